//! The `[data]` and `[partition]` configuration sections.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::DataError;

/// The `[data]` section: which dataset to load and how.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataConfig {
    /// Dataset name, one of [`crate::datasets`]. Default `"digits"`.
    pub dataset: String,
    /// Where a dataset read from disk lives: the directory holding the IDX
    /// files for `fashion-mnist` / `mnist`, or a CSV(.gz) file replacing the
    /// bundled one for `digits`; for the distributed formats (`cifar10`,
    /// `emnist`, `femnist`, …) the extracted folder or its parent. Not used
    /// by `synthetic`.
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
    /// Datasets with natural users (`femnist`, `shakespeare`,
    /// `movielens-100k`): keep only the first `users` of them (LEAF: in the
    /// order of the `users` lists of the sorted `train/*.json`; MovieLens:
    /// by ascending user id), an error when there are fewer. Set it to the
    /// experiment's `clients` for `partition.kind = "natural"`. Default: all.
    pub users: Option<usize>,
    /// `cifar100`: use the 20 coarse (superclass) labels instead of the 100
    /// fine ones. Default `false`.
    pub coarse_labels: bool,
    /// `emnist`: which split — `byclass` (62 classes), `bymerge` (47),
    /// `balanced` (47), `letters` (26), `digits` (10) or `mnist` (10).
    /// Default `balanced`.
    pub emnist_split: String,
    /// `yahoo-answers`: vocabulary size including `<pad>` (id 0) and `<unk>`
    /// (id 1); the most frequent training tokens fill the rest. Default 50000.
    pub vocab_size: usize,
    /// `yahoo-answers`: tokens kept per sample (the first ones; shorter
    /// texts are padded with `<pad>`). Default 256.
    pub seq_len: usize,
    /// `csv`: the number of classes (every label is below it; all clients
    /// must agree, since none sees the others' files).
    pub classes: Option<usize>,
    /// `csv`: the shape of one sample, e.g. `[1, 28, 28]` for a CNN
    /// (default: flat, `[d]`).
    pub shape: Option<Vec<usize>>,
    /// `image-folder`: the size every image is resized to (bilinear), an
    /// int for a square (`32`) or `[height, width]`. Default: no resizing,
    /// every image must then have the size of the first one read.
    pub image_size: Option<ImageSize>,
    /// `image-folder`: 3 (RGB, the default) or 1 (grayscale).
    pub channels: Option<usize>,
    /// `image-folder`: per-channel means subtracted from the pixels in
    /// [0, 1] (one value per channel; needs `data.std`). Default: none,
    /// values stay in [0, 1].
    pub mean: Option<Vec<f32>>,
    /// `image-folder`: per-channel standard deviations divided by (with
    /// `data.mean`).
    pub std: Option<Vec<f32>>,
}

/// `data.image_size`: `32` (a square) or `[height, width]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ImageSize {
    /// A square of this side.
    Square(usize),
    /// `[height, width]`.
    HeightWidth([usize; 2]),
}

