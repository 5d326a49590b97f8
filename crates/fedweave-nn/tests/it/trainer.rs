//! The step-level training API: a hand-written loop over `LocalTrainer`
//! equals `train_local`, frozen ranges stay put, the optimiser state
//! survives sessions, and the sampler draws today's order.

use fedweave_core::{Purpose, rng_stream};
use fedweave_nn::{
    BatchSampler, CosinePull, Device, ExtraLoss, Linear, LocalData, LocalTrainer, ModelKind,
    ModelSpec, Proximal, SgdState, TrainConfig, train_local,
};
use rand::Rng;
use rand::seq::SliceRandom;
use std::ops::Range;

const N: usize = 30;

struct Data {
    x: Vec<f32>,
    y: Vec<u32>,
    idx: Vec<usize>,
}

impl Data {
    fn new(input_len: usize, classes: u32) -> Self {
        let mut rng = rng_stream(21, 0, 0, Purpose::Dataset);
        Self {
            x: (0..N * input_len)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect(),
            y: (0..N).map(|_| rng.random_range(0..classes)).collect(),
            idx: (0..N).collect(),
        }
    }
    fn view(&self) -> LocalData<'_> {
        LocalData::new(&self.x, &self.y, &self.idx)
    }
}

fn cfg() -> TrainConfig {
    TrainConfig {
        lr: 0.05,
        momentum: 0.9,
        weight_decay: 1e-3,
        batch_size: 8,
        iterations: 6,
        epochs: 0,
    }
}

