//! All of this crate's integration tests in one binary: each test binary is a
//! separate link step, and linking dominates CI time and disk.
mod baselines;
mod common;
mod digits;
mod dpfl;
mod eval;
mod forecasting;
mod golden;
#[path = "../../../fedweave-nn/tests/support/golden_set.rs"]
mod golden_set;
mod graph_methods;
mod kept;
mod models;
mod resume;
mod robust;
mod sfl;
mod split;
