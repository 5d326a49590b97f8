//! The datasets fedweave knows, in one table: per dataset its name, its
//! one-line help (`fedweave list`), what `data.path` must hold, whether it
//! brings its own clients, and its loader. [`crate::load_dataset`],
//! [`crate::load_federation`], the CLI's `list` and `init`, and config
//! validation all read [`datasets`]; each loader lives in its own module.

use std::path::Path;

use crate::dataset::{Dataset, FASHION_MNIST_DEFAULT_DIR};
use crate::images::ImagePrep;
use crate::{
    DataConfig, DataError, cifar, cinic10, csv_clients, digits, emnist, forecast, idx,
    image_folder, leaf, movielens, pfllib, synthetic, tiny_imagenet, yahoo,
};

/// What `data.path` means for a dataset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataPath {
    /// Generated from the seed: `data.path` must not be set.
    Unused,
    /// Bundled or installed at a default place; `data.path` replaces it
    /// with what the text says.
    Optional(&'static str),
    /// Read from disk: `data.path` must be set and hold what the text says.
    Required(&'static str),
}

impl DataPath {
    /// What `data.path` must hold, if it may be set.
    pub fn holds(self) -> Option<&'static str> {
        match self {
            DataPath::Unused => None,
            DataPath::Optional(s) | DataPath::Required(s) => Some(s),
        }
    }
}

/// Loads a whole dataset from the configuration and the seed.
type LoadWhole = fn(&DataConfig, u64) -> Result<Dataset, DataError>;

/// Loads one set of files per client: the number of clients and the
/// hosted ones.
type LoadPerClient = fn(&DataConfig, usize, Option<&[usize]>) -> Result<Dataset, DataError>;

/// The preprocessing of a dataset's image files.
type Prep = fn(&DataConfig) -> Result<ImagePrep, DataError>;

/// How a dataset is loaded.
#[derive(Clone, Copy)]
pub(crate) enum Loader {
    /// The whole dataset from the configuration and the seed.
    Whole(LoadWhole),
    /// One set of files per client (`data.path` with `{id}`): the number of
    /// clients, and the clients whose files this machine holds (`None`:
    /// all of them).
    PerClient(LoadPerClient),
}

/// One dataset of the registry.
#[derive(Clone, Copy)]
pub struct DatasetSpec {
    /// The name `data.dataset` takes.
    pub name: &'static str,
    /// One line for `fedweave list`.
    pub help: &'static str,
    /// What `data.path` must hold.
    pub path: DataPath,
    /// Whether the data has its own clients (`partition.kind = "natural"`).
    pub natural_clients: bool,
    /// Whether `data.users` applies (natural users of which the first
    /// `users` are kept).
    pub users: bool,
    /// Whether each client's files may live only on its own machine
    /// (`data.path = "dir/{id}"`, read by [`crate::load_federation`] for the
    /// hosted clients only): a server or a peer cannot derive them.
    pub client_files: bool,
    /// Whether `data.image_size`, `data.channels`, `data.mean` and
    /// `data.std` apply (they are refused elsewhere).
    pub image_keys: bool,
    pub(crate) loader: Loader,
    /// How one image file becomes a sample, for datasets of image files
    /// ([`crate::image_prep`]).
    pub(crate) image: Option<Prep>,
}

impl std::fmt::Debug for DatasetSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatasetSpec")
            .field("name", &self.name)
            .field("path", &self.path)
            .field("natural_clients", &self.natural_clients)
            .finish_non_exhaustive()
    }
}

/// A dataset with a global split (partitioned by `partition.kind`).
const fn pooled(
    name: &'static str,
    help: &'static str,
    path: DataPath,
    load: LoadWhole,
) -> DatasetSpec {
    DatasetSpec {
        name,
        help,
        path,
        natural_clients: false,
        users: false,
        client_files: false,
        image_keys: false,
        loader: Loader::Whole(load),
        image: None,
    }
}

/// A pooled dataset of image files.
const fn images(
    name: &'static str,
    help: &'static str,
    path: DataPath,
    load: LoadWhole,
    prep: Prep,
) -> DatasetSpec {
    DatasetSpec {
        image: Some(prep),
        ..pooled(name, help, path, load)
    }
}

/// A dataset that comes with its own clients.
const fn natural(
    name: &'static str,
    help: &'static str,
    path: DataPath,
    users: bool,
    load: LoadWhole,
) -> DatasetSpec {
    DatasetSpec {
        natural_clients: true,
        users,
        ..pooled(name, help, path, load)
    }
}

