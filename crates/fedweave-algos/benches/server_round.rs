//! Server time per round of the graph methods at the `cnn-bn` model size
//! (FedAGHN's 4-layer CNN on 1×28×28, d = 582,218 trainable parameters),
//! for N = 20 and N = 200 clients, plus the bytes each client moves per
//! round.
//!
//! A plain bench binary rather than criterion: one N = 200 FedAGHN call
//! takes tens of seconds, so criterion's ten samples per case would take
//! many minutes for no extra information. Each case runs one warm-up round
//! (FedAGHN and FedDWA keep state across rounds) and then `REPEATS` timed
//! rounds; the median is printed.
//!
//! Uploads are synthetic trained models θ_i = θ_init + 0.01·(u_{i mod 4} +
//! z_i) with standard-normal u, z (four client groups); FedDWA's guidance
//! model is θ_i plus a further 0.001·z'.
//!
//! Run: `cargo bench -p fedweave-algos --bench server_round`
//! (`FEDWEAVE_BENCH_SIZES=20` to skip N = 200).

use fedweave_algos::{Env, Upload, build};
use fedweave_core::{Purpose, rng_stream};
use fedweave_nn::{ModelKind, ModelSpec, TrainConfig};
use rand_distr::{Distribution, StandardNormal};
use std::hint::black_box;
use std::time::Instant;

const METHODS: [&str; 4] = ["fedavg", "pfedgraph", "feddwa", "fedaghn"];
const GROUPS: usize = 4;

fn normal(rng: &mut impl rand::Rng, len: usize, scale: f32) -> Vec<f32> {
    (0..len)
        .map(|_| {
            let z: f32 = StandardNormal.sample(&mut *rng);
            scale * z
        })
        .collect()
}

/// The round's uploads of `n` clients, as the method would send them.
fn uploads(method: &str, init: &[f32], n: usize) -> Vec<Upload> {
    let mut rng = rng_stream(7, 1, 0, Purpose::Dataset);
    let dirs: Vec<Vec<f32>> = (0..GROUPS)
        .map(|_| normal(&mut rng, init.len(), 0.01))
        .collect();
    (0..n)
        .map(|i| {
            let z = normal(&mut rng, init.len(), 0.01);
            let model: Vec<f32> = init
                .iter()
                .zip(&dirs[i % GROUPS])
                .zip(&z)
                .map(|((t, u), z)| t + u + z)
                .collect();
            let mut up = Upload::model(model, 0.0);
            if method == "feddwa" {
                let extra = normal(&mut rng, init.len(), 0.001);
                up.extra = Some(up.model.iter().zip(extra).map(|(a, b)| a + b).collect());
                up.vectors = 2;
            }
            up
        })
        .collect()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    let sizes: Vec<usize> = std::env::var("FEDWEAVE_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![20, 200]);
    let spec = ModelSpec::new(ModelKind::CnnBn, &[1, 28, 28], 10).expect("cnn-bn spec");
    let init = spec.init(&mut rng_stream(7, 0, 0, Purpose::ModelInit));
    let wire = spec.layout().wire_bytes() as f64;
    let train = TrainConfig {
        lr: 0.01,
        momentum: 0.0,
        weight_decay: 0.0,
        batch_size: 64,
        iterations: 0,
        epochs: 1,
    };
    println!(
        "cnn-bn 1x28x28: d = {} parameters, {:.2} MB per model",
        init.len(),
        wire / 1e6
    );
    println!(
        "| method | N | server s/round (median) | MB up / client / round | MB down / client / round |"
    );
    println!("|---|---|---|---|---|");
    for &n in &sizes {
        let repeats = if n <= 50 { 5 } else { 2 };
        let client_sizes = vec![600; n];
        let env = Env {
            spec: &spec,
            train: &train,
            sizes: &client_sizes,
            init: &init,
            relation: None,
            label_counts: &[],
        };
        let participants: Vec<usize> = (0..n).collect();
        for method in METHODS {
            let (mut algo, _) = build(method, &toml::Table::new(), n).expect("known method");
            let owned = uploads(method, &init, n);
            let refs: Vec<&Upload> = owned.iter().collect();
            let mut times = Vec::new();
            let mut down = 0usize;
            for round in 1..=repeats + 1 {
                let start = Instant::now();
                let agg = black_box(algo.aggregate(&env, round, &participants, &refs));
                if round > 1 {
                    times.push(start.elapsed().as_secs_f64());
                }
                down = agg
                    .downloads
                    .iter()
                    .flatten()
                    .map(|d| 1 + usize::from(d.aux.is_some()))
                    .sum();
            }
            let up_models = owned.iter().map(|u| u.vectors).sum::<usize>() as f64 / n as f64;
            let down_models = down as f64 / n as f64;
            println!(
                "| {method} | {n} | {:.3} | {:.2} | {:.2} |",
                median(times),
                up_models * wire / 1e6,
                down_models * wire / 1e6
            );
        }
    }
}
