//! Transport settings shared by the server, clients and peers: HTTP/2
//! flow-control windows sized for models, bounds on what one connection
//! may hold (concurrent streams, header size, request duration),
//! keepalive, a deadline on connections that send nothing, and TLS
//! (rustls through tonic) from PEM files, with client certificates (mutual
//! TLS) when a client CA is given.

use crate::NetError;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::{Connected, TcpIncoming};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};

/// HTTP/2 flow-control windows. The protocol's default (64 KiB) makes a
/// sender stop for a window update every 64 KiB; a model is megabytes.
const STREAM_WINDOW: u32 = 8 << 20;
const CONNECTION_WINDOW: u32 = 32 << 20;
/// Keepalive: a ping every 20 s, a connection dead after 20 s without an
/// answer (a vanished machine frees its streams).
const KEEPALIVE: Duration = Duration::from_secs(20);
/// Headers of one request: ids, sessions and tokens are a few bytes.
const MAX_HEADERS: u32 = 16 << 10;
/// The longest a TLS handshake may take.
const TLS_HANDSHAKE: Duration = Duration::from_secs(10);
/// A connection that sends nothing for this long is closed. Honest
/// parties never go quiet that long: their HTTP/2 pings (every
/// [`KEEPALIVE`], and their answers to ours) are traffic; a stranger that
/// connects and stays silent (no handshake, no preface) is not.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(3 * KEEPALIVE.as_secs());

/// How a listening side bounds its connections.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Concurrent streams one connection may open (a worker hosting many
    /// clients holds one long poll per client).
    pub streams_per_connection: u32,
    /// The longest a request may take, its upload included (a trickling
    /// sender is cut off).
    pub request_timeout: Duration,
    /// The longest a connection may send nothing ([`IDLE_TIMEOUT`]).
    pub idle_timeout: Duration,
}

/// The connections `listener` accepts, each closed once it has sent
/// nothing for `idle` ([`IdleCutoff`]).
pub(crate) fn incoming(
    listener: TcpListener,
    idle: Duration,
) -> impl Stream<Item = io::Result<IdleCutoff<TcpStream>>> {
    TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(KEEPALIVE))
        .map(move |conn| conn.map(|io| IdleCutoff::new(io, idle)))
}

/// A connection whose reads fail (closing it) once the peer has sent
/// nothing for `idle`: the deadline moves with every byte received.
pub(crate) struct IdleCutoff<IO> {
    io: IO,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl<IO> IdleCutoff<IO> {
    fn new(io: IO, idle: Duration) -> Self {
        Self {
            io,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for IdleCutoff<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    let next = Instant::now() + self.idle;
                    self.deadline.as_mut().reset(next);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the peer sent nothing for too long",
                ))),
                Poll::Pending => Poll::Pending,
            },
            err => err,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for IdleCutoff<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The wrapped connection's address (and, under TLS, certificates) stay
/// what the services see.
impl<IO: Connected> Connected for IdleCutoff<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// TLS of a listening side: its certificate and key, and the CA its
/// clients' certificates must chain to (mutual TLS), if any.
#[derive(Clone, Debug, Default)]
pub struct ServerTls {
    /// Certificate and private key (PEM).
    pub identity: Option<(PathBuf, PathBuf)>,
    /// CA certificate (PEM) client certificates are verified with.
    pub client_ca: Option<PathBuf>,
}

