//! The batched trainer's batch norm: K clients' channels side by side
//! (`[B, K·C, H, W]`), each client's statistics over its own valid samples
//! only, as one operation with a hand-written backward step.
//!
//! Composed from burn's operations (mask, sums, centring, squares, square
//! root, scale, shift) it was some 25 launches forward and as many again in
//! its autodiff backward per layer. A batched GPU step of small models is
//! bound by its launches, not by arithmetic (~420 launches and ~2.1 ms for
//! `cnn-bn` at K = 10, batch 10 on an H200: docs/results.md, "GPU, session
//! 44"). On the cube backends each direction here is one kernel with one
//! cube per channel: the forward pass reads the channel three times (mean,
//! centred variance, output), the backward pass twice (three sums, then
//! dy). The CPU keeps burn's composition (its batched results are pinned by
//! tests against one client at a time); [`MaskedBatchNorm`]'s `Flex` form is
//! the same formula as burn's operations, the reference for the kernels.
//!
//! With `m` a sample's validity (0 or 1), `M` the channel's valid values
//! (at least 1, so a resting client's unused statistics stay finite) and
//! sums over every sample and position of the channel:
//!
//! - forward: `μ = Σ y·m / M`, `c = y − μ`, `σ² = Σ (c·m)² / M`,
//!   `r = √(σ² + ε)`, `out = c / r · γ + β`;
//! - backward, with `S₁ = Σ dout`, `S₂ = Σ dout·c`, `S₃ = Σ c·m`:
//!   `dβ = S₁`, `dγ = S₂ / r`, `dσ² = −γ·S₂ / (2r³)`,
//!   `dy = dout·γ/r + c·m·(2·dσ²/M) − m·(γ·S₁/r + 2·dσ²·S₃/M) / M`:
//!   the chain rule through the composition exactly (`S₃` is zero up to
//!   rounding, and kept so the two agree to rounding).

use super::batch_norm_ops::{channel_sums, per_channel};
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{
    Autodiff, AutodiffBackend, Backend, Dispatch, Flex, TensorMetadata, backend_extension,
};
use burn::tensor::{Shape, Tensor};

/// Masked batch norm over stacked clients.
#[backend_extension(Flex, Cube: cfg(any(feature = "cuda", feature = "wgpu")), Autodiff)]
pub trait MaskedBatchNorm: Backend {
    /// Batch norm of `y` (`[B, K·C, H, W]`) with scale `gamma` and shift
    /// `beta` (`[K·C]`), each client's channel normalised by the statistics
    /// of its valid samples: `valid` (`[B, K]`) is 1 for sample b of client
    /// k, `sizes` (`[K]`) each client's valid samples. The output and the
    /// batch's mean and biased variance (`[K·C]`, outside the autodiff
    /// graph).
    fn masked_batch_norm(
        y: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        valid: FloatTensor<Self>,
        sizes: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// The backward step of [`masked_batch_norm`](Self::masked_batch_norm)
    /// at `dout`, from its input and statistics: `(dy, dγ, dβ)`.
    #[allow(clippy::too_many_arguments)]
    fn masked_batch_norm_backward(
        dout: FloatTensor<Self>,
        y: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        var: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        valid: FloatTensor<Self>,
        sizes: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);
}

/// [`MaskedBatchNorm::masked_batch_norm`] on tensors of the dispatching
/// backend (`y` under autodiff; `valid` and `sizes` plain): the output and
/// the batch's mean and variance, each `[1, K·C, 1, 1]`.
pub(crate) fn masked_batch_norm(
    y: Tensor<4>,
    gamma: Tensor<1>,
    beta: Tensor<1>,
    valid: Tensor<2>,
    sizes: Tensor<1>,
    eps: f32,
) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
    let kc = y.dims()[1];
    let (out, mean, var) = <Dispatch as MaskedBatchNorm>::masked_batch_norm(
        y.into_dispatch(),
        gamma.into_dispatch(),
        beta.into_dispatch(),
        valid.into_dispatch(),
        sizes.into_dispatch(),
        eps,
    );
    let stat = |t| Tensor::<1>::from_dispatch(t).reshape([1, kc, 1, 1]);
    (Tensor::from_dispatch(out), stat(mean), stat(var))
}

