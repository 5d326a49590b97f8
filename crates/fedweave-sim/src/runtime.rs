//! The steps of a round that every runtime calls, whatever carries the
//! messages: the simulator's engine (memory), and the network runtime
//! (`fedweave-net`: gRPC server and clients, gRPC peers). The client side
//! derives its shard from the config exactly as the simulator does
//! ([`Derived`]); the server side learns the federation from the clients'
//! hellos ([`Blueprint`]); both call the same training, screening,
//! aggregation, scoring and bookkeeping functions, so a networked run is
//! bit-identical to a simulated one by construction.

use crate::config::ExperimentConfig;
use crate::engine::RunError;
use crate::setup::Setup;
use fedweave_algos::{Algorithm, ClientCx, ClientData, Env};
use fedweave_core::{Purpose, rng_stream};
use fedweave_data::{ClientLabelCounts, PartitionReport};
use fedweave_nn::{LocalData, ModelSpec};
use serde::{Deserialize, Serialize};

pub use crate::checks::{
    DEFAULT_MAX_CLIENT_SAMPLES, admit_download, check_hello, check_loss, check_origin, check_score,
};
pub use crate::driver::{
    Clients, Exchange, HostedPeers, PeerOutcome, StepFn, TrainAsk, TrainReply, server_round,
};
pub use crate::engine::{RunDir, checkpoint_due, resolve_config};
pub use crate::protocol::{Facts, Score, TestMetrics, Trackers};
pub use crate::round::{
    RoundBooks, RunState, Scores, Screened, Upload, choose_participants, close_round, screen,
    server_outcome, track, train_client, wants_origins,
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
        info_of(&self.setup, i)
    }

    /// Scores client `i`'s personalised model on its own validation and
    /// test data.
    pub fn score<A: Algorithm>(&self, algo: &A, i: usize, state: &A::Client) -> Score {
        let env = self.env();
        crate::protocol::score_client(algo, &env, state, &self.data(i), &self.test_data(i))
    }

    /// Client `i`'s test data.
    pub fn test_data(&self, i: usize) -> LocalData<'_> {
        self.setup.test_data(i)
    }

    /// Runs round `round` of a peer-to-peer method for the clients
    /// `peers` hosts, exactly as the simulator runs it for all of them.
    pub fn peer_round<A: Algorithm, P: HostedPeers<A>>(
        &self,
        algo: &A,
        round: usize,
        peers: &mut P,
    ) -> PeerOutcome {
        crate::driver::peer_round(algo, &self.setup, round, peers)
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

/// What a server knows: its own config, from which it derives every
/// client's dataset, shapes and (for every partition it can derive) data
/// sizes, and the hellos of the clients whose data only they hold
/// (`data.dataset = "csv"`: sizes checked and bounded, then taken as
/// claimed). A hello is checked against it when the client joins
/// ([`Blueprint::check_hello`]), so one misconfigured or hostile client is
/// refused alone and the run goes on.
pub struct Blueprint {
    setup: Setup,
    /// Each client's hello as the server derives it (shape fields only for
    /// remote clients).
    expected: Vec<ClientInfo>,
    /// Whether the server derived client i's data (else only it knows).
    derived: Vec<bool>,
    sizes: Vec<usize>,
    label_counts: Vec<Vec<usize>>,
    partition: PartitionReport,
    test_sizes: Vec<usize>,
    facts: Facts,
}

impl Blueprint {
    /// Derives the federation of `cfg` on the server: the dataset is read
    /// as for a simulation, except per-client files (`csv`), which stay on
    /// the clients' machines (their sizes come from the hellos). `threads`
    /// in the books default to 1 (the server trains nothing).
    pub fn derive(cfg: &ExperimentConfig) -> Result<Self, RunError> {
        let client_files =
            fedweave_data::dataset(&cfg.data.dataset).is_some_and(|d| d.client_files);
        if client_files && cfg.data.shape.is_none() {
            return Err(RunError::Config(crate::config::key_err(
                "data.shape",
                "a server of per-client files (data.dataset = \"csv\") needs data.shape: it checks every client's samples against it",
            )));
        }
        let mut setup = Setup::load_hosted(cfg, Some(&[]))?;
        setup.cfg.threads = Some(cfg.threads.unwrap_or(1));
        let n = setup.cfg.clients;
        let derived: Vec<bool> = (0..n).map(|i| !setup.is_remote(i)).collect();
        let expected = (0..n).map(|i| info_of(&setup, i)).collect();
        let facts = Facts {
            malicious: Vec::new(),
            benign: (0..n).collect(),
            threads: setup.threads(),
            ..setup.facts()
        };
        Ok(Self {
            sizes: setup.sizes.clone(),
            label_counts: setup.label_counts.clone(),
            partition: setup.report.clone(),
            test_sizes: facts.test_sizes.clone(),
            expected,
            derived,
            facts,
            setup,
        })
    }

    /// The resolved configuration.
    pub fn cfg(&self) -> &ExperimentConfig {
        &self.setup.cfg
    }

    /// The check of a client's hello against the server's derivation
    /// (the shared [`crate::checks::check_hello`]), to run when the client
    /// joins; claimed sizes (clients whose data only they hold) may not
    /// exceed `max_samples` a split.
    pub fn hello_check(
        &self,
        max_samples: usize,
    ) -> impl Fn(usize, &ClientInfo) -> Result<(), String> + Send + Sync + 'static {
        let expected = self.expected.clone();
        let derived = self.derived.clone();
        move |i, info| {
            let e = expected
                .get(i)
                .ok_or_else(|| format!("unknown client id {i}"))?;
            crate::checks::check_hello(e, derived[i], info, max_samples)
        }
    }

    /// Whether the server derived client `i`'s data itself.
    pub fn derives(&self, i: usize) -> bool {
        self.derived.get(i).copied().unwrap_or(false)
    }

    /// Records client `i`'s (checked) hello: for a client whose data only
    /// it holds, its sizes and label counts from now on.
    pub fn accept(&mut self, i: usize, info: &ClientInfo) {
        if self.derives(i) {
            return;
        }
        tracing::info!(
            client = i,
            samples = ?info.counts.samples,
            "sizes as the client claims them (its data is its own)"
        );
        self.sizes[i] = info.size;
        self.label_counts[i] = info.counts.train.clone();
        self.partition.clients[i] = info.counts.clone();
        self.test_sizes[i] = info.test_size;
        self.facts.test_sizes[i] = info.test_size;
    }

    /// `partition.json`: the same file as `fedweave run` writes.
    pub fn partition_json(&self) -> String {
        serde_json::to_string(&self.partition).unwrap_or_default()
    }

    /// What the algorithm may read on the server.
    pub fn env(&self) -> Env<'_> {
        Env {
            sizes: &self.sizes,
            label_counts: &self.label_counts,
            ..self.setup.env()
        }
    }

    /// The books' facts.
    pub fn facts(&self) -> &Facts {
        &self.facts
    }

    /// Trainable parameters of the model.
    pub fn model_parameters(&self) -> usize {
        self.setup.init.len()
    }
}

/// Client `i`'s hello as `setup` derives it.
fn info_of(s: &Setup, i: usize) -> ClientInfo {
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
