//! Training-mode batch norm for the backends without fedweave's own CPU
//! kernel (CUDA, wgpu), from burn's operations, with a hand-written
//! backward step.
//!
//! Composed from broadcasting operations (`(y − mean)/√(var + ε)·γ + β`),
//! batch norm's backward under burn's autodiff sums each broadcast operand's
//! gradient over the batch, height and width at once (`float_sum_dims` over
//! three axes, one per broadcast operand: four per batch norm). burn-cubecl
//! runs such a reduction, with one output per channel, on a single block of
//! 32 threads: most of a `cnn-bn` step's device time on an H100
//! (docs/results.md, "GPU, session 19"). Here every per-channel sum is two
//! contiguous ones (each sample's plane, then the batch), and the backward
//! is the closed form dβ = Σ dout, dγ = Σ dout·x̂, dy = γ·s·(dout − dβ/M −
//! x̂·dγ/M) with x̂ = (y − mean)·s, s = 1/√(var + ε), over the M = b·h·w
//! values of each channel.

#[cfg(any(feature = "cuda", feature = "wgpu"))]
use burn::backend::Cube;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, AutodiffBackend, Backend, Flex, TensorMetadata, backend_extension};
use burn::tensor::Shape;

/// Training-mode batch norm as burn's operations with a backward step of
/// contiguous sums, for every backend.
#[backend_extension(Flex, Cube: cfg(any(feature = "cuda", feature = "wgpu")), Autodiff)]
pub trait BatchNormOps: Backend {
    /// Batch norm of `y` (`[b, c, h, w]`) by its own per-channel
    /// statistics, with scale `gamma` and shift `beta` (`[c]`): the output,
    /// and the batch's mean and biased variance (`[c]`, outside the
    /// autodiff graph).
    fn batch_norm_composed(
        y: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

/// Per-channel sums of `t` (`[b, c, h, w]`) as `[c]`: along each sample's
/// h·w values, then over the batch.
pub(super) fn channel_sums<B: Backend>(t: FloatTensor<B>) -> FloatTensor<B> {
    let [b, c, h, w] = t.shape().dims::<4>();
    let t = B::float_reshape(t, Shape::new([b, c, h * w]));
    let t = B::float_sum_dim(B::float_sum_dim(t, 2), 0);
    B::float_reshape(t, Shape::new([c]))
}

/// A `[c]` tensor as `[1, c, 1, 1]`, to broadcast over `[b, c, h, w]`.
pub(super) fn per_channel<B: Backend>(t: FloatTensor<B>) -> FloatTensor<B> {
    let c = t.shape().num_elements();
    B::float_reshape(t, Shape::new([1, c, 1, 1]))
}

/// The values of one channel: b·h·w.
fn count(y: &impl TensorMetadata) -> f32 {
    let [b, _, h, w] = y.shape().dims::<4>();
    (b * h * w) as f32
}

/// The forward pass's tensors.
struct Forward<B: Backend> {
    out: FloatTensor<B>,
    mean: FloatTensor<B>,
    var: FloatTensor<B>,
    /// x̂ = (y − mean)·s, kept for the backward step.
    normalised: FloatTensor<B>,
    /// s = 1/√(var + ε) per channel.
    inv_std: FloatTensor<B>,
}

fn forward<B: Backend>(
    y: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    eps: f32,
) -> Forward<B> {
    let m = count(&y);
    let mean = B::float_div_scalar(channel_sums::<B>(y.clone()), m.into());
    let centred = B::float_sub(y, per_channel::<B>(mean.clone()));
    let squares = B::float_mul(centred.clone(), centred.clone());
    let var = B::float_div_scalar(channel_sums::<B>(squares), m.into());
    let inv_std = B::float_recip(B::float_sqrt(B::float_add_scalar(var.clone(), eps.into())));
    let normalised = B::float_mul(centred, per_channel::<B>(inv_std.clone()));
    let scaled = B::float_mul(normalised.clone(), per_channel::<B>(gamma));
    let out = B::float_add(scaled, per_channel::<B>(beta));
    Forward {
        out,
        mean,
        var,
        normalised,
        inv_std,
    }
}

/// [`BatchNormOps`] for a backend without autodiff: the forward pass.
macro_rules! forward_only {
    ($backend:ty) => {
        impl BatchNormOps for $backend {
            fn batch_norm_composed(
                y: FloatTensor<Self>,
                gamma: FloatTensor<Self>,
                beta: FloatTensor<Self>,
                eps: f32,
            ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
                let f = forward::<Self>(y, gamma, beta, eps);
                (f.out, f.mean, f.var)
            }
        }
    };
}

forward_only!(Flex);
#[cfg(any(feature = "cuda", feature = "wgpu"))]
forward_only!(Cube);

/// The backward step: x̂, s and γ.
#[derive(Debug)]
struct BatchNormBackward;

impl<B: Backend> Backward<B, 3> for BatchNormBackward {
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_y, node_gamma, node_beta] = ops.parents;
        let dout = grads.consume::<B>(&ops.node);
        let (normalised, inv_std, gamma) = ops.state;
        let m = count(&dout);
        let dbeta = channel_sums::<B>(dout.clone());
        let dgamma = channel_sums::<B>(B::float_mul(dout.clone(), normalised.clone()));
        if let Some(node) = node_y {
            // dy = k·dout − k·dβ/M − x̂·(k·dγ/M), k = γ·s per channel.
            let k = B::float_mul(gamma, inv_std);
            let shift = B::float_div_scalar(B::float_mul(k.clone(), dbeta.clone()), m.into());
            let slope = B::float_div_scalar(B::float_mul(k.clone(), dgamma.clone()), m.into());
            let dy = B::float_mul(dout, per_channel::<B>(k));
            let dy = B::float_sub(dy, per_channel::<B>(shift));
            let dy = B::float_sub(dy, B::float_mul(normalised, per_channel::<B>(slope)));
            grads.register::<B>(node.id, dy);
        }
        if let Some(node) = node_gamma {
            grads.register::<B>(node.id, dgamma);
        }
        if let Some(node) = node_beta {
            grads.register::<B>(node.id, dbeta);
        }
    }
}

