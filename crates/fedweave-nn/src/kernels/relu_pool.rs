//! ReLU then k×k max pooling of stride k (no padding, floor mode) off the
//! CPU, as one operation with a hand-written backward step.
//!
//! burn-cubecl runs ReLU as a comparison and a masked fill, and max pooling
//! on channels-last planes, so the composition was eight launches forward
//! (two for ReLU, a layout copy each way around the pool) and as many back.
//! Here each direction is one kernel: forward one unit per output (the
//! window's maximum, then ReLU: max commutes with ReLU), backward one unit
//! per input (its window's first maximum takes the output's gradient when
//! that maximum is positive: ReLU sends nothing from a window whose maximum
//! is not). The CPU has its own fused kernel (`CpuKernels::max_pool2d_square`);
//! the `Flex` form here is burn's composition, the reference for the cube
//! kernels.

use super::relu_masked;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{
    Autodiff, AutodiffBackend, Backend, Dispatch, Flex, TensorMetadata, backend_extension,
    get_or_init_device_settings,
};
use burn::tensor::Tensor;

/// ReLU then non-overlapping max pooling.
#[backend_extension(Flex, Cube: cfg(any(feature = "cuda", feature = "wgpu")), Autodiff)]
pub trait ReluMaxPool: Backend {
    /// `max_pool(relu(x))` for `x` of `[b, c, h, w]` with a k×k window of
    /// stride k: `[b, c, h / k, w / k]`.
    fn relu_max_pool(x: FloatTensor<Self>, k: usize) -> FloatTensor<Self>;

    /// The gradient with respect to `x` at `dout`.
    fn relu_max_pool_backward(
        x: FloatTensor<Self>,
        dout: FloatTensor<Self>,
        k: usize,
    ) -> FloatTensor<Self>;
}

/// [`ReluMaxPool::relu_max_pool`] on the dispatching backend.
pub(crate) fn relu_max_pool(x: Tensor<4>, k: usize) -> Tensor<4> {
    Tensor::from_dispatch(<Dispatch as ReluMaxPool>::relu_max_pool(
        x.into_dispatch(),
        k,
    ))
}

fn forward_composed<B: Backend>(x: FloatTensor<B>, k: usize) -> FloatTensor<B> {
    B::max_pool2d(
        relu_masked::<B>(x.clone(), x),
        [k, k],
        [k, k],
        [0, 0],
        [1, 1],
        false,
    )
}

fn backward_composed<B: Backend>(
    x: FloatTensor<B>,
    dout: FloatTensor<B>,
    k: usize,
) -> FloatTensor<B> {
    let settings = get_or_init_device_settings::<B>(&x.device());
    let r = relu_masked::<B>(x.clone(), x.clone());
    let pooled = B::max_pool2d_with_indices(
        r.clone(),
        [k, k],
        [k, k],
        [0, 0],
        [1, 1],
        false,
        settings.int_dtype,
    );
    let dx = B::max_pool2d_with_indices_backward(
        r,
        [k, k],
        [k, k],
        [0, 0],
        [1, 1],
        false,
        dout,
        pooled.indices,
    )
    .x_grad;
    relu_masked::<B>(dx, x)
}

/// [`ReluMaxPool`] as burn's operations: the CPU's form (the kernels' reference)
/// and, with burn's fusion (`cuda-tuned`), the cube backend's, whose fusion
/// joins the element-wise operations itself.
macro_rules! composed {
    ($backend:ty) => {
        impl ReluMaxPool for $backend {
            fn relu_max_pool(x: FloatTensor<Self>, k: usize) -> FloatTensor<Self> {
                forward_composed::<Self>(x, k)
            }

            fn relu_max_pool_backward(
                x: FloatTensor<Self>,
                dout: FloatTensor<Self>,
                k: usize,
            ) -> FloatTensor<Self> {
                backward_composed::<Self>(x, dout, k)
            }
        }
    };
}

composed!(Flex);

/// The backward step; its state: the input.
#[derive(Debug)]
struct ReluMaxPoolBackward {
    k: usize,
}

