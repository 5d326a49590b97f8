//! FedRoD (Chen & Chao, "On Bridging Generic and Personalized Federated
//! Learning for Image Classification", ICLR 2022): a shared body with a
//! generic head, plus a personal head on top.
//!
//! Client: trains the whole shared model (body + generic head) from the
//! global model on the balanced softmax loss (cross-entropy of
//! logits + log π with π its training label distribution,
//! [`fedweave_nn::BalancedSoftmax`], the paper's class-balanced generic
//! objective), then trains its personal head h_p on plain cross-entropy of
//! `generic logits (fixed) + h_p(features)` over the trained body's features
//! (fixed). It uploads the shared model; the personal head never leaves it.
//!
//! Graph rule: FedAvg's over the shared model — every row of W is the
//! data-size vector p over the round's participants, and the global model
//! goes to every client.
//!
//! Scored model: the body with head weights W_g + W_p and biases b_g + b_p.
//! Both heads are linear in the same features, so this network's logits are
//! exactly the generic logits plus the personal head's (PFLlib's
//! `out_g.detach() + out_p`).
//!
//! Defaults: none to choose — the generic loss, the personal loss and the
//! personal head's start (a copy of the initial head, PFLlib's
//! `deepcopy(model.predictor)`) are the paper's and PFLlib's; the personal
//! head uses the run's learning rate, momentum, weight decay, batch size and
//! step count.
//!
//! Deviation from PFLlib, and why: PFLlib steps the personal head inside the
//! body's loop, each batch on that batch's training-mode features of the
//! body *before* its step. fedweave first finishes the body's local training,
//! then takes the same number of personal-head steps on the trained body's
//! evaluation-mode features (one [`fedweave_nn::predict`] pass over the
//! training data, fresh mini-batches from the client's stream) with the exact
//! softmax-regression gradient on the host. The head thus fits the body it
//! is scored with, rather than a moving target; it also needs no second
//! backward pass through the body.

use crate::Checked;
use crate::contract::holds_model;
use crate::fedavg::average_to_all;
use crate::params::Validate;
use crate::{
    AlgoError, Algorithm, ClientCx, Env, Info, Model, ModelRef, ParamError, RoundOutcome, Trained,
};
use fedweave_nn::{BalancedSoftmax, BatchSampler, Predictions, TrainConfig, predict};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

/// FedRoD's parameters: none (see the module documentation).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FedRodParams {}

impl Validate for FedRodParams {
    fn validate(&self) -> Result<(), ParamError> {
        Ok(())
    }
}

/// The FedRoD algorithm.
pub struct FedRod {}

/// What a FedRoD client keeps.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RodClient {
    /// The shared model: body and generic head (the global model after
    /// receiving it).
    pub model: Model,
    /// The personal head: weight `[features, classes]` row-major, then bias.
    #[serde(with = "fedweave_core::stash::vector")]
    pub personal: Vec<f32>,
}

/// Mean cross-entropy of `generic + f·W + b` over `batch` and its gradient
/// with respect to the personal head `head` = [W (`dim × classes`) | b],
/// written into `grad`: dz = softmax(z) − onehot(y), dW = fᵀ·dz / B,
/// db = Σ dz / B.
pub fn personal_head_grad(
    pred: &Predictions,
    labels: &[u32],
    batch: &[usize],
    head: &[f32],
    grad: &mut [f32],
) -> f64 {
    let (d, c) = (pred.feature_len, pred.outputs);
    let (w, b) = head.split_at(d * c);
    let mut acc = vec![0.0f64; d * c + c];
    let mut loss = 0.0;
    let mut z = vec![0.0f64; c];
    for &k in batch {
        let f = pred.feature(k);
        for (j, zj) in z.iter_mut().enumerate() {
            *zj = pred.output(k)[j] as f64 + b[j] as f64;
        }
        for (i, &fi) in f.iter().enumerate() {
            if fi != 0.0 {
                for (j, zj) in z.iter_mut().enumerate() {
                    *zj += fi as f64 * w[i * c + j] as f64;
                }
            }
        }
        let max = z.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
        let sum: f64 = z.iter().map(|v| (v - max).exp()).sum();
        let y = labels[k] as usize;
        loss += max + sum.ln() - z[y];
        let dz: Vec<f64> = z
            .iter()
            .enumerate()
            .map(|(j, v)| (v - max).exp() / sum - f64::from(u8::from(j == y)))
            .collect();
        for (i, &fi) in f.iter().enumerate() {
            if fi != 0.0 {
                for (j, g) in dz.iter().enumerate() {
                    acc[i * c + j] += fi as f64 * g;
                }
            }
        }
        for (j, g) in dz.iter().enumerate() {
            acc[d * c + j] += g;
        }
    }
    let inv = 1.0 / batch.len().max(1) as f64;
    for (g, a) in grad.iter_mut().zip(&acc) {
        *g = (a * inv) as f32;
    }
    loss * inv
}