impl<B: BatchNormOps, C: CheckpointStrategy> BatchNormOps for Autodiff<B, C> {
    fn batch_norm_composed(
        y: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let inputs = [y, gamma, beta];
        let prep = BatchNormBackward
            .prepare::<C>(inputs.each_ref().map(|t| t.node()))
            .compute_bound()
            .stateful();
        let [y, gamma, beta] = inputs.map(|t| t.into_primitive());
        let f = forward::<B>(y, gamma.clone(), beta, eps);
        let out = match prep {
            OpsKind::Tracked(prep) => prep.finish((f.normalised, f.inv_std, gamma), f.out),
            OpsKind::UnTracked(prep) => prep.finish(f.out),
        };
        (out, Self::from_inner(f.mean), Self::from_inner(f.var))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{close, seeded};
    use super::super::{BatchNormOp, batch_norm_train};
    use super::BatchNormOps;
    use burn::backend::Dispatch;
    use burn::tensor::{Device, Tensor};

    /// burn's composition of the same formula through autodiff (the path
    /// the GPU backends took before): the reference.
    fn composed(y: Tensor<4>, gamma: Tensor<1>, beta: Tensor<1>) -> (Tensor<4>, Tensor<1>) {
        let [b, c, h, w] = y.dims();
        let m = (b * h * w) as f32;
        let mean = y.clone().sum_dim(0).sum_dim(2).sum_dim(3) / m;
        let centred = y - mean.clone();
        let var = centred.clone().square().sum_dim(0).sum_dim(2).sum_dim(3) / m;
        let out = centred / (var.clone() + 1e-5).sqrt() * gamma.reshape([1, c, 1, 1])
            + beta.reshape([1, c, 1, 1]);
        (out, var.reshape([c]))
    }

    /// Output, batch variance and the three gradients equal burn's
    /// composition through autodiff, on odd shapes; without autodiff the
    /// forward is the same.
    #[test]
    fn batch_norm_ops_agree_with_burns_composition() {
        let device = Device::flex().autodiff();
        // The GPU backends' operation, run here on the CPU backend.
        let op: BatchNormOp = <Dispatch as BatchNormOps>::batch_norm_composed;
        for [b, c, h, w] in [[4, 3, 5, 7], [2, 5, 1, 1], [7, 2, 3, 2]] {
            let y = seeded([b, c, h, w], 1, &device).require_grad();
            let gamma = seeded([c], 2, &device).require_grad();
            let beta = seeded([c], 3, &device).require_grad();
            let target = seeded([b, c, h, w], 4, &device);
            let run = |ours: bool| {
                let (out, var) = if ours {
                    let (out, _, var) =
                        batch_norm_train(op, y.clone(), gamma.clone(), beta.clone(), 1e-5);
                    (out, var)
                } else {
                    composed(y.clone(), gamma.clone(), beta.clone())
                };
                let grads = (out.clone() * target.clone()).sum().backward();
                (
                    out.inner(),
                    var.inner(),
                    y.grad(&grads).expect("dy"),
                    gamma.grad(&grads).expect("dγ"),
                    beta.grad(&grads).expect("dβ"),
                )
            };
            let (o1, v1, dy1, dg1, db1) = run(true);
            let (o2, v2, dy2, dg2, db2) = run(false);
            let case = format!("[{b}, {c}, {h}, {w}]");
            close(o1.clone(), o2, 1e-5, &format!("{case}: out"));
            close(v1, v2, 1e-5, &format!("{case}: var"));
            close(dy1, dy2, 1e-4, &format!("{case}: dy"));
            close(dg1, dg2, 1e-4, &format!("{case}: dγ"));
            close(db1, db2, 1e-4, &format!("{case}: dβ"));
            let plain = batch_norm_train(op, y.inner(), gamma.inner(), beta.inner(), 1e-5).0;
            close(plain, o1, 0.0, &format!("{case}: without autodiff"));
        }
    }
}
