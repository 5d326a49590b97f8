//! Mini-batch losses on a model's features and outputs, for methods whose
//! local objective is more than the task loss on the outputs: FedRoD's
//! balanced softmax, FedProto's and FedPAC's pull of features toward class
//! prototypes.
//!
//! Terms of the parameters alone ([`crate::ExtraLoss`]) are written on flat
//! vectors; these terms depend on the data, so they are written on the
//! backend's tensors and differentiated by it.

use crate::kernels;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Tensor, TensorData};

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
    let [batch, classes] = logits.dims();
    if !kernels::on_cpu(&logits) && batch > 0 {
        // Off the CPU: the batched trainer's loss with one client, rows
        // weighted 1/B (one kernel each way instead of ~25 launches).
        let weight = 1.0 / batch as f32;
        let target =
            one_hot(labels, classes, weight, &logits.device()).reshape([1, batch, classes]);
        return kernels::weighted_cross_entropy(logits.reshape([1, batch, classes]), None, target);
    }
    let onehot = one_hot(labels, classes, 1.0, &logits.device());
    log_softmax(logits, 1)
        .mul(onehot)
        .sum_dim(1)
        .mean()
        .neg()
        .reshape([1])
}

/// `labels` as one-hot rows `[batch, classes]` of `value`, built on the host: burn's
/// `one_hot` reads its indices back from the device twice (a range check
/// and a conversion), which would stop a GPU at every step.
///
/// # Panics
///
/// If a label is not in `0..classes` (the datasets check labels at load).
fn one_hot(labels: &[i64], classes: usize, value: f32, device: &Device) -> Tensor<2> {
    let mut rows = vec![0.0f32; labels.len() * classes];
    for (row, &label) in rows.chunks_mut(classes).zip(labels) {
        let class = usize::try_from(label)
            .ok()
            .filter(|&c| c < classes)
            .unwrap_or_else(|| panic!("label {label} outside 0..{classes}"));
        row[class] = value;
    }
    Tensor::from_data(TensorData::new(rows, [labels.len(), classes]), device)
}

/// Plain cross-entropy as an [`Objective`].
#[derive(Clone, Copy, Debug, Default)]
pub struct CrossEntropy;

impl Objective for CrossEntropy {
    fn loss(&self, out: Outputs, _: &[usize], labels: &[i64]) -> Tensor<1> {
        cross_entropy(out.logits, labels)
    }
}

/// Cross-entropy with a weight per training sample, looked up by the
/// batch's local positions: `Σ_k w_k·CE_k / |batch|` (FedEM trains each
/// mixture component on its E-step responsibilities this way; the
/// reference divides by the batch size, not by the weights' sum).
#[derive(Clone, Debug)]
pub struct WeightedCrossEntropy {
    /// w_k for every local training position.
    pub weights: Vec<f32>,
}

