//! `fedweave serve`: the server of a networked run. It learns the
//! federation from the clients' hellos (sizes and shapes, no data), then
//! drives the rounds with the simulator's own steps: participants,
//! screening, aggregation, bookkeeping; clients train and score on their
//! own machines. It writes the same run directory as `fedweave run` and
//! checkpoints its state, so `--resume` after a crash continues where the
//! last checkpoint left off.

use crate::auth;
use crate::hub::{Admission, FederationService, Hub};
use crate::transport::{IDLE_TIMEOUT, Limits, ServerTls};
use crate::wire::{self, Reply, Task};
use crate::{NetError, transport};
use bytes::Bytes;
use fedweave_algos::{Algorithm, Topology, Visitor};
use fedweave_sim::runtime::{
    Blueprint, ClientInfo, Clients, DEFAULT_MAX_CLIENT_SAMPLES, Facts, RunDir, RunState, Score,
    Trackers, TrainAsk, TrainReply, Upload, resolve_config, server_round,
};
use fedweave_sim::{ExperimentConfig, RoundRecord, Summary};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How `fedweave serve` runs.
pub struct ServeOptions {
    /// The experiment.
    pub cfg: ExperimentConfig,
    /// Address to listen on (port 0: any free port).
    pub listen: SocketAddr,
    /// The run directory.
    pub out: PathBuf,
    /// TLS certificate and key (PEM), when serving TLS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// CA certificate (PEM) clients' certificates must chain to: mutual
    /// TLS, each client authenticated by a certificate naming its id
    /// (`fedweave certs --clients N`).
    pub client_ca: Option<PathBuf>,
    /// `id token` lines, when clients must present tokens.
    pub tokens: Option<PathBuf>,
    /// Serve a non-loopback address without TLS or client credentials.
    pub insecure: bool,
    /// Continue from the run directory's last checkpoint.
    pub resume: bool,
    /// A session silent for this long frees its id.
    pub session_timeout: Duration,
    /// The longest one request may take, its upload included.
    pub request_timeout: Duration,
    /// The longest a connection may send nothing (default 60 s: honest
    /// clients ping every 20 s).
    pub idle_timeout: Duration,
    /// The most samples a client whose data the server cannot derive
    /// (`csv`) may claim in one split.
    pub max_client_samples: usize,
    /// The largest message read from an authenticated client (default:
    /// derived from the model, [`wire::message_limit`] with
    /// [`wire::UPLOAD_MODELS`] models).
    pub max_message: Option<usize>,
}

impl ServeOptions {
    /// Defaults for everything but the config, address and directory.
    pub fn new(cfg: ExperimentConfig, listen: SocketAddr, out: PathBuf) -> Self {
        Self {
            cfg,
            listen,
            out,
            tls: None,
            client_ca: None,
            tokens: None,
            insecure: false,
            resume: false,
            session_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(120),
            idle_timeout: IDLE_TIMEOUT,
            max_client_samples: DEFAULT_MAX_CLIENT_SAMPLES,
            max_message: None,
        }
    }
}

/// Refuses what only a simulation can do: attacks (the network runs honest
/// parties) and batched training (each client process trains alone; with
/// it, the run would differ from `fedweave run` of the same config).
pub(crate) fn refuse_simulation_settings(cfg: &ExperimentConfig) -> Result<(), NetError> {
    if cfg.attack.kind != fedweave_algos::attack::AttackKind::None {
        return Err(NetError::Unsupported(
            "attacks are a simulation feature; the network runtime runs honest parties".into(),
        ));
    }
    if cfg.device.batch_clients > 0 {
        return Err(NetError::Unsupported(
            "`device.batch_clients` is a simulation setting (each networked client trains on its own): remove it".into(),
        ));
    }
    Ok(())
}

