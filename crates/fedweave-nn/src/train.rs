//! Local training of a whole round ([`train_local`], a loop over a
//! [`LocalTrainer`]) and evaluation.

use crate::batch::{Batch, LocalData};
use crate::extra::ExtraLoss;
use crate::model::{ModelSpec, Norm};
use crate::objective::Objective;
use crate::trainer::{BatchSampler, LocalTrainer, SgdConfig};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Tensor, TensorData};
use rand::Rng;
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
    /// The optimiser settings (all but the learning rate) for a
    /// [`LocalTrainer`].
    pub fn sgd(&self) -> SgdConfig {
        SgdConfig {
            momentum: self.momentum,
            weight_decay: self.weight_decay,
        }
    }

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

/// Loss and accuracy (classification) or errors (regression) of a model on
/// some samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EvalStats {
    /// Summed task loss: cross-entropy per sample, or absolute error per
    /// observed target in normalised units (the training loss).
    pub loss_sum: f64,
    /// Terms in `loss_sum`: samples, or observed targets.
    pub loss_terms: usize,
    /// Correct predictions (classification).
    pub correct: usize,
    /// Samples evaluated.
    pub total: usize,
    /// Regression: summed |error| in the target's own unit.
    pub abs_err: f64,
    /// Regression: summed squared error in the target's own unit.
    pub sq_err: f64,
    /// Regression: summed |error| / |target| over targets with
    /// |target| ≥ [`MAPE_MIN_ABS`].
    pub pct_err: f64,
    /// Terms in `pct_err`.
    pub pct_terms: usize,
}

/// Targets smaller than this (in their unit) are left out of MAPE, whose
/// ratio explodes near zero (masked MAPE of the traffic literature, which
/// drops zero readings; for °C, days within ±1 °C of freezing).
pub const MAPE_MIN_ABS: f64 = 1.0;

impl EvalStats {
    /// Accuracy in [0, 1] (0 without samples).
    pub fn accuracy(&self) -> f64 {
        ratio(self.correct as f64, self.total)
    }
    /// Mean task loss (0 without samples).
    pub fn mean_loss(&self) -> f64 {
        ratio(self.loss_sum, self.loss_terms)
    }
    /// Mean absolute error in the target's unit.
    pub fn mae(&self) -> f64 {
        ratio(self.abs_err, self.loss_terms)
    }
    /// Root mean squared error in the target's unit.
    pub fn rmse(&self) -> f64 {
        ratio(self.sq_err, self.loss_terms).sqrt()
    }
    /// Mean absolute percentage error, in percent.
    pub fn mape(&self) -> f64 {
        100.0 * ratio(self.pct_err, self.pct_terms)
    }
}

fn ratio(sum: f64, n: usize) -> f64 {
    if n == 0 { 0.0 } else { sum / n as f64 }
}

/// Trains `params` in place on `data`.
///
/// Each step: the backend computes the gradient of the mini-batch's mean
/// task loss (cross-entropy, or masked MAE for regression targets — MSE for
/// `mf`, [`crate::ModelSpec::regression_loss`]); every
/// `extra` term adds its analytic gradient; weight decay adds `wd·θ`;
/// momentum SGD (dampening 0, as PyTorch) updates θ. Elements in `frozen`
/// ranges are not updated (FedRep's alternating heads and bases).
/// Batch-norm layers normalise with batch statistics and fold them into
/// `buffers` (the client's running statistics).
/// Mini-batches walk a shuffled order drawn from `rng`, reshuffled at every
/// pass; the last batch of a pass may be smaller.
///
/// This is a loop over a [`LocalTrainer`] on the CPU backend fed by a
/// [`BatchSampler`]; algorithms that need control within the round write
/// their own loop over the same pieces.
#[allow(clippy::too_many_arguments)]
pub fn train_local(
    spec: &ModelSpec,
    params: &mut [f32],
    buffers: &mut [f32],
    data: &LocalData,
    cfg: &TrainConfig,
    extras: &[&dyn ExtraLoss],
    frozen: &[Range<usize>],
    state: Option<&mut SgdState>,
    rng: &mut impl Rng,
) -> TrainStats {
    train_local_with(
        spec, params, buffers, data, cfg, extras, frozen, state, rng, None,
    )
}

