//! All of this crate's integration tests in one binary: each test binary is a
//! separate link step, and linking dominates CI time and disk.
mod cli;
mod cluster;
mod errors;
mod interrupt;
mod net;
mod progress;
mod start;
mod sweep;
