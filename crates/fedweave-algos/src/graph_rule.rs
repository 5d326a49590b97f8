//! `graph-rule`: a server whose graph rule is supplied at run time — from
//! Python, `fedweave.run(config, graph_rule=fn)` — while fedweave trains the
//! clients, mixes, attacks, logs and checkpoints as for any method.
//!
//! Graph rule: the installed [`Rule`] receives the round's participants'
//! uploaded models (`[participants, d]`), their data sizes, the round and
//! its own state (JSON text, kept in the server state so checkpoints and
//! resume carry it) and returns W over the participants — one for the whole
//! model, or one per layer group of the model's layout (as FedAGHN's
//! per-layer graphs). Each W is checked — participants × participants,
//! finite, non-negative, rows summing to 1 (within 1e-6) — and used as
//! given, and each participant receives Σ_j W_ij θ_j (layer by layer for
//! per-layer W; absent clients keep their models, identity rows). The
//! round's graph of a per-layer W is the mean over layers, its layers are
//! the round's `graph_layers`. Local objective:
//! cross-entropy from the received model. `evaluate = "trained"` (default)
//! scores the model after local training, `"received"` the mixed model
//! (FedAvg's point: with W's rows all p, this is `fedavg` bit for bit).
//!
//! The rule is process-wide ([`install`]), as the stop flag is: whoever
//! drives a run (the Python package) installs it before and removes it
//! after. A rule that fails or returns a bad W stops the run with its
//! message and the round, before the round is committed.

use crate::Checked;
use crate::params::{Validate, params};
use crate::{
    AlgoError, Algorithm, ClientCx, Env, EvalPoint, Info, Model, RoundOutcome, Trained, ids_of,
    models_of,
};
use fedweave_core::CollaborationGraph;
use fedweave_core::pairwise::Kernels;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex};

/// What a rule sees in one round.
pub struct RuleInput<'a> {
    /// The round, from 1.
    pub round: usize,
    /// The participants, ascending.
    pub participants: &'a [usize],
    /// Their uploaded models, in the same order.
    pub models: &'a [&'a [f32]],
    /// Their training-set sizes.
    pub sizes: &'a [usize],
    /// The model's layer groups (name, element range): what a per-layer W
    /// has one matrix for, in this order (one group `all` over the whole
    /// vector for a layout without groups).
    pub layers: Vec<(String, std::ops::Range<usize>)>,
}

/// What a rule returns: W over the participants (row i: how participant i
/// mixes them).
#[derive(Clone, Debug, PartialEq)]
pub enum Weights {
    /// One W for the whole model.
    Whole(Vec<Vec<f64>>),
    /// One W per layer group of [`RuleInput::layers`], in its order.
    Layers(Vec<Vec<Vec<f64>>>),
}

/// A graph rule supplied at run time.
pub trait Rule: Send + Sync {
    /// W over the participants, and the rule's new state; `state` is its
    /// state after the previous round (`"{}"` before the first). `Err`
    /// stops the run with the message.
    fn weights(&self, input: &RuleInput, state: &str) -> Result<(Weights, String), String>;
}

/// FedAvg's rule: every row the participants' data-size weights p (the
/// reference a rule can be checked against, and what tests install).
pub struct SizeWeights;

impl Rule for SizeWeights {
    fn weights(&self, input: &RuleInput, state: &str) -> Result<(Weights, String), String> {
        let p = crate::contract::size_weights(input.sizes);
        Ok((
            Weights::Whole(vec![p; input.sizes.len()]),
            state.to_string(),
        ))
    }
}

/// The rule of a process that only trains clients (`fedweave client` and
/// `worker` of a networked `graph-rule` run): the rule runs where `serve`
/// runs, so this one is never asked and says so if it is.
pub struct TrainOnly;

impl Rule for TrainOnly {
    fn weights(&self, _: &RuleInput, _: &str) -> Result<(Weights, String), String> {
        Err("this process only trains clients: the graph rule runs where the server runs".into())
    }
}

static RULE: Mutex<Option<Arc<dyn Rule>>> = Mutex::new(None);

/// Installs `rule` unless a rule is installed already (a process that
/// hosts clients next to a server keeps the server's).
pub fn install_if_absent(rule: Arc<dyn Rule>) {
    RULE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get_or_insert(rule);
}

/// Makes `rule` the graph rule of `graph-rule` runs in this process
/// (`None` removes it).
pub fn install(rule: Option<Arc<dyn Rule>>) {
    *RULE.lock().unwrap_or_else(|e| e.into_inner()) = rule;
}