const DATASETS: &[DatasetSpec] = &[
    pooled(
        "digits",
        "bundled UCI 8x8 handwritten digits (1,797 samples, 10 classes, CC BY 4.0); fixed stratified 75/25 split",
        DataPath::Optional("a CSV(.gz) file replacing the bundled one"),
        |cfg, _| digits::load(cfg.path.as_deref(), cfg.normalize),
    ),
    pooled(
        "fashion-mnist",
        "Fashion-MNIST 28x28 (60k/10k, 10 classes) from IDX files; default path /usr/share/datasets/fashion-mnist",
        DataPath::Optional(
            "a directory holding train-images-idx3-ubyte(.gz) and the three other IDX files",
        ),
        |cfg, _| load_fashion_mnist(cfg),
    ),
    pooled(
        "mnist",
        "MNIST 28x28 (60k/10k, 10 classes) from IDX files in data.path",
        DataPath::Required(
            "a directory holding train-images-idx3-ubyte, train-labels-idx1-ubyte, \
             t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (each raw or .gz)",
        ),
        |cfg, _| {
            let (mean, std) = if cfg.normalize {
                (0.1307, 0.3081)
            } else {
                (0.0, 1.0)
            };
            idx::load_idx_dataset("mnist", need(cfg)?, mean, std)
        },
    ),
    natural(
        "synthetic",
        "FedProx Synthetic(alpha, beta): per-client softmax-regression data, natural clients, 75/25 split per client",
        DataPath::Unused,
        false,
        |cfg, seed| synthetic::generate(&cfg.synthetic, seed),
    ),
    natural(
        "us-weather",
        "bundled NOAA GHCN-Daily 2025: 144 US stations x 365 days of temperature (forecasting), 6-NN station graph; one client per station",
        DataPath::Optional("an .npz archive replacing the bundled one"),
        false,
        |cfg, _| forecast::load_us_weather(cfg.path.as_deref(), cfg),
    ),
    natural(
        "pems04",
        "PeMS04 traffic flow (forecasting) from PEMS04.npz + PEMS04.csv in data.path; one client per sensor",
        DataPath::Required("the directory holding PEMS04.npz and PEMS04.csv"),
        false,
        |cfg, _| forecast::load_pems("pems04", need(cfg)?, cfg),
    ),
    natural(
        "pems08",
        "PeMS08 traffic flow (forecasting) from PEMS08.npz + PEMS08.csv in data.path",
        DataPath::Required("the directory holding PEMS08.npz and PEMS08.csv"),
        false,
        |cfg, _| forecast::load_pems("pems08", need(cfg)?, cfg),
    ),
    natural(
        "metr-la",
        "METR-LA traffic speed (forecasting, 207 sensors) from metr-la.npz in data.path (scripts/traffic_npz.py converts DCRNN's metr-la.h5 + adj_mx.pkl); DCRNN's sensor graph",
        DataPath::Required("the directory holding metr-la.npz (made by scripts/traffic_npz.py)"),
        false,
        |cfg, _| forecast::load_dcrnn("metr-la", need(cfg)?, cfg),
    ),
    natural(
        "pems-bay",
        "PEMS-BAY traffic speed (forecasting, 325 sensors) from pems-bay.npz in data.path (converted from pems-bay.h5 + adj_mx_bay.pkl); DCRNN's sensor graph",
        DataPath::Required("the directory holding pems-bay.npz (made by scripts/traffic_npz.py)"),
        false,
        |cfg, _| forecast::load_dcrnn("pems-bay", need(cfg)?, cfg),
    ),
    pooled(
        "cifar10",
        "CIFAR-10 3x32x32 (50k/10k, 10 classes), binary or python version, in data.path",
        DataPath::Required(
            "the extracted cifar-10-batches-bin or cifar-10-batches-py folder, or its parent",
        ),
        |cfg, _| cifar::load("cifar10", cfg),
    ),
    pooled(
        "cifar100",
        "CIFAR-100 3x32x32 (50k/10k, 100 fine classes; data.coarse_labels for the 20 superclasses), binary or python version",
        DataPath::Required(
            "the extracted cifar-100-binary or cifar-100-python folder, or its parent",
        ),
        |cfg, _| cifar::load("cifar100", cfg),
    ),
    images(
        "cinic10",
        "CINIC-10 3x32x32 (train+valid 180k / test 90k, 10 classes) from its PNG folders; CINIC-10's mean/std",
        DataPath::Required(
            "the extracted CINIC-10 folder holding train/, valid/ and test/ (10 class folders of PNGs each)",
        ),
        |cfg, _| cinic10::load(cfg),
        cinic10::prep,
    ),
    pooled(
        "emnist",
        "EMNIST 28x28 from IDX files (data.emnist_split: byclass, bymerge, balanced, letters, digits, mnist)",
        DataPath::Required("the folder holding the EMNIST IDX files (gzip folder), or its parent"),
        |cfg, _| emnist::load(cfg),
    ),
    natural(
        "femnist",
        "LEAF FEMNIST 28x28 (62 classes) from train/*.json + test/*.json; one natural client per writer",
        DataPath::Required("LEAF's data folder holding train/ and test/ (*.json), or its parent"),
        true,
        |cfg, _| leaf::load("femnist", cfg),
    ),
    natural(
        "shakespeare",
        "LEAF Shakespeare next-character (80 classes, 80-character token sequences); one natural client per speaking role",
        DataPath::Required("LEAF's data folder holding train/ and test/ (*.json), or its parent"),
        true,
        |cfg, _| leaf::load("shakespeare", cfg),
    ),
    natural(
        "movielens-100k",
        "MovieLens-100K ratings (regression on user id, item id) from u.data; one client per user, 70/10/20 by time",
        DataPath::Required("the ml-100k folder holding u.data, or its parent"),
        true,
        |cfg, _| movielens::load(cfg),
    ),
    pooled(
        "yahoo-answers",
        "Yahoo! Answers topics (10 classes) from train.csv/test.csv; token ids (data.seq_len, data.vocab_size)",
        DataPath::Required("the folder holding train.csv and test.csv, or its parent"),
        |cfg, _| yahoo::load(cfg),
    ),
    images(
        "tiny-imagenet",
        "Tiny-ImageNet 3x64x64 (100k train / 10k val as test, 200 classes) from JPEG folders",
        DataPath::Required(
            "the tiny-imagenet-200 folder holding wnids.txt, train/ and val/, or its parent",
        ),
        |cfg, _| tiny_imagenet::load(cfg),
        tiny_imagenet::prep,
    ),
    DatasetSpec {
        name: "csv",
        help: "each client's own train.csv and test.csv (rows label,x1,...,xd) in data.path = \"dir/{id}\"; natural clients, data.classes classes",
        path: DataPath::Required(
            "a directory per client with {id} in it, e.g. \"clients/{id}\", each holding train.csv and test.csv",
        ),
        natural_clients: true,
        users: false,
        client_files: true,
        image_keys: false,
        loader: Loader::PerClient(csv_clients::load),
        image: None,
    },
    DatasetSpec {
        name: "pfllib",
        help: "a dataset written by PFLlib's dataset/generate_*.py: config.json, train/{id}.npz, test/{id}.npz in data.path; PFLlib's clients (clients = num_clients) and train/test split",
        path: DataPath::Required("PFLlib's dataset folder holding config.json, train/ and test/"),
        natural_clients: true,
        users: false,
        client_files: false,
        image_keys: false,
        loader: Loader::PerClient(pfllib::load),
        image: None,
    },
    DatasetSpec {
        name: "image-folder",
        help: "each client's own images in data.path = \"dir/{id}\": train/<class>/*.png|jpg and test/<class>/*; natural clients, classes = sorted union of class folders (data.image_size, data.channels)",
        path: DataPath::Required(
            "a directory per client with {id} in it, e.g. \"clients/{id}\", each holding train/<class>/ and test/<class>/ image folders",
        ),
        natural_clients: true,
        users: false,
        client_files: false,
        image_keys: true,
        loader: Loader::PerClient(image_folder::load),
        image: Some(image_folder::prep),
    },
];

/// Every dataset fedweave can load, in the order `fedweave list` shows.
pub fn datasets() -> &'static [DatasetSpec] {
    DATASETS
}

/// The registry entry of `name`, if it is a dataset.
pub fn dataset(name: &str) -> Option<&'static DatasetSpec> {
    DATASETS.iter().find(|d| d.name == name)
}

/// `cfg.path` of a dataset whose [`DataPath`] is required (checked before
/// any loader runs).
fn need(cfg: &DataConfig) -> Result<&Path, DataError> {
    crate::files::need_path(cfg, "see `fedweave list`")
}

/// Fashion-MNIST from `data.path` or the Debian package's folder.
fn load_fashion_mnist(cfg: &DataConfig) -> Result<Dataset, DataError> {
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
    idx::load_idx_dataset("fashion-mnist", dir, mean, std)
}
