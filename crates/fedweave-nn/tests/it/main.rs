//! All of this crate's integration tests in one binary: each test binary is a
//! separate link step, and linking dominates CI time and disk.
mod batched;
mod conditional;
#[path = "../support/golden_set.rs"]
mod golden_set;
mod golden_train;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod gpu;
mod objective;
mod sequential;
mod trainer;