fn installed() -> Option<Arc<dyn Rule>> {
    RULE.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Which model the protocol scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Evaluate {
    /// After local training (personalised methods).
    Trained,
    /// The mixed model as received (FedAvg's point).
    Received,
}

params! {
    /// Parameters of `graph-rule`.
    pub struct GraphRuleParams {
        /// Which model is scored.
        pub evaluate: Evaluate = Evaluate::Trained,
    }
}

impl Validate for GraphRuleParams {}

/// The rule's state between rounds (checkpointed with the server).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RuleState {
    /// The rule's own state, JSON text.
    pub json: String,
}

impl Default for RuleState {
    fn default() -> Self {
        Self { json: "{}".into() }
    }
}

/// The `graph-rule` method.
pub struct GraphRule {
    rule: Arc<dyn Rule>,
    evaluate: Evaluate,
}

/// `Err` unless `w` is an `n` × `n` row-stochastic matrix.
pub fn check_weights(w: &[Vec<f64>], n: usize) -> Result<(), String> {
    if w.len() != n {
        return Err(format!("W has {} rows for {n} participants", w.len()));
    }
    for (i, row) in w.iter().enumerate() {
        if row.len() != n {
            return Err(format!(
                "row {i} of W has {} entries for {n} participants",
                row.len()
            ));
        }
        if let Some(j) = row.iter().position(|x| !x.is_finite() || *x < 0.0) {
            return Err(format!(
                "W[{i}][{j}] = {} (entries must be finite and ≥ 0)",
                row[j]
            ));
        }
        let sum: f64 = row.iter().sum();
        if (sum - 1.0).abs() > 1e-6 {
            return Err(format!("row {i} of W sums to {sum}, not 1"));
        }
    }
    Ok(())
}

