//! `fedweave peer`: peer-to-peer methods (DPFL) with no server. Every peer
//! is a gRPC server for what it published and a client of the others; it
//! runs the simulator's own steps for its one client (train, score, the
//! algorithm's `peer_step` through a [`PeerNet`] that fetches over the
//! network), keeps its own books and writes `peer-I.json` into its output
//! directory: its graph row, scores and transfers per round, and its
//! best-validation test accuracy, bit-identical to the simulation's.

//!
//! Peers tolerate peers: a peer that has not published within the
//! config's `round_timeout` (dead, unreachable, slow) is absent for that
//! round — the method chooses among the peers it reached — and every
//! surviving peer finishes and writes its result. A peer that comes back
//! (restarted) learns from the others which round they are in and joins
//! them there. `Fetch` is authenticated — the caller's token (`--tokens`
//! on the serving side, `--token` on the asking side) or its client
//! certificate (`--client-ca`) — and the caller is who it authenticated
//! as, never who it claims to be.

use crate::auth::{self, Credential};
use crate::proto::peers_client::PeersClient;
use crate::proto::peers_server::{Peers, PeersServer};
use crate::transport::{IDLE_TIMEOUT, Limits, ServerTls};
use crate::wire::{self, CLIENT_HEADER, FetchRequest, Post, PostState, TOKEN_HEADER};
use crate::{NetError, transport};
use bytes::Bytes;
use fedweave_algos::{Algorithm, Message, PeerNet, PeerStep, Topology, Visitor};
use fedweave_sim::ExperimentConfig;
use fedweave_sim::runtime::{
    Derived, Exchange, HostedPeers, Score, Scores, StepFn, Trackers, Upload, track, train_client,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

/// How long a fetch waits on the serving side for a post that is not
/// there yet before answering "not yet".
const LONG_POLL: Duration = Duration::from_secs(5);

/// How `fedweave peer` runs.
pub struct PeerOptions {
    /// The experiment (every peer runs the same file).
    pub cfg: ExperimentConfig,
    /// This peer's client id.
    pub id: usize,
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Every peer's address (`host:port` or URL) by id (this one's may be
    /// absent).
    pub peers: HashMap<usize, String>,
    /// Where `peer-I.json` goes.
    pub out: PathBuf,
    /// TLS certificate and key (PEM) this peer presents — to the peers
    /// fetching from it, and, with `client_ca`, as its client certificate
    /// when it fetches (`fedweave certs --peers N` writes such ones).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// CA certificate (PEM) the other peers are verified with.
    pub ca: Option<PathBuf>,
    /// CA certificate (PEM) the fetching peers' certificates must chain
    /// to (mutual TLS: each names its id, `fedweave-client-I`).
    pub client_ca: Option<PathBuf>,
    /// `id token` lines (tokens or `sha256:` of them): the peers allowed
    /// to fetch from this one.
    pub tokens: Option<PathBuf>,
    /// This peer's own token, presented when it fetches.
    pub token: Option<String>,
    /// Listen on a non-loopback address without TLS or peer credentials.
    pub insecure: bool,
    /// The longest one request may take.
    pub request_timeout: Duration,
    /// The longest a connection may send nothing (default 60 s: honest
    /// peers ping every 20 s).
    pub idle_timeout: Duration,
    /// The largest message accepted from a peer (default: derived from
    /// the model, [`wire::message_limit`]).
    pub max_message: Option<usize>,
}

impl PeerOptions {
    /// Defaults (no TLS, no credentials, loopback only) for everything
    /// but the config, id, address, peers and output directory.
    pub fn new(
        cfg: ExperimentConfig,
        id: usize,
        listen: SocketAddr,
        peers: HashMap<usize, String>,
        out: PathBuf,
    ) -> Self {
        Self {
            cfg,
            id,
            listen,
            peers,
            out,
            tls: None,
            ca: None,
            client_ca: None,
            tokens: None,
            token: None,
            insecure: false,
            request_timeout: Duration::from_secs(120),
            idle_timeout: IDLE_TIMEOUT,
            max_message: None,
        }
    }
}

/// Reads a peers file: one `id address` pair a line (`host:port` or a
/// URL); `#` comments; an id given twice is an error.
pub fn read_peers(path: &Path) -> Result<HashMap<usize, String>, NetError> {
    crate::read_id_lines(path, "url")
}

/// A peer's URL: `host:port` gets `http://`, or `https://` with TLS.
fn peer_url(address: &str, tls: bool) -> String {
    if address.contains("://") {
        address.to_string()
    } else if tls {
        format!("https://{address}")
    } else {
        format!("http://{address}")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn peer_addresses_get_a_scheme_and_urls_keep_theirs() {
        assert_eq!(
            super::peer_url("10.0.0.2:7071", false),
            "http://10.0.0.2:7071"
        );
        assert_eq!(super::peer_url("peer3:7071", true), "https://peer3:7071");
        assert_eq!(super::peer_url("http://a:1", true), "http://a:1");
    }

    #[test]
    fn a_peer_skips_rounds_only_when_most_of_those_asked_are_ahead() {
        use super::rejoin_round;
        // Three others asked, in round 2 of 10.
        assert_eq!(rejoin_round(&mut [], 3, 2, 10), 3);
        // One liar naming round 9 cannot move it.
        assert_eq!(rejoin_round(&mut [9], 3, 2, 10), 3);
        // One of two is not a majority either.
        assert_eq!(rejoin_round(&mut [9], 2, 2, 10), 3);
        // Two of three: the earliest round they name.
        assert_eq!(rejoin_round(&mut [9, 6], 3, 2, 10), 6);
        // A majority naming a round past the end (finished) leaves it the
        // last round to run; one naming an earlier round (stale) cannot
        // move it backwards.
        assert_eq!(rejoin_round(&mut [u64::MAX, 40], 3, 2, 10), 10);
        assert_eq!(rejoin_round(&mut [11, 11], 2, 10, 10), 11);
        assert_eq!(rejoin_round(&mut [1, 1], 2, 5, 10), 6);
        // The only other peer ahead.
        assert_eq!(rejoin_round(&mut [4], 1, 2, 10), 4);
    }

    #[test]
    fn a_peer_is_behind_when_a_post_is_gone_or_two_rounds_are_past() {
        use super::Found;
        let published = |latest| Found::Published {
            payload: bytes::Bytes::new(),
            latest,
        };
        // Asking for round 5: a peer that has posted 6 is in step (it
        // posts 6 once it has this one's 5); one that has posted 7 went
        // on without this one.
        assert_eq!(published(5).ahead_of(5), None);
        assert_eq!(published(6).ahead_of(5), None);
        assert_eq!(published(7).ahead_of(5), Some(7));
        assert_eq!(Found::Nothing { latest: 9 }.ahead_of(5), Some(9));
        assert_eq!(published(u64::MAX).ahead_of(u64::MAX), None);
        assert_eq!(Found::Absent { ahead: Some(6) }.ahead_of(5), Some(6));
        assert_eq!(Found::Absent { ahead: None }.ahead_of(5), None);
    }
}

/// One round as a peer saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerRound {
    /// The round.
    pub round: usize,
    /// Whether it published a sound model.
    pub published: bool,
    /// Its graph row: (peer, weight) pairs.
    pub row: Vec<(usize, f64)>,
    /// Score before training, when the protocol asks for it.
    pub before: Option<Score>,
    /// Score at the algorithm's point.
    pub after: Score,
    /// Models it fetched from other peers.
    pub transfers: u64,
    /// Bytes it fetched.
    pub bytes: u64,
    /// Reward evaluations spent choosing.
    pub evaluations: usize,
    /// Rewards alone and of the chosen set.
    pub rewards: Option<(f64, f64)>,
    /// Participants it could not reach within `round_timeout` (absent
    /// this round for it).
    #[serde(default)]
    pub absent: Vec<usize>,
}

/// A peer's whole run (`peer-I.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerReport {
    /// Its client id.
    pub id: usize,
    /// The algorithm.
    pub algorithm: String,
    /// Every round it ran (a peer that came back skips to the others'
    /// round).
    pub rounds: Vec<PeerRound>,
    /// Test accuracy at its best validation round.
    pub best_test_acc: f64,
    /// That round.
    pub best_round: usize,
}