/// [`train_local`] with `objective` in place of the task loss when given
/// (FedProto's prototype pull, FedRoD's balanced softmax).
#[allow(clippy::too_many_arguments)]
pub fn train_local_with(
    spec: &ModelSpec,
    params: &mut [f32],
    buffers: &mut [f32],
    data: &LocalData,
    cfg: &TrainConfig,
    extras: &[&dyn ExtraLoss],
    frozen: &[Range<usize>],
    state: Option<&mut SgdState>,
    rng: &mut impl Rng,
    objective: Option<&dyn Objective>,
) -> TrainStats {
    let n = data.len();
    if n == 0 {
        return TrainStats::default();
    }
    let steps = cfg.steps_for(n);
    let mut sampler = BatchSampler::new(n, cfg.batch_size, rng);
    let mut trainer = LocalTrainer::new(
        spec,
        spec.device(),
        params,
        buffers,
        cfg.sgd(),
        state.as_deref(),
    );
    if data.augment != crate::Augment::None || spec.draws_in_training() {
        trainer.seed_augmentation(rng);
    }
    let terms = trainer.prepare(extras);
    let mut samples = 0;
    for _ in 0..steps {
        let batch = sampler.next_batch(rng);
        samples += batch.len();
        trainer.loss_and_grad_deferred(data, batch, &terms, objective);
        trainer.step(frozen, cfg.lr);
    }
    let loss_total = trainer.take_losses().into_iter().fold(0.0, |a, l| a + l);
    trainer.store(params, buffers);
    if let Some(state) = state {
        trainer.store_state(state);
    }
    TrainStats {
        steps,
        samples,
        mean_loss: loss_total / steps as f64,
    }
}

/// Evaluation batch size: large batches amortise the backend's per-call cost.
const EVAL_BATCH: usize = 500;

/// Evaluates `params` (with the client's batch-norm `buffers`) on `data`,
/// without gradients: cross-entropy and accuracy, or for regression targets
/// the masked absolute error (normalised) and MAE/RMSE/MAPE in the target's
/// unit.
pub fn evaluate(spec: &ModelSpec, params: &[f32], buffers: &[f32], data: &LocalData) -> EvalStats {
    let mut stats = EvalStats::default();
    let c = spec.num_classes();
    let tensors = spec.tensors(params, spec.device());
    for_each_eval_batch(spec, buffers, data, &tensors, |features, y| {
        let out = spec.head(&tensors, features);
        stats.total += out.dims()[0];
        if data.is_regression() {
            let pred = out.into_data();
            let pred = pred.as_slice::<f32>().expect("f32 outputs");
            add_regression_errors(&mut stats, pred, y, data.target_scale);
            return;
        }
        add_classification(&mut stats, out, y, c);
    });
    stats
}

/// Adds a batch's cross-entropy and correct predictions to `stats`
/// (`out`: the batch's logits over `c` classes).
pub(crate) fn add_classification(stats: &mut EvalStats, out: Tensor<2>, y: &Batch, c: usize) {
    let logp = log_softmax(out, 1).into_data();
    let logp = logp.as_slice::<f32>().expect("f32 logits");
    for (k, &label) in y.labels.iter().enumerate() {
        let row = &logp[k * c..(k + 1) * c];
        let lp = row[label as usize];
        stats.loss_sum += if lp.is_finite() { -lp as f64 } else { 1e4 };
        stats.loss_terms += 1;
        let mut best = 0;
        for j in 1..c {
            if row[j] > row[best] {
                best = j;
            }
        }
        stats.correct += usize::from(best == label as usize);
    }
}

/// Runs the body over `data` in evaluation mode (running batch-norm
/// statistics), batch by batch, handing `f` each batch's features and
/// supervision.
pub(crate) fn for_each_eval_batch(
    spec: &ModelSpec,
    buffers: &[f32],
    data: &LocalData,
    tensors: &[crate::model::ParamTensor],
    mut f: impl FnMut(Tensor<2>, &Batch),
) {
    let device = spec.device().clone();
    let input_len = spec.input_len();
    let positions: Vec<usize> = (0..data.len()).collect();
    let (mut x, mut y) = (Vec::new(), Batch::default());
    for chunk in positions.chunks(EVAL_BATCH) {
        data.gather(chunk, input_len, &mut x, &mut y);
        let xt: Tensor<2> = Tensor::from_data(
            TensorData::new(x.clone(), [chunk.len(), input_len]),
            &device,
        );
        let features = spec.features(tensors, xt, &mut Norm::Running(buffers));
        f(features, &y);
    }
}

/// A model's features and outputs on every sample of a client's data, in
/// evaluation mode: what kNN-Per's datastore, FedProto's prototypes and
/// FedRoD's personal head are computed from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Predictions {
    /// `samples × feature_len`, row-major.
    pub features: Vec<f32>,
    /// `samples × outputs` (logits), row-major.
    pub logits: Vec<f32>,
    /// Width of a feature row.
    pub feature_len: usize,
    /// Width of an output row.
    pub outputs: usize,
}