/// The shapes an operation works on.
#[derive(Clone, Copy, Debug)]
struct Geom {
    batch: usize,
    clients: usize,
    /// Channels per client.
    per_client: usize,
    /// h·w.
    plane: usize,
}

impl Geom {
    fn of<B: Backend>(y: &FloatTensor<B>, valid: &FloatTensor<B>) -> Self {
        let [batch, kc, h, w] = y.shape().dims::<4>();
        let clients = valid.shape().dims::<2>()[1];
        Self {
            batch,
            clients,
            per_client: kc / clients,
            plane: h * w,
        }
    }

    fn channels(&self) -> usize {
        self.clients * self.per_client
    }
}

/// `[B, K·C, 1, 1]`: each sample's validity for each channel of its client.
fn channel_mask<B: Backend>(valid: FloatTensor<B>, g: Geom) -> FloatTensor<B> {
    let v = B::float_reshape(valid, Shape::new([g.batch, g.clients, 1]));
    let v = B::float_expand(v, Shape::new([g.batch, g.clients, g.per_client]));
    B::float_reshape(v, Shape::new([g.batch, g.channels(), 1, 1]))
}

/// `[K·C]`: valid values per channel, at least 1.
fn channel_counts<B: Backend>(sizes: FloatTensor<B>, g: Geom) -> FloatTensor<B> {
    let s = B::float_reshape(sizes, Shape::new([g.clients, 1]));
    let s = B::float_expand(s, Shape::new([g.clients, g.per_client]));
    let s = B::float_reshape(s, Shape::new([g.channels()]));
    B::float_clamp_min(
        B::float_mul_scalar(s, (g.plane as f32).into()),
        1.0f32.into(),
    )
}

/// The forward formula as burn's operations: `(out, mean, var)`.
fn forward_composed<B: Backend>(
    y: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    valid: FloatTensor<B>,
    sizes: FloatTensor<B>,
    eps: f32,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let g = Geom::of::<B>(&y, &valid);
    let mask = channel_mask::<B>(valid, g);
    let counts = channel_counts::<B>(sizes, g);
    let masked = B::float_mul(y.clone(), mask.clone());
    let mean = B::float_div(channel_sums::<B>(masked), counts.clone());
    let centred = B::float_sub(y, per_channel::<B>(mean.clone()));
    let kept = B::float_mul(centred.clone(), mask);
    let var = B::float_div(channel_sums::<B>(B::float_mul(kept.clone(), kept)), counts);
    let root = B::float_sqrt(B::float_add_scalar(var.clone(), eps.into()));
    let out = B::float_div(centred, per_channel::<B>(root));
    let out = B::float_mul(out, per_channel::<B>(gamma));
    let out = B::float_add(out, per_channel::<B>(beta));
    (out, mean, var)
}