impl ImageSize {
    /// `[height, width]`.
    pub fn height_width(self) -> [usize; 2] {
        match self {
            ImageSize::Square(s) => [s, s],
            ImageSize::HeightWidth(hw) => hw,
        }
    }
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
            users: None,
            coarse_labels: false,
            emnist_split: "balanced".to_string(),
            vocab_size: 50_000,
            seq_len: 256,
            classes: None,
            shape: None,
            image_size: None,
            channels: None,
            mean: None,
            std: None,
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
///
/// The first six kinds are fedweave's own; the others reproduce a paper's or
/// a library's recipe exactly (see the module documentation of
/// [`crate::partition`] for each one's precise definition).
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
    /// Client groups sharing dominant classes (FedDWA's code: each class
    /// has one owning group).
    Groups,
    /// The dataset's own clients.
    Natural,
    /// FedDWA's "practical 1" as the paper states it: equal-size groups of
    /// clients, `dominant_classes` dominant classes per group, and the same
    /// number of samples (and the same class counts) for every client of a
    /// group.
    #[serde(rename = "feddwa_groups")]
    FeddwaGroups,
    /// DPFL's "Patho(k)": k random classes per client; each class spread
    /// over the clients holding it by Dirichlet(`within_class_beta`).
    #[serde(rename = "dpfl_patho")]
    DpflPatho,
    /// PFLlib's `pat`: classes handed out in order to the clients with
    /// class slots left, `classes_per_client` slots each.
    #[serde(rename = "pfllib_pat")]
    PfllibPat,
    /// PFLlib's `dir`: Dirichlet(β) with the balance trick, redrawn until
    /// every client has `least_samples`.
    #[serde(rename = "pfllib_dir")]
    PfllibDir,
    /// PFLlib's `exdir`: `classes_per_client` random classes per client,
    /// then Dirichlet(β) over each class's holders with the balance trick.
    #[serde(rename = "pfllib_exdir")]
    PfllibExdir,
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
            PartitionKind::FeddwaGroups => "feddwa_groups",
            PartitionKind::DpflPatho => "dpfl_patho",
            PartitionKind::PfllibPat => "pfllib_pat",
            PartitionKind::PfllibDir => "pfllib_dir",
            PartitionKind::PfllibExdir => "pfllib_exdir",
        }
    }
}

impl fmt::Display for PartitionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which pool the clients' test sets come from (`partition.split`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SplitKind {
    /// The dataset's own train/test split: the partition splits the training
    /// pool, and each client's test set is drawn from the test pool following
    /// its label distribution.
    #[default]
    Given,
    /// Train and test merged into one pool (PFLlib, FedDWA's practical 2,
    /// FedAGHN); the partition splits the merged pool and each client's
    /// share is cut into test (`test_fraction`), then validation
    /// (`val_fraction` of the rest) and train. Needs [`crate::prepare`].
    Merged,
}

impl SplitKind {
    /// The configuration spelling, `"given"` or `"merged"`.
    pub fn as_str(self) -> &'static str {
        match self {
            SplitKind::Given => "given",
            SplitKind::Merged => "merged",
        }
    }
}