/// Trains the personal head `head` for `cfg.steps_for(n)` momentum-SGD
/// steps on mini-batches drawn from `rng` (PyTorch semantics: g + wd·θ,
/// buf ← m·buf + g, θ ← θ − lr·buf; a fresh buffer). Returns the mean loss.
pub fn train_personal_head(
    pred: &Predictions,
    labels: &[u32],
    head: &mut [f32],
    cfg: &TrainConfig,
    rng: &mut impl rand::Rng,
) -> f64 {
    let n = labels.len();
    if n == 0 {
        return 0.0;
    }
    let steps = cfg.steps_for(n);
    let mut sampler = BatchSampler::new(n, cfg.batch_size, rng);
    let mut grad = vec![0.0f32; head.len()];
    let mut buf = vec![0.0f32; head.len()];
    let mut total = 0.0;
    for _ in 0..steps {
        let batch = sampler.next_batch(rng);
        total += personal_head_grad(pred, labels, batch, head, &mut grad);
        for ((t, g), m) in head.iter_mut().zip(&grad).zip(buf.iter_mut()) {
            *m = cfg.momentum * *m + (g + cfg.weight_decay * *t);
            *t -= cfg.lr * *m;
        }
    }
    total / steps as f64
}

holds_model!(RodClient: model);

