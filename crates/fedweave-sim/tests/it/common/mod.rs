//! What every end-to-end test does: run a config with overrides in a
//! temporary directory and read back what it wrote.

use fedweave_sim::{ExperimentConfig, Summary, run_experiment};

/// A finished run: its summary, one JSON object per round, and its
/// `partition.json`.
pub struct Run {
    pub summary: Summary,
    pub rounds: Vec<serde_json::Value>,
    #[allow(dead_code)] // read by the tests that check label structure
    pub partition: serde_json::Value,
}

/// Runs `text` with `overrides` (`dotted.key=value`); every output file
/// must exist afterwards.
pub fn run_config(text: &str, overrides: &[&str]) -> Run {
    let o: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    let cfg = ExperimentConfig::from_toml_str(text, &o).expect("valid config");
    let dir = tempfile::tempdir().unwrap();
    let summary = run_experiment(&cfg, dir.path(), &mut |_| {}).expect("run succeeds");
    for f in [
        "config.toml",
        "summary.json",
        "partition.json",
        "report.html",
    ] {
        assert!(dir.path().join(f).exists(), "{f} written");
    }
    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap();
    Run {
        summary,
        rounds: read("rounds.jsonl")
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect(),
        partition: serde_json::from_str(&read("partition.json")).unwrap(),
    }
}

/// The round's collaboration graph.
#[allow(dead_code)] // not every test file reads graphs
pub fn graph(round: &serde_json::Value) -> Vec<Vec<f64>> {
    serde_json::from_value(round["graph"].clone()).unwrap()
}

/// A summary without its timings and thread count: what must be equal
/// between runs that differ only in how they were scheduled.
#[allow(dead_code)] // not every test file compares runs
pub fn untimed(s: &Summary) -> serde_json::Value {
    let mut v = serde_json::to_value(s).unwrap();
    let o = v.as_object_mut().unwrap();
    for k in ["wall_seconds", "seconds_per_round_median", "threads"] {
        o.remove(k);
    }
    v
}

/// Round records without their timings.
#[allow(dead_code)] // not every test file compares runs
pub fn untimed_rounds(rounds: &[serde_json::Value]) -> Vec<serde_json::Value> {
    let mut rounds = rounds.to_vec();
    for r in &mut rounds {
        r.as_object_mut().unwrap().remove("seconds");
    }
    rounds
}
