//! In-memory datasets and the dispatcher that loads them by name.

use fedweave_core::{Purpose, rng_stream};
use rand::seq::SliceRandom;

use crate::registry::{DataPath, DatasetSpec, Loader};
use crate::{DataConfig, DataError};

/// Samples of one split: features row-major, and one label (classification)
/// or `target_len` targets (forecasting) per sample.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Split {
    /// `len() × feature_len` values, row-major, already normalised.
    pub features: Vec<f32>,
    /// One class label per sample, each below the dataset's `num_classes`
    /// (empty for forecasting).
    pub labels: Vec<u32>,
    /// Forecasting: `target_len` z-scored values per sample, NaN where the
    /// sensor did not observe (empty for classification).
    pub targets: Vec<f32>,
    /// Targets per sample; 0 for classification.
    pub target_len: usize,
}

impl Split {
    /// An empty forecasting split with `target_len` targets per sample.
    pub fn forecasting(target_len: usize) -> Self {
        Split {
            target_len,
            ..Split::default()
        }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.targets
            .len()
            .checked_div(self.target_len)
            .unwrap_or(self.labels.len())
    }

    /// Whether the split holds no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The features of sample `i`.
    ///
    /// # Panics
    /// If `i` is out of range or `feature_len` is not the dataset's.
    pub fn row(&self, i: usize, feature_len: usize) -> &[f32] {
        &self.features[i * feature_len..(i + 1) * feature_len]
    }

    /// Keeps only the samples at `keep` (in that order); classification
    /// splits only (subsampling is stratified by label).
    fn select(&self, keep: &[usize], feature_len: usize) -> Split {
        let mut features = Vec::with_capacity(keep.len() * feature_len);
        let mut labels = Vec::with_capacity(keep.len());
        for &i in keep {
            features.extend_from_slice(self.row(i, feature_len));
            labels.push(self.labels[i]);
        }
        Split {
            features,
            labels,
            ..Split::default()
        }
    }
}

/// What the dataset's samples are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    /// One class label per sample.
    Classification,
    /// `horizon` future values per sample (regression).
    Forecasting {
        /// Steps predicted.
        horizon: usize,
    },
    /// `targets` real values per sample that are not a time series
    /// (`movielens-100k`: one rating). Like forecasting, the split's
    /// `targets` hold them, every sample belongs to a natural client with a
    /// fixed validation block, and `target_scales` maps them to their unit.
    Regression {
        /// Values predicted per sample.
        targets: usize,
    },
}

/// What a sample's feature values are; models pick their input layer by it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InputKind {
    /// Real values (pixels, readings), already normalised.
    #[default]
    Dense,
    /// A sequence of token ids stored as f32 (exact: every id is below
    /// 2²⁴), each below `vocab_size`: `feature_shape = [length]`. With
    /// `padded`, id 0 is `<pad>` and fills sequences shorter than `length`.
    Tokens {
        /// Number of distinct ids (embedding rows).
        vocab_size: usize,
        /// Whether id 0 is padding.
        padded: bool,
    },
    /// One categorical id per feature position, stored as f32: position `j`
    /// is below `cardinalities[j]` (`movielens-100k`: user, item).
    Categorical {
        /// Number of distinct ids of each position.
        cardinalities: Vec<usize>,
    },
}

/// Maps a natural client's z-scored targets back to their unit (°C,
/// vehicles): value = z·std + mean. Errors are reported in that unit.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct TargetScale {
    /// Training mean.
    pub mean: f32,
    /// Training standard deviation.
    pub std: f32,
}

/// A client that exists in the data itself (e.g. one synthetic device).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NaturalClient {
    /// Indices into the dataset's training split.
    pub train: Vec<usize>,
    /// Validation indices into the training split. When empty, the
    /// partition carves `val_fraction` off `train`; forecasting sets it to a
    /// chronological block after the training windows.
    pub val: Vec<usize>,
    /// Indices into the dataset's test split.
    pub test: Vec<usize>,
    /// Held on another machine and not loaded here (a networked client
    /// process loads only the clients it hosts): empty, and exempt from the
    /// partition's size checks.
    pub remote: bool,
}