/// What this peer published, by round (`None`: nothing this round); the
/// round after the last holds the "finished" mark.
#[derive(Default)]
struct Board {
    posts: Mutex<BTreeMap<u64, Option<Bytes>>>,
    posted: tokio::sync::Notify,
    /// The "finished" round, once posted, and who has fetched it: a peer
    /// leaves once every other peer has seen it finish (or a deadline
    /// passed), or a slower peer would find it gone.
    finished: OnceLock<u64>,
    seen_finished: Mutex<HashSet<u64>>,
    seen: tokio::sync::Notify,
}

impl Board {
    fn post(&self, round: u64, message: Option<Vec<u8>>) {
        let mut p = self.posts.lock().unwrap_or_else(|e| e.into_inner());
        p.insert(round, message.map(Bytes::from));
        // Others fetch the current round; older posts are not asked for.
        while p.len() > 4 {
            p.pop_first();
        }
        drop(p);
        self.posted.notify_waiters();
    }
}

/// Who may fetch from this peer.
struct PeerAuth {
    clients: usize,
    tokens: Option<HashMap<u64, Credential>>,
    client_certs: bool,
}

impl PeerAuth {
    /// The id the caller authenticated as (`None`: no credentials are
    /// required and it named none). With credentials required, a caller
    /// without them is refused.
    fn caller<T>(&self, request: &Request<T>) -> Result<Option<u64>, Status> {
        let header = |key: &str| {
            request
                .metadata()
                .get(key)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let claimed: Option<u64> = match header(CLIENT_HEADER) {
            Some(v) => Some(
                v.parse()
                    .map_err(|_| Status::unauthenticated("malformed peer id"))?,
            ),
            None => None,
        };
        let mut id = claimed;
        if self.client_certs {
            let cert = auth::caller_cert_id(request).ok_or_else(|| {
                Status::unauthenticated("a peer certificate (fedweave-client-I) is required")
            })?;
            if claimed.is_some_and(|c| c != cert) {
                return Err(Status::unauthenticated(
                    "the peer id named differs from the certificate's",
                ));
            }
            id = Some(cert);
        }
        if let Some(tokens) = &self.tokens {
            let who = claimed.ok_or_else(|| Status::unauthenticated("a peer id is required"))?;
            let token = header(TOKEN_HEADER).unwrap_or_default();
            if !tokens.get(&who).is_some_and(|c| c.matches(&token)) {
                return Err(Status::unauthenticated(format!(
                    "peer {who}: missing or wrong token"
                )));
            }
        }
        if id.is_some_and(|i| i >= self.clients as u64) {
            return Err(Status::unauthenticated("unknown peer id"));
        }
        Ok(id)
    }
}

struct PeerService {
    board: Arc<Board>,
    auth: PeerAuth,
}

#[tonic::async_trait]
impl Peers for PeerService {
    async fn fetch(&self, request: Request<FetchRequest>) -> Result<Response<Post>, Status> {
        let who = self.auth.caller(&request)?;
        let req = request.into_inner();
        let deadline = tokio::time::Instant::now() + LONG_POLL;
        let answer = |state: PostState, payload: Bytes, latest: u64| {
            Ok(Response::new(Post {
                state: state as i32,
                payload,
                latest,
            }))
        };
        loop {
            let notified = self.board.posted.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let p = self.board.posts.lock().unwrap_or_else(|e| e.into_inner());
                let latest = p.keys().next_back().copied().unwrap_or(0);
                match p.get(&req.round) {
                    Some(Some(m)) => {
                        if self.board.finished.get() == Some(&req.round)
                            && let Some(who) = who
                        {
                            let mut seen = self
                                .board
                                .seen_finished
                                .lock()
                                .unwrap_or_else(|e| e.into_inner());
                            seen.insert(who);
                            self.board.seen.notify_waiters();
                        }
                        let payload = if req.probe { Bytes::new() } else { m.clone() };
                        return answer(PostState::Published, payload, latest);
                    }
                    Some(None) => return answer(PostState::Nothing, Bytes::new(), latest),
                    None if p.keys().next().is_some_and(|&k| k > req.round) => {
                        return answer(PostState::Gone, Bytes::new(), latest);
                    }
                    None => {}
                }
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => {
                    let p = self.board.posts.lock().unwrap_or_else(|e| e.into_inner());
                    let latest = p.keys().next_back().copied().unwrap_or(0);
                    return answer(PostState::NotYet, Bytes::new(), latest);
                }
            }
        }
    }
}

