//! A concrete model ([`ModelSpec`]): a registered architecture
//! ([`crate::arch`]) built for one input shape and output width, as pure
//! functions of its flat parameter vector.

use crate::NnError;
pub use crate::arch::ModelKind;
use crate::arch::sequential::SequentialConfig;
use crate::arch::{Draw, LayerDesc, Net};
use crate::kernels;
use crate::resident::{BatchStats, RunningStats};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor, TensorData};
use fedweave_core::{ParamLayout, RngStream};
use rand::{Rng, RngCore};
use rand_distr::{Distribution, Normal};
use std::sync::Arc;

/// A regression model's training loss (observed targets only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegressionLoss {
    /// Mean absolute error.
    Mae,
    /// Mean squared error.
    Mse,
}

/// What a sample's feature values are, as far as a model's input layer
/// cares (the dataset's `InputKind` without its padding detail).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum InputValues {
    /// Real values.
    #[default]
    Dense,
    /// Token ids below `vocab`.
    Tokens {
        /// Rows of the embedding table.
        vocab: usize,
    },
    /// One categorical id per position, position `j` below `cardinalities[j]`.
    Categorical {
        /// Ids per position.
        cardinalities: Vec<usize>,
    },
}

/// What a model is built from beyond the sample shape: the kind of input
/// values, the embedding width of the embedding models and the layer list
/// of a `sequential` model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelInput {
    /// The input values.
    pub values: InputValues,
    /// Embedding width of `textcnn` / `mf` (`None`: the model's default).
    pub embed_dim: Option<usize>,
    /// The layers of a `sequential` model (`[model] layers` and `head`).
    pub sequential: Option<SequentialConfig>,
}

/// TextCNN's default embedding width: 256 in pFedGraph's code (the paper
/// gives none; the 300 of "300-d" is the pooled feature width, 3 × 100).
pub const TEXTCNN_EMBED_DIM: usize = 256;
/// Matrix factorisation's default embedding width.
pub const MF_EMBED_DIM: usize = 32;

/// Where a model's parts lie in its flat parameter vector: what split
/// methods (FedRep, FedPer, LG-FedAvg, FedBABU, FedRoD) share or keep, and
/// the batch-norm layers FedBN keeps local.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSplit {
    /// The body (feature extractor): every layer before the head.
    pub base: std::ops::Range<usize>,
    /// The head: the last linear layer (classifier, or forecast layer) of
    /// the built-ins; a `sequential` model's layers from `[model] head` on.
    pub head: std::ops::Range<usize>,
    /// The batch-norm layers' scales and shifts (empty without BN).
    pub batch_norm: Vec<std::ops::Range<usize>>,
}

/// A concrete model: architecture plus input and output sizes.
#[derive(Clone, Debug)]
pub struct ModelSpec {
    kind: ModelKind,
    input_shape: Vec<usize>,
    num_classes: usize,
    /// What it was built from (compared, and kept so the spec can be told
    /// apart from another layer list of the same name).
    input: ModelInput,
    layout: ParamLayout,
    /// Batch-norm layers, in forward order: (channels, offset of the running
    /// mean in the buffer vector; the running variance follows it).
    batch_norms: Vec<(usize, usize)>,
    /// Where this model trains and is evaluated (the CPU unless
    /// [`on`](Self::on) says otherwise): carried by the spec so that every
    /// training and evaluation path of every algorithm follows one choice.
    device: Device,
    /// The built architecture.
    net: Arc<dyn Net>,
}

impl PartialEq for ModelSpec {
    fn eq(&self, other: &Self) -> bool {
        // The net is a function of the rest.
        self.kind == other.kind
            && self.input_shape == other.input_shape
            && self.num_classes == other.num_classes
            && self.input == other.input
            && self.layout == other.layout
            && self.device == other.device
    }
}

impl ModelSpec {
    /// Validates the input shape for the architecture and builds the layout.
    /// `num_classes` is the output width: classes, or the forecast horizon
    /// for the `gru`.
    pub fn new(
        kind: ModelKind,
        input_shape: &[usize],
        num_classes: usize,
    ) -> Result<Self, NnError> {
        Self::with_input(kind, input_shape, num_classes, &ModelInput::default())
    }

