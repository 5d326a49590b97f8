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

/// Each client's data in its own files (`data.dataset = "csv"`), as a
/// deployment has it: the simulation reads every client's directory; each
/// networked client runs on a "machine" (a directory) holding only its
/// own, and the run is the same bit for bit.
#[test]
fn clients_with_only_their_own_files_equal_the_simulation() {
    let root = tempfile::tempdir().unwrap();
    let digits = fedweave_data::load_dataset(&Default::default(), 0).unwrap();
    let d = digits.feature_len();
    let csv = |split: &fedweave_data::Split, keep: &dyn Fn(u32) -> bool| {
        let mut text = String::new();
        for (k, &y) in split.labels.iter().enumerate() {
            if keep(y) {
                let row: Vec<String> = split.features[k * d..(k + 1) * d]
                    .iter()
                    .map(|v| v.to_string())
                    .collect();
                text += &format!("{y},{}\n", row.join(","));
            }
        }
        text
    };
    // Client i holds the digits with y mod 4 = i, in the shared layout and
    // on its own machine.
    for i in 0..4u32 {
        let keep = move |y: u32| y % 4 == i;
        for dir in [
            root.path().join(format!("all/{i}")),
            root.path().join(format!("machine{i}/{i}")),
        ] {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("train.csv"), csv(&digits.train, &keep)).unwrap();
            std::fs::write(dir.join("test.csv"), csv(&digits.test, &keep)).unwrap();
        }
    }
    let path = |sub: &str| format!("data.path=\"{}/{sub}/{{id}}\"", root.path().display());
    let csv_cfg = |sub: &str| {
        config(
            "pfedgraph",
            &[
                "data.dataset=\"csv\"",
                &path(sub),
                "data.classes=10",
                "data.shape=[1, 8, 8]",
                "partition.kind=\"natural\"",
            ],
        )
    };
    let cfg = csv_cfg("all");
    let (sim_dir, sim) = simulate(&cfg);
    let out = tempfile::tempdir().unwrap();
    let server = start_server(serve_opts(&cfg, out.path()));
    let url = format!("http://{}", server.addr);
    let clients: Vec<_> = (0..4)
        .map(|i| {
            start_clients(
                &csv_cfg(&format!("machine{i}")),
                url.clone(),
                vec![i],
                |_| {},
            )
        })
        .collect();
    let net = join(server.handle, 300).expect("served");
    for c in clients {
        join(c, 60).expect("client finished");
    }
    assert_same(sim_dir.path(), &sim, out.path(), &net);
    // A client machine cannot simulate: the others' files are not there.
    let err = fedweave_sim::runtime::Derived::load(&csv_cfg("machine0")).err();
    assert!(err.is_some_and(|e| e.to_string().contains("train.csv")));
}
