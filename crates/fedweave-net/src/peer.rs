//! `fedweave peer`: peer-to-peer methods (DPFL) with no server. Every peer
//! is a gRPC server for what it published and a client of the others; it
//! runs the simulator's own steps for its one client (train, score, the
//! algorithm's `peer_step` through a [`PeerNet`] that fetches over the
//! network), keeps its own books and writes `peer-I.json` into its output
//! directory: its graph row, scores and transfers per round, and its
//! best-validation test accuracy, bit-identical to the simulation's.

use crate::proto::peers_client::PeersClient;
use crate::proto::peers_server::{Peers, PeersServer};
use crate::wire::{self, Envelope, FetchRequest};
use crate::{NetError, transport};
use bytes::Bytes;
use fedweave_algos::{Algorithm, EvalPoint, Message, PeerNet, PeerStep, Topology, Visitor};
use fedweave_sim::ExperimentConfig;
use fedweave_sim::config::EvalWhen;
use fedweave_sim::runtime::{Derived, Score, Trackers, choose_participants, train_client};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

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
    /// TLS certificate and key (PEM) this peer presents.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// CA certificate (PEM) the other peers are verified with.
    pub ca: Option<PathBuf>,
    /// Give up on an unreachable peer after this long.
    pub retry_for: Duration,
    /// The largest message accepted or sent.
    pub max_message: usize,
}

/// Reads a peers file: one `id address` pair a line (`host:port` or a
/// URL); `#` comments.
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
}

/// A peer's whole run (`peer-I.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerReport {
    /// Its client id.
    pub id: usize,
    /// The algorithm.
    pub algorithm: String,
    /// Every round.
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
    /// leaves only when every other peer has seen it finish, or a slower
    /// peer would find it gone.
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

struct PeerService {
    board: Arc<Board>,
}

#[tonic::async_trait]
impl Peers for PeerService {
    async fn fetch(&self, request: Request<FetchRequest>) -> Result<Response<Envelope>, Status> {
        let req = request.into_inner();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let notified = self.board.posted.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let p = self.board.posts.lock().unwrap_or_else(|e| e.into_inner());
                match p.get(&req.round) {
                    Some(Some(m)) => {
                        if self.board.finished.get() == Some(&req.round) {
                            let mut seen = self
                                .board
                                .seen_finished
                                .lock()
                                .unwrap_or_else(|e| e.into_inner());
                            seen.insert(req.from);
                            self.board.seen.notify_waiters();
                        }
                        let payload = if req.probe { Bytes::new() } else { m.clone() };
                        return Ok(Response::new(Envelope { payload }));
                    }
                    Some(None) => {
                        return Err(Status::not_found(format!(
                            "nothing published in round {}",
                            req.round
                        )));
                    }
                    None if p.keys().next().is_some_and(|&k| k > req.round) => {
                        return Err(Status::out_of_range(format!("round {} is gone", req.round)));
                    }
                    None => {}
                }
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => {
                    return Err(Status::unavailable("not published yet"));
                }
            }
        }
    }
}

