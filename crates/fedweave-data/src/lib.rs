//! fedweave-data: datasets and client partitions for fedweave.
//!
//! - [`load_dataset`] loads a dataset by name ([`dataset_names`]): the bundled
//!   UCI 8×8 digits, Fashion-MNIST / MNIST from IDX files, or FedProx's
//!   Synthetic(α, β) with natural clients.
//! - [`partition`] splits its training pool across clients
//!   ([`partition_kinds`]), with a per-client validation split and a test set
//!   that follows each client's label distribution.
//!
//! Every random draw comes from [`fedweave_core::rng_stream`], so a
//! partition depends only on the seed and the configuration.

#![warn(missing_docs)]

mod config;
mod dataset;
pub mod digits;
mod error;
mod forecast;
mod idx;
mod partition;
mod synthetic;

pub use config::{DataConfig, PartitionConfig, PartitionKind, SyntheticConfig};
pub use dataset::{
    Dataset, FASHION_MNIST_DEFAULT_DIR, NaturalClient, Split, TargetScale, Task, dataset_names,
    load_dataset,
};
pub use error::DataError;
pub use partition::{
    ClientLabelCounts, ClientSplit, Partition, PartitionReport, partition, partition_kinds,
};
