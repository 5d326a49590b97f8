//! Stopping and restarting through the binary: SIGINT stops a run (or a
//! sweep) at the end of a round with its checkpoint written, `resume`
//! continues it to the numbers of an uninterrupted run, and nothing is
//! overwritten without being asked.

use crate::{fedweave, text};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::cli::summary_numbers;

/// Six digits clients, `rounds` rounds of a few steps each; checkpoints
/// only every 5 rounds, so a stop in between must write its own.
fn tiny_config(dir: &Path, rounds: usize) -> String {
    let p = dir.join("cfg.toml");
    std::fs::write(
        &p,
        format!(
            "seed = 3\nclients = 6\nrounds = {rounds}\nthreads = 1\ncheckpoint_every = 5\n\
             [data]\ndataset = \"digits\"\n[partition]\nkind = \"dirichlet\"\nbeta = 0.5\n\
             [model]\nkind = \"mlp\"\n[train]\nlocal_iterations = 40\nbatch_size = 16\n\
             [algorithm]\nname = \"pfedgraph\"\n"
        ),
    )
    .unwrap();
    p.display().to_string()
}

fn lines(file: &Path) -> usize {
    std::fs::read_to_string(file).map_or(0, |t| t.lines().count())
}

/// Sends SIGINT to `child` once `file` has a line, and returns its output.
fn interrupt_when_written(child: Child, file: &Path) -> Output {
    let started = Instant::now();
    while lines(file) < 1 && started.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    child.wait_with_output().unwrap()
}

fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_fedweave"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn rounds_without_time(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("rounds.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["seconds"] = serde_json::Value::Null;
            v
        })
        .collect()
}

#[test]
fn sigint_stops_after_a_round_and_resume_equals_an_uninterrupted_run() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny_config(tmp.path(), 12);
    let whole = tmp.path().join("whole");
    let o = fedweave(&["run", &cfg, "--out", whole.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));

    let cut = tmp.path().join("cut");
    let cut_s = cut.to_str().unwrap();
    let o = interrupt_when_written(
        spawn(&["run", &cfg, "--out", cut_s]),
        &cut.join("rounds.jsonl"),
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(130), "{t}");
    let done = lines(&cut.join("rounds.jsonl"));
    assert!((1..12).contains(&done), "stopped after round {done}: {t}");
    assert!(
        t.contains(&format!(
            "interrupted after round {done} — fedweave resume {cut_s} continues"
        )),
        "{t}"
    );
    assert!(!t.contains("panicked"), "{t}");
    assert!(!cut.join("summary.json").exists());
    assert!(cut.join("checkpoint/state.safetensors").is_file());

    // The unfinished run has a report (from rounds.jsonl alone).
    let o = fedweave(&["report", cut_s]);
    assert!(o.status.success(), "{}", text(&o));
    let html = std::fs::read_to_string(cut.join("report.html")).unwrap();
    assert!(
        html.contains(&format!("{done} of 12 rounds done")),
        "report of an unfinished run"
    );

    // Resumed from the stop's own checkpoint (not round 0 or 5): only the
    // rounds after it run, and the numbers equal the uninterrupted run's.
    let o = fedweave(&["resume", cut_s]);
    assert!(o.status.success(), "{}", text(&o));
    let ran = text(&o).lines().filter(|l| l.starts_with("round ")).count();
    assert_eq!(ran, 12 - done, "{}", text(&o));
    assert_eq!(summary_numbers(&cut), summary_numbers(&whole));
    assert_eq!(rounds_without_time(&cut), rounds_without_time(&whole));

    // Wall time counts every session: at least the rounds' own seconds.
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cut.join("summary.json")).unwrap()).unwrap();
    let round_seconds: f64 = std::fs::read_to_string(cut.join("rounds.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["seconds"]
                .as_f64()
                .unwrap()
        })
        .sum();
    assert!(
        s["wall_seconds"].as_f64().unwrap() >= round_seconds,
        "wall {} < rounds {round_seconds}",
        s["wall_seconds"]
    );

    // Resuming a finished run says so and changes nothing.
    let before = std::fs::read(cut.join("summary.json")).unwrap();
    let o = fedweave(&["resume", cut_s]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("already finished (12 rounds)"),
        "{}",
        text(&o)
    );
    assert!(text(&o).contains("--rounds N"), "{}", text(&o));
    assert_eq!(std::fs::read(cut.join("summary.json")).unwrap(), before);
}

