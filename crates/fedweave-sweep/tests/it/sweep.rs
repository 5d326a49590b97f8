//! A real (tiny) sweep: aggregation matches the runs' summaries exactly,
//! finished runs are skipped, deleted or changed ones are rerun.

use std::path::Path;

use fedweave_sweep::{ExecOptions, SweepError, compare, sweep};
use serde_json::Value;

const BASE: &str = "clients = 3\nrounds = 2\n[data]\ndataset = \"digits\"\n[partition]\nkind = \"dirichlet\"\nbeta = 0.5\n[model]\nkind = \"mlp\"\n[train]\nlocal_iterations = 2\nbatch_size = 16\n";

fn grid(dir: &Path, lr: &str) -> std::path::PathBuf {
    std::fs::write(dir.join("base.toml"), BASE).unwrap();
    let p = dir.join("grid.toml");
    std::fs::write(
        &p,
        format!(
            "base = \"base.toml\"\nseeds = [1, 2, 3]\n[set]\n\"train.lr\" = {lr}\n[grid]\n\"algorithm.name\" = [\"fedavg\", \"local\"]\n"
        ),
    )
    .unwrap();
    p
}

fn quiet(jobs: usize) -> ExecOptions {
    ExecOptions {
        jobs,
        quiet: true,
        ..ExecOptions::default()
    }
}

fn summary(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p.join("summary.json")).unwrap()).unwrap()
}

#[test]
fn aggregates_exactly_and_skips_finished_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let g = grid(tmp.path(), "0.05");
    let out = tmp.path().join("out");
    let rep = sweep(&g, &out, &quiet(2)).unwrap();
    assert_eq!(rep.outcome.ran.len(), 6);
    assert!(rep.outcome.skipped.is_empty());

    // results.csv: every value read back equals the run's summary.json.
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    let mut lines = csv.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(&head[..3], ["run", "algorithm.name", "seed"]);
    for k in [
        "mean_test_acc",
        "last_round_mean_test_acc",
        "max_round_mean_test_acc",
        "std_test_acc",
        "bottom10_test_acc",
        "top5pct_test_acc",
        "bottom5pct_test_acc",
        "bytes_up",
        "bytes_down",
        "wall_seconds",
    ] {
        assert!(head.contains(&k), "results.csv lacks {k}");
    }
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 6);
    for row in &rows {
        let s = summary(&out.join(row[0]));
        for (i, k) in head.iter().enumerate().skip(3) {
            assert_eq!(
                row[i].parse::<f64>().unwrap(),
                s[*k].as_f64().unwrap(),
                "{} {k}",
                row[0]
            );
        }
        assert_eq!(row[2].parse::<u64>().unwrap(), s["seed"].as_u64().unwrap());
        assert_eq!(row[1], s["algorithm"].as_str().unwrap());
    }

    // table.md: mean ± sample std over the three seeds, by hand.
    let md = std::fs::read_to_string(out.join("table.md")).unwrap();
    let mut best = ("", f64::NEG_INFINITY);
    let mut cells = Vec::new();
    for algo in ["fedavg", "local"] {
        let xs: Vec<f64> = (1..=3)
            .map(|seed| {
                summary(&out.join(format!("algorithm={algo}__seed={seed}")))["mean_test_acc"]
                    .as_f64()
                    .unwrap()
            })
            .collect();
        let mean = (xs[0] + xs[1] + xs[2]) / 3.0;
        let var = ((xs[0] - mean).powi(2) + (xs[1] - mean).powi(2) + (xs[2] - mean).powi(2)) / 2.0;
        let cell = format!("{:.2} ± {:.2}", 100.0 * mean, 100.0 * var.sqrt());
        if mean > best.1 {
            best = (algo, mean);
        }
        cells.push((algo, cell));
    }
    for (algo, cell) in &cells {
        let bold = format!("| {algo} | **{cell}** |");
        let plain = format!("| {algo} | {cell} |");
        if *algo == best.0 {
            assert!(md.contains(&bold), "{bold} not in\n{md}");
        } else {
            assert!(md.contains(&plain), "{plain} not in\n{md}");
        }
    }
    let tex = std::fs::read_to_string(out.join("table.tex")).unwrap();
    assert!(
        tex.contains("\\toprule") && tex.contains("\\mathbf{"),
        "{tex}"
    );
    let html = std::fs::read_to_string(out.join("index.html")).unwrap();
    for needle in [
        "id=\"curves\"",
        "<polygon",
        "id=\"graphs\"",
        "heatmap",
        "id=\"fairness\"",
        "id=\"comm\"",
    ] {
        assert!(html.contains(needle), "index.html lacks {needle}");
    }
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "self-contained"
    );

    // Second invocation runs nothing.
    let rep = sweep(&g, &out, &quiet(1)).unwrap();
    assert!(rep.outcome.ran.is_empty(), "{:?}", rep.outcome.ran);
    assert_eq!(rep.outcome.skipped.len(), 6);

    // A deleted summary (an interrupted run) reruns exactly that run.
    std::fs::remove_file(out.join("algorithm=local__seed=2/summary.json")).unwrap();
    let rep = sweep(&g, &out, &quiet(2)).unwrap();
    assert_eq!(rep.outcome.ran, ["algorithm=local__seed=2"]);
    assert_eq!(rep.outcome.skipped.len(), 5);
    assert!(out.join("algorithm=local__seed=2/summary.json").is_file());

    // Compare on the run directories gives the same table.
    let mut dirs: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.reverse();
    let cmp = tmp.path().join("cmp");
    compare(&dirs, &cmp).unwrap();
    let md2 = std::fs::read_to_string(cmp.join("table.md")).unwrap();
    assert_eq!(md, md2);

    // A changed configuration is not skipped.
    let g = grid(tmp.path(), "0.02");
    let rep = sweep(&g, &out, &quiet(2)).unwrap();
    assert_eq!(rep.outcome.ran.len(), 6);
    assert!(rep.outcome.skipped.is_empty());
    let cfg = std::fs::read_to_string(out.join("algorithm=fedavg__seed=1/config.toml")).unwrap();
    assert!(cfg.contains("lr = 0.02"), "{cfg}");
}

#[test]
fn a_bad_key_fails_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("base.toml"), BASE).unwrap();
    let g = tmp.path().join("grid.toml");
    std::fs::write(
        &g,
        "base = \"base.toml\"\n[grid]\n\"algorithm.name\" = [\"fedavg\", \"local\"]\n[[case]]\n\"train.lrr\" = 0.1\n",
    )
    .unwrap();
    let out = tmp.path().join("out");
    let e = sweep(&g, &out, &quiet(1)).unwrap_err();
    assert!(matches!(e, SweepError::Config { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("lrr=0.1__seed=1") && msg.contains("lrr"),
        "{msg}"
    );
    assert!(!out.exists(), "nothing ran");
}
