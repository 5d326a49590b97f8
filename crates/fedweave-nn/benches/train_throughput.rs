//! Local-training throughput (samples/s) of `train_local` on random data.
//!
//! Group `train_local`: one client, one thread, for the three model shapes
//! the experiments use (cnn on Fashion-MNIST 1×28×28, cnn/LeNet on CIFAR
//! 3×32×32, mlp on 1×28×28), batch 64, lr 0.01, momentum 0.9, wd 1e-5.
//!
//! Group `concurrent_clients`: two clients (each with its own parameters)
//! train at once in a rayon pool of 1 or 2 threads; the total throughput
//! shows whether the backend lets clients train in parallel or serialises
//! them.
//!
//! Run: `cargo bench -p fedweave-nn --bench train_throughput`.

use criterion::{
    BenchmarkId, Criterion, SamplingMode, Throughput, criterion_group, criterion_main,
};
use fedweave_core::{Purpose, rng_stream};
use fedweave_nn::{LocalData, ModelKind, ModelSpec, TrainConfig, train_local};
use rand::Rng;
use rayon::prelude::*;
use std::hint::black_box;
use std::time::Duration;

const BATCH: usize = 64;
const CLASSES: usize = 10;
/// Samples per client: 10 full batches, so every step is a full batch.
const LOCAL_SAMPLES: usize = 10 * BATCH;

/// Random features in [0, 1) and labels, `n` samples of `input_len` each.
struct RandomData {
    features: Vec<f32>,
    labels: Vec<u32>,
    indices: Vec<usize>,
}

impl RandomData {
    fn new(n: usize, input_len: usize, seed: u64) -> Self {
        let mut rng = rng_stream(seed, 0, 0, Purpose::Dataset);
        let features = (0..n * input_len).map(|_| rng.random::<f32>()).collect();
        let labels = (0..n)
            .map(|_| rng.random_range(0..CLASSES as u32))
            .collect();
        Self {
            features,
            labels,
            indices: (0..n).collect(),
        }
    }

    fn view(&self) -> LocalData<'_> {
        LocalData::new(&self.features, &self.labels, &self.indices)
    }
}

fn config(steps: usize) -> TrainConfig {
    TrainConfig {
        lr: 0.01,
        momentum: 0.9,
        weight_decay: 1e-5,
        batch_size: BATCH,
        iterations: steps,
        epochs: 0,
    }
}

fn models() -> Vec<(&'static str, ModelSpec)> {
    vec![
        (
            "cnn_1x28x28",
            ModelSpec::new(ModelKind::CNN, &[1, 28, 28], CLASSES).unwrap(),
        ),
        (
            "lenet_3x32x32",
            ModelSpec::new(ModelKind::CNN, &[3, 32, 32], CLASSES).unwrap(),
        ),
        (
            "cnn_bn_1x28x28",
            ModelSpec::new(ModelKind::CNN_BN, &[1, 28, 28], CLASSES).unwrap(),
        ),
        (
            "mlp_1x28x28",
            ModelSpec::new(ModelKind::MLP, &[1, 28, 28], CLASSES).unwrap(),
        ),
    ]
}

/// One client, 10 steps of 64 samples per iteration.
fn single_client(c: &mut Criterion) {
    const STEPS: usize = 10;
    let mut group = c.benchmark_group("train_local");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .sampling_mode(SamplingMode::Flat)
        .throughput(Throughput::Elements((STEPS * BATCH) as u64));
    let cfg = config(STEPS);
    for (name, spec) in models() {
        let data = RandomData::new(LOCAL_SAMPLES, spec.input_len(), 1);
        let init = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        let mut rng = rng_stream(1, 1, 0, Purpose::Batches);
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
            b.iter(|| {
                let mut params = init.clone();
                let stats = train_local(
                    &spec,
                    &mut params,
                    &mut spec.init_buffers(),
                    &data.view(),
                    &cfg,
                    &[],
                    &[],
                    None,
                    &mut rng,
                );
                black_box((params, stats))
            })
        });
    }
    group.finish();
}

/// Two clients × 25 steps per iteration in a pool of 1 or 2 threads.
fn concurrent_clients(c: &mut Criterion) {
    const CLIENTS: usize = 2;
    const STEPS: usize = 25;
    let mut group = c.benchmark_group("concurrent_clients");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .sampling_mode(SamplingMode::Flat)
        .throughput(Throughput::Elements((CLIENTS * STEPS * BATCH) as u64));
    let cfg = config(STEPS);
    for (name, spec) in models() {
        let data: Vec<RandomData> = (0..CLIENTS)
            .map(|k| RandomData::new(LOCAL_SAMPLES, spec.input_len(), 10 + k as u64))
            .collect();
        let init = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        for threads in [1, 2] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let id = BenchmarkId::new(name, format!("{threads}_workers"));
            group.bench_function(id, |b| {
                b.iter(|| {
                    pool.install(|| {
                        (0..CLIENTS)
                            .into_par_iter()
                            .map(|k| {
                                let mut params = init.clone();
                                let mut rng = rng_stream(1, 1, k as u64, Purpose::Batches);
                                let stats = train_local(
                                    &spec,
                                    &mut params,
                                    &mut spec.init_buffers(),
                                    &data[k].view(),
                                    &cfg,
                                    &[],
                                    &[],
                                    None,
                                    &mut rng,
                                );
                                black_box((params, stats)).1.samples
                            })
                            .sum::<usize>()
                    })
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, single_client, concurrent_clients);
criterion_main!(benches);
