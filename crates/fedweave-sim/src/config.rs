//! The experiment configuration: TOML with serde, unknown keys rejected with
//! their dotted path, `--set key=value` overrides, defaults filled in.

use fedweave_algos::attack::AttackKind;
use fedweave_algos::robust::AggregatorConfig;
use fedweave_core::pairwise::{Kernels, Precision};
use fedweave_core::{Purpose, rng_stream};
use fedweave_data::{DataConfig, PartitionConfig, PartitionKind};
use fedweave_nn::{Augment, Backend, LayerConfig, ModelKind, SequentialConfig, TrainConfig};
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Errors reading or checking a configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Not valid TOML.
    #[error("config is not valid TOML: {0}")]
    Syntax(String),
    /// A key is unknown, has the wrong type, or an impossible value.
    #[error("config key `{key}`: {message}")]
    Key {
        /// Dotted path of the key.
        key: String,
        /// What is wrong.
        message: String,
    },
}

pub(crate) fn key_err(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Key {
        key: key.to_string(),
        message: message.into(),
    }
}

/// The whole experiment.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExperimentConfig {
    /// Master seed: every random stream derives from it.
    pub seed: u64,
    /// Number of clients N.
    pub clients: usize,
    /// Communication rounds.
    pub rounds: usize,
    /// Fraction of clients taking part in each round (seeded per round).
    pub participation: f64,
    /// Worker threads (clients train in parallel); default = cores.
    /// Results do not depend on it.
    pub threads: Option<usize>,
    /// Dataset.
    pub data: DataConfig,
    /// How data is split across clients.
    pub partition: PartitionConfig,
    /// Model architecture.
    pub model: ModelSection,
    /// Local training.
    pub train: TrainSection,
    /// Algorithm name and its parameters (validated by the algorithm).
    pub algorithm: toml::Table,
    /// Malicious clients.
    pub attack: AttackSection,
    /// Rounds between checkpoints in `DIR/checkpoint/` (0: none; the last
    /// round is always checkpointed otherwise).
    pub checkpoint_every: usize,
    /// Also write each round's metrics as a TensorBoard event file
    /// (`DIR/tensorboard/`), for people who watch runs there.
    pub tensorboard: bool,
    /// When clients are scored and which figure the run reports.
    pub eval: EvalSection,
    /// The defence applied to the uploads before the server aggregates.
    pub aggregator: AggregatorConfig,
    /// Where local training runs. Left out of the resolved configuration
    /// while it is the default, so runs hash and resume as before.
    #[serde(skip_serializing_if = "DeviceSection::is_default")]
    pub device: DeviceSection,
    /// Networked runs (`fedweave serve`): seconds a round waits for the
    /// clients' answers before it completes with those that arrived (if at
    /// least `min_clients`). The simulator ignores it; written to
    /// `config.toml` only when set.
    #[serde(skip_serializing_if = "is_default_timeout")]
    pub round_timeout: f64,
    /// Networked runs: answers a round needs before `round_timeout` may
    /// complete it.
    #[serde(skip_serializing_if = "is_one")]
    pub min_clients: usize,
}

/// `[device]`: the burn backend local training and evaluation run on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeviceSection {
    /// `cpu` (default), `cuda` or `wgpu`; a GPU backend needs a binary
    /// built with its cargo feature.
    pub backend: Backend,
    /// Train up to this many participants' plain local rounds at once in
    /// one set of batched kernels (`fedweave_algos::batching`); 0 (the
    /// default) trains one client at a time. Results agree with the default
    /// to floating-point tolerance, not bit for bit. For GPUs, where one
    /// small model cannot fill the device; on the CPU it is slower.
    #[serde(skip_serializing_if = "is_zero")]
    pub batch_clients: usize,
    /// Where the server's pairwise products run (similarities, distances,
    /// the mixing W·Θ): see [`ServerKernels`].
    #[serde(skip_serializing_if = "ServerKernels::is_auto")]
    pub server_kernels: ServerKernels,
    /// How the host multiplies in those products: `auto` (exact `f64`
    /// products below 64 models, `f32` blocks summed in `f64` from 64 on, at
    /// ~2.4× the speed) or `f64` (exact products at every size). See
    /// `fedweave_core::pairwise::Precision`.
    #[serde(skip_serializing_if = "is_auto_precision")]
    pub server_precision: Precision,
}

fn is_auto_precision(p: &Precision) -> bool {
    *p == Precision::Auto
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// `[device] server_kernels`: where `fedweave_core::pairwise` computes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerKernels {
    /// On a GPU backend that computes in `f64`, products of at least
    /// [`OFFLOAD_MIN_FLOPS`] go to the GPU; otherwise everything stays on
    /// the host.
    #[default]
    Auto,
    /// Always the host's blocked GEMMs (bit-identical at any thread count).
    Host,
    /// Every Gram and many-row mixing on the `backend`'s device, even on
    /// `cpu` (burn's `flex`; how the offload path is tested without a GPU).
    /// Agrees with the host to the kernels' error bounds, not bit for bit.
    Device,
}

