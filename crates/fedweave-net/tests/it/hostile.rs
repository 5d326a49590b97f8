//! What a party holding no credential, a client lying about itself, or a
//! client answering out of turn can do to a run: nothing but be refused,
//! and the honest run equals `fedweave run` of the same config.

use crate::common::*;
use fedweave_net::NetError;
use fedweave_net::server::ServeOptions;
use fedweave_net::wire::{self, Reply, Task, WireUpload};
use fedweave_sim::runtime::{ClientInfo, Derived, Score};
use std::path::PathBuf;
use std::time::Duration;
use tonic::Code;

fn tokens_file(dir: &std::path::Path) -> PathBuf {
    let p = dir.join("tokens.txt");
    std::fs::write(&p, "0 t0\n1 t1\n2 t2\n3 t3\n").unwrap();
    p
}

fn with_tokens(
    cfg: &fedweave_sim::ExperimentConfig,
    out: PathBuf,
    tokens: PathBuf,
) -> impl FnOnce(std::net::SocketAddr) -> ServeOptions + Send + 'static {
    let cfg = cfg.clone();
    move |addr| {
        let mut o = ServeOptions::new(cfg, addr, out);
        o.tokens = Some(tokens);
        o
    }
}

fn token(t: &'static str) -> impl FnOnce(&mut fedweave_net::client::ClientOptions) + Send {
    move |o| o.token = Some(t.into())
}

fn random_session() -> Vec<u8> {
    fedweave_net::auth::new_session().unwrap()
}

/// With tokens required, a party holding none: its joins are refused,
/// its polls and answers under guessed sessions (random, empty, all
/// zero, the old counter-style small numbers) are refused before they
/// are read, for every client id, all through the run; the honest run
/// equals the simulation.
#[test]
fn a_party_without_a_token_can_neither_read_nor_answer_another_clients_task() {
    let cfg = config("fedavg", &["rounds=4", "train.local_iterations=40"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let server = start_server(with_tokens(&cfg, out.clone(), tokens_file(dir.path())));
    let url = format!("http://{}", server.addr);
    let honest: Vec<_> = [("t0", 0), ("t1", 1), ("t2", 2), ("t3", 3)]
        .into_iter()
        .map(|(t, i)| start_clients(&cfg, url.clone(), vec![i], token(t)))
        .collect();
    let info = wire::encode(&Derived::load(&cfg).unwrap().info(0)).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut tries = 0;
    rt.block_on(async {
        let mut raw = Raw::connect(&url).await;
        let started = std::time::Instant::now();
        let over = || out.join("summary.json").exists();
        // Refused as unauthenticated, as long as the run is on.
        let refused = |e: tonic::Status| {
            assert!(
                e.code() == Code::Unauthenticated || over(),
                "{e:?} while the run is on"
            );
        };
        while started.elapsed() < Duration::from_secs(120) && !over() {
            for id in 0..4u64 {
                for (tok, previous) in [("", vec![]), ("t9", random_session())] {
                    refused(raw.join(id, tok, info.clone(), previous).await.unwrap_err());
                }
                let mut guesses = vec![random_session(), vec![], vec![0; 16]];
                guesses.extend((1..=8u64).map(|k| k.to_le_bytes().to_vec()));
                for session in guesses {
                    tries += 1;
                    refused(raw.next(id, &session).await.unwrap_err());
                    let bogus = wire::encode(&Reply::<Vec<f32>>::Received { after: None }).unwrap();
                    refused(raw.report(id, &session, 2, bogus).await.unwrap_err());
                }
            }
        }
    });
    assert!(
        tries > 40,
        "the attacker kept trying during the run ({tries})"
    );
    finish_and_compare(&cfg, server.handle, "served", honest, &out);
}

/// Without tokens (loopback, open federation), a join naming a guessed
/// session as `previous` cannot take over a live id, nor can a join with
/// another client's token; the real client stays connected and the run
/// equals the simulation.
#[test]
fn a_guessed_previous_session_cannot_take_over_a_live_id() {
    for tokens in [false, true] {
        let cfg = config("pfedgraph", &["rounds=6"]);
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        let server = if tokens {
            start_server(with_tokens(&cfg, out.clone(), tokens_file(dir.path())))
        } else {
            start_server(serve_opts(&cfg, &out))
        };
        let url = format!("http://{}", server.addr);
        let honest: Vec<_> = [("t0", 0), ("t1", 1), ("t2", 2), ("t3", 3)]
            .into_iter()
            .map(|(t, i)| start_clients(&cfg, url.clone(), vec![i], token(t)))
            .collect();
        let first = server
            .rounds
            .recv_timeout(Duration::from_secs(120))
            .unwrap();
        assert_eq!(first.round, 1);
        let info = wire::encode(&Derived::load(&cfg).unwrap().info(2)).unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let tried = rt.block_on(async {
            let mut raw = Raw::connect(&url).await;
            let mut guesses = vec![vec![], vec![0; 16], random_session()];
            guesses.extend((1..=16u64).map(|k| k.to_string().into_bytes()));
            let mut tried = 0;
            for previous in guesses {
                // Client 1's token for id 2, or no token in an open run.
                let tok = if tokens { "t1" } else { "" };
                let e = raw.join(2, tok, info.clone(), previous).await.unwrap_err();
                // On a slow machine the run may end before the last guess.
                if out.join("summary.json").exists() {
                    break;
                }
                let want = if tokens {
                    Code::Unauthenticated
                } else {
                    Code::AlreadyExists
                };
                assert_eq!(e.code(), want, "{}", e.message());
                tried += 1;
            }
            tried
        });
        assert!(tried >= 3, "only {tried} guesses while the run was on");
        finish_and_compare(&cfg, server.handle, "served", honest, &out);
    }
}

/// A client started with another config (its partition differs, so its
/// sizes do; or another dataset) and a hello that does not decode are
/// refused with a reason when they join; the server does not stop, the
/// right clients join, and the run equals the simulation.
#[test]
fn a_mismatched_or_undecodable_hello_is_refused_and_the_run_equals_fedweave_run() {
    let cfg = config("pfedgraph", &["rounds=2"]);
    let out = tempfile::tempdir().unwrap();
    let server = start_server(serve_opts(&cfg, out.path()));
    let url = format!("http://{}", server.addr);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut raw = Raw::connect(&url).await;
        for junk in [vec![], b"FWM2\xff\xff\xff".to_vec(), vec![7; 5000]] {
            let e = raw.join(1, "", junk, vec![]).await.unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument);
            assert!(e.message().contains("undecodable"), "{}", e.message());
        }
    });
    for (other, why) in [
        (
            config("pfedgraph", &["rounds=2", "partition.beta=5.0"]),
            "training",
        ),
        (
            config("pfedgraph", &["rounds=2", "data.dataset=\"synthetic\""]),
            "dataset",
        ),
    ] {
        match join(start_clients(&other, url.clone(), vec![1], |_| {}), 60) {
            Err(NetError::Refused(m)) => {
                assert!(m.contains("hello refused") && m.contains(why), "{m}")
            }
            r => panic!("expected a refusal, got {r:?}"),
        }
    }
    let clients = start_clients(&cfg, url, vec![0, 1, 2, 3], |_| {});
    let net = join(server.handle, 300).expect("the run went on");
    join(clients, 60).expect("clients finished");
    let (sim_dir, sim) = simulate(&cfg);
    assert_same(sim_dir.path(), &sim, out.path(), &net);
}

