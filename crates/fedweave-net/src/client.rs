//! `fedweave client` and `fedweave worker`: clients of a networked run. A
//! client derives its shard from the same config as the simulator, joins
//! the server, and answers tasks: train (the simulator's
//! `train_client`), score on its own data, apply downloads. It keeps the
//! states it may need again (the server may resume from an earlier
//! checkpoint) and, with `--state DIR`, checkpoints its own state to disk
//! so a restarted client continues from it. Transport failures are
//! retried with exponential backoff; refusals (token, id) end it with the
//! server's reason. A worker hosts many clients in one process over one
//! HTTP/2 connection.

use crate::proto::federation_client::FederationClient;
use crate::proto::lobby_client::LobbyClient;
use crate::wire::{
    self, Answer, CLIENT_HEADER, Hello, Poll, Reply, SESSION_HEADER, Task, WireUpload,
};
use crate::{NetError, transport};
use fedweave_algos::{Algorithm, Visitor};
use fedweave_sim::ExperimentConfig;
use fedweave_sim::packed::{Unpacked, pack};
use fedweave_sim::runtime::{Derived, admit_download, checkpoint_due, train_client};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::Code;
use tonic::transport::Channel;

/// How `fedweave client` / `worker` run.
pub struct ClientOptions {
    /// The experiment (the same file the server runs).
    pub cfg: ExperimentConfig,
    /// The server's URL (`http://host:port`, or `https://` with TLS).
    pub connect: String,
    /// The client ids this process hosts.
    pub ids: Vec<usize>,
    /// The token presented for every hosted id.
    pub token: Option<String>,
    /// CA certificate (PEM) to verify the server with.
    pub ca: Option<PathBuf>,
    /// Client certificate and key (PEM) presented to a server that
    /// authenticates clients by certificate (`serve --client-ca`); a
    /// worker hosting several ids needs one naming each, so it takes
    /// `{id}` in the paths.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// Where each client checkpoints its own state.
    pub state_dir: Option<PathBuf>,
    /// Give up after this long without reaching the server.
    pub retry_for: Duration,
    /// The longest one request may take.
    pub request_timeout: Duration,
    /// The largest message accepted from the server (default: derived
    /// from the model and the number of clients, as a download may relay
    /// every client's model).
    pub max_message: Option<usize>,
}

impl ClientOptions {
    /// Defaults for everything but the config, URL and ids.
    pub fn new(cfg: ExperimentConfig, connect: String, ids: Vec<usize>) -> Self {
        Self {
            cfg,
            connect,
            ids,
            token: None,
            ca: None,
            identity: None,
            state_dir: None,
            retry_for: Duration::from_secs(120),
            request_timeout: Duration::from_secs(120),
            max_message: None,
        }
    }
}

/// Runs the hosted clients until the server says the run is over.
pub fn run_clients(opts: ClientOptions) -> Result<(), NetError> {
    opts.cfg.validate().map_err(fedweave_sim::RunError::from)?;
    if let Some(&bad) = opts.ids.iter().find(|&&i| i >= opts.cfg.clients) {
        return Err(NetError::Unsupported(format!(
            "client id {bad} is outside 0..{} (the config's clients)",
            opts.cfg.clients
        )));
    }
    let derived = Arc::new(Derived::load_hosted(&opts.cfg, &opts.ids)?);
    let cfg = derived.cfg().clone();
    // `graph-rule` clients train only; the rule runs in the server's process.
    fedweave_algos::graph_rule::install_if_absent(Arc::new(fedweave_algos::graph_rule::TrainOnly));
    let runner = Runner {
        derived: derived.clone(),
        opts,
    };
    fedweave_algos::dispatch(
        cfg.algorithm_name(),
        &cfg.algorithm_params(),
        &derived.env(),
        runner,
    )
    .map_err(fedweave_sim::RunError::from)?
}

struct Runner {
    derived: Arc<Derived>,
    opts: ClientOptions,
}

impl Visitor for Runner {
    type Output = Result<(), NetError>;

