//! fedweave-net: the network transports. The same algorithm code as the
//! simulator (the round steps of `fedweave_sim::runtime`) over gRPC (tonic,
//! prost, HTTP/2, rustls): a server and clients for server methods
//! (`fedweave serve` / `client` / `worker`), and peers for peer-to-peer
//! methods (`fedweave peer`). A networked run gives the same per-client
//! accuracies and graphs as `fedweave run` of the same config.

#![warn(missing_docs)]

pub mod auth;
pub mod certs;
pub mod client;
pub mod hub;
pub mod peer;
pub mod server;
mod transport;
pub mod wire;

/// The generated gRPC services (`Lobby`: Join; `Federation`: Next,
/// Report; `Peers`: Fetch), for tools that talk to a fedweave server
/// directly.
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/fedweave.Lobby.rs"));
    include!(concat!(env!("OUT_DIR"), "/fedweave.Federation.rs"));
    include!(concat!(env!("OUT_DIR"), "/fedweave.Peers.rs"));
}

/// Errors of the network runtime.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The run itself failed (config, data, checkpoint, outputs).
    #[error(transparent)]
    Run(#[from] fedweave_sim::RunError),
    /// A file could not be read or written.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// Transport failure (bind, connect, TLS).
    #[error("network: {0}")]
    Transport(String),
    /// The server refused this client (wrong token, unknown id, id in use).
    #[error("refused by the server: {0}")]
    Refused(String),
    /// A message could not be decoded.
    #[error(transparent)]
    Wire(#[from] wire::WireError),
    /// The configuration does not fit the network runtime.
    #[error("{0}")]
    Unsupported(String),
}

impl NetError {
    pub(crate) fn file(path: &std::path::Path, e: impl std::fmt::Display) -> Self {
        Self::File {
            path: path.display().to_string(),
            message: e.to_string(),
        }
    }
}

/// Reads a file of `id value` lines (`#` comments, blank lines skipped):
/// the tokens file of `serve` and the peers file of `peer`. A line that is
/// not exactly an id and one `what`, or an id given twice, is an error
/// naming the line.
pub(crate) fn read_id_lines<K: std::str::FromStr + std::hash::Hash + Eq>(
    path: &std::path::Path,
    what: &str,
) -> Result<std::collections::HashMap<K, String>, NetError> {
    let text = std::fs::read_to_string(path).map_err(|e| NetError::file(path, e))?;
    let mut out = std::collections::HashMap::new();
    for (k, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || NetError::file(path, format!("line {}: expected `id {what}`", k + 1));
        let mut parts = line.split_whitespace();
        let id = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
        let value = parts.next().ok_or_else(bad)?;
        if parts.next().is_some() {
            return Err(bad());
        }
        if out.insert(id, value.to_string()).is_some() {
            return Err(NetError::file(
                path,
                format!("line {}: the id appears twice", k + 1),
            ));
        }
    }
    Ok(out)
}
