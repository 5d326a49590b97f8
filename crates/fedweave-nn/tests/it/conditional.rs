//! Objectives with auxiliary parameters (`LocalTrainer::loss_and_grad_aux`)
//! and FedCP's conditional policy against f64 hand computations.
#![allow(clippy::needless_range_loop)] // index loops mirror the formulas

use burn::tensor::Tensor;
use fedweave_core::{Purpose, rng_stream};
use fedweave_nn::conditional::{cpn_len, evaluate_policy, init_cpn, policy_outputs};
use fedweave_nn::objective::cross_entropy;
use fedweave_nn::{
    AuxObjective, Body, ConditionalPolicy, Device, LocalData, LocalTrainer, ModelKind, ModelSpec,
    PolicyObjective, SgdConfig, predict,
};
use rand::Rng;

const N: usize = 12;
const C: usize = 3;

fn data() -> (Vec<f32>, Vec<u32>, Vec<usize>) {
    let mut rng = rng_stream(6, 0, 0, Purpose::Dataset);
    let x = (0..N * 5).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let y = (0..N).map(|_| rng.random_range(0..C as u32)).collect();
    (x, y, (0..N).collect())
}

fn mlp() -> (ModelSpec, Vec<f32>) {
    let spec = ModelSpec::new(ModelKind::MLP, &[5], C).unwrap();
    let init = spec.init(&mut rng_stream(9, 0, 0, Purpose::ModelInit));
    (spec, init)
}

fn trainer<'a>(spec: &'a ModelSpec, params: &[f32]) -> LocalTrainer<'a> {
    LocalTrainer::new(
        spec,
        &Device::flex(),
        params,
        &spec.init_buffers(),
        SgdConfig::default(),
        None,
    )
}

/// CE of the model's own head plus ½‖aux‖².
struct HalfSquare;

impl AuxObjective for HalfSquare {
    fn loss(&self, body: Body, aux: Tensor<1>, _: &[usize], labels: &[i64]) -> Tensor<1> {
        let logits = body.head(body.features.clone());
        cross_entropy(logits, labels) + aux.square().sum().mul_scalar(0.5).reshape([1])
    }
}

#[test]
fn auxiliary_parameters_get_their_gradient_and_the_model_its_own() {
    let (spec, params) = mlp();
    let (x, y, idx) = data();
    let d = LocalData::new(&x, &y, &idx);
    let batch: Vec<usize> = (0..N).collect();
    let mut plain = trainer(&spec, &params);
    let v0 = plain.loss_and_grad(&d, &batch, &[]);
    let mut g0 = vec![0.0; params.len()];
    plain.read_grad(&mut g0);

    let aux = [0.5f32, -2.0, 3.25];
    let mut aux_grad = [9.0f32; 3];
    let mut t = trainer(&spec, &params);
    let v = t.loss_and_grad_aux(&d, &batch, &[], &HalfSquare, &aux, &mut aux_grad);
    // d/da ½a² = a, exactly in f32.
    assert_eq!(aux_grad, aux);
    assert!(
        (v - v0 - 0.5 * (0.25 + 4.0 + 10.5625)).abs() < 1e-5,
        "{v} vs {v0}"
    );
    // The model's gradient is the task loss's, bit for bit (same graph).
    let mut g = vec![0.0; params.len()];
    t.read_grad(&mut g);
    assert_eq!(g, g0);
    // And a step uses it.
    t.step(&[], 0.1);
    let mut after = vec![0.0; params.len()];
    t.read_params(&mut after);
    for k in 0..params.len() {
        assert_eq!(after[k], params[k] - 0.1 * g0[k]);
    }
}

/// An objective that never reads `aux`: its gradient is reported as zeros.
struct Ignores;

impl AuxObjective for Ignores {
    fn loss(&self, body: Body, _: Tensor<1>, _: &[usize], labels: &[i64]) -> Tensor<1> {
        cross_entropy(body.head(body.features.clone()), labels)
    }
}

