//! The evaluation protocol: every round each benign client's personalised
//! model (the algorithm says which, and when) is scored on its validation
//! and test data; per client the test figure at its best validation score
//! is kept. The summary reads these trackers and the round records.

use crate::ExperimentConfig;
use crate::config::SelectionRule;
use crate::setup::Setup;
use fedweave_algos::{Algorithm, ClientData, Env};
use fedweave_core::vecmath::{mean, std_dev};
use fedweave_nn::{EvalStats, LocalData};
use fedweave_records::{PROTOCOL, RoundRecord, Summary, top_bottom_means};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// What the test split says about one client's model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TestMetrics {
    /// Accuracy (classification).
    pub acc: f64,
    /// Mean absolute error (regression).
    pub mae: f64,
    /// Root mean squared error (regression).
    pub rmse: f64,
    /// Mean absolute percentage error (regression).
    pub mape: f64,
}

/// One client's evaluation: the validation figure the protocol selects on
/// (`val_score`, higher is better: accuracy, or −MAE for regression), the
/// validation figure reported, and the test metrics.
/// A client computes it on its own data and reports it; the server only
/// keeps the books.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Score {
    /// What best-validation selection compares (higher is better).
    pub val_score: f64,
    /// The validation figure the records report.
    pub val_reported: f64,
    /// The test metrics.
    pub test: TestMetrics,
}

/// Per-client best-validation bookkeeping.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub(crate) struct BestTracker {
    pub best_val: Option<f64>,
    pub test_at_best: TestMetrics,
    pub round: usize,
}

/// The protocol's memory across rounds (checkpointed).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Trackers {
    pub(crate) best: Vec<BestTracker>,
    pub(crate) last_test: Vec<TestMetrics>,
}

impl Trackers {
    /// Nothing scored yet, for `clients` clients.
    pub fn new(clients: usize) -> Self {
        Self {
            best: vec![BestTracker::default(); clients],
            last_test: vec![TestMetrics::default(); clients],
        }
    }

    /// Client `i`'s test metrics at its best validation, and that round.
    pub fn best(&self, i: usize) -> (TestMetrics, usize) {
        (self.best[i].test_at_best, self.best[i].round)
    }

    /// Records round `round`'s scores of the `benign` clients (strict
    /// improvement: the earliest round wins ties).
    pub(crate) fn update(&mut self, round: usize, benign: &[usize], scores: &[Score]) {
        for (&i, score) in benign.iter().zip(scores) {
            let b = &mut self.best[i];
            if b.best_val.is_none_or(|v| score.val_score > v) {
                *b = BestTracker {
                    best_val: Some(score.val_score),
                    test_at_best: score.test,
                    round,
                };
            }
            self.last_test[i] = score.test;
        }
    }
}

/// Scores every benign client's personalised model.
pub(crate) fn evaluate_clients<A: Algorithm>(
    algo: &A,
    setup: &Setup,
    clients: &[A::Client],
    pool: &rayon::ThreadPool,
) -> Vec<Score> {
    pool.install(|| {
        setup
            .benign
            .par_iter()
            .map(|&i| {
                let env = setup.env();
                score_client(
                    algo,
                    &env,
                    &clients[i],
                    &setup.client_data(i),
                    &setup.test_data(i),
                )
            })
            .collect()
    })
}

/// Scores one client's personalised model on its validation and test data:
/// what every runtime calls, wherever the client's data lives.
pub(crate) fn score_client<A: Algorithm>(
    algo: &A,
    env: &Env,
    state: &A::Client,
    data: &ClientData,
    test_data: &LocalData,
) -> Score {
    let [val, t]: [EvalStats; 2] = algo
        .evaluate(env, state, &data.train, &[&data.val, test_data])
        .try_into()
        .expect("`Algorithm::evaluate` returns one score per set");
    let test = TestMetrics {
        acc: t.accuracy(),
        mae: t.mae(),
        rmse: t.rmse(),
        mape: t.mape(),
    };
    if data.val.is_regression() {
        Score {
            val_score: -val.mae(),
            val_reported: val.mae(),
            test,
        }
    } else {
        Score {
            val_score: val.accuracy(),
            val_reported: val.accuracy(),
            test,
        }
    }
}