/// What asking a peer for its post of a round found; `latest` is the
/// latest round it says it has posted (hostile: only a majority of peers
/// naming rounds ahead moves this one, see [`rejoin_round`]).
#[derive(Clone, Debug)]
enum Found {
    /// Published (the message, unless it was a probe).
    Published { payload: Bytes, latest: u64 },
    /// It published nothing that round.
    Nothing { latest: u64 },
    /// Not reached in time, or it refused us; `ahead` = its latest round
    /// when it is past the one asked for.
    Absent { ahead: Option<u64> },
}

impl Found {
    /// The round the peer asked for `round` is at, when that shows this
    /// peer is behind: its post of `round` gone, or a later round than
    /// `round + 1` posted. A peer posts `round + 2` only after finishing
    /// `round + 1` without this one, so a peer that restarted from round 1
    /// learns where the others are even while its rounds' posts are still
    /// held.
    fn ahead_of(&self, round: u64) -> Option<u64> {
        match *self {
            Self::Absent { ahead } => ahead,
            Self::Published { latest, .. } | Self::Nothing { latest } => round
                .checked_add(2)
                .is_some_and(|r| latest >= r)
                .then_some(latest),
        }
    }
}

/// How this peer asks another.
#[derive(Clone)]
struct Asker {
    me: u64,
    token: Option<String>,
    max_message: usize,
}

