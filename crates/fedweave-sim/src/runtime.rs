//! The steps of a round that every runtime calls, whatever carries the
//! messages: the simulator's engine (memory), and the network runtime
//! (`fedweave-net`: gRPC server and clients, gRPC peers). The client side
//! derives its shard from the config exactly as the simulator does
//! ([`Derived`]); the server side learns the federation from the clients'
//! hellos ([`Blueprint`]); both call the same training, screening,
//! aggregation, scoring and bookkeeping functions, so a networked run is
//! bit-identical to a simulated one by construction.

use crate::config::{ExperimentConfig, ServerKernels};
use crate::engine::RunError;
use crate::setup::Setup;
use fedweave_algos::{Algorithm, ClientCx, ClientData, Env};
use fedweave_core::pairwise::Kernels;
use fedweave_core::{Purpose, rng_stream};
use fedweave_data::{ClientLabelCounts, PartitionReport};
use fedweave_nn::{LocalData, ModelSpec, TrainConfig};
use serde::{Deserialize, Serialize};

pub use crate::engine::{RunDir, checkpoint_due, resolve_config};
pub use crate::protocol::{Facts, Score, TestMetrics, Trackers};
pub use crate::round::{
    RoundBooks, RunState, Scores, Screened, Upload, choose_participants, close_round, screen,
    server_outcome, train_client, wants_origins,
};

/// What a client tells the server about itself when it joins: sizes and
/// shapes, never data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClientInfo {
    /// Its training share n_i (train + validation).
    pub size: usize,
    /// Its test-set size.
    pub test_size: usize,
    /// Its samples per class in train, validation and test (oracle graphs
    /// read the training counts; the server writes them to
    /// `partition.json`).
    pub counts: ClientLabelCounts,
    /// The dataset's number of classes.
    pub num_classes: usize,
    /// The dataset's name.
    pub dataset: String,
    /// The input shape of one sample.
    pub feature_shape: Vec<usize>,
    /// The model's output width.
    pub outputs: usize,
    /// Regression or forecasting.
    pub regression: bool,
}

/// The federation as a client machine derives it from the config: the same
/// dataset, partition, model and seed as the simulator, of which a client
/// reads only its own shard.
pub struct Derived {
    setup: Setup,
}

impl Derived {
    /// Derives the federation of `cfg`.
    pub fn load(cfg: &ExperimentConfig) -> Result<Self, RunError> {
        Ok(Self {
            setup: Setup::load(cfg)?,
        })
    }

    /// Derives the federation of `cfg` on a machine holding only the
    /// `hosted` clients' data: with per-client files (`data.dataset =
    /// "csv"`) only theirs are read; the other clients' data is never
    /// needed there.
    pub fn load_hosted(cfg: &ExperimentConfig, hosted: &[usize]) -> Result<Self, RunError> {
        Ok(Self {
            setup: Setup::load_hosted(cfg, Some(hosted))?,
        })
    }

    /// The resolved configuration.
    pub fn cfg(&self) -> &ExperimentConfig {
        &self.setup.cfg
    }

    /// What the algorithm may read.
    pub fn env(&self) -> Env<'_> {
        self.setup.env()
    }

    /// What client `i` may read when it trains: [`Self::env`] with its own
    /// training settings (its step count under `train.local_iterations =
    /// [lo, hi]`).
    pub fn client_env(&self, i: usize) -> Env<'_> {
        self.setup.client_env(i)
    }

    /// Client `i`'s training and validation data.
    pub fn data(&self, i: usize) -> ClientData<'_> {
        self.setup.client_data(i)
    }

    /// Whether client `i` is scored (benign).
    pub fn is_benign(&self, i: usize) -> bool {
        !self.setup.is_malicious[i]
    }

    /// The books' facts (a simulation knows them all).
    pub fn facts(&self) -> Facts {
        self.setup.facts()
    }

    /// What client `i` tells the server when it joins.
    pub fn info(&self, i: usize) -> ClientInfo {
        let s = &self.setup;
        ClientInfo {
            size: s.sizes[i],
            test_size: s.test_data(i).len(),
            counts: s.report.clients[i].clone(),
            num_classes: s.report.num_classes,
            dataset: s.dataset.name.clone(),
            feature_shape: s.dataset.feature_shape.clone(),
            outputs: s.spec.num_classes(),
            regression: s.regression,
        }
    }

    /// Scores client `i`'s personalised model on its own validation and
    /// test data.
    pub fn score<A: Algorithm>(&self, algo: &A, i: usize, state: &A::Client) -> Score {
        let env = self.env();
        crate::protocol::score_client(algo, &env, state, &self.data(i), &self.test(i))
    }

    fn test(&self, i: usize) -> LocalData<'_> {
        self.setup.test_data(i)
    }

    /// Client `i`'s context for its peer step in round `round`.
    pub fn selection_cx(&self, i: usize, round: usize) -> ClientCx<'_> {
        selection_cx(self.data(i), self.setup.cfg.seed, round, i)
    }
}

