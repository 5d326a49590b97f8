//! Runs a simulation and a networked run of one config and compares them.

use fedweave_net::NetError;
use fedweave_net::client::{ClientOptions, run_clients};
use fedweave_net::server::{ServeOptions, serve};
use fedweave_sim::{ExperimentConfig, Summary, run_experiment};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// A small federation: 4 digits clients, an MLP, 3 rounds.
pub const SMALL: &str = "seed = 3\nclients = 4\nrounds = 3\nthreads = 1\n[data]\ndataset = \"digits\"\n[partition]\nkind = \"dirichlet\"\nbeta = 0.5\n[model]\nkind = \"mlp\"\n[train]\nlocal_iterations = 3\nbatch_size = 16\n";

/// The config with `algorithm.name = algo` and `overrides`.
pub fn config(algo: &str, overrides: &[&str]) -> ExperimentConfig {
    let mut o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    o.push(format!("algorithm.name=\"{algo}\""));
    ExperimentConfig::from_toml_str(SMALL, &o).expect("valid config")
}

/// The simulated run's directory and summary.
pub fn simulate(cfg: &ExperimentConfig) -> (tempfile::TempDir, Summary) {
    let dir = tempfile::tempdir().unwrap();
    let s = run_experiment(cfg, dir.path(), &mut |_| {}).expect("simulation runs");
    (dir, s)
}

/// A server running in a thread.
pub struct Server {
    pub addr: SocketAddr,
    pub handle: JoinHandle<Result<Summary, NetError>>,
    /// Each finished round's record.
    pub rounds: mpsc::Receiver<fedweave_sim::RoundRecord>,
}

/// Starts `serve` on a free loopback port.
pub fn start_server(opts: impl FnOnce(SocketAddr) -> ServeOptions + Send + 'static) -> Server {
    let (tx, rx) = mpsc::channel();
    let (round_tx, rounds) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let o = opts("127.0.0.1:0".parse().unwrap());
        serve(o, |a| tx.send(a).unwrap(), &mut |r| {
            round_tx.send(r.clone()).ok();
        })
    });
    let addr = match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(a) => a,
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            panic!(
                "the server stopped: {:?}",
                handle.join().map(|r| r.map(|_| ()))
            )
        }
        Err(e) => panic!("server not listening: {e}"),
    };
    Server {
        addr,
        handle,
        rounds,
    }
}

/// Runs `ids` as one process (a worker, or a single client) in a thread.
pub fn start_clients(
    cfg: &ExperimentConfig,
    url: String,
    ids: Vec<usize>,
    tune: impl FnOnce(&mut ClientOptions) + Send + 'static,
) -> JoinHandle<Result<(), NetError>> {
    let cfg = cfg.clone();
    std::thread::spawn(move || {
        let mut o = ClientOptions::new(cfg, url, ids);
        o.retry_for = Duration::from_secs(30);
        tune(&mut o);
        run_clients(o)
    })
}

/// Waits for a thread at most `secs` seconds.
pub fn join<T: Send + 'static>(h: JoinHandle<T>, secs: u64) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !h.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {secs}s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    h.join().expect("thread did not panic")
}

/// Waits for the server (its `what` names the expectation) and the
/// `clients`, then asserts that the run written to `out` equals the
/// simulation of `cfg`.
pub fn finish_and_compare(
    cfg: &ExperimentConfig,
    server: JoinHandle<Result<Summary, NetError>>,
    what: &str,
    clients: Vec<JoinHandle<Result<(), NetError>>>,
    out: &Path,
) {
    let summary = join(server, 300).expect(what);
    for c in clients {
        join(c, 60).expect("client finished");
    }
    let (sim_dir, sim) = simulate(cfg);
    assert_same(sim_dir.path(), &sim, out, &summary);
}

/// Serve options writing into `out`.
pub fn serve_opts(
    cfg: &ExperimentConfig,
    out: &Path,
) -> impl FnOnce(SocketAddr) -> ServeOptions + Send + 'static {
    let (cfg, out): (ExperimentConfig, PathBuf) = (cfg.clone(), out.to_path_buf());
    move |addr| ServeOptions::new(cfg, addr, out)
}