impl Asker {
    /// Asks peer `j` (on `channel`) for its post of `round` until
    /// `deadline`: retries while it is not there yet or unreachable.
    async fn ask(
        &self,
        channel: Channel,
        j: usize,
        round: u64,
        probe: bool,
        deadline: Instant,
    ) -> Found {
        let mut rpc = PeersClient::new(channel)
            .max_decoding_message_size(self.max_message)
            .max_encoding_message_size(wire::JOIN_LIMIT);
        let mut delay = Duration::from_millis(50);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Found::Absent { ahead: None };
            }
            let mut request = Request::new(FetchRequest { round, probe });
            request.set_timeout(left.max(Duration::from_millis(10)));
            let m = request.metadata_mut();
            if let Ok(v) = self.me.to_string().parse() {
                m.insert(CLIENT_HEADER, v);
            }
            if let Some(t) = self.token.as_deref().and_then(|t| t.parse().ok()) {
                m.insert(TOKEN_HEADER, t);
            }
            match rpc.fetch(request).await {
                Ok(post) => {
                    let post = post.into_inner();
                    match PostState::try_from(post.state) {
                        Ok(PostState::Published) => {
                            return Found::Published {
                                payload: post.payload,
                                latest: post.latest,
                            };
                        }
                        Ok(PostState::Nothing) => {
                            return Found::Nothing {
                                latest: post.latest,
                            };
                        }
                        Ok(PostState::Gone) => {
                            return Found::Absent {
                                ahead: Some(post.latest),
                            };
                        }
                        // The long poll expired: ask again.
                        Ok(PostState::NotYet) => continue,
                        Err(_) => {
                            tracing::warn!(peer = j, "answered with an unknown state");
                            return Found::Absent { ahead: None };
                        }
                    }
                }
                Err(s)
                    if matches!(
                        s.code(),
                        Code::Unauthenticated | Code::PermissionDenied | Code::Unimplemented
                    ) =>
                {
                    tracing::warn!(peer = j, "refused: {}", s.message());
                    return Found::Absent { ahead: None };
                }
                Err(s) => {
                    tracing::debug!(peer = j, "not reached: {}", s.message());
                    let left = deadline.saturating_duration_since(Instant::now());
                    tokio::time::sleep(delay.min(left)).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                }
            }
        }
    }
}

