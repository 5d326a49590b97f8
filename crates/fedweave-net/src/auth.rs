//! Credentials: tokens (plain, or stored as their SHA-256 so the file that
//! checks them cannot be used to forge them), client certificates (mutual
//! TLS: the certificate's common name `fedweave-client-I` names the id it
//! authenticates), sessions (128 random bits from the operating system,
//! bound to one client id), constant-time comparisons, and the rule that
//! a non-loopback address is served in plaintext or without client
//! credentials only when asked for explicitly (`--insecure`).

use crate::NetError;
use crate::wire::SESSION_BYTES;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use subtle::ConstantTimeEq;

/// A stored credential a presented token is checked against.
#[derive(Clone)]
pub enum Credential {
    /// The token itself.
    Plain(Vec<u8>),
    /// The SHA-256 of the token (`sha256:HEX` in a tokens file).
    Sha256([u8; 32]),
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print a secret.
        f.write_str(match self {
            Self::Plain(_) => "Credential::Plain(..)",
            Self::Sha256(_) => "Credential::Sha256(..)",
        })
    }
}

impl Credential {
    /// Parses a tokens file's value: `sha256:` and 64 hex digits, or the
    /// token itself.
    pub fn parse(value: &str) -> Result<Self, String> {
        if let Some(h) = value.strip_prefix("sha256:") {
            let bytes = crate::wire::unhex(h)
                .filter(|b| b.len() == 32)
                .ok_or("`sha256:` must be followed by 64 hex digits")?;
            let mut d = [0u8; 32];
            d.copy_from_slice(&bytes);
            return Ok(Self::Sha256(d));
        }
        if value.is_empty() {
            return Err("empty token".into());
        }
        Ok(Self::Plain(value.as_bytes().to_vec()))
    }

    /// Whether `presented` is this credential's token, in time that does
    /// not depend on where they differ.
    pub fn matches(&self, presented: &str) -> bool {
        match self {
            Self::Plain(t) => ct_eq(t, presented.as_bytes()),
            Self::Sha256(d) => ct_eq(d, &sha256(presented.as_bytes())),
        }
    }
}

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Whether `a == b`, comparing every byte whatever the first difference
/// (the lengths of secrets are not secret).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// A fresh session secret from the operating system's random source.
pub fn new_session() -> Result<Vec<u8>, NetError> {
    let mut s = vec![0u8; SESSION_BYTES];
    getrandom::fill(&mut s)
        .map_err(|e| NetError::Transport(format!("no random numbers from the OS: {e}")))?;
    Ok(s)
}

/// Reads a tokens file (`id token` lines; `#` comments; a token may be
/// given as `sha256:HEX`): every id must lie in `0..clients` and appear
/// once.
pub fn read_tokens(path: &Path, clients: usize) -> Result<HashMap<u64, Credential>, NetError> {
    let lines = crate::read_id_lines::<u64>(path, "token")?;
    let mut out = HashMap::new();
    for (id, value) in lines {
        if id >= clients as u64 {
            return Err(NetError::file(
                path,
                format!("id {id} is outside 0..{clients} (the config's clients)"),
            ));
        }
        let c =
            Credential::parse(&value).map_err(|e| NetError::file(path, format!("id {id}: {e}")))?;
        out.insert(id, c);
    }
    Ok(out)
}

/// The common-name prefix of a client certificate: `fedweave-client-I`
/// authenticates client (or peer) I.
pub const CERT_NAME_PREFIX: &str = "fedweave-client-";

/// The client id a certificate (DER) authenticates: its subject's common
/// name `fedweave-client-I`; `None` for any other certificate.
pub fn cert_identity(der: &[u8]) -> Option<u64> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let mut names = cert.subject().iter_common_name();
    let cn = names.next()?.as_str().ok()?;
    if names.next().is_some() {
        return None;
    }
    let id = cn.strip_prefix(CERT_NAME_PREFIX)?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) || id.len() > 19 {
        return None;
    }
    id.parse().ok()
}

/// The id the TLS client certificate of `request` authenticates (`None`:
/// no TLS, no certificate, or not a fedweave client certificate).
pub fn caller_cert_id<T>(request: &tonic::Request<T>) -> Option<u64> {
    let certs = request.peer_certs()?;
    cert_identity(certs.first()?.as_ref())
}

/// Whether serving on `listen` is reachable only from this machine.
pub fn is_loopback(listen: &SocketAddr) -> bool {
    listen.ip().is_loopback()
}

/// The rule for exposing a service: on a non-loopback address, TLS and
/// client credentials are required unless `insecure` (then a warning
/// says what is exposed). `what` names the service in messages.
pub fn check_exposure(
    what: &str,
    listen: &SocketAddr,
    tls: bool,
    credentials: bool,
    insecure: bool,
) -> Result<(), NetError> {
    if is_loopback(listen) || (tls && credentials) {
        return Ok(());
    }
    let missing = match (tls, credentials) {
        (false, false) => "in plaintext and without client credentials",
        (false, true) => "in plaintext (tokens and models readable on the network)",
        _ => "without client credentials (anyone who reaches it may take a client id)",
    };
    if insecure {
        tracing::warn!("{what} on {listen} {missing}: --insecure was given");
        eprintln!("warning: {what} on {listen} {missing} (--insecure)");
        Ok(())
    } else {
        Err(NetError::Unsupported(format!(
            "{what} on the non-loopback address {listen} {missing}: give TLS (--tls-cert/--tls-key) \
             and client credentials (--tokens or --client-ca), or --insecure to accept the risk"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_match_in_plain_or_hashed_form_only() {
        let plain = Credential::parse("s3cret").unwrap();
        assert!(plain.matches("s3cret"));
        assert!(!plain.matches("s3cre") && !plain.matches("s3cret!") && !plain.matches(""));
        let hashed =
            Credential::parse(&format!("sha256:{}", crate::wire::hex(&sha256(b"s3cret")))).unwrap();
        assert!(hashed.matches("s3cret") && !hashed.matches("s3cres"));
        assert!(Credential::parse("sha256:abc").is_err());
        assert!(Credential::parse("").is_err());
        assert_eq!(format!("{plain:?}"), "Credential::Plain(..)");
    }

    #[test]
    fn sessions_are_sixteen_fresh_bytes() {
        let a = new_session().unwrap();
        let b = new_session().unwrap();
        assert_eq!(a.len(), 16);
        assert_ne!(a, b);
    }

    #[test]
    fn tokens_files_refuse_duplicates_and_foreign_ids() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t");
        std::fs::write(&p, "0 a\n1 b\n").unwrap();
        assert_eq!(read_tokens(&p, 2).unwrap().len(), 2);
        let err = read_tokens(&p, 1).unwrap_err().to_string();
        assert!(err.contains("outside 0..1"), "{err}");
        std::fs::write(&p, "0 a\n0 b\n").unwrap();
        let err = read_tokens(&p, 2).unwrap_err().to_string();
        assert!(err.contains("twice"), "{err}");
    }

    #[test]
    fn exposure_needs_tls_and_credentials_or_insecure_off_loopback() {
        let lo: SocketAddr = "127.0.0.1:7070".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:7070".parse().unwrap();
        assert!(check_exposure("serving", &lo, false, false, false).is_ok());
        assert!(check_exposure("serving", &any, true, true, false).is_ok());
        assert!(check_exposure("serving", &any, false, true, false).is_err());
        assert!(check_exposure("serving", &any, true, false, false).is_err());
        assert!(check_exposure("serving", &any, false, false, true).is_ok());
    }
}
