//! The experiment configuration: TOML with serde, unknown keys rejected with
//! their dotted path, `--set key=value` overrides, defaults filled in.

use fedweave_algos::attack::AttackKind;
use fedweave_algos::robust::AggregatorConfig;
use fedweave_data::{DataConfig, PartitionConfig, PartitionKind};
use fedweave_nn::{ModelKind, TrainConfig};
use serde::{Deserialize, Serialize};

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
    /// When clients are scored and which figure the run reports.
    pub eval: EvalSection,
    /// The defence applied to the uploads before the server aggregates.
    pub aggregator: AggregatorConfig,
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
            eval: EvalSection::default(),
            aggregator: AggregatorConfig::default(),
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
    /// points, as pFedGraph's code does.
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
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            kind: ModelKind::Mlp,
        }
    }
}

/// `[train]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Mini-batch steps per round (0: use `local_epochs`).
    pub local_iterations: usize,
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
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            local_iterations: 20,
            local_epochs: 0,
            batch_size: 32,
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 1e-5,
        }
    }
}

impl TrainSection {
    /// The trainer's view.
    pub fn to_train_config(&self) -> TrainConfig {
        TrainConfig {
            lr: self.lr,
            momentum: self.momentum,
            weight_decay: self.weight_decay,
            batch_size: self.batch_size,
            iterations: self.local_iterations,
            epochs: self.local_epochs,
        }
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
            key_err(
                if path == "." { "(top level)" } else { &path },
                inner.message().to_string(),
            )
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
        match self.algorithm.get("name") {
            Some(toml::Value::String(name)) => {
                fedweave_algos::check_params(name, &self.algorithm_params(), self.clients)
                    .map_err(|e| key_err("algorithm", e.to_string()))?;
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
        if t.local_iterations == 0 && t.local_epochs == 0 {
            return Err(key_err(
                "train.local_iterations",
                "set local_iterations or local_epochs above 0",
            ));
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
}
