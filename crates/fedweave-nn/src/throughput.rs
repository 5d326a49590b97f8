//! How fast this machine trains: client-steps per second of one model, for K
//! clients trained one after another (spread over a thread pool, as the
//! simulator spreads them) or in one batched pass ([`train_local_batched`]).
//! `fedweave bench` and the `batched` bench both measure with it, so a user's
//! figure and the project's compare.
//!
//! Every client holds [`SAMPLES_PER_CLIENT`] random samples and ten random
//! labels; the steps are momentum-SGD steps (momentum 0.9, weight decay 1e-5)
//! of `batch` samples. A first step of every path runs untimed: it pays for
//! allocation, autotuning and (on a GPU) kernel compilation.

use crate::{BatchedClient, LocalData, ModelKind, ModelSpec, NnError, TrainConfig, train_local};
use crate::{train_local_batched, train_local_with};
use fedweave_core::RngStream;
use fedweave_core::{Purpose, rng_stream};
use rand::Rng;
use rayon::prelude::*;
use std::time::Instant;

/// Random samples each synthetic client holds (ten batches of 64).
pub const SAMPLES_PER_CLIENT: usize = 640;

/// Classes of the synthetic labels.
pub const CLASSES: usize = 10;

/// The input each image model is benchmarked on: the dataset the seeds train
/// it on (Fashion-MNIST's 1×28×28 or CIFAR's 3×32×32). `None` for models
/// whose inputs are not images (sequences, tokens, ids).
pub fn bench_input(kind: ModelKind) -> Option<[usize; 3]> {
    match kind {
        ModelKind::MLP | ModelKind::CNN | ModelKind::CNN_BN => Some([1, 28, 28]),
        ModelKind::CNN_DWA | ModelKind::RESNET8 | ModelKind::RESNET9 | ModelKind::RESNET18 => {
            Some([3, 32, 32])
        }
        // Sequences, tokens, ids, and layer lists of the user's own.
        _ => None,
    }
}

/// Synthetic clients' data as a simulated split holds it: one table of
/// random samples, each client an index range of [`SAMPLES_PER_CLIENT`]
/// rows (so the batched trainer can keep the table on a GPU, as in a run).
pub struct SyntheticData {
    x: Vec<f32>,
    y: Vec<u32>,
    idx: Vec<usize>,
    clients: usize,
}

impl SyntheticData {
    /// `clients` (at least 1) × [`SAMPLES_PER_CLIENT`] uniform samples of
    /// `input_len` values and uniform labels, from `seed`.
    pub fn new(input_len: usize, clients: usize, seed: u64) -> Self {
        let mut rng = rng_stream(seed, 0, 0, Purpose::Dataset);
        let clients = clients.max(1);
        let rows = clients * SAMPLES_PER_CLIENT;
        Self {
            x: (0..rows * input_len).map(|_| rng.random::<f32>()).collect(),
            y: (0..rows)
                .map(|_| rng.random_range(0..CLASSES as u32))
                .collect(),
            idx: (0..rows).collect(),
            clients,
        }
    }

    /// Client `c`'s data as a trainer reads it (clients beyond the table's
    /// share its ranges round-robin, which keeps memory flat at K = 100).
    pub fn view(&self, c: usize) -> LocalData<'_> {
        let c = c % self.clients;
        let idx = &self.idx[c * SAMPLES_PER_CLIENT..(c + 1) * SAMPLES_PER_CLIENT];
        LocalData::new(&self.x, &self.y, idx)
    }
}

/// What one timed pass did: its seconds and the client-steps the trainers
/// report having taken (the rate's numerator is counted, not assumed).
#[derive(Clone, Copy, Debug)]
pub struct Timed {
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Steps taken, summed over clients.
    pub client_steps: usize,
}

impl Timed {
    /// Client-steps per second.
    pub fn steps_per_s(&self) -> f64 {
        self.client_steps as f64 / self.seconds
    }
}

/// A training workload: K clients of one model, each taking `steps` steps.
pub struct Workload<'a> {
    /// The model (and, through [`ModelSpec::on`], the device).
    pub spec: &'a ModelSpec,
    /// Clients' data.
    pub data: &'a SyntheticData,
    /// Number of clients.
    pub k: usize,
    /// Samples per step.
    pub batch: usize,
}