impl<B: ReluMaxPool> Backward<B, 1> for ReluMaxPoolBackward {
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let dout = grads.consume::<B>(&ops.node);
        if let Some(node) = node {
            grads.register::<B>(node.id, B::relu_max_pool_backward(ops.state, dout, self.k));
        }
    }
}

impl<B: ReluMaxPool, C: CheckpointStrategy> ReluMaxPool for Autodiff<B, C> {
    fn relu_max_pool(x: FloatTensor<Self>, k: usize) -> FloatTensor<Self> {
        let prep = ReluMaxPoolBackward { k }
            .prepare::<C>([x.node()])
            .compute_bound()
            .stateful();
        let x = x.into_primitive();
        let out = B::relu_max_pool(x.clone(), k);
        match prep {
            OpsKind::Tracked(prep) => prep.finish(x, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn relu_max_pool_backward(
        x: FloatTensor<Self>,
        dout: FloatTensor<Self>,
        k: usize,
    ) -> FloatTensor<Self> {
        // Not differentiated again: the inner backend's step, detached.
        Self::from_inner(B::relu_max_pool_backward(
            x.into_primitive(),
            dout.into_primitive(),
            k,
        ))
    }
}

#[cfg(feature = "cuda-tuned")]
composed!(burn::backend::Cube);

#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "cuda-tuned")))]
mod cube {
    use super::super::cube::{F32, address, empty_f32, units};
    use super::{ReluMaxPool, backward_composed, forward_composed};
    use burn::backend::tensor::FloatTensor;
    use burn::tensor::{DType, Shape};
    use burn_cubecl::CubeBackend;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::prelude::*;

    /// The first position (row-major in the window) of window (`plane`,
    /// `oh`, `ow`)'s maximum, and that maximum.
    #[cube]
    fn window_max<F: Float>(
        x: &Tensor<F>,
        plane: usize,
        oh: usize,
        ow: usize,
        h: usize,
        w: usize,
        k: usize,
    ) -> (usize, F) {
        let origin = plane * h * w + oh * k * w + ow * k;
        let mut best = x[origin];
        let mut at = 0usize;
        for i in 0..k {
            for j in 0..k {
                let v = x[origin + i * w + j];
                if v > best {
                    best = v;
                    at = i * k + j;
                }
            }
        }
        (at, best)
    }

    #[cube(launch_unchecked, address_type = "dynamic")]
    fn relu_pool_forward_kernel<F: Float>(
        x: &Tensor<F>,
        out: &mut Tensor<F>,
        h: usize,
        w: usize,
        k: usize,
        #[define(F)] _dtype: ElemType,
    ) {
        if ABSOLUTE_POS >= out.len() {
            terminate!();
        }
        let (oh_n, ow_n) = (h / k, w / k);
        let plane = ABSOLUTE_POS / (oh_n * ow_n);
        let at = ABSOLUTE_POS % (oh_n * ow_n);
        let (_, best) = window_max::<F>(x, plane, at / ow_n, at % ow_n, h, w, k);
        let mut v = best;
        if best <= F::new(0.0) {
            v = F::new(0.0);
        }
        out[ABSOLUTE_POS] = v;
    }

    #[cube(launch_unchecked, address_type = "dynamic")]
    fn relu_pool_backward_kernel<F: Float>(
        x: &Tensor<F>,
        dout: &Tensor<F>,
        dx: &mut Tensor<F>,
        h: usize,
        w: usize,
        k: usize,
        #[define(F)] _dtype: ElemType,
    ) {
        if ABSOLUTE_POS >= dx.len() {
            terminate!();
        }
        let (oh_n, ow_n) = (h / k, w / k);
        let plane = ABSOLUTE_POS / (h * w);
        let at = ABSOLUTE_POS % (h * w);
        let (row, col) = (at / w, at % w);
        let (oh, ow) = (row / k, col / k);
        let mut g = F::new(0.0);
        if oh < oh_n && ow < ow_n {
            let (winner, best) = window_max::<F>(x, plane, oh, ow, h, w, k);
            if best > F::new(0.0) && winner == (row % k) * k + col % k {
                g = dout[(plane * oh_n + oh) * ow_n + ow];
            }
        }
        dx[ABSOLUTE_POS] = g;
    }

    impl ReluMaxPool for CubeBackend {
        fn relu_max_pool(x: CubeTensor, k: usize) -> FloatTensor<Self> {
            let [b, c, h, w] = x.meta.shape().dims::<4>();
            if x.dtype != DType::F32 || k == 0 || h < k || w < k || b * c == 0 {
                return forward_composed::<Self>(x, k);
            }
            let x = into_contiguous(x);
            let shape = Shape::new([b, c, h / k, w / k]);
            let out = empty_f32(&x, shape);
            let (count, dim) = units(&out, out.meta.shape().num_elements());
            let address = address(&[&x]);
            // SAFETY: one unit per output (position checked); its window
            // lies inside its plane of the contiguous input (floor mode).
            unsafe {
                relu_pool_forward_kernel::launch_unchecked(
                    &x.client.clone(),
                    count,
                    dim,
                    address,
                    x.into_tensor_arg(),
                    out.clone().into_tensor_arg(),
                    h,
                    w,
                    k,
                    F32,
                );
            }
            out
        }

        fn relu_max_pool_backward(x: CubeTensor, dout: CubeTensor, k: usize) -> FloatTensor<Self> {
            let [_, _, h, w] = x.meta.shape().dims::<4>();
            if x.dtype != DType::F32 || dout.dtype != DType::F32 || k == 0 || h < k || w < k {
                return backward_composed::<Self>(x, dout, k);
            }
            let (x, dout) = (into_contiguous(x), into_contiguous(dout));
            let dx = empty_f32(&x, x.meta.shape().clone());
            let (count, dim) = units(&dx, dx.meta.shape().num_elements());
            let address = address(&[&x]);
            // SAFETY: one unit per input (position checked); the window and
            // output it reads lie inside the contiguous input and `dout`.
            unsafe {
                relu_pool_backward_kernel::launch_unchecked(
                    &x.client.clone(),
                    count,
                    dim,
                    address,
                    x.into_tensor_arg(),
                    dout.into_tensor_arg(),
                    dx.clone().into_tensor_arg(),
                    h,
                    w,
                    k,
                    F32,
                );
            }
            dx
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::close;
    use super::relu_max_pool;
    use burn::tensor::activation::relu;
    use burn::tensor::module::max_pool2d;
    use burn::tensor::ops::MaxPoolOptions;
    use burn::tensor::{Device, Distribution, Tensor};

    /// Values and gradients equal burn's ReLU then max pooling through
    /// autodiff, on planes whose sides are and are not multiples of the
    /// window (floor mode drops the rest), with windows of only negative
    /// values among them.
    #[test]
    fn the_operation_is_relu_then_max_pooling() {
        let device = Device::flex().autodiff();
        for ([b, c, h, w], k) in [([2, 3, 8, 6], 2), ([1, 4, 7, 5], 2), ([2, 2, 9, 7], 3)] {
            let x = Tensor::<4>::random([b, c, h, w], Distribution::Uniform(-1.0, 0.6), &device)
                .require_grad();
            let weights = Tensor::<4>::random(
                [b, c, h / k, w / k],
                Distribution::Uniform(-2.0, 2.0),
                &device,
            );
            let run = |ours: bool| {
                let out = if ours {
                    relu_max_pool(x.clone(), k)
                } else {
                    max_pool2d(
                        relu(x.clone()),
                        MaxPoolOptions::new([k, k]).with_stride([k, k]),
                    )
                };
                let grads = (out.clone() * weights.clone()).sum().backward();
                (out.inner(), x.grad(&grads).expect("dx"))
            };
            let (o1, g1) = run(true);
            let (o2, g2) = run(false);
            let case = format!("[{b}, {c}, {h}, {w}], k = {k}");
            close(o1, o2, 0.0, &format!("{case}: out"));
            close(g1, g2, 0.0, &format!("{case}: dx"));
        }
    }
}