/// A hello claiming 2^64 − 1 training samples (which would give its
/// sender weight ~1 in every pFedGraph row) is refused: for a derived
/// partition because it is not the client's size, for per-client files
/// because it exceeds the bound. The run with the honest client equals
/// the simulation.
#[test]
fn an_absurd_size_claim_is_refused_and_cannot_capture_graph_rows() {
    let cfg = config("pfedgraph", &["rounds=2"]);
    let out = tempfile::tempdir().unwrap();
    let server = start_server(serve_opts(&cfg, out.path()));
    let url = format!("http://{}", server.addr);
    let mut info: ClientInfo = Derived::load(&cfg).unwrap().info(3);
    info.size = usize::MAX;
    info.counts.samples[0] = usize::MAX - info.counts.samples[1];
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut raw = Raw::connect(&url).await;
        let e = raw
            .join(3, "", wire::encode(&info).unwrap(), vec![])
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{}", e.message());
    });
    let clients = start_clients(&cfg, url, vec![0, 1, 2, 3], |_| {});
    let net = join(server.handle, 300).expect("served");
    join(clients, 60).expect("clients finished");
    let (sim_dir, sim) = simulate(&cfg);
    assert_same(sim_dir.path(), &sim, out.path(), &net);

    // Per-client files: only the clients know their sizes; a claim above
    // the bound is refused, a consistent one within it accepted.
    let csv = config(
        "pfedgraph",
        &[
            "rounds=1",
            "data.dataset=\"csv\"",
            "data.path=\"/nonexistent/{id}\"",
            "data.classes=2",
            "data.shape=[3]",
            "partition.kind=\"natural\"",
        ],
    );
    let out = tempfile::tempdir().unwrap();
    let (c, o) = (csv.clone(), out.path().to_path_buf());
    let server = start_server(move |addr| {
        let mut s = ServeOptions::new(c, addr, o);
        s.max_client_samples = 1000;
        s
    });
    let url = format!("http://{}", server.addr);
    let claim = |train: usize| ClientInfo {
        size: train,
        test_size: 2,
        counts: fedweave_data::ClientLabelCounts {
            train: vec![train - 1, 1],
            val: vec![0, 0],
            test: vec![1, 1],
            samples: [train, 0, 2],
        },
        num_classes: 2,
        dataset: "csv".into(),
        feature_shape: vec![3],
        outputs: 2,
        regression: false,
    };
    rt.block_on(async {
        let mut raw = Raw::connect(&url).await;
        for absurd in [usize::MAX / 2, 1001] {
            let e = raw
                .join(0, "", wire::encode(&claim(absurd)).unwrap(), vec![])
                .await
                .unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument);
            assert!(e.message().contains("limit"), "{}", e.message());
        }
        raw.join(0, "", wire::encode(&claim(1000)).unwrap(), vec![])
            .await
            .expect("a claim within the bound is taken");
    });
    drop(server);
}