/// Smallest product (flops) `auto` hands to a GPU: ~10 ms of one CPU core;
/// below it the transfers cost more than they save.
pub const OFFLOAD_MIN_FLOPS: f64 = 1e8;

impl ServerKernels {
    fn is_auto(&self) -> bool {
        *self == Self::Auto
    }

    /// The kernels a run with these `[device]` settings uses.
    ///
    /// # Errors
    ///
    /// `device` on a backend whose device cannot compute in `f64` (or does
    /// not work).
    pub fn build(device: &DeviceSection) -> Result<Kernels, ConfigError> {
        let offload = |min_flops| {
            fedweave_nn::BurnOffload::new(device.backend)
                .map(|dev| Kernels::offloaded(Arc::new(dev), min_flops))
        };
        let kernels = match device.server_kernels {
            ServerKernels::Host => Kernels::cpu().clone(),
            ServerKernels::Device => {
                offload(0.0).map_err(|e| key_err("device.server_kernels", e.to_string()))?
            }
            ServerKernels::Auto if device.backend == Backend::Cpu => Kernels::cpu().clone(),
            ServerKernels::Auto => offload(OFFLOAD_MIN_FLOPS).unwrap_or_else(|e| {
                tracing::info!("server kernels stay on the host: {e}");
                Kernels::cpu().clone()
            }),
        };
        Ok(kernels.with_precision(device.server_precision))
    }
}

impl DeviceSection {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Default `round_timeout`: ten minutes.
const DEFAULT_ROUND_TIMEOUT: f64 = 600.0;

fn is_default_timeout(t: &f64) -> bool {
    *t == DEFAULT_ROUND_TIMEOUT
}

fn is_one(n: &usize) -> bool {
    *n == 1
}

impl Default for ExperimentConfig {
    fn default() -> Self {
        let mut algorithm = toml::Table::new();
        algorithm.insert("name".into(), toml::Value::String("fedavg".into()));
        Self {
            seed: 1,
            clients: 10,
            rounds: 20,
            participation: 1.0,
            threads: None,
            data: DataConfig::default(),
            partition: PartitionConfig {
                kind: PartitionKind::Pathological,
                ..PartitionConfig::default()
            },
            model: ModelSection::default(),
            train: TrainSection::default(),
            algorithm,
            attack: AttackSection::default(),
            checkpoint_every: 1,
            tensorboard: false,
            eval: EvalSection::default(),
            aggregator: AggregatorConfig::default(),
            device: DeviceSection::default(),
            round_timeout: DEFAULT_ROUND_TIMEOUT,
            min_clients: 1,
        }
    }
}

/// `[eval]`: the papers' evaluation protocols as options of every run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalSection {
    /// When clients are scored each round.
    pub when: EvalWhen,
    /// Which figure `summary.json`'s `selected_test_acc` reports (every
    /// figure is reported; `mean_test_acc` stays the per-client
    /// best-validation headline).
    pub select: SelectionRule,
}

/// When clients are scored each round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvalWhen {
    /// At the algorithm's own point (after local training for personalised
    /// methods, after receiving the global model for FedAvg).
    #[default]
    #[serde(alias = "after_training")]
    Algorithm,
    /// Also before local training, on the model the client holds then (the
    /// received mix): each client's best validation is taken over both
    /// points, as pFedGraph's code does. Methods whose model before
    /// training is not one they report (FedAvg-FT, FedProx-FT:
    /// `Algorithm::scores_before_training`) are scored after only.
    BeforeAndAfter,
}

/// How a run's reported figure is selected across rounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SelectionRule {
    /// Per client, the test accuracy at its best validation round
    /// (pFedGraph, DPFL), averaged.
    #[default]
    PerClientBestVal,
    /// The one round with the best mean validation accuracy (FedAGHN).
    BestRoundMeanVal,
    /// The max over rounds of the round's test accuracy over its
    /// participants, weighted by test size (FedDWA, PFLlib).
    MaxRoundMean,
    /// The last round's mean test accuracy.
    Last,
}

/// `[model]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// Architecture.
    pub kind: ModelKind,
    /// Embedding width of `textcnn` (default 256, pFedGraph's code) and `mf`
    /// (default 32); other models reject it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embed_dim: Option<usize>,
    /// The layers of a `sequential` model, in order; other models reject
    /// it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layers: Option<Vec<LayerConfig>>,
    /// Index of a `sequential` model's first head layer (default: its last
    /// linear layer); other models reject it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<usize>,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            kind: ModelKind::MLP,
            embed_dim: None,
            layers: None,
            head: None,
        }
    }
}

