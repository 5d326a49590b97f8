//! TLS settings (rustls through tonic) from PEM files.

use crate::NetError;
use std::path::Path;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

fn read(path: &Path) -> Result<Vec<u8>, NetError> {
    std::fs::read(path).map_err(|e| NetError::file(path, e))
}

/// A server (or peer) presenting `cert` with its private `key`.
pub(crate) fn server_config(cert: &Path, key: &Path) -> Result<ServerTlsConfig, NetError> {
    Ok(ServerTlsConfig::new().identity(Identity::from_pem(read(cert)?, read(key)?)))
}

/// A client trusting the certificate authority `ca` (and only it).
pub(crate) fn client_config(ca: &Path) -> Result<ClientTlsConfig, NetError> {
    Ok(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?)))
}
