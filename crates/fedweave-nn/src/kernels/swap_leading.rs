//! The batched trainer's flatten off the CPU: conv features of K clients
//! (`[B, K, F]`, the grouped layout) turned client-major (`[K, B, F]`) as
//! one contiguous copy each way.
//!
//! As burn's `swap_dims` the turned tensor is a strided view, and the dense
//! layer after it paid for that on a GPU: two copies before its forward
//! product, two packing copies of the saved view for its weight gradient,
//! and a copy of the input gradient back to the grouped layout (five
//! launches). Written contiguous once, the products read it in place and
//! the gradient comes back contiguous (two launches). The CPU keeps the
//! view (its kernels take strided operands, and its results are pinned).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::ops::FloatTensorOps;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, backend_extension};
use burn::tensor::Tensor;

/// The first two axes exchanged, into a contiguous tensor.
#[backend_extension(Flex, Cube: cfg(any(feature = "cuda", feature = "wgpu")), Autodiff)]
pub trait SwapLeading: Backend {
    /// `x` (`[a, b, f]`) as `[b, a, f]`; contiguous where the backend's
    /// operations need it.
    fn swap_leading(x: FloatTensor<Self>) -> FloatTensor<Self>;
}

/// [`SwapLeading::swap_leading`] on the dispatching backend.
pub(crate) fn swap_leading(x: Tensor<3>) -> Tensor<3> {
    Tensor::from_dispatch(<Dispatch as SwapLeading>::swap_leading(x.into_dispatch()))
}

impl SwapLeading for Flex {
    fn swap_leading(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_swap_dims(x, 0, 1)
    }
}

// With burn's `fusion` (`cuda-tuned`) the view is fused into its readers.
#[cfg(feature = "cuda-tuned")]
impl SwapLeading for burn::backend::Cube {
    fn swap_leading(x: FloatTensor<Self>) -> FloatTensor<Self> {
        Self::float_swap_dims(x, 0, 1)
    }
}

#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "cuda-tuned")))]
impl SwapLeading for burn_cubecl::CubeBackend {
    fn swap_leading(x: FloatTensor<Self>) -> FloatTensor<Self> {
        burn_cubecl::kernel::into_contiguous(Self::float_swap_dims(x, 0, 1))
    }
}

/// The backward step: the same exchange of the gradient.
#[derive(Debug)]
struct SwapLeadingBackward;

impl<B: SwapLeading> Backward<B, 1> for SwapLeadingBackward {
    type State = ();

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let dout = grads.consume::<B>(&ops.node);
        if let Some(node) = node {
            grads.register::<B>(node.id, B::swap_leading(dout));
        }
    }
}

impl<B: SwapLeading, C: CheckpointStrategy> SwapLeading for Autodiff<B, C> {
    fn swap_leading(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let prep = SwapLeadingBackward.prepare::<C>([x.node()]).compute_bound();
        prep.stateless(B::swap_leading(x.into_primitive()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::values_of;
    use super::swap_leading;
    use burn::tensor::{Device, Distribution, Tensor};

    /// Values and the input's gradient equal burn's `swap_dims(0, 1)`
    /// through autodiff.
    #[test]
    fn the_operation_is_burns_swap_of_the_leading_axes() {
        let device = Device::flex().autodiff();
        let x = Tensor::<3>::random([3, 4, 5], Distribution::Uniform(-1.0, 1.0), &device)
            .require_grad();
        let weights = Tensor::<3>::random([4, 3, 5], Distribution::Uniform(-2.0, 2.0), &device);
        let run = |ours: bool| {
            let out = if ours {
                swap_leading(x.clone())
            } else {
                x.clone().swap_dims(0, 1)
            };
            let grads = (out.clone() * weights.clone()).sum().backward();
            (
                values_of(out.inner()),
                values_of(x.grad(&grads).expect("dx")),
            )
        };
        assert_eq!(run(true), run(false));
    }
}
