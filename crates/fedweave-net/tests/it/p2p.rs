//! DPFL by N peer processes (threads here, each with its own gRPC server)
//! against the simulation: the same graph rows, scores and transfers; with
//! tokens or peer certificates, and with a peer that never comes.

use crate::common::*;
use fedweave_net::NetError;
use fedweave_net::peer::{PeerOptions, PeerReport, run_peer};
use fedweave_net::proto::peers_client::PeersClient;
use fedweave_net::wire::{CLIENT_HEADER, FetchRequest, TOKEN_HEADER};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;
use tonic::Code;

/// Runs peers `running` (of the config's clients; the others' addresses
/// are closed ports) with `tune` applied to each one's options; `during`
/// runs while they do, with every peer's URL. Returns their results.
fn run_peers(
    cfg: &fedweave_sim::ExperimentConfig,
    out: &Path,
    running: &[usize],
    tune: impl Fn(usize, &mut PeerOptions) + Send + Sync + Clone + 'static,
    during: impl FnOnce(&HashMap<usize, String>),
) -> Vec<Result<PeerReport, NetError>> {
    let n = cfg.clients;
    // Reserve a port per peer, then hand each the others' URLs.
    let addrs: Vec<_> = (0..n)
        .map(|_| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        })
        .collect();
    let mut probe = PeerOptions::new(cfg.clone(), 0, addrs[0], HashMap::new(), out.into());
    tune(0, &mut probe);
    let scheme = if probe.ca.is_some() {
        "https://localhost"
    } else {
        "http://127.0.0.1"
    };
    let urls: HashMap<usize, String> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| (i, format!("{scheme}:{}", a.port())))
        .collect();
    let handles: Vec<_> = running
        .iter()
        .map(|&id| {
            let (cfg, out, urls, tune) =
                (cfg.clone(), out.to_path_buf(), urls.clone(), tune.clone());
            let listen = addrs[id];
            std::thread::spawn(move || {
                let mut opts = PeerOptions::new(cfg, id, listen, urls, out);
                tune(id, &mut opts);
                run_peer(opts, |_| {})
            })
        })
        .collect();
    during(&urls);
    handles.into_iter().map(|h| join(h, 300)).collect()
}

/// Every peer's rows, transfers, bytes and scores equal the simulation's.
fn assert_like_simulation(cfg: &fedweave_sim::ExperimentConfig, reports: &[PeerReport]) {
    let (sim_dir, sim) = simulate(cfg);
    let sim_rounds = rounds(sim_dir.path());
    let n = cfg.clients;
    for (round, rec) in sim_rounds.iter().enumerate() {
        let graph: Vec<Vec<f64>> = serde_json::from_value(rec["graph"].clone()).unwrap();
        let mut transfers = 0;
        for r in reports {
            let pr = &r.rounds[round];
            assert!(pr.absent.is_empty(), "round {} peer {}", round + 1, r.id);
            let mut row = vec![0.0; n];
            for &(j, w) in &pr.row {
                row[j] += w;
            }
            assert_eq!(row, graph[r.id], "round {} row {}", round + 1, r.id);
            transfers += pr.transfers;
        }
        assert_eq!(transfers, rec["selection"]["transfers"].as_u64().unwrap());
        let bytes: u64 = reports.iter().map(|r| r.rounds[round].bytes).sum();
        assert_eq!(bytes, rec["bytes_up"].as_u64().unwrap());
        let accs: Vec<f64> = reports
            .iter()
            .map(|r| r.rounds[round].after.test.acc)
            .collect();
        let mean_test = fedweave_core::vecmath::mean(&accs);
        assert_eq!(Some(mean_test), rec["mean_test_acc"].as_f64());
    }
    for r in reports {
        assert_eq!(Some(r.best_test_acc), sim.per_client_test_acc[r.id]);
        assert_eq!(Some(r.best_round), sim.per_client_best_round[r.id]);
    }
}