fn mlp() -> (ModelSpec, Vec<f32>) {
    let spec = ModelSpec::new(ModelKind::MLP, &[6], 3).unwrap();
    let init = spec.init(&mut rng_stream(2, 0, 0, Purpose::ModelInit));
    (spec, init)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_manual_loop_equals_train_local() {
    let data = Data::new(6, 3);
    let (spec, init) = mlp();
    let anchor: Vec<f32> = init.iter().map(|p| p * 0.5).collect();
    let prox = Proximal {
        mu: 0.2,
        anchor: &anchor,
    };
    let cos = CosinePull::new(-0.3, &anchor, true);
    let extras: [&dyn ExtraLoss; 2] = [&prox, &cos];
    let frozen = vec![3..50, 60..70];
    let cfg = cfg();

    let mut want = init.clone();
    let mut want_state = SgdState::default();
    let stats = train_local(
        &spec,
        &mut want,
        &mut [],
        &data.view(),
        &cfg,
        &extras,
        &frozen,
        Some(&mut want_state),
        &mut rng_stream(4, 1, 0, Purpose::Batches),
    );

    let mut rng = rng_stream(4, 1, 0, Purpose::Batches);
    let mut sampler = BatchSampler::new(N, cfg.batch_size, &mut rng);
    let mut trainer = LocalTrainer::new(&spec, &Device::flex(), &init, &[], cfg.sgd(), None);
    let mut loss = 0.0;
    for _ in 0..cfg.iterations {
        loss += trainer.loss_and_grad(&data.view(), sampler.next_batch(&mut rng), &extras);
        trainer.step(&frozen, cfg.lr);
    }
    let mut got = vec![0.0; init.len()];
    trainer.store(&mut got, &mut []);
    let mut got_state = SgdState::default();
    trainer.store_state(&mut got_state);
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(bits(&got_state.momentum), bits(&want_state.momentum));
    assert_eq!(
        (loss / cfg.iterations as f64).to_bits(),
        stats.mean_loss.to_bits()
    );
}

/// Two vectors for the terms to pull toward: one near `init`, one small.
fn term_targets(init: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let anchor = init.iter().map(|p| p * 0.5 - 0.01).collect();
    let shift = (0..init.len()).map(|i| (i % 7) as f32 * 1e-3).collect();
    (anchor, shift)
}

/// `cfg()`'s iterations from `init` with `extras`, their tensor forms on
/// the device or not: the parameters and each step's loss.
fn train_with_terms(
    data: &Data,
    spec: &ModelSpec,
    init: &[f32],
    extras: &[&dyn ExtraLoss],
    on_device: bool,
) -> (Vec<f32>, Vec<f64>) {
    let cfg = cfg();
    let mut rng = rng_stream(4, 1, 0, Purpose::Batches);
    let mut sampler = BatchSampler::new(N, cfg.batch_size, &mut rng);
    let mut trainer = LocalTrainer::new(spec, &Device::flex(), init, &[], cfg.sgd(), None)
        .terms_on_device(on_device);
    let terms = trainer.prepare(extras);
    let mut losses = Vec::new();
    for _ in 0..cfg.iterations {
        let batch = sampler.next_batch(&mut rng);
        losses.push(trainer.loss_and_grad_prepared(&data.view(), batch, &terms, None));
        trainer.step(&[], cfg.lr);
    }
    let mut params = vec![0.0; init.len()];
    trainer.store(&mut params, &mut []);
    (params, losses)
}

/// `c·‖θ‖²/2`, a term with only a host form.
struct HostOnly(f32);

impl ExtraLoss for HostOnly {
    fn add_value_and_grad(&self, theta: &[f32], grad: &mut [f32]) -> f64 {
        grad.iter_mut()
            .zip(theta)
            .for_each(|(g, t)| *g += self.0 * t);
        0.0
    }
}

#[test]
fn extra_terms_on_the_device_train_as_on_the_host() {
    let data = Data::new(6, 3);
    let (spec, init) = mlp();
    let (anchor, shift) = term_targets(&init);
    let prox = Proximal {
        mu: 0.2,
        anchor: &anchor,
    };
    let cos = CosinePull::new(-0.3, &anchor, true);
    let code_cos = CosinePull::new(0.1, &shift, false);
    let lin = Linear { coef: &shift };
    let host_only = HostOnly(0.05);
    let extras: [&dyn ExtraLoss; 5] = [&prox, &cos, &code_cos, &lin, &host_only];
    let (host, host_losses) = train_with_terms(&data, &spec, &init, &extras, false);
    let (device, device_losses) = train_with_terms(&data, &spec, &init, &extras, true);
    let moved = host
        .iter()
        .zip(&init)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(moved > 1e-2, "training moved the parameters by {moved}");
    for (a, b) in host.iter().zip(&device) {
        assert!((a - b).abs() <= 1e-6 * (1.0 + a.abs()), "{a} vs {b}");
    }
    for (a, b) in host_losses.iter().zip(&device_losses) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
}

/// A term's host form alone: what the trainer runs on flat vectors.
struct FlatOnly<'a>(&'a dyn ExtraLoss);

impl ExtraLoss for FlatOnly<'_> {
    fn add_value_and_grad(&self, theta: &[f32], grad: &mut [f32]) -> f64 {
        self.0.add_value_and_grad(theta, grad)
    }
}

#[test]
fn the_cosine_term_on_the_tensors_parts_trains_as_on_flat_vectors() {
    // The CPU trainer adds the cosine terms in the gradients' own buffers
    // (`PartsTerm`); wrapped without that form they run on joined vectors.
    // Same bits, parameters and losses; a mix with a flat-only term takes
    // the flat path for all.
    let data = Data::new(6, 3);
    let (spec, init) = mlp();
    let (anchor, shift) = term_targets(&init);
    let cos = CosinePull::new(-0.3, &anchor, true);
    let code_cos = CosinePull::new(0.1, &shift, false);
    assert!(cos.on_parts().is_some());
    let train = |extras: &[&dyn ExtraLoss]| {
        let (params, losses) = train_with_terms(&data, &spec, &init, extras, false);
        let losses: Vec<u64> = losses.iter().map(|l| l.to_bits()).collect();
        (bits(&params), losses)
    };
    let parts = train(&[&cos, &code_cos]);
    let flat = train(&[&FlatOnly(&cos), &FlatOnly(&code_cos)]);
    let mixed = train(&[&cos, &FlatOnly(&code_cos)]);
    assert_eq!(parts, flat);
    assert_eq!(parts, mixed);
    let plain = train(&[]);
    assert_ne!(parts.0, plain.0, "the terms moved the parameters");
}