/// Runs one peer to the end of the run; `on_ready` learns its address.
/// `peer-I.json` is written before the peer waits for the others to see
/// it finish.
pub fn run_peer(
    opts: PeerOptions,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<PeerReport, NetError> {
    opts.cfg.validate().map_err(fedweave_sim::RunError::from)?;
    crate::server::refuse_simulation_settings(&opts.cfg)?;
    if fedweave_data::dataset(&opts.cfg.data.dataset).is_some_and(|d| d.client_files) {
        return Err(NetError::Unsupported(
            "peers weigh each other by data size, which per-client files (data.dataset = \"csv\") do not let a peer know: derive the data from the config".into(),
        ));
    }
    let n = opts.cfg.clients;
    if opts.id >= n {
        return Err(NetError::Unsupported(format!(
            "peer id {} is outside 0..{n}",
            opts.id
        )));
    }
    if let Some(bad) = opts.peers.keys().find(|&&j| j >= n) {
        return Err(NetError::Unsupported(format!(
            "the peers file names peer {bad}, outside 0..{n} (the config's clients)"
        )));
    }
    if let Some(missing) = (0..n).find(|j| *j != opts.id && !opts.peers.contains_key(j)) {
        return Err(NetError::Unsupported(format!(
            "the peers file has no URL for peer {missing}"
        )));
    }
    auth::check_exposure(
        &format!("peer {}", opts.id),
        &opts.listen,
        opts.tls.is_some(),
        opts.tokens.is_some() || opts.client_ca.is_some(),
        opts.insecure,
    )?;
    let tokens = opts
        .tokens
        .as_deref()
        .map(|p| auth::read_tokens(p, n))
        .transpose()?;
    let derived = Derived::load(&opts.cfg)?;
    let max_message = opts
        .max_message
        .unwrap_or_else(|| wire::message_limit(derived.env().init.len(), wire::UPLOAD_MODELS));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| NetError::Transport(e.to_string()))?;
    let board = Arc::new(Board::default());
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(opts.listen))
        .map_err(|e| NetError::Transport(format!("cannot listen on {}: {e}", opts.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| NetError::Transport(e.to_string()))?;
    let service = PeersServer::new(PeerService {
        board: board.clone(),
        auth: PeerAuth {
            clients: n,
            tokens,
            client_certs: opts.client_ca.is_some(),
        },
    })
    .max_decoding_message_size(wire::JOIN_LIMIT)
    .max_encoding_message_size(usize::MAX);
    let tls = ServerTls {
        identity: opts.tls.clone(),
        client_ca: opts.client_ca.clone(),
    };
    let limits = Limits {
        // Each other peer asks one thing at a time, a few at the end.
        streams_per_connection: 16,
        request_timeout: opts.request_timeout,
        idle_timeout: opts.idle_timeout,
    };
    let mut builder = transport::server(&tls, &limits)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let incoming = transport::incoming(listener, limits.idle_timeout);
    let serving = runtime.spawn(builder.add_service(service).serve_with_incoming_shutdown(
        incoming,
        async {
            stopped.await.ok();
        },
    ));
    on_ready(addr);
    // Lazy channels spawn their connection tasks on this runtime.
    let _entered = runtime.enter();
    let identity = opts.client_ca.as_ref().and(opts.tls.as_ref());
    let mut channels = HashMap::new();
    for (&j, url) in &opts.peers {
        if j != opts.id {
            let url = peer_url(url, opts.ca.is_some());
            let ep = transport::endpoint(&url, opts.ca.as_deref(), identity, opts.request_timeout)?;
            channels.insert(j, ep.connect_lazy());
        }
    }
    let cfg = derived.cfg().clone();
    let runner = PeerRunner {
        derived: &derived,
        board: &board,
        channels: &channels,
        handle: runtime.handle().clone(),
        opts: &opts,
        asker: Asker {
            me: opts.id as u64,
            token: opts.token.clone(),
            max_message,
        },
        round_timeout: Duration::from_secs_f64(cfg.round_timeout),
    };
    let result = fedweave_algos::dispatch(
        cfg.algorithm_name(),
        &cfg.algorithm_params(),
        &derived.env(),
        runner,
    )
    .map_err(fedweave_sim::RunError::from)
    .map_err(NetError::from)
    .and_then(|r| r);
    stop.send(()).ok();
    runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(2), serving).await })
        .ok();
    result
}

