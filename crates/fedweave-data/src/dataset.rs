//! In-memory datasets and the dispatcher that loads them by name.

use std::path::Path;

use fedweave_core::{Purpose, rng_stream};
use rand::seq::SliceRandom;

use crate::{
    DataConfig, DataError, cifar, digits, emnist, forecast, idx, leaf, movielens, synthetic,
    tiny_imagenet, yahoo,
};

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
    /// Number of values per sample (the product of `feature_shape`).
    pub fn feature_len(&self) -> usize {
        self.feature_shape.iter().product()
    }
}

/// Loads the data of a federation of `clients` clients: [`load_dataset`],
/// except for `csv` (a directory per client), of which only the `hosted`
/// clients are read when given (a networked client process), the others
/// being marked remote.
pub fn load_federation(
    cfg: &DataConfig,
    seed: u64,
    clients: usize,
    hosted: Option<&[usize]>,
) -> Result<Dataset, DataError> {
    if cfg.dataset == "csv" {
        crate::csv_clients::load(cfg, clients, hosted)
    } else {
        load_dataset(cfg, seed)
    }
}

/// The datasets [`load_dataset`] knows, with a one-line description each.
pub fn dataset_names() -> &'static [(&'static str, &'static str)] {
    &[
        (
            "digits",
            "bundled UCI 8x8 handwritten digits (1,797 samples, 10 classes, CC BY 4.0); fixed stratified 75/25 split",
        ),
        (
            "fashion-mnist",
            "Fashion-MNIST 28x28 (60k/10k, 10 classes) from IDX files; default path /usr/share/datasets/fashion-mnist",
        ),
        (
            "mnist",
            "MNIST 28x28 (60k/10k, 10 classes) from IDX files in data.path",
        ),
        (
            "synthetic",
            "FedProx Synthetic(alpha, beta): per-client softmax-regression data, natural clients, 75/25 split per client",
        ),
        (
            "us-weather",
            "bundled NOAA GHCN-Daily 2025: 144 US stations x 365 days of temperature (forecasting), 6-NN station graph; one client per station",
        ),
        (
            "pems04",
            "PeMS04 traffic flow (forecasting) from PEMS04.npz + PEMS04.csv in data.path; one client per sensor",
        ),
        (
            "pems08",
            "PeMS08 traffic flow (forecasting) from PEMS08.npz + PEMS08.csv in data.path",
        ),
        (
            "metr-la",
            "METR-LA traffic speed (forecasting, 207 sensors) from metr-la.npz in data.path (scripts/traffic_npz.py converts DCRNN's metr-la.h5 + adj_mx.pkl); DCRNN's sensor graph",
        ),
        (
            "pems-bay",
            "PEMS-BAY traffic speed (forecasting, 325 sensors) from pems-bay.npz in data.path (converted from pems-bay.h5 + adj_mx_bay.pkl); DCRNN's sensor graph",
        ),
        (
            "cifar10",
            "CIFAR-10 3x32x32 (50k/10k, 10 classes), binary or python version, in data.path",
        ),
        (
            "cifar100",
            "CIFAR-100 3x32x32 (50k/10k, 100 fine classes; data.coarse_labels for the 20 superclasses), binary or python version",
        ),
        (
            "emnist",
            "EMNIST 28x28 from IDX files (data.emnist_split: byclass, bymerge, balanced, letters, digits, mnist)",
        ),
        (
            "femnist",
            "LEAF FEMNIST 28x28 (62 classes) from train/*.json + test/*.json; one natural client per writer",
        ),
        (
            "shakespeare",
            "LEAF Shakespeare next-character (80 classes, 80-character token sequences); one natural client per speaking role",
        ),
        (
            "movielens-100k",
            "MovieLens-100K ratings (regression on user id, item id) from u.data; one client per user, 70/10/20 by time",
        ),
        (
            "yahoo-answers",
            "Yahoo! Answers topics (10 classes) from train.csv/test.csv; token ids (data.seq_len, data.vocab_size)",
        ),
        (
            "tiny-imagenet",
            "Tiny-ImageNet 3x64x64 (100k train / 10k val as test, 200 classes) from JPEG folders",
        ),
        (
            "csv",
            "each client's own train.csv and test.csv (rows label,x1,...,xd) in data.path = \"dir/{id}\"; natural clients, data.classes classes",
        ),
    ]
}