impl Predictions {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.logits.len().checked_div(self.outputs).unwrap_or(0)
    }

    /// Whether there are no samples.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sample `k`'s features.
    pub fn feature(&self, k: usize) -> &[f32] {
        &self.features[k * self.feature_len..(k + 1) * self.feature_len]
    }

    /// Sample `k`'s outputs.
    pub fn output(&self, k: usize) -> &[f32] {
        &self.logits[k * self.outputs..(k + 1) * self.outputs]
    }
}

/// Features and outputs of `params` (with the client's batch-norm
/// `buffers`) on every sample of `data`, in order, without gradients.
pub fn predict(spec: &ModelSpec, params: &[f32], buffers: &[f32], data: &LocalData) -> Predictions {
    let tensors = spec.tensors(params, spec.device());
    let mut out = Predictions {
        feature_len: spec.feature_len(),
        outputs: spec.num_classes(),
        ..Predictions::default()
    };
    for_each_eval_batch(spec, buffers, data, &tensors, |features, _| {
        let logits = spec.head(&tensors, features.clone());
        out.features.extend_from_slice(
            features
                .into_data()
                .as_slice::<f32>()
                .expect("f32 features"),
        );
        out.logits
            .extend_from_slice(logits.into_data().as_slice::<f32>().expect("f32 outputs"));
    });
    out
}

