//! FedCP's conditional policy (Zhang et al., KDD 2023; PFLlib's
//! `clientcp.py`/`servercp.py`) as tensors: a conditional policy network
//! (CPN) that splits each sample's features into a personal part, read by
//! the model's own head, and a global part, read by a frozen global head.
//!
//! For features h (`[batch, d]`) and the client's conditional vector v
//! (L2-normalised):
//!
//! - z = ReLU(LayerNorm(Linear(h ⊙ v))) ∈ ℝ^{2d} (the CPN; Linear d → 2d,
//!   LayerNorm over the 2d outputs with ε = 1e-5);
//! - the policy per sample and feature is a softmax over the pair
//!   (z_k + g_k, z_{d+k} + g_{d+k})/τ: p_k (personal) and s_k = 1 − p_k
//!   (global), with Gumbel noise g during training (`F.gumbel_softmax`,
//!   τ = 1, soft) and none at evaluation;
//! - the output is head_p(h ⊙ p) + head_g(h ⊙ s).
//!
//! The local loss adds λ·MMD²(h, h_g) between the features of the client's
//! body and those of the frozen global body on the same samples, with the
//! reference's RBF kernel Σ_{a ∈ {10, 15, 20, 50}} exp(−‖x − y‖²/(2a)) and
//! its biased estimate mean(K_xx + K_yy − 2K_xy).
//!
//! The CPN's parameters are one flat vector of [`cpn_len`] values: weight
//! `[d, 2d]` (inputs × outputs, as the model layout stores linear layers),
//! bias `[2d]`, LayerNorm scale `[2d]` and shift `[2d]`.

use crate::auxiliary::{AuxObjective, Body};
use crate::batch::LocalData;
use crate::kernels::linear;
use crate::model::ModelSpec;
use crate::objective::cross_entropy;
use crate::train::{EvalStats, add_classification, for_each_eval_batch};
use burn::tensor::activation::{relu, sigmoid};
use burn::tensor::{Tensor, TensorData};
use rand::Rng;

/// LayerNorm ε (PyTorch's default).
const LN_EPS: f32 = 1e-5;
/// The reference's RBF bandwidths.
const BANDWIDTHS: [f32; 4] = [10.0, 15.0, 20.0, 50.0];

/// Length of the CPN's parameter vector for features of width `d`.
pub fn cpn_len(d: usize) -> usize {
    d * 2 * d + 3 * 2 * d
}

/// A fresh CPN as PyTorch initialises `Linear(d, 2d)` and
/// `LayerNorm(2d)`: weight and bias ~ U(−1/√d, 1/√d), scale 1, shift 0.
pub fn init_cpn(d: usize, rng: &mut impl Rng) -> Vec<f32> {
    let mut out = vec![0.0f32; cpn_len(d)];
    let bound = 1.0 / (d.max(1) as f32).sqrt();
    let linear = d * 2 * d + 2 * d;
    for x in &mut out[..linear] {
        *x = rng.random_range(-bound..bound);
    }
    out[linear..linear + 2 * d].fill(1.0);
    out
}

/// The fixed parts of the policy for one client: the global head and the
/// conditional vector.
#[derive(Clone, Copy, Debug)]
pub struct ConditionalPolicy<'a> {
    /// The frozen global head: weight `[d, outputs]` then bias `[outputs]`
    /// (the model's head layout).
    pub global_head: &'a [f32],
    /// The client's conditional vector v (`d` values; normalised here).
    pub context: &'a [f32],
    /// Gumbel-softmax temperature τ (the reference's 1).
    pub tau: f32,
}

impl ConditionalPolicy<'_> {
    /// The outputs head_p(h ⊙ p) + head_g(h ⊙ s) for features `h`, the
    /// model's head `head_p`, the CPN parameters `cpn` and optional Gumbel
    /// noise (`[batch, 2d]`).
    fn outputs(
        &self,
        h: Tensor<2>,
        head_p: &dyn Fn(Tensor<2>) -> Tensor<2>,
        cpn: Tensor<1>,
        noise: Option<Tensor<2>>,
    ) -> Tensor<2> {
        let [_, d] = h.dims();
        let device = h.device();
        let outputs = self.global_head.len() / (d + 1);
        let norm = self
            .context
            .iter()
            .map(|&x| f64::from(x) * f64::from(x))
            .sum::<f64>()
            .sqrt()
            .max(1e-12);
        let v: Vec<f32> = self
            .context
            .iter()
            .map(|&x| (f64::from(x) / norm) as f32)
            .collect();
        let v: Tensor<2> = Tensor::from_data(TensorData::new(v, [1, d]), &device);
        let w = cpn.clone().narrow(0, 0, 2 * d * d).reshape([d, 2 * d]);
        let b = cpn.clone().narrow(0, 2 * d * d, 2 * d);
        let gamma = cpn
            .clone()
            .narrow(0, 2 * d * d + 2 * d, 2 * d)
            .reshape([1, 2 * d]);
        let beta = cpn.narrow(0, 2 * d * d + 4 * d, 2 * d).reshape([1, 2 * d]);
        let z = linear(h.clone() * v, w, Some(b));
        let mean = z.clone().mean_dim(1);
        let centred = z - mean;
        let var = centred.clone().square().mean_dim(1);
        let z = relu(centred / (var + LN_EPS).sqrt() * gamma + beta);
        let z = match noise {
            Some(g) => z + g,
            None => z,
        };
        // softmax over the pair (z_k, z_{d+k})/τ: p = σ((z_k − z_{d+k})/τ).
        let diff = (z.clone().narrow(1, 0, d) - z.narrow(1, d, d)).div_scalar(self.tau);
        let personal = sigmoid(diff.clone());
        let global = sigmoid(diff.neg());
        let gw: Tensor<2> = Tensor::from_data(
            TensorData::new(self.global_head[..d * outputs].to_vec(), [d, outputs]),
            &device,
        );
        let gb: Tensor<1> = Tensor::from_data(
            TensorData::new(self.global_head[d * outputs..].to_vec(), [outputs]),
            &device,
        );
        head_p(h.clone() * personal) + linear(h * global, gw, Some(gb))
    }
}