/// Runs one peer to the end of the run; `on_ready` learns its address.
pub fn run_peer(
    opts: PeerOptions,
    on_ready: impl FnOnce(SocketAddr),
) -> Result<PeerReport, NetError> {
    opts.cfg.validate().map_err(fedweave_sim::RunError::from)?;
    crate::server::refuse_simulation_settings(&opts.cfg)?;
    if opts.cfg.data.dataset == "csv" {
        return Err(NetError::Unsupported(
            "peers weigh each other by data size, which per-client files (data.dataset = \"csv\") do not let a peer know: derive the data from the config".into(),
        ));
    }
    if opts.id >= opts.cfg.clients {
        return Err(NetError::Unsupported(format!(
            "peer id {} is outside 0..{}",
            opts.id, opts.cfg.clients
        )));
    }
    if let Some(missing) =
        (0..opts.cfg.clients).find(|j| *j != opts.id && !opts.peers.contains_key(j))
    {
        return Err(NetError::Unsupported(format!(
            "the peers file has no URL for peer {missing}"
        )));
    }
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
    })
    .max_decoding_message_size(opts.max_message)
    .max_encoding_message_size(opts.max_message);
    let mut builder = transport::server(opts.tls.as_ref())?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let serving = runtime.spawn(builder.add_service(service).serve_with_incoming_shutdown(
        incoming,
        async {
            stopped.await.ok();
        },
    ));
    on_ready(addr);
    // Lazy channels spawn their connection tasks on this runtime.
    let _entered = runtime.enter();
    let mut channels = HashMap::new();
    for (&j, url) in &opts.peers {
        if j != opts.id && j < opts.cfg.clients {
            let url = peer_url(url, opts.ca.is_some());
            channels.insert(
                j,
                transport::endpoint(&url, opts.ca.as_deref())?.connect_lazy(),
            );
        }
    }
    let derived = Derived::load(&opts.cfg)?;
    let cfg = derived.cfg().clone();
    let runner = PeerRunner {
        derived: &derived,
        board: &board,
        channels: &channels,
        handle: runtime.handle().clone(),
        opts: &opts,
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
    runtime.block_on(serving).ok();
    let report = result?;
    std::fs::create_dir_all(&opts.out).map_err(|e| NetError::file(&opts.out, e))?;
    let p = opts.out.join(format!("peer-{}.json", opts.id));
    let text = serde_json::to_string_pretty(&report).map_err(|e| NetError::file(&p, e))?;
    std::fs::write(&p, text).map_err(|e| NetError::file(&p, e))?;
    Ok(report)
}

struct PeerRunner<'a> {
    derived: &'a Derived,
    board: &'a Board,
    channels: &'a HashMap<usize, Channel>,
    handle: tokio::runtime::Handle,
    opts: &'a PeerOptions,
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
    /// Peer `j`'s post of `round` (`probe`: only whether it published:
    /// an empty payload),
    /// retrying while it is not there yet or unreachable.
    fn fetch(&self, j: usize, round: u64, probe: bool) -> Result<Option<Vec<u8>>, NetError> {
        let channel = self.channels[&j].clone();
        let max = self.opts.max_message;
        let me = self.opts.id as u64;
        let limit = self.opts.retry_for;
        self.handle.block_on(async move {
            let mut rpc = PeersClient::new(channel)
                .max_decoding_message_size(max)
                .max_encoding_message_size(max);
            let mut delay = Duration::from_millis(50);
            let mut since = Instant::now();
            loop {
                match rpc
                    .fetch(FetchRequest {
                        round,
                        from: me,
                        probe,
                    })
                    .await
                {
                    Ok(e) => return Ok(Some(e.into_inner().payload.into())),
                    Err(s) if s.code() == Code::NotFound => return Ok(None),
                    Err(s) if s.code() == Code::OutOfRange => {
                        return Err(NetError::Transport(format!("peer {j}: {}", s.message())));
                    }
                    // Not there yet: the long poll expired; ask again.
                    Err(s)
                        if s.code() == Code::Unavailable && s.message() == "not published yet" =>
                    {
                        since = Instant::now();
                    }
                    Err(s) => {
                        if since.elapsed() > limit {
                            return Err(NetError::Transport(format!(
                                "peer {j} unreachable: {}",
                                s.message()
                            )));
                        }
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(Duration::from_secs(5));
                    }
                }
            }
        })
    }
}

