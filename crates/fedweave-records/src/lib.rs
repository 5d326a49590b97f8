//! What a run writes: one [`RoundRecord`] per line of `rounds.jsonl` and a
//! [`Summary`] in `summary.json`. The engine writes these types and the
//! report (and `resume`) read them back, so the files have one schema.

#![warn(missing_docs)]

pub mod tensorboard;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The evaluation protocol, printed with the results.
pub const PROTOCOL: &str = "Each round every benign client's personalised model (the algorithm says \
which: after local training, or after mixing) is scored on its own validation and test data; the \
test data follow the client's label distribution. Per client, the test accuracy at its best \
validation accuracy (strict improvement, earliest round wins ties) is kept; mean_test_acc is the \
mean of these over benign clients. Also reported: the last round's mean, the maximum over rounds \
of the per-round mean (FedDWA's convention), and the spread across clients.";

/// One line of `rounds.jsonl`.
/// Missing fields read as their defaults, so older or partial files still
/// load (the report shows what is there).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RoundRecord {
    /// Round number, from 1.
    pub round: usize,
    /// Mean validation accuracy over benign clients (null when forecasting).
    pub mean_val_acc: Option<f64>,
    /// Mean test accuracy over benign clients (null when forecasting).
    pub mean_test_acc: Option<f64>,
    /// Test accuracy over the round's benign participants, weighted by
    /// their test sizes (FedDWA's per-round figure under partial
    /// participation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub participant_test_acc: Option<f64>,
    /// `[eval] when = "before_and_after"`: mean validation accuracy of the
    /// models clients held before local training (pFedGraph's θ̃_i).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_val_acc_before: Option<f64>,
    /// `[eval] when = "before_and_after"`: their mean test accuracy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_test_acc_before: Option<f64>,
    /// Forecasting: mean validation MAE over benign clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_val_mae: Option<f64>,
    /// Forecasting: mean test MAE (in the target's unit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_test_mae: Option<f64>,
    /// Forecasting: mean test RMSE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_test_rmse: Option<f64>,
    /// Forecasting: mean test MAPE (%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_test_mape: Option<f64>,
    /// Mean local training loss over the participants.
    pub mean_train_loss: f64,
    /// Wall-clock seconds of the round.
    pub seconds: f64,
    /// Bytes uploaded this round, all clients.
    pub bytes_up: u64,
    /// Bytes downloaded this round, all clients.
    pub bytes_down: u64,
    /// Clients that took part.
    pub participants: Vec<usize>,
    /// Clients whose upload was rejected (non-finite or wrong size).
    pub rejected: Vec<usize>,
    /// Clients that did not answer in time (network runtime only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub absent: Vec<usize>,
    /// The round's graph (mean over layers for per-layer methods).
    #[serde(deserialize_with = "matrix")]
    pub graph: Vec<Vec<f64>>,
    /// Per-layer graphs, when the method has them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[serde(deserialize_with = "matrices")]
    pub graph_layers: BTreeMap<String, Vec<Vec<f64>>>,
    /// Share of absent off-diagonal edges.
    pub graph_sparsity: f64,
    /// Share of edges whose reverse also exists.
    pub graph_symmetry: f64,
    /// Peer-to-peer rounds: what the clients' own selections cost and gave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection: Option<SelectionStats>,
}

/// The round's collaborator selections (peer-to-peer methods).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SelectionStats {
    /// Reward evaluations over all clients (DPFL: validation passes).
    pub reward_evaluations: usize,
    /// Clients that ran a selection this round.
    pub selecting_clients: usize,
    /// Share of them whose chosen set scored at least as well as the client
    /// alone (DPFL's Remark 3 says: all of them).
    pub no_worse_share: f64,
    /// Mean reward of the chosen set minus the client alone.
    pub mean_reward_gain: f64,
    /// The largest loss of reward against the client alone (0 if none).
    pub worst_reward_gain: f64,
    /// Model transfers between peers.
    pub transfers: u64,
}

