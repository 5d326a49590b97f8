//! The feature-level API: the model split, `predict`, and the objectives
//! against hand computations on the same features.
#![allow(clippy::needless_range_loop)] // index loops mirror the formulas

use fedweave_core::{Purpose, rng_stream};
use fedweave_nn::{
    BalancedSoftmax, CrossEntropy, Device, LocalData, LocalTrainer, ModelKind, ModelSpec,
    PrototypePull, SgdConfig, evaluate, predict,
};
use rand::Rng;

const N: usize = 24;

fn data(input_len: usize, classes: u32) -> (Vec<f32>, Vec<u32>, Vec<usize>) {
    let mut rng = rng_stream(5, 0, 0, Purpose::Dataset);
    let x = (0..N * input_len)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let y = (0..N).map(|_| rng.random_range(0..classes)).collect();
    (x, y, (0..N).collect())
}

fn mlp() -> (ModelSpec, Vec<f32>) {
    let spec = ModelSpec::new(ModelKind::MLP, &[5], 3).unwrap();
    let init = spec.init(&mut rng_stream(9, 0, 0, Purpose::ModelInit));
    (spec, init)
}

/// Gradient of `objective` (or the task loss) at `params` on the whole data.
fn grad_of(
    spec: &ModelSpec,
    params: &[f32],
    d: &LocalData,
    objective: Option<&dyn fedweave_nn::Objective>,
) -> (f64, Vec<f32>) {
    let mut t = LocalTrainer::new(
        spec,
        &Device::flex(),
        params,
        &spec.init_buffers(),
        SgdConfig::default(),
        None,
    );
    let batch: Vec<usize> = (0..d.len()).collect();
    let value = match objective {
        Some(o) => t.loss_and_grad_with(d, &batch, &[], o),
        None => t.loss_and_grad(d, &batch, &[]),
    };
    let mut g = vec![0.0; params.len()];
    t.read_grad(&mut g);
    (value, g)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn every_model_is_a_body_then_one_linear_head() {
    let cases = [
        (ModelKind::MLP, vec![7], 200, 0),
        (ModelKind::CNN, vec![1, 28, 28], 84, 0),
        (ModelKind::CNN_BN, vec![3, 32, 32], 512, 2),
        (ModelKind::CNN_DWA, vec![3, 32, 32], 512, 2),
        (ModelKind::GRU, vec![12, 2], 64, 0),
    ];
    for (kind, shape, features, bns) in cases {
        let spec = ModelSpec::new(kind, &shape, 4).unwrap();
        let split = spec.split();
        assert_eq!(spec.feature_len(), features, "{kind:?}");
        assert_eq!(split.base, 0..split.head.start, "{kind:?}");
        assert_eq!(split.head.end, spec.layout().len(), "{kind:?}");
        // The head is weight [features, outputs] plus bias [outputs].
        assert_eq!(split.head.len(), features * 4 + 4, "{kind:?}");
        assert_eq!(split.batch_norm.len(), bns, "{kind:?}");
        for r in &split.batch_norm {
            assert!(r.end <= split.base.end, "{kind:?}: BN lies in the body");
        }
    }
}

#[test]
fn predict_gives_the_features_the_head_reads() {
    let (spec, params) = mlp();
    let (x, y, idx) = data(5, 3);
    let d = LocalData::new(&x, &y, &idx);
    let p = predict(&spec, &params, &[], &d);
    assert_eq!((p.len(), p.feature_len, p.outputs), (N, 200, 3));
    // Head by hand: logits = f · W + b, with W stored [features, outputs].
    let head = spec.split().head;
    let (w, b) = params[head].split_at(200 * 3);
    let mut correct = 0;
    for k in 0..N {
        let f = p.feature(k);
        assert!(f.iter().all(|&v| v >= 0.0), "features follow a ReLU");
        let mut best = 0;
        for c in 0..3 {
            let z: f32 = b[c] + (0..200).map(|i| f[i] * w[i * 3 + c]).sum::<f32>();
            assert!((z - p.output(k)[c]).abs() < 1e-4, "sample {k} class {c}");
            if p.output(k)[c] > p.output(k)[best] {
                best = c;
            }
        }
        correct += usize::from(best == y[k] as usize);
    }
    assert_eq!(correct, evaluate(&spec, &params, &[], &d).correct);
}

#[test]
fn cross_entropy_objective_is_the_task_loss_bit_for_bit() {
    let (spec, params) = mlp();
    let (x, y, idx) = data(5, 3);
    let d = LocalData::new(&x, &y, &idx);
    let (v0, g0) = grad_of(&spec, &params, &d, None);
    let (v1, g1) = grad_of(&spec, &params, &d, Some(&CrossEntropy));
    assert_eq!(v0.to_bits(), v1.to_bits());
    assert_eq!(g0, g1);
}

#[test]
fn balanced_softmax_adds_the_log_prior_to_the_logits() {
    let (spec, params) = mlp();
    let (x, y, idx) = data(5, 3);
    let d = LocalData::new(&x, &y, &idx);
    // A uniform prior shifts every logit equally: the loss is unchanged.
    let uniform = BalancedSoftmax::from_counts(&[4, 4, 4]);
    let (v0, g0) = grad_of(&spec, &params, &d, None);
    let (v1, g1) = grad_of(&spec, &params, &d, Some(&uniform));
    assert!((v0 - v1).abs() < 1e-5 && max_diff(&g0, &g1) < 1e-5);
    // A skewed prior: the loss by hand from the predicted logits.
    let skewed = BalancedSoftmax::from_counts(&[6, 1, 3]);
    let lp = [0.6f64.ln(), 0.1f64.ln(), 0.3f64.ln()];
    let p = predict(&spec, &params, &[], &d);
    let mut hand = 0.0;
    for k in 0..N {
        let z: Vec<f64> = (0..3).map(|c| p.output(k)[c] as f64 + lp[c]).collect();
        let lse = z.iter().map(|v| v.exp()).sum::<f64>().ln();
        hand += lse - z[y[k] as usize];
    }
    let (v, _) = grad_of(&spec, &params, &d, Some(&skewed));
    assert!(
        (v - hand / N as f64).abs() < 1e-4,
        "{v} vs {}",
        hand / N as f64
    );
    // An absent class cannot be predicted: its log prior is very negative.
    let absent = BalancedSoftmax::from_counts(&[5, 0, 5]);
    assert!(absent.log_prior()[1] < -1e3);
}

#[test]
fn prototype_pull_adds_lambda_times_the_masked_feature_mse() {
    let (spec, params) = mlp();
    let (x, y, idx) = data(5, 3);
    let d = LocalData::new(&x, &y, &idx);
    let p = predict(&spec, &params, &[], &d);
    let fl = p.feature_len;
    let mut rng = rng_stream(3, 0, 0, Purpose::Dataset);
    let prototypes: Vec<f32> = (0..3 * fl).map(|_| rng.random_range(0.0..1.0)).collect();
    let known = vec![true, false, true];
    // λ = 0: exactly the task loss's gradient.
    let off = PrototypePull {
        lambda: 0.0,
        prototypes: prototypes.clone(),
        known: known.clone(),
    };
    let (v0, g0) = grad_of(&spec, &params, &d, None);
    let (v1, g1) = grad_of(&spec, &params, &d, Some(&off));
    assert!((v0 - v1).abs() < 1e-6 && max_diff(&g0, &g1) < 1e-6);
    // λ = 0.5: the value by hand (class 1 has no prototype: no pull).
    let lambda = 0.5;
    let mut sq = 0.0f64;
    for k in 0..N {
        let c = y[k] as usize;
        if known[c] {
            for i in 0..fl {
                let e = (p.feature(k)[i] - prototypes[c * fl + i]) as f64;
                sq += e * e;
            }
        }
    }
    let on = PrototypePull {
        lambda,
        prototypes,
        known,
    };
    let (v, g) = grad_of(&spec, &params, &d, Some(&on));
    let hand = v0 + lambda as f64 * sq / (N * fl) as f64;
    assert!((v - hand).abs() < 1e-4, "{v} vs {hand}");
    // The pull reaches the body only: the head's gradient is the task's.
    let head = spec.split().head;
    assert!(max_diff(&g[head.clone()], &g0[head]) < 1e-6);
    assert!(max_diff(&g, &g0) > 1e-4, "the body's gradient changed");
}