    fn visit<A: Algorithm>(self, algo: A, _: toml::Table) -> Self::Output {
        let Runner { derived, opts } = self;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| NetError::Transport(e.to_string()))?;
        if opts.token.is_some() && opts.ca.is_none() && !transport::is_local_url(&opts.connect) {
            tracing::warn!(
                "the token travels in plaintext to {}: serve TLS",
                opts.connect
            );
            eprintln!(
                "warning: the token travels in plaintext to {} (serve TLS and connect with https:// and --ca)",
                opts.connect
            );
        }
        // Lazy channels spawn their connection task on this runtime.
        let _entered = runtime.enter();
        // One connection for the process, or one per hosted id when each
        // id presents its own client certificate.
        let channel_for = |i: usize| -> Result<Channel, NetError> {
            let identity = opts.identity.as_ref().map(|(c, k)| {
                let fill = |p: &PathBuf| {
                    PathBuf::from(p.to_string_lossy().replace("{id}", &i.to_string()))
                };
                (fill(c), fill(k))
            });
            Ok(transport::endpoint(
                &opts.connect,
                opts.ca.as_deref(),
                identity.as_ref(),
                opts.request_timeout,
            )?
            .connect_lazy())
        };
        let shared = match &opts.identity {
            None => Some(channel_for(0)?),
            Some(_) => None,
        };
        let n = derived.cfg().clients;
        let host = Arc::new(Host {
            algo,
            token: opts.token.clone().unwrap_or_default(),
            state_dir: opts.state_dir.clone(),
            retry_for: opts.retry_for,
            max_message: opts.max_message.unwrap_or_else(|| {
                wire::message_limit(derived.env().init.len(), n + wire::UPLOAD_MODELS)
            }),
            derived,
        });
        let mut channels = Vec::with_capacity(opts.ids.len());
        for &i in &opts.ids {
            channels.push(match &shared {
                Some(c) => c.clone(),
                None => channel_for(i)?,
            });
        }
        runtime.block_on(async {
            let tasks: Vec<_> = opts
                .ids
                .iter()
                .zip(channels)
                .map(|(&i, channel)| tokio::spawn(host.clone().run(i, channel)))
                .collect();
            let mut first_error = None;
            for (t, &i) in tasks.into_iter().zip(&opts.ids) {
                let r = t
                    .await
                    .map_err(|e| NetError::Transport(format!("client {i} task failed: {e}")))
                    .and_then(|r| r);
                if let Err(e) = r {
                    tracing::error!(client = i, "{e}");
                    first_error.get_or_insert(e);
                }
            }
            first_error.map_or(Ok(()), Err)
        })
    }
}

/// What every hosted client shares.
struct Host<A> {
    algo: A,
    derived: Arc<Derived>,
    token: String,
    state_dir: Option<PathBuf>,
    retry_for: Duration,
    max_message: usize,
}

/// One client's own memory: its state after `round` rounds, and the states
/// it may be asked to start from again (the server resumes from its last
/// checkpoint, which may be behind the client).
struct Local<C> {
    round: usize,
    state: C,
    snapshots: BTreeMap<usize, Vec<u8>>,
}

/// What a client checkpoint file says it is.
const CLIENT_FORMAT: &str = "fedweave-client-state";

#[derive(Serialize, serde::Deserialize)]
struct Saved<C> {
    round: usize,
    state: C,
}

/// Exponential backoff from 100 ms to 5 s, giving up after `limit` of
/// consecutive failures.
struct Backoff {
    delay: Duration,
    since: Option<Instant>,
    limit: Duration,
}

impl Backoff {
    fn new(limit: Duration) -> Self {
        Self {
            delay: Duration::from_millis(100),
            since: None,
            limit,
        }
    }

    fn reset(&mut self) {
        self.delay = Duration::from_millis(100);
        self.since = None;
    }

    async fn wait(&mut self, i: usize, why: &tonic::Status) -> Result<(), NetError> {
        let since = *self.since.get_or_insert_with(Instant::now);
        if since.elapsed() > self.limit {
            return Err(NetError::Transport(format!(
                "client {i}: server unreachable for {:.0}s: {}",
                self.limit.as_secs_f64(),
                why.message()
            )));
        }
        tracing::info!(
            client = i,
            "retrying in {:?}: {}",
            self.delay,
            why.message()
        );
        tokio::time::sleep(self.delay).await;
        self.delay = (self.delay * 2).min(Duration::from_secs(5));
        Ok(())
    }
}

/// Writes `bytes` to `path` through a temporary file, so a crash leaves
/// the old file or the new one, never half of one.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), NetError> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| NetError::file(d, e))?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).map_err(|e| NetError::file(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| NetError::file(path, e))
}

fn pack_state<C: Serialize>(round: usize, state: &C) -> Result<Vec<u8>, NetError> {
    let meta = HashMap::from([("format".to_string(), CLIENT_FORMAT.to_string())]);
    pack(&Saved { round, state }, meta).map_err(NetError::Unsupported)
}

fn unpack_state<C: DeserializeOwned>(bytes: &[u8]) -> Result<Saved<C>, String> {
    let u = Unpacked::parse(bytes)?;
    if u.get("format") != CLIENT_FORMAT {
        return Err("not a fedweave client state".into());
    }
    u.value()
}