/// `Err` unless `w` is one row-stochastic W over `n` participants, or one
/// per layer of `layers` (the message names the layer).
pub fn check(
    w: &Weights,
    layers: &[(String, std::ops::Range<usize>)],
    n: usize,
) -> Result<(), String> {
    match w {
        Weights::Whole(w) => check_weights(w, n),
        Weights::Layers(w) => {
            if w.len() != layers.len() {
                return Err(format!(
                    "per-layer W has {} layers, the model has {} ({})",
                    w.len(),
                    layers.len(),
                    layers
                        .iter()
                        .map(|(name, _)| name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            w.iter().zip(layers).try_for_each(|(w, (name, _))| {
                check_weights(w, n).map_err(|e| format!("layer {name}: {e}"))
            })
        }
    }
}

/// Σ_j W_ij θ_j for every row i of a checked `w` over `models` (one blocked
/// product, [`Kernels::mix`]), layer by layer on the element ranges of
/// `layers` for a per-layer W: the mixing of `graph-rule` and of the Python
/// binding's rule adapter (`fedweave.servers.mix`).
pub fn mix_weights(
    kernels: &Kernels,
    w: &Weights,
    layers: &[(String, std::ops::Range<usize>)],
    models: &[&[f32]],
) -> Vec<Vec<f32>> {
    match w {
        Weights::Whole(w) => kernels.mix(w, models).into_rows(),
        Weights::Layers(w) => {
            let layers: Vec<(std::ops::Range<usize>, &[Vec<f64>])> = w
                .iter()
                .zip(layers)
                .map(|(rows, (_, range))| (range.clone(), rows.as_slice()))
                .collect();
            kernels.mix_layers(&layers, models)
        }
    }
}

/// The graph over all `n` clients with the participants' rows as given
/// (checked stochastic) and identity rows elsewhere.
fn embed_exact(n: usize, participants: &[usize], rows: &[Vec<f64>]) -> CollaborationGraph {
    let mut graph = CollaborationGraph::identity(n);
    for (row, &i) in rows.iter().zip(participants) {
        let mut full = vec![0.0; n];
        for (x, &j) in row.iter().zip(participants) {
            full[j] = *x;
        }
        graph.put_row(i, &full);
    }
    graph
}

impl Algorithm for GraphRule {
    const NAMES: &'static [Info] = &[Info {
        name: "graph-rule",
        summary: "W from a rule supplied at run time (Python: fedweave.run(cfg, graph_rule=fn)), checked row-stochastic; participants receive Σ_j W_ij θ_j; cross-entropy from the received model",
        reference: "—",
    }];
    type Params = GraphRuleParams;
    type Client = Model;
    type Server = RuleState;
    type Down = Vec<f32>;
    type Up = Vec<f32>;

    fn new(
        name: &'static str,
        params: Checked<GraphRuleParams>,
        _: &Env,
    ) -> Result<Self, AlgoError> {
        let rule = installed().ok_or_else(|| AlgoError::Unsupported {
            algorithm: name.to_string(),
            message: "no graph rule is installed: graph-rule runs from Python, \
                      fedweave.run(config, graph_rule=fn)"
                .into(),
        })?;
        Ok(Self {
            rule,
            evaluate: params.evaluate,
        })
    }

    fn init_client(&self, env: &Env, _: usize) -> Model {
        env.initial_model()
    }

    fn local_round(&self, env: &Env, cx: &mut ClientCx, model: &mut Model) -> Trained<Vec<f32>> {
        let train_loss = cx.train_plain(env, model, &[]);
        Trained {
            up: model.params.clone(),
            train_loss,
        }
    }

    fn aggregate(
        &self,
        env: &Env,
        state: &mut RuleState,
        round: usize,
        uploads: &[(usize, Vec<f32>)],
    ) -> RoundOutcome<Vec<f32>> {
        let participants = ids_of(uploads);
        let models = models_of(uploads);
        let groups = crate::layer_groups(env);
        let input = RuleInput {
            round,
            participants: &participants,
            models: &models,
            sizes: &participants
                .iter()
                .map(|&i| env.sizes[i])
                .collect::<Vec<_>>(),
            layers: groups
                .iter()
                .map(|g| (g.name.clone(), g.range.clone()))
                .collect(),
        };
        let (w, json) = self
            .rule
            .weights(&input, &state.json)
            .and_then(|(w, json)| check(&w, &input.layers, participants.len()).map(|()| (w, json)))
            // The protocol has no error path out of a round: the run stops
            // here, before the round is committed, and the driver reports it.
            .unwrap_or_else(|e| panic!("graph_rule, round {round}: {e}"));
        state.json = json;
        // W as the rule gave it (checked within 1e-6 of stochastic rows), not
        // renormalised: FedAvg's p in numpy must give FedAvg's graph bits.
        let n = env.clients();
        let mixed = mix_weights(env.kernels, &w, &input.layers, &models);
        let downloads = participants.iter().copied().zip(mixed).collect();
        match w {
            Weights::Whole(w) => RoundOutcome::new(embed_exact(n, &participants, &w), downloads),
            Weights::Layers(w) => {
                let layers: Vec<(String, CollaborationGraph)> = groups
                    .iter()
                    .zip(&w)
                    .map(|(g, rows)| (g.name.clone(), embed_exact(n, &participants, rows)))
                    .collect();
                let graphs: Vec<CollaborationGraph> =
                    layers.iter().map(|(_, g)| g.clone()).collect();
                RoundOutcome {
                    graph: CollaborationGraph::mean(&graphs),
                    layers,
                    downloads,
                }
            }
        }
    }

    fn receive(&self, _: &Env, model: &mut Model, mixed: Vec<f32>) {
        model.params = mixed;
    }

    fn eval_point(&self) -> EvalPoint {
        match self.evaluate {
            Evaluate::Trained => EvalPoint::AfterTraining,
            Evaluate::Received => EvalPoint::AfterReceive,
        }
    }
}

/// `graph-rule` without a rule is refused; a rule's bad W names what is wrong.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_must_be_square_finite_non_negative_and_row_stochastic() {
        assert_eq!(check_weights(&[vec![0.5, 0.5], vec![0.0, 1.0]], 2), Ok(()));
        let e = |w: &[Vec<f64>]| check_weights(w, 2).unwrap_err();
        assert!(e(&[vec![1.0, 0.0]]).contains("1 rows for 2"));
        assert!(e(&[vec![1.0], vec![1.0]]).contains("row 0 of W has 1 entries"));
        assert!(e(&[vec![1.0, 0.0], vec![f64::NAN, 1.0]]).contains("W[1][0] = NaN"));
        assert!(e(&[vec![1.5, -0.5], vec![0.0, 1.0]]).contains("W[0][1] = -0.5"));
        assert!(e(&[vec![0.5, 0.4], vec![0.0, 1.0]]).contains("row 0 of W sums to 0.9"));
    }

    #[test]
    fn per_layer_weights_are_checked_layer_by_layer() {
        let layers = vec![("fc1".to_string(), 0..6), ("fc2".to_string(), 6..9)];
        let good = vec![vec![0.5, 0.5], vec![0.0, 1.0]];
        let bad = vec![vec![0.5, 0.5], vec![0.2, 0.2]];
        let ok = Weights::Layers(vec![good.clone(), good.clone()]);
        assert_eq!(check(&ok, &layers, 2), Ok(()));
        let e = check(&Weights::Layers(vec![good.clone(), bad]), &layers, 2).unwrap_err();
        assert!(e.starts_with("layer fc2: row 1 of W sums to 0.4"), "{e}");
        let e = check(&Weights::Layers(vec![good.clone()]), &layers, 2).unwrap_err();
        assert!(e.contains("1 layers, the model has 2 (fc1, fc2)"), "{e}");
        assert_eq!(check(&Weights::Whole(good), &layers, 2), Ok(()));
    }
}
