//! `fedweave sweep` and `fedweave compare` end to end (tiny: digits, three
//! clients, two rounds).

use crate::{fedweave, text};
use std::path::Path;

fn write_grid(dir: &Path) -> String {
    std::fs::write(
        dir.join("base.toml"),
        "clients = 3\nrounds = 2\n[data]\ndataset = \"digits\"\n[partition]\nkind = \"dirichlet\"\n[model]\nkind = \"mlp\"\n[train]\nlocal_iterations = 2\nbatch_size = 16\n",
    )
    .unwrap();
    let g = dir.join("grid.toml");
    std::fs::write(
        &g,
        "base = \"base.toml\"\nseeds = [1, 2]\n[grid]\n\"algorithm.name\" = [\"fedavg\", \"local\", \"pfedgraph\"]\n\"partition.beta\" = [0.1, 1.0]\n",
    )
    .unwrap();
    g.display().to_string()
}

#[test]
fn sweep_then_rerun_then_compare() {
    let tmp = tempfile::tempdir().unwrap();
    let g = write_grid(tmp.path());
    let out = tmp.path().join("out");
    let out_s = out.to_str().unwrap();
    let o = fedweave(&["sweep", &g, "--out", out_s, "--jobs", "2"]);
    assert!(o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("12 runs: 12 run now, 0 skipped"), "{t}");
    // Not a terminal: one progress line per finished run, with an ETA.
    assert_eq!(t.matches("ETA").count(), 12, "{t}");
    assert!(t.contains("[12/12]"), "{t}");
    for f in ["results.csv", "table.md", "table.tex", "index.html"] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 13);
    let md = std::fs::read_to_string(out.join("table.md")).unwrap();
    assert!(md.contains("| algorithm | beta=0.1 | beta=1.0 |"), "{md}");
    // At least one best per column (ties are all bold).
    for line in md
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| algorithm"))
    {
        assert_eq!(line.matches('|').count(), 4, "{line}");
    }
    assert!(md.matches("**").count() >= 4, "a best per column:\n{md}");
    let dir = out.join("algorithm=pfedgraph__beta=0.1__seed=2");
    for f in ["summary.json", "rounds.jsonl", "config.toml", "report.html"] {
        assert!(dir.join(f).is_file(), "{f} missing in {}", dir.display());
    }

    let o = fedweave(&["sweep", &g, "--out", out_s]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("0 run now, 12 skipped"), "{}", text(&o));

    let mut args = vec!["compare".to_string()];
    for e in std::fs::read_dir(&out).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            args.push(p.display().to_string());
        }
    }
    let cmp = tmp.path().join("cmp");
    args.push("--out".into());
    args.push(cmp.display().to_string());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = fedweave(&args);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(cmp.join("table.md")).unwrap(),
        md,
        "compare groups by config differences, seeds together"
    );
    let html = std::fs::read_to_string(cmp.join("index.html")).unwrap();
    assert!(html.contains("../out/algorithm=fedavg__beta=0.1__seed=1/report.html"));
}

#[test]
fn bad_grid_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let g = tmp.path().join("grid.toml");
    std::fs::write(&g, "seeds = [1]\n[grid]\nrounds = 3\n").unwrap();
    let o = fedweave(&["sweep", g.to_str().unwrap()]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(t.contains("missing base"), "{t}");
    assert!(!t.contains("panicked"), "{t}");
    let o = fedweave(&["compare", tmp.path().to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("summary.json"), "{}", text(&o));
}

/// Runs that differ in two keys at once (algorithm and partition) make one
/// row per setting, not a diagonal of empty cells; row labels beside the
/// charts fit their margin (the full label is the tooltip).
#[test]
fn compare_of_settings_that_vary_together() {
    let tmp = tempfile::tempdir().unwrap();
    write_grid(tmp.path());
    let base = tmp.path().join("base.toml");
    let mut dirs = Vec::new();
    for (algo, kind, lr) in [("fedavg", "iid", "0.05"), ("local", "dirichlet", "0.02")] {
        let d = tmp.path().join(format!("{algo}-{kind}"));
        let o = fedweave(&[
            "run",
            base.to_str().unwrap(),
            "--out",
            d.to_str().unwrap(),
            "--set",
            &format!("algorithm.name={algo}"),
            "--set",
            &format!("partition.kind={kind}"),
            "--set",
            &format!("train.lr={lr}"),
            "--set",
            "train.weight_decay=0.000123456789",
        ]);
        assert!(o.status.success(), "{}", text(&o));
        dirs.push(d.display().to_string());
    }
    let cmp = tmp.path().join("cmp");
    let mut args = vec!["compare"];
    args.extend(dirs.iter().map(String::as_str));
    args.extend(["--out", cmp.to_str().unwrap()]);
    let o = fedweave(&args);
    assert!(o.status.success(), "{}", text(&o));
    let md = std::fs::read_to_string(cmp.join("table.md")).unwrap();
    assert!(!md.contains('—'), "no empty cells:\n{md}");
    assert!(
        md.contains("| algorithm, setting | mean_test_acc |"),
        "{md}"
    );
    assert!(md.contains("| fedavg, "), "{md}");
    assert!(md.contains("| local, "), "{md}");
    let html = std::fs::read_to_string(cmp.join("index.html")).unwrap();
    let mut cut = 0;
    for label in html.split("</title>").skip(1) {
        let shown = label.split("</text>").next().unwrap_or("");
        if !shown.contains('<') && !shown.is_empty() {
            assert!(shown.chars().count() <= 36, "row label too long: {shown}");
            cut += usize::from(shown.ends_with('…'));
        }
    }
    assert!(cut > 0, "long labels are shortened");
    // Two rounds: the round axis has ticks 1 and 2 only, once each.
    assert!(!html.contains(">1.5<"), "no fractional round ticks");
}
