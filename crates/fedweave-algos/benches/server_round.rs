//! Server time per round of the graph methods at the `cnn-bn` model size
//! (FedAGHN's 4-layer CNN on 1×28×28, d = 582,218 trainable parameters),
//! for N = 20 and N = 200 clients, plus the bytes each client moves per
//! round.
//!
//! A plain bench binary rather than criterion: one N = 200 FedAGHN call
//! takes tens of seconds, so criterion's ten samples per case would take
//! many minutes for no extra information. Each case runs one warm-up round
//! (FedAGHN and FedDWA keep state across rounds) and then a few timed
//! rounds; the fastest is printed (`fedweave_algos::server_bench`, which
//! `fedweave bench --server N` uses too).
//!
//! Uploads are synthetic trained models θ_i = θ_init + 0.01·(u_{i mod 4} +
//! z_i) with standard-normal u, z (four client groups); FedDWA's guidance
//! model is θ_i plus a further 0.001·z'.
//!
//! A second table times SFL's graph-convolutional aggregation U = Â³Θ on a
//! sparse 6-nearest-neighbour ring (each client linked to the 3 before and
//! after it) at N = 144 and N = 1000, for the `gru` (d = 13,059, the weather
//! model) and `cnn` (d = 44,426) sizes: O(hops·nnz·d) work, not O(N²·d).
//!
//! Run: `cargo bench -p fedweave-algos --bench server_round`
//! (`FEDWEAVE_BENCH_SIZES=20` to skip N = 200).
//!
//! The issue-16 grid instead: `FEDWEAVE_BENCH_CASES=100x44k,100x582k,1000x44k,1000x582k`
//! times pFedGraph's server step (cosines + graph) and the whole `aggregate`
//! of pFedGraph, FedAvg, FedDWA and FedAGHN at each N × d (at N = 1000
//! pFedGraph only, timed once: a 2-core machine needs minutes per method),
//! with the effective GFLOP/s as a share of this machine's measured
//! `matrixmultiply` dgemm rate (the kernels run `f64` GEMMs, see
//! `fedweave_core::pairwise`). `FEDWEAVE_BENCH_KERNELS=device` runs the grid's
//! products on burn's device instead (`[device] server_kernels = "device"`;
//! `FEDWEAVE_BENCH_BACKEND=cuda` in a CUDA build, `flex` on the CPU otherwise).

use fedweave_algos::fedaghn::FedAghn;
use fedweave_algos::fedavg::FedAvg;
use fedweave_algos::feddwa::FedDwa;
use fedweave_algos::pfedgraph::{PFedGraph, PFedGraphParams, infer_graph, similarity_matrix};
use fedweave_algos::server_bench::{
    self, Federation, guided_models as guided, trained_models as models,
};
use fedweave_algos::sfl::Sfl;
use fedweave_algos::{Algorithm, Env, Validate};
use fedweave_core::pairwise::{GemmThroughput, Kernels, gemm_throughput};
use fedweave_core::{Purpose, RelationGraph, rng_stream};
use fedweave_nn::{Backend, BurnOffload, ModelKind, ModelSpec, TrainConfig};
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

/// The fastest of `repeats` rounds after a warm-up, and the bytes each client
/// moves down and up.
fn time_aggregate<A: Algorithm>(
    name: &'static str,
    env: &Env,
    uploads: &[(usize, A::Up)],
    repeats: usize,
) -> (f64, f64, f64) {
    let t = server_bench::time_aggregate::<A>(name, env, uploads, repeats);
    (t.seconds, t.down_bytes, t.up_bytes)
}

/// Each client linked to its 3 predecessors and successors on a ring.
fn ring(n: usize) -> RelationGraph {
    let triples = (0..n).flat_map(|i| {
        (1..=3).flat_map(move |k| [(i, (i + k) % n, 1.0), (i, (i + n - k) % n, 1.0)])
    });
    RelationGraph::from_triples(n, triples.collect::<Vec<_>>()).expect("ring graph")
}

