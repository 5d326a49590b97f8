//! `fedweave bench`: the JSON Lines scripts read, and its refusals.

use crate::{fedweave, text};

#[test]
fn bench_json_has_one_object_per_measurement_with_the_contract_keys() {
    let o = fedweave(&[
        "bench",
        "--model",
        "mlp",
        "--k",
        "1",
        "--k",
        "3",
        "--batch",
        "16",
        "--threads",
        "1",
        "--seconds",
        "0.05",
        "--server",
        "4",
        "--json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is one JSON object"))
        .collect();
    // K = 1 one-by-one; K = 3 one-by-one and batched; four server steps.
    let modes: Vec<(&str, u64)> = rows
        .iter()
        .map(|r| (r["mode"].as_str().unwrap(), r["k"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        modes,
        [
            ("one-by-one", 1),
            ("one-by-one", 3),
            ("batched", 3),
            ("fedavg", 4),
            ("pfedgraph", 4),
            ("feddwa", 4),
            ("fedaghn", 4)
        ]
    );
    for r in &rows {
        assert_eq!(r["model"], "mlp");
        assert!(r["threads"].as_u64().unwrap() >= 1);
        let rate = r["steps_per_s"].as_f64().unwrap();
        assert!(rate.is_finite() && rate > 0.0, "{r}");
        // The rate is what was done over the time it took.
        let secs = r["seconds"].as_f64().unwrap();
        if r["measure"] == "train" {
            assert_eq!(r["batch"], 16);
            let samples = r["samples_per_s"].as_f64().unwrap();
            assert!((samples / rate - 16.0).abs() < 1e-9);
        } else {
            assert!(r["batch"].is_null());
            assert!((rate * secs - 1.0).abs() < 1e-9);
        }
        // mlp on 1×28×28 with 10 classes: 784·200+200 + 200·200+200 + 200·10+10.
        assert_eq!(r["d"], 199_210);
    }
    assert_eq!(rows[3]["vs_fedavg"], 1.0);
}

#[test]
fn bench_mode_measures_one_way_of_training_k_clients() {
    for (mode, want) in [
        ("batched", [("one-by-one", 1), ("batched", 2)]),
        ("one-by-one", [("one-by-one", 1), ("one-by-one", 2)]),
    ] {
        let o = fedweave(&[
            "bench",
            "--model",
            "mlp",
            "--k",
            "1",
            "--k",
            "2",
            "--batch",
            "8",
            "--threads",
            "1",
            "--seconds",
            "0.02",
            "--mode",
            mode,
            "--json",
        ]);
        assert!(o.status.success(), "{}", text(&o));
        let got: Vec<(String, u64)> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(|l| {
                let r: serde_json::Value = serde_json::from_str(l).unwrap();
                (
                    r["mode"].as_str().unwrap().to_string(),
                    r["k"].as_u64().unwrap(),
                )
            })
            .collect();
        // K = 1 has only the one-by-one way, whatever the mode.
        let want: Vec<(String, u64)> = want.iter().map(|&(m, k)| (m.to_string(), k)).collect();
        assert_eq!(got, want, "--mode {mode}");
    }
}

#[test]
fn bench_refuses_what_it_cannot_measure() {
    for (args, says) in [
        (&["bench", "--model", "cnnbn"][..], "did you mean `cnn-bn`"),
        (&["bench", "--model", "gru"][..], "`gru` is not one"),
        (&["bench", "--batch", "0"][..], "--batch must be at least 1"),
        (&["bench", "--no-train"][..], "nothing to measure"),
        (&["bench", "--backend", "tpu"][..], "unknown backend `tpu`"),
        (
            &["bench", "--mode", "both-ways"][..],
            "invalid value 'both-ways'",
        ),
        (
            &["bench", "--seconds", "nan"][..],
            "--seconds must be a positive number",
        ),
    ] {
        let o = fedweave(args);
        assert!(!o.status.success(), "{args:?}");
        assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
    }
}

#[test]
fn batched_clients_on_the_cpu_warn_that_they_do_not_pay_there() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../examples/quickstart.toml"
            ),
            "--out",
            out.to_str().unwrap(),
            "--overwrite",
            "--set",
            "rounds=1",
        ];
        args.extend_from_slice(extra);
        fedweave(&args)
    };
    let o = run(&["--set", "device.batch_clients=4"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("slower than one client at a time on a CPU"),
        "{}",
        text(&o)
    );
    let o = run(&[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("slower than one client"), "{}", text(&o));
}
