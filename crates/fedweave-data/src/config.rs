//! The `[data]` and `[partition]` configuration sections.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::DataError;

/// The `[data]` section: which dataset to load and how.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataConfig {
    /// Dataset name, one of [`crate::dataset_names`]. Default `"digits"`.
    pub dataset: String,
    /// Where a dataset read from disk lives: the directory holding the IDX
    /// files for `fashion-mnist` / `mnist`, or a CSV(.gz) file replacing the
    /// bundled one for `digits`. Not used by `synthetic`.
    pub path: Option<PathBuf>,
    /// Parameters of the `synthetic` dataset.
    pub synthetic: SyntheticConfig,
    /// Standardise pixels with the dataset's fixed mean and standard
    /// deviation (see [`crate::load_dataset`]). Default `true`.
    pub normalize: bool,
    /// Keep only this many training samples (a seeded, class-stratified
    /// subsample); the test split is untouched. For fast tests.
    /// Classification only.
    pub max_train_samples: Option<usize>,
    /// Forecasting: past steps each sample sees. Default 12.
    pub input_steps: usize,
    /// Forecasting: future steps each sample predicts. Default 3.
    pub horizon: usize,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            dataset: "digits".to_string(),
            path: None,
            synthetic: SyntheticConfig::default(),
            normalize: true,
            max_train_samples: None,
            input_steps: 12,
            horizon: 3,
        }
    }
}

/// The `[data.synthetic]` section: FedProx's Synthetic(α, β) generator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SyntheticConfig {
    /// Standard deviation of the per-client model mean `u_k ~ N(0, α²)`:
    /// how much the clients' labelling functions differ. Default 1.0.
    pub alpha: f64,
    /// Standard deviation of the per-client feature mean `B_k ~ N(0, β²)`:
    /// how much the clients' inputs differ. Default 1.0.
    pub beta: f64,
    /// Mean number of samples per client (train + test); sizes are
    /// log-normal with this mean, at least a quarter of it. Default 200.
    pub samples_per_client_mean: usize,
    /// Feature dimension. Default 60.
    pub dim: usize,
    /// Number of classes. Default 10.
    pub classes: usize,
    /// One shared labelling model and zero feature means for every client
    /// (FedProx's "Synthetic IID"). Default `false`.
    pub iid: bool,
    /// Number of natural clients generated; set it to the experiment's
    /// client count to use `partition.kind = "natural"`. Default 10.
    pub clients: usize,
}

impl Default for SyntheticConfig {
    fn default() -> Self {
        SyntheticConfig {
            alpha: 1.0,
            beta: 1.0,
            samples_per_client_mean: 200,
            dim: 60,
            classes: 10,
            iid: false,
            clients: 10,
        }
    }
}

/// How the training pool is split across clients.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PartitionKind {
    /// A random permutation cut into near-equal parts.
    #[default]
    Iid,
    /// Per-class Dirichlet(β) proportions with the balance trick.
    Dirichlet,
    /// pFedGraph's label-skew split: consecutive label groups of size k.
    Pathological,
    /// Sort by label, cut N·k shards, k random shards per client.
    Shards,
    /// FedDWA's "practical 1": client groups sharing dominant classes.
    Groups,
    /// The dataset's own clients.
    Natural,
}

impl PartitionKind {
    /// The configuration spelling of this kind, e.g. `"pathological"`.
    pub fn as_str(self) -> &'static str {
        match self {
            PartitionKind::Iid => "iid",
            PartitionKind::Dirichlet => "dirichlet",
            PartitionKind::Pathological => "pathological",
            PartitionKind::Shards => "shards",
            PartitionKind::Groups => "groups",
            PartitionKind::Natural => "natural",
        }
    }
}

impl fmt::Display for PartitionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `[partition]` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PartitionConfig {
    /// Which partition. Default `iid`.
    pub kind: PartitionKind,
    /// `pathological`: labels per client group (k). Default 2.
    pub classes_per_client: usize,
    /// `dirichlet`: concentration β (smaller is more skewed). Default 0.1.
    pub beta: f64,
    /// `shards`: shards per client. Default 2.
    pub shards_per_client: usize,
    /// `groups`: number of client groups. Default 4.
    pub groups: usize,
    /// `groups`: fraction of each class given to its owning group. Default 0.8.
    pub dominant_fraction: f64,
    /// `dirichlet`: every client must get at least this many samples
    /// (train + validation). Default 10.
    pub min_samples: usize,
    /// `dirichlet`: how many draws to try before giving up. Default 1000.
    pub max_retries: usize,
    /// Fraction of each client's share held out for validation. Default 0.2.
    pub val_fraction: f64,
}

impl Default for PartitionConfig {
    fn default() -> Self {
        PartitionConfig {
            kind: PartitionKind::Iid,
            classes_per_client: 2,
            beta: 0.1,
            shards_per_client: 2,
            groups: 4,
            dominant_fraction: 0.8,
            min_samples: 10,
            max_retries: 1000,
            val_fraction: 0.2,
        }
    }
}

impl PartitionConfig {
    /// Checks the settings that do not depend on the dataset (ranges of the
    /// keys the chosen kind uses), so a run can reject them before loading
    /// anything. [`crate::partition`] calls it too.
    pub fn validate(&self, clients: usize) -> Result<(), DataError> {
        if clients == 0 {
            return Err(DataError::config("clients", "must be at least 1"));
        }
        if !(self.val_fraction.is_finite() && (0.0..1.0).contains(&self.val_fraction)) {
            return Err(DataError::config(
                "partition.val_fraction",
                format!("must be in [0, 1), got {}", self.val_fraction),
            ));
        }
        match self.kind {
            PartitionKind::Iid | PartitionKind::Natural => {}
            PartitionKind::Dirichlet => {
                if !(self.beta.is_finite() && self.beta > 0.0) {
                    return Err(DataError::config(
                        "partition.beta",
                        format!("must be a positive number, got {}", self.beta),
                    ));
                }
                if self.max_retries == 0 {
                    return Err(DataError::config(
                        "partition.max_retries",
                        "must be at least 1",
                    ));
                }
            }
            PartitionKind::Pathological => {
                if self.classes_per_client == 0 {
                    return Err(DataError::config(
                        "partition.classes_per_client",
                        "must be at least 1",
                    ));
                }
            }
            PartitionKind::Shards => {
                if self.shards_per_client == 0 {
                    return Err(DataError::config(
                        "partition.shards_per_client",
                        "must be at least 1",
                    ));
                }
            }
            PartitionKind::Groups => {
                if self.groups == 0 {
                    return Err(DataError::config("partition.groups", "must be at least 1"));
                }
                if self.groups > clients {
                    return Err(DataError::config(
                        "partition.groups",
                        format!(
                            "{} groups need at least as many clients, but clients = {clients}",
                            self.groups
                        ),
                    ));
                }
                if !(self.dominant_fraction.is_finite()
                    && (0.0..=1.0).contains(&self.dominant_fraction))
                {
                    return Err(DataError::config(
                        "partition.dominant_fraction",
                        format!("must be in [0, 1], got {}", self.dominant_fraction),
                    ));
                }
            }
        }
        Ok(())
    }
}