/// Fills the round record's mean metrics from the round's scores:
/// accuracies, or the regression errors.
pub(crate) fn fill_means(record: &mut RoundRecord, regression: bool, scores: &[Score]) {
    let mean_of = |f: fn(&Score) -> f64| Some(mean(&scores.iter().map(f).collect::<Vec<_>>()));
    if regression {
        record.mean_val_mae = mean_of(|s| s.val_reported);
        record.mean_test_mae = mean_of(|s| s.test.mae);
        record.mean_test_rmse = mean_of(|s| s.test.rmse);
        record.mean_test_mape = mean_of(|s| s.test.mape);
    } else {
        record.mean_val_acc = mean_of(|s| s.val_reported);
        record.mean_test_acc = mean_of(|s| s.test.acc);
    }
}

/// Test accuracy over the round's benign `participants`, weighted by their
/// test sizes (`scores` are in `scored` order); `None` when no benign
/// client took part.
pub(crate) fn participant_accuracy(
    facts: &Facts,
    scored: &[usize],
    participants: &[usize],
    scores: &[Score],
) -> Option<f64> {
    let (mut correct, mut total) = (0.0, 0usize);
    for (&i, score) in scored.iter().zip(scores) {
        if participants.binary_search(&i).is_ok() {
            let n = facts.test_sizes[i];
            correct += score.test.acc * n as f64;
            total += n;
        }
    }
    (total > 0).then(|| correct / total as f64)
}

/// The round whose mean validation accuracy is highest (the earliest on
/// ties) and its mean test accuracy.
fn best_round_by_mean_val(records: &[RoundRecord]) -> Option<(usize, f64)> {
    let mut best: Option<(f64, usize, f64)> = None;
    for r in records {
        if let (Some(val), Some(test)) = (r.mean_val_acc, r.mean_test_acc)
            && best.is_none_or(|(v, _, _)| val > v)
        {
            best = Some((val, r.round, test));
        }
    }
    best.map(|(_, round, test)| (round, test))
}

/// What the books need to know about a federation besides the config: a
/// simulation reads it off its data, a network server learns it from the
/// clients' hellos.
#[derive(Clone, Debug)]
pub struct Facts {
    /// The resolved configuration.
    pub cfg: ExperimentConfig,
    /// The dataset's name.
    pub dataset: String,
    /// Trainable parameters of the model.
    pub model_parameters: usize,
    /// Malicious clients (sorted).
    pub malicious: Vec<usize>,
    /// Benign clients (sorted): those scored.
    pub benign: Vec<usize>,
    /// Each client's test-set size (participant accuracy weights).
    pub test_sizes: Vec<usize>,
    /// Regression or forecasting: errors instead of accuracy.
    pub regression: bool,
    /// Worker threads reported in the summary.
    pub threads: usize,
}