    /// As [`new`](Self::new) for inputs that are not plain values: token ids
    /// (`textcnn`) or categorical ids (`mf`), which size the embedding
    /// tables, and for `sequential` models, whose layers `input` carries. A
    /// model that cannot read the input is an error naming both.
    pub fn with_input(
        kind: ModelKind,
        input_shape: &[usize],
        num_classes: usize,
        input: &ModelInput,
    ) -> Result<Self, NnError> {
        let built = kind.build(input_shape, num_classes, input)?;
        Ok(Self {
            kind,
            input_shape: input_shape.to_vec(),
            num_classes,
            input: input.clone(),
            layout: built.layout,
            batch_norms: built.batch_norms,
            device: Device::flex(),
            net: built.net,
        })
    }

    /// The same model trained and evaluated on `device` (from
    /// [`crate::Backend::device`]).
    pub fn on(mut self, device: Device) -> Self {
        self.device = device;
        self
    }

    /// The device this model trains and is evaluated on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The built architecture.
    pub(crate) fn net(&self) -> &dyn Net {
        &*self.net
    }

    /// The architecture.
    pub fn kind(&self) -> ModelKind {
        self.kind
    }

    /// What the model was built from beyond its shape.
    pub fn input(&self) -> &ModelInput {
        &self.input
    }

    /// Output width: number of classes, or forecast horizon.
    pub fn num_classes(&self) -> usize {
        self.num_classes
    }

    /// The loss the model trains on for regression targets: matrix
    /// factorisation fits ratings by squared error (the MF literature, RMSE
    /// reported); the others by masked absolute error (the traffic
    /// literature).
    pub fn regression_loss(&self) -> RegressionLoss {
        self.net.regression_loss()
    }

    /// The layer list `fedweave export` writes, with PyTorch's module names
    /// and arguments; `None` for the architectures that are not a plain
    /// sequence of layers (gru, textcnn, mf: their kind names them).
    pub fn describe(&self) -> Option<Vec<LayerDesc>> {
        self.net.describe(&self.layout)
    }

    /// Whether training draws randomness inside the forward pass (a
    /// `sequential` model's dropout): the trainer then keys a mask stream
    /// per mini-batch, as it does for augmentation.
    pub fn draws_in_training(&self) -> bool {
        self.net.draws_in_training()
    }

    /// Each batch-norm layer's `(channels, offset in the buffer vector)`:
    /// its running means at `offset..offset + channels`, its variances next.
    pub(crate) fn batch_norms(&self) -> &[(usize, usize)] {
        &self.batch_norms
    }

    /// Length of the local buffer vector (batch-norm running means and
    /// variances). Buffers are not parameters: no gradient, and algorithms
    /// never mix them, so each client keeps statistics of its own data.
    pub fn buffer_len(&self) -> usize {
        self.batch_norms.iter().map(|&(c, _)| 2 * c).sum()
    }

    /// Fresh buffers: running means 0, running variances 1 (PyTorch).
    pub fn init_buffers(&self) -> Vec<f32> {
        let mut b = vec![0.0; self.buffer_len()];
        for &(c, at) in &self.batch_norms {
            b[at + c..at + 2 * c].fill(1.0);
        }
        b
    }

    /// The shape of one input sample (C×H×W images, steps×features
    /// sequences, anything for the `mlp`).
    pub fn input_shape(&self) -> &[usize] {
        &self.input_shape
    }

    /// Elements of one input sample.
    pub fn input_len(&self) -> usize {
        self.input_shape.iter().product()
    }

