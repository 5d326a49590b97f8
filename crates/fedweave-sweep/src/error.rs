//! The one error type of this crate.

use std::path::PathBuf;

/// Everything that can stop a sweep or a comparison.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// A file or directory could not be read or written.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The grid file is malformed.
    #[error("grid {file}: {message}")]
    Grid {
        /// The grid file (or `<inline>`).
        file: String,
        /// What is wrong.
        message: String,
    },
    /// One run's configuration does not parse or validate.
    #[error("run `{run}`: {source}")]
    Config {
        /// The run's name.
        run: String,
        /// The configuration error (it names the key).
        #[source]
        source: fedweave_sim::ConfigError,
    },
    /// A run directory given to `compare` (or written by a run) is unusable.
    #[error("{}: {message}", .path.display())]
    Input {
        /// The directory or file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Some runs failed; the others finished and were aggregated.
    #[error("{} of {total} runs failed:\n{}", .failed.len(), .failed.iter().map(|(n, e)| format!("  {n}: {e}")).collect::<Vec<_>>().join("\n"))]
    RunsFailed {
        /// Runs planned.
        total: usize,
        /// `(run name, error)` of each failed run.
        failed: Vec<(String, String)>,
    },
    /// The sweep was interrupted (SIGINT/SIGTERM): finished runs stay,
    /// running ones stopped at a checkpoint; running the sweep again goes on.
    #[error(
        "sweep interrupted: {finished} of {total} runs finished, {stopped} stopped at a checkpoint, {not_started} not started — run the same `fedweave sweep` again to continue"
    )]
    Interrupted {
        /// Runs planned.
        total: usize,
        /// Runs with a summary.
        finished: usize,
        /// Runs stopped at a checkpoint.
        stopped: usize,
        /// Runs not started.
        not_started: usize,
    },
    /// `--collect` found grid points without a finished run (the tables
    /// were written from the others).
    #[error(
        "{} of {total} grid points have no finished run yet (tables written from the others): {}",
        .missing.len(), .missing.join(", ")
    )]
    Incomplete {
        /// Runs planned.
        total: usize,
        /// `K (name)` of each missing grid point.
        missing: Vec<String>,
    },
    /// Drawing a figure failed.
    #[error(transparent)]
    Report(#[from] fedweave_report::ReportError),
}

pub(crate) fn io(path: &std::path::Path) -> impl Fn(std::io::Error) -> SweepError + '_ {
    move |source| SweepError::Io {
        path: path.to_path_buf(),
        source,
    }
}