#[test]
fn dpfl_by_peers_equals_simulation() {
    let cfg = config("dpfl", &["algorithm.init_epochs=1"]);
    let out = tempfile::tempdir().unwrap();
    let reports: Vec<PeerReport> = run_peers(&cfg, out.path(), &[0, 1, 2, 3], |_, _| {}, |_| {})
        .into_iter()
        .map(|r| r.expect("peer finished"))
        .collect();
    assert_like_simulation(&cfg, &reports);
    for r in &reports {
        assert!(out.path().join(format!("peer-{}.json", r.id)).exists());
    }
}

/// Asks the peer at `url` for round 1 as `claimed` with `token`.
async fn fetch_as(
    url: &str,
    claimed: Option<u64>,
    token: Option<&str>,
) -> Result<(), tonic::Status> {
    let mut rpc = loop {
        match PeersClient::connect(url.to_string()).await {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let mut r = tonic::Request::new(FetchRequest {
        round: 1,
        probe: true,
    });
    if let Some(c) = claimed {
        r.metadata_mut()
            .insert(CLIENT_HEADER, c.to_string().parse().unwrap());
    }
    if let Some(t) = token {
        r.metadata_mut().insert(TOKEN_HEADER, t.parse().unwrap());
    }
    rpc.fetch(r).await.map(|_| ())
}

/// With tokens (peer 2's stored as its SHA-256), every peer fetches with
/// its own token and the run equals the simulation; a party with no
/// token, a wrong one, or another peer's token for a claimed id is
/// refused before it learns anything.
#[test]
fn peers_with_tokens_equal_the_simulation_and_refuse_strangers_and_impostors() {
    let cfg = config("dpfl", &["algorithm.init_epochs=1"]);
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("peer-tokens.txt");
    let hashed = fedweave_net::wire::hex(&fedweave_net::auth::sha256(b"p2"));
    std::fs::write(&tokens, format!("0 p0\n1 p1\n2 sha256:{hashed}\n3 p3\n")).unwrap();
    let out = dir.path().join("out");
    let t = tokens.clone();
    let tune = move |id: usize, o: &mut PeerOptions| {
        o.tokens = Some(t.clone());
        o.token = Some(format!("p{id}"));
    };
    let results = run_peers(&cfg, &out, &[0, 1, 2, 3], tune, |urls| {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            for (claimed, token) in [
                (None, None),
                (Some(1), None),
                (Some(1), Some("p2")),
                (Some(2), Some("p1")),
                (Some(2), Some(hashed.as_str())),
                (Some(9), Some("p1")),
            ] {
                let e = fetch_as(&urls[&0], claimed, token).await.unwrap_err();
                assert_eq!(e.code(), Code::Unauthenticated, "{claimed:?} {token:?}");
            }
        });
    });
    let reports: Vec<PeerReport> = results.into_iter().map(|r| r.expect("peer")).collect();
    assert_like_simulation(&cfg, &reports);
}

