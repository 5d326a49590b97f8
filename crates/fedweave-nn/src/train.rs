//! Local training (SGD with momentum on the flat vector) and evaluation.

use crate::batch::LocalData;
use crate::extra::ExtraLoss;
use crate::model::ModelSpec;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use rand::Rng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// How much and how a client trains in one call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Learning rate.
    pub lr: f32,
    /// SGD momentum (PyTorch semantics, dampening 0).
    pub momentum: f32,
    /// L2 weight decay added to the gradient.
    pub weight_decay: f32,
    /// Mini-batch size.
    pub batch_size: usize,
    /// Mini-batch steps; when 0, `epochs` full passes are made instead.
    pub iterations: usize,
    /// Full passes over the local data (used when `iterations` is 0).
    pub epochs: usize,
}

impl TrainConfig {
    /// Number of optimiser steps for a client with `n` training samples.
    pub fn steps_for(&self, n: usize) -> usize {
        if self.iterations > 0 {
            self.iterations
        } else {
            self.epochs * n.div_ceil(self.batch_size.max(1))
        }
    }
}

/// The optimiser's state, kept by the caller when it must survive rounds
/// (DPFL); most methods build a fresh optimiser every round, as their
/// reference code does.
#[derive(Clone, Debug, Default)]
pub struct SgdState {
    /// Momentum buffer (empty until the first step).
    pub momentum: Vec<f32>,
}

/// What one call of [`train_local`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TrainStats {
    /// Optimiser steps taken.
    pub steps: usize,
    /// Samples processed.
    pub samples: usize,
    /// Mean task loss over the steps.
    pub mean_loss: f64,
}

/// Loss and accuracy of a model on some samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EvalStats {
    /// Summed cross-entropy.
    pub loss_sum: f64,
    /// Correct predictions.
    pub correct: usize,
    /// Samples evaluated.
    pub total: usize,
}

impl EvalStats {
    /// Accuracy in [0, 1] (0 without samples).
    pub fn accuracy(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.correct as f64 / self.total as f64
        }
    }
    /// Mean cross-entropy (0 without samples).
    pub fn mean_loss(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.loss_sum / self.total as f64
        }
    }
}

/// Trains `params` in place on `data`.
///
/// Each step: the backend computes the mean cross-entropy gradient of one
/// mini-batch; every `extra` term adds its analytic gradient; weight decay
/// adds `wd·θ`; momentum SGD (dampening 0, as PyTorch) updates θ. Elements in
/// `frozen` ranges are not updated (FedRep's alternating heads and bases).
/// Mini-batches walk a shuffled order drawn from `rng`, reshuffled at every
/// pass; the last batch of a pass may be smaller.
#[allow(clippy::too_many_arguments)]
pub fn train_local(
    spec: &ModelSpec,
    params: &mut [f32],
    data: &LocalData,
    cfg: &TrainConfig,
    extras: &[&dyn ExtraLoss],
    frozen: &[Range<usize>],
    state: Option<&mut SgdState>,
    rng: &mut impl Rng,
) -> TrainStats {
    let n = data.len();
    if n == 0 {
        return TrainStats::default();
    }
    let steps = cfg.steps_for(n);
    let device = Device::flex().autodiff();
    let input_len = spec.input_len();
    let mut local_state = SgdState::default();
    let state = state.unwrap_or(&mut local_state);
    if state.momentum.len() != params.len() {
        state.momentum = vec![0.0; params.len()];
    }
    let mut grad = vec![0.0f32; params.len()];
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(rng);
    let mut cursor = 0;
    let (mut x, mut y) = (Vec::new(), Vec::new());
    let mut loss_total = 0.0;
    let mut samples = 0;
    let bs = cfg.batch_size.max(1);
    for _ in 0..steps {
        if cursor >= n {
            order.shuffle(rng);
            cursor = 0;
        }
        let end = (cursor + bs).min(n);
        data.gather(&order[cursor..end], input_len, &mut x, &mut y);
        let b = end - cursor;
        cursor = end;
        samples += b;

        let tensors = spec.tensors(params, &device, true);
        let xt: Tensor<2> = Tensor::from_data(
            TensorData::new(std::mem::take(&mut x), [b, input_len]),
            &device,
        );
        let logits = spec.forward(&tensors, xt);
        let loss = cross_entropy(logits, &y, spec.num_classes(), &device);
        let grads = loss.backward();
        loss_total += scalar(&loss);
        for (t, spec_t) in tensors.iter().zip(spec.layout().tensors()) {
            t.grad_into(&grads, &mut grad[spec_t.range()]);
        }
        for e in extras {
            e.add_value_and_grad(params, &mut grad);
        }
        sgd_step(params, &grad, &mut state.momentum, cfg, frozen);
        x = Vec::with_capacity(b * input_len);
    }
    TrainStats {
        steps,
        samples,
        mean_loss: loss_total / steps as f64,
    }
}

