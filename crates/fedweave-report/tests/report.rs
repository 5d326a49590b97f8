//! End-to-end tests: run directory → report.html.

mod fixture;

use std::fs;
use std::path::Path;

use fedweave_report::{ReportError, RunFiles, color, render_report, write_report};
use serde_json::json;

/// A record as the engine's schema reads it (missing fields take defaults).
fn typed<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn fixture_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fixture::write_fixture(dir.path(), 4, 3, &[2]);
    dir
}

fn render_dir(dir: &Path) -> String {
    let path = write_report(dir).unwrap();
    assert_eq!(path, dir.join("report.html"));
    fs::read_to_string(path).unwrap()
}

/// The `<div class="hm-frame" …>` holding round `round`'s heatmap.
fn frame<'a>(html: &'a str, round: &str) -> &'a str {
    let key = format!(r#"<div class="hm-frame" data-round="{round}""#);
    let start = html
        .find(&key)
        .unwrap_or_else(|| panic!("no frame for round {round}"));
    let end = start + html[start..].find("</svg>").unwrap();
    &html[start..end]
}

fn cell_fill(svg: &str, i: usize, j: usize) -> String {
    let key = format!(r#"data-r="{i}" data-c="{j}""#);
    let start = svg.find(&key).unwrap() + key.len();
    let tag = &svg[start..start + svg[start..].find('>').unwrap()];
    let f = tag.find(r#"fill=""#).unwrap() + 6;
    tag[f..f + 7].to_string()
}

#[test]
fn fixture_report_is_self_contained_and_complete() {
    let dir = fixture_dir();
    let html = render_dir(dir.path());

    // Self-contained: the only URL is the SVG namespace plotters writes.
    let stripped = html.replace(r#"xmlns="http://www.w3.org/2000/svg""#, "");
    assert!(!stripped.contains("http://"), "external http reference");
    assert!(!stripped.contains("https://"), "external https reference");
    assert!(!html.contains("<script src"));
    assert!(!html.contains("<link"));
    assert!(!html.contains("@import"));
    assert!(!html.contains("url("));

    // Identity and headline numbers.
    for needle in [
        "pfedgraph",
        "digits",
        "pathological k=2",
        "sign_flip r=0.25",
        "91.25%",
        "90.50%",
        "91.80%",
        "± 3.21 pp",
        "11.8 MiB",
        "22.4 MiB",
        "1m 23s",
    ] {
        assert!(html.contains(needle), "missing {needle:?}");
    }

    // One heatmap per pre-rendered round; only the last visible.
    assert_eq!(html.matches(r#"class="hm-frame""#).count(), 3);
    assert!(html.contains(r#"<div class="hm-frame" data-round="1" hidden>"#));
    assert!(html.contains(r#"<div class="hm-frame" data-round="3"><svg"#));
    assert!(html.contains(r#"type="range" id="hm-slider" min="0" max="2" value="2""#));

    // Heatmap cells: (2,2) = 1.0 darkest, (0,2) = 0.0 white, (0,0) in between;
    // (0,1) ≠ (1,0)-style transposition checked via the round-1 graph values.
    let last = frame(&html, "3");
    assert_eq!(cell_fill(last, 2, 2), color::scale(1.0).hex());
    assert_eq!(cell_fill(last, 0, 2), color::scale(0.0).hex());
    assert_ne!(cell_fill(last, 2, 2), cell_fill(last, 0, 2));
    assert_eq!(cell_fill(last, 0, 0), color::scale(0.6).hex());
    let first = frame(&html, "1");
    assert_eq!(cell_fill(first, 1, 1), color::scale(0.4).hex());
    assert!(
        last.contains(">1.00</text>"),
        "cell values printed for N ≤ 12"
    );
    assert!(last.contains("client j (source)") && last.contains("client i (recipient)"));

    // Malicious client 2 is marked in the heatmap, the header, the bars and the table.
    assert!(
        last.contains(r##"class="tick malicious" fill="#dc2626" font-weight="bold">2</text>"##)
    );
    assert!(last.contains(r#"class="mark""#));
    assert!(html.contains("malicious <b>2</b>"));
    assert!(html.contains("malicious (excluded, no value)"));
    assert!(html.contains(r#"<tr class="mal"><td>2<span class="tag">malicious</span>"#));

    // Per-layer small multiples, graph metrics, partition, protocol, config.
    assert_eq!(html.matches(r#"<figure class="layer">"#).count(), 2);
    assert!(html.contains("Graph structure over rounds"));
    assert!(html.contains("Training labels per client"));
    assert!(html.contains("1440 train / 180 val / 360 test"));
    assert!(html.contains("best-validation model is tested once"));
    assert!(html.contains("classes_per_client = 2"));
}

#[test]
fn colour_scale_is_monotone_with_fixed_endpoints() {
    assert_eq!(color::scale(0.0).hex(), "#ffffff");
    assert_eq!(color::scale(1.0).hex(), "#08306b");
    assert_ne!(color::scale(1.0), color::scale(0.0));
    let mut prev = f64::INFINITY;
    for k in 0..=100 {
        let l = color::scale(k as f64 / 100.0).luminance();
        assert!(l <= prev);
        prev = l;
    }
    assert!(color::scale(0.5).luminance() < color::scale(0.0).luminance());
}

#[test]
fn missing_summary_is_an_error_naming_the_file() {
    let dir = fixture_dir();
    fs::remove_file(dir.path().join("summary.json")).unwrap();
    // With its rounds, a run without a summary is an unfinished one.
    let rounds = fs::read_to_string(dir.path().join("rounds.jsonl")).unwrap();
    let done = rounds.lines().filter(|l| !l.trim().is_empty()).count();
    let page = write_report(dir.path()).unwrap();
    let html = fs::read_to_string(&page).unwrap();
    assert!(html.contains("Unfinished run"), "banner");
    assert!(html.contains(&format!("<b>Unfinished run:</b> {done} of ")));
    fs::remove_file(page).unwrap();
    // Without them it is no run.
    fs::remove_file(dir.path().join("rounds.jsonl")).unwrap();
    let err = write_report(dir.path()).unwrap_err();
    assert!(matches!(err, ReportError::Io { ref path, .. } if path.ends_with("summary.json")));
    assert!(err.to_string().contains("summary.json"), "{err}");
    assert!(!dir.path().join("report.html").exists());
}

#[test]
fn malformed_rounds_line_is_an_error_naming_file_and_line() {
    let dir = fixture_dir();
    let path = dir.path().join("rounds.jsonl");
    let text = fs::read_to_string(&path).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[1] = r#"{"round": 2, "mean_val_acc": 0.5,"#;
    fs::write(&path, lines.join("\n")).unwrap();
    let err = write_report(dir.path()).unwrap_err();
    assert!(
        matches!(err, ReportError::JsonLine { line: 2, .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("rounds.jsonl") && msg.contains("line 2"),
        "{msg}"
    );
}

#[test]
fn other_bad_inputs_are_errors_not_panics() {
    // Summary that is not an object.
    let dir = fixture_dir();
    fs::write(dir.path().join("summary.json"), "[1, 2]").unwrap();
    let msg = write_report(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("summary.json"), "{msg}");

    // Invalid JSON in partition.json.
    let dir = fixture_dir();
    fs::write(dir.path().join("partition.json"), "{").unwrap();
    let msg = write_report(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("partition.json"), "{msg}");

    // A ragged graph in round 2.
    let mut files = RunFiles::read(fixture_dir().path()).unwrap();
    files.rounds[1].graph = vec![vec![0.5, 0.5], vec![1.0]];
    let msg = render_report(&files).unwrap_err().to_string();
    assert!(
        msg.contains("rounds.jsonl") && msg.contains("round 2"),
        "{msg}"
    );

    // A round that is not an object.
    let dir = fixture_dir();
    fs::write(dir.path().join("rounds.jsonl"), "{\"round\": 1}\n\n42\n").unwrap();
    let msg = write_report(dir.path()).unwrap_err().to_string();
    assert!(
        msg.contains("rounds.jsonl") && msg.contains("line 3"),
        "{msg}"
    );

    // Missing config.toml.
    let dir = fixture_dir();
    fs::remove_file(dir.path().join("config.toml")).unwrap();
    let msg = write_report(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("config.toml"), "{msg}");
}

#[test]
fn config_and_summary_strings_are_escaped() {
    let dir = fixture_dir();
    let cfg = dir.path().join("config.toml");
    let mut text = fs::read_to_string(&cfg).unwrap();
    text.push_str("note = \"<script>alert('x')</script> & <b>\"\n");
    fs::write(&cfg, text).unwrap();
    let sp = dir.path().join("summary.json");
    let mut summary: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&sp).unwrap()).unwrap();
    summary["algorithm"] = json!("<img src=x onerror=alert(1)>");
    fs::write(&sp, summary.to_string()).unwrap();

    let html = render_dir(dir.path());
    assert!(html.contains(
        "note = &quot;&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &lt;b&gt;&quot;"
    ));
    assert!(!html.contains("<script>alert"));
    assert!(!html.contains("<img"));
    assert!(html.contains("&lt;img src=x onerror=alert(1)&gt;"));
    // Exactly one script element: the slider's.
    assert_eq!(html.matches("<script").count(), 1);
}

#[test]
fn minimal_run_without_optional_fields_renders() {
    let files = RunFiles {
        config_toml: String::new(),
        summary: typed(json!({ "algorithm": "local", "mean_test_acc": null })),
        rounds: vec![
            typed(json!({ "round": 1 })),
            typed(json!({ "round": 2, "mean_val_acc": 0.5 })),
        ],
        partition: None,
        unfinished: None,
    };
    let html = render_report(&files).unwrap();
    assert!(html.contains("no collaboration graph"));
    assert!(html.contains("No partition.json"));
    assert!(html.contains("—"));

    let empty = RunFiles {
        config_toml: String::new(),
        summary: typed(json!({})),
        rounds: Vec::new(),
        partition: Some(json!({ "clients": [] })),
        unfinished: None,
    };
    assert!(render_report(&empty).is_ok());
}

#[test]
fn final_graph_is_used_when_rounds_have_none() {
    let files = RunFiles {
        config_toml: String::new(),
        summary: typed(
            json!({ "clients": 2, "final_graph": [[0.9, 0.1], [0.3, 0.7]], "malicious": [] }),
        ),
        rounds: vec![typed(json!({ "round": 1, "mean_val_acc": 0.5 }))],
        partition: None,
        unfinished: None,
    };
    let html = render_report(&files).unwrap();
    assert_eq!(html.matches(r#"class="hm-frame""#).count(), 1);
    let f = frame(&html, "final");
    // vmax = 0.9, so (0,1) = 0.1 maps to 0.1/0.9.
    assert_eq!(cell_fill(f, 0, 0), color::scale(1.0).hex());
    assert_eq!(cell_fill(f, 0, 1), color::scale(0.1 / 0.9).hex());
    assert_eq!(cell_fill(f, 1, 0), color::scale(0.3 / 0.9).hex());
    assert!(!html.contains(r#"id="hm-slider""#));
}

#[test]
fn forecasting_runs_show_errors_instead_of_accuracy() {
    let dir = fixture_dir();
    let sp = dir.path().join("summary.json");
    let mut s: serde_json::Value = serde_json::from_str(&fs::read_to_string(&sp).unwrap()).unwrap();
    s["mean_test_acc"] = json!(null);
    s["mean_test_mae"] = json!(1.2345);
    s["mean_test_rmse"] = json!(2.5);
    s["mean_test_mape"] = json!(12.75);
    s["per_client_test_mae"] = json!([1.0, 1.5, null, 1.2]);
    s.as_object_mut().unwrap().remove("per_client_test_acc");
    fs::write(&sp, s.to_string()).unwrap();
    let html = render_dir(dir.path());
    assert!(html.contains("Mean test MAE") && html.contains("1.234"));
    assert!(html.contains("Mean test RMSE") && html.contains("2.500"));
    assert!(html.contains("Mean test MAPE") && html.contains("12.750"));
    assert!(html.contains("Per-client test MAE"));
    assert!(!html.contains("Mean test accuracy"));
}

#[test]
fn many_clients_and_rounds_stay_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let n = 150;
    fixture::write_fixture(dir.path(), n, 100, &[3, 77]);
    let html = render_dir(dir.path());
    let frames = html.matches(r#"class="hm-frame""#).count();
    assert!((2..=30).contains(&frames), "{frames} frames");
    assert!(html.contains(r#"data-round="1" hidden"#));
    assert!(html.contains(r#"<div class="hm-frame" data-round="100"><svg"#));
    // No per-cell rects or in-cell numbers at this size; sparse ticks only.
    let last = frame(&html, "100");
    assert!(!last.contains("data-r="));
    assert!(!last.contains("dominant-baseline=\"central\" font-size"));
    assert!(last.matches(r#"class="tick"#).count() <= 40);
    assert!(html.len() < 15_000_000, "page is {} bytes", html.len());
}

#[test]
fn forecasting_figures_carry_units() {
    let files = RunFiles {
        config_toml: "[data]\ndataset = \"us-weather\"\n".into(),
        summary: typed(json!({
            "dataset": "us-weather", "clients": 2, "mean_test_acc": null,
            "mean_test_mae": 1.5, "mean_test_rmse": 2.25, "mean_test_mape": 12.5,
            "per_client_test_mae": [1.0, 2.0]
        })),
        rounds: vec![typed(
            json!({ "round": 1, "mean_val_mae": 1.7, "mean_test_mae": 1.6 }),
        )],
        partition: None,
        unfinished: None,
    };
    let html = render_report(&files).unwrap();
    assert!(html.contains("1.500 °C"), "MAE in °C");
    assert!(html.contains("2.250 °C"), "RMSE in °C");
    assert!(html.contains("12.500 %"), "MAPE in %");
    assert!(html.contains("MAE (°C)"), "axis label with its unit");
    // A dataset of unknown unit gets none.
    let mut other = files.clone();
    other.summary.dataset = "csv".into();
    let html = render_report(&other).unwrap();
    assert!(!html.contains("°C"));
    assert!(html.contains("12.500 %"));
}

#[test]
fn the_config_shown_leaves_out_what_does_not_apply() {
    let config = "seed = 1\n\n[data]\ndataset = \"digits\"\ninput_steps = 12\nhorizon = 3\nseq_len = 256\n\n\
                  [data.synthetic]\ndim = 60\n\n[partition]\nkind = \"iid\"\n\n[attack]\nkind = \"none\"\nratio = 0.0\n\n\
                  [aggregator]\nkind = \"mean\"\ntrim = 0.1\n\n[eval]\nwhen = \"algorithm\"\n";
    let files = RunFiles {
        config_toml: config.into(),
        summary: typed(json!({ "dataset": "digits", "clients": 1, "mean_test_acc": 0.5 })),
        rounds: vec![typed(json!({ "round": 1, "mean_val_acc": 0.5 }))],
        partition: None,
        unfinished: None,
    };
    let html = render_report(&files).unwrap();
    let shown = html
        .split("<pre><code>")
        .nth(1)
        .unwrap()
        .split("</code>")
        .next()
        .unwrap();
    for gone in [
        "input_steps",
        "seq_len",
        "[data.synthetic]",
        "[attack]",
        "[aggregator]",
        "trim",
    ] {
        assert!(!shown.contains(gone), "{gone} shown:\n{shown}");
    }
    for kept in [
        "seed = 1",
        "dataset = &quot;digits&quot;",
        "[partition]",
        "[eval]",
    ] {
        assert!(shown.contains(kept), "{kept} missing:\n{shown}");
    }
    assert!(!shown.contains("\n\n\n"));
    // An attack that ran is shown.
    let mut attacked = files.clone();
    attacked.config_toml = config.replace("kind = \"none\"", "kind = \"sign_flip\"");
    let html = render_report(&attacked).unwrap();
    assert!(html.contains("[attack]\nkind = &quot;sign_flip&quot;"));
}
