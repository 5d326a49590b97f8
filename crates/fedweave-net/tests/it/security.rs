//! Tokens and refusals, TLS, and a client that stops answering.

use crate::common::*;
use fedweave_net::NetError;
use fedweave_net::server::ServeOptions;
use std::time::Duration;

fn refused(r: Result<(), NetError>, why: &str) {
    match r {
        Err(NetError::Refused(m)) => assert!(m.contains(why), "refusal `{m}` lacks `{why}`"),
        other => panic!("expected a refusal ({why}), got {other:?}"),
    }
}

#[test]
fn wrong_missing_and_unknown_tokens_and_a_second_connection_are_refused_and_the_run_goes_on() {
    let cfg = config("fedavg", &["rounds=3"]);
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.txt");
    std::fs::write(&tokens, "# id token\n0 t0\n1 t1\n2 t2\n3 t3\n").unwrap();
    let out = dir.path().join("run");
    let (c, t) = (cfg.clone(), tokens.clone());
    let server = start_server(move |addr| {
        let mut o = ServeOptions::new(c, addr, out);
        o.tokens = Some(t);
        o
    });
    let url = format!("http://{}", server.addr);
    let token = |t: &'static str| {
        move |o: &mut fedweave_net::client::ClientOptions| o.token = Some(t.into())
    };
    refused(
        join(start_clients(&cfg, url.clone(), vec![0], token("t1")), 60),
        "wrong token",
    );
    refused(
        join(start_clients(&cfg, url.clone(), vec![1], |_| {}), 60),
        "token is required",
    );
    let five = config("fedavg", &["rounds=3", "clients=5"]);
    refused(
        join(start_clients(&five, url.clone(), vec![4], token("t3")), 60),
        "unknown client id 4",
    );
    let good: Vec<_> = [("t0", 0), ("t1", 1), ("t2", 2), ("t3", 3)]
        .into_iter()
        .map(|(t, i)| start_clients(&cfg, url.clone(), vec![i], token(t)))
        .collect();
    // Once round 1 is done every client is connected: a second connection
    // for id 2, with the right token, is refused.
    let first = server
        .rounds
        .recv_timeout(Duration::from_secs(120))
        .unwrap();
    assert_eq!(first.round, 1);
    refused(
        join(start_clients(&cfg, url.clone(), vec![2], token("t2")), 60),
        "already connected",
    );
    finish_and_compare(
        &cfg,
        server.handle,
        "the run went on",
        good,
        &dir.path().join("run"),
    );
}

#[test]
fn tls_with_fedweave_certs_gives_the_same_run_and_plain_clients_cannot_talk_to_it() {
    let cfg = config("pfedgraph", &["rounds=2"]);
    let dir = tempfile::tempdir().unwrap();
    let files =
        fedweave_net::certs::generate(&dir.path().join("certs"), &["localhost".into()], 0, 0)
            .unwrap();
    let out = dir.path().join("run");
    let (c, cert, key) = (cfg.clone(), files.cert.clone(), files.key.clone());
    let server = start_server(move |addr| {
        let mut o = ServeOptions::new(c, addr, out);
        o.tls = Some((cert, key));
        o
    });
    let port = server.addr.port();
    // Without TLS the server cannot be reached.
    let plain = start_clients(&cfg, format!("http://localhost:{port}"), vec![0], |o| {
        o.retry_for = Duration::from_secs(2);
    });
    assert!(matches!(join(plain, 60), Err(NetError::Transport(_))));
    let ca = files.ca.clone();
    let clients = start_clients(
        &cfg,
        format!("https://localhost:{port}"),
        vec![0, 1, 2, 3],
        move |o| {
            o.ca = Some(ca);
        },
    );
    let summary = join(server.handle, 300).expect("served over TLS");
    join(clients, 60).expect("clients finished");
    let (sim_dir, sim) = simulate(&cfg);
    assert_same(sim_dir.path(), &sim, &dir.path().join("run"), &summary);
}