/// `summary.json`.
/// Missing fields read as their defaults, as for [`RoundRecord`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Summary {
    /// Algorithm name.
    pub algorithm: String,
    /// Dataset name.
    pub dataset: String,
    /// Partition, e.g. `pathological(classes_per_client=2)`.
    pub partition: String,
    /// Model architecture.
    pub model: String,
    /// Number of model parameters.
    pub model_parameters: usize,
    /// N.
    pub clients: usize,
    /// Rounds run.
    pub rounds: usize,
    /// Seed.
    pub seed: u64,
    /// Attack, e.g. `sign_flip r=0.4` or `none`.
    pub attack: String,
    /// Headline: mean over benign clients of the best-validation test accuracy.
    pub mean_test_acc: Option<f64>,
    /// Mean test accuracy of the last round's models.
    pub last_round_mean_test_acc: Option<f64>,
    /// Max over rounds of the per-round mean test accuracy.
    pub max_round_mean_test_acc: Option<f64>,
    /// Max over rounds of the test-size-weighted accuracy over each round's
    /// participants (FedDWA's protocol).
    pub max_round_participant_test_acc: Option<f64>,
    /// Mean test accuracy of the one round with the best mean validation
    /// accuracy (FedAGHN's protocol).
    pub best_round_mean_val_test_acc: Option<f64>,
    /// That round.
    pub best_round_mean_val_round: Option<usize>,
    /// The selection rule of `[eval] select`.
    pub selection_rule: String,
    /// The figure that rule selects (one of the above).
    pub selected_test_acc: Option<f64>,
    /// Std of the per-client best-validation test accuracy (benign clients).
    pub std_test_acc: Option<f64>,
    /// Lowest per-client figure.
    pub min_test_acc: Option<f64>,
    /// Mean of the lowest 10 % of clients (at least one).
    pub bottom10_test_acc: Option<f64>,
    /// Mean best-validation test accuracy of the best ⌈5 % · N⌉ benign
    /// clients (SFL's "best 5 %"); absent in summaries written before it.
    pub top5pct_test_acc: Option<f64>,
    /// Mean best-validation test accuracy of the worst ⌈5 % · N⌉ benign
    /// clients (SFL's "worst 5 %"); absent in summaries written before it.
    pub bottom5pct_test_acc: Option<f64>,
    /// Per client (null for malicious ones).
    pub per_client_test_acc: Vec<Option<f64>>,
    /// Round of each client's best validation score (null for malicious).
    pub per_client_best_round: Vec<Option<usize>>,
    /// Forecasting metrics (null for classification).
    pub mean_test_mae: Option<f64>,
    /// Forecasting metrics (null for classification).
    pub mean_test_rmse: Option<f64>,
    /// Forecasting metrics (null for classification).
    pub mean_test_mape: Option<f64>,
    /// Forecasting: mean test MAE of the last round's models.
    pub last_round_mean_test_mae: Option<f64>,
    /// Forecasting: per-client best-validation test MAE (null for
    /// malicious clients); absent for classification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_client_test_mae: Option<Vec<Option<f64>>>,
    /// Forecasting: mean MAE of the worst 10 % of clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst10_test_mae: Option<f64>,
    /// Malicious clients.
    pub malicious: Vec<usize>,
    /// The last round's graph.
    #[serde(deserialize_with = "matrix")]
    pub final_graph: Vec<Vec<f64>>,
    /// The last round's per-layer graphs, if any.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[serde(deserialize_with = "matrices")]
    pub final_graph_layers: BTreeMap<String, Vec<Vec<f64>>>,
    /// Total bytes uploaded.
    pub bytes_up: u64,
    /// Total bytes downloaded.
    pub bytes_down: u64,
    /// Wall-clock seconds of the whole run.
    pub wall_seconds: f64,
    /// Median seconds per round.
    pub seconds_per_round_median: f64,
    /// Worker threads used.
    pub threads: usize,
    /// The evaluation protocol.
    pub protocol: String,
}

