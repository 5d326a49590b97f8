//! Per-channel sums and broadcasts for batch norm composed from burn's
//! operations (the masked batch norm's reference form, and its form under
//! burn's fusion).
//!
//! burn-cubecl runs a reduction over the batch, height and width at once
//! (one output per channel) on a single block of 32 threads: most of a
//! `cnn-bn` step's device time on an H100 (docs/results.md, "GPU, session
//! 19"). Here every per-channel sum is two contiguous ones (each sample's
//! plane, then the batch).

use burn::backend::tensor::FloatTensor;
use burn::backend::{Backend, TensorMetadata};
use burn::tensor::Shape;

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

#[cfg(test)]
mod tests {
    use super::super::batch_norm_one_model;
    use super::super::tests::{close, seeded};
    use burn::tensor::activation::relu;
    use burn::tensor::{Device, Tensor};

    /// burn's composition of the same formula through autodiff: the
    /// reference.
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

    /// One model's batch norm off the CPU (the masked operation with one
    /// client, every sample valid; run here in its CPU form): output,
    /// batch variance and the three gradients equal burn's composition
    /// through autodiff on odd shapes, with and without the ReLU after it;
    /// without autodiff the forward is the same.
    #[test]
    fn one_models_batch_norm_is_burns_composition() {
        let device = Device::flex().autodiff();
        for ([b, c, h, w], with_relu) in [
            ([4, 3, 5, 7], false),
            ([2, 5, 1, 1], true),
            ([7, 2, 3, 2], true),
        ] {
            let y = seeded([b, c, h, w], 1, &device).require_grad();
            let gamma = seeded([c], 2, &device).require_grad();
            let beta = seeded([c], 3, &device).require_grad();
            let target = seeded([b, c, h, w], 4, &device);
            let run = |ours: bool| {
                let (out, var) = if ours {
                    let affine = [gamma.clone(), beta.clone()];
                    let (out, stats) =
                        batch_norm_one_model(y.clone(), affine, 1e-5, with_relu, None);
                    (out, stats.expect("recorded, with no running statistics").1)
                } else {
                    let (out, var) = composed(y.clone(), gamma.clone(), beta.clone());
                    (if with_relu { relu(out) } else { out }, var)
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
            let case = format!("[{b}, {c}, {h}, {w}], ReLU {with_relu}");
            close(o1.clone(), o2, 1e-5, &format!("{case}: out"));
            close(v1, v2, 1e-5, &format!("{case}: var"));
            close(dy1, dy2, 1e-4, &format!("{case}: dy"));
            close(dg1, dg2, 1e-4, &format!("{case}: dγ"));
            close(db1, db2, 1e-4, &format!("{case}: dβ"));
            let affine = [gamma.inner(), beta.inner()];
            let plain = batch_norm_one_model(y.inner(), affine, 1e-5, with_relu, None).0;
            close(plain, o1, 0.0, &format!("{case}: without autodiff"));
        }
    }
}