/// A client that sends a model full of NaN in round 1 and one of the wrong
/// length in round 2 (a forged client speaking the protocol directly): both
/// uploads are rejected as in simulation, recorded, and the rounds go on
/// with the three honest clients.
#[test]
fn nan_and_wrong_shape_uploads_are_rejected_without_ending_the_round() {
    use fedweave_net::wire::{self, Reply, Task, WireUpload};
    let cfg = config("fedavg", &["rounds=3", "train.local_iterations=30"]);
    let out = tempfile::tempdir().unwrap();
    let server = start_server(serve_opts(&cfg, out.path()));
    let url = format!("http://{}", server.addr);
    let honest = start_clients(&cfg, url.clone(), vec![0, 1, 2], |_| {});
    let derived = fedweave_sim::runtime::Derived::load(&cfg).unwrap();
    let d = derived.env().init.len();
    let info = wire::encode(&derived.info(3)).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut raw = Raw::connect(&url).await;
        let session = raw.join(3, "", info, Vec::new()).await.unwrap();
        loop {
            let payload = raw.next(3, &session).await.unwrap();
            let (seq, reply) = match wire::decode::<Task<Vec<f32>>>(&payload, 1 << 30).unwrap() {
                Task::Wait => continue,
                Task::Finish => break,
                Task::Train { seq, round, .. } => {
                    let up = if round == 1 {
                        vec![f32::NAN; d]
                    } else {
                        vec![0.0; d - 1]
                    };
                    let upload = Some(WireUpload {
                        up,
                        loss: 0.0,
                        origin: None,
                    });
                    let reply = Reply::Trained {
                        upload,
                        before: None,
                        after: Some(Default::default()),
                    };
                    (seq, reply)
                }
                Task::Receive { seq, .. } => (
                    seq,
                    Reply::Received {
                        after: Some(Default::default()),
                    },
                ),
            };
            raw.report(3, &session, seq, wire::encode(&reply).unwrap())
                .await
                .unwrap();
        }
    });
    let summary = join(server.handle, 300).expect("the run went on");
    join(honest, 60).expect("honest clients finished");
    let recs = rounds(out.path());
    assert_eq!(recs.len(), 3);
    for r in &recs {
        assert_eq!(
            r["rejected"],
            serde_json::json!([3]),
            "round {}",
            r["round"]
        );
    }
    // The average never took the NaN model in: the honest clients learned
    // (chance on ten digit classes is 0.1; a NaN model scores about that).
    for i in 0..3 {
        let acc = summary.per_client_test_acc[i].unwrap();
        assert!(acc > 0.5, "client {i}: {acc}");
    }
}

/// Settings only a simulation can honour stop `serve` before it listens:
/// attacks (the network runs honest clients) and batched training (each
/// networked client trains alone, so the run would differ from `fedweave run`).
#[test]
fn simulation_only_settings_are_refused_up_front() {
    for (extra, why) in [
        ("attack.kind=sign_flip", "attacks"),
        ("device.batch_clients=4", "device.batch_clients"),
    ] {
        let mut overrides = vec!["rounds=1", extra];
        if extra.starts_with("attack") {
            overrides.push("attack.ratio=0.25");
        }
        let cfg = config("fedavg", &overrides);
        let dir = tempfile::tempdir().unwrap();
        let opts = ServeOptions::new(cfg, "127.0.0.1:0".parse().unwrap(), dir.path().join("run"));
        let got = fedweave_net::server::serve(opts, |_| panic!("listened"), &mut |_| {});
        match got {
            Err(NetError::Unsupported(m)) => assert!(m.contains(why), "`{m}` lacks `{why}`"),
            other => panic!("{extra}: expected a refusal, got {:?}", other.map(|_| ())),
        }
    }
}

/// Mutual TLS: clients authenticated by certificates naming their ids
/// (`fedweave certs --clients 4`, `serve --client-ca`); a worker presents
/// each id's own certificate (`{id}` in the paths) and the run equals the
/// simulation. A certificate for id 1 cannot join as id 2, and a client
/// without a certificate cannot talk to the server at all.
#[test]
fn client_certificates_authenticate_ids_and_give_the_same_run() {
    let cfg = config("pfedgraph", &["rounds=2"]);
    let dir = tempfile::tempdir().unwrap();
    let files = fedweave_net::certs::generate(&dir.path().join("certs"), &[], 4, 0).unwrap();
    let out = dir.path().join("run");
    let (c, cert, key, ca) = (
        cfg.clone(),
        files.cert.clone(),
        files.key.clone(),
        files.ca.clone(),
    );
    let server = start_server(move |addr| {
        let mut o = ServeOptions::new(c, addr, out);
        o.tls = Some((cert, key));
        o.client_ca = Some(ca);
        o
    });
    let url = format!("https://localhost:{}", server.addr.port());
    let ca = files.ca.clone();
    let certs = dir.path().join("certs");
    let with = move |paths: Option<(&str, &str)>| {
        let (ca, certs) = (ca.clone(), certs.clone());
        let paths = paths.map(|(c, k)| (certs.join(c), certs.join(k)));
        move |o: &mut fedweave_net::client::ClientOptions| {
            o.ca = Some(ca);
            o.identity = paths;
            o.retry_for = Duration::from_secs(2);
        }
    };
    // Client 1's certificate for id 2.
    refused(
        join(
            start_clients(
                &cfg,
                url.clone(),
                vec![2],
                with(Some(("client-1.pem", "client-1.key"))),
            ),
            60,
        ),
        "certificate",
    );
    // No certificate: the TLS handshake fails.
    assert!(matches!(
        join(start_clients(&cfg, url.clone(), vec![2], with(None)), 60),
        Err(NetError::Transport(_))
    ));
    let clients = start_clients(
        &cfg,
        url,
        vec![0, 1, 2, 3],
        with(Some(("client-{id}.pem", "client-{id}.key"))),
    );
    let summary = join(server.handle, 300).expect("served with client certificates");
    join(clients, 60).expect("clients finished");
    let (sim_dir, sim) = simulate(&cfg);
    assert_same(sim_dir.path(), &sim, &dir.path().join("run"), &summary);
}