/// Mutual TLS: each peer serves and fetches with its own certificate
/// (`certs --peers 4`); the run equals the simulation, and a client
/// without a certificate cannot fetch.
#[test]
fn peers_with_certificates_equal_the_simulation() {
    let cfg = config("dpfl", &["algorithm.init_epochs=1", "rounds=2"]);
    let dir = tempfile::tempdir().unwrap();
    let files = fedweave_net::certs::generate(&dir.path().join("certs"), &[], 0, 4).unwrap();
    let out = dir.path().join("out");
    let (peers, ca) = (files.peers.clone(), files.ca.clone());
    let tune = move |id: usize, o: &mut PeerOptions| {
        o.tls = Some(peers[id].clone());
        o.ca = Some(ca.clone());
        o.client_ca = Some(ca.clone());
    };
    let (ca, one) = (files.ca.clone(), files.peers[1].clone());
    let results = run_peers(&cfg, &out, &[0, 1, 2, 3], tune, move |urls| {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let tls = tonic::transport::ClientTlsConfig::new().ca_certificate(
                tonic::transport::Certificate::from_pem(std::fs::read(&ca).unwrap()),
            );
            // Peer 1's certificate claiming to be peer 2: refused.
            let with_one = tls.clone().identity(tonic::transport::Identity::from_pem(
                std::fs::read(&one.0).unwrap(),
                std::fs::read(&one.1).unwrap(),
            ));
            let channel = loop {
                let ep = tonic::transport::Endpoint::from_shared(urls[&0].clone())
                    .unwrap()
                    .tls_config(with_one.clone())
                    .unwrap();
                match ep.connect().await {
                    Ok(c) => break c,
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            };
            let mut rpc = PeersClient::new(channel);
            let mut r = tonic::Request::new(FetchRequest {
                round: 1,
                probe: true,
            });
            r.metadata_mut().insert(CLIENT_HEADER, "2".parse().unwrap());
            let e = rpc.fetch(r).await.unwrap_err();
            assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
            let ep = tonic::transport::Endpoint::from_shared(urls[&0].clone())
                .unwrap()
                .tls_config(tls)
                .unwrap();
            // The handshake itself fails without a client certificate, or
            // the call is refused.
            if let Ok(channel) = ep.connect().await {
                let mut rpc = PeersClient::new(channel);
                let r = tonic::Request::new(FetchRequest {
                    round: 1,
                    probe: true,
                });
                assert!(rpc.fetch(r).await.is_err());
            }
        });
    });
    let reports: Vec<PeerReport> = results.into_iter().map(|r| r.expect("peer")).collect();
    assert_like_simulation(&cfg, &reports);
}

/// A peer that never comes (its address is a closed port): the others
/// find it absent in every round, once `round_timeout` passes, choose
/// among the peers they reach, finish, and write their results.
#[test]
fn a_missing_peer_is_absent_and_the_others_finish_with_results() {
    let cfg = config("dpfl", &["algorithm.init_epochs=1", "round_timeout=1.0"]);
    let out = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let results = run_peers(&cfg, out.path(), &[0, 1, 2], |_, _| {}, |_| {});
    assert!(started.elapsed() < Duration::from_secs(60));
    for r in results {
        let r = r.expect("a surviving peer finishes");
        assert_eq!(r.rounds.len(), cfg.rounds);
        for pr in &r.rounds {
            assert_eq!(pr.absent, [3], "peer {} round {}", r.id, pr.round);
            assert!(pr.row.iter().all(|&(j, _)| j != 3));
        }
        assert!(out.path().join(format!("peer-{}.json", r.id)).exists());
    }
}

/// A fourth "peer" that answers every fetch with "gone, I am at round
/// u64::MAX": one peer's word is a minority, so the three honest peers
/// run every round (none skips to the end), find it absent, and finish.
#[test]
fn a_peer_lying_about_its_round_moves_no_one() {
    use fedweave_net::proto::peers_server::{Peers, PeersServer};
    use fedweave_net::wire::{Post, PostState};
    use tonic::{Request, Response, Status};

    struct Liar;
    #[tonic::async_trait]
    impl Peers for Liar {
        async fn fetch(&self, _: Request<FetchRequest>) -> Result<Response<Post>, Status> {
            Ok(Response::new(Post {
                state: PostState::Gone as i32,
                payload: Default::default(),
                latest: u64::MAX,
            }))
        }
    }

    let cfg = config("dpfl", &["algorithm.init_epochs=1", "round_timeout=1.0"]);
    let out = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let results = run_peers(
        &cfg,
        out.path(),
        &[0, 1, 2],
        |_, _| {},
        |urls| {
            let port = urls[&3].rsplit(':').next().unwrap().to_string();
            let listener = rt
                .block_on(tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")))
                .unwrap();
            rt.spawn(
                tonic::transport::Server::builder()
                    .add_service(PeersServer::new(Liar))
                    .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
            );
        },
    );
    for r in results {
        let r = r.expect("an honest peer finishes");
        let rounds: Vec<usize> = r.rounds.iter().map(|pr| pr.round).collect();
        assert_eq!(
            rounds,
            (1..=cfg.rounds).collect::<Vec<_>>(),
            "peer {}",
            r.id
        );
        for pr in &r.rounds {
            assert_eq!(pr.absent, [3], "peer {} round {}", r.id, pr.round);
        }
    }
}
