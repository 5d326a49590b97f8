//! Many clients at once on the CPU: K clients' local steps as one batched
//! pass (`train_local_batched`) against K `train_local` calls one after
//! another, both on one thread (burn-flex runs each kernel on the calling
//! thread).
//!
//! Each client has 640 random samples and takes `STEPS` steps of batch 64
//! (momentum 0.9, wd 1e-5). Reported: client-steps per second and samples
//! per second, sequential and batched, and their ratio, for `mlp`, `cnn`,
//! `cnn-bn` and FedDWA's ResNet-8 (3×32×32) at K = 1, 10 and 100 (the
//! batched ResNet-8 at K = 100 holds a few GB of activations).
//!
//! Run: `cargo bench -p fedweave-nn --bench batched`
//! (`FEDWEAVE_BENCH_K=1,10` to choose K).

use fedweave_nn::throughput::{CLASSES, SyntheticData, Workload};
use fedweave_nn::{ModelKind, ModelSpec};

const BATCH: usize = 64;

/// Seconds for K clients × `steps` steps: one after another on one thread,
/// and batched.
fn time_case(spec: &ModelSpec, k: usize, steps: usize) -> (f64, f64) {
    let data = SyntheticData::new(spec.input_len(), k.min(10), 0);
    let work = Workload {
        spec,
        data: &data,
        k,
        batch: BATCH,
    };
    let one_thread = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a thread pool");
    let sequential = work.time_one_by_one(steps, &one_thread);
    let batched = work.time_batched(steps).expect("batched model");
    (sequential.seconds, batched.seconds)
}

fn main() {
    let ks: Vec<usize> = std::env::var("FEDWEAVE_BENCH_K")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 10, 100]);
    println!(
        "| model | K | steps/client | sequential client-steps/s | batched client-steps/s | sequential samples/s | batched samples/s | batched / sequential |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, kind, shape, steps) in [
        ("mlp 1x28x28", ModelKind::MLP, [1, 28, 28], 20),
        ("cnn 1x28x28", ModelKind::CNN, [1, 28, 28], 5),
        ("cnn-bn 1x28x28", ModelKind::CNN_BN, [1, 28, 28], 3),
        ("resnet8 3x32x32", ModelKind::RESNET8, [3, 32, 32], 2),
    ] {
        let spec = ModelSpec::new(kind, &shape, CLASSES).expect("spec");
        for &k in &ks {
            let (seq, bat) = time_case(&spec, k, steps);
            let client_steps = (k * steps) as f64;
            let rate = |s: f64| client_steps / s;
            println!(
                "| {name} | {k} | {steps} | {:.1} | {:.1} | {:.0} | {:.0} | {:.2}× |",
                rate(seq),
                rate(bat),
                rate(seq) * BATCH as f64,
                rate(bat) * BATCH as f64,
                seq / bat,
            );
        }
    }
}
