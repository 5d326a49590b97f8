//! Checkpoints and resume: for every algorithm, a run stopped after round k
//! (cleanly, or by a crash in the middle of round k + 1) and resumed gives
//! bit-identical summaries, round records and graphs to an uninterrupted
//! run; a corrupt or foreign checkpoint is a clear error.

use fedweave_sim::{ExperimentConfig, RunError, Summary, resume_experiment, run_experiment};
use std::path::Path;

const BASE: &str = "seed = 9\nclients = 6\nrounds = 4\nparticipation = 0.75\nthreads = 2\n[data]\ndataset = \"digits\"\n[partition]\nkind = \"dirichlet\"\nbeta = 0.5\n[model]\nkind = \"mlp\"\n[train]\nlocal_iterations = 4\nbatch_size = 16\nlr = 0.05\n";

fn config(name: &str, rounds: usize) -> ExperimentConfig {
    let mut overrides = vec![format!("algorithm.name={name}"), format!("rounds={rounds}")];
    if name == "dpfl" {
        overrides.push("algorithm.init_epochs=1".into());
    }
    ExperimentConfig::from_toml_str(BASE, &overrides).unwrap()
}

/// The run's results without wall-clock fields: summary and round lines.
fn results(dir: &Path, summary: &Summary) -> (String, Vec<serde_json::Value>) {
    let mut s = summary.clone();
    s.wall_seconds = 0.0;
    s.seconds_per_round_median = 0.0;
    let rounds = std::fs::read_to_string(dir.join("rounds.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["seconds"] = 0.0.into();
            v
        })
        .collect();
    (serde_json::to_string(&s).unwrap(), rounds)
}

/// Every registered algorithm; `graph-rule` gets FedAvg's W and a state
/// that counts its rounds, so resume must carry the rule's state too.
fn algorithms() -> Vec<&'static str> {
    use fedweave_algos::graph_rule::{Rule, RuleInput, Weights, install};
    struct Counting;
    impl Rule for Counting {
        fn weights(&self, input: &RuleInput, state: &str) -> Result<(Weights, String), String> {
            let seen: serde_json::Value = serde_json::from_str(state).map_err(|e| e.to_string())?;
            let before = seen.get("rounds").and_then(|v| v.as_u64()).unwrap_or(0);
            if before + 1 != input.round as u64 {
                return Err(format!(
                    "round {} after {before} rounds of state",
                    input.round
                ));
            }
            let p = fedweave_algos::size_weights(input.sizes);
            let next = serde_json::json!({ "rounds": input.round }).to_string();
            Ok((Weights::Whole(vec![p; input.sizes.len()]), next))
        }
    }
    install(Some(std::sync::Arc::new(Counting)));
    fedweave_algos::catalogue().iter().map(|a| a.name).collect()
}

#[test]
fn resume_after_a_clean_stop_or_a_crash_equals_an_uninterrupted_run() {
    for name in algorithms() {
        let whole = tempfile::tempdir().unwrap();
        let want = run_experiment(&config(name, 4), whole.path(), &mut |_| {}).unwrap();
        let want = results(whole.path(), &want);

        // Stopped cleanly after round 2, then extended to 4.
        let stopped = tempfile::tempdir().unwrap();
        run_experiment(&config(name, 2), stopped.path(), &mut |_| {}).unwrap();
        let mut ran = Vec::new();
        let got = resume_experiment(stopped.path(), Some(4), &mut |r| ran.push(r.round)).unwrap();
        assert_eq!(
            ran,
            [3, 4],
            "{name}: resumed from the checkpoint, not from scratch"
        );
        assert_eq!(results(stopped.path(), &got), want, "{name}: clean stop");

        // Killed in round 3 after writing part of its line and part of a
        // new checkpoint: the torn line and the temporary file are ignored.
        let crashed = tempfile::tempdir().unwrap();
        let dir = crashed.path();
        run_experiment(&config(name, 2), dir, &mut |_| {}).unwrap();
        let rounds = std::fs::read_to_string(dir.join("rounds.jsonl")).unwrap();
        let last = rounds.lines().last().unwrap();
        std::fs::write(
            dir.join("rounds.jsonl"),
            format!("{rounds}{}", &last[..last.len() / 2]),
        )
        .unwrap();
        std::fs::write(dir.join("checkpoint/state.safetensors.tmp"), b"torn").unwrap();
        std::fs::remove_file(dir.join("summary.json")).unwrap();
        let mut cfg = std::fs::read_to_string(dir.join("config.toml")).unwrap();
        cfg = cfg.replace("rounds = 2", "rounds = 4");
        std::fs::write(dir.join("config.toml"), cfg).unwrap();
        let mut ran = Vec::new();
        let got = resume_experiment(dir, None, &mut |r| ran.push(r.round)).unwrap();
        assert_eq!(ran, [3, 4], "{name}: resumed from the checkpoint");
        assert_eq!(results(dir, &got), want, "{name}: crash");
    }
}

