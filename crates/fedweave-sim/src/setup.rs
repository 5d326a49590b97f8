//! Everything a run needs that does not change from round to round: the
//! data and its partition, the model, the common initial model, who is
//! malicious. Built once from the config, before any training, so every
//! check fails early.

use crate::config::{ExperimentConfig, ServerKernels, key_err};
use crate::engine::RunError;
use crate::protocol::Facts;
use fedweave_algos::attack::{AttackKind, choose_malicious};
use fedweave_algos::{ClientData, Env};
use fedweave_core::pairwise::Kernels;
use fedweave_data::{Dataset, InputKind, Partition, PartitionReport, Task};
use fedweave_nn::{InputValues, LocalData, ModelInput, ModelSpec, TrainConfig};

/// The fixed part of a run.
pub(crate) struct Setup {
    /// The resolved configuration (dataset defaults and threads filled in).
    pub cfg: ExperimentConfig,
    pub dataset: Dataset,
    pub partition: Partition,
    /// Per-client label counts, written to `partition.json`.
    pub report: PartitionReport,
    pub spec: ModelSpec,
    /// What the model reads besides the sample shape (kept models' card).
    pub input: ModelInput,
    pub train: TrainConfig,
    /// Each client's local training settings (they differ only in the step
    /// count, when `train.local_iterations` is a range).
    pub client_train: Vec<TrainConfig>,
    /// The common round-0 model.
    pub init: Vec<f32>,
    pub sizes: Vec<usize>,
    pub label_counts: Vec<Vec<usize>>,
    pub malicious: Vec<usize>,
    pub is_malicious: Vec<bool>,
    pub benign: Vec<usize>,
    /// Forecasting or rating regression: errors instead of accuracy.
    pub regression: bool,
    /// Where the server's pairwise products run (`[device] server_kernels`).
    pub kernels: Kernels,
}

impl Setup {
    /// Loads and partitions the data, builds the model and the initial
    /// parameters.
    pub fn load(cfg: &ExperimentConfig) -> Result<Self, RunError> {
        Self::load_hosted(cfg, None)
    }

    /// [`Self::load`] on a machine that holds only the `hosted` clients'
    /// data (a networked client process): with per-client files (`csv`)
    /// only theirs are read.
    pub fn load_hosted(cfg: &ExperimentConfig, hosted: Option<&[usize]>) -> Result<Self, RunError> {
        let mut cfg = cfg.clone();
        if cfg.data.dataset == "synthetic" {
            cfg.data.synthetic.clients = cfg.clients;
        }
        let threads = cfg
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        cfg.threads = Some(threads);
        let dataset = fedweave_data::load_federation(&cfg.data, cfg.seed, cfg.clients, hosted)?;
        let (dataset, partition) =
            fedweave_data::prepare(dataset, &cfg.partition, cfg.clients, cfg.seed)?;
        let outputs = match dataset.task {
            Task::Forecasting { horizon } => horizon,
            Task::Regression { targets } => targets,
            Task::Classification => dataset.num_classes,
        };
        let input = ModelInput {
            values: match &dataset.input {
                InputKind::Dense => InputValues::Dense,
                InputKind::Tokens { vocab_size, .. } => InputValues::Tokens { vocab: *vocab_size },
                InputKind::Categorical { cardinalities } => InputValues::Categorical {
                    cardinalities: cardinalities.clone(),
                },
            },
            embed_dim: cfg.model.embed_dim,
            sequential: cfg.model.sequential(),
        };
        let spec = ModelSpec::with_input(cfg.model.kind, &dataset.feature_shape, outputs, &input)?
            .on(cfg.device.backend.device()?);
        if cfg.device.batch_clients > 0 {
            // A layer list may hold a layer without a batched form.
            fedweave_nn::BatchedTrainer::check(&spec)
                .map_err(|e| key_err("device.batch_clients", format!("{e}; remove the key")))?;
        }
        cfg.train
            .augment
            .check(&dataset.feature_shape)
            .map_err(|m| key_err("train.augment", format!("{m} ({})", dataset.name)))?;
        let report = partition.label_counts(&dataset);
        let malicious = choose_malicious(cfg.seed, cfg.clients, cfg.attack.ratio);
        let is_malicious: Vec<bool> = (0..cfg.clients).map(|i| malicious.contains(&i)).collect();
        Ok(Self {
            kernels: ServerKernels::build(&cfg.device)?,
            train: cfg.train.to_train_config(),
            client_train: cfg.train.client_configs(cfg.seed, cfg.clients),
            init: crate::runtime::initial_model(&spec, cfg.seed),
            sizes: partition.train_sizes(),
            label_counts: report.clients.iter().map(|c| c.train.clone()).collect(),
            benign: (0..cfg.clients).filter(|&i| !is_malicious[i]).collect(),
            regression: dataset.task != Task::Classification,
            malicious,
            is_malicious,
            report,
            spec,
            input,
            partition,
            dataset,
            cfg,
        })
    }

