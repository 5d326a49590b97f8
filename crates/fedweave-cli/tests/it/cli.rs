//! The `fedweave` binary as scripts use it: the contract's commands, its
//! outputs, and clear failures on bad input.

use crate::fedweave;
use std::path::Path;
use std::process::{Command, Output};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn write_config(dir: &Path, text: &str) -> String {
    let p = dir.join("cfg.toml");
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// A failure must be an error message, never a panic.
fn assert_clean_failure(o: &Output, needle: &str) {
    assert!(!o.status.success(), "should fail");
    let e = stderr(o);
    assert!(e.contains(needle), "stderr should mention `{needle}`: {e}");
    assert!(!e.contains("panicked"), "no panic: {e}");
}

#[test]
fn quickstart_runs_and_writes_every_contract_file() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let quickstart = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/quickstart.toml"
    );
    let o = fedweave(&[
        "run",
        quickstart,
        "--out",
        out.to_str().unwrap(),
        "--set",
        "rounds=3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    for k in [
        "algorithm",
        "dataset",
        "partition",
        "clients",
        "rounds",
        "seed",
        "mean_test_acc",
        "last_round_mean_test_acc",
        "per_client_test_acc",
        "std_test_acc",
        "malicious",
        "final_graph",
        "bytes_up",
        "bytes_down",
        "wall_seconds",
        "mean_test_mae",
        "mean_test_rmse",
        "mean_test_mape",
    ] {
        assert!(s.get(k).is_some(), "summary.json lacks {k}");
    }
    assert_eq!(s["rounds"], 3);
    assert_eq!(s["per_client_test_acc"].as_array().unwrap().len(), 10);
    let rounds = std::fs::read_to_string(out.join("rounds.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = rounds
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    for (k, r) in lines.iter().enumerate() {
        assert_eq!(r["round"], k + 1);
        for f in [
            "mean_val_acc",
            "mean_test_acc",
            "seconds",
            "bytes_up",
            "bytes_down",
            "graph",
        ] {
            assert!(r.get(f).is_some(), "round lacks {f}");
        }
    }
    let resolved = std::fs::read_to_string(out.join("config.toml")).unwrap();
    assert!(
        resolved.contains("rounds = 3") && resolved.contains("alpha = 0.8"),
        "{resolved}"
    );
    // `report` rebuilds the page from the directory.
    std::fs::remove_file(out.join("report.html")).unwrap();
    let o = fedweave(&["report", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.join("report.html").exists());
}

#[test]
fn list_names_everything() {
    let o = fedweave(&["list"]);
    let text = String::from_utf8_lossy(&o.stdout);
    for name in [
        "pfedgraph",
        "fedavg-ft",
        "fedprox",
        "digits",
        "fashion-mnist",
        "dirichlet",
        "pathological",
        "cnn",
        "sign_flip",
        "label_flip",
        "trimmed_mean",
        "multi_krum",
        "knn-per",
    ] {
        assert!(text.contains(name), "list lacks {name}");
    }
}

#[test]
fn unknown_key_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "rounds = 2\n[train]\nlearning_rate = 0.1\n");
    assert_clean_failure(
        &fedweave(&["run", &cfg, "--out", dir.path().join("o").to_str().unwrap()]),
        "learning_rate",
    );
}

#[test]
fn unknown_algorithm_key_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "rounds = 2\n[algorithm]\nname = \"pfedgraph\"\nbudget = 3\n",
    );
    assert_clean_failure(
        &fedweave(&["run", &cfg, "--out", dir.path().join("o").to_str().unwrap()]),
        "algorithm.budget",
    );
}

#[test]
fn wrong_type_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "rounds = \"twenty\"\n");
    assert_clean_failure(&fedweave(&["run", &cfg]), "rounds");
}

#[test]
fn missing_dataset_dir_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "rounds = 1\n[data]\ndataset = \"fashion-mnist\"\npath = \"/nonexistent/fmnist\"\n",
    );
    assert_clean_failure(
        &fedweave(&["run", &cfg, "--out", dir.path().join("o").to_str().unwrap()]),
        "/nonexistent/fmnist",
    );
}

#[test]
fn corrupt_idx_header_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    for f in [
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ] {
        std::fs::write(data.join(f), b"\x00\x00\x08\x99garbage").unwrap();
    }
    let cfg = write_config(
        dir.path(),
        &format!(
            "rounds = 1\n[data]\ndataset = \"mnist\"\npath = \"{}\"\n",
            data.display()
        ),
    );
    assert_clean_failure(
        &fedweave(&["run", &cfg, "--out", dir.path().join("o").to_str().unwrap()]),
        "-ubyte",
    );
}

#[test]
fn impossible_partition_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "rounds = 1\n[partition]\nkind = \"dirichlet\"\nbeta = 0.1\nmin_samples = 1000\n",
    );
    assert_clean_failure(
        &fedweave(&["run", &cfg, "--out", dir.path().join("o").to_str().unwrap()]),
        "min_samples",
    );
}

#[test]
fn missing_config_file_is_named() {
    assert_clean_failure(
        &fedweave(&["run", "/nonexistent/cfg.toml"]),
        "/nonexistent/cfg.toml",
    );
}

