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
//! The convolution's bias before it and a ReLU after it can be part of the
//! operation (two launches saved each way for each). With `y` the input
//! plus the bias, `m` a sample's validity (0 or 1), `M` the channel's valid
//! values (at least 1, so a resting client's unused statistics stay finite)
//! and sums over every sample and position of the channel:
//!
//! - forward: `μ = Σ y·m / M`, `c = y − μ`, `σ² = Σ (c·m)² / M`,
//!   `r = √(σ² + ε)`, `out = c / r · γ + β`;
//! - backward, with `S₁ = Σ dout`, `S₂ = Σ dout·c`, `S₃ = Σ c·m`:
//!   `dβ = S₁`, `dγ = S₂ / r`, `dσ² = −γ·S₂ / (2r³)`,
//!   `dy = dout·γ/r + c·m·(2·dσ²/M) − m·(γ·S₁/r + 2·dσ²·S₃/M) / M`:
//!   the chain rule through the composition exactly (`S₃` is zero up to
//!   rounding, and kept so the two agree to rounding); the bias's gradient
//!   is `Σ dy`; with the ReLU, `dout` is first zeroed where `out ≤ 0` (burn's
//!   ReLU and its gradient).

use super::batch_norm_ops::{channel_sums, per_channel};
use super::relu_masked;
use crate::model::BN_MOMENTUM;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{
    Autodiff, AutodiffBackend, Backend, Dispatch, Flex, TensorMetadata, backend_extension,
};
use burn::tensor::{Device, Shape, Tensor, TensorData};

/// Masked batch norm over stacked clients.
#[backend_extension(Flex, Cube: cfg(any(feature = "cuda", feature = "wgpu")), Autodiff)]
pub trait MaskedBatchNorm: Backend {
    /// Batch norm of `y` (`[B, K·C, H, W]`) plus `bias` (`[K·C]`, when
    /// `has_bias`; any tensor otherwise, never read) with scale `gamma` and shift `beta` (`[K·C]`), each client's
    /// channel normalised by the statistics of its valid samples: `valid`
    /// (`[B, K]`) is 1 for sample b of client k, `sizes` (`[K]`) each
    /// client's valid samples; then ReLU when `relu`. The output and the
    /// batch's mean and biased variance (`[K·C]`, outside the autodiff
    /// graph).
    #[allow(clippy::too_many_arguments)]
    fn masked_batch_norm(
        y: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        has_bias: bool,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        valid: FloatTensor<Self>,
        sizes: FloatTensor<Self>,
        eps: f32,
        relu: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>);

    /// The backward step of [`masked_batch_norm`](Self::masked_batch_norm)
    /// at `dout`, from its inputs and statistics: `(dy, dbias, dγ, dβ)`
    /// (`dbias`, the sum of `dy` per channel, whether or not there is a
    /// bias).
    #[allow(clippy::too_many_arguments)]
    fn masked_batch_norm_backward(
        dout: FloatTensor<Self>,
        y: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        has_bias: bool,
        mean: FloatTensor<Self>,
        var: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        valid: FloatTensor<Self>,
        sizes: FloatTensor<Self>,
        eps: f32,
        relu: bool,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
    );

    /// [`masked_batch_norm`](Self::masked_batch_norm) that also folds the
    /// batch's statistics into `running_mean` and `running_var` (`[K, C]`)
    /// in place, as `RunningStats::fold_rows` does (momentum `momentum`,
    /// the variance unbiased; a client whose size is 0 keeps its own): one
    /// launch per layer fewer. `None` where the backend does not write them
    /// in place: the caller folds them.
    #[allow(clippy::too_many_arguments)]
    fn masked_batch_norm_folding(
        _y: FloatTensor<Self>,
        _bias: FloatTensor<Self>,
        _has_bias: bool,
        _gamma: FloatTensor<Self>,
        _beta: FloatTensor<Self>,
        _valid: FloatTensor<Self>,
        _sizes: FloatTensor<Self>,
        _eps: f32,
        _relu: bool,
        _running_mean: FloatTensor<Self>,
        _running_var: FloatTensor<Self>,
        _momentum: f32,
    ) -> Option<(FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>)> {
        None
    }
}

/// `(dy, dbias, dγ, dβ)` of [`MaskedBatchNorm::masked_batch_norm_backward`].
pub type Gradients4<B> = (
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
    FloatTensor<B>,
);

/// What surrounds a masked batch norm in one operation: the convolution's
/// bias before it, a ReLU after it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Around {
    /// `[K·C]`, added to the input.
    pub(crate) bias: Option<Tensor<1>>,
    /// ReLU on the output.
    pub(crate) relu: bool,
}

