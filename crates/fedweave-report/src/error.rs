//! The one error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong while reading a run directory or drawing its
/// report. Every variant names the file (or chart) it is about.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A file could not be read or written.
    #[error("{}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file is not valid JSON.
    #[error("{}: invalid JSON: {source}", .path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// One line of a JSON-lines file is not valid JSON.
    #[error("{}: line {line}: invalid JSON: {source}", .path.display())]
    JsonLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The parser's complaint.
        #[source]
        source: serde_json::Error,
    },
    /// A file parsed but its content has the wrong shape (e.g. a graph that
    /// is not a square matrix).
    #[error("{file}: {message}")]
    Invalid {
        /// The file name (e.g. `summary.json`), or `file:line` for JSON lines.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// The plotting library failed to draw a chart.
    #[error("drawing the {chart} chart failed: {message}")]
    Chart {
        /// Which chart.
        chart: &'static str,
        /// The plotting library's message.
        message: String,
    },
}

impl ReportError {
    pub(crate) fn invalid(file: impl Into<String>, message: impl Into<String>) -> Self {
        ReportError::Invalid {
            file: file.into(),
            message: message.into(),
        }
    }
}
