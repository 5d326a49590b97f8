//! The batched trainer's hidden dense layers off the CPU: bias then ReLU on
//! K clients' products (`[K, B, J]`), as one operation with a hand-written
//! backward step that also gives the bias gradient.
//!
//! As burn's operations a hidden layer after its product was an addition, a
//! comparison and a masked fill forward, and back a comparison, a masked
//! fill and a reduction for the bias: six launches of a few microseconds
//! each on a GPU step that is bound by its launches (docs/results.md, "GPU
//! path, session 45"). Here forward is one unit per value, backward one unit
//! per client and output (`K·J`) that walks the batch: it writes the
//! masked gradient and sums it into the bias's. The CPU keeps burn's
//! composition (its batched results are pinned against one client at a
//! time); the `Flex` form here is that composition, the reference for the
//! kernels.
//!
//! ReLU is burn's: `x ≤ 0` → 0 (NaN passes, −0 becomes +0), and its gradient
//! passes where the output is not `≤ 0`.

use super::relu_masked;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{
    Autodiff, AutodiffBackend, Backend, Dispatch, Flex, TensorMetadata, backend_extension,
};
use burn::tensor::{Shape, Tensor};

/// Per-client bias, then ReLU.
#[backend_extension(Flex, Cube: cfg(any(feature = "cuda", feature = "wgpu")), Autodiff)]
pub trait BiasRelu: Backend {
    /// `relu(z + bias)` for `z` of `[K, B, J]` and `bias` of `[K, J]`
    /// (client k's bias added to each of its rows).
    fn bias_relu(z: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self>;

    /// The gradients with respect to `z` and `bias` at `dout`, from the
    /// operation's output `out`: `(dz, dbias)`.
    fn bias_relu_backward(
        out: FloatTensor<Self>,
        dout: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>);
}

/// [`BiasRelu::bias_relu`] on the dispatching backend.
pub(crate) fn bias_relu(z: Tensor<3>, bias: Tensor<2>) -> Tensor<3> {
    Tensor::from_dispatch(<Dispatch as BiasRelu>::bias_relu(
        z.into_dispatch(),
        bias.into_dispatch(),
    ))
}

/// The forward formula as burn's operations.
fn forward_composed<B: Backend>(z: FloatTensor<B>, bias: FloatTensor<B>) -> FloatTensor<B> {
    let [k, j] = bias.shape().dims::<2>();
    let y = B::float_add(z, B::float_reshape(bias, Shape::new([k, 1, j])));
    relu_masked::<B>(y.clone(), y)
}

/// The backward formula as burn's operations.
fn backward_composed<B: Backend>(
    out: FloatTensor<B>,
    dout: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let [k, _, j] = out.shape().dims::<3>();
    let dz = relu_masked::<B>(dout, out);
    let dbias = B::float_reshape(B::float_sum_dim(dz.clone(), 1), Shape::new([k, j]));
    (dz, dbias)
}

/// [`BiasRelu`] as burn's operations: the CPU's form (the kernels' reference)
/// and, with burn's fusion (`cuda-tuned`), the cube backend's, whose fusion
/// joins the element-wise operations itself.
macro_rules! composed {
    ($backend:ty) => {
        impl BiasRelu for $backend {
            fn bias_relu(z: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
                forward_composed::<Self>(z, bias)
            }

            fn bias_relu_backward(
                out: FloatTensor<Self>,
                dout: FloatTensor<Self>,
            ) -> (FloatTensor<Self>, FloatTensor<Self>) {
                backward_composed::<Self>(out, dout)
            }
        }
    };
}

composed!(Flex);

/// The backward step; its state: the output.
#[derive(Debug)]
struct BiasReluBackward;

impl<B: BiasRelu> Backward<B, 2> for BiasReluBackward {
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [z, bias] = ops.parents;
        let dout = grads.consume::<B>(&ops.node);
        let (dz, dbias) = B::bias_relu_backward(ops.state, dout);
        if let Some(z) = z {
            grads.register::<B>(z.id, dz);
        }
        if let Some(bias) = bias {
            grads.register::<B>(bias.id, dbias);
        }
    }
}