#[test]
fn unused_auxiliary_parameters_get_a_zero_gradient() {
    let (spec, params) = mlp();
    let (x, y, idx) = data();
    let d = LocalData::new(&x, &y, &idx);
    let mut aux_grad = [1.0f32; 4];
    trainer(&spec, &params).loss_and_grad_aux(
        &d,
        &[0, 1, 2],
        &[],
        &Ignores,
        &[1.0; 4],
        &mut aux_grad,
    );
    assert_eq!(aux_grad, [0.0; 4]);
}

/// Everything FedCP's forward pass needs, as plain vectors.
struct Setup {
    spec: ModelSpec,
    params: Vec<f32>,
    cpn: Vec<f32>,
    global_head: Vec<f32>,
    context: Vec<f32>,
    x: Vec<f32>,
    y: Vec<u32>,
    idx: Vec<usize>,
}

fn setup() -> Setup {
    let (spec, params) = mlp();
    let d = spec.feature_len();
    let mut rng = rng_stream(4, 0, 0, Purpose::Algorithm);
    let mut cpn = init_cpn(d, &mut rng);
    // Perturb the LayerNorm scale and shift so they matter.
    let ln = 2 * d * d + 2 * d;
    for v in &mut cpn[ln..] {
        *v += rng.random_range(-0.5f32..0.5);
    }
    let head = spec.split().head;
    let global_head = params[head]
        .iter()
        .map(|w| w + rng.random_range(-0.3f32..0.3))
        .collect();
    let context = (0..d).map(|_| rng.random_range(0.0f32..1.0)).collect();
    let (x, y, idx) = data();
    Setup {
        spec,
        params,
        cpn,
        global_head,
        context,
        x,
        y,
        idx,
    }
}

/// FedCP's logits for one sample's features `h`, in f64 (PFLlib's
/// `Ensemble.forward`): `noise` is the sample's Gumbel noise (2d).
fn host_logits(s: &Setup, h: &[f32], head_p: &[f32], cpn: &[f32], noise: &[f64]) -> Vec<f64> {
    let d = h.len();
    let norm = s
        .context
        .iter()
        .map(|&v| (v as f64).powi(2))
        .sum::<f64>()
        .sqrt();
    let gate: Vec<f64> = (0..d)
        .map(|i| h[i] as f64 * s.context[i] as f64 / norm)
        .collect();
    let (w, rest) = cpn.split_at(2 * d * d);
    let (b, rest) = rest.split_at(2 * d);
    let (gamma, beta) = rest.split_at(2 * d);
    let z: Vec<f64> = (0..2 * d)
        .map(|o| {
            b[o] as f64
                + (0..d)
                    .map(|i| gate[i] * w[i * 2 * d + o] as f64)
                    .sum::<f64>()
        })
        .collect();
    let mean = z.iter().sum::<f64>() / (2 * d) as f64;
    let var = z.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (2 * d) as f64;
    let z: Vec<f64> = (0..2 * d)
        .map(|o| {
            let n = (z[o] - mean) / (var + 1e-5).sqrt() * gamma[o] as f64 + beta[o] as f64;
            n.max(0.0) + noise[o]
        })
        .collect();
    let personal: Vec<f64> = (0..d)
        .map(|k| {
            let (a, c) = (z[k].exp(), z[d + k].exp());
            a / (a + c)
        })
        .collect();
    let linear = |head: &[f32], mask: &dyn Fn(usize) -> f64| -> Vec<f64> {
        (0..C)
            .map(|c| {
                head[d * C + c] as f64
                    + (0..d)
                        .map(|i| h[i] as f64 * mask(i) * head[i * C + c] as f64)
                        .sum::<f64>()
            })
            .collect()
    };
    let p = linear(head_p, &|i| personal[i]);
    let g = linear(&s.global_head, &|i| 1.0 - personal[i]);
    (0..C).map(|c| p[c] + g[c]).collect()
}