/// Accumulates the errors of a batch's predictions over observed targets.
/// A non-finite prediction counts as a large error rather than poisoning the
/// sums with NaN, so a diverged model ranks last instead of breaking the run.
fn add_regression_errors(stats: &mut EvalStats, pred: &[f32], y: &Batch, (mean, std): (f32, f32)) {
    const DIVERGED: f64 = 1e4;
    for ((&p, &t), &o) in pred.iter().zip(&y.targets).zip(&y.observed) {
        if o == 0.0 {
            continue;
        }
        let z_err = if p.is_finite() {
            f64::from((p - t).abs())
        } else {
            DIVERGED
        };
        let truth = f64::from(t) * f64::from(std) + f64::from(mean);
        let err = z_err * f64::from(std);
        stats.loss_sum += z_err;
        stats.loss_terms += 1;
        stats.abs_err += err;
        stats.sq_err += err * err;
        if truth.abs() >= MAPE_MIN_ABS {
            stats.pct_err += err / truth.abs();
            stats.pct_terms += 1;
        }
    }
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
        let spec = ModelSpec::new(ModelKind::MLP, &[4], 2).unwrap();
        let init = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        (spec, init)
    }

    #[test]
    fn mlp_learns_separable_blobs_and_is_deterministic() {
        let (x, y) = blobs(200);
        let idx: Vec<usize> = (0..200).collect();
        let data = LocalData::new(&x, &y, &idx);
        let (spec, init) = mlp();
        let before = evaluate(&spec, &init, &[], &data);
        let run = || {
            let mut p = init.clone();
            let stats = train_local(
                &spec,
                &mut p,
                &mut [],
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
        let after = evaluate(&spec, &p1, &[], &data);
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
            flip_labels: Some(2),
            ..LocalData::new(&x, &y, &idx)
        };
        let clean = LocalData {
            flip_labels: None,
            ..flipped
        };
        let spec = ModelSpec::new(ModelKind::MLP, &[4], 2).unwrap();
        let mut p = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        train_local(
            &spec,
            &mut p,
            &mut [],
            &flipped,
            &cfg(60),
            &[],
            &[],
            None,
            &mut rng_stream(1, 1, 0, Purpose::Batches),
        );
        assert!(evaluate(&spec, &p, &[], &clean).accuracy() < 0.05);
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
            &mut [],
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
                &mut [],
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

    #[test]
    fn regression_errors_by_hand() {
        // Two observed targets and one masked; scale (mean 10, std 2).
        let y = Batch {
            labels: vec![],
            targets: vec![0.5, 1.0, 0.0],
            observed: vec![1.0, 1.0, 0.0],
        };
        let mut stats = EvalStats::default();
        add_regression_errors(&mut stats, &[1.0, 2.0, 99.0], &y, (10.0, 2.0));
        // Truths 11 and 12 °C, errors 1 and 2 °C; normalised errors 0.5, 1.
        assert_eq!(stats.loss_terms, 2);
        assert!((stats.mean_loss() - 0.75).abs() < 1e-12);
        assert!((stats.mae() - 1.5).abs() < 1e-12);
        assert!((stats.rmse() - 2.5f64.sqrt()).abs() < 1e-12);
        assert!((stats.mape() - 50.0 * (1.0 / 11.0 + 2.0 / 12.0)).abs() < 1e-9);
    }

    /// Sine waves with random phase: 12 past values → the next 3, with every
    /// seventh target unobserved (NaN).
    fn sines(n: usize) -> (Vec<f32>, Vec<f32>) {
        let mut rng = rng_stream(5, 0, 0, Purpose::Dataset);
        let (mut x, mut t) = (Vec::new(), Vec::new());
        for i in 0..n {
            let phase = rng.random_range(0.0f32..std::f32::consts::TAU);
            for s in 0..15 {
                let v = (0.5 * s as f32 + phase).sin();
                if s < 12 {
                    x.push(v);
                } else {
                    t.push(if (i * 3 + s) % 7 == 0 { f32::NAN } else { v });
                }
            }
        }
        (x, t)
    }

    #[test]
    fn gru_learns_to_forecast_and_ignores_masked_targets() {
        let (x, t) = sines(256);
        let idx: Vec<usize> = (0..256).collect();
        let data = LocalData::forecasting(&x, &t, 3, (0.0, 1.0), &idx);
        let spec = ModelSpec::new(crate::ModelKind::GRU, &[12, 1], 3).unwrap();
        let mut p = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        let before = evaluate(&spec, &p, &[], &data);
        let stats = train_local(
            &spec,
            &mut p,
            &mut [],
            &data,
            &TrainConfig {
                lr: 0.05,
                momentum: 0.9,
                weight_decay: 0.0,
                batch_size: 32,
                iterations: 300,
                epochs: 0,
            },
            &[],
            &[],
            None,
            &mut rng_stream(1, 1, 0, Purpose::Batches),
        );
        assert!(stats.mean_loss.is_finite() && p.iter().all(|v| v.is_finite()));
        let after = evaluate(&spec, &p, &[], &data);
        // 256·3 targets, of which those with (3i + s) % 7 == 0 are masked.
        let masked = (0..256)
            .flat_map(|i| (12..15).map(move |s| (3 * i + s) % 7 == 0))
            .filter(|&m| m)
            .count();
        assert_eq!(after.loss_terms, 256 * 3 - masked);
        assert!(
            after.mae() < 0.25 * before.mae(),
            "MAE {} → {}",
            before.mae(),
            after.mae()
        );
    }

    #[test]
    fn batch_norm_running_statistics_track_the_data_and_drive_evaluation() {
        let spec = ModelSpec::new(crate::ModelKind::CNN_BN, &[1, 28, 28], 3).unwrap();
        let mut rng = rng_stream(2, 0, 0, Purpose::Dataset);
        let n = 48;
        let x: Vec<f32> = (0..n * 784)
            .map(|_| rng.random_range(0.0f32..2.0))
            .collect();
        let y: Vec<u32> = (0..n as u32).map(|i| i % 3).collect();
        let idx: Vec<usize> = (0..n).collect();
        let data = LocalData::new(&x, &y, &idx);
        let mut p = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        let fresh = spec.init_buffers();
        let mut buffers = fresh.clone();
        // lr = 0: the parameters stay put and every step sees the whole set,
        // so after 100 steps the running statistics are the data's own
        // (up to 0.9^100 and the n/(n−1) variance correction).
        let frozen_cfg = TrainConfig {
            lr: 0.0,
            momentum: 0.0,
            weight_decay: 0.0,
            batch_size: n,
            iterations: 100,
            epochs: 0,
        };
        let before = p.clone();
        let stats = train_local(
            &spec,
            &mut p,
            &mut buffers,
            &data,
            &frozen_cfg,
            &[],
            &[],
            None,
            &mut rng_stream(1, 1, 0, Purpose::Batches),
        );
        assert_eq!(p, before);
        assert!(
            buffers[..32].iter().any(|&m| m.abs() > 1e-3),
            "running means moved"
        );
        let eval = evaluate(&spec, &p, &buffers, &data);
        assert!(
            (eval.mean_loss() - stats.mean_loss).abs() < 1e-3,
            "evaluation with running stats {} vs batch-stat training loss {}",
            eval.mean_loss(),
            stats.mean_loss
        );
        let with_fresh = evaluate(&spec, &p, &fresh, &data);
        assert!((with_fresh.mean_loss() - stats.mean_loss).abs() > 1e-2);
    }
}