/// The backward formula as burn's operations: `(dy, dγ, dβ)`.
#[allow(clippy::too_many_arguments)]
fn backward_composed<B: Backend>(
    dout: FloatTensor<B>,
    y: FloatTensor<B>,
    mean: FloatTensor<B>,
    var: FloatTensor<B>,
    gamma: FloatTensor<B>,
    valid: FloatTensor<B>,
    sizes: FloatTensor<B>,
    eps: f32,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let g = Geom::of::<B>(&y, &valid);
    let mask = channel_mask::<B>(valid, g);
    let counts = channel_counts::<B>(sizes, g);
    let centred = B::float_sub(y, per_channel::<B>(mean));
    let s1 = channel_sums::<B>(dout.clone());
    let s2 = channel_sums::<B>(B::float_mul(dout.clone(), centred.clone()));
    let kept = B::float_mul(centred.clone(), mask.clone());
    let s3 = channel_sums::<B>(kept.clone());
    let root = B::float_sqrt(B::float_add_scalar(var, eps.into()));
    let dgamma = B::float_div(s2.clone(), root.clone());
    // dσ² = −γ·S₂ / (2r³); its share of dy per kept value: 2·dσ²/M.
    let cube = B::float_mul(B::float_mul(root.clone(), root.clone()), root.clone());
    let dvar = B::float_div(
        B::float_neg(B::float_mul(gamma.clone(), s2)),
        B::float_mul_scalar(cube, 2.0f32.into()),
    );
    let slope = B::float_div(B::float_mul_scalar(dvar, 2.0f32.into()), counts.clone());
    let scale = B::float_div(gamma, root);
    let shift = B::float_div(
        B::float_add(
            B::float_mul(scale.clone(), s1.clone()),
            B::float_mul(slope.clone(), s3),
        ),
        counts,
    );
    let dy = B::float_mul(dout, per_channel::<B>(scale));
    let dy = B::float_add(dy, B::float_mul(kept, per_channel::<B>(slope)));
    let dy = B::float_sub(dy, B::float_mul(mask, per_channel::<B>(shift)));
    (dy, dgamma, s1)
}

impl MaskedBatchNorm for Flex {
    fn masked_batch_norm(
        y: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        valid: FloatTensor<Self>,
        sizes: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        forward_composed::<Self>(y, gamma, beta, valid, sizes, eps)
    }

    fn masked_batch_norm_backward(
        dout: FloatTensor<Self>,
        y: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        var: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        valid: FloatTensor<Self>,
        sizes: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        backward_composed::<Self>(dout, y, mean, var, gamma, valid, sizes, eps)
    }
}

/// The backward step's state: y, the statistics, γ and the validity.
#[derive(Debug)]
struct MaskedBatchNormBackward {
    eps: f32,
}

type State<B> = [FloatTensor<B>; 6];