/// θ ← θ − lr·buf, buf ← momentum·buf + (g + wd·θ), skipping frozen ranges.
fn sgd_step(
    params: &mut [f32],
    grad: &[f32],
    buf: &mut [f32],
    cfg: &TrainConfig,
    frozen: &[Range<usize>],
) {
    let update = |lo: usize, hi: usize, params: &mut [f32], buf: &mut [f32]| {
        for i in lo..hi {
            let g = grad[i] + cfg.weight_decay * params[i];
            buf[i] = cfg.momentum * buf[i] + g;
            params[i] -= cfg.lr * buf[i];
        }
    };
    let mut lo = 0;
    let mut sorted: Vec<&Range<usize>> = frozen.iter().collect();
    sorted.sort_by_key(|r| r.start);
    for r in sorted {
        if r.start > lo {
            update(lo, r.start, params, buf);
        }
        lo = lo.max(r.end);
    }
    update(lo, params.len(), params, buf);
}

fn cross_entropy(logits: Tensor<2>, y: &[i64], classes: usize, device: &Device) -> Tensor<1> {
    let yt: Tensor<1, Int> = Tensor::from_data(TensorData::new(y.to_vec(), [y.len()]), device);
    let onehot: Tensor<2> = yt.one_hot::<2>(classes).float();
    log_softmax(logits, 1)
        .mul(onehot)
        .sum_dim(1)
        .mean()
        .neg()
        .reshape([1])
}

fn scalar(t: &Tensor<1>) -> f64 {
    t.to_data()
        .as_slice::<f32>()
        .map(|s| s[0] as f64)
        .unwrap_or(f64::NAN)
}

/// Evaluation batch size: large batches amortise the backend's per-call cost.
const EVAL_BATCH: usize = 500;