struct PeerRunner<'a> {
    derived: &'a Derived,
    board: &'a Board,
    channels: &'a HashMap<usize, Channel>,
    handle: tokio::runtime::Handle,
    opts: &'a PeerOptions,
    asker: Asker,
    round_timeout: Duration,
}

/// Fetches peer messages over gRPC, at most once each per round, and
/// counts every delivery as the simulator does.
struct GrpcNet<'a, A: Algorithm> {
    runner: &'a PeerRunner<'a>,
    algo: &'a A,
    round: u64,
    own: Option<&'a A::Up>,
    published: Vec<usize>,
    cache: Vec<OnceLock<Option<A::Up>>>,
    transfers: AtomicU64,
    bytes: AtomicU64,
}

impl PeerRunner<'_> {
    /// Asks each of `peers` for its post of `round` at once, until
    /// `deadline`.
    fn ask_all(&self, peers: &[usize], round: u64, probe: bool, deadline: Instant) -> Vec<Found> {
        let asks: Vec<_> = peers
            .iter()
            .map(|&j| {
                let (asker, channel) = (self.asker.clone(), self.channels[&j].clone());
                self.handle
                    .spawn(async move { asker.ask(channel, j, round, probe, deadline).await })
            })
            .collect();
        self.handle.block_on(async move {
            let mut out = Vec::with_capacity(asks.len());
            for a in asks {
                out.push(a.await.unwrap_or(Found::Absent { ahead: None }));
            }
            out
        })
    }

    /// Stays until every other peer has seen this one's "finished" mark
    /// (and has been shown its own), or `round_timeout` has passed: a
    /// peer that is gone is not waited for longer, and peers absent in the
    /// last round (`gone`) not at all.
    fn linger(&self, done: u64, gone: &[usize]) {
        let mut others: Vec<usize> = self
            .channels
            .keys()
            .copied()
            .filter(|j| !gone.contains(j))
            .collect();
        others.sort_unstable();
        let deadline = Instant::now() + self.round_timeout;
        let asks: Vec<_> = others
            .iter()
            .map(|&j| {
                let (asker, channel) = (self.asker.clone(), self.channels[&j].clone());
                self.handle
                    .spawn(async move { asker.ask(channel, j, done, true, deadline).await })
            })
            .collect();
        let board = self.board;
        let missing = self.handle.block_on(async move {
            let until =
                tokio::time::Instant::now() + deadline.saturating_duration_since(Instant::now());
            let missing = loop {
                let notified = board.seen.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let missing: Vec<usize> = {
                    let seen = board
                        .seen_finished
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    others
                        .iter()
                        .filter(|&&j| !seen.contains(&(j as u64)))
                        .copied()
                        .collect()
                };
                if missing.is_empty() {
                    break missing;
                }
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep_until(until) => break missing,
                }
            };
            for a in asks {
                a.await.ok();
            }
            missing
        });
        if !missing.is_empty() {
            tracing::warn!(?missing, "peers that never saw this one finish (gone?)");
        }
    }
}