fn sfl_table() {
    println!("\n| SFL aggregation (U = Â³Θ, 6-NN ring) | N | d | nnz(Â) | s/round (best) |");
    println!("|---|---|---|---|---|");
    for (model, spec) in [
        (
            "gru",
            ModelSpec::new(ModelKind::GRU, &[12, 1], 3).expect("gru spec"),
        ),
        (
            "cnn",
            ModelSpec::new(ModelKind::CNN, &[1, 28, 28], 10).expect("cnn spec"),
        ),
    ] {
        let init = spec.init(&mut rng_stream(7, 0, 0, Purpose::ModelInit));
        for n in [144, 1000] {
            let graph = ring(n);
            let train = TrainConfig {
                lr: 0.01,
                momentum: 0.0,
                weight_decay: 0.0,
                batch_size: 32,
                iterations: 0,
                epochs: 1,
            };
            let sizes = vec![280; n];
            let env = Env {
                spec: &spec,
                train: &train,
                sizes: &sizes,
                init: &init,
                relation: Some(&graph),
                label_counts: &[],
                kernels: fedweave_core::pairwise::Kernels::cpu(),
            };
            let (secs, _, _) = time_aggregate::<Sfl>("sfl", &env, &models(&init, n), 3);
            let nnz = graph.with_self_loops_row_normalized(1.0).nnz();
            println!("| {model} | {n} | {} | {nnz} | {:.3} |", init.len(), secs);
        }
    }
}

/// The grid's kernels: the host's, or burn's device with
/// `FEDWEAVE_BENCH_KERNELS=device` (on `FEDWEAVE_BENCH_BACKEND`, default cpu).
fn bench_kernels() -> Kernels {
    match std::env::var("FEDWEAVE_BENCH_KERNELS").as_deref() {
        Ok("device") => {
            let backend = match std::env::var("FEDWEAVE_BENCH_BACKEND").as_deref() {
                Ok("cuda") => Backend::Cuda,
                Ok("wgpu") => Backend::Wgpu,
                _ => Backend::Cpu,
            };
            let dev = BurnOffload::new(backend).expect("the backend computes in f64");
            Kernels::offloaded(Arc::new(dev), 0.0)
        }
        _ => Kernels::cpu().clone(),
    }
}

/// The models the grid covers: d = 44,426 (`cnn`, pFedGraph's SimpleCNN)
/// and d = 582,218 (`cnn-bn`, FedAGHN's CNN), both on 1×28×28.
fn spec_of(d: &str) -> ModelSpec {
    let kind = match d {
        "44k" => ModelKind::CNN,
        "582k" => ModelKind::CNN_BN,
        other => panic!("FEDWEAVE_BENCH_CASES: model size {other} is not 44k or 582k"),
    };
    ModelSpec::new(kind, &[1, 28, 28], 10).expect("image spec")
}

/// One (N, d) case of the grid: pFedGraph's server step (similarity +
/// graph, no mixing) and every method's whole `aggregate`, with effective
/// GFLOP/s as a share of the machine's dgemm rate. `only_pfedgraph` skips
/// the others (N = 1000: minutes per method on 2 cores; at d = 582k FedAGHN
/// alone keeps four 2.3 GB N×d blocks).
fn grid_case(n: usize, d: &str, peak: &GemmThroughput, kernels: &Kernels, only_pfedgraph: bool) {
    let spec = spec_of(d);
    let fed = Federation::new(&spec, n);
    let (env, init) = (fed.env(&spec, kernels), &fed.init);
    let dim = init.len();
    let trained = models(init, n);
    let repeats = if n * dim > 20_000_000 { 1 } else { 3 };
    let (nn, dd) = (n as f64, dim as f64);
    // Useful flops: a symmetric Gram N²·d, a cross Gram or a mix 2·N²·d.
    let report = |what: &str, secs: f64, flops: f64| {
        let gf = flops / secs / 1e9;
        println!(
            "| {what} | {n} | {dim} | {secs:.3} | {gf:.1} | {:.0}% |",
            100.0 * gf / peak.dgemm_all
        );
    };
    let uploads: Vec<Vec<f32>> = trained.iter().map(|(_, m)| m.clone()).collect();
    let p = vec![1.0 / nn; n];
    // The largest case is timed once, without a warm-up (pFedGraph keeps
    // no server state, so a first call measures what later ones do).
    let warmup = usize::from(!only_pfedgraph);
    let step = (0..warmup + repeats)
        .map(|_| {
            let start = Instant::now();
            let s = similarity_matrix(
                kernels,
                &uploads,
                init,
                std::slice::from_ref(&(0..dim)),
                0.9,
            );
            black_box(infer_graph(&s, &p, 0.08 * nn));
            start.elapsed().as_secs_f64()
        })
        .skip(warmup)
        .fold(f64::INFINITY, f64::min);
    drop(uploads);
    report(
        "pfedgraph server step (cosines + graph)",
        step,
        nn * nn * dd,
    );
    if only_pfedgraph {
        let params = PFedGraphParams::default().check(env.clients());
        let algo = PFedGraph::new("pfedgraph", params.expect("valid"), &env).expect("builds");
        let mut server = algo.init_server(&env);
        let start = Instant::now();
        black_box(algo.aggregate(&env, &mut server, 1, &trained));
        let secs = start.elapsed().as_secs_f64();
        report(
            "pfedgraph aggregate (+ mixing W·Θ)",
            secs,
            3.0 * nn * nn * dd,
        );
        return;
    }
    let (secs, _, _) = time_aggregate::<PFedGraph>("pfedgraph", &env, &trained, repeats);
    report(
        "pfedgraph aggregate (+ mixing W·Θ)",
        secs,
        3.0 * nn * nn * dd,
    );
    let (secs, _, _) = time_aggregate::<FedAvg>("fedavg", &env, &trained, repeats);
    report("fedavg aggregate", secs, 2.0 * nn * dd);
    let (secs, _, _) = time_aggregate::<FedDwa>("feddwa", &env, &guided(init, n), repeats);
    report(
        "feddwa aggregate (distances + mixing)",
        secs,
        4.0 * nn * nn * dd,
    );
    let (secs, _, _) = time_aggregate::<FedAghn>("fedaghn", &env, &trained, repeats);
    report(
        "fedaghn aggregate (per-layer cosines + 2 mixes)",
        secs,
        5.0 * nn * nn * dd,
    );
}