impl fmt::Display for SplitKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `[partition]` section.
///
/// Recipes for the papers' settings (all keys not named keep their
/// defaults):
///
/// | setting | keys |
/// |---|---|
/// | FedDWA practical 1 | `kind = "feddwa_groups"`, `groups = 4`, `dominant_classes = 3` (20 for 100 classes), `dominant_fraction = 0.8` |
/// | FedDWA practical 2 | `kind = "dirichlet"`, `split = "merged"`, `test_fraction = 0.2`, `min_samples = 20`, `beta = 0.1` (code; paper 0.07), `val_fraction = 0` (as the paper: no validation) or keep 0.2 for fedweave's best-validation protocol |
/// | DPFL Patho(3) | `kind = "dpfl_patho"`, `classes_per_client = 3`, `within_class_beta = 0.5`, `min_samples = 10` |
/// | FedAGHN | `kind = "pfllib_dir"`, `split = "merged"`, `test_fraction = 0.2`, `val_fraction = 0.125` (70/10/20), `least_samples = 1`, `beta = 0.1` |
/// | PFLlib | `kind = "pfllib_pat" \| "pfllib_dir" \| "pfllib_exdir"`, `split = "merged"`, `test_fraction = 0.25`, `val_fraction = 0`, `balance`, `classes_per_client`, `beta` |
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PartitionConfig {
    /// Which partition. Default `iid`.
    pub kind: PartitionKind,
    /// `pathological`: labels per client group (k); `dpfl_patho`: classes
    /// per client (k); `pfllib_pat` / `pfllib_exdir`: PFLlib's
    /// `class_per_client`. Default 2.
    pub classes_per_client: usize,
    /// `dirichlet`, `pfllib_dir`, `pfllib_exdir`: concentration β (PFLlib's
    /// `alpha`; smaller is more skewed). Default 0.1.
    pub beta: f64,
    /// `shards`: shards per client. Default 2.
    pub shards_per_client: usize,
    /// `groups`, `feddwa_groups`: number of client groups (for
    /// `feddwa_groups` it must divide `clients`). Default 4.
    pub groups: usize,
    /// `groups`: fraction of each class given to its owning group;
    /// `feddwa_groups`: fraction of each client's samples drawn from its
    /// group's dominant classes. Default 0.8.
    pub dominant_fraction: f64,
    /// `feddwa_groups`: dominant classes per group (3 in FedDWA for 10
    /// classes, 20 for 100). Default 3.
    pub dominant_classes: usize,
    /// `feddwa_groups`: samples (train + validation, or the whole share
    /// with `split = "merged"`) of every client; default (unset) the largest
    /// size the data allows. Every other kind but `natural`: a cap — a
    /// client whose share is larger keeps a seeded random `n` of it (the
    /// rest is left unused), as pFedGraph's paper samples 3,072 per client.
    pub samples_per_client: Option<usize>,
    /// `dirichlet`: every client must get at least this many samples
    /// (train + validation); `dpfl_patho`: every holder of a class must get
    /// at least this many samples of it. Default 10.
    pub min_samples: usize,
    /// `dpfl_patho`: concentration of the Dirichlet that spreads a class
    /// over its holders. Default 0.5.
    pub within_class_beta: f64,
    /// `pfllib_pat`: PFLlib's `balance` (equal per-class shares instead of
    /// random ones). Default `false`, as PFLlib's `separate_data`.
    pub balance: bool,
    /// `pfllib_pat` (unbalanced), `pfllib_dir`, `pfllib_exdir`: PFLlib's
    /// `least_samples` (`min_require_size` for `exdir`). Unset: PFLlib's own,
    /// `⌊min(10 / test_fraction, pool / clients / 2)⌋` for `pat` and `dir`
    /// (its batch size 10), 10 for `exdir`.
    pub least_samples: Option<usize>,
    /// `dirichlet`, `pfllib_dir`, `pfllib_exdir`: how many draws of the
    /// whole partition to try before giving up; `dpfl_patho`: per class,
    /// `1000 · max_retries` draws of the class's proportions. Default 1000.
    pub max_retries: usize,
    /// Fraction of each client's share (after the test cut with `split =
    /// "merged"`) held out for validation. Default 0.2.
    pub val_fraction: f64,
    /// Where test sets come from: `given` (default) or `merged`.
    pub split: SplitKind,
    /// `split = "merged"`: fraction of each client's share held out for
    /// test, `n − ⌊(1 − test_fraction)·n⌋` samples (scikit-learn's
    /// `train_test_split` with `train_size = 1 − test_fraction`). Default
    /// 0.25 (PFLlib's `train_ratio = 0.75`).
    pub test_fraction: f64,
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
            dominant_classes: 3,
            samples_per_client: None,
            min_samples: 10,
            within_class_beta: 0.5,
            balance: false,
            least_samples: None,
            max_retries: 1000,
            val_fraction: 0.2,
            split: SplitKind::Given,
            test_fraction: 0.25,
        }
    }
}

