//! DPFL by N peer processes (threads here, each with its own gRPC server)
//! against the simulation: the same graph rows, scores and transfers.

use crate::common::*;
use fedweave_net::peer::{PeerOptions, PeerReport, run_peer};
use std::collections::HashMap;
use std::sync::mpsc;
use std::time::Duration;

#[test]
fn dpfl_by_peers_equals_simulation() {
    let cfg = config("dpfl", &["algorithm.init_epochs=1"]);
    let (sim_dir, sim) = simulate(&cfg);
    let sim_rounds = rounds(sim_dir.path());
    let n = cfg.clients;
    // Bind every peer first (port 0), then hand each the others' URLs.
    let out = tempfile::tempdir().unwrap();
    let (addr_tx, addr_rx) = mpsc::channel();
    let mut url_txs = Vec::new();
    let mut handles = Vec::new();
    for id in 0..n {
        let (url_tx, url_rx) = mpsc::channel::<HashMap<usize, String>>();
        url_txs.push(url_tx);
        let (cfg, out, addr_tx) = (cfg.clone(), out.path().to_path_buf(), addr_tx.clone());
        handles.push(std::thread::spawn(move || {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            drop(listener);
            addr_tx.send((id, addr)).unwrap();
            let peers = url_rx.recv().unwrap();
            run_peer(PeerOptions::new(cfg, id, addr, peers, out), |_| {})
        }));
    }
    let mut urls = HashMap::new();
    for _ in 0..n {
        let (id, addr) = addr_rx.recv_timeout(Duration::from_secs(30)).unwrap();
        urls.insert(id, format!("http://{addr}"));
    }
    for tx in url_txs {
        tx.send(urls.clone()).unwrap();
    }
    let reports: Vec<PeerReport> = handles
        .into_iter()
        .map(|h| join(h, 300).expect("peer finished"))
        .collect();
    for (round, rec) in sim_rounds.iter().enumerate() {
        let graph: Vec<Vec<f64>> = serde_json::from_value(rec["graph"].clone()).unwrap();
        let mut transfers = 0;
        for r in &reports {
            let pr = &r.rounds[round];
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
    for r in &reports {
        assert_eq!(Some(r.best_test_acc), sim.per_client_test_acc[r.id]);
        assert_eq!(Some(r.best_round), sim.per_client_best_round[r.id]);
        assert!(out.path().join(format!("peer-{}.json", r.id)).exists());
    }
}