#[test]
fn run_refuses_an_existing_run_without_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny_config(tmp.path(), 2);
    let out = tmp.path().join("run");
    let out_s = out.to_str().unwrap();
    let o = fedweave(&["run", &cfg, "--out", out_s]);
    assert!(o.status.success(), "{}", text(&o));
    let before = std::fs::read(out.join("summary.json")).unwrap();

    let o = fedweave(&["run", &cfg, "--out", out_s, "--set", "seed=4"]);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(
        t.contains("already holds a run") && t.contains("--overwrite"),
        "{t}"
    );
    assert_eq!(std::fs::read(out.join("summary.json")).unwrap(), before);

    let o = fedweave(&[
        "run",
        &cfg,
        "--out",
        out_s,
        "--set",
        "seed=4",
        "--overwrite",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(s["seed"], 4);

    // A folder holding someone's config.toml is not overwritten either.
    let mine = tmp.path().join("mine");
    std::fs::create_dir(&mine).unwrap();
    std::fs::write(mine.join("config.toml"), "# my notes\nrounds = 2\n").unwrap();
    let o = fedweave(&["run", &cfg, "--out", mine.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("not a run's"), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(mine.join("config.toml")).unwrap(),
        "# my notes\nrounds = 2\n"
    );
}

#[test]
fn resume_refuses_a_directory_without_a_run() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("config.toml"), "rounds = 2\n").unwrap();
    let o = fedweave(&["resume", dir.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o).contains("is not a run directory"), "{}", text(&o));
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert_eq!(left.len(), 1, "nothing written");
    assert_eq!(
        std::fs::read_to_string(dir.join("config.toml")).unwrap(),
        "rounds = 2\n"
    );
}

#[test]
fn sigint_stops_a_sweep_and_a_rerun_finishes_it() {
    let tmp = tempfile::tempdir().unwrap();
    tiny_config(tmp.path(), 8);
    let g = tmp.path().join("grid.toml");
    std::fs::write(
        &g,
        "base = \"cfg.toml\"\nseeds = [1, 2]\n[grid]\n\"algorithm.name\" = [\"fedavg\", \"pfedgraph\"]\n",
    )
    .unwrap();
    let g = g.display().to_string();
    let out = tmp.path().join("out");
    let out_s = out.to_str().unwrap();
    let first = out.join("algorithm=fedavg__seed=1").join("rounds.jsonl");
    let o = interrupt_when_written(spawn(&["sweep", &g, "--out", out_s]), &first);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(130), "{t}");
    assert!(t.contains("sweep interrupted"), "{t}");
    assert!(
        t.contains("1 stopped at a checkpoint, 3 not started"),
        "{t}"
    );
    assert!(
        out.join("algorithm=fedavg__seed=1/checkpoint/state.safetensors")
            .is_file()
    );

    let o = fedweave(&["sweep", &g, "--out", out_s]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("4 runs: 4 run now"), "{}", text(&o));
    let whole = tmp.path().join("whole");
    let o = fedweave(&["sweep", &g, "--out", whole.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    for run in ["algorithm=fedavg__seed=1", "algorithm=pfedgraph__seed=2"] {
        assert_eq!(
            summary_numbers(&out.join(run)),
            summary_numbers(&whole.join(run))
        );
    }
}

#[test]
fn a_second_sigint_quits_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("slow.toml");
    // Rounds of a few seconds: the second Ctrl-C must not wait for one.
    std::fs::write(
        &cfg,
        "seed = 1\nclients = 4\nrounds = 3\nthreads = 1\n[data]\ndataset = \"digits\"\n\
         [partition]\nkind = \"iid\"\n[model]\nkind = \"mlp\"\n[train]\nlocal_iterations = 1500\n",
    )
    .unwrap();
    let out = tmp.path().join("run");
    let child = spawn(&["run", cfg.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let first_round = Instant::now();
    let rounds = out.join("rounds.jsonl");
    while lines(&rounds) < 1 && first_round.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let round_took = first_round.elapsed();
    // Well inside round 2 (round 1 ending is a safe point of its own).
    std::thread::sleep(Duration::from_millis(500));
    let pid = child.id().to_string();
    let sent = Instant::now();
    for _ in 0..2 {
        assert!(
            Command::new("kill")
                .args(["-INT", &pid])
                .status()
                .unwrap()
                .success()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = child.wait_with_output().unwrap();
    let waited = sent.elapsed();
    assert_eq!(o.status.code(), Some(130));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        !e.contains("interrupted after round"),
        "quit without finishing the round: {e}"
    );
    assert!(
        waited < round_took / 2 + Duration::from_millis(300),
        "quit at once: {waited:?} (a round takes {round_took:?})"
    );
    // The last checkpoint (round 1) still resumes.
    assert!(out.join("checkpoint/state.safetensors").is_file());
}

#[test]
fn wall_time_adds_up_when_a_finished_run_is_extended() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tiny_config(tmp.path(), 2);
    let out = tmp.path().join("run");
    let out_s = out.to_str().unwrap();
    let o = fedweave(&["run", &cfg, "--out", out_s]);
    assert!(o.status.success(), "{}", text(&o));
    let wall = |dir: &Path| -> f64 {
        let s: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap())
                .unwrap();
        s["wall_seconds"].as_f64().unwrap()
    };
    let first = wall(&out);
    let o = fedweave(&["resume", out_s, "--rounds", "4"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(lines(&out.join("rounds.jsonl")), 4);
    let round_seconds: f64 = std::fs::read_to_string(out.join("rounds.jsonl"))
        .unwrap()
        .lines()
        .skip(2)
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["seconds"]
                .as_f64()
                .unwrap()
        })
        .sum();
    // The first session's time up to its last checkpoint (its summary
    // also counts writing the report) plus the new rounds.
    assert!(
        wall(&out) >= first - 0.1 + round_seconds,
        "{} < {first} - 0.1 + {round_seconds}",
        wall(&out)
    );
}