impl Objective for WeightedCrossEntropy {
    fn loss(&self, out: Outputs, batch: &[usize], labels: &[i64]) -> Tensor<1> {
        let [b, classes] = out.logits.dims();
        let device = out.logits.device();
        let onehot = one_hot(labels, classes, 1.0, &device);
        let w: Vec<f32> = batch.iter().map(|&k| self.weights[k]).collect();
        let w: Tensor<2> = Tensor::from_data(TensorData::new(w, [b, 1]), &device);
        log_softmax(out.logits, 1)
            .mul(onehot)
            .sum_dim(1)
            .mul(w)
            .sum()
            .div_scalar(b as f32)
            .neg()
            .reshape([1])
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

/// FedPHP's inherited-knowledge objective (Li et al., ECML-PKDD 2021):
/// `(1 − λ)·CE + λ·MMD²(f(x), g(x))`, where g is a frozen "inherited" model
/// whose features on every training sample were computed beforehand
/// ([`crate::predict`]) and are looked up by the batch's local positions.
///
/// MMD² is the biased estimate `mean(K_XX + K_YY − K_XY − K_YX)` with the
/// authors' kernel (`mmd_rbf_noaccelerate` in their FedRepo): a sum of five
/// Gaussians `exp(−‖u − v‖² / σ_i)`, σ_i = σ·2^(i−2) for i = 0…4, where σ is
/// the mean pairwise squared distance over the concatenated batch `[X; Y]`
/// (off-diagonal pairs, plus 1e-8), held constant for differentiation.
#[derive(Clone, Debug)]
pub struct InheritedMmd {
    /// λ: the weight of the MMD term (and 1 − λ that of the cross-entropy).
    pub lambda: f32,
    /// The inherited model's features, `samples × feature_len`, row-major,
    /// indexed by local position.
    pub features: Vec<f32>,
    /// Width of a feature row.
    pub feature_len: usize,
}

/// Kernels in the sum and the ratio between consecutive bandwidths (the
/// authors' `kernel_num = 5`, `kernel_mul = 2`).
const MMD_KERNELS: i32 = 5;
const MMD_KERNEL_MUL: f32 = 2.0;

/// Biased MMD² between the rows of `x` and of `y` (same shape) under the
/// multi-bandwidth Gaussian kernel of [`InheritedMmd`].
pub fn mmd_rbf(x: Tensor<2>, y: Tensor<2>) -> Tensor<1> {
    let [b, _] = x.dims();
    let n = 2 * b;
    let z = Tensor::cat(vec![x, y], 0);
    let sq = z.clone().square().sum_dim(1); // [n, 1]
    let gram = z.clone().matmul(z.transpose());
    let dist = (sq.clone() + sq.transpose() - gram.mul_scalar(2.0)).clamp_min(0.0);
    let total: f32 = dist.clone().sum().detach().into_scalar();
    let pairs = (n * n - n).max(1) as f32;
    let base = (total / pairs + 1e-8) / MMD_KERNEL_MUL.powi(MMD_KERNELS / 2);
    let mut kernel = dist.clone().mul_scalar(-1.0 / base).exp();
    for i in 1..MMD_KERNELS {
        let sigma = base * MMD_KERNEL_MUL.powi(i);
        kernel = kernel + dist.clone().mul_scalar(-1.0 / sigma).exp();
    }
    // mean(XX + YY − XY − YX) = (ΣXX + ΣYY − ΣXY − ΣYX) / b², read off
    // the kernel matrix with a ±1 sign pattern.
    let mut sign = vec![0.0f32; n * n];
    for r in 0..n {
        for c in 0..n {
            sign[r * n + c] = if (r < b) == (c < b) { 1.0 } else { -1.0 };
        }
    }
    let device = kernel.device();
    let sign: Tensor<2> = Tensor::from_data(TensorData::new(sign, [n, n]), &device);
    kernel
        .mul(sign)
        .sum()
        .div_scalar((b * b) as f32)
        .reshape([1])
}

impl Objective for InheritedMmd {
    fn loss(&self, out: Outputs, batch: &[usize], labels: &[i64]) -> Tensor<1> {
        let ce = cross_entropy(out.logits, labels);
        let y = rows_at(
            &self.features,
            self.feature_len,
            batch,
            &out.features.device(),
        );
        ce.mul_scalar(1.0 - self.lambda) + mmd_rbf(out.features, y).mul_scalar(self.lambda)
    }
}

/// The rows of a `samples × d` row-major `table` at local positions
/// `batch`, as a `[batch, d]` constant: how objectives read features of a
/// frozen model computed beforehand with [`crate::predict`].
fn rows_at(table: &[f32], d: usize, batch: &[usize], device: &burn::tensor::Device) -> Tensor<2> {
    let mut out = Vec::with_capacity(batch.len() * d);
    for &k in batch {
        out.extend_from_slice(&table[k * d..(k + 1) * d]);
    }
    Tensor::from_data(TensorData::new(out, [batch.len(), d]), device)
}

/// Row-wise cosine similarity of two `[b, d]` tensors, `[b, 1]`; each norm
/// is clamped below at 1e-8 as PyTorch's `cosine_similarity` does, so a
/// zero feature row (all ReLUs off) has similarity 0 and a finite gradient.
fn row_cosine(a: Tensor<2>, b: Tensor<2>) -> Tensor<2> {
    let na = a.clone().square().sum_dim(1).clamp_min(1e-16).sqrt();
    let nb = b.clone().square().sum_dim(1).clamp_min(1e-16).sqrt();
    (a * b).sum_dim(1).div(na * nb)
}

/// MOON's model-contrastive objective (Li, He, Song, CVPR 2021):
/// `CE + μ · mean_k ℓ_k` with
/// `ℓ_k = −log( e^{cos(z, z_glob)/τ} / (e^{cos(z, z_glob)/τ} + e^{cos(z, z_prev)/τ}) )`,
/// z the trained model's features of sample k, z_glob and z_prev those of
/// the round's global model and of the client's previous local model
/// (both frozen: computed beforehand with [`crate::predict`] and looked up
/// by local position).
#[derive(Clone, Debug)]
pub struct ModelContrastive {
    /// μ: weight of the contrastive term.
    pub mu: f32,
    /// τ: temperature.
    pub tau: f32,
    /// The global model's features, `samples × feature_len`, row-major.
    pub global: Vec<f32>,
    /// The previous local model's features, same layout.
    pub previous: Vec<f32>,
    /// Width of a feature row.
    pub feature_len: usize,
}

impl Objective for ModelContrastive {
    fn loss(&self, out: Outputs, batch: &[usize], labels: &[i64]) -> Tensor<1> {
        let ce = cross_entropy(out.logits, labels);
        let device = out.features.device();
        let d = self.feature_len;
        let glob = rows_at(&self.global, d, batch, &device);
        let prev = rows_at(&self.previous, d, batch, &device);
        let pos = row_cosine(out.features.clone(), glob).div_scalar(self.tau);
        let neg = row_cosine(out.features, prev).div_scalar(self.tau);
        let contrast = (pos.clone().exp() + neg.exp()).log() - pos;
        ce + contrast.mean().reshape([1]).mul_scalar(self.mu)
    }
}

#[cfg(test)]
mod model_contrastive_tests {
    use super::*;
    use burn::tensor::Device;

    /// ℓ by hand in f64 for one sample.
    fn ell(z: [f64; 2], g: [f64; 2], p: [f64; 2], tau: f64) -> f64 {
        let cos = |a: [f64; 2], b: [f64; 2]| {
            (a[0] * b[0] + a[1] * b[1]) / (a[0].hypot(a[1]) * b[0].hypot(b[1]))
        };
        let (sg, sp) = (cos(z, g) / tau, cos(z, p) / tau);
        -(sg.exp() / (sg.exp() + sp.exp())).ln()
    }

    /// Two samples, features z = [[1, 0], [1, 1]], the global model's
    /// [[0, 1], [1, 1]] and the previous model's [[1, 0], [−1, 1]]: sample 0
    /// has cos(z, z_glob) = 0, cos(z, z_prev) = 1; sample 1 has 1 and 0. The
    /// value is checked against the formula and its gradient with respect
    /// to the features against central differences.
    #[test]
    fn value_by_hand_and_gradient_by_finite_differences() {
        let device = Device::flex().autodiff();
        let z = [1.0f32, 0.0, 1.0, 1.0];
        // Positions 2 and 0 of a three-sample table.
        let obj = ModelContrastive {
            mu: 2.0,
            tau: 0.5,
            global: vec![1.0, 1.0, 9.0, 9.0, 0.0, 1.0],
            previous: vec![-1.0, 1.0, 9.0, 9.0, 1.0, 0.0],
            feature_len: 2,
        };
        let logits = [0.3f32, -0.2, 0.0, 0.4];
        let labels = [1i64, 0];
        let ce = {
            let l0 = -(-0.2f64 - (0.3f64.exp() + (-0.2f64).exp()).ln());
            let l1 = -(0.0f64 - (1.0f64 + 0.4f64.exp()).ln());
            (l0 + l1) / 2.0
        };
        let hand = |z: &[f32]| {
            let z0 = [z[0] as f64, z[1] as f64];
            let z1 = [z[2] as f64, z[3] as f64];
            (ell(z0, [0.0, 1.0], [1.0, 0.0], 0.5) + ell(z1, [1.0, 1.0], [-1.0, 1.0], 0.5)) / 2.0
        };
        // By hand: ℓ_0 = log(1 + e^2) (the negative is closer), ℓ_1 = log(1 + e^−2).
        let want = ce + 2.0 * hand(&z);
        let closed = ce + 2.0 * ((1.0 + 2f64.exp()).ln() + (1.0 + (-2f64).exp()).ln()) / 2.0;
        assert!((want - closed).abs() < 1e-12);
        let feats: Tensor<2> =
            Tensor::from_data(TensorData::new(z.to_vec(), [2, 2]), &device).require_grad();
        let lg: Tensor<2> = Tensor::from_data(TensorData::new(logits.to_vec(), [2, 2]), &device);
        let loss = obj.loss(
            Outputs {
                features: feats.clone(),
                logits: lg,
            },
            &[2, 0],
            &labels,
        );
        let value: f32 = loss.clone().into_scalar();
        assert!((value as f64 - want).abs() < 1e-5, "{value} vs {want}");
        let grads = loss.backward();
        let g = feats.grad(&grads).unwrap().into_data();
        let g = g.as_slice::<f32>().unwrap();
        let h = 1e-4;
        for e in 0..4 {
            let mut up = z.to_vec();
            let mut down = z.to_vec();
            up[e] += h as f32;
            down[e] -= h as f32;
            let fd = 2.0 * (hand(&up) - hand(&down)) / (2.0 * h);
            assert!(
                (g[e] as f64 - fd).abs() < 1e-3,
                "element {e}: {} vs {fd}",
                g[e]
            );
        }
        assert!(g.iter().any(|v| v.abs() > 0.1), "{g:?}");
        // μ = 0 is plain cross-entropy.
        let plain = ModelContrastive { mu: 0.0, ..obj };
        let f: Tensor<2> = Tensor::from_data(TensorData::new(z.to_vec(), [2, 2]), &device);
        let lg: Tensor<2> = Tensor::from_data(TensorData::new(logits.to_vec(), [2, 2]), &device);
        let v: f32 = plain
            .loss(
                Outputs {
                    features: f,
                    logits: lg,
                },
                &[2, 0],
                &labels,
            )
            .into_scalar();
        assert!((v as f64 - ce).abs() < 1e-6);
    }
}

#[cfg(test)]
mod inherited_mmd_tests {
    use super::*;
    use burn::tensor::Device;

    /// The kernel sum of the five Gaussians at squared distance `d` for base
    /// bandwidth σ (before the division by 4).
    fn k(d: f64, sigma: f64) -> f64 {
        (0..5)
            .map(|i| (-d / (sigma * 2f64.powi(i - 2))).exp())
            .sum()
    }

    /// X = [[0, 0], [1, 0]], Y = [[0, 1], [0, 0]] by hand: squared distances
    /// x0–x1 1, y0–y1 1, x0–y0 1, x0–y1 0, x1–y0 2, x1–y1 1; their off-diagonal
    /// sum is 2·(1 + 1 + 1 + 0 + 2 + 1) = 12 over 12 pairs, so σ = 1 + 1e-8.
    #[test]
    fn weighted_cross_entropy_weighs_each_sample_by_its_position() {
        let device = Device::flex();
        // Two samples, two classes: logits (0, 0) and (ln 3, 0), labels 0, 1.
        // CE = ln 2 and ln 4; positions 2 and 0 of weights (0.5, _, 2.0).
        let logits: Tensor<2> = Tensor::from_data(
            TensorData::new(vec![0.0f32, 0.0, 3f32.ln(), 0.0], [2, 2]),
            &device,
        );
        let features: Tensor<2> = Tensor::zeros([2, 1], &device);
        let obj = WeightedCrossEntropy {
            weights: vec![0.5, 7.0, 2.0],
        };
        let got: f32 = obj
            .loss(Outputs { features, logits }, &[2, 0], &[0, 1])
            .into_scalar();
        let hand = (2.0 * 2f64.ln() + 0.5 * 4f64.ln()) / 2.0;
        assert!((got as f64 - hand).abs() < 1e-6, "{got} vs {hand}");
    }

    #[test]
    fn mmd_by_hand_and_its_gradient_by_finite_differences() {
        let device = Device::flex();
        let xs = [0.0f32, 0.0, 1.0, 0.0];
        let ys = [0.0f32, 1.0, 0.0, 0.0];
        let x: Tensor<2> = Tensor::from_data(TensorData::new(xs.to_vec(), [2, 2]), &device);
        let y: Tensor<2> = Tensor::from_data(TensorData::new(ys.to_vec(), [2, 2]), &device);
        let got: f32 = mmd_rbf(x, y).into_scalar();
        let s = 1.0 + 1e-8;
        let xx = 2.0 * k(0.0, s) + 2.0 * k(1.0, s);
        let yy = 2.0 * k(0.0, s) + 2.0 * k(1.0, s);
        let xy = k(1.0, s) + k(0.0, s) + k(2.0, s) + k(1.0, s);
        let hand = (xx + yy - 2.0 * xy) / 4.0;
        assert!((got as f64 - hand).abs() < 1e-5, "{got} vs {hand}");
        assert!(hand > 0.05, "the two sets differ: {hand}");
        // Identical sets: zero.
        let x: Tensor<2> = Tensor::from_data(TensorData::new(xs.to_vec(), [2, 2]), &device);
        let same: f32 = mmd_rbf(x.clone(), x).into_scalar();
        assert!(same.abs() < 1e-6, "{same}");

        // The objective: (1 − λ)·CE + λ·MMD, with Y looked up by position
        // (positions 1 and 0 of a table of three samples), and its gradient
        // w.r.t. the features against central differences of the value
        // with the bandwidth held fixed (it is a constant of the graph).
        let table = vec![9.0f32, 9.0, 0.0, 0.0, 0.0, 1.0];
        let obj = InheritedMmd {
            lambda: 0.3,
            features: table,
            feature_len: 2,
        };
        let logits = [0.5f32, -0.5, 0.2, 0.1];
        let labels = [0i64, 1];
        let ce = {
            let l0 = -(0.5f64 - (0.5f64.exp() + (-0.5f64).exp()).ln());
            let l1 = -(0.1f64 - (0.2f64.exp() + 0.1f64.exp()).ln());
            (l0 + l1) / 2.0
        };
        let ad = device.clone().autodiff();
        let feats: Tensor<2> =
            Tensor::from_data(TensorData::new(xs.to_vec(), [2, 2]), &ad).require_grad();
        let lg: Tensor<2> = Tensor::from_data(TensorData::new(logits.to_vec(), [2, 2]), &ad);
        let loss = obj.loss(
            Outputs {
                features: feats.clone(),
                logits: lg,
            },
            &[2, 1],
            &labels,
        );
        let value: f32 = loss.clone().into_scalar();
        let want = 0.7 * ce + 0.3 * hand;
        assert!((value as f64 - want).abs() < 1e-5, "{value} vs {want}");
        let grads = loss.backward();
        let g = feats.grad(&grads).unwrap().into_data();
        let g = g.as_slice::<f32>().unwrap();
        // Finite differences of 0.3·MMD with σ frozen at its value at xs.
        let mmd_fixed = |x: &[f32]| -> f64 {
            let pts: Vec<[f64; 2]> = [x[0], x[1], x[2], x[3], 0.0, 1.0, 0.0, 0.0]
                .chunks(2)
                .map(|c| [c[0] as f64, c[1] as f64])
                .collect();
            let d = |a: usize, b: usize| {
                (pts[a][0] - pts[b][0]).powi(2) + (pts[a][1] - pts[b][1]).powi(2)
            };
            let mut total = 0.0;
            for r in 0..4 {
                for c in 0..4 {
                    let sign = if (r < 2) == (c < 2) { 1.0 } else { -1.0 };
                    total += sign * k(d(r, c), s);
                }
            }
            total / 4.0
        };
        let h = 1e-3;
        for e in 0..4 {
            let mut up = xs.to_vec();
            let mut down = xs.to_vec();
            up[e] += h as f32;
            down[e] -= h as f32;
            let fd = 0.3 * (mmd_fixed(&up) - mmd_fixed(&down)) / (2.0 * h);
            assert!(
                (g[e] as f64 - fd).abs() < 1e-3,
                "element {e}: {} vs {fd}",
                g[e]
            );
        }
        assert!(g.iter().any(|v| v.abs() > 1e-2), "{g:?}");
    }
}