fn main() {
    let peak = gemm_throughput(1024, 3);
    println!(
        "matrixmultiply 1024³ on this machine: dgemm {:.1} GFLOP/s on 1 thread, {:.1} on {} threads; sgemm {:.1} on {} threads",
        peak.dgemm_one, peak.dgemm_all, peak.threads, peak.sgemm_all, peak.threads
    );
    if let Ok(cases) = std::env::var("FEDWEAVE_BENCH_CASES") {
        let kernels = bench_kernels();
        println!(
            "kernels: {}",
            kernels.device_name().unwrap_or("host (matrixmultiply)")
        );
        println!("| step | N | d | s (best) | GFLOP/s | % of dgemm |");
        println!("|---|---|---|---|---|---|");
        for case in cases.split(',') {
            let (n, d) = case
                .split_once('x')
                .expect("FEDWEAVE_BENCH_CASES looks like 100x44k,1000x582k");
            let n: usize = n.parse().expect("N is a number");
            let large = n >= 1000;
            grid_case(n, d, &peak, &kernels, large);
        }
        return;
    }
    let sizes: Vec<usize> = std::env::var("FEDWEAVE_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![20, 200]);
    let spec = ModelSpec::new(ModelKind::CNN_BN, &[1, 28, 28], 10).expect("cnn-bn spec");
    let init = spec.init(&mut rng_stream(7, 0, 0, Purpose::ModelInit));
    let wire = spec.layout().wire_bytes() as f64;
    println!(
        "cnn-bn 1x28x28: d = {} parameters, {:.2} MB per model",
        init.len(),
        wire / 1e6
    );
    println!(
        "| method | N | server s/round (best) | MB up / client / round | MB down / client / round |"
    );
    println!("|---|---|---|---|---|");
    for &n in &sizes {
        let repeats = if n <= 50 { 5 } else { 2 };
        let fed = Federation::new(&spec, n);
        let env = fed.env(&spec, Kernels::cpu());
        let trained = models(&init, n);
        let rows = [
            (
                "fedavg",
                time_aggregate::<FedAvg>("fedavg", &env, &trained, repeats),
            ),
            (
                "pfedgraph",
                time_aggregate::<PFedGraph>("pfedgraph", &env, &trained, repeats),
            ),
            (
                "feddwa",
                time_aggregate::<FedDwa>("feddwa", &env, &guided(&init, n), repeats),
            ),
            (
                "fedaghn",
                time_aggregate::<FedAghn>("fedaghn", &env, &trained, repeats),
            ),
        ];
        for (method, (secs, down, up)) in rows {
            println!(
                "| {method} | {n} | {secs:.3} | {:.2} | {:.2} |",
                up / 1e6,
                down / 1e6
            );
        }
    }
    sfl_table();
}
