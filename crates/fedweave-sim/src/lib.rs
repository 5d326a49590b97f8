//! fedweave-sim: the round engine.
//!
//! It loads the data, partitions it, runs clients in parallel (one rayon task
//! per client, every random draw from its own stream, so results do not
//! depend on the thread count), applies attacks, asks the algorithm for the
//! round's collaboration graph, accounts for every byte, evaluates with the
//! papers' protocol and writes the run directory (`config.toml`,
//! `rounds.jsonl`, `summary.json`, `partition.json`, `report.html`).

#![warn(missing_docs)]

pub mod config;
mod engine;
mod peer;
mod records;

pub use config::{ConfigError, ExperimentConfig};
pub use engine::{RunError, run_experiment};
pub use records::{PROTOCOL, RoundRecord, SelectionStats, Summary};