impl PeerRunner<'_> {
    /// Waits (up to `retry_for`) until every other peer has fetched this
    /// one's "finished" mark.
    fn wait_until_seen_finished(&self) -> Result<(), NetError> {
        let others: Vec<u64> = self.channels.keys().map(|&j| j as u64).collect();
        let board = self.board;
        let deadline = tokio::time::Instant::now() + self.opts.retry_for;
        self.handle.block_on(async move {
            loop {
                let notified = board.seen.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let missing: Vec<u64> = {
                    let seen = board
                        .seen_finished
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    others
                        .iter()
                        .filter(|j| !seen.contains(j))
                        .copied()
                        .collect()
                };
                if missing.is_empty() {
                    return Ok(());
                }
                tokio::select! {
                    _ = &mut notified => {}
                    _ = tokio::time::sleep_until(deadline) => {
                        return Err(NetError::Transport(format!(
                            "peers {missing:?} never asked whether this peer finished"
                        )));
                    }
                }
            }
        })
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
            let bytes = self
                .runner
                .fetch(peer, self.round, false)
                .map_err(|e| tracing::warn!(peer, "fetch failed: {e}"))
                .ok()??;
            let up: A::Up = wire::decode(&bytes, self.runner.opts.max_message)
                .map_err(|e| tracing::warn!(peer, "bad message: {e}"))
                .ok()?;
            let env = self.runner.derived.env();
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
        let env = d.env();
        let me = self.opts.id;
        let n = cfg.clients;
        let mut state = algo.init_client(&env, me);
        let mut trackers = Trackers::new(n);
        let mut rounds = Vec::new();
        for round in 1..=cfg.rounds {
            let participants = choose_participants(cfg, round);
            let before =
                (cfg.eval.when == EvalWhen::BeforeAndAfter).then(|| d.score(&algo, me, &state));
            if let Some(b) = before {
                trackers.record(round, me, b);
            }
            let mut own = None;
            if participants.binary_search(&me).is_ok() {
                let u = train_client(
                    &algo,
                    &d.client_env(me),
                    d.data(me),
                    cfg.seed,
                    round,
                    me,
                    &mut state,
                    false,
                    None,
                );
                match algo.check_upload(&env, &u.up) {
                    Ok(()) => own = Some(u.up),
                    Err(why) => tracing::warn!(round, "own upload rejected ({why}); not published"),
                }
            }
            self.board
                .post(round as u64, own.as_ref().map(wire::encode).transpose()?);
            let mut after =
                (algo.eval_point() == EvalPoint::AfterTraining).then(|| d.score(&algo, me, &state));
            let mut published = Vec::new();
            for &j in &participants {
                let there = if j == me {
                    own.is_some()
                } else {
                    // Whether j published: its post, fetched once and kept.
                    self.fetch(j, round as u64, true)?.is_some()
                };
                if there {
                    published.push(j);
                }
            }
            let net = GrpcNet {
                runner: &self,
                algo: &algo,
                round: round as u64,
                own: own.as_ref(),
                published,
                cache: (0..n).map(|_| OnceLock::new()).collect(),
                transfers: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
            };
            let step = if own.is_some() {
                let mut cx = d.selection_cx(me, round);
                algo.peer_step(&env, &mut cx, &mut state, &net)
            } else {
                PeerStep::keep(me)
            };
            if algo.eval_point() == EvalPoint::AfterReceive {
                after = Some(d.score(&algo, me, &state));
            }
            let after = after.unwrap_or_default();
            trackers.record(round, me, after);
            rounds.push(PeerRound {
                round,
                published: own.is_some(),
                row: step.row,
                before,
                after,
                transfers: net.transfers.load(Ordering::Relaxed),
                bytes: net.bytes.load(Ordering::Relaxed),
                evaluations: step.evaluations,
                rewards: step.rewards,
            });
        }
        // Stay until every other peer is done with this one's posts: wait
        // for each one's "finished" mark, then for each one to have seen
        // this one's.
        let done = cfg.rounds as u64 + 1;
        self.board.finished.set(done).ok();
        self.board.post(done, Some(Vec::new()));
        for &j in self.channels.keys() {
            self.fetch(j, done, true)?;
        }
        self.wait_until_seen_finished()?;
        let (best, best_round) = trackers.best(me);
        Ok(PeerReport {
            id: me,
            algorithm: algo.name().to_string(),
            rounds,
            best_test_acc: best.acc,
            best_round,
        })
    }
}
