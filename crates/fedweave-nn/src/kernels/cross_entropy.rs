//! Cross-entropy against (weighted) target rows as one operation with a
//! hand-written backward step, for the GPU backends.
//!
//! As burn's composition (log-softmax, product with the targets, sums,
//! negation) a training step's loss and its autodiff backward were about 35
//! kernel launches of a few elements each; a GPU step of a small model is
//! bound by the host's launches (docs/results.md, "GPU, session 22"). The
//! gradient has a closed form: for loss_r = −Σ_c t_rc·log p_rc with p =
//! softmax(z_r), ∂loss_r/∂z_rc = p_rc·Σ_c t_rc − t_rc, so the backward step
//! is four element-wise launches. The CPU keeps the composition: its
//! rounding is what the goldens pin.

#[cfg(any(feature = "cuda", feature = "wgpu"))]
use burn::backend::Cube;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, TensorMetadata, backend_extension};
use burn::tensor::{Shape, Tensor};

/// Softmax cross-entropy per row, differentiated in closed form.
#[backend_extension(Flex, Cube: cfg(any(feature = "cuda", feature = "wgpu")), Autodiff)]
pub trait SoftmaxCrossEntropy: Backend {
    /// −Σ_c `target`·log softmax(`logits`) for each row of `[rows,
    /// classes]`, as `[rows]`; `target` is a constant (no gradient).
    fn softmax_cross_entropy(
        logits: FloatTensor<Self>,
        target: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

/// [`SoftmaxCrossEntropy::softmax_cross_entropy`] on the dispatching device.
pub(crate) fn softmax_cross_entropy(logits: Tensor<2>, target: Tensor<2>) -> Tensor<1> {
    Tensor::from_dispatch(<Dispatch as SoftmaxCrossEntropy>::softmax_cross_entropy(
        logits.into_dispatch(),
        target.into_dispatch(),
    ))
}

/// The per-row losses `[rows]` and the log-probabilities `[rows, classes]`.
fn forward<B: Backend>(
    logits: FloatTensor<B>,
    target: FloatTensor<B>,
) -> (FloatTensor<B>, FloatTensor<B>) {
    let [rows, _] = logits.shape().dims::<2>();
    let max = B::float_max_dim(logits.clone(), 1);
    let shifted = B::float_sub(logits, max);
    let norm = B::float_log(B::float_sum_dim(B::float_exp(shifted.clone()), 1));
    let log_p = B::float_sub(shifted, norm);
    let loss = B::float_sum_dim(B::float_mul(target, log_p.clone()), 1);
    let loss = B::float_neg(B::float_reshape(loss, Shape::new([rows])));
    (loss, log_p)
}

/// [`SoftmaxCrossEntropy`] for a backend without autodiff: the forward.
macro_rules! forward_only {
    ($backend:ty) => {
        impl SoftmaxCrossEntropy for $backend {
            fn softmax_cross_entropy(
                logits: FloatTensor<Self>,
                target: FloatTensor<Self>,
            ) -> FloatTensor<Self> {
                forward::<Self>(logits, target).0
            }
        }
    };
}

forward_only!(Flex);
#[cfg(any(feature = "cuda", feature = "wgpu"))]
forward_only!(Cube);

/// The backward step; its state is log p and the targets.
#[derive(Debug)]
struct CrossEntropyBackward;

impl<B: Backend> Backward<B, 1> for CrossEntropyBackward {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let upstream = grads.consume::<B>(&ops.node);
        let Some(node) = node else { return };
        let (log_p, target) = ops.state;
        let rows = upstream.shape().num_elements();
        let upstream = B::float_reshape(upstream, Shape::new([rows, 1]));
        // (p·Σ_c t − t)·g, with Σ_c t per row.
        let mass = B::float_sum_dim(target.clone(), 1);
        let dz = B::float_sub(B::float_mul(B::float_exp(log_p), mass), target);
        grads.register::<B>(node.id, B::float_mul(dz, upstream));
    }
}

impl<B: SoftmaxCrossEntropy, C: CheckpointStrategy> SoftmaxCrossEntropy for Autodiff<B, C> {
    fn softmax_cross_entropy(
        logits: FloatTensor<Self>,
        target: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let prep = CrossEntropyBackward
            .prepare::<C>([logits.node()])
            .compute_bound()
            .stateful();
        let (logits, target) = (logits.into_primitive(), target.into_primitive());
        match prep {
            OpsKind::Tracked(prep) => {
                let (loss, log_p) = forward::<B>(logits, target.clone());
                prep.finish((log_p, target), loss)
            }
            OpsKind::UnTracked(prep) => prep.finish(forward::<B>(logits, target).0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::close;
    use super::*;
    use burn::tensor::activation::log_softmax;
    use burn::tensor::{Device, Distribution, TensorData};

    /// Per-row losses and the logits' gradient (through a weighted sum of
    /// the rows) equal burn's composition through autodiff: one-hot rows,
    /// weighted rows (the batched trainer's 1/b_k), an all-zero row (a
    /// padded sample) and large logits (the shift by the row maximum).
    #[test]
    fn cross_entropy_agrees_with_burns_composition() {
        let device = Device::flex().autodiff();
        let (rows, classes) = (5, 4);
        let logits = Tensor::<2>::random([rows, classes], Distribution::Normal(0.0, 3.0), &device)
            .add_scalar(40.0)
            .detach()
            .require_grad();
        let mut t = vec![0.0f32; rows * classes];
        for (r, c, w) in [
            (0, 1, 1.0),
            (1, 3, 0.5),
            (2, 1, 0.3),
            (2, 2, 0.7),
            (3, 0, 0.25),
        ] {
            t[r * classes + c] = w;
        }
        let target = Tensor::<2>::from_data(TensorData::new(t, [rows, classes]), &device);
        let weights = Tensor::<1>::from_data(
            TensorData::new(vec![1.0f32, -2.0, 0.5, 3.0, 1.5], [rows]),
            &device,
        );
        let run = |ours: bool| {
            let loss = if ours {
                softmax_cross_entropy(logits.clone(), target.clone())
            } else {
                log_softmax(logits.clone(), 1)
                    .mul(target.clone())
                    .sum_dim(1)
                    .neg()
                    .reshape([rows])
            };
            let grads = (loss.clone() * weights.clone()).sum().backward();
            (loss.inner(), logits.grad(&grads).expect("a gradient"))
        };
        let (l1, g1) = run(true);
        let (l2, g2) = run(false);
        close(l1, l2, 1e-5, "losses");
        close(g1, g2, 1e-5, "gradient");
    }
}