    /// What the algorithm may read about the federation.
    pub fn env(&self) -> Env<'_> {
        Env {
            spec: &self.spec,
            train: &self.train,
            sizes: &self.sizes,
            init: &self.init,
            relation: self.dataset.relation_graph.as_ref(),
            label_counts: &self.label_counts,
            kernels: &self.kernels,
        }
    }

    /// What client `i` reads about the federation while it trains: the
    /// common view with its own local training settings.
    pub fn client_env(&self, i: usize) -> Env<'_> {
        Env {
            train: &self.client_train[i],
            ..self.env()
        }
    }

    /// Whether client `i`'s data is on another machine (per-client files
    /// this process did not read).
    pub fn is_remote(&self, i: usize) -> bool {
        self.dataset
            .natural_clients
            .as_ref()
            .is_some_and(|nat| nat.get(i).is_some_and(|c| c.remote))
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.cfg.threads.unwrap_or(1)
    }

    /// What the books need to know about the federation.
    pub fn facts(&self) -> Facts {
        Facts {
            cfg: self.cfg.clone(),
            dataset: self.dataset.name.clone(),
            model_parameters: self.init.len(),
            malicious: self.malicious.clone(),
            benign: self.benign.clone(),
            test_sizes: (0..self.cfg.clients)
                .map(|i| self.test_data(i).len())
                .collect(),
            regression: self.regression,
            threads: self.threads(),
        }
    }

    /// Label-flipping clients see labels y → C−1−y (train and validation).
    fn flip(&self, i: usize) -> Option<usize> {
        (self.cfg.attack.kind == AttackKind::LabelFlip && self.is_malicious[i])
            .then_some(self.dataset.num_classes)
    }

    /// Client `i`'s training and validation data.
    pub fn client_data(&self, i: usize) -> ClientData<'_> {
        let c = &self.partition.clients[i];
        let flip_labels = self.flip(i);
        ClientData {
            train: LocalData {
                flip_labels,
                augment: self.cfg.train.augment,
                ..self.view(&self.dataset.train, i, &c.train)
            },
            val: LocalData {
                flip_labels,
                ..self.view(&self.dataset.train, i, &c.val)
            },
        }
    }

    /// Client `i`'s test data (never flipped: it measures the truth).
    pub fn test_data(&self, i: usize) -> LocalData<'_> {
        self.view(&self.dataset.test, i, &self.partition.clients[i].test)
    }

    /// Client `i`'s rows `indices` of `split`: labelled, or regression
    /// targets with the client's own scale (natural clients are the
    /// sensors or users).
    fn view<'a>(
        &'a self,
        split: &'a fedweave_data::Split,
        i: usize,
        indices: &'a [usize],
    ) -> LocalData<'a> {
        let ds = &self.dataset;
        let targets = match ds.task {
            Task::Classification => {
                return LocalData::new(&split.features, &split.labels, indices);
            }
            Task::Forecasting { horizon } => horizon,
            Task::Regression { targets } => targets,
        };
        let scale = ds
            .target_scales
            .as_ref()
            .and_then(|s| s.get(i))
            .map_or((0.0, 1.0), |s| (s.mean, s.std));
        LocalData::forecasting(&split.features, &split.targets, targets, scale, indices)
    }
}