/// The rounds of a run directory, less wall-clock seconds.
pub fn rounds(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("rounds.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("seconds");
            v
        })
        .collect()
}

/// Asserts that two runs agree bit for bit on everything but timing.
pub fn assert_same(sim_dir: &Path, sim: &Summary, net_dir: &Path, net: &Summary) {
    assert_eq!(net.per_client_test_acc, sim.per_client_test_acc);
    assert_eq!(net.per_client_best_round, sim.per_client_best_round);
    assert_eq!(net.final_graph, sim.final_graph);
    assert_eq!(net.final_graph_layers, sim.final_graph_layers);
    assert_eq!(net.mean_test_acc, sim.mean_test_acc);
    assert_eq!(net.selected_test_acc, sim.selected_test_acc);
    assert_eq!(
        (net.bytes_up, net.bytes_down),
        (sim.bytes_up, sim.bytes_down)
    );
    assert_eq!(rounds(net_dir), rounds(sim_dir));
    for f in ["config.toml", "partition.json"] {
        assert_eq!(
            std::fs::read_to_string(net_dir.join(f)).unwrap(),
            std::fs::read_to_string(sim_dir.join(f)).unwrap(),
            "{f}"
        );
    }
    for f in ["summary.json", "rounds.jsonl", "report.html"] {
        assert!(net_dir.join(f).exists(), "{f} written by the server");
    }
}

/// A party speaking the protocol directly (tests of what the server
/// accepts from a forged or hostile client).
pub struct Raw {
    pub lobby: fedweave_net::proto::lobby_client::LobbyClient<tonic::transport::Channel>,
    pub rpc: fedweave_net::proto::federation_client::FederationClient<tonic::transport::Channel>,
}

impl Raw {
    /// Connects to `url` (plaintext).
    pub async fn connect(url: &str) -> Self {
        let channel = tonic::transport::Endpoint::from_shared(url.to_string())
            .unwrap()
            .connect()
            .await
            .unwrap();
        Self {
            lobby: fedweave_net::proto::lobby_client::LobbyClient::new(channel.clone()),
            rpc: fedweave_net::proto::federation_client::FederationClient::new(channel)
                .max_decoding_message_size(usize::MAX),
        }
    }

    /// Another handle on the same connection.
    pub fn clone_channels(&self) -> Self {
        Self {
            lobby: self.lobby.clone(),
            rpc: self.rpc.clone(),
        }
    }

    /// `Join` as client `id`; the session.
    pub async fn join(
        &mut self,
        id: u64,
        token: &str,
        info: Vec<u8>,
        previous: Vec<u8>,
    ) -> Result<Vec<u8>, tonic::Status> {
        let hello = fedweave_net::wire::Hello {
            id,
            token: token.into(),
            info,
            previous,
        };
        Ok(self.lobby.join(hello).await?.into_inner().session)
    }

    fn who<T>(msg: T, id: u64, session: &[u8]) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.metadata_mut().insert(
            fedweave_net::wire::CLIENT_HEADER,
            id.to_string().parse().unwrap(),
        );
        r.metadata_mut().insert(
            fedweave_net::wire::SESSION_HEADER,
            fedweave_net::wire::hex(session).parse().unwrap(),
        );
        r
    }

    /// `Next` as (id, session): the packed task.
    pub async fn next(&mut self, id: u64, session: &[u8]) -> Result<bytes::Bytes, tonic::Status> {
        let r = Self::who(fedweave_net::wire::Poll {}, id, session);
        Ok(self.rpc.next(r).await?.into_inner().payload)
    }

    /// `Report` as (id, session).
    pub async fn report(
        &mut self,
        id: u64,
        session: &[u8],
        seq: u64,
        payload: Vec<u8>,
    ) -> Result<(), tonic::Status> {
        let r = Self::who(fedweave_net::wire::Answer { seq, payload }, id, session);
        self.rpc.report(r).await.map(|_| ())
    }
}