/// A loaded dataset: a training pool, a test pool and its shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// The dataset's name, as in the configuration.
    pub name: String,
    /// Number of classes; every label is below it.
    pub num_classes: usize,
    /// Shape of one sample: `[1, 8, 8]` (digits), `[1, 28, 28]`
    /// (Fashion-MNIST, MNIST), `[dim]` (synthetic).
    pub feature_shape: Vec<usize>,
    /// The training pool that partitions split across clients.
    pub train: Split,
    /// The test pool.
    pub test: Split,
    /// The data's own clients, if it has any (`synthetic` does).
    pub natural_clients: Option<Vec<NaturalClient>>,
    /// Classification or forecasting.
    pub task: Task,
    /// A relation graph between the natural clients, if the data has one
    /// (the weather-station graph).
    pub relation_graph: Option<fedweave_core::RelationGraph>,
    /// Forecasting: per natural client, the scale of its targets.
    pub target_scales: Option<Vec<TargetScale>>,
    /// What the feature values are (dense values, token ids, categorical ids).
    pub input: InputKind,
}

impl Dataset {
    /// A classification dataset of dense features (no graph, no target
    /// scales).
    pub(crate) fn classification(
        name: &str,
        num_classes: usize,
        feature_shape: Vec<usize>,
        (train, test): (Split, Split),
        natural_clients: Option<Vec<NaturalClient>>,
    ) -> Self {
        Dataset {
            name: name.to_string(),
            num_classes,
            feature_shape,
            train,
            test,
            natural_clients,
            task: Task::Classification,
            relation_graph: None,
            target_scales: None,
            input: InputKind::Dense,
        }
    }

    /// Number of values per sample (the product of `feature_shape`).
    pub fn feature_len(&self) -> usize {
        self.feature_shape.iter().product()
    }
}

/// Loads the data of a federation of `clients` clients: [`load_dataset`],
/// except for the datasets of one set of files per client (`csv`,
/// `image-folder`), of which only the `hosted` clients are read when given
/// (a networked client process), the others being marked remote.
pub fn load_federation(
    cfg: &DataConfig,
    seed: u64,
    clients: usize,
    hosted: Option<&[usize]>,
) -> Result<Dataset, DataError> {
    match spec_of(cfg)?.loader {
        Loader::PerClient(load) => {
            check_path(cfg)?;
            load(cfg, clients, hosted)
        }
        Loader::Whole(_) => load_dataset(cfg, seed),
    }
}

/// Where the Debian package `dataset-fashion-mnist` installs its files.
pub const FASHION_MNIST_DEFAULT_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// Loads the dataset `cfg.dataset`, one of [`crate::datasets`] (the
/// registry holds each one's loader).
///
/// - `digits`: the bundled file (or `cfg.path`), pixels / 16, a fixed
///   stratified split independent of `seed`; `normalize` standardises with
///   mean 0.3053 and std 0.3760 (pixel statistics of all 1,797 images).
/// - `fashion-mnist`, `mnist`: IDX files (raw or gzip) in `cfg.path`
///   (Fashion-MNIST defaults to [`FASHION_MNIST_DEFAULT_DIR`]); pixels / 255,
///   then with `normalize` `(x − 0.2860) / 0.3530` (Fashion-MNIST) or
///   `(x − 0.1307) / 0.3081` (MNIST).
/// - `synthetic`: generated from `seed` (streams `Purpose::Dataset`, client =
///   the synthetic client's index; `u64::MAX` for the shared IID model);
///   `normalize` has no effect.
/// - `cifar10`, `cifar100`, `cinic10`, `emnist`, `femnist`, `shakespeare`,
///   `movielens-100k`, `yahoo-answers`, `tiny-imagenet`, `pfllib`: the files
///   their authors distribute (or PFLlib writes), in `cfg.path`; each module
///   documents its layout, normalisation and split.
///
/// `max_train_samples` then keeps a class-stratified subsample of the
/// training split drawn from `rng_stream(seed, 1, u64::MAX, Purpose::Dataset)`,
/// in the original order; natural clients are re-indexed accordingly.
pub fn load_dataset(cfg: &DataConfig, seed: u64) -> Result<Dataset, DataError> {
    let spec = spec_of(cfg)?;
    let Loader::Whole(load) = spec.loader else {
        return Err(DataError::config(
            "data.dataset",
            format!(
                "dataset {} is one set of files per client: load it with load_federation",
                spec.name
            ),
        ));
    };
    check_path(cfg)?;
    let ds = load(cfg, seed)?;
    match cfg.max_train_samples {
        None => Ok(ds),
        Some(0) => Err(DataError::config(
            "data.max_train_samples",
            "must be at least 1 (omit it to keep the whole training split)",
        )),
        Some(m) => Ok(subsample_train(ds, m, seed)),
    }
}