impl ModelSection {
    /// The layer list of a `sequential` model.
    pub fn sequential(&self) -> Option<SequentialConfig> {
        self.layers.as_ref().map(|layers| SequentialConfig {
            layers: layers.clone(),
            head: self.head,
        })
    }

    /// Checks the keys that apply to some architectures only.
    fn validate(&self) -> Result<(), ConfigError> {
        let info = self.kind.info();
        if self.embed_dim.is_some() && !info.embedding {
            let with: Vec<&str> = ModelKind::catalogue()
                .iter()
                .filter(|i| i.embedding)
                .map(|i| i.name)
                .collect();
            return Err(key_err(
                "model.embed_dim",
                format!("only {} have an embedding", with.join(" and ")),
            ));
        }
        if self.embed_dim == Some(0) {
            return Err(key_err("model.embed_dim", "must be at least 1"));
        }
        let sequential = self.kind == ModelKind::SEQUENTIAL;
        for (key, set) in [
            ("layers", self.layers.is_some()),
            ("head", self.head.is_some()),
        ] {
            if set && !sequential {
                return Err(key_err(
                    &format!("model.{key}"),
                    format!(
                        "only a sequential model (kind = \"sequential\") has a layer list, not `{}`",
                        self.kind
                    ),
                ));
            }
        }
        match &self.layers {
            None if sequential => Err(key_err(
                "model.layers",
                "missing: a sequential model needs a layer list, e.g. layers = [{ type = \"flatten\" }, { type = \"linear\" }]",
            )),
            Some(layers) if layers.is_empty() => {
                Err(key_err("model.layers", "is empty; list at least one layer"))
            }
            _ => Ok(()),
        }
    }
}

/// `train.local_iterations`: one number of mini-batch steps per round for
/// every client, or a range from which each client draws its own.
///
/// In TOML: `local_iterations = 20`, or `local_iterations = [10, 30]`
/// (each client takes a fixed count in 10..=30 every round, drawn once from
/// the seed: clients that do unequal amounts of local work, the setting
/// FedNova corrects for).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalIterations {
    /// Every client takes this many steps (0: use `local_epochs`).
    Fixed(usize),
    /// Each client draws a fixed count in `lo..=hi`.
    Range {
        /// Fewest steps.
        lo: usize,
        /// Most steps.
        hi: usize,
    },
}

impl Serialize for LocalIterations {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match *self {
            Self::Fixed(n) => s.serialize_u64(n as u64),
            Self::Range { lo, hi } => [lo, hi].serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for LocalIterations {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = LocalIterations;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a number of steps (e.g. 20) or a range of two, [lo, hi]")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Self::Value, E> {
                usize::try_from(n)
                    .map(LocalIterations::Fixed)
                    .map_err(|_| E::custom(format!("{n} steps is too many")))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Self::Value, E> {
                u64::try_from(n)
                    .map_err(|_| E::custom(format!("must be ≥ 0, got {n}")))
                    .and_then(|n| self.visit_u64(n))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<Self::Value, A::Error> {
                let mut v: Vec<u64> = Vec::new();
                while let Some(x) = a.next_element::<u64>()? {
                    v.push(x);
                }
                match v[..] {
                    [lo, hi] => Ok(LocalIterations::Range {
                        lo: lo as usize,
                        hi: hi as usize,
                    }),
                    _ => Err(serde::de::Error::custom(format!(
                        "a range is two step counts [lo, hi], got {} values",
                        v.len()
                    ))),
                }
            }
        }
        d.deserialize_any(Visit)
    }
}

/// `[train]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Mini-batch steps per round (0: use `local_epochs`), or a per-client
    /// range.
    pub local_iterations: LocalIterations,
    /// Full local passes per round, used when `local_iterations` is 0.
    pub local_epochs: usize,
    /// Mini-batch size.
    pub batch_size: usize,
    /// Learning rate.
    pub lr: f32,
    /// SGD momentum (dampening 0).
    pub momentum: f32,
    /// L2 weight decay.
    pub weight_decay: f32,
    /// Augmentation of training mini-batches (`crop_flip`: CIFAR-style
    /// random crop with 4-pixel padding and horizontal flip;
    /// `crop_flip_reflect[_cutout]`: SFL's, see [`Augment`]).
    pub augment: Augment,
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            local_iterations: LocalIterations::Fixed(20),
            local_epochs: 0,
            batch_size: 32,
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 1e-5,
            augment: Augment::None,
        }
    }
}

impl TrainSection {
    /// The trainer's view shared by all clients; with a per-client range,
    /// its step count is the range's upper end (what the server side may
    /// read; each client trains with [`TrainSection::client_configs`]).
    pub fn to_train_config(&self) -> TrainConfig {
        TrainConfig {
            lr: self.lr,
            momentum: self.momentum,
            weight_decay: self.weight_decay,
            batch_size: self.batch_size,
            iterations: match self.local_iterations {
                LocalIterations::Fixed(n) => n,
                LocalIterations::Range { hi, .. } => hi,
            },
            epochs: self.local_epochs,
        }
    }

