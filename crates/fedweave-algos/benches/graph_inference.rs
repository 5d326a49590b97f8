//! pFedGraph's server-side cost per round at the `cnn` model size
//! (d = 44,426 for 1×28×28 inputs, 10 classes).
//!
//! Groups:
//! - `server_step`: `similarity_matrix` (cosines of θ_i − θ_init, one
//!   blocked N×d by d×N GEMM) and `infer_graph` (N simplex projections), as
//!   `PFedGraph::aggregate` runs them.
//! - `aggregate`: the whole `Algorithm::aggregate` call, which adds the
//!   embedding into an N×N graph and the mixing W·Θ (a second GEMM). N = 1000
//!   runs only with `FEDWEAVE_BENCH_LARGE=1`.
//! - `infer_graph`: the per-row QPs alone on a given random similarity
//!   matrix (values in [−1, 1], symmetric, diagonal 1; p uniform;
//!   alpha = 0.08·N), the same problem `scripts/qp_reference.py` solves
//!   with cvxpy.
//!
//! With `FEDWEAVE_QP_CASES=<dir>` (written by
//! `python3 scripts/qp_reference.py --dump <dir>`), the bench first prints
//! the largest difference between `infer_graph` and the cvxpy rows.
//!
//! Run: `cargo bench -p fedweave-algos --bench graph_inference`.

use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};
use fedweave_algos::pfedgraph::{PFedGraph, PFedGraphParams, infer_graph, similarity_matrix};
use fedweave_algos::{Algorithm, Env, Validate};
use fedweave_core::{Purpose, rng_stream};
use fedweave_nn::{ModelKind, ModelSpec, TrainConfig};
use rand::Rng;
use rand_distr::{Distribution, StandardNormal};
use std::hint::black_box;
use std::time::Duration;

const SIZES: [usize; 3] = [10, 100, 1000];
/// Clusters of clients whose updates share a direction, so the similarity
/// matrix has the block structure the graph rule is meant to find.
const CLUSTERS: usize = 4;

fn spec() -> ModelSpec {
    ModelSpec::new(ModelKind::CNN, &[1, 28, 28], 10).unwrap()
}

/// θ_init and N trained models θ_i = θ_init + 0.01·(u_{i mod 4} + z_i) with
/// u and z standard normal.
fn random_models(spec: &ModelSpec, n: usize) -> (Vec<f32>, Vec<Vec<f32>>) {
    let init = spec.init(&mut rng_stream(7, 0, 0, Purpose::ModelInit));
    let d = init.len();
    let mut rng = rng_stream(7, 1, 0, Purpose::Dataset);
    let mut normal = |len: usize| -> Vec<f32> {
        (0..len)
            .map(|_| StandardNormal.sample(&mut rng))
            .collect::<Vec<f32>>()
    };
    let dirs: Vec<Vec<f32>> = (0..CLUSTERS).map(|_| normal(d)).collect();
    let models = (0..n)
        .map(|i| {
            let z = normal(d);
            init.iter()
                .zip(&dirs[i % CLUSTERS])
                .zip(&z)
                .map(|((t, u), z)| t + 0.01 * (u + z))
                .collect()
        })
        .collect();
    (init, models)
}

/// What `PFedGraph::aggregate` computes before mixing, on all layers.
fn server_step(init: &[f32], uploads: &[Vec<f32>], p: &[f64], alpha: f64) -> Vec<Vec<f64>> {
    let s = similarity_matrix(
        fedweave_core::pairwise::Kernels::cpu(),
        uploads,
        init,
        std::slice::from_ref(&(0..init.len())),
        0.9,
    );
    infer_graph(&s, p, alpha)
}

fn bench_server_step(c: &mut Criterion) {
    let spec = spec();
    let mut group = c.benchmark_group("server_step");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sampling_mode(SamplingMode::Flat);
    for n in SIZES {
        let (init, models) = random_models(&spec, n);
        let p = vec![1.0 / n as f64; n];
        let alpha = 0.08 * n as f64;
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| black_box(server_step(&init, &models, &p, alpha)))
        });
    }
    group.finish();
}