/// A peer's context for choosing collaborators: its own keyed stream.
pub(crate) fn selection_cx(data: ClientData, seed: u64, round: usize, i: usize) -> ClientCx {
    ClientCx {
        client: i,
        round,
        data,
        rng: rng_stream(seed, round as u64, i as u64, Purpose::Selection),
        origin: None,
        batch: None,
    }
}

/// The common round-0 model of a federation.
pub(crate) fn initial_model(spec: &ModelSpec, seed: u64) -> Vec<f32> {
    spec.init(&mut rng_stream(seed, 0, u64::MAX, Purpose::ModelInit))
}

/// What a server knows: the config and the clients' hellos. No data.
pub struct Blueprint {
    spec: ModelSpec,
    train: TrainConfig,
    init: Vec<f32>,
    sizes: Vec<usize>,
    label_counts: Vec<Vec<usize>>,
    partition: PartitionReport,
    facts: Facts,
    /// Where the server's pairwise products run (`[device] server_kernels`).
    kernels: Kernels,
}

impl Blueprint {
    /// Builds the server's view from `cfg` and every client's hello (in
    /// client order); clients that disagree on the dataset or shapes are
    /// an error.
    pub fn new(cfg: &ExperimentConfig, infos: &[ClientInfo]) -> Result<Self, RunError> {
        let first = infos.first().ok_or_else(|| {
            RunError::Config(crate::config::key_err("clients", "no client joined"))
        })?;
        if let Some((i, _)) = infos.iter().enumerate().find(|(_, c)| {
            (&c.dataset, &c.feature_shape, c.outputs, c.regression)
                != (
                    &first.dataset,
                    &first.feature_shape,
                    first.outputs,
                    first.regression,
                )
        }) {
            return Err(RunError::Config(crate::config::key_err(
                "data",
                format!("client {i} reports another dataset or shape than client 0"),
            )));
        }
        let spec = ModelSpec::new(cfg.model.kind, &first.feature_shape, first.outputs)?;
        let mut cfg = cfg.clone();
        cfg.threads = Some(cfg.threads.unwrap_or(1));
        let init = initial_model(&spec, cfg.seed);
        Ok(Self {
            kernels: ServerKernels::build(&cfg.device)?,
            train: cfg.train.to_train_config(),
            sizes: infos.iter().map(|c| c.size).collect(),
            label_counts: infos.iter().map(|c| c.counts.train.clone()).collect(),
            partition: PartitionReport {
                num_classes: first.num_classes,
                clients: infos.iter().map(|c| c.counts.clone()).collect(),
            },
            facts: Facts {
                dataset: first.dataset.clone(),
                model_parameters: init.len(),
                malicious: Vec::new(),
                benign: (0..infos.len()).collect(),
                test_sizes: infos.iter().map(|c| c.test_size).collect(),
                regression: first.regression,
                threads: cfg.threads.unwrap_or(1),
                cfg,
            },
            init,
            spec,
        })
    }

    /// `partition.json` as the clients reported it: the same file as
    /// `fedweave run` writes.
    pub fn partition_json(&self) -> String {
        serde_json::to_string(&self.partition).unwrap_or_default()
    }

    /// What the algorithm may read on the server.
    pub fn env(&self) -> Env<'_> {
        Env {
            spec: &self.spec,
            train: &self.train,
            sizes: &self.sizes,
            init: &self.init,
            relation: None,
            label_counts: &self.label_counts,
            kernels: &self.kernels,
        }
    }

    /// The books' facts.
    pub fn facts(&self) -> &Facts {
        &self.facts
    }
}
