//! Messages a new user meets: "did you mean" for mistyped names and keys,
//! no Rust type names, each cause once, and loud warnings for runs whose
//! results mean little.

use crate::fedweave;
use std::path::Path;
use std::process::Output;

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const BASE: &str = "seed = 1\nclients = 4\nrounds = 2\nthreads = 1\n[data]\ndataset = \"digits\"\n\
    [partition]\nkind = \"iid\"\n[model]\nkind = \"mlp\"\n[train]\nlocal_iterations = 5\n\
    [algorithm]\nname = \"fedavg\"\n";

fn config(dir: &Path) -> String {
    let p = dir.join("cfg.toml");
    std::fs::write(&p, BASE).unwrap();
    p.display().to_string()
}

/// Runs `config` with one override; it must fail before any work, with a
/// message holding `want` and no Rust type name or panic.
fn refused(set: &str, want: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let o = fedweave(&[
        "run",
        &config(dir.path()),
        "--out",
        out.to_str().unwrap(),
        "--set",
        set,
    ]);
    assert!(!o.status.success(), "{set} should be refused");
    let e = stderr(&o);
    assert!(e.contains(want), "--set {set}: `{want}` not in {e}");
    for leak in ["Section", "usize", "u64", "f64", "panicked", "struct "] {
        assert!(!e.contains(leak), "--set {set} leaks `{leak}`: {e}");
    }
    assert!(
        !out.exists(),
        "nothing written before the config is checked"
    );
    e
}

#[test]
fn mistyped_names_and_keys_get_a_suggestion() {
    let e = refused("algorithm.name=pfedgrph", "did you mean `pfedgraph`?");
    assert!(!e.contains("fedavg-ft"), "no list of every algorithm: {e}");
    refused(
        "rouns=5",
        "config key `rouns`: unknown key; did you mean `rounds`?",
    );
    refused("train.lrr=0.1", "did you mean `train.lr`?");
    refused(
        "data.dataset=digts",
        "unknown dataset `digts`; did you mean `digits`?",
    );
    refused("model.kind=mpl", "did you mean `mlp`?");
    refused("attack.kind=signflip", "did you mean `sign_flip`?");
    refused(
        "algorithm={ name = \"pfedgraph\", alpah = 0.5 }",
        "unknown key `algorithm.alpah`; did you mean `algorithm.alpha`?",
    );
    // No close name: the list, to choose from.
    refused("data.dataset=zzzz", "known: digits, fashion-mnist");
}

#[test]
fn wrong_types_are_said_in_words() {
    refused(
        "train=5",
        "expected a table (a `[train]` section), got integer `5`",
    );
    refused(
        "rounds=\"many\"",
        "expected a whole number ≥ 0, got string \"many\"",
    );
}

#[test]
fn each_cause_is_said_once() {
    let o = fedweave(&["run", "no-such-config.toml"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert_eq!(e.matches("No such file").count(), 1, "{e}");
    assert!(e.contains("no-such-config.toml"), "{e}");

    // A sweep grid's bad run: the suggestion once, not the list twice.
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let g = dir.path().join("grid.toml");
    std::fs::write(
        &g,
        "base = \"cfg.toml\"\nseeds = [1]\n[grid]\n\"algorithm.name\" = [\"pfedgrph\"]\n",
    )
    .unwrap();
    let o = fedweave(&["sweep", g.to_str().unwrap(), "--dry-run"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert_eq!(e.matches("did you mean `pfedgraph`").count(), 1, "{e}");
    assert_eq!(e.lines().filter(|l| !l.trim().is_empty()).count(), 1, "{e}");
}

#[test]
fn meaningless_runs_are_warned_about_loudly() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let o = fedweave(&[
        "run",
        &cfg,
        "--out",
        dir.path().join("one").to_str().unwrap(),
        "--set",
        "clients=1",
        "--set",
        "rounds=1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("WARNING: clients = 1: a federation of one client"),
        "{}",
        stderr(&o)
    );

    let o = fedweave(&[
        "run",
        &cfg,
        "--out",
        dir.path().join("nan").to_str().unwrap(),
        "--set",
        "train.lr=1e6",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("WARNING: round 1: every upload was rejected"),
        "{e}"
    );
    assert!(
        e.contains("WARNING: round 2: every upload was rejected"),
        "{e}"
    );
    assert!(
        e.contains(
            "every upload was rejected in 2 round(s) (round 1, 2); these results mean little"
        ),
        "{e}"
    );
    // Not a terminal: no colour codes in the log.
    assert!(!e.contains('\u{1b}'), "no ANSI codes in a pipe: {e}");
}

#[test]
fn grid_files_get_suggestions_too() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path());
    let g = dir.path().join("grid.toml");
    for (grid, want) in [
        (
            "base = \"cfg.toml\"\nsede = [1]\n",
            "unknown key `sede`; did you mean `seeds`?",
        ),
        (
            "base = \"cfg.toml\"\n[grid]\nrouns = [2, 3]\n",
            "did you mean `rounds`?",
        ),
    ] {
        std::fs::write(&g, grid).unwrap();
        let o = fedweave(&["sweep", g.to_str().unwrap(), "--dry-run"]);
        assert!(!o.status.success());
        let e = stderr(&o);
        assert_eq!(e.matches(want).count(), 1, "{e}");
    }
}
