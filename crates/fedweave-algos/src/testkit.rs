//! A tiny federation for the algorithms' unit tests: an MLP on random
//! 4-feature, 2-class data, an `Env` over it and per-client contexts.

use crate::{ClientCx, ClientData, Env};
use fedweave_core::{Purpose, rng_stream};
use fedweave_nn::{LocalData, ModelKind, ModelSpec, TrainConfig};
use rand::Rng;

/// Samples per client.
pub(crate) const SAMPLES: usize = 16;

/// Model, training settings and every client's data.
pub(crate) struct Fixture {
    pub spec: ModelSpec,
    pub train: TrainConfig,
    pub sizes: Vec<usize>,
    pub init: Vec<f32>,
    x: Vec<f32>,
    y: Vec<u32>,
    idx: Vec<Vec<usize>>,
}

impl Fixture {
    /// `clients` clients of [`SAMPLES`] samples each, trained with `lr`
    /// (0 leaves every model where it started), plain SGD, batch 8, one
    /// step per round.
    pub fn new(clients: usize, lr: f32) -> Self {
        let spec = ModelSpec::new(ModelKind::Mlp, &[4], 2).expect("valid model");
        let init = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        let mut rng = rng_stream(7, 0, 0, Purpose::Dataset);
        let n = clients * SAMPLES;
        Self {
            spec,
            train: TrainConfig {
                lr,
                momentum: 0.0,
                weight_decay: 0.0,
                batch_size: 8,
                iterations: 1,
                epochs: 0,
            },
            sizes: vec![SAMPLES; clients],
            init,
            x: (0..n * 4).map(|_| rng.random_range(-1.0..1.0)).collect(),
            y: (0..n).map(|k| (k % 2) as u32).collect(),
            idx: (0..clients)
                .map(|i| (i * SAMPLES..(i + 1) * SAMPLES).collect())
                .collect(),
        }
    }

    /// The federation as algorithms see it.
    pub fn env(&self) -> Env<'_> {
        Env {
            spec: &self.spec,
            train: &self.train,
            sizes: &self.sizes,
            init: &self.init,
            relation: None,
            label_counts: &[],
        }
    }

    /// Client `client`'s data (validation = training samples).
    pub fn data(&self, client: usize) -> LocalData<'_> {
        LocalData::new(&self.x, &self.y, &self.idx[client])
    }

    /// Client `client`'s context in `round`.
    pub fn cx(&self, client: usize, round: usize) -> ClientCx<'_> {
        ClientCx {
            client,
            round,
            data: ClientData {
                train: self.data(client),
                val: self.data(client),
            },
            rng: rng_stream(3, round as u64, client as u64, Purpose::Batches),
            origin: None,
        }
    }
}