impl Algorithm for FedRod {
    const NAMES: &'static [Info] = &[Info {
        name: "fedrod",
        summary: "FedAvg of body + generic head (rows of W = p) trained with balanced softmax; a personal linear head on the body's features, scored as body + (generic + personal) head",
        reference: "Chen & Chao, ICLR 2022",
    }];
    type Params = FedRodParams;
    type Client = RodClient;
    type Server = ();
    /// The global shared model.
    type Down = Vec<f32>;
    /// The trained shared model.
    type Up = Vec<f32>;

    fn new(name: &'static str, _: Checked<FedRodParams>, env: &Env) -> Result<Self, AlgoError> {
        if env.label_counts.is_empty() {
            return Err(AlgoError::Unsupported {
                algorithm: name.to_string(),
                message: "FedRoD's balanced softmax needs class labels; this dataset has none"
                    .into(),
            });
        }
        Ok(Self {})
    }

    fn init_client(&self, env: &Env, _: usize) -> RodClient {
        let head = env.spec.split().head;
        RodClient {
            model: env.initial_model(),
            personal: env.init[head].to_vec(),
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut RodClient,
    ) -> Trained<Vec<f32>> {
        let train = cx.data.train;
        let labels = train.local_labels();
        let mut counts = vec![0usize; env.spec.num_classes()];
        for &y in &labels {
            if let Some(c) = counts.get_mut(y as usize) {
                *c += 1;
            }
        }
        let bsm = BalancedSoftmax::from_counts(&counts);
        let stats = cx.train_with(env, &mut state.model, env.train, &[], &[], None, Some(&bsm));
        let pred = predict(env.spec, &state.model.params, &state.model.buffers, &train);
        train_personal_head(&pred, &labels, &mut state.personal, env.train, &mut cx.rng);
        Trained {
            up: state.model.params.clone(),
            train_loss: stats.mean_loss,
        }
    }

    fn aggregate(
        &self,
        env: &Env,
        _: &mut (),
        _: usize,
        uploads: &[(usize, Vec<f32>)],
    ) -> RoundOutcome<Vec<f32>> {
        average_to_all(env, uploads)
    }

    fn receive(&self, _: &Env, state: &mut RodClient, global: Vec<f32>) {
        state.model.params = global;
    }

    fn personalized<'c>(&self, state: &'c RodClient) -> ModelRef<'c> {
        let mut params = state.model.params.clone();
        let start = params.len() - state.personal.len();
        for (p, q) in params[start..].iter_mut().zip(&state.personal) {
            *p += q;
        }
        ModelRef {
            params: Cow::Owned(params),
            buffers: &state.model.buffers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedweave_core::{Purpose, rng_stream};
    use fedweave_nn::{ModelKind, ModelSpec};

    /// Two features, two classes. Sample 0: f = (1, 2), generic logits
    /// (0, 0), label 1; sample 1: f = (0, 1), generic (1, 0), label 0.
    fn tiny() -> (Predictions, Vec<u32>) {
        (
            Predictions {
                features: vec![1.0, 2.0, 0.0, 1.0],
                logits: vec![0.0, 0.0, 1.0, 0.0],
                feature_len: 2,
                outputs: 2,
            },
            vec![1, 0],
        )
    }

    #[test]
    fn personal_head_gradient_by_hand() {
        let (pred, labels) = tiny();
        // W = [[0.5, 0], [0, 0]] (row = feature), b = (0, 0.5).
        let head = [0.5f32, 0.0, 0.0, 0.0, 0.0, 0.5];
        let mut g = [0.0f32; 6];
        let loss = personal_head_grad(&pred, &labels, &[0, 1], &head, &mut g);
        // Sample 0: z = (0.5, 0.5), s = (½, ½), y = 1: dz = (½, −½), CE ln 2.
        // Sample 1: z = (1, 0.5), s0 = 1/(1+e^−½), y = 0: dz = (s0 − 1, 1 − s0).
        let s0 = 1.0 / (1.0 + (-0.5f64).exp());
        let ce1 = -s0.ln();
        assert!((loss - (2f64.ln() + ce1) / 2.0).abs() < 1e-7, "{loss}");
        let dz0 = [0.5, -0.5];
        let dz1 = [s0 - 1.0, 1.0 - s0];
        let want = [
            (1.0 * dz0[0] + 0.0 * dz1[0]) / 2.0,
            (1.0 * dz0[1] + 0.0 * dz1[1]) / 2.0,
            (2.0 * dz0[0] + 1.0 * dz1[0]) / 2.0,
            (2.0 * dz0[1] + 1.0 * dz1[1]) / 2.0,
            (dz0[0] + dz1[0]) / 2.0,
            (dz0[1] + dz1[1]) / 2.0,
        ];
        for (e, (got, w)) in g.iter().zip(want).enumerate() {
            assert!((*got as f64 - w).abs() < 1e-6, "element {e}: {got} vs {w}");
        }
        // One sample alone: batch size 1, no averaging over the other.
        loss_matches_central_differences(&pred, &labels, &head);
    }

    fn loss_matches_central_differences(pred: &Predictions, labels: &[u32], head: &[f32]) {
        let mut g = vec![0.0f32; head.len()];
        personal_head_grad(pred, labels, &[1], head, &mut g);
        let mut scratch = vec![0.0f32; head.len()];
        for e in 0..head.len() {
            let h = 1e-2f32;
            let mut up = head.to_vec();
            let mut down = head.to_vec();
            up[e] += h;
            down[e] -= h;
            let fd = (personal_head_grad(pred, labels, &[1], &up, &mut scratch)
                - personal_head_grad(pred, labels, &[1], &down, &mut scratch))
                / (2.0 * h as f64);
            assert!(
                (g[e] as f64 - fd).abs() < 1e-4,
                "element {e}: {} vs {fd}",
                g[e]
            );
        }
    }

    #[test]
    fn personal_head_training_fits_the_labels_the_generic_head_gets_wrong() {
        let (pred, labels) = tiny();
        let cfg = TrainConfig {
            lr: 0.5,
            momentum: 0.0,
            weight_decay: 0.0,
            batch_size: 2,
            iterations: 200,
            epochs: 0,
        };
        let mut head = vec![0.0f32; 6];
        let mut rng = rng_stream(1, 1, 0, Purpose::Batches);
        train_personal_head(&pred, &labels, &mut head, &cfg, &mut rng);
        let mut g = vec![0.0f32; 6];
        let after = personal_head_grad(&pred, &labels, &[0, 1], &head, &mut g);
        // Generic logits alone score ln 2 and CE(1, 0 | y = 0) on the two
        // samples; the trained head drives the loss near zero.
        assert!(after < 0.05, "{after}");
        // One plain SGD step by hand from zero: θ ← −lr·g.
        let mut one = vec![0.0f32; 6];
        let step = TrainConfig {
            iterations: 1,
            ..cfg
        };
        train_personal_head(&pred, &labels, &mut one, &step, &mut rng);
        personal_head_grad(&pred, &labels, &[0, 1], &[0.0; 6], &mut g);
        for (t, gi) in one.iter().zip(&g) {
            assert!((t + 0.5 * gi).abs() < 1e-7, "{one:?} vs {g:?}");
        }
    }

    #[test]
    fn scored_model_is_body_plus_summed_heads() {
        let spec = ModelSpec::new(ModelKind::MLP, &[4], 3).unwrap();
        let init = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        let train = TrainConfig {
            lr: 0.05,
            momentum: 0.0,
            weight_decay: 0.0,
            batch_size: 8,
            iterations: 1,
            epochs: 1,
        };
        let counts = vec![vec![1, 1, 1]];
        let env = Env {
            spec: &spec,
            train: &train,
            sizes: &[3],
            init: &init,
            relation: None,
            label_counts: &counts,
            kernels: fedweave_core::pairwise::Kernels::cpu(),
        };
        let algo = FedRod::new(
            "fedrod",
            FedRodParams::default().check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let mut c = algo.init_client(&env, 0);
        let head = spec.split().head;
        assert_eq!(c.personal, init[head.clone()]);
        c.personal.iter_mut().for_each(|v| *v = 0.25);
        let scored = algo.personalized(&c).params.into_owned();
        assert_eq!(scored[..head.start], init[..head.start]);
        for (s, g) in scored[head.clone()].iter().zip(&init[head]) {
            assert_eq!(*s, g + 0.25);
        }
    }
}
