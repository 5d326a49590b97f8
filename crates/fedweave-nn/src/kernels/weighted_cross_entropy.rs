//! The batched trainer's loss: each client's cross-entropy against weighted
//! targets, as one operation with a hand-written backward step.
//!
//! With logits `x` and targets `t` (`[K, B, N]`: one-hot rows weighted
//! `1/b_k`, zero rows for padding) client k's loss is
//! `L_k = −Σ_b Σ_n t·(x − lse)` with `lse = log Σ_n exp(x)` per row, and
//! `∂L_k/∂x = (softmax(x)·Σ_n t − t)`. As burn's operations (log-softmax,
//! product, two sums, negation) and their autodiff steps that was about 25
//! launches a step; on the cube backends it is one kernel each way (one
//! cube per client forward, one thread per logit backward). The CPU keeps
//! burn's composition (its batched results are pinned against one client
//! at a time); the `Flex` form here is the same formula as burn's
//! operations, the reference for the kernels.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{
    Autodiff, AutodiffBackend, Backend, Dispatch, Flex, TensorMetadata, backend_extension,
};
use burn::tensor::{Shape, Tensor};

/// Weighted cross-entropy per client.
#[backend_extension(Flex, Cube: cfg(any(feature = "cuda", feature = "wgpu")), Autodiff)]
pub trait WeightedCrossEntropy: Backend {
    /// Each client's `−Σ_b Σ_n t·log softmax(x)` (`[K]`) for logits `x` and
    /// targets `t` (`[K, B, N]`), with each row's log-sum-exp and target
    /// mass `Σ_n t` (`[K, B, 1]`) for the backward step.
    fn weighted_cross_entropy(
        logits: FloatTensor<Self>,
        target: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// The gradient with respect to the logits at `dloss` (`[K]`):
    /// `(exp(x − lse)·mass − t)·dloss_k`.
    fn weighted_cross_entropy_backward(
        dloss: FloatTensor<Self>,
        logits: FloatTensor<Self>,
        target: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        mass: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

/// [`WeightedCrossEntropy::weighted_cross_entropy`] of the dispatching
/// backend's `logits` (under autodiff) against `target`: each client's
/// loss, `[K]`.
pub(crate) fn weighted_cross_entropy(logits: Tensor<3>, target: Tensor<3>) -> Tensor<1> {
    let (loss, _, _) = <Dispatch as WeightedCrossEntropy>::weighted_cross_entropy(
        logits.into_dispatch(),
        target.into_dispatch(),
    );
    Tensor::from_dispatch(loss)
}

/// The forward formula as burn's operations: `(loss, lse, mass)`.
fn forward_composed<B: Backend>(
    logits: FloatTensor<B>,
    target: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let [k, b, _] = logits.shape().dims::<3>();
    let top = B::float_max_dim(logits.clone(), 2);
    let shifted = B::float_sub(logits, top.clone());
    let log_sum = B::float_log(B::float_sum_dim(B::float_exp(shifted.clone()), 2));
    let log_p = B::float_sub(shifted, log_sum.clone());
    let mass = B::float_sum_dim(target.clone(), 2);
    let rows = B::float_sum_dim(B::float_mul(log_p, target), 2);
    let loss = B::float_neg(B::float_sum_dim(
        B::float_reshape(rows, Shape::new([k, b])),
        1,
    ));
    let lse = B::float_add(top, log_sum);
    (B::float_reshape(loss, Shape::new([k])), lse, mass)
}

/// The backward formula as burn's operations.
fn backward_composed<B: Backend>(
    dloss: FloatTensor<B>,
    logits: FloatTensor<B>,
    target: FloatTensor<B>,
    lse: FloatTensor<B>,
    mass: FloatTensor<B>,
) -> FloatTensor<B> {
    let k = dloss.shape().num_elements();
    let soft = B::float_exp(B::float_sub(logits, lse));
    let d = B::float_sub(B::float_mul(soft, mass), target);
    B::float_mul(d, B::float_reshape(dloss, Shape::new([k, 1, 1])))
}

impl WeightedCrossEntropy for Flex {
    fn weighted_cross_entropy(
        logits: FloatTensor<Self>,
        target: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        forward_composed::<Self>(logits, target)
    }

    fn weighted_cross_entropy_backward(
        dloss: FloatTensor<Self>,
        logits: FloatTensor<Self>,
        target: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        mass: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        backward_composed::<Self>(dloss, logits, target, lse, mass)
    }
}

/// The backward step; its state: the logits, targets, log-sum-exps and
/// target masses.
#[derive(Debug)]
struct CrossEntropyBackward;

impl<B: WeightedCrossEntropy> Backward<B, 1> for CrossEntropyBackward {
    type State = [FloatTensor<B>; 4];

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let dloss = grads.consume::<B>(&ops.node);
        let [logits, target, lse, mass] = ops.state;
        if let Some(node) = node {
            let d = B::weighted_cross_entropy_backward(dloss, logits, target, lse, mass);
            grads.register::<B>(node.id, d);
        }
    }
}

impl<B: WeightedCrossEntropy, C: CheckpointStrategy> WeightedCrossEntropy for Autodiff<B, C> {
    fn weighted_cross_entropy(
        logits: FloatTensor<Self>,
        target: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        // The targets are data (no gradient flows to them).
        let prep = CrossEntropyBackward
            .prepare::<C>([logits.node()])
            .compute_bound()
            .stateful();
        let (logits, target) = (logits.into_primitive(), target.into_primitive());
        let (loss, lse, mass) = B::weighted_cross_entropy(logits.clone(), target.clone());
        let loss = match prep {
            OpsKind::Tracked(prep) => {
                prep.finish([logits, target, lse.clone(), mass.clone()], loss)
            }
            OpsKind::UnTracked(prep) => prep.finish(loss),
        };
        (loss, Self::from_inner(lse), Self::from_inner(mass))
    }

    fn weighted_cross_entropy_backward(
        dloss: FloatTensor<Self>,
        logits: FloatTensor<Self>,
        target: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        mass: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        // Not differentiated again: the inner backend's step, detached.
        Self::from_inner(B::weighted_cross_entropy_backward(
            dloss.into_primitive(),
            logits.into_primitive(),
            target.into_primitive(),
            lse.into_primitive(),
            mass.into_primitive(),
        ))
    }
}

// With burn's `fusion` (`cuda-tuned`) the cube backend fuses the
// composition's element-wise operations itself.
#[cfg(feature = "cuda-tuned")]
impl WeightedCrossEntropy for burn::backend::Cube {
    fn weighted_cross_entropy(
        logits: FloatTensor<Self>,
        target: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        forward_composed::<Self>(logits, target)
    }

    fn weighted_cross_entropy_backward(
        dloss: FloatTensor<Self>,
        logits: FloatTensor<Self>,
        target: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        mass: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        backward_composed::<Self>(dloss, logits, target, lse, mass)
    }
}

#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "cuda-tuned")))]
mod cube {
    //! Forward: one cube per client, its units striding over the client's
    //! rows (N logits each, read serially) and meeting for the sum.
    //! Backward: one unit per logit.

    use super::super::cube::{F32, THREADS, address, cube_sum, empty_f32, units};
    use super::{WeightedCrossEntropy, backward_composed, forward_composed};
    use burn::backend::tensor::FloatTensor;
    use burn::tensor::{DType, Shape};
    use burn_cubecl::CubeBackend;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::prelude::*;

    #[cube(launch_unchecked, address_type = "dynamic")]
    fn cross_entropy_forward_kernel<F: Float>(
        logits: &Tensor<F>,
        target: &Tensor<F>,
        loss: &mut Tensor<F>,
        lse: &mut Tensor<F>,
        mass: &mut Tensor<F>,
        rows: usize,
        classes: usize,
        #[define(F)] _dtype: ElemType,
    ) {
        let k = CUBE_POS;
        let mut sums = Shared::new_slice(comptime!(THREADS as usize));
        let mut acc = F::new(0.0);
        let mut b = UNIT_POS as usize;
        while b < rows {
            let row = (k * rows + b) * classes;
            let mut top = logits[row];
            for n in 1..classes {
                top = F::max(top, logits[row + n]);
            }
            let mut total = F::new(0.0);
            for n in 0..classes {
                total += F::exp(logits[row + n] - top);
            }
            let log_sum = F::ln(total);
            let (mut weighted, mut weight) = (F::new(0.0), F::new(0.0));
            for n in 0..classes {
                let t = target[row + n];
                weighted += (logits[row + n] - top - log_sum) * t;
                weight += t;
            }
            acc -= weighted;
            lse[k * rows + b] = top + log_sum;
            mass[k * rows + b] = weight;
            b += CUBE_DIM as usize;
        }
        let total = cube_sum::<F>(acc, &mut sums);
        if UNIT_POS == 0 {
            loss[k] = total;
        }
    }

    #[cube(launch_unchecked, address_type = "dynamic")]
    fn cross_entropy_backward_kernel<F: Float>(
        dloss: &Tensor<F>,
        logits: &Tensor<F>,
        target: &Tensor<F>,
        lse: &Tensor<F>,
        mass: &Tensor<F>,
        out: &mut Tensor<F>,
        rows: usize,
        classes: usize,
        #[define(F)] _dtype: ElemType,
    ) {
        if ABSOLUTE_POS >= out.len() {
            terminate!();
        }
        let row = ABSOLUTE_POS / classes;
        let soft = F::exp(logits[ABSOLUTE_POS] - lse[row]);
        out[ABSOLUTE_POS] = (soft * mass[row] - target[ABSOLUTE_POS]) * dloss[row / rows];
    }

    fn f32s(tensors: &[&CubeTensor]) -> bool {
        tensors.iter().all(|t| t.dtype == DType::F32)
    }

    impl WeightedCrossEntropy for CubeBackend {
        fn weighted_cross_entropy(
            logits: CubeTensor,
            target: CubeTensor,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
            let [k, b, n] = logits.meta.shape().dims::<3>();
            if !f32s(&[&logits, &target]) || k * b * n == 0 {
                return forward_composed::<Self>(logits, target);
            }
            let [logits, target] = [logits, target].map(into_contiguous);
            let loss = empty_f32(&logits, Shape::new([k]));
            let (lse, mass) = (
                empty_f32(&logits, Shape::new([k, b, 1])),
                empty_f32(&logits, Shape::new([k, b, 1])),
            );
            let client = logits.client.clone();
            let address = address(&[&logits]);
            // SAFETY: one cube per client; unit b reads row (k, b)'s N
            // logits and targets (b < B) and writes its log-sum-exp and
            // mass; unit 0 writes loss[k]. All contiguous.
            unsafe {
                cross_entropy_forward_kernel::launch_unchecked(
                    &client,
                    CubeCount::Static(k as u32, 1, 1),
                    CubeDim::new_1d(THREADS),
                    address,
                    logits.into_tensor_arg(),
                    target.into_tensor_arg(),
                    loss.clone().into_tensor_arg(),
                    lse.clone().into_tensor_arg(),
                    mass.clone().into_tensor_arg(),
                    b,
                    n,
                    F32,
                );
            }
            (loss, lse, mass)
        }

        fn weighted_cross_entropy_backward(
            dloss: CubeTensor,
            logits: CubeTensor,
            target: CubeTensor,
            lse: CubeTensor,
            mass: CubeTensor,
        ) -> FloatTensor<Self> {
            let shape = logits.meta.shape().clone();
            let [_, b, n] = shape.dims::<3>();
            let len = shape.num_elements();
            if !f32s(&[&dloss, &logits, &target, &lse, &mass]) || len == 0 {
                return backward_composed::<Self>(dloss, logits, target, lse, mass);
            }
            let [dloss, logits, target, lse, mass] =
                [dloss, logits, target, lse, mass].map(into_contiguous);
            let out = empty_f32(&logits, shape);
            let client = logits.client.clone();
            let address = address(&[&logits, &out]);
            let (cube_count, cube_dim) = units(&out, len);
            // SAFETY: one unit per logit (position < K·B·N, checked); its
            // row (< K·B) and client (< K) index the row and client tensors.
            unsafe {
                cross_entropy_backward_kernel::launch_unchecked(
                    &client,
                    cube_count,
                    cube_dim,
                    address,
                    dloss.into_tensor_arg(),
                    logits.into_tensor_arg(),
                    target.into_tensor_arg(),
                    lse.into_tensor_arg(),
                    mass.into_tensor_arg(),
                    out.clone().into_tensor_arg(),
                    b,
                    n,
                    F32,
                );
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::close;
    use super::weighted_cross_entropy;
    use burn::tensor::activation::log_softmax;
    use burn::tensor::{Device, Distribution, Tensor, TensorData};

    /// Each client's loss and the logits' gradient equal burn's
    /// log-softmax composition through autodiff (the batched trainer's loss
    /// until now), with weighted one-hot rows, padding rows of zeros and a
    /// client with no row at all; logits up to ±40 so the shift by the
    /// row's maximum matters.
    #[test]
    fn the_operation_is_burns_log_softmax_loss() {
        let device = Device::flex().autodiff();
        let (k, b, n) = (3, 4, 7);
        let logits = Tensor::<3>::random([k, b, n], Distribution::Uniform(-40.0, 40.0), &device)
            .require_grad();
        // Client 0: four rows weighted 1/4; client 1: two rows of 1/2 and
        // two padding rows; client 2 rests.
        let mut t = vec![0.0f32; k * b * n];
        for (row, weight) in [
            (0, 0.25),
            (1, 0.25),
            (2, 0.25),
            (3, 0.25),
            (4, 0.5),
            (5, 0.5),
        ] {
            t[row * n + (row * 3) % n] = weight;
        }
        let target = Tensor::<3>::from_data(TensorData::new(t, [k, b, n]), &device);
        let dloss = Tensor::<1>::from_data(TensorData::new(vec![1.0f32, -2.0, 0.5], [k]), &device);
        let run = |ours: bool| {
            let loss = if ours {
                weighted_cross_entropy(logits.clone(), target.clone())
            } else {
                log_softmax(logits.clone(), 2)
                    .mul(target.clone())
                    .sum_dim(2)
                    .sum_dim(1)
                    .neg()
                    .reshape([k])
            };
            let grads = (loss.clone() * dloss.clone()).sum().backward();
            (loss.inner(), logits.grad(&grads).expect("d logits"))
        };
        let (l1, g1) = run(true);
        let (l2, g2) = run(false);
        close(l1.clone(), l2, 1e-5, "losses");
        close(g1, g2, 1e-5, "gradients");
        assert_eq!(
            l1.into_data().try_to_vec::<f32>().unwrap()[2],
            0.0,
            "a resting client's loss"
        );
    }
}