/// FedCP's local objective: cross-entropy of the policy's outputs plus
/// λ·MMD²(features, features of the frozen global body). The auxiliary
/// vector is the CPN.
#[derive(Clone, Copy, Debug)]
pub struct PolicyObjective<'a> {
    /// The global head and conditional vector.
    pub policy: ConditionalPolicy<'a>,
    /// λ of the MMD term.
    pub lambda: f32,
    /// The frozen global body's features of every local training sample
    /// (`samples × d`, row = local position).
    pub reference_features: &'a [f32],
    /// This batch's Gumbel noise (`batch × 2d`), or none.
    pub noise: Option<&'a [f32]>,
}

impl AuxObjective for PolicyObjective<'_> {
    fn loss(&self, body: Body, aux: Tensor<1>, batch: &[usize], labels: &[i64]) -> Tensor<1> {
        let h = body.features.clone();
        let [b, d] = h.dims();
        let device = h.device();
        let noise = self
            .noise
            .map(|g| Tensor::from_data(TensorData::new(g.to_vec(), [b, 2 * d]), &device));
        let head = |f: Tensor<2>| body.head(f);
        let out = self.policy.outputs(h.clone(), &head, aux, noise);
        let ce = cross_entropy(out, labels);
        if self.lambda == 0.0 {
            return ce;
        }
        let mut reference = Vec::with_capacity(b * d);
        for &k in batch {
            reference.extend_from_slice(&self.reference_features[k * d..(k + 1) * d]);
        }
        let reference: Tensor<2> = Tensor::from_data(TensorData::new(reference, [b, d]), &device);
        ce + mmd_rbf(h, reference).mul_scalar(self.lambda)
    }
}

/// The reference's biased MMD² estimate with its RBF kernel sum:
/// mean(K_xx + K_yy − 2K_xy), shape `[1]`.
pub fn mmd_rbf(x: Tensor<2>, y: Tensor<2>) -> Tensor<1> {
    let sq = |t: &Tensor<2>| t.clone().square().sum_dim(1);
    let (sx, sy) = (sq(&x), sq(&y));
    let dist = |a: &Tensor<2>, sa: &Tensor<2>, b: &Tensor<2>, sb: &Tensor<2>| {
        sa.clone() + sb.clone().transpose()
            - a.clone().matmul(b.clone().transpose()).mul_scalar(2.0)
    };
    let kernel = |dd: Tensor<2>| {
        let mut k = dd.clone().mul_scalar(-0.5 / BANDWIDTHS[0]).exp();
        for a in &BANDWIDTHS[1..] {
            k = k + dd.clone().mul_scalar(-0.5 / a).exp();
        }
        k
    };
    let kxx = kernel(dist(&x, &sx, &x, &sx));
    let kyy = kernel(dist(&y, &sy, &y, &sy));
    let kxy = kernel(dist(&x, &sx, &y, &sy));
    (kxx + kyy - kxy.mul_scalar(2.0)).mean().reshape([1])
}

/// The policy's outputs (logits) on every sample of `data`, in evaluation
/// mode and without noise: `samples × outputs`, row-major. `params` and
/// `buffers` are the client's model (its body and personal head).
pub fn policy_outputs(
    spec: &ModelSpec,
    params: &[f32],
    buffers: &[f32],
    data: &LocalData,
    policy: &ConditionalPolicy,
    cpn: &[f32],
) -> Vec<f32> {
    let device = spec.device().clone();
    let tensors = spec.tensors(params, &device);
    let cpn_t: Tensor<1> = Tensor::from_data(TensorData::new(cpn.to_vec(), [cpn.len()]), &device);
    let mut out = Vec::new();
    for_each_eval_batch(spec, buffers, data, &tensors, |features, _| {
        let head = |f: Tensor<2>| spec.head(&tensors, f);
        let logits = policy.outputs(features, &head, cpn_t.clone(), None);
        out.extend_from_slice(logits.into_data().as_slice::<f32>().expect("f32 outputs"));
    });
    out
}

/// Cross-entropy and accuracy of the policy's outputs on `data`
/// (classification), as [`crate::evaluate`] scores a plain model.
pub fn evaluate_policy(
    spec: &ModelSpec,
    params: &[f32],
    buffers: &[f32],
    data: &LocalData,
    policy: &ConditionalPolicy,
    cpn: &[f32],
) -> EvalStats {
    let device = spec.device().clone();
    let tensors = spec.tensors(params, &device);
    let cpn_t: Tensor<1> = Tensor::from_data(TensorData::new(cpn.to_vec(), [cpn.len()]), &device);
    let c = spec.num_classes();
    let mut stats = EvalStats::default();
    for_each_eval_batch(spec, buffers, data, &tensors, |features, y| {
        let head = |f: Tensor<2>| spec.head(&tensors, f);
        let out = policy.outputs(features, &head, cpn_t.clone(), None);
        stats.total += out.dims()[0];
        add_classification(&mut stats, out, y, c);
    });
    stats
}