impl<A: Algorithm> PeerNet<A::Up> for GrpcNet<'_, A> {
    fn fetch(&self, to: usize, peer: usize) -> Option<&A::Up> {
        if peer == to {
            return self.own;
        }
        let slot = self.cache.get(peer)?.get_or_init(|| {
            if self.published.binary_search(&peer).is_err() {
                return None;
            }
            let r = self.runner;
            let deadline = Instant::now() + r.round_timeout;
            let found = r.ask_all(&[peer], self.round, false, deadline);
            let Some(Found::Published { payload: bytes, .. }) = found.into_iter().next() else {
                tracing::warn!(peer, "its model could not be fetched");
                return None;
            };
            let up: A::Up = wire::decode(&bytes, r.asker.max_message)
                .map_err(|e| tracing::warn!(peer, "bad message: {e}"))
                .ok()?;
            let env = r.derived.env();
            match self.algo.check_upload(&env, &up) {
                Ok(()) => Some(up),
                Err(why) => {
                    tracing::warn!(peer, "message rejected ({why})");
                    None
                }
            }
        });
        let m = slot.as_ref()?;
        self.transfers.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(m.bytes(), Ordering::Relaxed);
        Some(m)
    }

    fn published(&self) -> &[usize] {
        &self.published
    }
}

/// This peer's one client, as the shared round ([`Derived::peer_round`])
/// sees it: trained and scored here, published on this peer's board, the
/// others' messages fetched over gRPC.
struct PeerHost<'a, A: Algorithm> {
    runner: &'a PeerRunner<'a>,
    algo: &'a A,
    state: A::Client,
    /// The rounds named by the participants that were past the one asked
    /// for, in the last exchange.
    ahead: Vec<u64>,
    /// The other participants asked in the last exchange.
    asked: usize,
}

impl<A: Algorithm> HostedPeers<A> for PeerHost<'_, A> {
    fn scores(&mut self) -> Vec<(usize, Score)> {
        let (d, me) = (self.runner.derived, self.runner.opts.id);
        if d.is_benign(me) {
            vec![(me, d.score(self.algo, me, &self.state))]
        } else {
            Vec::new()
        }
    }

    fn train(&mut self, round: usize, participants: &[usize], origin: bool) -> Vec<Upload<A::Up>> {
        let (d, me) = (self.runner.derived, self.runner.opts.id);
        if participants.binary_search(&me).is_err() {
            return Vec::new();
        }
        let data = d.data(me);
        let env = d.client_env(me);
        vec![train_client(
            self.algo,
            &env,
            data,
            d.cfg().seed,
            round,
            me,
            &mut self.state,
            origin,
            None,
        )]
    }

    fn exchange(
        &mut self,
        round: usize,
        participants: &[usize],
        sound: Vec<(usize, A::Up)>,
        step: &StepFn<'_, A>,
    ) -> Exchange {
        let r = self.runner;
        let me = r.opts.id;
        let mut own = sound.into_iter().find(|(i, _)| *i == me).map(|(_, u)| u);
        match own.as_ref().map(wire::encode).transpose() {
            Ok(post) => r.board.post(round as u64, post),
            Err(e) => {
                tracing::warn!(round, "own message not published: {e}");
                r.board.post(round as u64, None);
                own = None;
            }
        }
        // Who published: each other participant's post, asked for at once
        // and waited for until the round's deadline.
        let others: Vec<usize> = participants.iter().copied().filter(|&j| j != me).collect();
        let deadline = Instant::now() + r.round_timeout;
        let found = r.ask_all(&others, round as u64, true, deadline);
        let mut published = Vec::new();
        let mut absent = Vec::new();
        self.ahead.clear();
        self.asked = others.len();
        for &j in participants {
            if j == me {
                if own.is_some() {
                    published.push(j);
                }
                continue;
            }
            let k = others.binary_search(&j).unwrap_or_default();
            self.ahead.extend(found[k].ahead_of(round as u64));
            match &found[k] {
                Found::Published { .. } => published.push(j),
                Found::Nothing { .. } => {}
                Found::Absent { .. } => absent.push(j),
            }
        }
        if !absent.is_empty() {
            tracing::warn!(
                round,
                ?absent,
                "peers absent this round (not reached within round_timeout)"
            );
        }
        let net = GrpcNet {
            runner: r,
            algo: self.algo,
            round: round as u64,
            own: own.as_ref(),
            published,
            cache: (0..r.derived.cfg().clients)
                .map(|_| OnceLock::new())
                .collect(),
            transfers: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        };
        let steps = match own {
            Some(_) => step(me, &mut self.state, &net)
                .map(|s| (me, s))
                .into_iter()
                .collect(),
            None => Vec::new(),
        };
        Exchange {
            steps,
            absent,
            transfers: net.transfers.load(Ordering::Relaxed),
            bytes: net.bytes.load(Ordering::Relaxed),
        }
    }
}