fn host_mmd(x: &[Vec<f64>], y: &[Vec<f64>]) -> f64 {
    let k = |a: &[f64], b: &[f64]| {
        let d2: f64 = a.iter().zip(b).map(|(u, v)| (u - v).powi(2)).sum();
        [10.0, 15.0, 20.0, 50.0]
            .iter()
            .map(|bw| (-0.5 * d2 / bw).exp())
            .sum::<f64>()
    };
    let n = x.len() as f64;
    let mut total = 0.0;
    for i in 0..x.len() {
        for j in 0..x.len() {
            total += k(&x[i], &x[j]) + k(&y[i], &y[j]) - 2.0 * k(&x[i], &y[j]);
        }
    }
    total / (n * n)
}

fn host_loss(
    s: &Setup,
    feats: &[Vec<f32>],
    head_p: &[f32],
    cpn: &[f32],
    reference: &[Vec<f64>],
    noise: &[Vec<f64>],
    lambda: f64,
) -> f64 {
    let mut ce = 0.0;
    for k in 0..N {
        let z = host_logits(s, &feats[k], head_p, cpn, &noise[k]);
        let lse = z.iter().map(|v| v.exp()).sum::<f64>().ln();
        ce += lse - z[s.y[k] as usize];
    }
    let x: Vec<Vec<f64>> = feats
        .iter()
        .map(|f| f.iter().map(|&v| v as f64).collect())
        .collect();
    ce / N as f64 + lambda * host_mmd(&x, reference)
}

#[test]
fn policy_outputs_and_scores_match_the_reference_forward_pass() {
    let s = setup();
    let d = LocalData::new(&s.x, &s.y, &s.idx);
    let policy = ConditionalPolicy {
        global_head: &s.global_head,
        context: &s.context,
        tau: 1.0,
    };
    let got = policy_outputs(&s.spec, &s.params, &[], &d, &policy, &s.cpn);
    let p = predict(&s.spec, &s.params, &[], &d);
    let head_p = &s.params[s.spec.split().head];
    let fl = s.spec.feature_len();
    let mut correct = 0;
    let mut loss = 0.0;
    for k in 0..N {
        let want = host_logits(&s, p.feature(k), head_p, &s.cpn, &vec![0.0; 2 * fl]);
        for c in 0..C {
            assert!(
                (got[k * C + c] as f64 - want[c]).abs() < 1e-4,
                "sample {k}: {:?} vs {want:?}",
                &got[k * C..(k + 1) * C]
            );
        }
        let best = (0..C).max_by(|&a, &b| want[a].total_cmp(&want[b])).unwrap();
        correct += usize::from(best == s.y[k] as usize);
        let lse = want.iter().map(|v| v.exp()).sum::<f64>().ln();
        loss += lse - want[s.y[k] as usize];
    }
    let stats = evaluate_policy(&s.spec, &s.params, &[], &d, &policy, &s.cpn);
    assert_eq!((stats.total, stats.correct), (N, correct));
    assert!(
        (stats.loss_sum - loss).abs() < 1e-3,
        "{} vs {loss}",
        stats.loss_sum
    );
    // The policy is not the plain model: the global head contributes.
    let plain = fedweave_nn::evaluate(&s.spec, &s.params, &[], &d);
    assert!((plain.loss_sum - stats.loss_sum).abs() > 1e-3);
    assert_eq!(s.cpn.len(), cpn_len(fl));
}