/// A client that answers out of turn: an answer before its task was
/// handed out, a second answer to one task, uploads when not asked to
/// train, an origin that would skip norm clipping (empty, NaN), scores
/// of NaN and 7.0. Each is refused; the honest clients' run is unharmed
/// (finite figures in range, the cheater never counted).
#[test]
fn answers_out_of_turn_nan_scores_and_bad_origins_are_refused() {
    let cfg = config(
        "fedavg",
        &[
            "rounds=4",
            "participation=0.75",
            "train.local_iterations=30",
            "aggregator.kind=\"norm_clip\"",
        ],
    );
    let out = tempfile::tempdir().unwrap();
    let server = start_server(serve_opts(&cfg, out.path()));
    let url = format!("http://{}", server.addr);
    let honest = start_clients(&cfg, url.clone(), vec![0, 1, 2], |_| {});
    let derived = Derived::load(&cfg).unwrap();
    let d = derived.env().init.len();
    let info = wire::encode(&derived.info(3)).unwrap();
    let bad = Score {
        val_score: f64::NAN,
        val_reported: f64::NAN,
        test: fedweave_sim::runtime::TestMetrics {
            acc: 7.0,
            ..Default::default()
        },
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mut early, mut twice, mut rounds) = (0, 0, Vec::new());
    rt.block_on(async {
        let mut raw = Raw::connect(&url).await;
        let session = raw.join(3, "", info, vec![]).await.unwrap();
        loop {
            // An answer to a task not handed out yet: refused.
            let reply = Reply::<Vec<f32>>::Received { after: Some(bad) };
            let packed = wire::encode(&reply).unwrap();
            for seq in 0..12 {
                let e = raw.report(3, &session, seq, packed.clone()).await;
                assert!(e.is_err(), "an answer before its task was handed out");
                early += 1;
            }
            let payload = raw.next(3, &session).await.unwrap();
            let task = wire::decode::<Task<Vec<f32>>>(&payload, 1 << 30).unwrap();
            let (seq, reply) = match task {
                Task::Wait => continue,
                Task::Finish => break,
                Task::Train {
                    seq,
                    round,
                    participate,
                    ..
                } => {
                    rounds.push((round, participate));
                    // Uploads whether asked or not; the origin is empty
                    // or NaN, so clipping would measure nothing.
                    let origin = if round % 2 == 0 {
                        Some(vec![])
                    } else {
                        Some(vec![f32::NAN; d])
                    };
                    let upload = WireUpload {
                        up: vec![100.0f32; d],
                        loss: 0.1,
                        origin,
                    };
                    let reply = Reply::Trained {
                        upload: Some(upload),
                        before: Some(bad),
                        after: Some(bad),
                    };
                    (seq, reply)
                }
                Task::Receive { seq, .. } => (seq, Reply::Received { after: Some(bad) }),
            };
            let packed = wire::encode(&reply).unwrap();
            raw.report(3, &session, seq, packed.clone()).await.unwrap();
            // Answered already (or, its answer the last one, the phase
            // is over).
            let e = raw.report(3, &session, seq, packed).await.unwrap_err();
            assert!(
                matches!(e.code(), Code::AlreadyExists | Code::FailedPrecondition),
                "{e:?}"
            );
            twice += 1;
        }
    });
    let summary = join(server.handle, 300).expect("the run went on");
    join(honest, 60).expect("honest clients finished");
    assert!(early > 0 && twice >= 8, "early {early}, twice {twice}");
    let recs = rounds_of(out.path());
    assert_eq!(recs.len(), 4);
    for (r, (round, participate)) in recs.iter().zip(&rounds) {
        assert_eq!(r["round"].as_u64(), Some(*round as u64));
        let asked = r["participants"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!(3));
        assert_eq!(asked, *participate);
        // Its upload is refused whether it was asked (bad origin) or not.
        assert_eq!(r["rejected"], serde_json::json!([3]), "round {round}");
        for key in ["mean_val_acc", "mean_test_acc"] {
            let v = r[key].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&v), "{key} = {v}");
        }
    }
    assert!(rounds.iter().any(|r| !r.1), "client 3 sat out some round");
    let mean = summary.mean_test_acc.unwrap();
    assert!((0.0..=1.0).contains(&mean), "{mean}");
    // Never scored: its per-client figure is the tracker's initial one.
    assert_eq!(summary.per_client_test_acc[3], Some(0.0));
    for i in 0..3 {
        assert!(summary.per_client_test_acc[i].unwrap() > 0.5);
    }
}