    /// Layout of the flat parameter vector.
    pub fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    /// The initialisation of the reference code of each model, so results
    /// compare with the authors': PyTorch's defaults — conv/linear weights
    /// and biases ~ U(−1/√fan_in, 1/√fan_in) (kaiming-uniform with a = √5),
    /// batch-norm and group-norm scale 1 and shift 0, GRU weights ~
    /// U(−1/√hidden, 1/√hidden) — with these exceptions: ResNet-8 (FedDWA's
    /// `kaiming_normal_`) conv and linear weights ~ N(0, 2/fan_in); ResNet-18
    /// (torchvision) conv weights ~ N(0, 2/fan_out), fan_out = out·k·k;
    /// TextCNN embeddings ~ U(−0.1, 0.1) (pFedGraph); matrix factorisation
    /// embeddings and biases ~ N(0, 0.1²), head weights 1 and bias 0 (plain
    /// biased MF at the start); a `sequential` embedding ~ N(0, 1)
    /// (`nn.Embedding`). Tensors are drawn in layout order, so two models
    /// of the same layout draw the same values from the same stream.
    pub fn init(&self, rng: &mut impl Rng) -> Vec<f32> {
        let rng: &mut dyn RngCore = rng;
        let mut out = vec![0.0f32; self.layout.len()];
        for group in self.layout.groups() {
            let tensors: Vec<_> = self
                .layout
                .tensors()
                .iter()
                .filter(|t| group.range.contains(&t.offset))
                .collect();
            let first = tensors[0];
            if self.net.is_batch_norm(&group.name) {
                let c = first.shape[0];
                out[first.offset..first.offset + c].fill(1.0);
                continue;
            }
            let fan_in = match first.shape.len() {
                4 => first.shape[1] * first.shape[2] * first.shape[3],
                _ => first.shape[0],
            };
            for t in tensors {
                let values = &mut out[t.range()];
                match self.net.draw(&group.name, t, fan_in) {
                    Draw::Fill(v) => values.fill(v),
                    Draw::Normal(std) => fill_normal(values, std, rng),
                    Draw::Uniform(bound) => {
                        for x in values {
                            *x = rng.random_range(-bound..bound);
                        }
                    }
                }
            }
        }
        out
    }

    /// Forward pass: a batch of flattened inputs `[batch, input_len]` to
    /// outputs (logits, or the forecast). `norm` says whether batch norm uses
    /// the batch's statistics (training; they are recorded for the running
    /// averages) or the running ones (evaluation).
    pub(crate) fn forward(&self, p: &[ParamTensor], x: Tensor<2>, norm: &mut Norm) -> Tensor<2> {
        let features = self.features(p, x, norm);
        self.head(p, features)
    }

    /// The body: inputs to the features the head reads (`[batch,
    /// feature_len]`). Feature-level methods (FedRoD, FedProto, FedPAC,
    /// kNN-Per) work on this representation.
    pub(crate) fn features(&self, p: &[ParamTensor], x: Tensor<2>, norm: &mut Norm) -> Tensor<2> {
        self.net.features(p, x, norm)
    }

    /// The head, features to outputs: the last linear layer of the
    /// built-ins (ResNet-9's has no bias and scales its logits by 0.2), a
    /// `sequential` model's layers from its `head` index on.
    pub(crate) fn head(&self, p: &[ParamTensor], features: Tensor<2>) -> Tensor<2> {
        self.net.head(p, features)
    }

    /// Width of the features (the body's output) the head reads.
    pub fn feature_len(&self) -> usize {
        self.net.feature_len()
    }

    /// The named parts split methods work on: a body followed by the head
    /// (the built-ins' last layer group; a `sequential` model's groups from
    /// its `head` layer on), and the batch-norm groups.
    pub fn split(&self) -> ModelSplit {
        let first = &self.layout.groups()[self.net.head_group(&self.layout)];
        let head = first.range.start..self.layout.len();
        ModelSplit {
            base: 0..head.start,
            head,
            batch_norm: self
                .layout
                .groups()
                .iter()
                .filter(|g| self.net.is_batch_norm(&g.name))
                .map(|g| g.range.clone())
                .collect(),
        }
    }

    /// Builds the parameter tensors from a flat vector, without gradients
    /// (evaluation; training keeps them in a [`crate::LocalTrainer`]).
    pub(crate) fn tensors(&self, flat: &[f32], device: &Device) -> Vec<ParamTensor> {
        self.layout
            .tensors()
            .iter()
            .map(|t| {
                let data = TensorData::new(flat[t.range()].to_vec(), t.shape.clone());
                match t.shape.len() {
                    1 => ParamTensor::T1(Tensor::from_data(data, device)),
                    2 => ParamTensor::T2(Tensor::from_data(data, device)),
                    4 => ParamTensor::T4(Tensor::from_data(data, device)),
                    r => unreachable!("layouts only hold rank 1, 2 and 4 tensors, got {r}"),
                }
            })
            .collect()
    }
}

/// `[batch, C·H·W]` inputs as `[batch, C, H, W]` images.
pub(crate) fn to_image(x: Tensor<2>, [c, h, w]: [usize; 3]) -> Tensor<4> {
    let [batch, _] = x.dims();
    x.reshape([batch, c, h, w])
}

/// Fills `values` with N(0, std²) draws.
fn fill_normal(values: &mut [f32], std: f32, rng: &mut dyn RngCore) {
    let normal = Normal::new(0.0, std).expect("a finite positive std");
    for x in values {
        *x = normal.sample(rng);
    }
}

