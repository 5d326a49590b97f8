//! Sweeps on a cluster: `--emit slurm|k8s`, `--only K`, `--collect`.

use crate::{fedweave, text};
use std::path::Path;
use std::process::Command;

/// Two algorithms × two seeds, tiny runs.
fn write_grid(dir: &Path) -> String {
    std::fs::write(
        dir.join("base.toml"),
        "clients = 3\nrounds = 2\nthreads = 1\n[data]\ndataset = \"digits\"\n[partition]\nkind = \"iid\"\n\
         [model]\nkind = \"mlp\"\n[train]\nlocal_iterations = 3\nbatch_size = 16\n",
    )
    .unwrap();
    let g = dir.join("grid.toml");
    std::fs::write(
        &g,
        "base = \"base.toml\"\nseeds = [1, 2]\n[grid]\n\"algorithm.name\" = [\"fedavg\", \"local\"]\n",
    )
    .unwrap();
    g.display().to_string()
}

/// `results.csv` without its wall-clock column.
fn results_without_time(dir: &Path) -> Vec<Vec<String>> {
    let csv = std::fs::read_to_string(dir.join("results.csv")).unwrap();
    let rows: Vec<Vec<String>> = csv
        .lines()
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    let t = rows[0].iter().position(|c| c == "wall_seconds").unwrap();
    rows.into_iter()
        .map(|mut r| {
            r.remove(t);
            r
        })
        .collect()
}

fn run_dirs(out: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(out)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn slurm_array_task_k_runs_grid_point_k_and_collect_equals_a_local_sweep() {
    let tmp = tempfile::tempdir().unwrap();
    let g = write_grid(tmp.path());
    let out = tmp.path().join("cluster");
    let out_s = out.to_str().unwrap();

    // Grid point K as `--dry-run` numbers them.
    let o = fedweave(&["sweep", &g, "--out", out_s, "--dry-run"]);
    assert!(o.status.success(), "{}", text(&o));
    let listed = String::from_utf8_lossy(&o.stdout).into_owned();
    let point = |k: usize| -> String {
        let line = listed
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{k} ")))
            .unwrap_or_else(|| panic!("no grid point {k}: {listed}"));
        line.split_whitespace().last().unwrap().to_string()
    };
    assert_eq!(point(2), "algorithm=local__seed=1");

    let o = fedweave(&["sweep", &g, "--out", out_s, "--emit", "slurm"]);
    assert!(o.status.success(), "{}", text(&o));
    let script = out.join("sweep.slurm");
    let body = std::fs::read_to_string(&script).unwrap();
    assert!(body.starts_with("#!/bin/bash\n"));
    assert!(body.contains("#SBATCH --array=0-3\n"), "{body}");
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .status()
        .unwrap();
    assert!(syntax.success(), "bash -n");

    // Array task 2, run here as Slurm would (from another directory).
    let o = Command::new("bash")
        .arg(&script)
        .current_dir(std::env::temp_dir())
        .env("SLURM_ARRAY_TASK_ID", "2")
        .env("FEDWEAVE", env!("CARGO_BIN_EXE_fedweave"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(run_dirs(&out), [point(2)], "exactly grid point 2");
    let s: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join(point(2)).join("summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        (s["algorithm"].as_str(), s["seed"].as_u64()),
        (Some("local"), Some(1))
    );
    // Without a task id the script refuses to guess.
    let o = Command::new("bash")
        .arg(&script)
        .env_remove("SLURM_ARRAY_TASK_ID")
        .env("FEDWEAVE", env!("CARGO_BIN_EXE_fedweave"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("SLURM_ARRAY_TASK_ID"), "{}", text(&o));

    // Collecting early names what is missing.
    let o = fedweave(&["sweep", &g, "--out", out_s, "--collect"]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("3 of 4 grid points have no finished run yet"),
        "{}",
        text(&o)
    );

    for k in ["0", "1", "3"] {
        let o = fedweave(&["sweep", &g, "--out", out_s, "--only", k]);
        assert!(o.status.success(), "{}", text(&o));
    }
    let o = fedweave(&["sweep", &g, "--out", out_s, "--only", "4"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("the grid has 4 runs"), "{}", text(&o));

    let o = fedweave(&["sweep", &g, "--out", out_s, "--collect"]);
    assert!(o.status.success(), "{}", text(&o));
    for f in ["results.csv", "table.md", "table.tex", "index.html"] {
        assert!(out.join(f).is_file(), "{f}");
    }
    let local = tmp.path().join("local");
    let o = fedweave(&["sweep", &g, "--out", local.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(results_without_time(&out), results_without_time(&local));
    assert_eq!(
        std::fs::read_to_string(out.join("table.md")).unwrap(),
        std::fs::read_to_string(local.join("table.md")).unwrap()
    );
}

#[test]
fn k8s_manifest_is_an_indexed_job_with_one_completion_per_grid_point() {
    use yaml_rust2::YamlLoader;
    let tmp = tempfile::tempdir().unwrap();
    let g = write_grid(tmp.path());
    let out = tmp.path().join("k8s");
    let o = fedweave(&[
        "sweep",
        &g,
        "--out",
        out.to_str().unwrap(),
        "--emit",
        "k8s",
        "--set",
        "rounds=1",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let body = std::fs::read_to_string(out.join("sweep-job.yaml")).unwrap();
    let docs = YamlLoader::load_from_str(&body).expect("valid YAML");
    assert_eq!(docs.len(), 1);
    let job = &docs[0];
    assert_eq!(job["apiVersion"].as_str(), Some("batch/v1"));
    assert_eq!(job["kind"].as_str(), Some("Job"));
    assert_eq!(job["spec"]["completionMode"].as_str(), Some("Indexed"));
    assert_eq!(job["spec"]["completions"].as_i64(), Some(4));
    let c = &job["spec"]["template"]["spec"]["containers"][0];
    let cmd: Vec<&str> = c["command"]
        .as_vec()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(cmd[..2], ["sh", "-c"]);
    assert!(
        cmd[2].contains("--only \"$JOB_COMPLETION_INDEX\""),
        "{}",
        cmd[2]
    );
    assert!(cmd[2].contains("--set 'rounds=1'"), "{}", cmd[2]);
    let name = job["metadata"]["name"].as_str().unwrap();
    assert!(
        name.chars()
            .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-')
    );
    // Nothing ran.
    assert!(run_dirs(&out).is_empty());
}
