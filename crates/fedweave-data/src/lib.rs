//! fedweave-data: datasets and client partitions for fedweave.
//!
//! - [`datasets`] is the registry of every dataset: name, help text, what
//!   `data.path` holds, natural clients, loader.
//! - [`load_dataset`] loads a dataset by name: the bundled
//!   UCI 8×8 digits, Fashion-MNIST / MNIST from IDX files, FedProx's
//!   Synthetic(α, β) with natural clients, the forecasting series, and the
//!   formats the seed papers' authors distribute — CIFAR-10/100 (binary and
//!   python), EMNIST (IDX), LEAF FEMNIST / Shakespeare (JSON, natural
//!   users), MovieLens-100K (`u.data`, rating regression), Yahoo! Answers
//!   (CSV, token ids), Tiny-ImageNet (JPEG folders), CINIC-10 (PNG
//!   folders) and PFLlib's per-client `.npz` files; [`load_federation`]
//!   also reads per-client folders (`csv`, `image-folder`).
//! - [`partition`] splits its training pool across clients
//!   ([`partition_kinds`]), with a per-client validation split and a test set
//!   that follows each client's label distribution.
//! - [`prepare`] is the one call an engine makes after loading: it returns
//!   the dataset to train on and its partition, merging train and test into
//!   one pool first when `partition.split = "merged"` (PFLlib, FedDWA's
//!   practical 2, FedAGHN).
//!
//! Every random draw comes from [`fedweave_core::rng_stream`], so a
//! partition depends only on the seed and the configuration.

#![warn(missing_docs)]

mod cifar;
mod cinic10;
mod config;
mod csv_clients;
mod dataset;
pub mod digits;
mod emnist;
mod error;
mod files;
mod forecast;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
mod idx;
mod image_folder;
mod images;
mod leaf;
mod movielens;
mod partition;
mod pfllib;
mod registry;
mod synthetic;
mod tiny_imagenet;
mod yahoo;

pub use config::{
    DataConfig, ImageSize, PartitionConfig, PartitionKind, SplitKind, SyntheticConfig,
};
pub use dataset::{
    Dataset, FASHION_MNIST_DEFAULT_DIR, InputKind, NaturalClient, Split, TargetScale, Task,
    load_dataset, load_federation,
};
pub use error::DataError;
pub use images::{ImagePrep, image_prep};
pub use leaf::SHAKESPEARE_ALPHABET;
pub use partition::{
    ClientLabelCounts, ClientSplit, Partition, PartitionReport, partition, partition_kinds, prepare,
};
pub use registry::{DataPath, DatasetSpec, dataset, datasets};
