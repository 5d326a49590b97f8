//! SFL and SFL* end to end on the bundled digits: the graph the server
//! propagates along is the one the configuration names (hand-checkable for
//! the label-overlap oracle), SFL* finds a known relation structure from the
//! models alone, and SFL's personalised models beat FedAvg's global one.

use crate::common;

use common::graph;
use fedweave_sim::{ExperimentConfig, Summary, run_experiment};

fn run(base: &str, overrides: &[&str]) -> (Summary, Vec<serde_json::Value>, serde_json::Value) {
    let r = common::run_config(base, overrides);
    (r.summary, r.rounds, r.partition)
}

fn shards(rounds: usize) -> String {
    format!(
        "seed = 1\nclients = 20\nrounds = {rounds}\n[data]\ndataset = \"digits\"\n\
         [partition]\nkind = \"shards\"\nshards_per_client = 2\n[model]\nkind = \"mlp\"\n\
         [train]\nlocal_iterations = 20\nbatch_size = 32\nlr = 0.05\n[algorithm]\nname = \"sfl\"\n"
    )
}

/// Each client's set of labels present in its training split.
fn label_sets(partition: &serde_json::Value) -> Vec<Vec<usize>> {
    partition["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let counts: Vec<usize> = serde_json::from_value(c["train"].clone()).unwrap();
            (0..counts.len()).filter(|&l| counts[l] > 0).collect()
        })
        .collect()
}

#[test]
fn one_hop_label_overlap_rows_are_uniform_over_label_sharing_clients() {
    let (_, rounds, partition) = run(&shards(1), &["algorithm.hops=1"]);
    let labels = label_sets(&partition);
    let g = graph(&rounds[0]);
    for (i, row) in g.iter().enumerate() {
        // With ≤ 2 labels per client, every label is in the client's top 5.
        let linked: Vec<usize> = (0..labels.len())
            .filter(|&j| labels[i].iter().any(|l| labels[j].contains(l)))
            .collect();
        assert!(linked.contains(&i));
        for (j, &w) in row.iter().enumerate() {
            let want = if linked.contains(&j) {
                1.0 / linked.len() as f64
            } else {
                0.0
            };
            assert!((w - want).abs() < 1e-12, "W[{i}][{j}] = {w}, want {want}");
        }
    }
}

#[test]
fn sfl_personalised_models_beat_fedavg_on_two_shard_clients() {
    let (sfl, rounds, _) = run(&shards(10), &[]);
    let (fedavg, _, _) = run(&shards(10), &["algorithm.name=fedavg"]);
    let (sfl_acc, avg_acc) = (sfl.mean_test_acc.unwrap(), fedavg.mean_test_acc.unwrap());
    assert!(sfl_acc > avg_acc, "SFL {sfl_acc:.4} vs FedAvg {avg_acc:.4}");
    // Three hops spread weight beyond direct neighbours, but every row is
    // still a distribution and SFL downloads u_i and w (2 models).
    let g = graph(rounds.last().unwrap());
    assert!(g.iter().all(|r| (r.iter().sum::<f64>() - 1.0).abs() < 1e-9));
    assert_eq!(sfl.bytes_down, 2 * fedavg.bytes_down);
}

#[test]
fn sfl_star_learns_the_group_structure_from_models_alone() {
    // 20 clients in 4 groups of 5 that share dominant classes: the true
    // relation graph links the clients of a group. The learned graph alone
    // (adj_beta = 1), 4 neighbours per client, one hop so the logged rows
    // show the learned edges themselves.
    let base = "seed = 3\nclients = 20\nrounds = 3\n[data]\ndataset = \"digits\"\n\
                [partition]\nkind = \"groups\"\ngroups = 4\ndominant_fraction = 0.9\n\
                [model]\nkind = \"mlp\"\n[train]\nlocal_iterations = 20\nbatch_size = 32\nlr = 0.05\n\
                [algorithm]\nname = \"sfl\"\ngraph = \"learned\"\nadj_beta = 1.0\ntop_k = 4\nhops = 1\n";
    let (_, rounds, _) = run(base, &[]);
    let g = graph(rounds.last().unwrap());
    let (mut edges, mut in_group) = (0, 0);
    for (i, row) in g.iter().enumerate() {
        for (j, &w) in row.iter().enumerate() {
            if j != i && w > 0.0 {
                edges += 1;
                in_group += usize::from(i / 5 == j / 5);
            }
        }
    }
    assert_eq!(edges, 20 * 4);
    // Chance: 4 of the 19 others are in the group (21 %).
    let overlap = in_group as f64 / edges as f64;
    assert!(
        overlap > 0.8,
        "learned edges inside the true groups: {overlap:.2}"
    );
}

#[test]
fn given_graph_without_a_dataset_graph_is_a_clear_error() {
    let cfg = ExperimentConfig::from_toml_str(&shards(1), &["algorithm.graph=\"given\"".into()])
        .expect("valid config");
    let dir = tempfile::tempdir().unwrap();
    let err = run_experiment(&cfg, dir.path(), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("no relation graph"), "{err}");
}