    /// Each client's trainer view: with a range, client i's step count is
    /// drawn uniformly from `lo..=hi` by its own stream of the seed (the
    /// same at any thread count, and for the whole run); otherwise every
    /// client gets [`TrainSection::to_train_config`].
    pub fn client_configs(&self, seed: u64, clients: usize) -> Vec<TrainConfig> {
        let common = self.to_train_config();
        (0..clients)
            .map(|i| match self.local_iterations {
                LocalIterations::Fixed(_) => common.clone(),
                LocalIterations::Range { lo, hi } => {
                    let mut rng = rng_stream(seed, 0, i as u64, Purpose::LocalWork);
                    TrainConfig {
                        iterations: rng.random_range(lo..=hi),
                        ..common.clone()
                    }
                }
            })
            .collect()
    }
}

/// `[attack]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AttackSection {
    /// Attack kind.
    pub kind: AttackKind,
    /// Fraction of malicious clients (⌊ratio·N⌉ of them).
    pub ratio: f64,
    /// `gaussian` draws U(0,1) instead of N(0,1) (the paper's wording).
    pub uniform: bool,
    /// Peer-to-peer methods (DPFL): whether malicious clients choose their
    /// own collaborators (true, the paper's Fig. 4b) or just keep and send
    /// their local models (false, Fig. 4a).
    pub run_selection: bool,
}

impl Default for AttackSection {
    fn default() -> Self {
        Self {
            kind: AttackKind::None,
            ratio: 0.0,
            uniform: false,
            run_selection: true,
        }
    }
}

impl AttackSection {
    /// `none`, or e.g. `sign_flip r=0.4`.
    pub fn describe(&self) -> String {
        if self.kind == AttackKind::None {
            return "none".into();
        }
        let kind = toml::Value::try_from(self.kind)
            .map(|v| v.as_str().unwrap_or("").to_string())
            .unwrap_or_default();
        format!("{kind} r={}", self.ratio)
    }
}

