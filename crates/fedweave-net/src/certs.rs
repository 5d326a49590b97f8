//! `fedweave certs`: a private certificate authority and one certificate
//! signed by it for the server (and peers), valid for the given host names
//! and addresses. Clients trust `ca.pem`; the server presents `server.pem`
//! with `server.key`. Keep `ca.key` offline: it signs certificates.

use crate::NetError;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use std::path::{Path, PathBuf};

/// The files written.
pub struct CertFiles {
    /// The CA certificate clients trust.
    pub ca: PathBuf,
    /// The server/peer certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

fn tls_err(e: rcgen::Error) -> NetError {
    NetError::Transport(format!("certificate generation: {e}"))
}

/// Writes `ca.pem`, `ca.key`, `server.pem` and `server.key` into `out` for
/// `hosts` (names or IP addresses; default `localhost` and `127.0.0.1`).
pub fn generate(out: &Path, hosts: &[String]) -> Result<CertFiles, NetError> {
    let hosts: Vec<String> = if hosts.is_empty() {
        vec!["localhost".into(), "127.0.0.1".into()]
    } else {
        hosts.to_vec()
    };
    std::fs::create_dir_all(out).map_err(|e| NetError::file(out, e))?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(tls_err)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "fedweave CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().map_err(tls_err)?;
    let ca_cert = ca_params.self_signed(&ca_key).map_err(tls_err)?;

    let mut params = CertificateParams::new(hosts.clone()).map_err(tls_err)?;
    params
        .distinguished_name
        .push(DnType::CommonName, hosts[0].clone());
    let key = KeyPair::generate().map_err(tls_err)?;
    let issuer = Issuer::from_params(&ca_params, &ca_key);
    let cert = params.signed_by(&key, &issuer).map_err(tls_err)?;

    let files = CertFiles {
        ca: out.join("ca.pem"),
        cert: out.join("server.pem"),
        key: out.join("server.key"),
    };
    let write = |p: &Path, text: String| std::fs::write(p, text).map_err(|e| NetError::file(p, e));
    write(&files.ca, ca_cert.pem())?;
    write(&out.join("ca.key"), ca_key.serialize_pem())?;
    write(&files.cert, cert.pem())?;
    write(&files.key, key.serialize_pem())?;
    Ok(files)
}