impl<B: MaskedBatchNorm> Backward<B, 3> for MaskedBatchNormBackward {
    type State = State<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_y, node_gamma, node_beta] = ops.parents;
        let dout = grads.consume::<B>(&ops.node);
        let [y, mean, var, gamma, valid, sizes] = ops.state;
        let (dy, dgamma, dbeta) =
            B::masked_batch_norm_backward(dout, y, mean, var, gamma, valid, sizes, self.eps);
        for (node, grad) in [(node_y, dy), (node_gamma, dgamma), (node_beta, dbeta)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: MaskedBatchNorm, C: CheckpointStrategy> MaskedBatchNorm for Autodiff<B, C> {
    fn masked_batch_norm(
        y: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        valid: FloatTensor<Self>,
        sizes: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let inputs = [y, gamma, beta];
        let prep = MaskedBatchNormBackward { eps }
            .prepare::<C>(inputs.each_ref().map(|t| t.node()))
            .compute_bound()
            .stateful();
        let [y, gamma, beta] = inputs.map(|t| t.into_primitive());
        let (valid, sizes) = (valid.into_primitive(), sizes.into_primitive());
        let (out, mean, var) = B::masked_batch_norm(
            y.clone(),
            gamma.clone(),
            beta,
            valid.clone(),
            sizes.clone(),
            eps,
        );
        let out = match prep {
            OpsKind::Tracked(prep) => {
                prep.finish([y, mean.clone(), var.clone(), gamma, valid, sizes], out)
            }
            OpsKind::UnTracked(prep) => prep.finish(out),
        };
        (out, Self::from_inner(mean), Self::from_inner(var))
    }

    fn masked_batch_norm_backward(
        dout: FloatTensor<Self>,
        y: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        var: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        valid: FloatTensor<Self>,
        sizes: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        // Not differentiated again: the inner backend's step, detached.
        let (dy, dgamma, dbeta) = B::masked_batch_norm_backward(
            dout.into_primitive(),
            y.into_primitive(),
            mean.into_primitive(),
            var.into_primitive(),
            gamma.into_primitive(),
            valid.into_primitive(),
            sizes.into_primitive(),
            eps,
        );
        (
            Self::from_inner(dy),
            Self::from_inner(dgamma),
            Self::from_inner(dbeta),
        )
    }
}

// With burn's `fusion` (`cuda-tuned`) the cube backend fuses the
// composition's element-wise operations itself.
#[cfg(feature = "cuda-tuned")]
impl MaskedBatchNorm for burn::backend::Cube {
    fn masked_batch_norm(
        y: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        valid: FloatTensor<Self>,
        sizes: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        forward_composed::<Self>(y, gamma, beta, valid, sizes, eps)
    }

    fn masked_batch_norm_backward(
        dout: FloatTensor<Self>,
        y: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        var: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        valid: FloatTensor<Self>,
        sizes: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        backward_composed::<Self>(dout, y, mean, var, gamma, valid, sizes, eps)
    }
}

#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "cuda-tuned")))]
mod cube {
    //! One cube per channel: its threads stride over the channel's B·H·W
    //! values and meet in shared memory for each sum.

    use super::super::cube::{F32, THREADS, address, channel_value, cube_sum, empty_f32};
    use super::{Geom, MaskedBatchNorm, backward_composed, forward_composed};
    use burn::backend::tensor::FloatTensor;
    use burn::tensor::{DType, Shape};
    use burn_cubecl::CubeBackend;
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::tensor::CubeTensor;
    use cubecl::prelude::*;

    /// Client k's valid values per channel: its valid samples' planes, at
    /// least 1.
    #[cube]
    fn valid_values<F: Float>(sizes: &Tensor<F>, k: usize, plane: usize) -> F {
        F::max(sizes[k] * F::cast_from(plane), F::new(1.0))
    }

    /// Sample b's validity for client k.
    #[cube]
    fn validity<F: Float>(
        valid: &Tensor<F>,
        i: usize,
        plane: usize,
        clients: usize,
        k: usize,
    ) -> F {
        valid[(i / plane) * clients + k]
    }

    #[cube(launch_unchecked, address_type = "dynamic")]
    #[allow(clippy::too_many_arguments)]
    fn masked_bn_forward_kernel<F: Float>(
        y: &Tensor<F>,
        gamma: &Tensor<F>,
        beta: &Tensor<F>,
        valid: &Tensor<F>,
        sizes: &Tensor<F>,
        out: &mut Tensor<F>,
        mean_out: &mut Tensor<F>,
        var_out: &mut Tensor<F>,
        clients: usize,
        per_client: usize,
        plane: usize,
        len: usize,
        eps: InputScalar,
        #[define(F)] _dtype: ElemType,
    ) {
        let (ch, stride) = (CUBE_POS, CUBE_DIM as usize);
        let (channels, k) = (clients * per_client, ch / per_client);
        let count = valid_values::<F>(sizes, k, plane);
        let mut sums = Shared::new_slice(THREADS as usize);
        let mut squares = Shared::new_slice(THREADS as usize);

        let mut acc = F::new(0.0);
        let mut i = UNIT_POS as usize;
        while i < len {
            acc += y[channel_value(i, ch, channels, plane)]
                * validity::<F>(valid, i, plane, clients, k);
            i += stride;
        }
        let mean = cube_sum::<F>(acc, &mut sums) / count;

        let mut acc = F::new(0.0);
        let mut i = UNIT_POS as usize;
        while i < len {
            let kept = (y[channel_value(i, ch, channels, plane)] - mean)
                * validity::<F>(valid, i, plane, clients, k);
            acc += kept * kept;
            i += stride;
        }
        let var = cube_sum::<F>(acc, &mut squares) / count;

        let root = F::sqrt(var + eps.get::<F>());
        let (scale, shift) = (gamma[ch], beta[ch]);
        let mut i = UNIT_POS as usize;
        while i < len {
            let j = channel_value(i, ch, channels, plane);
            out[j] = (y[j] - mean) / root * scale + shift;
            i += stride;
        }
        if UNIT_POS == 0 {
            mean_out[ch] = mean;
            var_out[ch] = var;
        }
    }

    #[cube(launch_unchecked, address_type = "dynamic")]
    #[allow(clippy::too_many_arguments)]
    fn masked_bn_backward_kernel<F: Float>(
        dout: &Tensor<F>,
        y: &Tensor<F>,
        mean: &Tensor<F>,
        var: &Tensor<F>,
        gamma: &Tensor<F>,
        valid: &Tensor<F>,
        sizes: &Tensor<F>,
        dy: &mut Tensor<F>,
        dgamma: &mut Tensor<F>,
        dbeta: &mut Tensor<F>,
        clients: usize,
        per_client: usize,
        plane: usize,
        len: usize,
        eps: InputScalar,
        #[define(F)] _dtype: ElemType,
    ) {
        let (ch, stride) = (CUBE_POS, CUBE_DIM as usize);
        let (channels, k) = (clients * per_client, ch / per_client);
        let count = valid_values::<F>(sizes, k, plane);
        let mu = mean[ch];
        let mut first = Shared::new_slice(THREADS as usize);
        let mut second = Shared::new_slice(THREADS as usize);
        let mut third = Shared::new_slice(THREADS as usize);

        let (mut a1, mut a2, mut a3) = (F::new(0.0), F::new(0.0), F::new(0.0));
        let mut i = UNIT_POS as usize;
        while i < len {
            let j = channel_value(i, ch, channels, plane);
            let (d, c) = (dout[j], y[j] - mu);
            a1 += d;
            a2 += d * c;
            a3 += c * validity::<F>(valid, i, plane, clients, k);
            i += stride;
        }
        let s1 = cube_sum::<F>(a1, &mut first);
        let s2 = cube_sum::<F>(a2, &mut second);
        let s3 = cube_sum::<F>(a3, &mut third);

        let g = gamma[ch];
        let root = F::sqrt(var[ch] + eps.get::<F>());
        let dvar = -(g * s2) / (root * root * root * F::new(2.0));
        let slope = dvar * F::new(2.0) / count;
        let scale = g / root;
        let shift = (scale * s1 + slope * s3) / count;
        let mut i = UNIT_POS as usize;
        while i < len {
            let j = channel_value(i, ch, channels, plane);
            let m = validity::<F>(valid, i, plane, clients, k);
            dy[j] = dout[j] * scale + (y[j] - mu) * m * slope - m * shift;
            i += stride;
        }
        if UNIT_POS == 0 {
            dgamma[ch] = s2 / root;
            dbeta[ch] = s1;
        }
    }

    /// Whether the kernels take these tensors: `f32`, the expected shapes,
    /// and cubes of [`THREADS`] threads on this device.
    fn fits(tensors: &[&CubeTensor], g: Geom) -> bool {
        let threads_fit =
            tensors[0].client.properties().hardware.max_cube_dim.0 >= THREADS && g.clients > 0;
        threads_fit && tensors.iter().all(|t| t.dtype == DType::F32)
    }

    impl MaskedBatchNorm for CubeBackend {
        fn masked_batch_norm(
            y: CubeTensor,
            gamma: CubeTensor,
            beta: CubeTensor,
            valid: CubeTensor,
            sizes: CubeTensor,
            eps: f32,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
            let g = Geom::of::<Self>(&y, &valid);
            if !fits(&[&y, &gamma, &beta, &valid, &sizes], g) {
                return forward_composed::<Self>(y, gamma, beta, valid, sizes, eps);
            }
            let [y, gamma, beta, valid, sizes] =
                [y, gamma, beta, valid, sizes].map(into_contiguous);
            let out = empty_f32(&y, y.meta.shape().clone());
            let (mean, var) = (
                empty_f32(&y, Shape::new([g.channels()])),
                empty_f32(&y, Shape::new([g.channels()])),
            );
            let client = y.client.clone();
            let address = address(&[&y, &out]);
            // SAFETY: one cube per channel of `y` (K·C of them); every index
            // is below B·K·C·H·W (for `y` and `out`), K·C (`gamma`, `beta`,
            // the statistics), B·K (`valid`) or K (`sizes`), all contiguous.
            unsafe {
                masked_bn_forward_kernel::launch_unchecked(
                    &client,
                    CubeCount::Static(g.channels() as u32, 1, 1),
                    CubeDim::new_1d(THREADS),
                    address,
                    y.into_tensor_arg(),
                    gamma.into_tensor_arg(),
                    beta.into_tensor_arg(),
                    valid.into_tensor_arg(),
                    sizes.into_tensor_arg(),
                    out.clone().into_tensor_arg(),
                    mean.clone().into_tensor_arg(),
                    var.clone().into_tensor_arg(),
                    g.clients,
                    g.per_client,
                    g.plane,
                    g.batch * g.plane,
                    InputScalar::new(eps, F32),
                    F32,
                );
            }
            (out, mean, var)
        }

        fn masked_batch_norm_backward(
            dout: CubeTensor,
            y: CubeTensor,
            mean: CubeTensor,
            var: CubeTensor,
            gamma: CubeTensor,
            valid: CubeTensor,
            sizes: CubeTensor,
            eps: f32,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
            let g = Geom::of::<Self>(&y, &valid);
            if !fits(&[&dout, &y, &mean, &var, &gamma, &valid, &sizes], g) {
                return backward_composed::<Self>(dout, y, mean, var, gamma, valid, sizes, eps);
            }
            let [dout, y, mean, var, gamma, valid, sizes] =
                [dout, y, mean, var, gamma, valid, sizes].map(into_contiguous);
            let dy = empty_f32(&y, y.meta.shape().clone());
            let (dgamma, dbeta) = (
                empty_f32(&y, Shape::new([g.channels()])),
                empty_f32(&y, Shape::new([g.channels()])),
            );
            let client = y.client.clone();
            let address = address(&[&y, &dout, &dy]);
            // SAFETY: as the forward kernel's; `dout` and `dy` have `y`'s shape.
            unsafe {
                masked_bn_backward_kernel::launch_unchecked(
                    &client,
                    CubeCount::Static(g.channels() as u32, 1, 1),
                    CubeDim::new_1d(THREADS),
                    address,
                    dout.into_tensor_arg(),
                    y.into_tensor_arg(),
                    mean.into_tensor_arg(),
                    var.into_tensor_arg(),
                    gamma.into_tensor_arg(),
                    valid.into_tensor_arg(),
                    sizes.into_tensor_arg(),
                    dy.clone().into_tensor_arg(),
                    dgamma.clone().into_tensor_arg(),
                    dbeta.clone().into_tensor_arg(),
                    g.clients,
                    g.per_client,
                    g.plane,
                    g.batch * g.plane,
                    InputScalar::new(eps, F32),
                    F32,
                );
            }
            (dy, dgamma, dbeta)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{close, seeded};
    use super::masked_batch_norm;
    use burn::tensor::{Device, Tensor, TensorData};

    /// The formula through burn's autodiff: the reference.
    fn composed(
        y: Tensor<4>,
        gamma: Tensor<1>,
        beta: Tensor<1>,
        valid: &[f32],
        clients: usize,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let [b, kc, h, w] = y.dims();
        let c = kc / clients;
        let device = y.device();
        let mask: Vec<f32> = (0..b)
            .flat_map(|s| (0..kc).map(move |ch| valid[s * clients + ch / c]))
            .collect();
        let mask = Tensor::<4>::from_data(TensorData::new(mask, [b, kc, 1, 1]), &device);
        let counts: Vec<f32> = (0..kc)
            .map(|ch| {
                let n: f32 = (0..b).map(|s| valid[s * clients + ch / c]).sum();
                (n * (h * w) as f32).max(1.0)
            })
            .collect();
        let counts = Tensor::<4>::from_data(TensorData::new(counts, [1, kc, 1, 1]), &device);
        let sums = |t: Tensor<4>| t.sum_dim(0).sum_dim(2).sum_dim(3);
        let mean = sums(y.clone() * mask.clone()) / counts.clone();
        let centred = y - mean.clone();
        let var = sums((centred.clone() * mask).square()) / counts;
        let out = centred / (var.clone() + 1e-5).sqrt() * gamma.reshape([1, kc, 1, 1])
            + beta.reshape([1, kc, 1, 1]);
        (out, mean, var)
    }

    /// Output, statistics and the three gradients equal the formula through
    /// autodiff: with padded samples, a resting client (no valid sample:
    /// its statistics stay finite, its gradients zero where the loss does
    /// not look) and a client whose only valid sample makes a 1×1 plane's
    /// variance zero.
    #[test]
    fn the_operation_is_the_masked_formula_forward_and_backward() {
        let device = Device::flex().autodiff();
        // (batch, clients, channels per client, h, w, valid [b][k])
        let cases: [(usize, usize, usize, usize, usize, Vec<f32>); 3] = [
            (
                4,
                3,
                2,
                5,
                3,
                vec![1., 1., 0., 1., 0., 0., 1., 1., 0., 0., 1., 0.],
            ),
            (3, 2, 5, 1, 1, vec![1., 1., 0., 1., 0., 1.]),
            (2, 2, 3, 1, 1, vec![1., 1., 0., 1.]),
        ];
        for (b, k, c, h, w, valid) in cases {
            let kc = k * c;
            let y = seeded([b, kc, h, w], 1, &device).require_grad();
            let gamma = seeded([kc], 2, &device).require_grad();
            let beta = seeded([kc], 3, &device).require_grad();
            // Zero where the sample is padding, as the trainer's loss weights.
            let weights: Vec<f32> = seeded::<4>([b, kc, h, w], 4, &device)
                .into_data()
                .try_to_vec::<f32>()
                .unwrap()
                .into_iter()
                .enumerate()
                .map(|(i, v)| v * valid[i / (kc * h * w) * k + i / (h * w) % kc / c])
                .collect();
            let weights = Tensor::<4>::from_data(TensorData::new(weights, [b, kc, h, w]), &device);
            let sizes: Vec<f32> = (0..k)
                .map(|j| (0..b).map(|s| valid[s * k + j]).sum())
                .collect();
            let plain = |v: Vec<f32>, n: usize| {
                Tensor::<1>::from_data(TensorData::new(v, [n]), &device.clone().inner())
            };
            let valid_t = plain(valid.clone(), b * k).reshape([b, k]);
            let run = |ours: bool| {
                let (out, mean, var) = if ours {
                    masked_batch_norm(
                        y.clone(),
                        gamma.clone(),
                        beta.clone(),
                        valid_t.clone(),
                        plain(sizes.clone(), k),
                        1e-5,
                    )
                } else {
                    composed(y.clone(), gamma.clone(), beta.clone(), &valid, k)
                };
                let grads = (out.clone() * weights.clone()).sum().backward();
                (
                    out.inner(),
                    mean.inner(),
                    var.inner(),
                    y.grad(&grads).expect("dy"),
                    gamma.grad(&grads).expect("dγ"),
                    beta.grad(&grads).expect("dβ"),
                )
            };
            let (o1, m1, v1, dy1, dg1, db1) = run(true);
            let (o2, m2, v2, dy2, dg2, db2) = run(false);
            let case = format!("[{b}, {k}×{c}, {h}, {w}]");
            close(o1, o2, 1e-5, &format!("{case}: out"));
            close(m1, m2, 1e-6, &format!("{case}: mean"));
            close(v1, v2, 1e-6, &format!("{case}: var"));
            close(dy1, dy2, 1e-4, &format!("{case}: dy"));
            close(dg1, dg2, 1e-4, &format!("{case}: dγ"));
            close(db1, db2, 1e-5, &format!("{case}: dβ"));
        }
    }
}
