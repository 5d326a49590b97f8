//! `fedweave certs`: a private certificate authority, one certificate
//! signed by it for the server (and peers), valid for the given host names
//! and addresses, and optionally certificates for mutual TLS whose common
//! name `fedweave-client-I` authenticates client (or peer) I:
//! `client-I.pem`/`.key` (client authentication only, for `client` /
//! `worker`) and `peer-I.pem`/`.key` (client and server authentication,
//! valid for the hosts too: a peer serves and fetches with one). Clients trust `ca.pem`; the server
//! presents `server.pem` with `server.key` and, with `--client-ca ca.pem`,
//! accepts only clients presenting a certificate for their id. Private
//! keys are written readable by their owner only (mode 0600); keep
//! `ca.key` offline: it signs certificates.

use crate::NetError;
use crate::auth::CERT_NAME_PREFIX;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// The files written.
pub struct CertFiles {
    /// The CA certificate clients trust.
    pub ca: PathBuf,
    /// The server/peer certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
    /// Client certificates and keys, by id (`client-I.pem`, `client-I.key`).
    pub clients: Vec<(PathBuf, PathBuf)>,
    /// Peer certificates and keys, by id (`peer-I.pem`, `peer-I.key`).
    pub peers: Vec<(PathBuf, PathBuf)>,
}

fn tls_err(e: rcgen::Error) -> NetError {
    NetError::Transport(format!("certificate generation: {e}"))
}

/// Writes a private file: created readable and writable by its owner only
/// (mode 0600 on Unix), replacing an older one.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> Result<(), NetError> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        options.mode(0o600);
        // An existing file keeps its mode on open: tighten it first.
        if path.exists() {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| NetError::file(path, e))?;
        }
    }
    let mut f = options.open(path).map_err(|e| NetError::file(path, e))?;
    f.write_all(bytes).map_err(|e| NetError::file(path, e))
}

/// Writes `ca.pem`, `ca.key`, `server.pem` and `server.key` into `out` for
/// `hosts` (names or IP addresses; default `localhost` and `127.0.0.1`),
/// `clients` client certificates (`client-I.pem`/`.key`, I in
/// 0..clients, for clients of `serve --client-ca`) and `peers` peer
/// certificates (`peer-I.pem`/`.key`, also valid for `hosts`, for
/// `peer --tls-cert … --client-ca`).
pub fn generate(
    out: &Path,
    hosts: &[String],
    clients: usize,
    peers: usize,
) -> Result<CertFiles, NetError> {
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
    let issuer = Issuer::from_params(&ca_params, &ca_key);

    let mut params = CertificateParams::new(hosts.clone()).map_err(tls_err)?;
    params
        .distinguished_name
        .push(DnType::CommonName, hosts[0].clone());
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(tls_err)?;
    let cert = params.signed_by(&key, &issuer).map_err(tls_err)?;

    let files = CertFiles {
        ca: out.join("ca.pem"),
        cert: out.join("server.pem"),
        key: out.join("server.key"),
        clients: (0..clients)
            .map(|i| {
                (
                    out.join(format!("client-{i}.pem")),
                    out.join(format!("client-{i}.key")),
                )
            })
            .collect(),
        peers: (0..peers)
            .map(|i| {
                (
                    out.join(format!("peer-{i}.pem")),
                    out.join(format!("peer-{i}.key")),
                )
            })
            .collect(),
    };
    let write = |p: &Path, text: String| std::fs::write(p, text).map_err(|e| NetError::file(p, e));
    write(&files.ca, ca_cert.pem())?;
    write_private(&out.join("ca.key"), ca_key.serialize_pem().as_bytes())?;
    write(&files.cert, cert.pem())?;
    write_private(&files.key, key.serialize_pem().as_bytes())?;
    let issue = |i: usize, (pem, key_file): &(PathBuf, PathBuf), peer: bool| {
        // A client certificate names no host: it cannot pose as a server.
        let names = if peer { hosts.clone() } else { Vec::new() };
        let mut p = CertificateParams::new(names).map_err(tls_err)?;
        p.distinguished_name
            .push(DnType::CommonName, format!("{CERT_NAME_PREFIX}{i}"));
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if peer {
            p.extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        let k = KeyPair::generate().map_err(tls_err)?;
        let c = p.signed_by(&k, &issuer).map_err(tls_err)?;
        write(pem, c.pem())?;
        write_private(key_file, k.serialize_pem().as_bytes())
    };
    for (i, f) in files.clients.iter().enumerate() {
        issue(i, f, false)?;
    }
    for (i, f) in files.peers.iter().enumerate() {
        issue(i, f, true)?;
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_are_private_and_client_certificates_name_their_id() {
        let dir = tempfile::tempdir().unwrap();
        let files = super::generate(dir.path(), &[], 2, 1).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            for k in [
                "ca.key",
                "server.key",
                "client-0.key",
                "client-1.key",
                "peer-0.key",
            ] {
                let mode = std::fs::metadata(dir.path().join(k))
                    .unwrap()
                    .permissions()
                    .mode();
                assert_eq!(mode & 0o777, 0o600, "{k}");
            }
        }
        let der = |p: &std::path::Path| {
            let text = std::fs::read_to_string(p).unwrap();
            let b64: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
            base64_decode(&b64)
        };
        assert_eq!(
            crate::auth::cert_identity(&der(&files.clients[1].0)),
            Some(1)
        );
        assert_eq!(crate::auth::cert_identity(&der(&files.peers[0].0)), Some(0));
        assert_eq!(crate::auth::cert_identity(&der(&files.cert)), None);
        assert_eq!(crate::auth::cert_identity(&der(&files.ca)), None);
        assert_eq!(crate::auth::cert_identity(b"not a certificate"), None);
    }

    /// Standard base64 (test helper: PEM bodies).
    fn base64_decode(text: &str) -> Vec<u8> {
        let value = |c: u8| match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            _ => 63,
        };
        let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=').map(value).collect();
        let mut out = Vec::new();
        for chunk in digits.chunks(4) {
            let mut n = 0u32;
            for (k, &d) in chunk.iter().enumerate() {
                n |= u32::from(d) << (18 - 6 * k);
            }
            for k in 0..chunk.len().saturating_sub(1) {
                out.push((n >> (16 - 8 * k)) as u8);
            }
        }
        out
    }
}
