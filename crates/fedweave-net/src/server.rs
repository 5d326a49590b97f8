//! `fedweave serve`: the server of a networked run. It learns the
//! federation from the clients' hellos (sizes and shapes, no data), then
//! drives the rounds with the simulator's own steps: participants,
//! screening, aggregation, bookkeeping; clients train and score on their
//! own machines. It writes the same run directory as `fedweave run` and
//! checkpoints its state, so `--resume` after a crash continues where the
//! last checkpoint left off.

use crate::hub::{Admission, FederationService, Hub};
use crate::wire::{self, Reply, Task};
use crate::{NetError, transport};
use bytes::Bytes;
use fedweave_algos::{Algorithm, EvalPoint, Message, Topology, Visitor};
use fedweave_sim::config::EvalWhen;
use fedweave_sim::runtime::{
    Blueprint, ClientInfo, Facts, RoundBooks, RunDir, RunState, Scores, Trackers, Upload,
    choose_participants, close_round, resolve_config, screen, server_outcome, wants_origins,
};
use fedweave_sim::{ExperimentConfig, RoundRecord, Summary};
use std::collections::HashMap;
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
    /// `id token` lines, when clients must present tokens.
    pub tokens: Option<PathBuf>,
    /// Continue from the run directory's last checkpoint.
    pub resume: bool,
    /// A session silent for this long frees its id.
    pub session_timeout: Duration,
    /// The largest message accepted or sent.
    pub max_message: usize,
}

impl ServeOptions {
    /// Defaults for everything but the config, address and directory.
    pub fn new(cfg: ExperimentConfig, listen: SocketAddr, out: PathBuf) -> Self {
        Self {
            cfg,
            listen,
            out,
            tls: None,
            tokens: None,
            resume: false,
            session_timeout: Duration::from_secs(30),
            max_message: wire::DEFAULT_MAX_MESSAGE,
        }
    }
}