/// The registry entry of `cfg.dataset`, or an error listing every name.
fn spec_of(cfg: &DataConfig) -> Result<&'static DatasetSpec, DataError> {
    crate::dataset(&cfg.dataset).ok_or_else(|| {
        let known: Vec<&str> = crate::datasets().iter().map(|d| d.name).collect();
        DataError::config(
            "data.dataset",
            format!(
                "unknown dataset {:?}; known: {}",
                cfg.dataset,
                known.join(", ")
            ),
        )
    })
}

/// The names of the datasets for which `keep` holds, comma-separated.
fn names_where(keep: fn(&DatasetSpec) -> bool) -> String {
    let names: Vec<&str> = crate::datasets()
        .iter()
        .filter(|d| keep(d))
        .map(|d| d.name)
        .collect();
    names.join(", ")
}

/// The checks every dataset shares: `data.path` set exactly where the
/// registry needs it, `data.users` only for datasets with natural users,
/// the image keys only where they apply.
fn check_path(cfg: &DataConfig) -> Result<(), DataError> {
    let spec = spec_of(cfg)?;
    if cfg.users.is_some() && !spec.users {
        return Err(DataError::config(
            "data.users",
            format!(
                "only {} have natural users, not {:?} (synthetic: data.synthetic.clients)",
                names_where(|d| d.users),
                cfg.dataset
            ),
        ));
    }
    let image_keys = [
        ("data.image_size", cfg.image_size.is_some()),
        ("data.channels", cfg.channels.is_some()),
        ("data.mean", cfg.mean.is_some()),
        ("data.std", cfg.std.is_some()),
    ];
    if let Some((key, _)) = image_keys.iter().find(|(_, set)| *set && !spec.image_keys) {
        return Err(DataError::config(
            *key,
            format!(
                "applies to {} only, not to dataset {:?}; remove it",
                names_where(|d| d.image_keys),
                spec.name
            ),
        ));
    }
    match (spec.path, &cfg.path) {
        (DataPath::Unused, Some(p)) => Err(DataError::config(
            "data.path",
            format!(
                "dataset {} is generated, not read; remove data.path ({})",
                spec.name,
                p.display()
            ),
        )),
        (DataPath::Required(what), None) => Err(DataError::config(
            "data.path",
            format!("dataset {} needs data.path: {what}", spec.name),
        )),
        _ => Ok(()),
    }
}

