//! A tiny federation for the algorithms' unit tests: an MLP on 4 inputs and
//! 3 separable classes, three clients with 12, 12 and 24 samples, an `Env`
//! over it (with the clients' label counts) and per-client contexts.

use crate::{ClientCx, ClientData, Env};
use fedweave_core::{Purpose, rng_stream};
use fedweave_nn::{LocalData, ModelKind, ModelSpec, TrainConfig};

/// Everything an [`Env`] and a [`ClientCx`] borrow.
pub(crate) struct Tiny {
    pub spec: ModelSpec,
    pub init: Vec<f32>,
    pub train: TrainConfig,
    pub sizes: Vec<usize>,
    label_counts: Vec<Vec<usize>>,
    features: Vec<f32>,
    labels: Vec<u32>,
    indices: Vec<Vec<usize>>,
}

impl Tiny {
    pub(crate) fn new() -> Self {
        Self::with_spec(ModelSpec::new(ModelKind::MLP, &[4], 3).unwrap())
    }

    /// The federation with a `sequential` model: linear 16, ReLU,
    /// dropout, linear 16, ReLU, linear head.
    pub(crate) fn sequential() -> Self {
        use fedweave_nn::{LayerConfig, ModelInput, SequentialConfig, Width};
        let linear = |o: Option<usize>| LayerConfig::Linear {
            in_features: None,
            out_features: o.map(Width::Count),
            bias: true,
        };
        let layers = vec![
            linear(Some(16)),
            LayerConfig::Relu {},
            LayerConfig::Dropout { p: 0.1 },
            linear(Some(16)),
            LayerConfig::Relu {},
            linear(None),
        ];
        let input = ModelInput {
            sequential: Some(SequentialConfig { layers, head: None }),
            ..Default::default()
        };
        Self::with_spec(ModelSpec::with_input(ModelKind::SEQUENTIAL, &[4], 3, &input).unwrap())
    }

    /// The federation with another model of 4 inputs and 3 classes.
    pub(crate) fn with_spec(spec: ModelSpec) -> Self {
        let init = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        let n = 48;
        // Separable: the class sets which feature is large.
        let labels: Vec<u32> = (0..n).map(|k| (k % 3) as u32).collect();
        let features = (0..n * 4)
            .map(|e| {
                let (k, f) = (e / 4, e % 4);
                let jitter = ((e * 7919) % 13) as f32 / 13.0 - 0.5;
                if f == k % 3 { 2.0 + jitter } else { jitter }
            })
            .collect();
        let indices: Vec<Vec<usize>> =
            vec![(0..12).collect(), (12..24).collect(), (24..48).collect()];
        let label_counts = indices
            .iter()
            .map(|idx| {
                let mut c = vec![0; 3];
                idx.iter().for_each(|&k| c[labels[k] as usize] += 1);
                c
            })
            .collect();
        Self {
            spec,
            init,
            train: TrainConfig {
                lr: 0.1,
                momentum: 0.9,
                weight_decay: 1e-3,
                batch_size: 4,
                iterations: 3,
                epochs: 1,
            },
            sizes: vec![12, 12, 24],
            label_counts,
            features,
            labels,
            indices,
        }
    }

    pub(crate) fn env(&self) -> Env<'_> {
        Env {
            spec: &self.spec,
            train: &self.train,
            sizes: &self.sizes,
            init: &self.init,
            relation: None,
            label_counts: &self.label_counts,
            kernels: fedweave_core::pairwise::Kernels::cpu(),
        }
    }

    pub(crate) fn cx(&self, client: usize, round: usize) -> ClientCx<'_> {
        let data = LocalData::new(&self.features, &self.labels, &self.indices[client]);
        ClientCx {
            client,
            round,
            data: ClientData {
                train: data,
                val: data,
            },
            rng: rng_stream(9, round as u64, client as u64, Purpose::Batches),
            origin: None,
            batch: None,
        }
    }
}

/// Elements of `a` and `b` that differ inside `r`.
pub(crate) fn changed(a: &[f32], b: &[f32], r: std::ops::Range<usize>) -> usize {
    a[r.clone()]
        .iter()
        .zip(&b[r])
        .filter(|(x, y)| x != y)
        .count()
}