#[test]
fn policy_objective_value_and_gradients_match_finite_differences() {
    let s = setup();
    let d = LocalData::new(&s.x, &s.y, &s.idx);
    let fl = s.spec.feature_len();
    let mut rng = rng_stream(8, 0, 0, Purpose::Algorithm);
    // Frozen "global body" features and Gumbel noise for the batch.
    let reference: Vec<f32> = (0..N * fl).map(|_| rng.random_range(0.0f32..1.5)).collect();
    let noise: Vec<f32> = (0..N * 2 * fl)
        .map(|_| {
            let u: f64 = rng.random_range(1e-9..1.0);
            (-(-u.ln()).ln()) as f32
        })
        .collect();
    let lambda = 5.0;
    let objective = PolicyObjective {
        policy: ConditionalPolicy {
            global_head: &s.global_head,
            context: &s.context,
            tau: 1.0,
        },
        lambda,
        reference_features: &reference,
        noise: Some(&noise),
    };
    let batch: Vec<usize> = (0..N).collect();
    let mut t = trainer(&s.spec, &s.params);
    let mut cpn_grad = vec![0.0; s.cpn.len()];
    let value = t.loss_and_grad_aux(&d, &batch, &[], &objective, &s.cpn, &mut cpn_grad);
    let mut grad = vec![0.0; s.params.len()];
    t.read_grad(&mut grad);

    let p = predict(&s.spec, &s.params, &[], &d);
    let feats: Vec<Vec<f32>> = (0..N).map(|k| p.feature(k).to_vec()).collect();
    let reference64: Vec<Vec<f64>> = (0..N)
        .map(|k| {
            reference[k * fl..(k + 1) * fl]
                .iter()
                .map(|&v| v as f64)
                .collect()
        })
        .collect();
    let noise64: Vec<Vec<f64>> = (0..N)
        .map(|k| {
            noise[k * 2 * fl..(k + 1) * 2 * fl]
                .iter()
                .map(|&v| v as f64)
                .collect()
        })
        .collect();
    let head = s.spec.split().head;
    let head_p = s.params[head.clone()].to_vec();
    let loss = |head_p: &[f32], cpn: &[f32]| {
        host_loss(
            &s,
            &feats,
            head_p,
            cpn,
            &reference64,
            &noise64,
            lambda as f64,
        )
    };
    let want = loss(&head_p, &s.cpn);
    assert!(
        (value - want).abs() < 1e-4 * want.abs().max(1.0),
        "{value} vs {want}"
    );
    assert!(
        host_mmd(
            &feats
                .iter()
                .map(|f| f.iter().map(|&v| v as f64).collect())
                .collect::<Vec<_>>(),
            &reference64
        ) > 1e-3
    );

    // Central differences in f64 on the host loss, for CPN coordinates of
    // every block (linear weight and bias, LayerNorm scale and shift) and
    // for the personal head.
    let eps = 1e-3;
    let blocks = [
        0,
        7 * 2 * fl + 11,
        2 * fl * fl + 5,
        2 * fl * fl + 2 * fl + 9,
        2 * fl * fl + 4 * fl + 3,
    ];
    for &j in &blocks {
        let mut up = s.cpn.clone();
        up[j] += eps;
        let mut down = s.cpn.clone();
        down[j] -= eps;
        let fd = (loss(&head_p, &up) - loss(&head_p, &down)) / (2.0 * eps as f64);
        let g = cpn_grad[j] as f64;
        assert!(
            (fd - g).abs() < 2e-3 * fd.abs().max(0.05),
            "cpn[{j}]: autodiff {g} vs fd {fd}"
        );
    }
    for j in [0, 3 * C + 1, fl * C + 2] {
        let mut up = head_p.clone();
        up[j] += eps;
        let mut down = head_p.clone();
        down[j] -= eps;
        let fd = (loss(&up, &s.cpn) - loss(&down, &s.cpn)) / (2.0 * eps as f64);
        let g = grad[head.start + j] as f64;
        assert!(
            (fd - g).abs() < 2e-3 * fd.abs().max(0.05),
            "head[{j}]: autodiff {g} vs fd {fd}"
        );
    }
    // The MMD term reaches the body; without it (λ = 0) the body's
    // gradient changes.
    let no_mmd = PolicyObjective {
        lambda: 0.0,
        ..objective
    };
    let mut t0 = trainer(&s.spec, &s.params);
    t0.loss_and_grad_aux(&d, &batch, &[], &no_mmd, &s.cpn, &mut cpn_grad);
    let mut g0 = vec![0.0; s.params.len()];
    t0.read_grad(&mut g0);
    let body = s.spec.split().base;
    let diff = g0[body.clone()]
        .iter()
        .zip(&grad[body])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(diff > 1e-5, "{diff}");
}
