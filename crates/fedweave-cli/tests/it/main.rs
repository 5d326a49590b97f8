//! All of this crate's integration tests in one binary: each test binary is a
//! separate link step, and linking dominates CI time and disk.
mod bench;
mod cli;
mod cluster;
mod errors;
mod export;
mod interrupt;
mod net;
mod progress;
mod start;
mod sweep;

use std::process::{Command, Output};

/// Runs the `fedweave` binary with `args` to its end.
pub fn fedweave(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fedweave"))
        .args(args)
        .output()
        .expect("binary runs")
}

/// What a finished command printed: stdout, then stderr.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
