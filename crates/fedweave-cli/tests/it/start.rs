//! Getting started: `init`, `config`, `list --json` and `completions`.

use crate::fedweave;
use std::process::{Command, Output};

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn summary(dir: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

#[test]
fn init_writes_a_commented_config_that_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let o = fedweave(&["init"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.lines()
            .filter(|l| l.trim_start().starts_with('#'))
            .count()
            >= 5
    );
    let cfg = tmp.path().join("exp.toml");
    std::fs::write(&cfg, &text).unwrap();
    let out = tmp.path().join("run");
    let o = fedweave(&[
        "run",
        cfg.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--set",
        "rounds=2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = summary(&out);
    assert_eq!(
        (s["algorithm"].as_str(), s["dataset"].as_str()),
        (Some("fedavg"), Some("digits"))
    );
    assert!(s["mean_test_acc"].as_f64().unwrap() > 0.5, "it learns: {s}");

    // --algorithm/--dataset, written with --out (never over a file).
    let other = tmp.path().join("other.toml");
    let o = fedweave(&[
        "init",
        "--algorithm",
        "pfedgraph",
        "--dataset",
        "synthetic",
        "--out",
        other.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&other).unwrap();
    assert!(text.contains("name = \"pfedgraph\"") && text.contains("dataset = \"synthetic\""));
    let o = fedweave(&["init", "--out", other.to_str().unwrap()]);
    assert!(
        !o.status.success() && stderr(&o).contains("exists"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_to_string(&other).unwrap(), text);

    let o = fedweave(&["init", "--algorithm", "pfedgrph"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("did you mean `pfedgraph`?"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn config_prints_the_resolved_config_and_runs_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("exp.toml");
    std::fs::write(&cfg, "rounds = 3\n[algorithm]\nname = \"pfedgraph\"\n").unwrap();
    let o = fedweave(&["config", cfg.to_str().unwrap(), "--set", "rounds=7"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    for want in [
        "rounds = 7",
        "clients = 10",
        "dataset = \"digits\"",
        "name = \"pfedgraph\"",
        "alpha = 0.8",
    ] {
        assert!(text.contains(want), "`{want}` missing:\n{text}");
    }
    // The printed config is itself a config, resolved to itself.
    let resolved = tmp.path().join("resolved.toml");
    std::fs::write(&resolved, &text).unwrap();
    let o = fedweave(&["config", resolved.to_str().unwrap()]);
    assert_eq!(stdout(&o), text);
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        2,
        "nothing run"
    );

    let o = fedweave(&["config", cfg.to_str().unwrap(), "--set", "rouns=2"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("did you mean `rounds`?"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn list_json_names_everything() {
    let o = fedweave(&["list", "--json"]);
    assert!(o.status.success());
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let names = |k: &str| -> Vec<String> {
        v[k].as_array()
            .unwrap_or_else(|| panic!("{k} missing"))
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(names("algorithms").contains(&"pfedgraph".to_string()));
    assert!(v["algorithms"][0]["reference"].is_string());
    assert!(names("datasets").contains(&"digits".to_string()));
    assert!(names("partitions").contains(&"dirichlet".to_string()));
    assert!(names("models").contains(&"cnn".to_string()));
    assert!(names("attacks").contains(&"sign_flip".to_string()));
    assert!(names("aggregators").contains(&"median".to_string()));
    assert!(v["datasets"][0]["description"].is_string());
    // The same names as the text listing.
    let text = stdout(&fedweave(&["list"]));
    for n in names("algorithms") {
        assert!(text.contains(&format!("  {n} ")), "{n}");
    }
    // Datasets: the registry's, in its order, with what data.path holds.
    let registry: Vec<String> = fedweave_data::datasets()
        .iter()
        .map(|d| d.name.to_string())
        .collect();
    assert_eq!(names("datasets"), registry);
    for (d, spec) in v["datasets"]
        .as_array()
        .unwrap()
        .iter()
        .zip(fedweave_data::datasets())
    {
        assert_eq!(d["natural_clients"].as_bool(), Some(spec.natural_clients));
        assert_eq!(d["path"].as_str(), spec.path.holds(), "{d}");
        assert!(text.contains(&format!("  {:<12} {}", spec.name, spec.help)));
    }
    let pfllib = &v["datasets"][registry.iter().position(|n| n == "pfllib").unwrap()];
    assert!(pfllib["path"].as_str().unwrap().contains("config.json"));
}

#[test]
fn init_writes_a_valid_config_for_every_dataset() {
    for d in fedweave_data::datasets() {
        let o = fedweave(&["init", "--dataset", d.name]);
        assert!(o.status.success(), "{}: {}", d.name, stderr(&o));
        let text = stdout(&o);
        assert!(text.contains(&format!("dataset = \"{}\"", d.name)));
        if d.natural_clients {
            assert!(text.contains("kind = \"natural\""), "{}: {text}", d.name);
        }
    }
}

#[test]
fn completions_for_each_shell() {
    let tmp = tempfile::tempdir().unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let o = fedweave(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", stderr(&o));
        let text = stdout(&o);
        for word in ["resume", "sweep", "completions", "overwrite"] {
            assert!(text.contains(word), "{shell} completion lacks {word}");
        }
        if shell == "bash" {
            let p = tmp.path().join("fedweave.bash");
            std::fs::write(&p, &text).unwrap();
            let ok = Command::new("bash").arg("-n").arg(&p).status().unwrap();
            assert!(ok.success(), "bash -n");
        }
    }
    let o = fedweave(&["completions", "tcsh"]);
    assert!(!o.status.success());
}

#[test]
fn default_run_directories_have_readable_unique_names() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("exp.toml"),
        "seed = 7\nclients = 3\nrounds = 1\n[partition]\nkind = \"iid\"\n[train]\nlocal_iterations = 2\n",
    )
    .unwrap();
    for want in ["fedavg-digits-iid-s7", "fedavg-digits-iid-s7-2"] {
        let o = Command::new(env!("CARGO_BIN_EXE_fedweave"))
            .current_dir(tmp.path())
            .args(["run", "exp.toml"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            stdout(&o).contains(&format!("outputs in runs/{want}")),
            "{}",
            stdout(&o)
        );
        assert!(
            tmp.path()
                .join("runs")
                .join(want)
                .join("summary.json")
                .is_file()
        );
    }
}
