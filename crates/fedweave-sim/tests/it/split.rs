//! The split-model baselines end to end: uploads and downloads carry
//! exactly the shared part, the per-group graphs are logged, and FedBN is
//! FedAvg on a model without batch norm and keeps BN layers local with one.

use crate::common;
use crate::digits::run;

/// Elements of the MLP on 8×8 digits: 64·200+200, 200·200+200, 200·10+10.
const MLP_BASE: u64 = 64 * 200 + 200 + 200 * 200 + 200;
const MLP_HEAD: u64 = 200 * 10 + 10;

#[test]
fn uploads_and_downloads_carry_exactly_the_shared_part() {
    // 10 clients, all taking part; the average goes to all 10.
    for (name, shared, groups) in [
        ("fedrep", MLP_BASE, ["base", "head"]),
        ("fedper", MLP_BASE, ["base", "head"]),
        ("fedbabu", MLP_BASE, ["base", "head"]),
        ("lg-fedavg", MLP_HEAD, ["base", "head"]),
    ] {
        let (s, rounds) = run(&[&format!("algorithm.name={name}"), "rounds=2"]);
        assert_eq!(s.model_parameters as u64, MLP_BASE + MLP_HEAD);
        for r in &rounds {
            assert_eq!(r["bytes_up"], 10 * 4 * shared, "{name}");
            assert_eq!(r["bytes_down"], 10 * 4 * shared, "{name}");
            let layers = r["graph_layers"].as_object().unwrap();
            assert_eq!(layers.keys().collect::<Vec<_>>(), groups, "{name}");
            let kept = if name == "lg-fedavg" { "base" } else { "head" };
            let shared = if name == "lg-fedavg" { "head" } else { "base" };
            for (i, row) in common::graph(&serde_json::json!({"graph": layers[kept]}))
                .iter()
                .enumerate()
            {
                assert_eq!(row.iter().sum::<f64>(), 1.0);
                assert_eq!(row[i], 1.0, "{name}: the {kept} stays local");
            }
            let p = common::graph(&serde_json::json!({"graph": layers[shared]}));
            assert!(p.iter().all(|row| row == &p[0]), "{name}: every row is p");
        }
    }
}

/// On the MLP (no BN) FedBN runs FedAvg's numbers exactly.
#[test]
fn fedbn_without_batch_norm_is_fedavg() {
    let (avg, r_avg) = run(&["algorithm.name=fedavg", "rounds=3", "participation=0.7"]);
    let (bn, r_bn) = run(&["algorithm.name=fedbn", "rounds=3", "participation=0.7"]);
    assert_eq!(avg.per_client_test_acc, bn.per_client_test_acc);
    assert_eq!(avg.final_graph, bn.final_graph);
    assert!(bn.final_graph_layers.is_empty());
    assert_eq!((avg.bytes_up, avg.bytes_down), (bn.bytes_up, bn.bytes_down));
    for (a, b) in r_avg.iter().zip(&r_bn) {
        assert_eq!(a["mean_train_loss"], b["mean_train_loss"]);
        assert_eq!(a["graph"], b["graph"]);
    }
}

/// Fashion-MNIST with the batch-norm CNN (golden.rs's FMNIST config, one
/// round, three of four clients taking part).
const FMNIST_BN: &str = "seed = 2\nclients = 4\nrounds = 1\nthreads = 2\nparticipation = 0.75\n[data]\ndataset = \"fashion-mnist\"\nmax_train_samples = 1200\n[partition]\nkind = \"groups\"\ngroups = 2\n[model]\nkind = \"cnn-bn\"\n[train]\nlocal_iterations = 4\nbatch_size = 32\nlr = 0.01\nmomentum = 0.5\n";

/// On `cnn-bn`, FedBN sends everything but the 2·(32 + 64) BN scales and
/// shifts and logs "bn" = I and "rest" = p (one round: the test split is
/// the whole Fashion-MNIST test set, and scoring it dominates the cost).
#[test]
fn fedbn_keeps_batch_norm_layers_local_on_the_bn_cnn() {
    let run = common::run_config(FMNIST_BN, &["algorithm.name=fedbn"]);
    let d = run.summary.model_parameters as u64;
    let shared = 4 * (d - 2 * (32 + 64));
    let r = &run.rounds[0];
    assert_eq!(r["participants"].as_array().unwrap().len(), 3);
    assert_eq!(r["bytes_up"], 3 * shared);
    assert_eq!(r["bytes_down"], 4 * shared, "the average reaches all four");
    let layers = &r["graph_layers"];
    let kept = common::graph(&serde_json::json!({"graph": layers["bn"]}));
    let rest = common::graph(&serde_json::json!({"graph": layers["rest"]}));
    let absent = (0..4).find(|i| !r["participants"].as_array().unwrap().contains(&(*i).into()));
    for i in 0..4 {
        assert_eq!(kept[i][i], 1.0);
        assert_eq!(rest[i], rest[0]);
        assert!((rest[i].iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert_eq!(Some(i) == absent, rest[0][i] == 0.0);
    }
}

/// `[algorithm] personal` through the whole engine: FedAvg-FT with a
/// personal head is FedPer (same training, same scoring point) to the last
/// bit, and SFL with a personal head (SFL + FedPer, SFL's Table 4) moves
/// only the body both ways — u_i and the read-out w, each cut to the body.
#[test]
fn a_personal_part_composes_with_server_mixing_methods() {
    let (fedper, r_fedper) = run(&["algorithm.name=fedper", "rounds=3", "participation=0.7"]);
    let (composed, r_composed) = run(&[
        "algorithm.name=fedavg-ft",
        "algorithm.personal=head",
        "rounds=3",
        "participation=0.7",
    ]);
    assert_eq!(fedper.per_client_test_acc, composed.per_client_test_acc);
    assert_eq!(
        (fedper.bytes_up, fedper.bytes_down),
        (composed.bytes_up, composed.bytes_down)
    );
    for (a, b) in r_fedper.iter().zip(&r_composed) {
        assert_eq!(a["mean_train_loss"], b["mean_train_loss"]);
    }
    let (s, rounds) = run(&["algorithm.name=sfl", "algorithm.personal=head", "rounds=2"]);
    for r in &rounds {
        assert_eq!(r["bytes_up"], 10 * 4 * MLP_BASE);
        assert_eq!(r["bytes_down"], 10 * 4 * 2 * MLP_BASE);
    }
    let (plain, _) = run(&["algorithm.name=sfl", "rounds=2"]);
    assert_ne!(s.per_client_test_acc, plain.per_client_test_acc);
}