/// The means of the best and of the worst ⌈`percent` % · n⌉ of `values`
/// (n = `values.len()`, higher is better; at least one value each), or
/// `None` for no values. The count is exact integer arithmetic: 20 values
/// at 5 % give one each, 21 give two. NaNs sort as the largest values.
pub fn top_bottom_means(values: &[f64], percent: usize) -> Option<(f64, f64)> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let k = (n * percent).div_ceil(100).clamp(1, n);
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    Some((mean(&sorted[n - k..]), mean(&sorted[..k])))
}

/// A matrix whose `null` entries (how JSON writes NaN) read back as NaN, and
/// a `null` matrix as an empty one.
fn matrix<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Vec<f64>>, D::Error> {
    let rows: Option<Vec<Vec<Option<f64>>>> = Deserialize::deserialize(d)?;
    Ok(rows
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.into_iter().map(|x| x.unwrap_or(f64::NAN)).collect())
        .collect())
}

/// [`matrix`] for each named layer.
fn matrices<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, Vec<Vec<f64>>>, D::Error> {
    #[derive(Deserialize)]
    struct M(#[serde(deserialize_with = "matrix")] Vec<Vec<f64>>);
    let named: Option<BTreeMap<String, M>> = Deserialize::deserialize(d)?;
    Ok(named
        .unwrap_or_default()
        .into_iter()
        .map(|(k, m)| (k, m.0))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_partial_files_load() {
        let r = RoundRecord {
            round: 3,
            mean_val_acc: Some(0.25),
            graph: vec![vec![0.5, f64::NAN], vec![0.0, 1.0]],
            ..Default::default()
        };
        let text = serde_json::to_string(&r).unwrap();
        assert!(text.contains("[0.5,null]"), "{text}");
        let back: RoundRecord = serde_json::from_str(&text).unwrap();
        assert!(back.graph[0][1].is_nan());
        assert_eq!(back.graph[1], r.graph[1]);
        assert_eq!(back.mean_val_acc, Some(0.25));
        let partial: Summary = serde_json::from_str(r#"{"algorithm":"local"}"#).unwrap();
        assert_eq!(partial.algorithm, "local");
        assert!(partial.final_graph.is_empty() && partial.mean_test_acc.is_none());
        assert!(serde_json::from_str::<Summary>("[1, 2]").is_err());
        // A summary from before the 5 % figures reads back without them.
        let old: Summary = serde_json::from_str(
            r#"{"algorithm":"sfl","mean_test_acc":0.5,"bottom10_test_acc":0.25}"#,
        )
        .unwrap();
        assert_eq!(old.mean_test_acc, Some(0.5));
        assert_eq!(
            (old.top5pct_test_acc, old.bottom5pct_test_acc),
            (None, None)
        );
    }

    /// 20 values: ⌈5 % · 20⌉ = 1 on each side (the largest and smallest);
    /// 21 values: ⌈1.05⌉ = 2; 3 values: one each; none: `None`.
    #[test]
    fn best_and_worst_shares_by_hand() {
        let twenty: Vec<f64> = (0..20).map(|k| f64::from((k * 7) % 20) / 20.0).collect();
        assert_eq!(top_bottom_means(&twenty, 5), Some((0.95, 0.0)));
        let mut more = twenty.clone();
        more.push(0.5);
        // Best two: 0.95, 0.9; worst two: 0.0, 0.05.
        let (top, bottom) = top_bottom_means(&more, 5).unwrap();
        assert!((top - 0.925).abs() < 1e-15 && (bottom - 0.025).abs() < 1e-15);
        assert_eq!(top_bottom_means(&[0.3, 0.9, 0.6], 5), Some((0.9, 0.3)));
        // 10 % of 20 = 2: (0.95 + 0.9)/2 and (0 + 0.05)/2.
        let (top, bottom) = top_bottom_means(&twenty, 10).unwrap();
        assert!((top - 0.925).abs() < 1e-15 && (bottom - 0.025).abs() < 1e-15);
        assert_eq!(top_bottom_means(&[], 5), None);
    }
}