/// [`MaskedBatchNorm::masked_batch_norm`] on tensors of the dispatching
/// backend (`y`, the bias and the affine parameters under autodiff; `valid`
/// and `sizes` plain): the output and the batch's mean and variance, each
/// `[1, K·C, 1, 1]`.
pub(crate) fn masked_batch_norm(
    y: Tensor<4>,
    [gamma, beta]: [Tensor<1>; 2],
    valid: Tensor<2>,
    sizes: Tensor<1>,
    eps: f32,
    around: Around,
) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
    let kc = y.dims()[1];
    let has_bias = around.bias.is_some();
    // Without a bias γ stands in for it (never read).
    let bias = around.bias.unwrap_or_else(|| gamma.clone());
    let (out, mean, var) = <Dispatch as MaskedBatchNorm>::masked_batch_norm(
        y.into_dispatch(),
        bias.into_dispatch(),
        has_bias,
        gamma.into_dispatch(),
        beta.into_dispatch(),
        valid.into_dispatch(),
        sizes.into_dispatch(),
        eps,
        around.relu,
    );
    let stat = |t| Tensor::<1>::from_dispatch(t).reshape([1, kc, 1, 1]);
    (Tensor::from_dispatch(out), stat(mean), stat(var))
}

/// Training-mode batch norm of one model's `y` (`[B, C, H, W]`, every
/// sample valid) with scale `gamma` and shift `beta`, then ReLU when
/// `relu`: the masked operation with one client, one kernel each way off
/// the CPU (burn's operations were ~45 launches a layer there). The output,
/// and the batch's mean and variance (`[C]`, detached) unless the
/// operation folded them into `running` (means and variances, `[1, C]`)
/// itself.
pub(crate) fn batch_norm_one_model(
    y: Tensor<4>,
    affine: [Tensor<1>; 2],
    eps: f32,
    relu: bool,
    running: Option<[&mut Tensor<2>; 2]>,
) -> (Tensor<4>, Option<(Tensor<1>, Tensor<1>)>) {
    let [b, c, _, _] = y.dims();
    let (valid, sizes) = all_valid(b, &y.device().inner());
    let around = Around { bias: None, relu };
    if let Some(layer) = running {
        let folding = (&affine, &valid, &sizes, &around, layer);
        if let Some(out) = masked_batch_norm_folding(&y, folding, eps, BN_MOMENTUM) {
            return (out, None);
        }
    }
    let (out, mean, var) = masked_batch_norm(y, affine, valid, sizes, eps, around);
    (out, Some((mean.reshape([c]), var.reshape([c]))))
}

/// One client's validity (`[B, 1]` of ones) and batch size (`[1]` = B) on
/// `device`, uploaded once per thread and kept (a step of one model takes
/// them for each batch norm).
fn all_valid(batch: usize, device: &Device) -> (Tensor<2>, Tensor<1>) {
    use std::cell::RefCell;
    use std::collections::HashMap;
    thread_local! {
        static KEPT: RefCell<HashMap<(usize, String), (Tensor<2>, Tensor<1>)>> =
            RefCell::new(HashMap::new());
    }
    KEPT.with_borrow_mut(|kept| {
        kept.entry((batch, format!("{device:?}")))
            .or_insert_with(|| {
                let ones = TensorData::new(vec![1.0f32; batch], [batch, 1]);
                let size = TensorData::new(vec![batch as f32], [1]);
                (
                    Tensor::from_data(ones, device),
                    Tensor::from_data(size, device),
                )
            })
            .clone()
    })
}

/// What [`masked_batch_norm_folding`] reads: γ and β, the validity, the
/// sizes, what surrounds the operation and the running statistics (means,
/// variances).
pub(crate) type Folding<'a> = (
    &'a [Tensor<1>; 2],
    &'a Tensor<2>,
    &'a Tensor<1>,
    &'a Around,
    [&'a mut Tensor<2>; 2],
);

