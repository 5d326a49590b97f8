//! Mini-batch losses on a model's features and outputs, for methods whose
//! local objective is more than the task loss on the outputs: FedRoD's
//! balanced softmax, FedProto's and FedPAC's pull of features toward class
//! prototypes.
//!
//! Terms of the parameters alone ([`crate::ExtraLoss`]) are written on flat
//! vectors; these terms depend on the data, so they are written on the
//! backend's tensors and differentiated by it.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};

/// What one forward pass of a mini-batch gives an [`Objective`].
pub struct Outputs {
    /// The body's output, `[batch, feature_len]`: what the head reads.
    pub features: Tensor<2>,
    /// The head's output, `[batch, classes]`.
    pub logits: Tensor<2>,
}

/// A classification loss over one mini-batch, differentiated by the
/// backend. Used through [`crate::LocalTrainer::loss_and_grad_with`].
pub trait Objective: Sync {
    /// The mean loss of the mini-batch, shape `[1]`. `batch` are the
    /// samples' local positions (to look up per-sample constants) and
    /// `labels` their classes.
    fn loss(&self, out: Outputs, batch: &[usize], labels: &[i64]) -> Tensor<1>;
}

/// Mean cross-entropy of `logits` against `labels`: the task loss of every
/// classifier.
pub fn cross_entropy(logits: Tensor<2>, labels: &[i64]) -> Tensor<1> {
    let [_, classes] = logits.dims();
    let device = logits.device();
    let y: Tensor<1, Int> =
        Tensor::from_data(TensorData::new(labels.to_vec(), [labels.len()]), &device);
    let onehot: Tensor<2> = y.one_hot::<2>(classes).float();
    log_softmax(logits, 1)
        .mul(onehot)
        .sum_dim(1)
        .mean()
        .neg()
        .reshape([1])
}

/// Plain cross-entropy as an [`Objective`].
#[derive(Clone, Copy, Debug, Default)]
pub struct CrossEntropy;

impl Objective for CrossEntropy {
    fn loss(&self, out: Outputs, _: &[usize], labels: &[i64]) -> Tensor<1> {
        cross_entropy(out.logits, labels)
    }
}

/// Balanced softmax (Ren et al., 2020): cross-entropy of `logits + log πᵧ`
/// with π the client's label distribution. FedRoD trains its generic head
/// with it, so that head estimates the class-balanced posterior however
/// skewed the client's labels are.
#[derive(Clone, Debug)]
pub struct BalancedSoftmax {
    /// log π per class; absent classes get a large negative value, as the
    /// reference's `log(count)` with count 0 gives −∞ (clamped here so the
    /// softmax stays finite).
    log_prior: Vec<f32>,
}

impl BalancedSoftmax {
    /// From the client's training label counts.
    pub fn from_counts(counts: &[usize]) -> Self {
        let total: usize = counts.iter().sum();
        let log_prior = counts
            .iter()
            .map(|&c| {
                if c == 0 {
                    -1e4
                } else {
                    (c as f64 / total as f64).ln() as f32
                }
            })
            .collect();
        Self { log_prior }
    }

    /// log π per class.
    pub fn log_prior(&self) -> &[f32] {
        &self.log_prior
    }
}

impl Objective for BalancedSoftmax {
    fn loss(&self, out: Outputs, _: &[usize], labels: &[i64]) -> Tensor<1> {
        let device = out.logits.device();
        let c = self.log_prior.len();
        let prior: Tensor<2> =
            Tensor::from_data(TensorData::new(self.log_prior.clone(), [1, c]), &device);
        cross_entropy(out.logits + prior, labels)
    }
}

/// Cross-entropy plus `λ · MSE(f(x), P_y)`: features pulled toward their
/// class's prototype (FedProto's regulariser, FedPAC's feature alignment).
/// Samples of a class without a prototype contribute no pull, as the
/// reference codes substitute the sample's own feature for the missing
/// prototype. The MSE averages over all elements of the batch's features,
/// as `nn.MSELoss` does.
#[derive(Clone, Debug)]
pub struct PrototypePull {
    /// λ.
    pub lambda: f32,
    /// `classes × feature_len`, row-major.
    pub prototypes: Vec<f32>,
    /// Whether each class has a prototype.
    pub known: Vec<bool>,
}

impl Objective for PrototypePull {
    fn loss(&self, out: Outputs, _: &[usize], labels: &[i64]) -> Tensor<1> {
        let ce = cross_entropy(out.logits, labels);
        let [b, d] = out.features.dims();
        let device = out.features.device();
        let mut target = vec![0.0f32; b * d];
        let mut mask = vec![0.0f32; b * d];
        for (k, &y) in labels.iter().enumerate() {
            let y = y as usize;
            if self.known.get(y).copied().unwrap_or(false) {
                target[k * d..(k + 1) * d].copy_from_slice(&self.prototypes[y * d..(y + 1) * d]);
                mask[k * d..(k + 1) * d].fill(1.0);
            }
        }
        let target: Tensor<2> = Tensor::from_data(TensorData::new(target, [b, d]), &device);
        let mask: Tensor<2> = Tensor::from_data(TensorData::new(mask, [b, d]), &device);
        let mse = (out.features - target)
            .mul(mask)
            .square()
            .mean()
            .reshape([1]);
        ce + mse.mul_scalar(self.lambda)
    }
}