/// `[b, C, H, W]` to `[b, C·H·W]`.
pub(crate) fn flatten(y: Tensor<4>) -> Tensor<2> {
    let [b, ch, hh, ww] = y.dims();
    y.reshape([b, ch * hh * ww])
}

/// Batch-norm ε and momentum (PyTorch defaults).
pub(crate) const BN_EPS: f32 = 1e-5;
pub(crate) const BN_MOMENTUM: f32 = 0.1;

/// How batch norm normalises in a forward pass.
pub(crate) enum Norm<'a> {
    /// Evaluation: the running statistics in this buffer vector.
    Running(&'a [f32]),
    /// Training: the batch's own statistics, which are also recorded per
    /// batch-norm layer (kept on the device, [`BatchStats`]; `None` where
    /// the layer folded them into the running statistics, the third field,
    /// itself), and the stream dropout masks are drawn from (`None`: no
    /// dropout).
    Batch(
        Vec<Option<BatchStats>>,
        Option<Box<RngStream>>,
        Option<&'a mut RunningStats>,
    ),
}

impl Norm<'_> {
    /// The stream of training-mode dropout masks (`None` in evaluation).
    pub(crate) fn dropout(&mut self) -> Option<&mut RngStream> {
        match self {
            Norm::Batch(_, rng, _) => rng.as_deref_mut(),
            Norm::Running(_) => None,
        }
    }

    /// Batch norm of layer `which` (`(channels, buffer offset)`) with scale
    /// `gamma` and shift `beta`, on `[batch, C, H, W]`.
    pub(crate) fn apply(
        &mut self,
        which: usize,
        (c, at): (usize, usize),
        y: Tensor<4>,
        gamma: &ParamTensor,
        beta: &ParamTensor,
    ) -> Tensor<4> {
        let device = y.device();
        let [_, _, h, w] = y.dims();
        // The CPU in `f32` and the GPU backends have their own training-mode
        // batch norm; the CPU in `f64` composes burn's operations below.
        if let Norm::Batch(record, _, running) = self {
            if let Some(op) = kernels::batch_norm_for(&y) {
                let (out, mean, var) =
                    kernels::batch_norm_train(op, y, gamma.t1(), beta.t1(), BN_EPS);
                record_stats(record, which, c, h * w, Some((mean, var)));
                return out;
            }
            if !kernels::on_cpu(&y) {
                let affine = [gamma.t1(), beta.t1()];
                let layer = running.as_deref_mut().map(|r| r.layer(which));
                let (out, stats) = kernels::batch_norm_one_model(y, affine, BN_EPS, false, layer);
                record_stats(record, which, c, h * w, stats);
                return out;
            }
        }
        let (mean, var): (Tensor<4>, Tensor<4>) = match self {
            Norm::Running(buffers) => {
                let stat = |range: std::ops::Range<usize>| {
                    Tensor::<1>::from_data(TensorData::new(buffers[range].to_vec(), [c]), &device)
                        .reshape([1, c, 1, 1])
                };
                (stat(at..at + c), stat(at + c..at + 2 * c))
            }
            Norm::Batch(record, _, _) => {
                let count = (y.dims()[0] * h * w) as f32;
                let mean = channel_sums(y.clone()) / count;
                let var = channel_sums((y.clone() - mean.clone()).square()) / count;
                debug_assert_eq!(record.len(), which, "batch norms run in order");
                record.push(Some(BatchStats::of(&mean, &var, h * w)));
                (mean, var)
            }
        };
        let scale = gamma.t1().reshape([1, c, 1, 1]);
        let shift = beta.t1().reshape([1, c, 1, 1]);
        (y - mean) / (var + BN_EPS).sqrt() * scale + shift
    }

    /// [`Norm::apply`] then ReLU: one kernel each way when training on the
    /// CPU in `f32` (the same bits as the two operations).
    pub(crate) fn apply_relu(
        &mut self,
        which: usize,
        (c, at): (usize, usize),
        y: Tensor<4>,
        gamma: &ParamTensor,
        beta: &ParamTensor,
    ) -> Tensor<4> {
        if let Norm::Batch(record, _, running) = self {
            let [_, _, h, w] = y.dims();
            let (out, stats) = if kernels::on_cpu_f32(&y) {
                let (out, mean, var) =
                    kernels::batch_norm_relu_train(y, gamma.t1(), beta.t1(), BN_EPS);
                (out, Some((mean, var)))
            } else if !kernels::on_cpu(&y) {
                let affine = [gamma.t1(), beta.t1()];
                let layer = running.as_deref_mut().map(|r| r.layer(which));
                kernels::batch_norm_one_model(y, affine, BN_EPS, true, layer)
            } else {
                return relu(self.apply(which, (c, at), y, gamma, beta));
            };
            record_stats(record, which, c, h * w, stats);
            return out;
        }
        relu(self.apply(which, (c, at), y, gamma, beta))
    }
}

