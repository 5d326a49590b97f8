//! Serve + N client processes, and serve + a few workers, against
//! `fedweave run` of the same config: bit-identical.

use crate::common::*;

/// One networked run of `cfg` with the clients grouped as `groups`.
fn networked(
    cfg: &fedweave_sim::ExperimentConfig,
    groups: &[Vec<usize>],
) -> (tempfile::TempDir, fedweave_sim::Summary) {
    let out = tempfile::tempdir().unwrap();
    let server = start_server(serve_opts(cfg, out.path()));
    let url = format!("http://{}", server.addr);
    let clients: Vec<_> = groups
        .iter()
        .map(|ids| start_clients(cfg, url.clone(), ids.clone(), |_| {}))
        .collect();
    let summary = join(server.handle, 300).expect("served");
    for c in clients {
        join(c, 60).expect("client finished");
    }
    (out, summary)
}

fn check(algo: &str, overrides: &[&str]) {
    let cfg = config(algo, overrides);
    let (sim_dir, sim) = simulate(&cfg);
    let (net_dir, net) = networked(&cfg, &[vec![0], vec![1], vec![2], vec![3]]);
    assert_same(sim_dir.path(), &sim, net_dir.path(), &net);
    let (net_dir, net) = networked(&cfg, &[vec![0, 1, 2], vec![3]]);
    assert_same(sim_dir.path(), &sim, net_dir.path(), &net);
}

#[test]
fn pfedgraph_over_grpc_equals_simulation() {
    check("pfedgraph", &["eval.when=\"before_and_after\""]);
}

#[test]
fn feddwa_over_grpc_equals_simulation() {
    check("feddwa", &[]);
}

#[test]
fn fedaghn_over_grpc_equals_simulation() {
    check("fedaghn", &[]);
}

#[test]
fn sfl_over_grpc_equals_simulation() {
    check("sfl", &[]);
}

#[test]
fn fedrep_split_model_over_grpc_equals_simulation() {
    check("fedrep", &[]);
}

#[test]
fn fedavg_with_partial_participation_over_grpc_equals_simulation() {
    check("fedavg", &["participation=0.5"]);
}