impl PartitionConfig {
    /// Checks the settings that do not depend on the dataset (ranges of the
    /// keys the chosen kind uses), so a run can reject them before loading
    /// anything. [`crate::partition`] and [`crate::prepare`] call it too.
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
        if self.split == SplitKind::Merged {
            if !(self.test_fraction.is_finite()
                && self.test_fraction > 0.0
                && self.test_fraction < 1.0)
            {
                return Err(DataError::config(
                    "partition.test_fraction",
                    format!(
                        "must be in (0, 1) with split = \"merged\", got {}",
                        self.test_fraction
                    ),
                ));
            }
            if self.kind == PartitionKind::Natural {
                return Err(DataError::config(
                    "partition.split",
                    "partition.kind = \"natural\" keeps the dataset's own test sets; use split = \"given\"",
                ));
            }
        }
        let positive = |key: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(DataError::config(
                    key,
                    format!("must be a positive number, got {v}"),
                ))
            }
        };
        let at_least_one = |key: &str, v: usize| {
            if v == 0 {
                Err(DataError::config(key, "must be at least 1"))
            } else {
                Ok(())
            }
        };
        match self.kind {
            PartitionKind::Iid | PartitionKind::Natural => {}
            PartitionKind::Dirichlet | PartitionKind::PfllibDir => {
                positive("partition.beta", self.beta)?;
                at_least_one("partition.max_retries", self.max_retries)?;
            }
            PartitionKind::PfllibExdir => {
                positive("partition.beta", self.beta)?;
                at_least_one("partition.max_retries", self.max_retries)?;
                at_least_one("partition.classes_per_client", self.classes_per_client)?;
            }
            PartitionKind::Pathological | PartitionKind::PfllibPat => {
                at_least_one("partition.classes_per_client", self.classes_per_client)?;
            }
            PartitionKind::DpflPatho => {
                at_least_one("partition.classes_per_client", self.classes_per_client)?;
                positive("partition.within_class_beta", self.within_class_beta)?;
                at_least_one("partition.max_retries", self.max_retries)?;
            }
            PartitionKind::Shards => {
                at_least_one("partition.shards_per_client", self.shards_per_client)?;
            }
            PartitionKind::Groups | PartitionKind::FeddwaGroups => {
                at_least_one("partition.groups", self.groups)?;
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
                if self.kind == PartitionKind::FeddwaGroups {
                    if !clients.is_multiple_of(self.groups) {
                        return Err(DataError::config(
                            "partition.groups",
                            format!(
                                "feddwa_groups needs groups of equal size: {} groups do not divide \
                                 clients = {clients}",
                                self.groups
                            ),
                        ));
                    }
                    at_least_one("partition.dominant_classes", self.dominant_classes)?;
                }
            }
        }
        match self.samples_per_client {
            Some(_) if self.kind == PartitionKind::Natural => Err(DataError::config(
                "partition.samples_per_client",
                "natural clients keep the samples they come with; subsample their files beforehand",
            )),
            Some(0) => Err(DataError::config(
                "partition.samples_per_client",
                "must be at least 1 (omit it to keep every client's whole share)",
            )),
            _ => Ok(()),
        }
    }

    /// A one-line description of the partition with the keys its kind uses,
    /// e.g. `dirichlet(beta=0.1), merged(test_fraction=0.2)`.
    pub fn describe(&self) -> String {
        let kind = match self.kind {
            PartitionKind::Iid | PartitionKind::Natural => self.kind.to_string(),
            PartitionKind::Dirichlet => format!("dirichlet(beta={})", self.beta),
            PartitionKind::Pathological => {
                format!(
                    "pathological(classes_per_client={})",
                    self.classes_per_client
                )
            }
            PartitionKind::Shards => {
                format!("shards(shards_per_client={})", self.shards_per_client)
            }
            PartitionKind::Groups => format!(
                "groups(groups={}, dominant_fraction={})",
                self.groups, self.dominant_fraction
            ),
            PartitionKind::FeddwaGroups => format!(
                "feddwa_groups(groups={}, dominant_classes={}, dominant_fraction={}{})",
                self.groups,
                self.dominant_classes,
                self.dominant_fraction,
                self.samples_per_client
                    .map(|n| format!(", samples_per_client={n}"))
                    .unwrap_or_default()
            ),
            PartitionKind::DpflPatho => format!(
                "dpfl_patho(classes_per_client={}, within_class_beta={}, min_samples={})",
                self.classes_per_client, self.within_class_beta, self.min_samples
            ),
            PartitionKind::PfllibPat => format!(
                "pfllib_pat(classes_per_client={}, balance={})",
                self.classes_per_client, self.balance
            ),
            PartitionKind::PfllibDir => format!("pfllib_dir(beta={})", self.beta),
            PartitionKind::PfllibExdir => format!(
                "pfllib_exdir(classes_per_client={}, beta={})",
                self.classes_per_client, self.beta
            ),
        };
        let kind = match self.samples_per_client {
            Some(n) if self.kind != PartitionKind::FeddwaGroups => {
                format!("{kind}, at most {n} samples per client")
            }
            _ => kind,
        };
        match self.split {
            SplitKind::Given => kind,
            SplitKind::Merged => format!("{kind}, merged(test_fraction={})", self.test_fraction),
        }
    }
}