/// Real Fashion-MNIST (Debian's dataset-fashion-mnist, installed by .ci/run).
#[test]
fn fashion_mnist_cnn_learns_on_real_data() {
    if !Path::new("/usr/share/datasets/fashion-mnist").exists() {
        panic!("Fashion-MNIST missing: apt-get install dataset-fashion-mnist (as .ci/run does)");
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "seed = 1\nclients = 4\nrounds = 3\n[data]\ndataset = \"fashion-mnist\"\nmax_train_samples = 6000\n\
         [partition]\nkind = \"pathological\"\nclasses_per_client = 2\n[model]\nkind = \"cnn\"\n\
         [train]\nlocal_iterations = 30\nbatch_size = 64\nlr = 0.01\nmomentum = 0.9\n[algorithm]\nname = \"pfedgraph\"\n",
    );
    let out = dir.path().join("o");
    let o = fedweave(&["run", &cfg, "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["dataset"], "fashion-mnist");
    assert_eq!(s["model_parameters"], 44_426);
    // 2-class clients: chance is 0.5; a CNN learning real images is far above it.
    assert!(
        s["mean_test_acc"].as_f64().unwrap() > 0.85,
        "{}",
        s["mean_test_acc"]
    );
}

/// FedAGHN with its own model, the 4-layer CNN with batch norm, on real
/// Fashion-MNIST: it learns, and the per-layer graphs cover the six layer
/// groups (conv1, bn1, conv2, bn2, fc1, fc) while BN statistics stay local.
#[test]
fn fedaghn_cnn_bn_learns_on_real_fashion_mnist() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "seed = 1\nclients = 4\nrounds = 3\n[data]\ndataset = \"fashion-mnist\"\nmax_train_samples = 4000\n\
         [partition]\nkind = \"groups\"\ngroups = 2\n[model]\nkind = \"cnn-bn\"\n\
         [train]\nlocal_iterations = 20\nbatch_size = 64\nlr = 0.01\nmomentum = 0.0\n[algorithm]\nname = \"fedaghn\"\n",
    );
    let out = dir.path().join("o");
    let o = fedweave(&["run", &cfg, "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    // 582,026 (PFLlib FedAvgCNN) + 192 BN scales and shifts; buffers are not parameters.
    assert_eq!(s["model_parameters"], 582_218);
    let acc = s["mean_test_acc"].as_f64().unwrap();
    assert!(acc > 0.75, "FedAGHN cnn-bn accuracy {acc}");
    let rounds = std::fs::read_to_string(out.join("rounds.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(rounds.lines().last().unwrap()).unwrap();
    let layers: Vec<&String> = last["graph_layers"].as_object().unwrap().keys().collect();
    assert_eq!(layers, ["bn1", "bn2", "conv1", "conv2", "fc", "fc1"]);
}

/// `summary.json` without its wall-clock fields.
pub(crate) fn summary_numbers(dir: &Path) -> serde_json::Value {
    let mut s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    for k in ["wall_seconds", "seconds_per_round_median"] {
        s[k] = serde_json::Value::Null;
    }
    s
}

/// The contract's promise: a run killed with SIGKILL in the middle of a
/// round and resumed gives the same summary numbers and graphs as an
/// uninterrupted run.
#[test]
fn resume_after_kill_9_equals_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(
        dir.path(),
        "seed = 2\nclients = 6\nrounds = 12\nthreads = 1\n[data]\ndataset = \"digits\"\n\
         [partition]\nkind = \"dirichlet\"\nbeta = 0.5\n[model]\nkind = \"mlp\"\n\
         [train]\nlocal_iterations = 150\nbatch_size = 32\nlr = 0.05\n[algorithm]\nname = \"fedaghn\"\n",
    );
    let whole = dir.path().join("whole");
    let o = fedweave(&["run", &cfg, "--out", whole.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));

    let killed = dir.path().join("killed");
    let mut child = Command::new(env!("CARGO_BIN_EXE_fedweave"))
        .args(["run", &cfg, "--out", killed.to_str().unwrap()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let lines =
        || std::fs::read_to_string(killed.join("rounds.jsonl")).map_or(0, |t| t.lines().count());
    let started = std::time::Instant::now();
    while lines() < 3 && started.elapsed().as_secs() < 120 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !killed.join("summary.json").exists(),
        "killed before the end (round {})",
        lines()
    );

    let o = fedweave(&["resume", killed.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(summary_numbers(&killed), summary_numbers(&whole));
}

/// `fedweave tensorboard` exports finished runs found under a folder (as a
/// sweep leaves them); a folder without runs or a corrupt `rounds.jsonl`
/// is a clear error.
#[test]
fn tensorboard_exports_runs_under_a_folder() {
    use fedweave_records::tensorboard::{EVENT_FILE, read_events};
    let dir = tempfile::tempdir().unwrap();
    let quickstart = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/quickstart.toml"
    );
    let run = dir.path().join("sweep/a");
    let o = fedweave(&[
        "run",
        quickstart,
        "--out",
        run.to_str().unwrap(),
        "--set",
        "rounds=2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = fedweave(&["tensorboard", dir.path().join("sweep").to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let path = run.join(EVENT_FILE);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        path.display().to_string()
    );
    let events = read_events(&path).unwrap();
    assert_eq!(events.iter().map(|e| e.step).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(events[1].wall_time < events[2].wall_time);
    let first: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(run.join("rounds.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let acc = events[1]
        .summary
        .as_ref()
        .unwrap()
        .value
        .iter()
        .find(|v| v.tag == "accuracy/test_mean")
        .and_then(|v| v.simple_value);
    assert_eq!(acc, Some(first["mean_test_acc"].as_f64().unwrap() as f32));

    let empty = tempfile::tempdir().unwrap();
    assert_clean_failure(
        &fedweave(&["tensorboard", empty.path().to_str().unwrap()]),
        "no run directory",
    );
    std::fs::write(run.join("rounds.jsonl"), "{\"round\": 1}\nnot json\n").unwrap();
    assert_clean_failure(
        &fedweave(&["tensorboard", run.to_str().unwrap()]),
        "rounds.jsonl",
    );
}