/// `summary.json` from the trackers and every round's record.
pub(crate) fn summarize(
    facts: &Facts,
    algorithm: &str,
    trackers: &Trackers,
    records: &[RoundRecord],
    wall_seconds: f64,
) -> Summary {
    let cfg = &facts.cfg;
    let regression = facts.regression;
    let benign = &facts.benign;
    let best = &trackers.best;
    // The headline per client: accuracy, or MAE for regression.
    let headline = |m: &TestMetrics| if regression { m.mae } else { m.acc };
    let is_malicious = |i: usize| facts.malicious.binary_search(&i).is_ok();
    let per_client: Vec<Option<f64>> = (0..cfg.clients)
        .map(|i| (!is_malicious(i)).then_some(headline(&best[i].test_at_best)))
        .collect();
    let benign_best: Vec<f64> = benign
        .iter()
        .map(|&i| headline(&best[i].test_at_best))
        .collect();
    let benign_mean = |f: fn(&TestMetrics) -> f64| {
        mean(
            &benign
                .iter()
                .map(|&i| f(&best[i].test_at_best))
                .collect::<Vec<_>>(),
        )
    };
    let last_mean = mean(
        &benign
            .iter()
            .map(|&i| headline(&trackers.last_test[i]))
            .collect::<Vec<_>>(),
    );
    let mut sorted = benign_best.clone();
    // Worst first: lowest accuracy, or highest error.
    sorted.sort_by(|a, b| {
        if regression {
            b.total_cmp(a)
        } else {
            a.total_cmp(b)
        }
    });
    let bottom = (sorted.len() / 10).max(1).min(sorted.len());
    let five = top_bottom_means(&benign_best, 5).filter(|_| !regression);
    let mut secs: Vec<f64> = records.iter().map(|r| r.seconds).collect();
    secs.sort_by(f64::total_cmp);
    let last = records.last();
    let c = !regression;
    let best_round = best_round_by_mean_val(records).filter(|_| c);
    let max_participant = records
        .iter()
        .filter_map(|r| r.participant_test_acc)
        .reduce(f64::max);
    let selected = match cfg.eval.select {
        SelectionRule::PerClientBestVal => c.then(|| mean(&benign_best)),
        SelectionRule::BestRoundMeanVal => best_round.map(|b| b.1),
        SelectionRule::MaxRoundMean => max_participant,
        SelectionRule::Last => c.then_some(last_mean),
    };
    let rule = toml::Value::try_from(cfg.eval.select)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    Summary {
        algorithm: algorithm.to_string(),
        dataset: facts.dataset.clone(),
        partition: cfg.partition.describe(),
        // The summary's spelling since its first version (`cnnbn`: the
        // old enum's name, lowercased), which records and goldens pin.
        model: cfg.model.kind.name().replace('-', ""),
        model_parameters: facts.model_parameters,
        clients: cfg.clients,
        rounds: records.len(),
        seed: cfg.seed,
        attack: cfg.attack.describe(),
        mean_test_acc: c.then(|| mean(&benign_best)),
        last_round_mean_test_acc: c.then_some(last_mean),
        max_round_mean_test_acc: records
            .iter()
            .filter_map(|r| r.mean_test_acc)
            .reduce(f64::max),
        max_round_participant_test_acc: max_participant,
        best_round_mean_val_test_acc: best_round.map(|b| b.1),
        best_round_mean_val_round: best_round.map(|b| b.0),
        selection_rule: rule,
        selected_test_acc: selected,
        std_test_acc: c.then(|| std_dev(&benign_best)),
        min_test_acc: sorted.first().copied().filter(|_| c),
        bottom10_test_acc: (!sorted.is_empty() && c).then(|| mean(&sorted[..bottom])),
        top5pct_test_acc: five.map(|f| f.0),
        bottom5pct_test_acc: five.map(|f| f.1),
        per_client_test_acc: if regression {
            vec![None; cfg.clients]
        } else {
            per_client.clone()
        },
        last_round_mean_test_mae: regression.then_some(last_mean),
        per_client_test_mae: regression.then_some(per_client),
        worst10_test_mae: (!sorted.is_empty() && regression).then(|| mean(&sorted[..bottom])),
        per_client_best_round: (0..cfg.clients)
            .map(|i| (!is_malicious(i)).then_some(best[i].round))
            .collect(),
        mean_test_mae: regression.then(|| benign_mean(|m| m.mae)),
        mean_test_rmse: regression.then(|| benign_mean(|m| m.rmse)),
        mean_test_mape: regression.then(|| benign_mean(|m| m.mape)),
        malicious: facts.malicious.clone(),
        final_graph: last.map(|r| r.graph.clone()).unwrap_or_default(),
        final_graph_layers: last.map(|r| r.graph_layers.clone()).unwrap_or_default(),
        bytes_up: records.iter().map(|r| r.bytes_up).sum(),
        bytes_down: records.iter().map(|r| r.bytes_down).sum(),
        wall_seconds,
        seconds_per_round_median: secs.get(secs.len() / 2).copied().unwrap_or(0.0),
        threads: facts.threads,
        protocol: PROTOCOL.to_string(),
    }
}
