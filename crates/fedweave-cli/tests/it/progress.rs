//! Progress as a log shows it (stderr not a terminal): a line per round
//! with its ETA, a line now and then inside a long round, none with
//! `--quiet`.

use std::process::{Command, Output};

fn run(extra: &[&str], env: Option<(&str, &str)>) -> (Output, String) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("cfg.toml");
    std::fs::write(
        &cfg,
        "seed = 1\nclients = 4\nrounds = 3\nthreads = 1\n[data]\ndataset = \"digits\"\n\
         [partition]\nkind = \"iid\"\n[model]\nkind = \"mlp\"\n[train]\nlocal_iterations = 60\n",
    )
    .unwrap();
    let mut c = Command::new(env!("CARGO_BIN_EXE_fedweave"));
    c.args(extra)
        .arg("run")
        .arg(&cfg)
        .arg("--out")
        .arg(dir.path().join("o"));
    if let Some((k, v)) = env {
        c.env(k, v);
    }
    let o = c.output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{e}");
    (o, e)
}

#[test]
fn each_round_has_a_line_with_its_eta() {
    let (_, e) = run(&[], None);
    let rounds: Vec<&str> = e.lines().filter(|l| l.contains("val acc")).collect();
    assert_eq!(rounds.len(), 3, "{e}");
    for (k, l) in rounds.iter().enumerate() {
        assert!(l.starts_with(&format!("round {:>4}/3", k + 1)), "{l}");
        assert!(l.contains(" elapsed  ETA "), "{l}");
    }
    assert!(rounds[2].ends_with("ETA 0.0 s"), "{}", rounds[2]);
}

#[test]
fn a_long_round_says_how_many_clients_have_trained() {
    let (_, e) = run(&[], Some(("FEDWEAVE_PROGRESS_SECONDS", "0.001")));
    let inside: Vec<&str> = e
        .lines()
        .filter(|l| l.contains("clients trained"))
        .collect();
    assert!(!inside.is_empty(), "{e}");
    for l in &inside {
        let counts = l.split_whitespace().nth(2).unwrap();
        let (k, n) = counts.split_once('/').unwrap();
        let (k, n): (usize, usize) = (k.parse().unwrap(), n.parse().unwrap());
        assert!(k <= n && n == 4, "{l}");
        assert!(l.contains("into the round"), "{l}");
    }
}

#[test]
fn quiet_shows_no_progress_but_the_result() {
    let (o, e) = run(&["--quiet"], None);
    assert!(!e.contains("round "), "{e}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("mean test acc"));
}
