//! fedweave-sim: the round engine.
//!
//! It loads the data, partitions it, runs clients in parallel (one rayon task
//! per client, every random draw from its own stream, so results do not
//! depend on the thread count), applies attacks, asks the algorithm for the
//! round's collaboration graph, accounts for every byte, evaluates with the
//! papers' protocol and writes the run directory (`config.toml`,
//! `rounds.jsonl`, `summary.json`, `partition.json`, `report.html`) and its
//! checkpoints. `setup` builds the fixed part of a run, `round` runs one
//! round, `protocol` scores and summarises, `engine` drives the loop and
//! writes the outputs, `checkpoint` saves and restores the state.

#![warn(missing_docs)]

pub mod checkpoint;
pub mod checks;
pub mod config;
mod driver;
mod engine;
pub mod export;
pub mod interrupt;
pub mod models;
pub mod onnx;
pub mod packed;
mod peer;
pub mod progress;
mod protocol;
mod round;
pub mod runtime;
mod setup;
pub mod suggest;

pub use config::{ConfigError, ExperimentConfig, ServerKernels, default_out_dir};
pub use engine::{RunError, claim_out_dir, is_run_dir, resume_experiment, run_experiment};
pub use fedweave_records::{PROTOCOL, RoundRecord, SelectionStats, Summary};
pub use interrupt::{clear_stop, request_stop, stop_flag, stop_requested};