impl<B: BiasRelu, C: CheckpointStrategy> BiasRelu for Autodiff<B, C> {
    fn bias_relu(z: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
        let prep = BiasReluBackward
            .prepare::<C>([z.node(), bias.node()])
            .compute_bound()
            .stateful();
        let out = B::bias_relu(z.into_primitive(), bias.into_primitive());
        match prep {
            OpsKind::Tracked(prep) => prep.finish(out.clone(), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn bias_relu_backward(
        out: FloatTensor<Self>,
        dout: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        // Not differentiated again: the inner backend's step, detached.
        let (dz, dbias) = B::bias_relu_backward(out.into_primitive(), dout.into_primitive());
        (Self::from_inner(dz), Self::from_inner(dbias))
    }
}

#[cfg(feature = "cuda-tuned")]
composed!(burn::backend::Cube);

#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "cuda-tuned")))]
mod cube {
    use super::super::cube::{F32, address, empty_f32, units};
    use super::{BiasRelu, backward_composed, forward_composed};
    use burn::backend::tensor::FloatTensor;
    use burn::tensor::{DType, Shape};
    use burn_cubecl::CubeBackend;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::prelude::*;

    #[cube(launch_unchecked, address_type = "dynamic")]
    fn bias_relu_forward_kernel<F: Float>(
        z: &Tensor<F>,
        bias: &Tensor<F>,
        out: &mut Tensor<F>,
        rows: usize,
        width: usize,
        #[define(F)] _dtype: ElemType,
    ) {
        if ABSOLUTE_POS >= out.len() {
            terminate!();
        }
        let (k, j) = (ABSOLUTE_POS / (rows * width), ABSOLUTE_POS % width);
        let y = z[ABSOLUTE_POS] + bias[k * width + j];
        let mut v = y;
        if y <= F::new(0.0) {
            v = F::new(0.0);
        }
        out[ABSOLUTE_POS] = v;
    }

    /// One unit per (client, output): down the client's rows.
    #[cube(launch_unchecked, address_type = "dynamic")]
    fn bias_relu_backward_kernel<F: Float>(
        out: &Tensor<F>,
        dout: &Tensor<F>,
        dz: &mut Tensor<F>,
        dbias: &mut Tensor<F>,
        rows: usize,
        width: usize,
        #[define(F)] _dtype: ElemType,
    ) {
        if ABSOLUTE_POS >= dbias.len() {
            terminate!();
        }
        let (k, j) = (ABSOLUTE_POS / width, ABSOLUTE_POS % width);
        let mut sum = F::new(0.0);
        for b in 0..rows {
            let at = (k * rows + b) * width + j;
            let mut g = dout[at];
            if out[at] <= F::new(0.0) {
                g = F::new(0.0);
            }
            dz[at] = g;
            sum += g;
        }
        dbias[ABSOLUTE_POS] = sum;
    }

    impl BiasRelu for CubeBackend {
        fn bias_relu(z: CubeTensor, bias: CubeTensor) -> FloatTensor<Self> {
            let shape = z.meta.shape().clone();
            let [_, rows, width] = shape.dims::<3>();
            if z.dtype != DType::F32 || bias.dtype != DType::F32 || shape.num_elements() == 0 {
                return forward_composed::<Self>(z, bias);
            }
            let [z, bias] = [z, bias].map(into_contiguous);
            let out = empty_f32(&z, shape);
            let (count, dim) = units(&out, out.meta.shape().num_elements());
            let address = address(&[&z, &out]);
            // SAFETY: one unit per value of the contiguous `[K, B, J]` `z`
            // and `out` (position checked); its bias (k, j) < K·J.
            unsafe {
                bias_relu_forward_kernel::launch_unchecked(
                    &z.client.clone(),
                    count,
                    dim,
                    address,
                    z.into_tensor_arg(),
                    bias.into_tensor_arg(),
                    out.clone().into_tensor_arg(),
                    rows,
                    width,
                    F32,
                );
            }
            out
        }

        fn bias_relu_backward(
            out: CubeTensor,
            dout: CubeTensor,
        ) -> (FloatTensor<Self>, FloatTensor<Self>) {
            let shape = out.meta.shape().clone();
            let [k, rows, width] = shape.dims::<3>();
            if out.dtype != DType::F32 || dout.dtype != DType::F32 || k * width == 0 {
                return backward_composed::<Self>(out, dout);
            }
            let [out, dout] = [out, dout].map(into_contiguous);
            let dz = empty_f32(&out, shape);
            let dbias = empty_f32(&out, Shape::new([k, width]));
            let (count, dim) = units(&dbias, k * width);
            let address = address(&[&out, &dz]);
            // SAFETY: one unit per (k, j) < K·J (checked); it reads and
            // writes (k, b, j) for b < B of the contiguous `[K, B, J]`
            // tensors.
            unsafe {
                bias_relu_backward_kernel::launch_unchecked(
                    &out.client.clone(),
                    count,
                    dim,
                    address,
                    out.into_tensor_arg(),
                    dout.into_tensor_arg(),
                    dz.clone().into_tensor_arg(),
                    dbias.clone().into_tensor_arg(),
                    rows,
                    width,
                    F32,
                );
            }
            (dz, dbias)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::values_of;
    use super::bias_relu;
    use burn::tensor::activation::relu;
    use burn::tensor::{Device, Distribution, Tensor, TensorData};

    /// Values and both gradients equal burn's addition then ReLU through
    /// autodiff (the batched trainer's composition), on products with
    /// zeros, negatives and a NaN, which passes forward and back as in
    /// burn.
    #[test]
    fn the_operation_is_bias_then_burns_relu() {
        let device = Device::flex().autodiff();
        let (k, b, j) = (3, 5, 7);
        let mut values: Vec<f32> = (0..k * b * j)
            .map(|i| ((i * 37) % 23) as f32 / 4.0 - 3.0)
            .collect();
        values[11] = f32::NAN;
        let z = Tensor::<3>::from_data(TensorData::new(values, [k, b, j]), &device).require_grad();
        let bias =
            Tensor::<2>::random([k, j], Distribution::Uniform(-1.0, 1.0), &device).require_grad();
        let weights = Tensor::<3>::random([k, b, j], Distribution::Uniform(-2.0, 2.0), &device);
        let run = |ours: bool| {
            let out = if ours {
                bias_relu(z.clone(), bias.clone())
            } else {
                relu(z.clone() + bias.clone().reshape([k, 1, j]))
            };
            let grads = (out.clone() * weights.clone()).sum().backward();
            (
                out.inner(),
                z.grad(&grads).expect("dz"),
                bias.grad(&grads).expect("dbias"),
            )
        };
        let (o1, z1, b1) = run(true);
        let (o2, z2, b2) = run(false);
        let same = |a: Vec<f32>, b: Vec<f32>, tol: f32, what: &str| {
            assert_eq!(a.len(), b.len(), "{what}");
            for (x, y) in a.iter().zip(&b) {
                let ok = (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol * (1.0 + y.abs());
                assert!(ok, "{what}: {x} vs {y}");
            }
        };
        let (o1, o2) = (values_of(o1), values_of(o2));
        assert!(o1[11].is_nan(), "NaN passes");
        assert!(o1.iter().filter(|v| **v == 0.0).count() > 20, "ReLU cuts");
        same(o1, o2, 0.0, "out");
        same(values_of(z1), values_of(z2), 0.0, "dz");
        same(values_of(b1), values_of(b2), 1e-6, "dbias");
    }
}
