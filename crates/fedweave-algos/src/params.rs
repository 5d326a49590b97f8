//! Typed per-algorithm parameters parsed from the `[algorithm]` table.

use crate::Algorithm;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Errors building an algorithm.
#[derive(Debug, thiserror::Error)]
pub enum AlgoError {
    /// No algorithm has this name.
    #[error("unknown algorithm `{name}` (known: {known})")]
    UnknownAlgorithm {
        /// The name given.
        name: String,
        /// The names fedweave knows.
        known: String,
    },
    /// A key is unknown for this algorithm, or has the wrong type.
    #[error("algorithm `{algorithm}`: {message}")]
    BadParameter {
        /// The algorithm being configured.
        algorithm: String,
        /// What is wrong, naming the key (`algorithm.<key>`).
        message: String,
    },
}

/// Parses `P` from `table` (unknown keys rejected), validates it, and
/// returns the algorithm together with the resolved table.
pub(crate) fn build<P, F>(
    name: &str,
    table: &toml::Table,
    clients: usize,
    make: F,
) -> Result<(Box<dyn Algorithm>, toml::Table), AlgoError>
where
    P: DeserializeOwned + Serialize + Validate,
    F: FnOnce(P) -> Box<dyn Algorithm>,
{
    let bad = |message: String| AlgoError::BadParameter {
        algorithm: name.to_string(),
        message,
    };
    let mut params: P =
        toml::Value::Table(table.clone())
            .try_into()
            .map_err(|e: toml::de::Error| {
                bad(format!(
                    "in [algorithm]: {}",
                    e.message()
                        .replace("unknown field `", "unknown key `algorithm.")
                ))
            })?;
    params.validate().map_err(bad)?;
    params.resolve(clients);
    let resolved = match toml::Value::try_from(&params) {
        Ok(toml::Value::Table(t)) => t,
        _ => toml::Table::new(),
    };
    Ok((make(params), resolved))
}

/// Range checks beyond what types express, and defaults that depend on the
/// federation (so the resolved config shows the value that ran).
pub(crate) trait Validate {
    /// `Err(message naming the key)` when a value is impossible.
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }

    /// Fills defaults that depend on the number of clients.
    fn resolve(&mut self, _clients: usize) {}
}