impl<A: Algorithm> Host<A> {
    fn state_file(&self, i: usize) -> Option<PathBuf> {
        self.state_dir
            .as_ref()
            .map(|d| d.join(format!("client-{i}.safetensors")))
    }

    /// The client's state: from its checkpoint when it has one, else fresh.
    fn load(&self, i: usize) -> Result<Local<A::Client>, NetError> {
        let env = self.derived.env();
        if let Some(p) = self.state_file(i)
            && p.exists()
        {
            let bytes = std::fs::read(&p).map_err(|e| NetError::file(&p, e))?;
            let saved: Saved<A::Client> =
                unpack_state(&bytes).map_err(|e| NetError::file(&p, e))?;
            tracing::info!(
                client = i,
                round = saved.round,
                "continuing from its checkpoint"
            );
            return Ok(Local {
                round: saved.round,
                snapshots: BTreeMap::from([(saved.round, bytes)]),
                state: saved.state,
            });
        }
        Ok(Local {
            round: 0,
            state: self.algo.init_client(&env, i),
            snapshots: BTreeMap::new(),
        })
    }

    /// Round `round` begins: rewind if the server is behind, keep the
    /// starting state, train and score.
    #[allow(clippy::too_many_arguments)]
    fn train(
        &self,
        i: usize,
        local: &mut Local<A::Client>,
        round: usize,
        participate: bool,
        before: bool,
        after: bool,
        origin: bool,
    ) -> Result<Reply<A::Up>, NetError> {
        let cfg = self.derived.cfg();
        if round == 0 || round > cfg.rounds {
            return Err(NetError::Unsupported(format!(
                "client {i}: the server asks for round {round} of a {}-round run",
                cfg.rounds
            )));
        }
        let from = round - 1;
        if local.round > from {
            // The server resumed from a checkpoint behind this client: the
            // state then is the latest one kept at or before it.
            match local.snapshots.range(..=from).next_back() {
                Some((_, bytes)) => {
                    let saved: Saved<A::Client> =
                        unpack_state(bytes).map_err(NetError::Unsupported)?;
                    local.round = from;
                    local.state = saved.state;
                }
                None if from == 0 => {
                    local.round = 0;
                    local.state = self.algo.init_client(&self.derived.env(), i);
                }
                None => {
                    return Err(NetError::Unsupported(format!(
                        "client {i}: the server restarts round {round} but this client kept no state for it"
                    )));
                }
            }
        }
        local
            .snapshots
            .insert(local.round, pack_state(local.round, &local.state)?);
        // Keep what a server restart may still ask for: everything from the
        // last checkpoint round before the current one.
        let keep_from = (0..local.round)
            .rev()
            .find(|&r| r == 0 || checkpoint_due(cfg.checkpoint_every, cfg.rounds, r))
            .unwrap_or(0);
        local.snapshots.retain(|&r, _| r >= keep_from);

        let score = |state: &A::Client| self.derived.score(&self.algo, i, state);
        let before = before.then(|| score(&local.state));
        let upload = participate.then(|| {
            let env = self.derived.client_env(i);
            let u = train_client(
                &self.algo,
                &env,
                self.derived.data(i),
                cfg.seed,
                round,
                i,
                &mut local.state,
                origin,
                None,
            );
            WireUpload {
                up: u.up,
                loss: u.loss,
                origin: u.origin,
            }
        });
        let after = after.then(|| score(&local.state));
        local.round = round;
        Ok(Reply::Trained {
            upload,
            before,
            after,
        })
    }

    /// Applies round `round`'s download and scores; checkpoints the state
    /// on the server's checkpoint rounds.
    fn receive(
        &self,
        i: usize,
        local: &mut Local<A::Client>,
        round: usize,
        down: Option<A::Down>,
        after: bool,
    ) -> Result<Reply<A::Up>, NetError> {
        let env = self.derived.env();
        if let Some(d) = down.and_then(|d| admit_download(&self.algo, &env, i, round, d)) {
            self.algo.receive(&env, &mut local.state, d);
        }
        let after = after.then(|| self.derived.score(&self.algo, i, &local.state));
        let cfg = self.derived.cfg();
        if let Some(p) = self.state_file(i)
            && checkpoint_due(cfg.checkpoint_every, cfg.rounds, round)
        {
            write_atomically(&p, &pack_state(round, &local.state)?)?;
        }
        Ok(Reply::Received { after })
    }