/// Serves one run to its end and returns its summary. `on_ready` learns
/// the bound address (tests listen on port 0); `on_round` sees each
/// round's record.
pub fn serve(
    opts: ServeOptions,
    on_ready: impl FnOnce(SocketAddr),
    on_round: &mut dyn FnMut(&RoundRecord),
) -> Result<Summary, NetError> {
    let started = Instant::now();
    let cfg = opts.cfg.clone();
    cfg.validate().map_err(fedweave_sim::RunError::from)?;
    refuse_simulation_settings(&cfg)?;
    let credentials = opts.tokens.is_some() || opts.client_ca.is_some();
    auth::check_exposure(
        "serving",
        &opts.listen,
        opts.tls.is_some(),
        credentials,
        opts.insecure,
    )?;
    let tokens = opts
        .tokens
        .as_deref()
        .map(|p| auth::read_tokens(p, cfg.clients))
        .transpose()?;
    // The server's own view of the federation: every hello is judged
    // against it as the client joins.
    let mut blueprint = Blueprint::derive(&cfg)?;
    let check = blueprint.hello_check(opts.max_client_samples);
    let max_message = opts
        .max_message
        .unwrap_or_else(|| wire::message_limit(blueprint.model_parameters(), wire::UPLOAD_MODELS));
    let hub = Hub::new(Admission {
        clients: cfg.clients,
        tokens,
        client_certs: opts.client_ca.is_some(),
        session_timeout: opts.session_timeout,
        check_hello: Box::new(move |i, packed| {
            let info: ClientInfo =
                wire::decode(packed, wire::JOIN_LIMIT).map_err(|e| format!("undecodable: {e}"))?;
            check(i, &info)
        }),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| NetError::Transport(e.to_string()))?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(opts.listen))
        .map_err(|e| NetError::Transport(format!("cannot listen on {}: {e}", opts.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| NetError::Transport(e.to_string()))?;
    let service = FederationService {
        hub: hub.clone(),
        wait: wire::encode(&Task::<()>::Wait)?.into(),
    };
    let lobby = crate::proto::lobby_server::LobbyServer::new(service.clone())
        .max_decoding_message_size(wire::JOIN_LIMIT)
        .max_encoding_message_size(wire::JOIN_LIMIT);
    let federation = crate::proto::federation_server::FederationServer::new(service)
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(usize::MAX);
    let federation = crate::hub::Gate {
        inner: federation,
        hub: hub.clone(),
    };
    let tls = ServerTls {
        identity: opts.tls.clone(),
        client_ca: opts.client_ca.clone(),
    };
    let limits = Limits {
        // A worker may host every client, each with a long poll open.
        streams_per_connection: u32::try_from(cfg.clients + 16).unwrap_or(u32::MAX),
        request_timeout: opts.request_timeout,
        idle_timeout: opts.idle_timeout,
    };
    let mut builder = transport::server(&tls, &limits)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let incoming = transport::incoming(listener, limits.idle_timeout);
    let serving = runtime.spawn(
        builder
            .add_service(lobby)
            .add_service(federation)
            .serve_with_incoming_shutdown(incoming, async {
                stopped.await.ok();
            }),
    );
    tracing::info!(%addr, "serving; waiting for {} clients", cfg.clients);
    on_ready(addr);

    let result = (|| {
        let infos: Vec<ClientInfo> = hub
            .wait_for_hellos()
            .iter()
            .map(|b| wire::decode(b, wire::JOIN_LIMIT))
            .collect::<Result<_, _>>()?;
        for (i, info) in infos.iter().enumerate() {
            blueprint.accept(i, info);
        }
        let driver = Driver {
            hub: &hub,
            blueprint: &blueprint,
            out: &opts.out,
            resume: opts.resume,
            max_message,
            on_round,
            started,
        };
        let name = cfg.algorithm_name().to_string();
        let params = cfg.algorithm_params();
        fedweave_algos::dispatch(&name, &params, &blueprint.env(), driver)
            .map_err(fedweave_sim::RunError::from)?
    })();
    // Clients learn the run is over, then the server stops: open streams
    // get a moment to end, then the runtime goes, whatever still holds on.
    hub.finish(
        wire::encode(&Task::<()>::Finish)?.into(),
        Duration::from_secs(10),
    );
    stop.send(()).ok();
    runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(2), serving).await })
        .ok();
    runtime.shutdown_timeout(Duration::from_millis(500));
    result
}

/// The clients of a served run: each phase's tasks published on the hub,
/// the answers decoded as they come back (an undecodable one is an absent
/// client). The round itself is the simulator's [`server_round`].
struct HubClients<'a, A> {
    hub: &'a Hub,
    timeout: Duration,
    min: usize,
    max_message: usize,
    n: usize,
    /// A task that could not be encoded (ends the run).
    failed: Option<NetError>,
    _algo: std::marker::PhantomData<A>,
}

impl<A: Algorithm> HubClients<'_, A> {
    /// Publishes phase `seq` and decodes the answers.
    fn phase(&mut self, seq: u64, tasks: Vec<Option<Bytes>>) -> Vec<Option<Reply<A::Up>>> {
        self.hub
            .run_phase(seq, tasks, self.timeout, self.min)
            .into_iter()
            .enumerate()
            .map(|(i, a)| {
                wire::decode(&a?, self.max_message)
                    .map_err(|e| tracing::warn!(client = i, "undecodable answer: {e}"))
                    .ok()
            })
            .collect()
    }
}

