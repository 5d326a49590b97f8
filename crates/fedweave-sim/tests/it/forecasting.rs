//! Forecasting end to end on the bundled `us-weather` sensor graph: 144
//! weather stations, one client each, GRU on the last 12 days → next 3.
//! SFL propagates along the dataset's own station graph, and the errors are
//! reported in °C under the best-validation protocol.

use crate::common;
use fedweave_data::{DataConfig, load_dataset};

use fedweave_sim::{ExperimentConfig, Summary, run_experiment};

fn run(overrides: &[&str]) -> (Summary, Vec<serde_json::Value>) {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/us_weather_sfl.toml"
    ))
    .unwrap();
    let r = common::run_config(&text, overrides);
    (r.summary, r.rounds)
}

#[test]
fn sfl_propagates_along_the_station_graph_and_reports_errors_in_celsius() {
    let (s, rounds) = run(&["rounds=2", "algorithm.hops=1", "train.local_epochs=3"]);
    // Â = rownorm(A + I) of the dataset's own station graph.
    let ds = load_dataset(
        &DataConfig {
            dataset: "us-weather".into(),
            ..DataConfig::default()
        },
        1,
    )
    .unwrap();
    let a = ds.relation_graph.unwrap();
    let g: Vec<Vec<f64>> = serde_json::from_value(rounds[1]["graph"].clone()).unwrap();
    for i in [0, 57, 143] {
        let total: f64 = 1.0
            + a.row(i)
                .filter(|&(j, _)| j != i)
                .map(|(_, w)| w)
                .sum::<f64>();
        assert!((g[i][i] - 1.0 / total).abs() < 1e-12);
        for (j, w) in a.row(i).filter(|&(j, _)| j != i) {
            assert!((g[i][j] - w / total).abs() < 1e-12, "Â[{i}][{j}]");
        }
        let support = g[i].iter().filter(|&&w| w > 0.0).count();
        assert_eq!(support, 1 + a.row(i).filter(|&(j, _)| j != i).count());
    }
    // Forecasting outputs: no accuracy, errors in °C for every station.
    assert!(s.mean_test_acc.is_none());
    let mae = s.mean_test_mae.unwrap();
    let rmse = s.mean_test_rmse.unwrap();
    assert!(rmse >= mae && s.mean_test_mape.unwrap() > 0.0);
    assert_eq!(s.per_client_test_mae.as_ref().unwrap().len(), 144);
    assert!(rounds[0]["mean_val_mae"].as_f64().is_some());
    assert!(rounds[0]["mean_test_acc"].is_null());
    // Predicting each station's training mean scores 7.53 °C on these test
    // windows (and persistence 3.55 °C): two rounds of GRU training are
    // already far from the mean predictor.
    assert!(mae < 5.0, "test MAE {mae:.3} °C");
}

#[test]
fn forecasting_rejects_label_partitions() {
    let text = "clients = 144\n[data]\ndataset = \"us-weather\"\n[partition]\nkind = \"iid\"\n[model]\nkind = \"gru\"\n";
    let cfg = ExperimentConfig::from_toml_str(text, &[]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let err = run_experiment(&cfg, dir.path(), &mut |_| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("natural"), "{err}");
}