#[test]
fn a_run_without_checkpoint_resumes_from_the_start() {
    let whole = tempfile::tempdir().unwrap();
    let want = run_experiment(&config("pfedgraph", 3), whole.path(), &mut |_| {}).unwrap();
    let dir = tempfile::tempdir().unwrap();
    run_experiment(&config("pfedgraph", 3), dir.path(), &mut |_| {}).unwrap();
    // As a run stopped before its first checkpoint: no checkpoint, no
    // summary (a run with a summary is finished, and `resume` says so).
    std::fs::remove_dir_all(dir.path().join("checkpoint")).unwrap();
    std::fs::remove_file(dir.path().join("summary.json")).unwrap();
    let mut ran = Vec::new();
    let got = resume_experiment(dir.path(), None, &mut |r| ran.push(r.round)).unwrap();
    assert_eq!(ran, [1, 2, 3]);
    assert_eq!(
        results(dir.path(), &got),
        results(whole.path(), &want),
        "restarted from round 0"
    );
}

fn checkpoint_error(result: Result<Summary, RunError>) -> String {
    match result {
        Err(e @ RunError::Checkpoint { .. }) => e.to_string(),
        Err(e) => panic!("expected a checkpoint error, got {e}"),
        Ok(_) => panic!("expected a checkpoint error, got a run"),
    }
}

#[test]
fn corrupt_or_foreign_checkpoints_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    run_experiment(&config("fedaghn", 2), d, &mut |_| {}).unwrap();
    let ckpt = d.join("checkpoint/state.safetensors");
    let good = std::fs::read(&ckpt).unwrap();

    // Another configuration (the learning rate changed).
    let cfg = std::fs::read_to_string(d.join("config.toml")).unwrap();
    std::fs::write(d.join("config.toml"), cfg.replace("lr = 0.05", "lr = 0.01")).unwrap();
    let e = checkpoint_error(resume_experiment(d, Some(3), &mut |_| {}));
    assert!(
        e.contains("another configuration") && e.contains("lr"),
        "{e}"
    );
    std::fs::write(d.join("config.toml"), &cfg).unwrap();

    // Truncated file.
    std::fs::write(&ckpt, &good[..good.len() / 2]).unwrap();
    let e = checkpoint_error(resume_experiment(d, Some(3), &mut |_| {}));
    assert!(e.contains("not a valid checkpoint"), "{e}");

    // Not a checkpoint at all.
    std::fs::write(&ckpt, b"hello").unwrap();
    let e = checkpoint_error(resume_experiment(d, Some(3), &mut |_| {}));
    assert!(e.contains("state.safetensors"), "{e}");

    // Rounds missing from rounds.jsonl.
    std::fs::write(&ckpt, &good).unwrap();
    std::fs::write(d.join("rounds.jsonl"), "").unwrap();
    let e = checkpoint_error(resume_experiment(d, Some(3), &mut |_| {}));
    assert!(e.contains("rounds.jsonl"), "{e}");

    // Fewer rounds than already run.
    run_experiment(&config("fedaghn", 2), d, &mut |_| {}).unwrap();
    let e = checkpoint_error(resume_experiment(d, Some(1), &mut |_| {}));
    assert!(e.contains("already has 2 rounds"), "{e}");
}

/// `tensorboard = true`: the event file holds every round once, with the
/// figures of `rounds.jsonl`, also after a resume (the file is rewritten
/// from the kept records, not appended to twice).
#[test]
fn tensorboard_events_follow_rounds_jsonl_across_a_resume() {
    use fedweave_records::tensorboard::{EVENT_FILE, read_events, scalars};
    let with_tb = |rounds| {
        let mut c = config("pfedgraph", rounds);
        c.tensorboard = true;
        c
    };
    let dir = tempfile::tempdir().unwrap();
    run_experiment(&with_tb(2), dir.path(), &mut |_| {}).unwrap();
    resume_experiment(dir.path(), Some(4), &mut |_| {}).unwrap();
    let events = read_events(&dir.path().join(EVENT_FILE)).unwrap();
    let records: Vec<fedweave_records::RoundRecord> =
        std::fs::read_to_string(dir.path().join("rounds.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
    let steps: Vec<i64> = events[1..].iter().map(|e| e.step).collect();
    assert_eq!(steps, [1, 2, 3, 4]);
    for (e, r) in events[1..].iter().zip(&records) {
        let got: Vec<(String, f32)> = e
            .summary
            .as_ref()
            .unwrap()
            .value
            .iter()
            .map(|v| (v.tag.clone(), v.simple_value.unwrap()))
            .collect();
        let want: Vec<(String, f32)> = scalars(r)
            .into_iter()
            .map(|(t, v)| (t.to_string(), v as f32))
            .collect();
        assert_eq!(got, want, "round {}", r.round);
        assert!(want.iter().any(|(t, _)| t == "accuracy/test_mean"));
    }

    // A folder that cannot be made is a clear error naming the file.
    let blocked = tempfile::tempdir().unwrap();
    std::fs::write(blocked.path().join("tensorboard"), b"a file").unwrap();
    let e = run_experiment(&with_tb(1), blocked.path(), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("events.out.tfevents"), "{e}");
}