impl<A: Algorithm> Clients<A> for HubClients<'_, A> {
    fn train(&mut self, ask: &TrainAsk) -> Vec<Option<TrainReply<A::Up>>> {
        let round = ask.round;
        let task = |i: usize| Task::<A::Down>::Train {
            seq: 2 * round as u64,
            round,
            participate: ask.participants.binary_search(&i).is_ok(),
            before: ask.before,
            after: ask.after,
            origin: ask.origin,
        };
        let tasks = match (0..self.n)
            .map(|i| wire::encode(&task(i)).map(|t| Some(Bytes::from(t))))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(t) => t,
            Err(e) => {
                self.failed = Some(e.into());
                return (0..self.n).map(|_| None).collect();
            }
        };
        self.phase(2 * round as u64, tasks)
            .into_iter()
            .enumerate()
            .map(|(i, r)| match r? {
                Reply::Trained {
                    upload,
                    before,
                    after,
                } => Some(TrainReply {
                    upload: upload.map(|u| Upload {
                        client: i,
                        up: u.up,
                        loss: u.loss,
                        origin: u.origin,
                    }),
                    before,
                    after,
                }),
                Reply::Received { .. } => None,
            })
            .collect()
    }

    fn deliver(
        &mut self,
        round: usize,
        mut inbox: Vec<Option<A::Down>>,
        to: &[bool],
        score: bool,
    ) -> Vec<Option<Option<Score>>> {
        // Methods with one global model send every client the same bytes:
        // keep one copy.
        let mut last: Option<Bytes> = None;
        let mut tasks = Vec::with_capacity(self.n);
        for i in 0..self.n {
            if !to.get(i).copied().unwrap_or(false) {
                tasks.push(None);
                continue;
            }
            let task = Task::Receive {
                seq: 2 * round as u64 + 1,
                round,
                down: inbox.get_mut(i).and_then(Option::take),
                after: score,
            };
            let bytes = match wire::encode(&task) {
                Ok(b) => b,
                Err(e) => {
                    self.failed = Some(e.into());
                    return vec![None; self.n];
                }
            };
            let shared = match &last {
                Some(b) if b[..] == bytes[..] => b.clone(),
                _ => Bytes::from(bytes),
            };
            last = Some(shared.clone());
            tasks.push(Some(shared));
        }
        self.phase(2 * round as u64 + 1, tasks)
            .into_iter()
            .map(|r| match r? {
                Reply::Received { after } => Some(after),
                Reply::Trained { .. } => None,
            })
            .collect()
    }
}

/// Drives the rounds for one algorithm type.
struct Driver<'a> {
    hub: &'a Hub,
    blueprint: &'a Blueprint,
    out: &'a Path,
    resume: bool,
    max_message: usize,
    on_round: &'a mut dyn FnMut(&RoundRecord),
    started: Instant,
}

impl Visitor for Driver<'_> {
    type Output = Result<Summary, NetError>;

    fn visit<A: Algorithm>(self, algo: A, resolved: toml::Table) -> Self::Output {
        let Driver {
            hub,
            blueprint,
            out,
            resume,
            max_message,
            on_round,
            started,
        } = self;
        if algo.topology() == Topology::PeerToPeer {
            return Err(NetError::Unsupported(format!(
                "`{}` is peer-to-peer: run it with `fedweave peer`",
                algo.name()
            )));
        }
        let cfg = resolve_config(blueprint.cfg(), &algo, resolved)?;
        let mut dir = RunDir::open(out, &cfg, algo.name(), Some(&blueprint.partition_json()))?;
        let env = blueprint.env();
        let facts = &Facts {
            cfg: cfg.clone(),
            ..blueprint.facts().clone()
        };
        let n = cfg.clients;
        let restored = if resume {
            dir.restore::<A::Server, ()>()?
        } else {
            None
        };
        let (mut state, mut records) = restored.unwrap_or_else(|| {
            let state = RunState {
                round: 0,
                server: algo.init_server(&env),
                clients: Vec::new(),
                trackers: Trackers::new(n),
            };
            (state, Vec::new())
        });
        dir.start_records(&records, state.round)?;
        let mut clients = HubClients::<A> {
            hub,
            timeout: Duration::from_secs_f64(cfg.round_timeout),
            min: cfg.min_clients,
            max_message,
            n,
            failed: None,
            _algo: std::marker::PhantomData,
        };
        while state.round < cfg.rounds {
            let round = state.round + 1;
            let record = server_round(
                &algo,
                &env,
                facts,
                round,
                &mut state.server,
                &mut state.trackers,
                &mut clients,
            );
            if let Some(e) = clients.failed.take() {
                return Err(e);
            }
            state.round = round;
            dir.commit(&record, &state)?;
            on_round(&record);
            records.push(record);
        }
        Ok(dir.finish(facts, algo.name(), &state.trackers, &records, started)?)
    }
}
