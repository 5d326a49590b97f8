//! A residual block's end off the CPU: `relu(a + b)` (the block's output
//! plus its shortcut) as one operation with a hand-written backward step.
//!
//! As burn's operations it was an addition, a comparison and a masked fill
//! forward and a comparison and a masked fill back (five launches a block
//! on a GPU step bound by its launches); here one kernel each way, one unit
//! per value. Both inputs take the same gradient (the addition passes it
//! on). The CPU keeps burn's composition (its results are pinned); the
//! `Flex` form here is that composition, the reference for the kernels.

use super::relu_masked;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, AutodiffBackend, Backend, Dispatch, Flex, backend_extension};
use burn::tensor::Tensor;

/// A sum, then ReLU.
#[backend_extension(Flex, Cube: cfg(any(feature = "cuda", feature = "wgpu")), Autodiff)]
pub trait AddRelu: Backend {
    /// `relu(a + b)` for `a` and `b` of one shape.
    fn add_relu(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self>;

    /// The gradient with respect to either input at `dout`, from the
    /// operation's output `out`: `dout` where `out` is not `≤ 0`, else 0.
    fn add_relu_backward(out: FloatTensor<Self>, dout: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// `relu(a + b)`: off the CPU [`AddRelu::add_relu`], one kernel each way;
/// the CPU keeps burn's addition and ReLU.
pub(crate) fn add_relu<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
    if super::on_cpu(&a) {
        return burn::tensor::activation::relu(a + b);
    }
    Tensor::from_dispatch(<Dispatch as AddRelu>::add_relu(
        a.into_dispatch(),
        b.into_dispatch(),
    ))
}

/// The forward formula as burn's operations.
fn forward_composed<B: Backend>(a: FloatTensor<B>, b: FloatTensor<B>) -> FloatTensor<B> {
    let sum = B::float_add(a, b);
    relu_masked::<B>(sum.clone(), sum)
}

/// [`AddRelu`] as burn's operations: the CPU's form (the kernels'
/// reference) and, with burn's fusion (`cuda-tuned`), the cube backend's,
/// whose fusion joins the element-wise operations itself.
macro_rules! composed {
    ($backend:ty) => {
        impl AddRelu for $backend {
            fn add_relu(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
                forward_composed::<Self>(a, b)
            }

            fn add_relu_backward(
                out: FloatTensor<Self>,
                dout: FloatTensor<Self>,
            ) -> FloatTensor<Self> {
                relu_masked::<Self>(dout, out)
            }
        }
    };
}

composed!(Flex);

/// The backward step; its state: the output.
#[derive(Debug)]
struct AddReluBackward;

impl<B: AddRelu> Backward<B, 2> for AddReluBackward {
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dout = grads.consume::<B>(&ops.node);
        let d = B::add_relu_backward(ops.state, dout);
        let [a, b] = ops.parents;
        match (a, b) {
            (Some(a), Some(b)) => {
                grads.register::<B>(a.id, d.clone());
                grads.register::<B>(b.id, d);
            }
            (Some(one), None) | (None, Some(one)) => grads.register::<B>(one.id, d),
            (None, None) => {}
        }
    }
}

impl<B: AddRelu, C: CheckpointStrategy> AddRelu for Autodiff<B, C> {
    fn add_relu(a: FloatTensor<Self>, b: FloatTensor<Self>) -> FloatTensor<Self> {
        let prep = AddReluBackward
            .prepare::<C>([a.node(), b.node()])
            .compute_bound()
            .stateful();
        let out = B::add_relu(a.into_primitive(), b.into_primitive());
        match prep {
            OpsKind::Tracked(prep) => prep.finish(out.clone(), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn add_relu_backward(out: FloatTensor<Self>, dout: FloatTensor<Self>) -> FloatTensor<Self> {
        // Not differentiated again: the inner backend's step, detached.
        Self::from_inner(B::add_relu_backward(
            out.into_primitive(),
            dout.into_primitive(),
        ))
    }
}

#[cfg(feature = "cuda-tuned")]
composed!(burn::backend::Cube);

#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "cuda-tuned")))]
mod cube {
    use super::super::cube::{F32, address, empty_f32, units};
    use super::AddRelu;
    use burn::backend::tensor::FloatTensor;
    use burn::tensor::DType;
    use burn_cubecl::CubeBackend;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::prelude::*;

    #[cube(launch_unchecked, address_type = "dynamic")]
    fn add_relu_kernel<F: Float>(
        a: &Tensor<F>,
        b: &Tensor<F>,
        out: &mut Tensor<F>,
        #[define(F)] _dtype: ElemType,
    ) {
        if ABSOLUTE_POS >= out.len() {
            terminate!();
        }
        let sum = a[ABSOLUTE_POS] + b[ABSOLUTE_POS];
        let mut v = sum;
        if sum <= F::new(0.0) {
            v = F::new(0.0);
        }
        out[ABSOLUTE_POS] = v;
    }

    #[cube(launch_unchecked, address_type = "dynamic")]
    fn add_relu_backward_kernel<F: Float>(
        out: &Tensor<F>,
        dout: &Tensor<F>,
        d: &mut Tensor<F>,
        #[define(F)] _dtype: ElemType,
    ) {
        if ABSOLUTE_POS >= d.len() {
            terminate!();
        }
        let mut g = dout[ABSOLUTE_POS];
        if out[ABSOLUTE_POS] <= F::new(0.0) {
            g = F::new(0.0);
        }
        d[ABSOLUTE_POS] = g;
    }

    /// `x` and `y` of one shape, `f32`, not empty.
    fn fits(x: &CubeTensor, y: &CubeTensor) -> bool {
        x.meta.shape() == y.meta.shape()
            && x.dtype == DType::F32
            && y.dtype == DType::F32
            && x.meta.shape().num_elements() > 0
    }

    impl AddRelu for CubeBackend {
        fn add_relu(a: CubeTensor, b: CubeTensor) -> FloatTensor<Self> {
            if !fits(&a, &b) {
                return super::forward_composed::<Self>(a, b);
            }
            let [a, b] = [a, b].map(into_contiguous);
            let out = empty_f32(&a, a.meta.shape().clone());
            let (count, dim) = units(&out, out.meta.shape().num_elements());
            let address = address(&[&a, &out]);
            // SAFETY: one unit per value of the contiguous `a`, `b` and
            // `out`, all of one shape (position checked).
            unsafe {
                add_relu_kernel::launch_unchecked(
                    &a.client.clone(),
                    count,
                    dim,
                    address,
                    a.into_tensor_arg(),
                    b.into_tensor_arg(),
                    out.clone().into_tensor_arg(),
                    F32,
                );
            }
            out
        }

        fn add_relu_backward(out: CubeTensor, dout: CubeTensor) -> FloatTensor<Self> {
            if !fits(&out, &dout) {
                return super::relu_masked::<Self>(dout, out);
            }
            let [out, dout] = [out, dout].map(into_contiguous);
            let d = empty_f32(&out, out.meta.shape().clone());
            let (count, dim) = units(&d, d.meta.shape().num_elements());
            let address = address(&[&out, &d]);
            // SAFETY: as the forward kernel's.
            unsafe {
                add_relu_backward_kernel::launch_unchecked(
                    &out.client.clone(),
                    count,
                    dim,
                    address,
                    out.into_tensor_arg(),
                    dout.into_tensor_arg(),
                    d.clone().into_tensor_arg(),
                    F32,
                );
            }
            d
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::values_of;
    use super::AddRelu;
    use burn::backend::Dispatch;
    use burn::tensor::activation::relu;
    use burn::tensor::{Device, Distribution, Tensor};

    /// Values and both inputs' gradients equal burn's addition then ReLU
    /// through autodiff, bit for bit, with values on both sides of zero.
    #[test]
    fn the_operation_is_a_sum_then_burns_relu() {
        let device = Device::flex().autodiff();
        let a = Tensor::<4>::random([2, 3, 4, 5], Distribution::Uniform(-1.0, 1.0), &device)
            .require_grad();
        let b = Tensor::<4>::random([2, 3, 4, 5], Distribution::Uniform(-1.0, 1.0), &device)
            .require_grad();
        let weights = Tensor::<4>::random([2, 3, 4, 5], Distribution::Uniform(-2.0, 2.0), &device);
        let run = |ours: bool| {
            let out = if ours {
                Tensor::from_dispatch(<Dispatch as AddRelu>::add_relu(
                    a.clone().into_dispatch(),
                    b.clone().into_dispatch(),
                ))
            } else {
                relu(a.clone() + b.clone())
            };
            let grads = (out.clone() * weights.clone()).sum().backward();
            (
                values_of(out.inner()),
                values_of(a.grad(&grads).expect("da")),
                values_of(b.grad(&grads).expect("db")),
            )
        };
        let (ours, burns) = (run(true), run(false));
        assert!(
            ours.0.iter().filter(|v| **v == 0.0).count() > 10,
            "ReLU cuts"
        );
        assert!(ours.0.iter().any(|v| *v > 0.0), "and passes");
        assert_eq!(ours, burns);
    }
}