impl Workload<'_> {
    fn config(&self, steps: usize) -> TrainConfig {
        TrainConfig {
            lr: 0.01,
            momentum: 0.9,
            weight_decay: 1e-5,
            batch_size: self.batch,
            iterations: steps,
            epochs: 0,
        }
    }

    fn rng(c: usize) -> RngStream {
        rng_stream(3, c as u64, 0, Purpose::Batches)
    }

    /// The K clients taking `steps` steps each, one client per `train_local`
    /// call, the calls spread over `pool` (one warm-up step first, untimed).
    pub fn time_one_by_one(&self, steps: usize, pool: &rayon::ThreadPool) -> Timed {
        let init = self.spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        let run = |steps: usize| {
            let cfg = self.config(steps);
            pool.install(|| {
                (0..self.k)
                    .into_par_iter()
                    .map(|c| {
                        let mut params = init.clone();
                        let mut buffers = self.spec.init_buffers();
                        let data = self.data.view(c);
                        train_local(
                            self.spec,
                            &mut params,
                            &mut buffers,
                            &data,
                            &cfg,
                            &[],
                            &[],
                            None,
                            &mut Self::rng(c),
                        )
                        .steps
                    })
                    .sum()
            })
        };
        warm_up(self.spec, &init, &self.data.view(0), &self.config(1));
        let start = Instant::now();
        let client_steps = run(steps);
        Timed {
            seconds: start.elapsed().as_secs_f64(),
            client_steps,
        }
    }

    /// The K clients taking `steps` steps each in one [`train_local_batched`]
    /// pass (one warm-up pass of one step first).
    ///
    /// # Errors
    ///
    /// When the model has no batched form on this device.
    pub fn time_batched(&self, steps: usize) -> Result<Timed, NnError> {
        let init = self.spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        let run = |steps: usize| -> Result<Timed, NnError> {
            let mut params = vec![init.clone(); self.k];
            let mut buffers = vec![self.spec.init_buffers(); self.k];
            let mut rngs: Vec<RngStream> = (0..self.k).map(Self::rng).collect();
            let mut clients: Vec<BatchedClient<RngStream>> = params
                .iter_mut()
                .zip(buffers.iter_mut())
                .zip(rngs.iter_mut())
                .enumerate()
                .map(|(c, ((params, buffers), rng))| BatchedClient {
                    params,
                    buffers,
                    data: self.data.view(c),
                    rng,
                })
                .collect();
            let start = Instant::now();
            let stats = train_local_batched(
                self.spec,
                self.spec.device(),
                &mut clients,
                &self.config(steps),
            )?;
            Ok(Timed {
                seconds: start.elapsed().as_secs_f64(),
                client_steps: stats.iter().map(|s| s.steps).sum(),
            })
        };
        run(1)?;
        run(steps)
    }
}

/// One untimed step of one client.
fn warm_up(spec: &ModelSpec, init: &[f32], data: &LocalData, cfg: &TrainConfig) {
    let mut params = init.to_vec();
    let mut buffers = spec.init_buffers();
    train_local_with(
        spec,
        &mut params,
        &mut buffers,
        data,
        cfg,
        &[],
        &[],
        None,
        &mut Workload::rng(0),
        None,
    );
}

/// Steps per client so that K clients take about `seconds`, from the time of
/// `probe_steps` timed steps of one client: at least 2, at most 100,000.
pub fn steps_for(seconds: f64, probe_seconds: f64, probe_steps: usize, k: usize) -> usize {
    let per_step = (probe_seconds / probe_steps.max(1) as f64).max(1e-6);
    ((seconds / (per_step * k.max(1) as f64)).ceil() as usize).clamp(2, 100_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_image_model_builds_on_its_bench_input() {
        for kind in [
            ModelKind::MLP,
            ModelKind::CNN,
            ModelKind::CNN_BN,
            ModelKind::CNN_DWA,
            ModelKind::RESNET8,
            ModelKind::RESNET9,
            ModelKind::RESNET18,
        ] {
            let shape = bench_input(kind).expect("an image model");
            ModelSpec::new(kind, &shape, CLASSES).expect("builds on its bench input");
        }
        assert_eq!(bench_input(ModelKind::GRU), None);
    }

    #[test]
    fn steps_fill_the_asked_time_within_bounds() {
        // 10 ms a step, 4 clients, 2 s: 50 steps each.
        assert_eq!(steps_for(2.0, 0.02, 2, 4), 50);
        assert_eq!(steps_for(0.0, 1.0, 1, 1), 2);
        assert_eq!(steps_for(1e9, 0.0, 1, 1), 100_000);
    }

    #[test]
    fn both_paths_count_k_times_steps_client_steps() {
        let spec = ModelSpec::new(ModelKind::MLP, &[4], CLASSES).expect("mlp");
        let data = SyntheticData::new(4, 2, 0);
        let w = Workload {
            spec: &spec,
            data: &data,
            k: 3,
            batch: 8,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("pool");
        let one = w.time_one_by_one(5, &pool);
        let batched = w.time_batched(5).expect("the mlp is batched");
        assert_eq!(one.client_steps, 15);
        assert_eq!(batched.client_steps, 15);
        assert!(one.seconds > 0.0 && batched.seconds > 0.0);
    }
}