#[test]
fn step_leaves_frozen_ranges_and_their_momentum_untouched() {
    let data = Data::new(6, 3);
    let (spec, init) = mlp();
    let layout = spec.layout();
    // Part of fc1.weight, all of fc1.bias and part of fc2.weight, plus the
    // whole head group; given unsorted and overlapping.
    let b1 = layout.tensor("fc1.bias").unwrap().range();
    let head = layout.head().unwrap().range.clone();
    let frozen: Vec<Range<usize>> = vec![
        head.clone(),
        b1.start..b1.end + 7,
        b1.start - 5..b1.start + 2,
    ];
    let is_frozen = |i: usize| frozen.iter().any(|r| r.contains(&i));
    let mut rng = rng_stream(4, 1, 0, Purpose::Batches);
    let mut sampler = BatchSampler::new(N, 8, &mut rng);
    // Momentum comes in non-zero, so "untouched" is visible.
    let state = SgdState {
        momentum: (0..init.len()).map(|i| (i % 7) as f32 * 0.01).collect(),
    };
    let mut trainer = LocalTrainer::new(
        &spec,
        &Device::flex(),
        &init,
        &[],
        cfg().sgd(),
        Some(&state),
    );
    for _ in 0..3 {
        trainer.loss_and_grad(&data.view(), sampler.next_batch(&mut rng), &[]);
        trainer.step(&frozen, 0.1);
    }
    let mut p = vec![0.0; init.len()];
    trainer.read_params(&mut p);
    let mut after = SgdState::default();
    trainer.store_state(&mut after);
    for i in 0..init.len() {
        if is_frozen(i) {
            assert_eq!(p[i].to_bits(), init[i].to_bits(), "parameter {i} moved");
            assert_eq!(
                after.momentum[i].to_bits(),
                state.momentum[i].to_bits(),
                "momentum {i} moved"
            );
        }
    }
    let moved = (0..init.len())
        .filter(|&i| !is_frozen(i) && p[i] != init[i])
        .count();
    let free = (0..init.len()).filter(|&i| !is_frozen(i)).count();
    assert!(
        moved > free * 9 / 10,
        "{moved} of {free} free parameters moved"
    );
}

#[test]
fn sgd_state_persists_across_sessions() {
    let data = Data::new(6, 3);
    let (spec, init) = mlp();
    let cfg = cfg();
    let run = |sessions: usize, steps: usize, keep: bool| {
        let mut rng = rng_stream(5, 1, 0, Purpose::Batches);
        let mut sampler = BatchSampler::new(N, cfg.batch_size, &mut rng);
        let mut p = init.clone();
        let mut state = SgdState::default();
        for _ in 0..sessions {
            let mut t = LocalTrainer::new(
                &spec,
                &Device::flex(),
                &p,
                &[],
                cfg.sgd(),
                keep.then_some(&state),
            );
            for _ in 0..steps {
                t.loss_and_grad(&data.view(), sampler.next_batch(&mut rng), &[]);
                t.step(&[], cfg.lr);
            }
            t.store(&mut p, &mut []);
            t.store_state(&mut state);
        }
        (bits(&p), bits(&state.momentum))
    };
    let one = run(1, 6, true);
    assert_eq!(run(2, 3, true), one, "momentum carried over");
    assert_eq!(run(3, 2, true), one);
    assert_ne!(run(2, 3, false).0, one.0, "a fresh optimiser differs");
    // train_local with a kept state continues the same way.
    let mut p = init.clone();
    let mut state = SgdState::default();
    let mut rng = rng_stream(6, 1, 0, Purpose::Batches);
    let half = TrainConfig {
        iterations: 3,
        ..cfg.clone()
    };
    for _ in 0..2 {
        train_local(
            &spec,
            &mut p,
            &mut [],
            &data.view(),
            &half,
            &[],
            &[],
            Some(&mut state),
            &mut rng,
        );
    }
    assert_eq!(state.momentum.len(), init.len());
    assert!(state.momentum.iter().any(|&m| m != 0.0));
}

