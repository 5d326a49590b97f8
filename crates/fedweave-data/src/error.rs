//! The error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong while loading a dataset or partitioning it.
///
/// Every message names the file or the configuration key at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataError {
    /// A file or directory could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file or directory that failed.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file was read but its content is not what its format requires.
    #[error("{}: {message}", path.display())]
    Format {
        /// The file at fault (for the bundled digits, its name).
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A configuration value is invalid, or the combination of settings is
    /// impossible for this dataset.
    #[error("invalid setting `{key}`: {message}")]
    Config {
        /// The dotted configuration key at fault, e.g. `partition.min_samples`.
        key: String,
        /// What is wrong and how to fix it.
        message: String,
    },
}

impl DataError {
    pub(crate) fn config(key: impl Into<String>, message: impl Into<String>) -> Self {
        DataError::Config {
            key: key.into(),
            message: message.into(),
        }
    }

    pub(crate) fn format(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        DataError::Format {
            path: path.into(),
            message: message.into(),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.into(),
            source,
        }
    }
}