/// The round a peer runs after `round` (of `rounds`), given the rounds
/// named by the other participants that were ahead of it (`ahead`) out
/// of the `asked` ones: the next round, unless most of those asked are
/// ahead — then the earliest round they name, so one peer's word alone
/// cannot make this one skip rounds. A peer behind runs the last round
/// even when the others have finished: their last posts are still held.
fn rejoin_round(ahead: &mut [u64], asked: usize, round: usize, rounds: usize) -> usize {
    ahead.sort_unstable();
    if 2 * ahead.len() > asked {
        let earliest = usize::try_from(ahead[0]).unwrap_or(usize::MAX);
        earliest.min(rounds).max(round + 1)
    } else {
        round + 1
    }
}

/// This peer's score among `scores`, if it is there.
fn own_score(scores: &Scores, me: usize) -> Option<Score> {
    let k = scores.clients.iter().position(|&i| i == me)?;
    Some(scores.scores[k])
}

impl Visitor for PeerRunner<'_> {
    type Output = Result<PeerReport, NetError>;

    fn visit<A: Algorithm>(self, algo: A, _: toml::Table) -> Self::Output {
        if algo.topology() != Topology::PeerToPeer {
            return Err(NetError::Unsupported(format!(
                "`{}` needs a server: run it with `fedweave serve` and clients",
                algo.name()
            )));
        }
        let d = self.derived;
        let cfg = d.cfg();
        let me = self.opts.id;
        let mut trackers = Trackers::new(cfg.clients);
        let mut rounds = Vec::new();
        let mut host = PeerHost {
            runner: &self,
            algo: &algo,
            state: algo.init_client(&d.env(), me),
            ahead: Vec::new(),
            asked: 0,
        };
        let mut round = 1;
        while round <= cfg.rounds {
            let outcome = d.peer_round(&algo, round, &mut host);
            track(
                &mut trackers,
                round,
                outcome.before.as_ref(),
                &outcome.after,
            );
            let ex = outcome.exchange;
            let published = outcome.published.contains(&me);
            let step = ex
                .steps
                .into_iter()
                .next()
                .map_or_else(|| PeerStep::keep(me), |(_, s)| s);
            tracing::info!(round, published, absent = ?ex.absent, "round done");
            rounds.push(PeerRound {
                round,
                published,
                row: step.row,
                before: outcome.before.as_ref().and_then(|s| own_score(s, me)),
                after: own_score(&outcome.after, me).unwrap_or_default(),
                transfers: ex.transfers,
                bytes: ex.bytes,
                evaluations: step.evaluations,
                rewards: step.rewards,
                absent: ex.absent,
            });
            // Behind the others (this peer came back, or was too slow)?
            let next = rejoin_round(&mut host.ahead, host.asked, round, cfg.rounds);
            if next > round + 1 {
                tracing::warn!(round, next, "the other peers are ahead: joining them");
            }
            round = next;
        }
        let (best, best_round) = trackers.best(me);
        let report = PeerReport {
            id: me,
            algorithm: algo.name().to_string(),
            rounds,
            best_test_acc: best.acc,
            best_round,
        };
        let out = &self.opts.out;
        std::fs::create_dir_all(out).map_err(|e| NetError::file(out, e))?;
        let p = out.join(format!("peer-{me}.json"));
        let text = serde_json::to_string_pretty(&report).map_err(|e| NetError::file(&p, e))?;
        std::fs::write(&p, text).map_err(|e| NetError::file(&p, e))?;
        // Stay while the others may still need this peer's posts.
        let done = cfg.rounds as u64 + 1;
        self.board.finished.set(done).ok();
        self.board.post(done, Some(Vec::new()));
        let gone = report
            .rounds
            .last()
            .map(|r| r.absent.clone())
            .unwrap_or_default();
        self.linger(done, &gone);
        Ok(report)
    }
}