/// The rounds of a run directory.
fn rounds_of(dir: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("rounds.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// One authenticated client may have at most `CALLS_PER_CLIENT` calls in
/// flight (each may hold a message up to the server's limit): further
/// ones are refused at once, and its slots come back when calls end.
#[test]
fn one_client_cannot_open_calls_without_bound() {
    let cfg = config("fedavg", &["rounds=1"]);
    let out = tempfile::tempdir().unwrap();
    let server = start_server(serve_opts(&cfg, out.path()));
    let url = format!("http://{}", server.addr);
    let info = wire::encode(&Derived::load(&cfg).unwrap().info(3)).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut raw = Raw::connect(&url).await;
        let session = raw.join(3, "", info, vec![]).await.unwrap();
        // No phase yet: every poll waits (up to 5 s) for a task.
        let polls: Vec<_> = (0..fedweave_net::hub::CALLS_PER_CLIENT + 3)
            .map(|_| {
                let (mut raw, session) = (raw.clone_channels(), session.clone());
                tokio::spawn(async move { raw.next(3, &session).await })
            })
            .collect();
        let mut exhausted = 0;
        for p in polls {
            match p.await.unwrap() {
                Ok(_) => {}
                Err(e) if e.code() == Code::ResourceExhausted => exhausted += 1,
                Err(e) => panic!("{e:?}"),
            }
        }
        assert_eq!(exhausted, 3);
        // The slots are free again.
        raw.next(3, &session)
            .await
            .expect("a poll after the others ended");
    });
    drop(server);
}

/// Seconds from `started` until the server closes `conn` (reads return
/// end of file or an error), waiting at most `limit`.
fn closed_after(conn: &mut std::net::TcpStream, started: std::time::Instant, limit: f64) -> f64 {
    use std::io::Read;
    conn.set_read_timeout(Some(Duration::from_secs_f64(limit)))
        .unwrap();
    let mut buf = [0u8; 256];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break,
            // The server's settings and pings.
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!("still open after {limit} s")
            }
            Err(_) => break,
        }
    }
    started.elapsed().as_secs_f64()
}

/// A connection that sends nothing (no preface), or stops after the
/// HTTP/2 preface, is closed once the idle deadline passes; one that
/// keeps calling stays open past it.
#[test]
fn silent_connections_are_closed_and_talking_ones_are_not() {
    let cfg = config("fedavg", &["rounds=1"]);
    let out = tempfile::tempdir().unwrap();
    let (c, o) = (cfg.clone(), out.path().to_path_buf());
    let server = start_server(move |addr| {
        let mut opts = ServeOptions::new(c, addr, o);
        opts.idle_timeout = Duration::from_secs(1);
        opts
    });
    let started = std::time::Instant::now();
    let mut silent = std::net::TcpStream::connect(server.addr).unwrap();
    let mut preface = std::net::TcpStream::connect(server.addr).unwrap();
    std::io::Write::write_all(&mut preface, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").unwrap();
    for conn in [&mut silent, &mut preface] {
        let t = closed_after(conn, started, 10.0);
        assert!((0.9..5.0).contains(&t), "closed after {t} s");
    }
    let url = format!("http://{}", server.addr);
    let info = wire::encode(&Derived::load(&cfg).unwrap().info(0)).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut raw = Raw::connect(&url).await;
        let mut session = raw.join(0, "", info.clone(), vec![]).await.unwrap();
        // Calls every 0.4 s for 3 s, on one connection: never idle.
        for _ in 0..8 {
            tokio::time::sleep(Duration::from_millis(400)).await;
            session = raw
                .join(0, "", info.clone(), session.clone())
                .await
                .expect("a talking connection stays open");
        }
    });
    drop(server);
}