/// Cross-entropy and accuracy of `params` on `data` (no gradients).
pub fn evaluate(spec: &ModelSpec, params: &[f32], data: &LocalData) -> EvalStats {
    let mut stats = EvalStats::default();
    if data.is_empty() {
        return stats;
    }
    let device = Device::flex();
    let tensors = spec.tensors(params, &device, false);
    let input_len = spec.input_len();
    let positions: Vec<usize> = (0..data.len()).collect();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for chunk in positions.chunks(EVAL_BATCH) {
        data.gather(chunk, input_len, &mut x, &mut y);
        let b = chunk.len();
        let xt: Tensor<2> = Tensor::from_data(TensorData::new(x.clone(), [b, input_len]), &device);
        let logp = log_softmax(spec.forward(&tensors, xt), 1).into_data();
        let logp = logp.as_slice::<f32>().expect("f32 logits");
        let c = spec.num_classes();
        for (k, &label) in y.iter().enumerate() {
            let row = &logp[k * c..(k + 1) * c];
            let lp = row[label as usize];
            stats.loss_sum += if lp.is_finite() { -lp as f64 } else { 1e4 };
            let mut best = 0;
            for j in 1..c {
                if row[j] > row[best] {
                    best = j;
                }
            }
            stats.correct += usize::from(best == label as usize);
        }
        stats.total += b;
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelKind;
    use fedweave_core::{Purpose, rng_stream};

    /// Two Gaussian blobs in 4-D: a problem an MLP must solve perfectly.
    fn blobs(n: usize) -> (Vec<f32>, Vec<u32>) {
        let mut rng = rng_stream(3, 0, 0, Purpose::Dataset);
        let mut x = Vec::new();
        let mut y = Vec::new();
        for i in 0..n {
            let c = (i % 2) as u32;
            let centre = if c == 0 { -1.0 } else { 1.0 };
            for _ in 0..4 {
                x.push(centre + rng.random_range(-0.5f32..0.5));
            }
            y.push(c);
        }
        (x, y)
    }

    fn cfg(iterations: usize) -> TrainConfig {
        TrainConfig {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 0.0,
            batch_size: 16,
            iterations,
            epochs: 1,
        }
    }

    /// A 4-input MLP for two classes and its seeded initial weights.
    fn mlp() -> (ModelSpec, Vec<f32>) {
        let spec = ModelSpec::new(ModelKind::Mlp, &[4], 2).unwrap();
        let init = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        (spec, init)
    }

    #[test]
    fn mlp_learns_separable_blobs_and_is_deterministic() {
        let (x, y) = blobs(200);
        let idx: Vec<usize> = (0..200).collect();
        let data = LocalData::new(&x, &y, &idx);
        let (spec, init) = mlp();
        let before = evaluate(&spec, &init, &data);
        let run = || {
            let mut p = init.clone();
            let stats = train_local(
                &spec,
                &mut p,
                &data,
                &cfg(60),
                &[],
                &[],
                None,
                &mut rng_stream(1, 1, 0, Purpose::Batches),
            );
            (p, stats)
        };
        let (p1, s1) = run();
        let (p2, _) = run();
        assert_eq!(p1, p2, "same seed, same parameters");
        let after = evaluate(&spec, &p1, &data);
        assert!(after.accuracy() > 0.98, "accuracy {}", after.accuracy());
        assert!(after.mean_loss() < before.mean_loss() / 4.0);
        assert_eq!(s1.steps, 60);
        // 200 samples = 12 full batches + one of 8 per pass: 4 passes (52 steps,
        // 800 samples) then 8 full batches.
        assert_eq!(s1.samples, 4 * 200 + 8 * 16);
    }

    #[test]
    fn label_flip_inverts_what_is_learned() {
        let (x, y) = blobs(200);
        let idx: Vec<usize> = (0..200).collect();
        let flipped = LocalData {
            features: &x,
            labels: &y,
            indices: &idx,
            flip_labels: Some(2),
        };
        let clean = LocalData {
            flip_labels: None,
            ..flipped
        };
        let spec = ModelSpec::new(ModelKind::Mlp, &[4], 2).unwrap();
        let mut p = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        train_local(
            &spec,
            &mut p,
            &flipped,
            &cfg(60),
            &[],
            &[],
            None,
            &mut rng_stream(1, 1, 0, Purpose::Batches),
        );
        assert!(evaluate(&spec, &p, &clean).accuracy() < 0.05);
    }

    #[test]
    fn frozen_ranges_do_not_move() {
        let (x, y) = blobs(64);
        let idx: Vec<usize> = (0..64).collect();
        let data = LocalData::new(&x, &y, &idx);
        let (spec, init) = mlp();
        let head = spec.layout().head().unwrap().range.clone();
        let mut p = init.clone();
        train_local(
            &spec,
            &mut p,
            &data,
            &cfg(5),
            &[],
            std::slice::from_ref(&head),
            None,
            &mut rng_stream(1, 1, 0, Purpose::Batches),
        );
        assert_eq!(p[head.clone()], init[head.clone()]);
        assert_ne!(p[..head.start], init[..head.start]);
    }

    #[test]
    fn strong_proximal_term_keeps_the_model_at_its_anchor() {
        let (x, y) = blobs(64);
        let idx: Vec<usize> = (0..64).collect();
        let data = LocalData::new(&x, &y, &idx);
        let (spec, init) = mlp();
        let drift = |mu: f32| {
            let mut p = init.clone();
            let prox = crate::Proximal { mu, anchor: &init };
            let c = TrainConfig {
                momentum: 0.0,
                ..cfg(30)
            };
            train_local(
                &spec,
                &mut p,
                &data,
                &c,
                &[&prox],
                &[],
                None,
                &mut rng_stream(1, 1, 0, Purpose::Batches),
            );
            fedweave_core::vecmath::sq_dist(&p, &init)
        };
        assert!(drift(10.0) < 0.2 * drift(0.0));
    }
}