/// Appends batch norm `which`'s batch statistics (`[c]` mean and
/// variance, `None` when the layer folded them already) over planes of
/// `hw` values to `record`.
fn record_stats(
    record: &mut Vec<Option<BatchStats>>,
    which: usize,
    c: usize,
    hw: usize,
    stats: Option<(Tensor<1>, Tensor<1>)>,
) {
    debug_assert_eq!(record.len(), which, "batch norms run in order");
    record.push(stats.map(|(mean, var)| {
        let (mean, var) = (mean.reshape([1, c, 1, 1]), var.reshape([1, c, 1, 1]));
        BatchStats::of(&mean, &var, hw)
    }));
}

/// Σ over the batch and the plane of each channel of `y` (`[b, c, h, w]`)
/// as `[1, c, 1, 1]`: a sum along each row of h·w contiguous values, then
/// over the batch. burn-cubecl runs one reduction over dims (0, 2, 3) with
/// few outputs on a single block of 32 threads (Nsight Compute on an H100:
/// up to ~1 ms per batch-norm statistic of a `cnn-bn` step); the two sums
/// take ~7 µs. (One model on the CPU takes the fused batch-norm kernel.)
pub(crate) fn channel_sums(y: Tensor<4>) -> Tensor<4> {
    let [b, c, h, w] = y.dims();
    y.reshape([b, c, h * w])
        .sum_dim(2)
        .sum_dim(0)
        .reshape([1, c, 1, 1])
}

/// A parameter tensor of rank 1, 2 or 4.
#[derive(Clone)]
pub(crate) enum ParamTensor {
    T1(Tensor<1>),
    T2(Tensor<2>),
    T4(Tensor<4>),
}

impl ParamTensor {
    pub(crate) fn t1(&self) -> Tensor<1> {
        match self {
            Self::T1(t) => t.clone(),
            _ => unreachable!("layout rank mismatch"),
        }
    }
    pub(crate) fn t2(&self) -> Tensor<2> {
        match self {
            Self::T2(t) => t.clone(),
            _ => unreachable!("layout rank mismatch"),
        }
    }
    pub(crate) fn t4(&self) -> Tensor<4> {
        match self {
            Self::T4(t) => t.clone(),
            _ => unreachable!("layout rank mismatch"),
        }
    }

    /// An autodiff leaf (tracking its gradient) of layout shape `shape` over
    /// a rank-1 parameter tensor: a reshape of the same contiguous buffer.
    pub(crate) fn leaf(flat: Tensor<1>, shape: &[usize]) -> Self {
        match shape.len() {
            1 => Self::T1(flat.autodiff().require_grad()),
            2 => Self::T2(flat.reshape([shape[0], shape[1]]).autodiff().require_grad()),
            4 => Self::T4(
                flat.reshape([shape[0], shape[1], shape[2], shape[3]])
                    .autodiff()
                    .require_grad(),
            ),
            r => unreachable!("layouts only hold rank 1, 2 and 4 tensors, got {r}"),
        }
    }