fn bench_aggregate(c: &mut Criterion) {
    let spec = spec();
    let train = TrainConfig {
        lr: 0.01,
        momentum: 0.9,
        weight_decay: 1e-5,
        batch_size: 64,
        iterations: 10,
        epochs: 0,
    };
    let mut group = c.benchmark_group("aggregate");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sampling_mode(SamplingMode::Flat);
    let large = std::env::var_os("FEDWEAVE_BENCH_LARGE").is_some();
    for n in SIZES {
        if n >= 1000 && !large {
            eprintln!("aggregate/{n}: skipped (set FEDWEAVE_BENCH_LARGE=1)");
            continue;
        }
        let (init, models) = random_models(&spec, n);
        let sizes = vec![600; n];
        let env = Env {
            spec: &spec,
            train: &train,
            sizes: &sizes,
            init: &init,
            relation: None,
            label_counts: &[],
            kernels: fedweave_core::pairwise::Kernels::cpu(),
        };
        let uploads: Vec<(usize, Vec<f32>)> = models.into_iter().enumerate().collect();
        let algo = PFedGraph::new(
            "pfedgraph",
            PFedGraphParams::default()
                .check(env.clients())
                .expect("valid"),
            &env,
        )
        .expect("builds");
        let mut server = algo.init_server(&env);
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| black_box(algo.aggregate(&env, &mut server, 1, &uploads)))
        });
    }
    group.finish();
}

/// Symmetric, entries U(−1, 1), diagonal 1.
fn random_similarity(n: usize) -> Vec<Vec<f64>> {
    let mut rng = rng_stream(11, 0, n as u64, Purpose::Dataset);
    let mut s = vec![vec![1.0; n]; n];
    for i in 0..n {
        let upper: Vec<f64> = (i + 1..n).map(|_| rng.random_range(-1.0..1.0)).collect();
        for (k, v) in upper.into_iter().enumerate() {
            s[i][i + 1 + k] = v;
            s[i + 1 + k][i] = v;
        }
    }
    s
}

fn bench_infer_graph(c: &mut Criterion) {
    check_against_cvxpy();
    let mut group = c.benchmark_group("infer_graph");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for n in SIZES {
        let s = random_similarity(n);
        let p = vec![1.0 / n as f64; n];
        let alpha = 0.08 * n as f64;
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter(|| black_box(infer_graph(&s, &p, alpha)))
        });
    }
    group.finish();
}

/// Compares `infer_graph` with the rows cvxpy found, for every case file
/// `qp_case_<N>.txt` in `$FEDWEAVE_QP_CASES`. The format (whitespace
/// separated): `N alpha rows`, then p (N values), then S (N×N), then `rows`
/// lines of `i w_i0 … w_i(N−1)`.
fn check_against_cvxpy() {
    let Ok(dir) = std::env::var("FEDWEAVE_QP_CASES") else {
        return;
    };
    for n in SIZES {
        let path = std::path::Path::new(&dir).join(format!("qp_case_{n}.txt"));
        let Ok(text) = std::fs::read_to_string(&path) else {
            eprintln!("cvxpy check: no {}", path.display());
            continue;
        };
        let mut it = text
            .split_ascii_whitespace()
            .map(|t| t.parse::<f64>().unwrap());
        let mut take = |k: usize| (&mut it).take(k).collect::<Vec<f64>>();
        let head = take(3);
        let (n, alpha, rows) = (head[0] as usize, head[1], head[2] as usize);
        let p = take(n);
        let s: Vec<Vec<f64>> = (0..n).map(|_| take(n)).collect();
        let ours = infer_graph(&s, &p, alpha);
        let mut max_diff = 0.0f64;
        for _ in 0..rows {
            let line = take(n + 1);
            let i = line[0] as usize;
            for (a, b) in ours[i].iter().zip(&line[1..]) {
                max_diff = max_diff.max((a - b).abs());
            }
        }
        eprintln!("cvxpy check N={n}: {rows} rows, max |rust - cvxpy| = {max_diff:.3e}");
    }
}

criterion_group!(
    benches,
    bench_infer_graph,
    bench_server_step,
    bench_aggregate
);
criterion_main!(benches);