impl ExperimentConfig {
    /// Parses TOML text, applies `overrides` (`dotted.key=value`, the value
    /// read as a TOML value or else as a string) and checks every key.
    pub fn from_toml_str(text: &str, overrides: &[String]) -> Result<Self, ConfigError> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax(e.to_string()))?;
        for o in overrides {
            apply_override(&mut table, o)?;
        }
        let de = toml::Value::Table(table);
        let cfg: Self = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let message = crate::suggest::explain(&path, inner.message());
            key_err(if path == "." { "(top level)" } else { &path }, message)
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and parses a config file.
    pub fn from_file(path: &std::path::Path, overrides: &[String]) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml_str(&text, overrides)
    }

    /// The algorithm's name.
    pub fn algorithm_name(&self) -> &str {
        self.algorithm
            .get("name")
            .and_then(|v| v.as_str())
            .unwrap_or("fedavg")
    }

    /// The algorithm's parameters (the `[algorithm]` table without `name`).
    pub fn algorithm_params(&self) -> toml::Table {
        let mut t = self.algorithm.clone();
        t.remove("name");
        t
    }

    /// Checks values that types cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.clients == 0 {
            return Err(key_err("clients", "must be at least 1"));
        }
        if self.rounds == 0 {
            return Err(key_err("rounds", "must be at least 1"));
        }
        if !(self.participation > 0.0 && self.participation <= 1.0) {
            return Err(key_err(
                "participation",
                format!("must be in (0, 1], got {}", self.participation),
            ));
        }
        if self.threads == Some(0) {
            return Err(key_err("threads", "must be at least 1"));
        }
        if let Err(e) = self.device.backend.device() {
            return Err(key_err("device.backend", e.to_string()));
        }
        if self.device.batch_clients > 0 && !self.model.kind.info().batched {
            return Err(key_err(
                "device.batch_clients",
                format!(
                    "model `{}` cannot be trained batched: it has no batched formulation; remove the key",
                    self.model.kind
                ),
            ));
        }
        let datasets: Vec<&str> = fedweave_data::datasets().iter().map(|d| d.name).collect();
        if !datasets.contains(&self.data.dataset.as_str()) {
            return Err(key_err(
                "data.dataset",
                crate::suggest::unknown_name("dataset", &self.data.dataset, &datasets),
            ));
        }
        match self.algorithm.get("name") {
            Some(toml::Value::String(name)) => {
                let catalogue = fedweave_algos::catalogue();
                let known: Vec<&str> = catalogue.iter().map(|a| a.name).collect();
                if !known.contains(&name.as_str()) {
                    return Err(key_err(
                        "algorithm.name",
                        format!(
                            "{} (`fedweave list` describes them)",
                            crate::suggest::unknown_name("algorithm", name, &known)
                        ),
                    ));
                }
                fedweave_algos::check_params(name, &self.algorithm_params(), self.clients)
                    .map_err(|e| key_err("algorithm", algorithm_message(&e.to_string())))?;
            }
            Some(_) => return Err(key_err("algorithm.name", "must be a string")),
            None => return Err(key_err("algorithm.name", "missing")),
        }
        self.aggregator
            .validate()
            .map_err(|e| key_err(&format!("aggregator.{}", e.key), e.message))?;
        let t = &self.train;
        if t.batch_size == 0 {
            return Err(key_err("train.batch_size", "must be at least 1"));
        }
        match t.local_iterations {
            LocalIterations::Fixed(0) if t.local_epochs == 0 => {
                return Err(key_err(
                    "train.local_iterations",
                    "set local_iterations or local_epochs above 0",
                ));
            }
            LocalIterations::Range { lo, hi } if lo == 0 || lo > hi => {
                return Err(key_err(
                    "train.local_iterations",
                    format!("a range [lo, hi] needs 1 ≤ lo ≤ hi, got [{lo}, {hi}]"),
                ));
            }
            _ => {}
        }
        if !(t.lr > 0.0 && t.lr.is_finite()) {
            return Err(key_err(
                "train.lr",
                format!("must be a finite number > 0, got {}", t.lr),
            ));
        }
        if !(0.0..1.0).contains(&t.momentum) {
            return Err(key_err(
                "train.momentum",
                format!("must be in [0, 1), got {}", t.momentum),
            ));
        }
        if !(t.weight_decay >= 0.0 && t.weight_decay.is_finite()) {
            return Err(key_err(
                "train.weight_decay",
                format!("must be ≥ 0, got {}", t.weight_decay),
            ));
        }
        if !(0.0..1.0).contains(&self.attack.ratio) {
            return Err(key_err(
                "attack.ratio",
                format!("must be in [0, 1), got {}", self.attack.ratio),
            ));
        }
        if self.attack.kind != AttackKind::None && self.attack.ratio == 0.0 {
            return Err(key_err("attack.ratio", "an attack needs a ratio above 0"));
        }
        self.partition
            .validate(self.clients)
            .map_err(|e| key_err("partition", e.to_string()))?;
        self.model.validate()?;
        if !(self.round_timeout > 0.0 && self.round_timeout.is_finite()) {
            return Err(key_err(
                "round_timeout",
                format!(
                    "must be a finite number of seconds > 0, got {}",
                    self.round_timeout
                ),
            ));
        }
        if self.min_clients == 0 || self.min_clients > self.clients {
            return Err(key_err(
                "min_clients",
                format!("must be in 1..={}, got {}", self.clients, self.min_clients),
            ));
        }
        Ok(())
    }

    /// What identifies a run for its checkpoints: the configuration less
    /// what may change when it is resumed (rounds, threads, checkpoint
    /// frequency).
    pub fn fingerprint(&self) -> String {
        let mut c = self.clone();
        c.rounds = 0;
        c.threads = None;
        c.checkpoint_every = 0;
        c.tensorboard = false;
        c.round_timeout = DEFAULT_ROUND_TIMEOUT;
        c.min_clients = 1;
        c.to_toml()
    }

    /// The resolved configuration as TOML (what `DIR/config.toml` holds).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self)
            .unwrap_or_else(|e| format!("# could not serialise config: {e}\n"))
    }
}

/// An `[algorithm]` parameter error with "did you mean" for an unknown key
/// (`… unknown key `algorithm.alpah`, expected one of `alpha`, …`).
fn algorithm_message(message: &str) -> String {
    const MARK: &str = "unknown key `algorithm.";
    let Some(at) = message.find(MARK) else {
        return message.to_string();
    };
    let rest = &message[at + MARK.len()..];
    let (word, tail) = rest.split_once('`').unwrap_or((rest, ""));
    let known: Vec<&str> = tail.split('`').skip(1).step_by(2).collect();
    let head = &message[..at];
    match crate::suggest::did_you_mean(word, known.iter().copied()) {
        Some(s) => format!("{head}unknown key `algorithm.{word}`; did you mean `algorithm.{s}`?"),
        None => message.to_string(),
    }
}