#[test]
fn the_sampler_walks_the_former_order() {
    for (n, bs, steps) in [
        (30, 8, 20),
        (7, 3, 10),
        (5, 5, 4),
        (4, 10, 5),
        (1, 1, 3),
        (10, 0, 12),
    ] {
        // The former trainer's loop, verbatim.
        let mut rng = rng_stream(7, 2, n as u64, Purpose::Batches);
        let mut want: Vec<Vec<usize>> = Vec::new();
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(&mut rng);
        let mut cursor = 0;
        let b = bs.max(1);
        for _ in 0..steps {
            if cursor >= n {
                order.shuffle(&mut rng);
                cursor = 0;
            }
            let end = (cursor + b).min(n);
            want.push(order[cursor..end].to_vec());
            cursor = end;
        }
        let after_want: u64 = rng.random();

        let mut rng = rng_stream(7, 2, n as u64, Purpose::Batches);
        let mut sampler = BatchSampler::new(n, bs, &mut rng);
        let got: Vec<Vec<usize>> = (0..steps)
            .map(|_| sampler.next_batch(&mut rng).to_vec())
            .collect();
        assert_eq!(got, want, "n {n}, batch {bs}");
        assert_eq!(rng.random::<u64>(), after_want, "same draws from the rng");
    }
}

#[test]
fn parameters_and_gradient_can_be_read_and_replaced() {
    let data = Data::new(6, 3);
    let (spec, init) = mlp();
    let plain = fedweave_nn::SgdConfig::default();
    let mut t = LocalTrainer::new(&spec, &Device::flex(), &init, &[], plain, None);
    let batch: Vec<usize> = (0..10).collect();
    t.loss_and_grad(&data.view(), &batch, &[]);
    let mut g = vec![0.0; init.len()];
    t.read_grad(&mut g);
    assert!(g.iter().any(|&v| v != 0.0));
    // Plain SGD with lr 1: θ − 1·g, exactly.
    t.step(&[], 1.0);
    let mut p = vec![0.0; init.len()];
    t.read_params(&mut p);
    let want: Vec<f32> = init.iter().zip(&g).map(|(a, b)| a - 1.0 * b).collect();
    assert_eq!(bits(&p), bits(&want));
    // Back to the start, same gradient: the same step again (Per-FedAvg's
    // outer step from the pre-adaptation model).
    t.load_params(&init);
    t.step(&[], 1.0);
    t.read_params(&mut p);
    assert_eq!(bits(&p), bits(&want));
    // An extra term sees the session's current parameters: a proximal
    // term anchored at them adds nothing.
    let prox = Proximal {
        mu: 5.0,
        anchor: &want,
    };
    let mut with = vec![0.0; init.len()];
    let mut without = vec![0.0; init.len()];
    t.loss_and_grad(&data.view(), &batch, &[&prox]);
    t.read_grad(&mut with);
    t.loss_and_grad(&data.view(), &batch, &[]);
    t.read_grad(&mut without);
    assert_eq!(bits(&with), bits(&without));
}

#[test]
fn batch_norm_statistics_are_stored_with_the_parameters() {
    let spec = ModelSpec::new(ModelKind::CNN_BN, &[1, 28, 28], 2).unwrap();
    let data = Data::new(784, 2);
    let init = spec.init(&mut rng_stream(2, 0, 0, Purpose::ModelInit));
    let fresh = spec.init_buffers();
    let mut t = LocalTrainer::new(&spec, &Device::flex(), &init, &fresh, cfg().sgd(), None);
    let batch: Vec<usize> = (0..6).collect();
    t.loss_and_grad(&data.view(), &batch, &[]);
    assert_ne!(t.buffers(), fresh);
    let (mut p, mut b) = (vec![0.0; init.len()], vec![0.0; fresh.len()]);
    t.store(&mut p, &mut b);
    assert_eq!(b, t.buffers());
    assert_eq!(p, init, "no step taken");
}
