//! Transport settings shared by the server, clients and peers: HTTP/2
//! flow-control windows sized for models, and TLS (rustls through tonic)
//! from PEM files.

use crate::NetError;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};

/// HTTP/2 flow-control windows. The protocol's default (64 KiB) makes a
/// sender stop for a window update every 64 KiB; a model is megabytes.
const STREAM_WINDOW: u32 = 8 << 20;
const CONNECTION_WINDOW: u32 = 32 << 20;

/// A gRPC server builder, serving TLS with `tls` = (certificate, key).
pub(crate) fn server(tls: Option<&(PathBuf, PathBuf)>) -> Result<Server, NetError> {
    let mut builder = Server::builder()
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .tcp_nodelay(true);
    if let Some((cert, key)) = tls {
        builder = builder
            .tls_config(server_config(cert, key)?)
            .map_err(|e| NetError::Transport(e.to_string()))?;
    }
    Ok(builder)
}

/// A connection to `url` (TLS when a CA is given).
pub(crate) fn endpoint(url: &str, ca: Option<&Path>) -> Result<Endpoint, NetError> {
    let mut ep = Endpoint::from_shared(url.to_string())
        .map_err(|e| NetError::Transport(format!("bad URL {url}: {e}")))?
        .connect_timeout(Duration::from_secs(5))
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .tcp_nodelay(true);
    if let Some(ca) = ca {
        ep = ep
            .tls_config(client_config(ca)?)
            .map_err(|e| NetError::Transport(e.to_string()))?;
    }
    Ok(ep)
}

fn read(path: &Path) -> Result<Vec<u8>, NetError> {
    std::fs::read(path).map_err(|e| NetError::file(path, e))
}

/// A server (or peer) presenting `cert` with its private `key`.
fn server_config(cert: &Path, key: &Path) -> Result<ServerTlsConfig, NetError> {
    Ok(ServerTlsConfig::new().identity(Identity::from_pem(read(cert)?, read(key)?)))
}

/// A client trusting the certificate authority `ca` (and only it).
fn client_config(ca: &Path) -> Result<ClientTlsConfig, NetError> {
    Ok(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?)))
}