/// Sets `a.b.c = value` in `table`, creating intermediate tables.
fn apply_override(table: &mut toml::Table, assignment: &str) -> Result<(), ConfigError> {
    let (key, raw) = assignment
        .split_once('=')
        .ok_or_else(|| key_err(assignment, "an override must look like key=value"))?;
    let key = key.trim();
    let raw = raw.trim();
    let value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(key_err(key, "empty path segment"));
    }
    let mut cur = table;
    for p in &parts[..parts.len() - 1] {
        let entry = cur
            .entry(p.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        cur = entry
            .as_table_mut()
            .ok_or_else(|| key_err(key, format!("`{p}` is not a table")))?;
    }
    cur.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

/// `runs/ALGORITHM-DATASET-PARTITION-sSEED`, with `-2`, `-3`, … added when
/// that directory exists.
pub fn default_out_dir(cfg: &ExperimentConfig) -> std::path::PathBuf {
    let base = format!(
        "{}-{}-{}-s{}",
        cfg.algorithm_name(),
        cfg.data.dataset,
        cfg.partition.kind,
        cfg.seed
    );
    let clean: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    unique_dir(&std::path::PathBuf::from("runs"), &clean)
}

/// `parent/name`, or `parent/name-K` for the first K ≥ 2 not taken.
fn unique_dir(parent: &std::path::Path, name: &str) -> std::path::PathBuf {
    let first = parent.join(name);
    if !first.exists() {
        return first;
    }
    (2..)
        .map(|k| parent.join(format!("{name}-{k}")))
        .find(|p| !p.exists())
        .unwrap_or(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_named() {
        let e = ExperimentConfig::from_toml_str("[train]\nlr = 0.1\nlearning_rate = 3\n", &[])
            .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("train") && msg.contains("learning_rate"),
            "{msg}"
        );
    }

    #[test]
    fn wrong_types_are_named() {
        let e = ExperimentConfig::from_toml_str("rounds = \"many\"\n", &[]).unwrap_err();
        assert!(e.to_string().contains("rounds"), "{e}");
        let e = ExperimentConfig::from_toml_str("", &["train.lr=fast".into()]).unwrap_err();
        assert!(e.to_string().contains("train.lr"), "{e}");
    }

    #[test]
    fn overrides_parse_as_toml_or_strings() {
        let cfg = ExperimentConfig::from_toml_str(
            "",
            &[
                "algorithm.name=pfedgraph".into(),
                "rounds=5".into(),
                "partition.beta=0.5".into(),
                "attack.kind=\"sign_flip\"".into(),
                "attack.ratio=0.2".into(),
            ],
        )
        .unwrap();
        assert_eq!(cfg.algorithm_name(), "pfedgraph");
        assert_eq!(cfg.rounds, 5);
        assert_eq!(cfg.partition.beta, 0.5);
        assert_eq!(cfg.attack.kind, AttackKind::SignFlip);
        let again = ExperimentConfig::from_toml_str(
            "",
            &["attack.kind=sign_flip".into(), "attack.ratio=0.2".into()],
        )
        .unwrap();
        assert_eq!(again.attack.kind, AttackKind::SignFlip);
    }

    #[test]
    fn impossible_values_are_rejected() {
        for (o, key) in [
            ("clients=0", "clients"),
            ("participation=1.5", "participation"),
            ("train.lr=-1", "train.lr"),
            ("attack.ratio=1.0", "attack.ratio"),
        ] {
            let e = ExperimentConfig::from_toml_str("", &[o.into()]).unwrap_err();
            assert!(e.to_string().contains(key), "{o}: {e}");
        }
    }

    #[test]
    fn backends_are_checked_against_the_build() {
        let cpu = ExperimentConfig::from_toml_str("[device]\nbackend = \"cpu\"\n", &[]).unwrap();
        assert_eq!(cpu.device.backend, Backend::Cpu);
        // The default device is not written out: resolved configs (and
        // their hashes) stay as they were before `[device]` existed.
        assert!(!cpu.to_toml().contains("device"), "{}", cpu.to_toml());
        for backend in [Backend::Cuda, Backend::Wgpu] {
            let name = backend.name();
            let got = ExperimentConfig::from_toml_str("", &[format!("device.backend={name}")]);
            match got {
                Ok(cfg) => {
                    assert!(backend.available(), "{name} accepted without its feature");
                    assert!(cfg.to_toml().contains(name));
                }
                Err(e) => {
                    assert!(!backend.available(), "{name}: {e}");
                    let msg = e.to_string();
                    assert!(
                        msg.contains("device.backend") && msg.contains("--features"),
                        "{msg}"
                    );
                }
            }
        }
        let e = ExperimentConfig::from_toml_str("[device]\nbackend = \"tpu\"\n", &[]).unwrap_err();
        assert!(e.to_string().contains("device.backend"), "{e}");
    }

    #[test]
    fn server_kernels_parse_build_and_are_written_out() {
        let parse = |v: &str| {
            ExperimentConfig::from_toml_str(&format!("[device]\nserver_kernels = \"{v}\"\n"), &[])
        };
        let auto = ExperimentConfig::from_toml_str("", &[]).unwrap();
        assert_eq!(auto.device.server_kernels, ServerKernels::Auto);
        assert!(!auto.to_toml().contains("server_kernels"));
        // `auto` and `host` on the CPU backend: the host kernels.
        for cfg in [auto, parse("host").unwrap()] {
            let k = ServerKernels::build(&cfg.device).unwrap();
            assert_eq!(k.device_name(), None);
        }
        let dev = parse("device").unwrap();
        assert!(dev.to_toml().contains("server_kernels = \"device\""));
        let k = ServerKernels::build(&dev.device).unwrap();
        assert_eq!(k.device_name(), Some("cpu"));
        let e = parse("gpu").unwrap_err().to_string();
        assert!(
            e.contains("server_kernels") || e.contains("unknown variant"),
            "{e}"
        );
    }

    #[test]
    fn server_precision_parses_reaches_the_kernels_and_is_written_out() {
        let auto = ExperimentConfig::from_toml_str("", &[]).unwrap();
        assert_eq!(auto.device.server_precision, Precision::Auto);
        assert!(!auto.to_toml().contains("server_precision"));
        let k = ServerKernels::build(&auto.device).unwrap();
        assert_eq!(k.precision(), Precision::Auto);
        let f64_cfg =
            ExperimentConfig::from_toml_str("[device]\nserver_precision = \"f64\"\n", &[]).unwrap();
        assert!(f64_cfg.to_toml().contains("server_precision = \"f64\""));
        assert_eq!(
            ServerKernels::build(&f64_cfg.device).unwrap().precision(),
            Precision::F64
        );
        // Also on the offloaded kernels (their host side).
        let mut dev = f64_cfg.device.clone();
        dev.server_kernels = ServerKernels::Device;
        assert_eq!(
            ServerKernels::build(&dev).unwrap().precision(),
            Precision::F64
        );
        let e = ExperimentConfig::from_toml_str("[device]\nserver_precision = \"f16\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("server_precision") || e.contains("unknown variant"),
            "{e}"
        );
    }

    #[test]
    fn a_sequential_model_is_read_from_the_layer_list_and_written_back() {
        let text = r#"
[model]
kind = "sequential"
head = 4
layers = [
  { type = "conv2d", out_channels = 6, kernel = 5, padding = 2 },
  { type = "relu" },
  { type = "max_pool2d", kernel = 2 },
  { type = "flatten" },
  { type = "linear", out_features = 32 },
  { type = "relu" },
  { type = "linear", out_features = "classes", bias = false },
]
"#;
        let cfg = ExperimentConfig::from_toml_str(text, &[]).unwrap();
        let seq = cfg.model.sequential().unwrap();
        assert_eq!(seq.head, Some(4));
        assert_eq!(seq.layers.len(), 7);
        assert_eq!(
            seq.layers[6],
            LayerConfig::Linear {
                in_features: None,
                out_features: Some(fedweave_nn::Width::Classes),
                bias: false,
            }
        );
        let again = ExperimentConfig::from_toml_str(&cfg.to_toml(), &[]).unwrap();
        assert_eq!(again.model.sequential(), Some(seq));
        let example = include_str!("../../../examples/sequential_digits.toml");
        let cfg = ExperimentConfig::from_toml_str(example, &[]).unwrap();
        assert_eq!(cfg.model.sequential().unwrap().layers.len(), 10);
    }

    #[test]
    fn layer_list_mistakes_name_the_layer_and_the_key() {
        let err = |model: &str| {
            ExperimentConfig::from_toml_str(&format!("[model]\n{model}\n"), &[])
                .unwrap_err()
                .to_string()
        };
        let e = err(r#"kind = "sequential"
layers = [{ type = "relu" }, { type = "convolution", out_channels = 3 }]"#);
        assert!(
            e.contains("model.layers[1]") && e.contains("convolution"),
            "{e}"
        );
        assert!(e.contains("conv2d"), "did you mean: {e}");
        let e = err(r#"kind = "sequential"
layers = [{ type = "linear", out_feature = 3 }]"#);
        assert!(
            e.contains("model.layers[0]") && e.contains("out_features"),
            "{e}"
        );
        let e = err(r#"kind = "sequential"
layers = [{ type = "conv2d", out_channels = "six", kernel = 3 }]"#);
        assert!(e.contains("model.layers[0]"), "{e}");
        let e = err(r#"kind = "sequential"
layers = [{ type = "relu", p = 0.5 }]"#);
        assert!(
            e.contains("model.layers[0]") && e.contains("unknown key; this table takes no keys"),
            "{e}"
        );
        let e = err(r#"kind = "sequential""#);
        assert!(e.contains("model.layers") && e.contains("missing"), "{e}");
        let e = err(r#"kind = "sequential"
layers = []"#);
        assert!(e.contains("model.layers") && e.contains("empty"), "{e}");
        let e = err(r#"kind = "cnn"
layers = [{ type = "relu" }]"#);
        assert!(
            e.contains("model.layers") && e.contains("sequential"),
            "{e}"
        );
        let e = err(r#"kind = "sequentail""#);
        assert!(
            e.contains("model.kind") && e.contains("did you mean `sequential`"),
            "{e}"
        );
        let e = err(r#"kind = "cnn"
embed_dim = 8"#);
        assert!(
            e.contains("model.embed_dim") && e.contains("textcnn and mf"),
            "{e}"
        );
    }

    #[test]
    fn batch_clients_needs_a_batched_model_and_is_written_out() {
        let cfg = ExperimentConfig::from_toml_str(
            "[model]\nkind = \"cnn\"\n[device]\nbatch_clients = 8\n",
            &[],
        )
        .unwrap();
        assert_eq!(cfg.device.batch_clients, 8);
        assert!(
            cfg.to_toml().contains("batch_clients = 8"),
            "{}",
            cfg.to_toml()
        );
        let e = ExperimentConfig::from_toml_str(
            "[model]\nkind = \"gru\"\n[device]\nbatch_clients = 8\n",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("device.batch_clients") && e.contains("gru"),
            "{e}"
        );
    }

    #[test]
    fn resolved_config_round_trips() {
        let cfg = ExperimentConfig::from_toml_str(
            "rounds = 3\n[algorithm]\nname = \"pfedgraph\"\nlambda = 0.1\n",
            &[],
        )
        .unwrap();
        let again = ExperimentConfig::from_toml_str(&cfg.to_toml(), &[]).unwrap();
        assert_eq!(again.to_toml(), cfg.to_toml());
        assert_eq!(
            again
                .algorithm_params()
                .get("lambda")
                .and_then(|v| v.as_float()),
            Some(0.1)
        );
    }

    #[test]
    fn local_iterations_take_a_count_or_a_range() {
        let parse = |v: &str| {
            ExperimentConfig::from_toml_str(&format!("[train]\nlocal_iterations = {v}\n"), &[])
        };
        assert_eq!(
            parse("7").unwrap().train.local_iterations,
            LocalIterations::Fixed(7)
        );
        let cfg = parse("[10, 30]").unwrap();
        assert_eq!(
            cfg.train.local_iterations,
            LocalIterations::Range { lo: 10, hi: 30 }
        );
        // The range survives the resolved config, and the override form.
        let again = ExperimentConfig::from_toml_str(&cfg.to_toml(), &[]).unwrap();
        assert_eq!(again.train.local_iterations, cfg.train.local_iterations);
        let o =
            ExperimentConfig::from_toml_str("", &["train.local_iterations=[2, 4]".into()]).unwrap();
        assert_eq!(
            o.train.local_iterations,
            LocalIterations::Range { lo: 2, hi: 4 }
        );
        // Each client draws a fixed count in the range from the seed:
        // reproducible, different across seeds, and spread over the range.
        let steps = |seed| -> Vec<usize> {
            cfg.train
                .client_configs(seed, 40)
                .iter()
                .map(|c| c.iterations)
                .collect()
        };
        let a = steps(1);
        assert_eq!(a, steps(1));
        assert_ne!(a, steps(2));
        assert!(a.iter().all(|s| (10..=30).contains(s)), "{a:?}");
        assert!(
            a.iter().any(|&s| s < 15) && a.iter().any(|&s| s > 25),
            "{a:?}"
        );
        assert_eq!(cfg.train.to_train_config().iterations, 30);
        // A fixed count: every client the same.
        let fixed = parse("7").unwrap().train.client_configs(1, 3);
        assert!(fixed.iter().all(|c| c.iterations == 7));
    }

    #[test]
    fn bad_step_ranges_get_a_clear_error() {
        let err = |v: &str| {
            ExperimentConfig::from_toml_str(&format!("[train]\nlocal_iterations = {v}\n"), &[])
                .unwrap_err()
                .to_string()
        };
        let e = err("[30, 10]");
        assert!(
            e.contains("train.local_iterations") && e.contains("1 ≤ lo ≤ hi, got [30, 10]"),
            "{e}"
        );
        let e = err("[0, 5]");
        assert!(e.contains("got [0, 5]"), "{e}");
        let e = err("[1, 2, 3]");
        assert!(
            e.contains("train.local_iterations") && e.contains("two step counts [lo, hi], got 3"),
            "{e}"
        );
        let e = err("-3");
        assert!(
            e.contains("train.local_iterations") && e.contains("≥ 0"),
            "{e}"
        );
        let e = err("\"many\"");
        assert!(
            e.contains("train.local_iterations") && e.contains("[lo, hi]"),
            "{e}"
        );
        let e = err("0");
        assert!(e.contains("local_epochs above 0"), "{e}");
    }
}