/// Where the Debian package `dataset-fashion-mnist` installs its files.
pub const FASHION_MNIST_DEFAULT_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// Loads the dataset `cfg.dataset`.
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
/// - `cifar10`, `cifar100`, `emnist`, `femnist`, `shakespeare`,
///   `movielens-100k`, `yahoo-answers`, `tiny-imagenet`: the files their
///   authors distribute, in `cfg.path` (the extracted folder or its parent);
///   each module documents its layout, normalisation and split (`cifar`,
///   `emnist`, `leaf`, `movielens`, `yahoo`, `tiny_imagenet`).
///
/// `max_train_samples` then keeps a class-stratified subsample of the
/// training split drawn from `rng_stream(seed, 1, u64::MAX, Purpose::Dataset)`,
/// in the original order; natural clients are re-indexed accordingly.
pub fn load_dataset(cfg: &DataConfig, seed: u64) -> Result<Dataset, DataError> {
    if cfg.dataset == "csv" {
        return Err(DataError::config(
            "data.dataset",
            "dataset csv is one set of files per client: load it with load_federation",
        ));
    }
    if cfg.users.is_some()
        && !matches!(
            cfg.dataset.as_str(),
            "femnist" | "shakespeare" | "movielens-100k"
        )
    {
        return Err(DataError::config(
            "data.users",
            format!(
                "only femnist, shakespeare and movielens-100k have natural users, not {:?} \
                 (synthetic: data.synthetic.clients)",
                cfg.dataset
            ),
        ));
    }
    let ds = match cfg.dataset.as_str() {
        "digits" => digits::load(cfg.path.as_deref(), cfg.normalize)?,
        "fashion-mnist" => {
            let dir = cfg
                .path
                .as_deref()
                .unwrap_or(Path::new(FASHION_MNIST_DEFAULT_DIR));
            if cfg.path.is_none() && !dir.is_dir() {
                return Err(DataError::config(
                    "data.path",
                    format!(
                        "Fashion-MNIST not found at {FASHION_MNIST_DEFAULT_DIR}; install the Debian \
                         package dataset-fashion-mnist or set data.path to a directory holding \
                         train-images-idx3-ubyte(.gz) and the three other IDX files"
                    ),
                ));
            }
            let (mean, std) = if cfg.normalize {
                (0.2860, 0.3530)
            } else {
                (0.0, 1.0)
            };
            idx::load_idx_dataset("fashion-mnist", dir, mean, std)?
        }
        "mnist" => {
            let Some(dir) = cfg.path.as_deref() else {
                return Err(DataError::config(
                    "data.path",
                    "dataset mnist needs data.path: a directory holding train-images-idx3-ubyte, \
                     train-labels-idx1-ubyte, t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte \
                     (each raw or .gz)",
                ));
            };
            let (mean, std) = if cfg.normalize {
                (0.1307, 0.3081)
            } else {
                (0.0, 1.0)
            };
            idx::load_idx_dataset("mnist", dir, mean, std)?
        }
        "synthetic" => {
            if let Some(p) = &cfg.path {
                return Err(DataError::config(
                    "data.path",
                    format!(
                        "dataset synthetic is generated, not read; remove data.path ({})",
                        p.display()
                    ),
                ));
            }
            synthetic::generate(&cfg.synthetic, seed)?
        }
        "us-weather" => forecast::load_us_weather(cfg.path.as_deref(), cfg)?,
        "pems04" | "pems08" => {
            let Some(dir) = cfg.path.as_deref() else {
                return Err(DataError::config(
                    "data.path",
                    format!(
                        "dataset {} needs data.path: the directory holding {}.npz and {}.csv",
                        cfg.dataset,
                        cfg.dataset.to_uppercase(),
                        cfg.dataset.to_uppercase()
                    ),
                ));
            };
            forecast::load_pems(&cfg.dataset, dir, cfg)?
        }
        "metr-la" | "pems-bay" => {
            let Some(dir) = cfg.path.as_deref() else {
                return Err(DataError::config(
                    "data.path",
                    format!(
                        "dataset {} needs data.path: the directory holding {}.npz (made by scripts/traffic_npz.py)",
                        cfg.dataset, cfg.dataset
                    ),
                ));
            };
            forecast::load_dcrnn(&cfg.dataset, dir, cfg)?
        }
        "cifar10" | "cifar100" => cifar::load(&cfg.dataset, cfg)?,
        "emnist" => emnist::load(cfg)?,
        "femnist" | "shakespeare" => leaf::load(&cfg.dataset, cfg)?,
        "movielens-100k" => movielens::load(cfg)?,
        "yahoo-answers" => yahoo::load(cfg)?,
        "tiny-imagenet" => tiny_imagenet::load(cfg)?,
        other => {
            let known: Vec<&str> = dataset_names().iter().map(|(n, _)| *n).collect();
            return Err(DataError::config(
                "data.dataset",
                format!("unknown dataset {other:?}; known: {}", known.join(", ")),
            ));
        }
    };
    match cfg.max_train_samples {
        None => Ok(ds),
        Some(0) => Err(DataError::config(
            "data.max_train_samples",
            "must be at least 1 (omit it to keep the whole training split)",
        )),
        Some(m) => Ok(subsample_train(ds, m, seed)),
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