/// Reads a tokens file: one `id token` pair a line; `#` comments.
pub fn read_tokens(path: &Path) -> Result<HashMap<u64, String>, NetError> {
    crate::read_id_lines(path, "token")
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
    let tokens = opts.tokens.as_deref().map(read_tokens).transpose()?;
    let hub = Hub::new(Admission {
        clients: cfg.clients,
        tokens,
        session_timeout: opts.session_timeout,
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
    let server = crate::proto::federation_server::FederationServer::new(service)
        .max_decoding_message_size(opts.max_message)
        .max_encoding_message_size(opts.max_message);
    let mut builder = transport::server(opts.tls.as_ref())?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let serving = runtime.spawn(builder.add_service(server).serve_with_incoming_shutdown(
        incoming,
        async {
            stopped.await.ok();
        },
    ));
    tracing::info!(%addr, "serving; waiting for {} clients", cfg.clients);
    on_ready(addr);

    let infos: Vec<ClientInfo> = hub
        .wait_for_hellos()
        .iter()
        .map(|b| wire::decode(b, opts.max_message))
        .collect::<Result<_, _>>()?;
    let blueprint = Blueprint::new(&cfg, &infos)?;
    let driver = Driver {
        hub: &hub,
        blueprint: &blueprint,
        out: &opts.out,
        resume: opts.resume,
        max_message: opts.max_message,
        on_round,
        started,
    };
    let name = cfg.algorithm_name().to_string();
    let params = cfg.algorithm_params();
    let result = fedweave_algos::dispatch(&name, &params, &blueprint.env(), driver)
        .map_err(fedweave_sim::RunError::from);
    // Clients learn the run is over, then the server stops.
    hub.finish(
        wire::encode(&Task::<()>::Finish)?.into(),
        Duration::from_secs(10),
    );
    stop.send(()).ok();
    runtime.block_on(serving).ok();
    result?
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
        let cfg = resolve_config(&blueprint.facts().cfg, &algo, resolved)?;
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
        let timeout = Duration::from_secs_f64(cfg.round_timeout);
        let min = cfg.min_clients;
        let decode_all = |answers: Vec<Option<Vec<u8>>>| -> Vec<Option<Reply<A::Up>>> {
            answers
                .into_iter()
                .enumerate()
                .map(|(i, a)| {
                    let a = a?;
                    wire::decode(&a, max_message)
                        .map_err(|e| tracing::warn!(client = i, "undecodable answer: {e}"))
                        .ok()
                })
                .collect()
        };
        while state.round < cfg.rounds {
            let round = state.round + 1;
            let round_started = Instant::now();
            let participants = choose_participants(&cfg, round);
            let train = |i: usize| Task::<A::Down>::Train {
                seq: 2 * round as u64,
                round,
                participate: participants.binary_search(&i).is_ok(),
                before: cfg.eval.when == EvalWhen::BeforeAndAfter,
                after: algo.eval_point() == EvalPoint::AfterTraining,
                origin: wants_origins(&cfg),
            };
            let tasks = (0..n)
                .map(|i| wire::encode(&train(i)).map(|t| Some(t.into())))
                .collect::<Result<Vec<_>, _>>()?;
            let replies = decode_all(hub.run_phase(2 * round as u64, tasks, timeout, min));

            let mut uploads = Vec::new();
            let mut before = Scores::default();
            let mut after = Scores::default();
            let mut answered = vec![false; n];
            for (i, r) in replies.into_iter().enumerate() {
                let Some(Reply::Trained {
                    upload,
                    before: b,
                    after: a,
                }) = r
                else {
                    continue;
                };
                answered[i] = true;
                if let Some(u) = upload {
                    uploads.push(Upload {
                        client: i,
                        up: u.up,
                        loss: u.loss,
                        origin: u.origin,
                    });
                }
                if let Some(b) = b {
                    before.clients.push(i);
                    before.scores.push(b);
                }
                if let Some(a) = a {
                    after.clients.push(i);
                    after.scores.push(a);
                }
            }
            let screened = screen(&algo, &env, &cfg, round, uploads);
            let outcome = server_outcome(&algo, &env, &mut state.server, round, &screened.sound);
            let bytes_down = outcome.downloads.iter().map(|(_, d)| d.bytes()).sum();
            let mut inbox: Vec<Option<A::Down>> = (0..n).map(|_| None).collect();
            for (i, d) in outcome.downloads {
                inbox[i] = Some(d);
            }
            // Methods with one global model send every client the same
            // bytes: keep one copy.
            let mut last: Option<Bytes> = None;
            let mut tasks = Vec::with_capacity(n);
            for i in 0..n {
                let task = Task::Receive {
                    seq: 2 * round as u64 + 1,
                    round,
                    down: inbox[i].take(),
                    after: algo.eval_point() == EvalPoint::AfterReceive,
                };
                if !answered[i] {
                    tasks.push(None);
                    continue;
                }
                let bytes = wire::encode(&task)?;
                let shared = match &last {
                    Some(b) if b[..] == bytes[..] => b.clone(),
                    _ => Bytes::from(bytes),
                };
                last = Some(shared.clone());
                tasks.push(Some(shared));
            }
            let replies = decode_all(hub.run_phase(2 * round as u64 + 1, tasks, timeout, min));
            let mut absent = Vec::new();
            for (i, r) in replies.into_iter().enumerate() {
                match r {
                    Some(Reply::Received { after: a }) => {
                        if let Some(a) = a {
                            after.clients.push(i);
                            after.scores.push(a);
                        }
                    }
                    _ => absent.push(i),
                }
            }
            state.round = round;
            let books = RoundBooks {
                round,
                started: round_started,
                participants,
                absent,
                losses: &screened.losses,
                rejected: screened.rejected,
                bytes_up: screened.bytes_up,
                bytes_down,
                graph: &outcome.graph,
                layers: &outcome.layers,
                selection: None,
                before: (cfg.eval.when == EvalWhen::BeforeAndAfter).then_some(before),
                after,
            };
            let record = close_round(facts, &mut state.trackers, books);
            dir.commit(&record, &state)?;
            on_round(&record);
            records.push(record);
        }
        Ok(dir.finish(facts, algo.name(), &state.trackers, &records, started)?)
    }
}