/// Keeps a seeded, class-stratified subsample of `m` training samples.
fn subsample_train(mut ds: Dataset, m: usize, seed: u64) -> Dataset {
    let n = ds.train.len();
    if m >= n {
        return ds;
    }
    let mut rng = rng_stream(seed, 1, u64::MAX, Purpose::Dataset);
    let mut by_class: Vec<Vec<usize>> = vec![Vec::new(); ds.num_classes];
    for (i, &y) in ds.train.labels.iter().enumerate() {
        by_class[y as usize].push(i);
    }
    // Largest-remainder quotas: floor(n_c·m/n), then +1 for the largest
    // fractional parts (ties by class id) until the total is m.
    let mut quota: Vec<usize> = by_class.iter().map(|c| c.len() * m / n).collect();
    let mut order: Vec<usize> = (0..ds.num_classes).collect();
    order.sort_by_key(|&c| std::cmp::Reverse((by_class[c].len() * m) % n));
    let mut missing = m - quota.iter().sum::<usize>();
    for &c in order.iter().cycle() {
        if missing == 0 {
            break;
        }
        if quota[c] < by_class[c].len() {
            quota[c] += 1;
            missing -= 1;
        }
    }
    let mut keep = Vec::with_capacity(m);
    for (idx, q) in by_class.iter_mut().zip(&quota) {
        idx.shuffle(&mut rng);
        keep.extend_from_slice(&idx[..*q]);
    }
    keep.sort_unstable();
    let fl = ds.feature_len();
    ds.train = ds.train.select(&keep, fl);
    if let Some(clients) = &mut ds.natural_clients {
        let mut new_index = vec![usize::MAX; n];
        for (new, &old) in keep.iter().enumerate() {
            new_index[old] = new;
        }
        for c in clients.iter_mut() {
            c.train = c
                .train
                .iter()
                .map(|&i| new_index[i])
                .filter(|&i| i != usize::MAX)
                .collect();
        }
    }
    ds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsample_is_stratified_and_exact() {
        let cfg = DataConfig {
            max_train_samples: Some(200),
            ..DataConfig::default()
        };
        let ds = load_dataset(&cfg, 3).unwrap();
        assert_eq!(ds.train.len(), 200);
        assert_eq!(ds.train.features.len(), 200 * 64);
        let mut counts = [0usize; 10];
        for &y in &ds.train.labels {
            counts[y as usize] += 1;
        }
        for c in counts {
            assert!((19..=21).contains(&c), "class count {c}");
        }
        assert_eq!(ds.test.len(), 445);
        let again = load_dataset(&cfg, 3).unwrap();
        assert_eq!(ds.train, again.train);
        let other = load_dataset(&cfg, 4).unwrap();
        assert_ne!(ds.train, other.train);
    }

    #[test]
    fn subsample_remaps_natural_clients() {
        let cfg = DataConfig {
            dataset: "synthetic".into(),
            max_train_samples: Some(300),
            ..DataConfig::default()
        };
        let ds = load_dataset(&cfg, 9).unwrap();
        assert_eq!(ds.train.len(), 300);
        let clients = ds.natural_clients.unwrap();
        let total: usize = clients.iter().map(|c| c.train.len()).sum();
        assert_eq!(total, 300);
        let mut all: Vec<usize> = clients.iter().flat_map(|c| c.train.clone()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..300).collect::<Vec<_>>());
    }

    #[test]
    fn unknown_dataset_and_zero_subsample_name_the_key() {
        let cfg = DataConfig {
            dataset: "cifar-11".into(),
            ..DataConfig::default()
        };
        let e = load_dataset(&cfg, 0).unwrap_err().to_string();
        assert!(e.contains("data.dataset") && e.contains("cifar-11"), "{e}");
        let cfg = DataConfig {
            max_train_samples: Some(0),
            ..DataConfig::default()
        };
        let e = load_dataset(&cfg, 0).unwrap_err().to_string();
        assert!(e.contains("data.max_train_samples"), "{e}");
        let cfg = DataConfig {
            dataset: "mnist".into(),
            ..DataConfig::default()
        };
        let e = load_dataset(&cfg, 0).unwrap_err().to_string();
        assert!(e.contains("data.path"), "{e}");
    }
}
