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

use fedweave_core::{Purpose, rng_stream};
use fedweave_nn::{
    BatchedClient, Device, LocalData, ModelKind, ModelSpec, TrainConfig, train_local,
    train_local_batched,
};
use rand::Rng;
use std::time::Instant;

const BATCH: usize = 64;
const SAMPLES: usize = 10 * BATCH;
const CLASSES: usize = 10;

struct Data {
    x: Vec<f32>,
    y: Vec<u32>,
    idx: Vec<usize>,
}

impl Data {
    fn new(input_len: usize, seed: u64) -> Self {
        let mut rng = rng_stream(seed, 0, 0, Purpose::Dataset);
        Self {
            x: (0..SAMPLES * input_len)
                .map(|_| rng.random::<f32>())
                .collect(),
            y: (0..SAMPLES)
                .map(|_| rng.random_range(0..CLASSES as u32))
                .collect(),
            idx: (0..SAMPLES).collect(),
        }
    }
    fn view(&self) -> LocalData<'_> {
        LocalData::new(&self.x, &self.y, &self.idx)
    }
}

/// Seconds for K clients × `steps` steps: (sequential, batched when the
/// model has a batched form).
/// Seconds for K clients one after another, and batched.
fn time_case(spec: &ModelSpec, k: usize, steps: usize) -> (f64, f64) {
    let cfg = TrainConfig {
        lr: 0.01,
        momentum: 0.9,
        weight_decay: 1e-5,
        batch_size: BATCH,
        iterations: steps,
        epochs: 0,
    };
    // Ten distinct datasets shared round-robin keep memory flat at K = 100.
    let data: Vec<Data> = (0..k.min(10))
        .map(|c| Data::new(spec.input_len(), c as u64))
        .collect();
    let init = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
    let rng = |c: usize| rng_stream(3, c as u64, 0, Purpose::Batches);

    let mut params = vec![init.clone(); k];
    let mut buffers = vec![spec.init_buffers(); k];
    let start = Instant::now();
    for c in 0..k {
        train_local(
            spec,
            &mut params[c],
            &mut buffers[c],
            &data[c % data.len()].view(),
            &cfg,
            &[],
            &[],
            None,
            &mut rng(c),
        );
    }
    let sequential = start.elapsed().as_secs_f64();

    let mut params = vec![init; k];
    let mut buffers = vec![spec.init_buffers(); k];
    let mut rngs: Vec<_> = (0..k).map(rng).collect();
    let mut clients: Vec<BatchedClient<_>> = params
        .iter_mut()
        .zip(buffers.iter_mut())
        .zip(rngs.iter_mut())
        .enumerate()
        .map(|(c, ((params, buffers), rng))| BatchedClient {
            params,
            buffers,
            data: data[c % data.len()].view(),
            rng,
        })
        .collect();
    let start = Instant::now();
    train_local_batched(spec, &Device::flex(), &mut clients, &cfg).expect("batched model");
    (sequential, start.elapsed().as_secs_f64())
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
        ("mlp 1x28x28", ModelKind::Mlp, [1, 28, 28], 20),
        ("cnn 1x28x28", ModelKind::Cnn, [1, 28, 28], 5),
        ("cnn-bn 1x28x28", ModelKind::CnnBn, [1, 28, 28], 3),
        ("resnet8 3x32x32", ModelKind::ResNet8, [3, 32, 32], 2),
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