/// [`masked_batch_norm`] folding the batch's statistics into the running
/// ones (`running`: means and variances, `[K, C]`) in place
/// ([`MaskedBatchNorm::masked_batch_norm_folding`]): the output, or `None`
/// where the backend does not (the caller calls [`masked_batch_norm`]).
pub(crate) fn masked_batch_norm_folding(
    y: &Tensor<4>,
    (affine, valid, sizes, around, running): Folding,
    eps: f32,
    momentum: f32,
) -> Option<Tensor<4>> {
    let [gamma, beta] = affine;
    let [running_mean, running_var] = running;
    let bias = around.bias.clone().unwrap_or_else(|| gamma.clone());
    let (out, _, _) = <Dispatch as MaskedBatchNorm>::masked_batch_norm_folding(
        y.clone().into_dispatch(),
        bias.into_dispatch(),
        around.bias.is_some(),
        gamma.clone().into_dispatch(),
        beta.clone().into_dispatch(),
        valid.clone().into_dispatch(),
        sizes.clone().into_dispatch(),
        eps,
        around.relu,
        running_mean.clone().into_dispatch(),
        running_var.clone().into_dispatch(),
        momentum,
    )?;
    Some(Tensor::from_dispatch(out))
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

/// `y` plus the bias, if any.
fn biased<B: Backend>(y: FloatTensor<B>, bias: Option<FloatTensor<B>>) -> FloatTensor<B> {
    match bias {
        Some(b) => B::float_add(y, per_channel::<B>(b)),
        None => y,
    }
}

/// The forward formula as burn's operations: `(out, mean, var)`.
#[allow(clippy::too_many_arguments)]
fn forward_composed<B: Backend>(
    y: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    valid: FloatTensor<B>,
    sizes: FloatTensor<B>,
    eps: f32,
    relu: bool,
) -> (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>) {
    let g = Geom::of::<B>(&y, &valid);
    let y = biased::<B>(y, bias);
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
    let out = if relu {
        relu_masked::<B>(out.clone(), out)
    } else {
        out
    };
    (out, mean, var)
}

/// The backward formula as burn's operations: `(dy, dbias, dγ, dβ)`.
#[allow(clippy::too_many_arguments)]
fn backward_composed<B: Backend>(
    dout: FloatTensor<B>,
    y: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    mean: FloatTensor<B>,
    var: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    valid: FloatTensor<B>,
    sizes: FloatTensor<B>,
    eps: f32,
    relu: bool,
) -> Gradients4<B> {
    let g = Geom::of::<B>(&y, &valid);
    let mask = channel_mask::<B>(valid, g);
    let counts = channel_counts::<B>(sizes, g);
    let centred = B::float_sub(biased::<B>(y, bias), per_channel::<B>(mean));
    let dout = if relu {
        // The forward's output again, for its ReLU mask.
        let root = B::float_sqrt(B::float_add_scalar(var.clone(), eps.into()));
        let out = B::float_div(centred.clone(), per_channel::<B>(root));
        let out = B::float_mul(out, per_channel::<B>(gamma.clone()));
        relu_masked::<B>(dout, B::float_add(out, per_channel::<B>(beta)))
    } else {
        dout
    };
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
    let dbias = channel_sums::<B>(dy.clone());
    (dy, dbias, dgamma, s1)
}

/// [`MaskedBatchNorm`] as burn's operations: the CPU's form (the kernels' reference)
/// and, with burn's fusion (`cuda-tuned`), the cube backend's, whose fusion
/// joins the element-wise operations itself.
macro_rules! composed {
    ($backend:ty) => {
        impl MaskedBatchNorm for $backend {
            fn masked_batch_norm(
                y: FloatTensor<Self>,
                bias: FloatTensor<Self>,
                has_bias: bool,
                gamma: FloatTensor<Self>,
                beta: FloatTensor<Self>,
                valid: FloatTensor<Self>,
                sizes: FloatTensor<Self>,
                eps: f32,
                relu: bool,
            ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
                let bias = has_bias.then_some(bias);
                forward_composed::<Self>(y, bias, gamma, beta, valid, sizes, eps, relu)
            }

            fn masked_batch_norm_backward(
                dout: FloatTensor<Self>,
                y: FloatTensor<Self>,
                bias: FloatTensor<Self>,
                has_bias: bool,
                mean: FloatTensor<Self>,
                var: FloatTensor<Self>,
                gamma: FloatTensor<Self>,
                beta: FloatTensor<Self>,
                valid: FloatTensor<Self>,
                sizes: FloatTensor<Self>,
                eps: f32,
                relu: bool,
            ) -> Gradients4<Self> {
                let bias = has_bias.then_some(bias);
                backward_composed::<Self>(
                    dout, y, bias, mean, var, gamma, beta, valid, sizes, eps, relu,
                )
            }
        }
    };
}

composed!(Flex);

/// The backward step, with (`N` = 4) or without (`N` = 3) a bias; its
/// state: [`State`].
#[derive(Debug)]
struct MaskedBatchNormBackward<const N: usize> {
    eps: f32,
    relu: bool,
}

/// y, the bias, the statistics, γ, β and the validity.
#[derive(Clone, Debug)]
struct State<B: Backend> {
    y: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    mean: FloatTensor<B>,
    var: FloatTensor<B>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    valid: FloatTensor<B>,
    sizes: FloatTensor<B>,
}

impl<const N: usize> MaskedBatchNormBackward<N> {
    /// Registers the gradients of the parents that need one: y, γ, β and
    /// the bias (`parents`, in that order).
    fn register<B: MaskedBatchNorm>(self, ops: Ops<State<B>, N>, grads: &mut Gradients) {
        let dout = grads.consume::<B>(&ops.node);
        let State {
            y,
            bias,
            mean,
            var,
            gamma,
            beta,
            valid,
            sizes,
        } = ops.state;
        let has_bias = bias.is_some();
        let bias = bias.unwrap_or_else(|| gamma.clone());
        let (dy, dbias, dgamma, dbeta) = B::masked_batch_norm_backward(
            dout, y, bias, has_bias, mean, var, gamma, beta, valid, sizes, self.eps, self.relu,
        );
        let grads_in_order = [dy, dgamma, dbeta, dbias];
        for (node, grad) in ops.parents.into_iter().zip(grads_in_order) {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

impl<B: MaskedBatchNorm> Backward<B, 3> for MaskedBatchNormBackward<3> {
    type State = State<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        self.register::<B>(ops, grads);
    }
}

impl<B: MaskedBatchNorm> Backward<B, 4> for MaskedBatchNormBackward<4> {
    type State = State<B>;

    fn backward(self, ops: Ops<Self::State, 4>, grads: &mut Gradients, _: &mut Checkpointer) {
        self.register::<B>(ops, grads);
    }
}

/// The forward pass under autodiff of `inputs` (y, γ, β and, with `N` =
/// 4, the bias).
/// with the inner backend's `forward` (`None`: it declined, and nothing is
/// recorded).
fn tracked<B: MaskedBatchNorm, C: CheckpointStrategy, const N: usize>(
    op: MaskedBatchNormBackward<N>,
    inputs: [FloatTensor<Autodiff<B, C>>; N],
    valid: FloatTensor<Autodiff<B, C>>,
    sizes: FloatTensor<Autodiff<B, C>>,
    forward: impl FnOnce(&Inputs<B>) -> Option<[FloatTensor<B>; 3]>,
) -> Option<[FloatTensor<Autodiff<B, C>>; 3]>
where
    MaskedBatchNormBackward<N>: Backward<B, N, State = State<B>>,
{
    let nodes = inputs.each_ref().map(|t| t.node());
    let mut prims = inputs.into_iter().map(|t| t.into_primitive());
    let mut next = || prims.next().expect("y, γ and β");
    let (y, gamma, beta) = (next(), next(), next());
    let inner = Inputs {
        y,
        bias: prims.next(),
        gamma,
        beta,
        valid: valid.into_primitive(),
        sizes: sizes.into_primitive(),
    };
    let [out, mean, var] = forward(&inner)?;
    let prep = op.prepare::<C>(nodes).compute_bound().stateful();
    let Inputs {
        y,
        bias,
        gamma,
        beta,
        valid,
        sizes,
    } = inner;
    let out = match prep {
        OpsKind::Tracked(prep) => {
            let state = State {
                y,
                bias,
                mean: mean.clone(),
                var: var.clone(),
                gamma,
                beta,
                valid,
                sizes,
            };
            prep.finish(state, out)
        }
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    Some([
        out,
        Autodiff::<B, C>::from_inner(mean),
        Autodiff::<B, C>::from_inner(var),
    ])
}

/// The inner backend's inputs of a masked batch norm under autodiff.
struct Inputs<B: Backend> {
    y: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
    gamma: FloatTensor<B>,
    beta: FloatTensor<B>,
    valid: FloatTensor<B>,
    sizes: FloatTensor<B>,
}

impl<B: Backend> Inputs<B> {
    /// The bias and whether there is one (γ stands in, never read).
    fn bias_arg(&self) -> (FloatTensor<B>, bool) {
        match &self.bias {
            Some(b) => (b.clone(), true),
            None => (self.gamma.clone(), false),
        }
    }
}

/// [`tracked`] with or without a bias (`bias`, when `has_bias`).
#[allow(clippy::too_many_arguments)]
fn tracked_either<B: MaskedBatchNorm, C: CheckpointStrategy>(
    [y, bias, gamma, beta]: [FloatTensor<Autodiff<B, C>>; 4],
    has_bias: bool,
    valid: FloatTensor<Autodiff<B, C>>,
    sizes: FloatTensor<Autodiff<B, C>>,
    (eps, relu): (f32, bool),
    forward: impl FnOnce(&Inputs<B>) -> Option<[FloatTensor<B>; 3]>,
) -> Option<[FloatTensor<Autodiff<B, C>>; 3]> {
    if has_bias {
        let op = MaskedBatchNormBackward::<4> { eps, relu };
        tracked::<B, C, 4>(op, [y, gamma, beta, bias], valid, sizes, forward)
    } else {
        let op = MaskedBatchNormBackward::<3> { eps, relu };
        tracked::<B, C, 3>(op, [y, gamma, beta], valid, sizes, forward)
    }
}

impl<B: MaskedBatchNorm, C: CheckpointStrategy> MaskedBatchNorm for Autodiff<B, C> {
    fn masked_batch_norm(
        y: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        has_bias: bool,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        valid: FloatTensor<Self>,
        sizes: FloatTensor<Self>,
        eps: f32,
        relu: bool,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let forward = |i: &Inputs<B>| {
            let (bias, has_bias) = i.bias_arg();
            let (y, gamma, beta) = (i.y.clone(), i.gamma.clone(), i.beta.clone());
            let (valid, sizes) = (i.valid.clone(), i.sizes.clone());
            let (out, mean, var) =
                B::masked_batch_norm(y, bias, has_bias, gamma, beta, valid, sizes, eps, relu);
            Some([out, mean, var])
        };
        let inputs = [y, bias, gamma, beta];
        let [out, mean, var] =
            tracked_either::<B, C>(inputs, has_bias, valid, sizes, (eps, relu), forward)
                .expect("the plain operation always runs");
        (out, mean, var)
    }

    fn masked_batch_norm_folding(
        y: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        has_bias: bool,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        valid: FloatTensor<Self>,
        sizes: FloatTensor<Self>,
        eps: f32,
        relu: bool,
        running_mean: FloatTensor<Self>,
        running_var: FloatTensor<Self>,
        momentum: f32,
    ) -> Option<(FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>)> {
        let running = [running_mean, running_var].map(|t| t.into_primitive());
        let forward = |i: &Inputs<B>| {
            let (bias, has_bias) = i.bias_arg();
            let (y, gamma, beta) = (i.y.clone(), i.gamma.clone(), i.beta.clone());
            let (valid, sizes) = (i.valid.clone(), i.sizes.clone());
            let [rm, rv] = running;
            let (out, mean, var) = B::masked_batch_norm_folding(
                y, bias, has_bias, gamma, beta, valid, sizes, eps, relu, rm, rv, momentum,
            )?;
            Some([out, mean, var])
        };
        let inputs = [y, bias, gamma, beta];
        let [out, mean, var] =
            tracked_either::<B, C>(inputs, has_bias, valid, sizes, (eps, relu), forward)?;
        Some((out, mean, var))
    }

    fn masked_batch_norm_backward(
        dout: FloatTensor<Self>,
        y: FloatTensor<Self>,
        bias: FloatTensor<Self>,
        has_bias: bool,
        mean: FloatTensor<Self>,
        var: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        valid: FloatTensor<Self>,
        sizes: FloatTensor<Self>,
        eps: f32,
        relu: bool,
    ) -> Gradients4<Self> {
        // Not differentiated again: the inner backend's step, detached.
        let (dy, dbias, dgamma, dbeta) = B::masked_batch_norm_backward(
            dout.into_primitive(),
            y.into_primitive(),
            bias.into_primitive(),
            has_bias,
            mean.into_primitive(),
            var.into_primitive(),
            gamma.into_primitive(),
            beta.into_primitive(),
            valid.into_primitive(),
            sizes.into_primitive(),
            eps,
            relu,
        );
        (
            Self::from_inner(dy),
            Self::from_inner(dbias),
            Self::from_inner(dgamma),
            Self::from_inner(dbeta),
        )
    }
}

#[cfg(feature = "cuda-tuned")]
composed!(burn::backend::Cube);

#[cfg(all(any(feature = "cuda", feature = "wgpu"), not(feature = "cuda-tuned")))]
mod cube {
    //! One cube per channel: its threads stride over the channel's B·H·W
    //! values and meet in shared memory for each sum.

    use super::super::cube::{F32, THREADS, address, channel_value, cube_sum, empty_f32, folded};
    use super::{Geom, Gradients4, MaskedBatchNorm, backward_composed, forward_composed};
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

    /// Channel `ch`'s bias: `bias[ch]` when `has_bias` is 1, else 0.
    #[cube]
    fn bias_of<F: Float>(bias: &Tensor<F>, ch: usize, has_bias: u32) -> F {
        let mut b = F::new(0.0);
        if has_bias == 1 {
            b = bias[ch];
        }
        b
    }

    /// The output of value `v` (input plus bias) of a channel: normalised,
    /// scaled, shifted and, when `relu` is 1, through ReLU (burn's: `≤ 0`
    /// gives 0).
    #[cube]
    fn normalised<F: Float>(v: F, mean: F, root: F, scale: F, shift: F, relu: u32) -> F {
        let out = (v - mean) / root * scale + shift;
        let mut r = out;
        if relu == 1 && out <= F::new(0.0) {
            r = F::new(0.0);
        }
        r
    }

    #[cube(launch_unchecked, address_type = "dynamic")]
    #[allow(clippy::too_many_arguments)]
    fn masked_bn_forward_kernel<F: Float>(
        y: &Tensor<F>,
        bias: &Tensor<F>,
        gamma: &Tensor<F>,
        beta: &Tensor<F>,
        valid: &Tensor<F>,
        sizes: &Tensor<F>,
        out: &mut Tensor<F>,
        mean_out: &mut Tensor<F>,
        var_out: &mut Tensor<F>,
        running_mean: &mut Tensor<F>,
        running_var: &mut Tensor<F>,
        clients: usize,
        per_client: usize,
        plane: usize,
        len: usize,
        eps: InputScalar,
        has_bias: u32,
        relu: u32,
        fold: u32,
        momentum: InputScalar,
        #[define(F)] _dtype: ElemType,
    ) {
        let (ch, stride) = (CUBE_POS, CUBE_DIM as usize);
        let (channels, k) = (clients * per_client, ch / per_client);
        let count = valid_values::<F>(sizes, k, plane);
        let b = bias_of::<F>(bias, ch, has_bias);
        let mut sums = Shared::new_slice(THREADS as usize);
        let mut squares = Shared::new_slice(THREADS as usize);

        let mut acc = F::new(0.0);
        let mut i = UNIT_POS as usize;
        while i < len {
            let v = y[channel_value(i, ch, channels, plane)] + b;
            acc += v * validity::<F>(valid, i, plane, clients, k);
            i += stride;
        }
        let mean = cube_sum::<F>(acc, &mut sums) / count;

        let mut acc = F::new(0.0);
        let mut i = UNIT_POS as usize;
        while i < len {
            let v = y[channel_value(i, ch, channels, plane)] + b;
            let kept = (v - mean) * validity::<F>(valid, i, plane, clients, k);
            acc += kept * kept;
            i += stride;
        }
        let var = cube_sum::<F>(acc, &mut squares) / count;

        let root = F::sqrt(var + eps.get::<F>());
        let (scale, shift) = (gamma[ch], beta[ch]);
        let mut i = UNIT_POS as usize;
        while i < len {
            let j = channel_value(i, ch, channels, plane);
            out[j] = normalised::<F>(y[j] + b, mean, root, scale, shift, relu);
            i += stride;
        }
        if UNIT_POS == 0 {
            mean_out[ch] = mean;
            var_out[ch] = var;
            if fold == 1 && sizes[k] != F::new(0.0) {
                let m = momentum.get::<F>();
                let count = sizes[k] * F::cast_from(plane);
                let old = (running_mean[ch], running_var[ch]);
                let (rm, rv) = folded::<F>(old.0, old.1, mean, var, count, m, F::new(1.0) - m);
                running_mean[ch] = rm;
                running_var[ch] = rv;
            }
        }
    }

    #[cube(launch_unchecked, address_type = "dynamic")]
    #[allow(clippy::too_many_arguments)]
    fn masked_bn_backward_kernel<F: Float>(
        dout: &Tensor<F>,
        y: &Tensor<F>,
        bias: &Tensor<F>,
        mean: &Tensor<F>,
        var: &Tensor<F>,
        gamma: &Tensor<F>,
        beta: &Tensor<F>,
        valid: &Tensor<F>,
        sizes: &Tensor<F>,
        dy: &mut Tensor<F>,
        dbias: &mut Tensor<F>,
        dgamma: &mut Tensor<F>,
        dbeta: &mut Tensor<F>,
        clients: usize,
        per_client: usize,
        plane: usize,
        len: usize,
        eps: InputScalar,
        has_bias: u32,
        relu: u32,
        #[define(F)] _dtype: ElemType,
    ) {
        let (ch, stride) = (CUBE_POS, CUBE_DIM as usize);
        let (channels, k) = (clients * per_client, ch / per_client);
        let count = valid_values::<F>(sizes, k, plane);
        let b = bias_of::<F>(bias, ch, has_bias);
        let mu = mean[ch];
        let (g, shift_out) = (gamma[ch], beta[ch]);
        let root = F::sqrt(var[ch] + eps.get::<F>());
        let mut first = Shared::new_slice(THREADS as usize);
        let mut second = Shared::new_slice(THREADS as usize);
        let mut third = Shared::new_slice(THREADS as usize);
        let mut fourth = Shared::new_slice(THREADS as usize);

        let (mut a1, mut a2, mut a3) = (F::new(0.0), F::new(0.0), F::new(0.0));
        let mut i = UNIT_POS as usize;
        while i < len {
            let j = channel_value(i, ch, channels, plane);
            let c = y[j] + b - mu;
            let mut d = dout[j];
            if relu == 1 && normalised::<F>(y[j] + b, mu, root, g, shift_out, 0) <= F::new(0.0) {
                d = F::new(0.0);
            }
            a1 += d;
            a2 += d * c;
            a3 += c * validity::<F>(valid, i, plane, clients, k);
            i += stride;
        }
        let s1 = cube_sum::<F>(a1, &mut first);
        let s2 = cube_sum::<F>(a2, &mut second);
        let s3 = cube_sum::<F>(a3, &mut third);

        let dvar = -(g * s2) / (root * root * root * F::new(2.0));
        let slope = dvar * F::new(2.0) / count;
        let scale = g / root;
        let shift = (scale * s1 + slope * s3) / count;
        let mut a4 = F::new(0.0);
        let mut i = UNIT_POS as usize;
        while i < len {
            let j = channel_value(i, ch, channels, plane);
            let m = validity::<F>(valid, i, plane, clients, k);
            let mut d = dout[j];
            if relu == 1 && normalised::<F>(y[j] + b, mu, root, g, shift_out, 0) <= F::new(0.0) {
                d = F::new(0.0);
            }
            let grad = d * scale + (y[j] + b - mu) * m * slope - m * shift;
            dy[j] = grad;
            a4 += grad;
            i += stride;
        }
        let s4 = cube_sum::<F>(a4, &mut fourth);
        if UNIT_POS == 0 {
            dgamma[ch] = s2 / root;
            dbeta[ch] = s1;
            dbias[ch] = s4;
        }
    }

    /// Whether the kernels take these tensors: `f32`, the expected shapes,
    /// and cubes of [`THREADS`] threads on this device.
    fn fits(tensors: &[&CubeTensor], g: Geom) -> bool {
        let threads_fit =
            tensors[0].client.properties().hardware.max_cube_dim.0 >= THREADS && g.clients > 0;
        threads_fit && tensors.iter().all(|t| t.dtype == DType::F32)
    }

    /// The forward kernel's launch on `[y, bias, γ, β, valid, sizes]` (that
    /// fit), folding into `running` (means and variances, with the momentum)
    /// when given.
    fn forward(
        inputs: [CubeTensor; 6],
        g: Geom,
        (has_bias, relu, eps): (bool, bool, f32),
        running: Option<([CubeTensor; 2], f32)>,
    ) -> (CubeTensor, CubeTensor, CubeTensor) {
        let [y, bias, gamma, beta, valid, sizes] = inputs.map(into_contiguous);
        let out = empty_f32(&y, y.meta.shape().clone());
        let (mean, var) = (
            empty_f32(&y, Shape::new([g.channels()])),
            empty_f32(&y, Shape::new([g.channels()])),
        );
        // Without running statistics two one-value buffers stand in (never
        // read or written: the fold is off).
        let (fold, [running_mean, running_var], momentum) = match running {
            Some((running, momentum)) => (1, running, momentum),
            None => (0, [0; 2].map(|_| empty_f32(&y, Shape::new([1]))), 0.0),
        };
        let client = y.client.clone();
        let address = address(&[&y, &out]);
        // SAFETY: one cube per channel of `y` (K·C of them); every index
        // is below B·K·C·H·W (for `y` and `out`), K·C (the bias, `gamma`,
        // `beta`, the statistics and the contiguous running statistics),
        // B·K (`valid`) or K (`sizes`), all contiguous; the bias is read
        // only when there is one, the running statistics written by unit 0
        // of their own channel's cube only when folding.
        unsafe {
            masked_bn_forward_kernel::launch_unchecked(
                &client,
                CubeCount::Static(g.channels() as u32, 1, 1),
                CubeDim::new_1d(THREADS),
                address,
                y.into_tensor_arg(),
                bias.into_tensor_arg(),
                gamma.into_tensor_arg(),
                beta.into_tensor_arg(),
                valid.into_tensor_arg(),
                sizes.into_tensor_arg(),
                out.clone().into_tensor_arg(),
                mean.clone().into_tensor_arg(),
                var.clone().into_tensor_arg(),
                running_mean.into_tensor_arg(),
                running_var.into_tensor_arg(),
                g.clients,
                g.per_client,
                g.plane,
                g.batch * g.plane,
                InputScalar::new(eps, F32),
                u32::from(has_bias),
                u32::from(relu),
                fold,
                InputScalar::new(momentum, F32),
                F32,
            );
        }
        (out, mean, var)
    }

    impl MaskedBatchNorm for CubeBackend {
        fn masked_batch_norm(
            y: CubeTensor,
            bias: CubeTensor,
            has_bias: bool,
            gamma: CubeTensor,
            beta: CubeTensor,
            valid: CubeTensor,
            sizes: CubeTensor,
            eps: f32,
            relu: bool,
        ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
            let g = Geom::of::<Self>(&y, &valid);
            if !fits(&[&y, &bias, &gamma, &beta, &valid, &sizes], g) {
                let bias = has_bias.then_some(bias);
                return forward_composed::<Self>(y, bias, gamma, beta, valid, sizes, eps, relu);
            }
            let inputs = [y, bias, gamma, beta, valid, sizes];
            forward(inputs, g, (has_bias, relu, eps), None)
        }

        fn masked_batch_norm_folding(
            y: CubeTensor,
            bias: CubeTensor,
            has_bias: bool,
            gamma: CubeTensor,
            beta: CubeTensor,
            valid: CubeTensor,
            sizes: CubeTensor,
            eps: f32,
            relu: bool,
            running_mean: CubeTensor,
            running_var: CubeTensor,
            momentum: f32,
        ) -> Option<(FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>)> {
            let g = Geom::of::<Self>(&y, &valid);
            let running = [&running_mean, &running_var];
            // Written in place: their own buffers, `[K, C]`.
            let in_place = running.iter().all(|t| {
                t.is_contiguous() && t.meta.shape().dims::<2>() == [g.clients, g.per_client]
            });
            let tensors = [
                &y, &bias, &gamma, &beta, &valid, &sizes, running[0], running[1],
            ];
            if !in_place || !fits(&tensors, g) {
                return None;
            }
            let inputs = [y, bias, gamma, beta, valid, sizes];
            let running = Some(([running_mean, running_var], momentum));
            Some(forward(inputs, g, (has_bias, relu, eps), running))
        }

        fn masked_batch_norm_backward(
            dout: CubeTensor,
            y: CubeTensor,
            bias: CubeTensor,
            has_bias: bool,
            mean: CubeTensor,
            var: CubeTensor,
            gamma: CubeTensor,
            beta: CubeTensor,
            valid: CubeTensor,
            sizes: CubeTensor,
            eps: f32,
            relu: bool,
        ) -> Gradients4<Self> {
            let g = Geom::of::<Self>(&y, &valid);
            let tensors = [&dout, &y, &bias, &mean, &var, &gamma, &beta, &valid, &sizes];
            if !fits(&tensors, g) {
                let bias = has_bias.then_some(bias);
                return backward_composed::<Self>(
                    dout, y, bias, mean, var, gamma, beta, valid, sizes, eps, relu,
                );
            }
            let [dout, y, bias, mean, var, gamma, beta, valid, sizes] =
                [dout, y, bias, mean, var, gamma, beta, valid, sizes].map(into_contiguous);
            let dy = empty_f32(&y, y.meta.shape().clone());
            let [dbias, dgamma, dbeta] = [0; 3].map(|_| empty_f32(&y, Shape::new([g.channels()])));
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
                    bias.into_tensor_arg(),
                    mean.into_tensor_arg(),
                    var.into_tensor_arg(),
                    gamma.into_tensor_arg(),
                    beta.into_tensor_arg(),
                    valid.into_tensor_arg(),
                    sizes.into_tensor_arg(),
                    dy.clone().into_tensor_arg(),
                    dbias.clone().into_tensor_arg(),
                    dgamma.clone().into_tensor_arg(),
                    dbeta.clone().into_tensor_arg(),
                    g.clients,
                    g.per_client,
                    g.plane,
                    g.batch * g.plane,
                    InputScalar::new(eps, F32),
                    u32::from(has_bias),
                    u32::from(relu),
                    F32,
                );
            }
            (dy, dbias, dgamma, dbeta)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{close, seeded};
    use super::{Around, masked_batch_norm};
    use burn::tensor::activation::relu;
    use burn::tensor::{Device, Tensor, TensorData};

    /// The formula through burn's autodiff: the reference.
    fn composed(
        y: Tensor<4>,
        [gamma, beta]: [Tensor<1>; 2],
        valid: &[f32],
        clients: usize,
        around: Around,
    ) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let [b, kc, h, w] = y.dims();
        let y = match around.bias {
            Some(bias) => y + bias.reshape([1, kc, 1, 1]),
            None => y,
        };
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
        let out = if around.relu { relu(out) } else { out };
        (out, mean, var)
    }

    /// Output, statistics and the gradients (y, γ, β and the bias) equal the
    /// formula through autodiff, alone, with a bias before it, a ReLU after
    /// it, or both: with padded samples, a resting client (no valid sample:
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
        let forms = [(false, false), (true, false), (false, true), (true, true)];
        for ((b, k, c, h, w, valid), (with_bias, with_relu)) in cases
            .into_iter()
            .flat_map(|case| forms.map(|form| (case.clone(), form)))
        {
            let kc = k * c;
            let y = seeded([b, kc, h, w], 1, &device).require_grad();
            let gamma = seeded([kc], 2, &device).require_grad();
            let beta = seeded([kc], 3, &device).require_grad();
            let bias = seeded([kc], 5, &device).require_grad();
            let around = Around {
                bias: with_bias.then(|| bias.clone()),
                relu: with_relu,
            };
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
                let affine = [gamma.clone(), beta.clone()];
                let (out, mean, var) = if ours {
                    masked_batch_norm(
                        y.clone(),
                        affine,
                        valid_t.clone(),
                        plain(sizes.clone(), k),
                        1e-5,
                        around.clone(),
                    )
                } else {
                    composed(y.clone(), affine, &valid, k, around.clone())
                };
                let grads = (out.clone() * weights.clone()).sum().backward();
                (
                    out.inner(),
                    mean.inner(),
                    var.inner(),
                    y.grad(&grads).expect("dy"),
                    gamma.grad(&grads).expect("dγ"),
                    beta.grad(&grads).expect("dβ"),
                    bias.grad(&grads),
                )
            };
            let (o1, m1, v1, dy1, dg1, db1, dbias1) = run(true);
            let (o2, m2, v2, dy2, dg2, db2, dbias2) = run(false);
            let case = format!("[{b}, {k}×{c}, {h}, {w}], bias {with_bias}, ReLU {with_relu}");
            match (dbias1, dbias2) {
                (Some(a), Some(b)) => close(a, b, 1e-4, &format!("{case}: dbias")),
                (None, None) => assert!(!with_bias, "{case}: no bias gradient"),
                _ => panic!("{case}: a bias gradient on one side only"),
            }
            if with_relu {
                let out = o1.clone().into_data().try_to_vec::<f32>().expect("f32");
                let zeros = out.iter().filter(|v| **v == 0.0).count();
                assert!(zeros > 0, "{case}: the ReLU cuts something");
            }
            close(o1, o2, 1e-5, &format!("{case}: out"));
            close(m1, m2, 1e-6, &format!("{case}: mean"));
            close(v1, v2, 1e-6, &format!("{case}: var"));
            close(dy1, dy2, 1e-4, &format!("{case}: dy"));
            close(dg1, dg2, 1e-4, &format!("{case}: dγ"));
            close(db1, db2, 1e-5, &format!("{case}: dβ"));
        }
    }
}