/// A gRPC server builder with `limits`, serving TLS when `tls` has an
/// identity.
pub(crate) fn server(tls: &ServerTls, limits: &Limits) -> Result<Server, NetError> {
    let mut builder = Server::builder()
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(limits.streams_per_connection)
        .http2_max_header_list_size(MAX_HEADERS)
        .http2_keepalive_interval(Some(KEEPALIVE))
        .http2_keepalive_timeout(Some(KEEPALIVE))
        .tcp_keepalive(Some(KEEPALIVE))
        .timeout(limits.request_timeout)
        .tcp_nodelay(true);
    match (&tls.identity, &tls.client_ca) {
        (Some((cert, key)), ca) => {
            let mut config = ServerTlsConfig::new()
                .identity(Identity::from_pem(read(cert)?, read(key)?))
                .timeout(TLS_HANDSHAKE);
            if let Some(ca) = ca {
                config = config.client_ca_root(Certificate::from_pem(read(ca)?));
            }
            builder = builder
                .tls_config(config)
                .map_err(|e| NetError::Transport(e.to_string()))?;
        }
        (None, Some(_)) => {
            return Err(NetError::Unsupported(
                "client certificates (--client-ca) need TLS: give --tls-cert and --tls-key too"
                    .into(),
            ));
        }
        (None, None) => {}
    }
    Ok(builder)
}

/// A connection to `url`: TLS when a CA is given (then the URL must be
/// `https://`, and an `https://` URL needs a CA), presenting `identity`
/// (certificate, key) as a client certificate when given.
pub(crate) fn endpoint(
    url: &str,
    ca: Option<&Path>,
    identity: Option<&(PathBuf, PathBuf)>,
    request_timeout: Duration,
) -> Result<Endpoint, NetError> {
    let scheme = url
        .split("://")
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    match (scheme.as_str(), ca) {
        ("http", Some(_)) => {
            return Err(NetError::Unsupported(format!(
                "--ca is given but {url} is plaintext: connect to https://… (the server's TLS) or drop --ca"
            )));
        }
        ("https", None) => {
            return Err(NetError::Unsupported(format!(
                "{url} is TLS: give --ca, the CA certificate that signed the server's (fedweave certs writes ca.pem)"
            )));
        }
        ("http" | "https", _) => {}
        _ => {
            return Err(NetError::Unsupported(format!(
                "bad URL {url}: expected http://host:port or https://host:port"
            )));
        }
    }
    if identity.is_some() && ca.is_none() {
        return Err(NetError::Unsupported(
            "a client certificate needs TLS: give --ca and an https:// URL".into(),
        ));
    }
    let mut ep = Endpoint::from_shared(url.to_string())
        .map_err(|e| NetError::Transport(format!("bad URL {url}: {e}")))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(request_timeout)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE)
        .keep_alive_while_idle(true)
        .tcp_keepalive(Some(KEEPALIVE))
        .tcp_nodelay(true);
    if let Some(ca) = ca {
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
        if let Some((cert, key)) = identity {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        ep = ep
            .tls_config(config)
            .map_err(|e| NetError::Transport(e.to_string()))?;
    }
    Ok(ep)
}

/// Whether `url`'s host is this machine (a token sent in plaintext there
/// crosses no network).
pub(crate) fn is_local_url(url: &str) -> bool {
    let rest = url.split("://").nth(1).unwrap_or(url);
    let host = rest.split('/').next().unwrap_or_default();
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn read(path: &Path) -> Result<Vec<u8>, NetError> {
    std::fs::read(path).map_err(|e| NetError::file(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_needs_https_and_https_needs_a_ca() {
        let t = Duration::from_secs(1);
        let ca = Path::new("/nonexistent/ca.pem");
        let err = endpoint("http://10.0.0.1:7070", Some(ca), None, t).unwrap_err();
        assert!(err.to_string().contains("plaintext"), "{err}");
        let err = endpoint("https://10.0.0.1:7070", None, None, t).unwrap_err();
        assert!(err.to_string().contains("--ca"), "{err}");
        assert!(endpoint("ftp://x:1", None, None, t).is_err());
        assert!(endpoint("http://127.0.0.1:7070", None, None, t).is_ok());
    }

    #[test]
    fn local_urls_are_loopback_hosts() {
        assert!(is_local_url("http://127.0.0.1:7070"));
        assert!(is_local_url("http://localhost:1"));
        assert!(is_local_url("http://[::1]:7070"));
        assert!(!is_local_url("http://10.0.0.2:7070"));
        assert!(!is_local_url("http://example.org:7070"));
    }
}