    /// The client's life: join, answer tasks until `Finish`.
    async fn run(self: Arc<Self>, i: usize, channel: Channel) -> Result<(), NetError> {
        let mut lobby = LobbyClient::new(channel.clone())
            .max_decoding_message_size(wire::JOIN_LIMIT)
            .max_encoding_message_size(wire::JOIN_LIMIT);
        let mut rpc = FederationClient::new(channel)
            .max_decoding_message_size(self.max_message)
            .max_encoding_message_size(usize::MAX);
        let mut local = Some(self.load(i)?);
        let info = wire::encode(&self.derived.info(i))?;
        let mut backoff = Backoff::new(self.retry_for);
        // A client restarted after a crash names the session it had, so the
        // server lets it take its id back before that session times out.
        // The session is a secret: its file is readable by its owner only.
        let session_file = self
            .state_dir
            .as_ref()
            .map(|d| d.join(format!("client-{i}.session")));
        let mut previous = session_file
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|t| wire::unhex(t.trim()))
            .unwrap_or_default();
        'join: loop {
            let hello = Hello {
                id: i as u64,
                token: self.token.clone(),
                info: info.clone(),
                previous: previous.clone(),
            };
            let session = match lobby.join(hello).await {
                Ok(w) => w.into_inner().session,
                Err(s)
                    if matches!(
                        s.code(),
                        Code::NotFound
                            | Code::Unauthenticated
                            | Code::AlreadyExists
                            | Code::InvalidArgument
                    ) =>
                {
                    return Err(NetError::Refused(s.message().to_string()));
                }
                Err(s) => {
                    backoff.wait(i, &s).await?;
                    continue;
                }
            };
            previous = session.clone();
            if let Some(p) = &session_file {
                write_secret(p, wire::hex(&session).as_bytes())?;
            }
            backoff.reset();
            let who = |request: &mut tonic::metadata::MetadataMap| -> Result<(), NetError> {
                let value = |v: String| {
                    v.parse()
                        .map_err(|_| NetError::Transport("bad metadata value".into()))
                };
                request.insert(CLIENT_HEADER, value(i.to_string())?);
                request.insert(SESSION_HEADER, value(wire::hex(&session))?);
                Ok(())
            };
            loop {
                let mut poll = tonic::Request::new(Poll {});
                who(poll.metadata_mut())?;
                let envelope = match rpc.next(poll).await {
                    Ok(e) => e.into_inner(),
                    Err(s) if s.code() == Code::Unauthenticated => continue 'join,
                    Err(s) => {
                        backoff.wait(i, &s).await?;
                        continue 'join;
                    }
                };
                let task: Task<A::Down> = wire::decode(&envelope.payload, self.max_message)?;
                let seq = match &task {
                    Task::Wait => continue,
                    Task::Finish => return Ok(()),
                    Task::Train { seq, .. } | Task::Receive { seq, .. } => *seq,
                };
                let host = self.clone();
                let mut l = local.take().ok_or_else(|| {
                    NetError::Unsupported(format!("client {i}: state lost by a failed task"))
                })?;
                let (l, reply) = tokio::task::spawn_blocking(move || {
                    let reply = match task {
                        Task::Train {
                            round,
                            participate,
                            before,
                            after,
                            origin,
                            ..
                        } => host.train(i, &mut l, round, participate, before, after, origin),
                        Task::Receive {
                            round, down, after, ..
                        } => host.receive(i, &mut l, round, down, after),
                        Task::Wait | Task::Finish => unreachable!("handled above"),
                    };
                    (l, reply)
                })
                .await
                .map_err(|e| NetError::Transport(format!("client {i}: {e}")))?;
                local = Some(l);
                let mut answer = tonic::Request::new(Answer {
                    seq,
                    payload: wire::encode(&reply?)?,
                });
                who(answer.metadata_mut())?;
                match rpc.report(answer).await {
                    Ok(_) => {}
                    Err(s)
                        if matches!(s.code(), Code::FailedPrecondition | Code::AlreadyExists) =>
                    {
                        tracing::warn!(client = i, "{}", s.message());
                    }
                    Err(s) if s.code() == Code::Unauthenticated => continue 'join,
                    Err(s) => {
                        backoff.wait(i, &s).await?;
                        continue 'join;
                    }
                }
            }
        }
    }
}

/// Writes a secret file (mode 0600 on Unix) through a temporary file.
fn write_secret(path: &Path, bytes: &[u8]) -> Result<(), NetError> {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| NetError::file(d, e))?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    crate::certs::write_private(&tmp, bytes)?;
    std::fs::rename(&tmp, path).map_err(|e| NetError::file(path, e))
}