    /// This leaf's gradient as a rank-1 tensor without autodiff (`None` if
    /// the loss does not depend on it), taken out of `grads`: the caller
    /// then holds its buffer's only handle, so host terms add into it in
    /// place instead of copying it first.
    pub(crate) fn grad_flat(&self, grads: &mut burn::tensor::Gradients) -> Option<Tensor<1>> {
        match self {
            Self::T1(t) => t.grad_remove(grads),
            Self::T2(t) => t.grad_remove(grads).map(|g| {
                let n = g.shape().num_elements();
                g.reshape([n])
            }),
            Self::T4(t) => t.grad_remove(grads).map(|g| {
                let n = g.shape().num_elements();
                g.reshape([n])
            }),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::arch::gru::GRU_HIDDEN;

    /// The two-step channel sums equal one reduction over dims (0, 2, 3).
    #[test]
    fn channel_sums_equal_a_sum_over_batch_and_plane() {
        let device = Device::flex();
        let y = Tensor::<4>::random([3, 4, 5, 6], burn::tensor::Distribution::Default, &device);
        let ours = channel_sums(y.clone())
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let direct = y
            .sum_dims(&[0, 2, 3])
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        assert_eq!(ours.len(), 4);
        for (a, b) in ours.iter().zip(&direct) {
            assert!((a - b).abs() <= 1e-5 * b.abs(), "{a} vs {b}");
        }
    }

    /// Checks `spec`'s gradient at its init on one full batch of `data`
    /// against the loss itself, as a property that holds on any CPU: along
    /// the unit gradient direction ĝ the loss's slope, measured by central
    /// differences, must equal ‖g‖ (to 5 %), and the step down must lower
    /// the loss. The step's norm is chosen so that the first-order change
    /// is `rel_change` of the loss: large against f32 rounding, small
    /// against curvature (the differences' error is second order in the
    /// step). Batch norm normalises with the batch's statistics throughout,
    /// so the loss is a fixed function of the parameters. Returns
    /// (slope / ‖g‖, loss, loss after the step down).
    pub(crate) fn check_gradient(
        spec: &ModelSpec,
        data: &crate::LocalData,
        rel_change: f64,
    ) -> (f64, f64, f64) {
        let p = spec.init(&mut fedweave_core::rng_stream(
            1,
            0,
            0,
            fedweave_core::Purpose::ModelInit,
        ));
        let sgd = crate::SgdConfig {
            momentum: 0.0,
            weight_decay: 0.0,
        };
        let batch: Vec<usize> = (0..data.len()).collect();
        let mut t = crate::LocalTrainer::new(
            spec,
            &crate::Device::flex(),
            &p,
            &spec.init_buffers(),
            sgd,
            None,
        );
        let loss = t.loss_and_grad(data, &batch, &[]);
        let mut g = vec![0.0f32; p.len()];
        t.read_grad(&mut g);
        let norm = g.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
        assert!(norm > 0.0 && norm.is_finite(), "gradient norm {norm}");
        let eps = rel_change * loss / norm;
        let mut at = |sign: f64| {
            let q: Vec<f32> = p
                .iter()
                .zip(&g)
                .map(|(&pi, &gi)| (f64::from(pi) + sign * eps * f64::from(gi) / norm) as f32)
                .collect();
            t.load_params(&q);
            (t.loss_and_grad(data, &batch, &[]), q)
        };
        let ((up, q_up), (down, q_down)) = (at(1.0), at(-1.0));
        // The step actually taken along ĝ, after the parameters' f32 rounding.
        let along: f64 = q_up
            .iter()
            .zip(&q_down)
            .zip(&g)
            .map(|((&a, &b), &gi)| (f64::from(a) - f64::from(b)) * f64::from(gi) / norm)
            .sum();
        ((up - down) / along / norm, loss, down)
    }

    /// Trains `spec` from its init on the samples `(x, y)` (one full batch)
    /// and returns the mean loss of the first step and of `steps` later
    /// steps: a model whose forward and backward are right fits a tiny batch.
    pub(crate) fn first_and_later_loss(
        spec: &ModelSpec,
        data: &crate::LocalData,
        lr: f32,
        steps: usize,
    ) -> (f64, f64) {
        let mut p = spec.init(&mut fedweave_core::rng_stream(
            1,
            0,
            0,
            fedweave_core::Purpose::ModelInit,
        ));
        let mut buffers = spec.init_buffers();
        let cfg = crate::TrainConfig {
            lr,
            momentum: 0.9,
            weight_decay: 0.0,
            batch_size: data.len(),
            iterations: 1,
            epochs: 0,
        };
        let mut run = |iterations: usize, round: u64| {
            crate::train_local(
                spec,
                &mut p,
                &mut buffers,
                data,
                &crate::TrainConfig {
                    iterations,
                    ..cfg.clone()
                },
                &[],
                &[],
                None,
                &mut fedweave_core::rng_stream(1, round, 0, fedweave_core::Purpose::Batches),
            )
            .mean_loss
        };
        let first = run(1, 1);
        let later = run(steps, 2);
        (first, later)
    }

    #[test]
    fn parameter_counts_match_the_reference_models() {
        // pFedGraph's SimpleCNN for 1×28×28 has 44,426 parameters (fc1 256→120).
        let cnn = ModelSpec::new(ModelKind::CNN, &[1, 28, 28], 10).unwrap();
        assert_eq!(cnn.layout().len(), 44_426);
        // pFedGraph's SimpleCNN for CIFAR (3×32×32, METHODS.md §1.6):
        // 32 −conv5→ 28 −pool→ 14 −conv5→ 10 −pool→ 5, flatten 16·5·5 = 400.
        //   conv1 6·3·5·5 + 6   =    456
        //   conv2 16·6·5·5 + 16 =  2,416
        //   fc1   400·120 + 120 = 48,120
        //   fc2   120·84 + 84   = 10,164
        //   fc3   84·10 + 10    =    850
        //   total                 62,006
        let cnn32 = ModelSpec::new(ModelKind::CNN, &[3, 32, 32], 10).unwrap();
        assert_eq!(456 + 2_416 + 48_120 + 10_164 + 850, 62_006);
        assert_eq!(cnn32.layout().len(), 62_006);
        let mlp = ModelSpec::new(ModelKind::MLP, &[1, 28, 28], 10).unwrap();
        assert_eq!(mlp.layout().len(), 784 * 200 + 200 + 200 * 200 + 200 + 2010);
    }

    #[test]
    fn cnn_bn_and_gru_sizes() {
        // PFLlib's FedAvgCNN on 1×28×28 has 582,026 parameters; BN adds
        // 2·(32 + 64) scales and shifts, and 2·(32 + 64) buffers.
        let bn = ModelSpec::new(ModelKind::CNN_BN, &[1, 28, 28], 10).unwrap();
        assert_eq!(bn.layout().len(), 582_026 + 192);
        assert_eq!(bn.buffer_len(), 192);
        let groups: Vec<_> = bn
            .layout()
            .groups()
            .iter()
            .map(|g| g.name.as_str())
            .collect();
        assert_eq!(groups, ["conv1", "bn1", "conv2", "bn2", "fc1", "fc"]);
        let init = bn.init(&mut fedweave_core::rng_stream(
            1,
            0,
            0,
            fedweave_core::Purpose::ModelInit,
        ));
        let gamma = bn.layout().tensor("bn2.weight").unwrap().range();
        assert!(init[gamma].iter().all(|&g| g == 1.0));
        let buffers = bn.init_buffers();
        assert!(
            buffers[..32].iter().all(|&m| m == 0.0) && buffers[32..64].iter().all(|&v| v == 1.0)
        );
        // 3×32×32: flatten 64·5·5 = 1600 → 512.
        let bn32 = ModelSpec::new(ModelKind::CNN_BN, &[3, 32, 32], 10).unwrap();
        assert_eq!(
            bn32.layout().len(),
            2432 + 64 + 51_264 + 128 + 1600 * 512 + 512 + 5130
        );
        // GRU(1 → 64) as torch.nn.GRU: 3·64·(1 + 64) weights + 2·192 biases; head 64 → 3.
        let gru = ModelSpec::new(ModelKind::GRU, &[12, 1], 3).unwrap();
        assert_eq!(gru.layout().len(), 3 * 64 * 65 + 2 * 192 + 64 * 3 + 3);
        assert_eq!(gru.buffer_len(), 0);
        assert!(ModelSpec::new(ModelKind::GRU, &[1, 28, 28], 3).is_err());
    }

    /// A plain f64 GRU (PyTorch's equations) to check the burn graph against.
    fn reference_gru(spec: &ModelSpec, p: &[f32], x: &[f32]) -> Vec<f64> {
        let t = |name: &str| &p[spec.layout().tensor(name).unwrap().range()];
        let (wi, wh, bi, bh) = (
            t("gru.weight_ih"),
            t("gru.weight_hh"),
            t("gru.bias_ih"),
            t("gru.bias_hh"),
        );
        let (wo, bo) = (t("head.weight"), t("head.bias"));
        let (hd, g) = (GRU_HIDDEN, 3 * GRU_HIDDEN);
        let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
        let mut h = vec![0.0f64; hd];
        for &xt in x {
            let gx: Vec<f64> = (0..g).map(|k| f64::from(xt * wi[k] + bi[k])).collect();
            let gh: Vec<f64> = (0..g)
                .map(|k| {
                    f64::from(bh[k])
                        + (0..hd)
                            .map(|j| h[j] * f64::from(wh[j * g + k]))
                            .sum::<f64>()
                })
                .collect();
            h = (0..hd)
                .map(|k| {
                    let r = sig(gx[k] + gh[k]);
                    let z = sig(gx[hd + k] + gh[hd + k]);
                    let n = (gx[2 * hd + k] + r * gh[2 * hd + k]).tanh();
                    (1.0 - z) * n + z * h[k]
                })
                .collect();
        }
        let out = bo.len();
        (0..out)
            .map(|o| {
                f64::from(bo[o])
                    + (0..hd)
                        .map(|j| h[j] * f64::from(wo[j * out + o]))
                        .sum::<f64>()
            })
            .collect()
    }

    #[test]
    fn gru_forward_matches_the_pytorch_equations() {
        let spec = ModelSpec::new(ModelKind::GRU, &[5, 1], 2).unwrap();
        let p = spec.init(&mut fedweave_core::rng_stream(
            4,
            0,
            0,
            fedweave_core::Purpose::ModelInit,
        ));
        let xs = [[0.5f32, -1.0, 2.0, 0.0, 0.3], [1.0, 1.0, -0.5, 0.2, -2.0]];
        let device = Device::flex();
        let tensors = spec.tensors(&p, &device);
        let x = Tensor::<2>::from_data(TensorData::new(xs.concat(), [2, 5]), &device);
        let out = spec
            .forward(&tensors, x, &mut Norm::Running(&[]))
            .into_data();
        let out = out.as_slice::<f32>().unwrap();
        for (b, xb) in xs.iter().enumerate() {
            let want = reference_gru(&spec, &p, xb);
            for (o, w) in want.iter().enumerate() {
                assert!(
                    (f64::from(out[b * 2 + o]) - w).abs() < 1e-5,
                    "{} vs {w}",
                    out[b * 2 + o]
                );
            }
        }
    }

    #[test]
    fn feddwa_cnn_size_and_shape() {
        // FedDWA's CIFAR CNN (METHODS.md §4.3): 32 −conv3→ 30 −pool→ 15
        // −conv3→ 13 −pool→ 6, flatten 64·6·6 = 2304.
        //   conv1 32·3·3·3 + 32    =       896
        //   bn1   2·32             =        64
        //   conv2 64·32·3·3 + 64   =    18,496
        //   bn2   2·64             =       128
        //   fc1   2304·512 + 512   = 1,180,160
        //   fc    512·10 + 10      =     5,130
        //   total                    1,204,874
        let spec = ModelSpec::new(ModelKind::CNN_DWA, &[3, 32, 32], 10).unwrap();
        assert_eq!(896 + 64 + 18_496 + 128 + 1_180_160 + 5_130, 1_204_874);
        assert_eq!(spec.layout().len(), 1_204_874);
        assert_eq!(spec.buffer_len(), 192);
        let p = spec.init(&mut fedweave_core::rng_stream(
            1,
            0,
            0,
            fedweave_core::Purpose::ModelInit,
        ));
        let device = Device::flex();
        let tensors = spec.tensors(&p, &device);
        let x = Tensor::<2>::zeros([2, 3 * 32 * 32], &device);
        let buffers = spec.init_buffers();
        let out = spec.forward(&tensors, x, &mut Norm::Running(&buffers));
        assert_eq!(out.dims(), [2, 10]);
    }

    #[test]
    fn feddwa_cnn_gradient_matches_the_loss() {
        use rand::Rng;
        let spec = ModelSpec::new(ModelKind::CNN_DWA, &[3, 32, 32], 2).unwrap();
        let mut rng = fedweave_core::rng_stream(2, 0, 0, fedweave_core::Purpose::Dataset);
        let n = 8;
        let y: Vec<u32> = (0..n as u32).map(|i| i % 2).collect();
        let x: Vec<f32> = (0..n * 3072)
            .map(|i| f32::from(y[i / 3072] as u8) + rng.random_range(-0.5f32..0.5))
            .collect();
        let idx: Vec<usize> = (0..n).collect();
        let data = crate::LocalData::new(&x, &y, &idx);
        let (slope, loss, down) = check_gradient(&spec, &data, 1e-2);
        assert!((slope - 1.0).abs() < 0.05, "slope / |g| = {slope}");
        assert!(down < loss, "{loss} → {down}");
    }

    #[test]
    fn cnn_rejects_small_images() {
        let err = ModelSpec::new(ModelKind::CNN, &[1, 8, 8], 10).unwrap_err();
        assert!(err.to_string().contains("28×28"), "{err}");
    }
}
