//! DPFL (Kharrat, Canini, Horváth 2024): decentralized personalized FL with
//! greedy, budgeted collaborator selection. There is no server: every client
//! decides whom it averages with, so the graph is directed and sparse.
//!
//! Graph rule of client k (its own decision, [`Algorithm::peer_step`]):
//! - Round 1 (preprocessing): after τ_init = `init_epochs` local epochs from
//!   the common initial model, BGGC over all other clients — their models
//!   streamed in batches of at most B_c — gives the candidate set Ω_k
//!   (|Ω_k| ≤ B_c); then w_k ← the data-size weighted average over Ω_k ∪ {k}.
//! - Every later round: local training, then the models of Ω_k are fetched
//!   and GGC over Ω_k (every `period` rounds; in between the last C_k is
//!   reused) picks C_k ⊆ Ω_k; w_k ← the weighted average over C_k ∪ {k}.
//!   Ω_k never shrinks.
//! - GGC is the randomized double greedy of [`crate::ggc`] on R(S) = −(the
//!   validation loss of client k on the size-weighted average of S).
//!
//! Budget B_c (`budget`) counts collaborators **excluding** the client (the
//! paper); `budget_includes_self = true` gives the authors' code meaning
//! (`cardinality` counts the client). `budget = 0` means no limit; left
//! unset it is ⌈0.1·N⌉.
//!
//! Local objective: plain cross-entropy; the optimiser state (momentum)
//! persists across rounds, as in the authors' client, so it survives the
//! model replacement.
//!
//! `graph = "random"` is the paper's ablation: Ω_k is a uniformly random set
//! of B_c peers, and C_k = Ω_k every round (no reward is evaluated).
//!
//! Evaluation: the model right after local training, scored before the peer
//! exchange (what the authors' code logs).

use crate::Checked;
use crate::contract::holds_model;
use crate::ggc::{self, Candidate, SelectionRule};
use crate::params::Validate;
use crate::params::params;
use crate::{
    AlgoError, Algorithm, ClientCx, ClientData, Env, Info, Model, ParamError, PeerNet, PeerStep,
    Topology, Trained,
};
use fedweave_nn::{SgdState, TrainConfig, evaluate};
use serde::{Deserialize, Serialize};

/// How collaborators are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerGraph {
    /// BGGC once, then GGC (the method).
    Ggc,
    /// Uniformly random peers, same budget (the paper's ablation).
    Random,
}

params! {
    /// DPFL's parameters.
    pub struct DpflParams {
        /// B_c: collaborators per client (0 = no limit; unset = ⌈0.1·N⌉).
        pub budget: Option<usize> = None,
        /// Count the client itself in the budget (the authors' code).
        pub budget_includes_self: bool = false,
        /// τ_init: local epochs before the first selection (paper: 10; FEMNIST 4).
        pub init_epochs: usize = 10,
        /// Run GGC every `period` rounds (paper's main setting 1).
        pub period: usize = 1,
        /// Selection rule.
        pub graph: PeerGraph = PeerGraph::Ggc,
        /// GGC: when a candidate helps neither way (a = b = 0), drop it instead
        /// of adding it as the paper does; guarantees the chosen set is never
        /// worse than the client alone (see [`crate::ggc`]).
        pub skip_when_no_gain: bool = false,
    }
}

impl Validate for DpflParams {
    fn validate(&self) -> Result<(), ParamError> {
        if self.period == 0 {
            return Err(ParamError::new("period", "must be ≥ 1"));
        }
        if self.budget_includes_self && self.budget == Some(1) {
            return Err(ParamError::new(
                "budget",
                "= 1 with budget_includes_self leaves no collaborator",
            ));
        }
        Ok(())
    }

    fn resolve(&mut self, clients: usize) {
        if self.budget.is_none() {
            self.budget = Some((clients as f64 * 0.1).ceil().max(1.0) as usize);
        }
    }
}

/// DPFL.
pub struct Dpfl {
    params: DpflParams,
}

/// A DPFL client: its model, its optimiser's momentum (it persists across
/// rounds, as in the authors' client) and its choices of peers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DpflClient {
    /// w_k.
    pub model: Model,
    /// SGD momentum buffer (empty before the first step).
    #[serde(with = "fedweave_core::stash::vector")]
    pub momentum: Vec<f32>,
    /// Ω_k: the peers it may draw from.
    pub candidates: Vec<usize>,
    /// C_k: the peers it currently averages with.
    pub collaborators: Vec<usize>,
}

impl Dpfl {
    fn rule(&self) -> SelectionRule {
        SelectionRule {
            limit: self.params.budget.filter(|&b| b > 0),
            includes_self: self.params.budget_includes_self,
            skip_when_no_gain: self.params.skip_when_no_gain,
        }
    }

    /// Collaborators excluding the client that the budget allows.
    fn max_collaborators(&self, candidates: usize) -> usize {
        self.rule()
            .collaborators()
            .map_or(candidates, |b| b.min(candidates))
    }
}

/// −(validation loss of the client on `model`), with its own BN statistics.
fn reward<'a>(
    env: &'a Env,
    data: &'a ClientData,
    buffers: &'a [f32],
) -> impl FnMut(&[f32]) -> f64 + 'a {
    move |model: &[f32]| -evaluate(env.spec, model, buffers, &data.val).mean_loss()
}

/// Client `k`'s new model: the data-size weighted average of its own model
/// and the peer models in `peers`; returns it with the graph row.
fn weighted_average(
    env: &Env,
    k: usize,
    own: &[f32],
    peers: &[(usize, &[f32])],
) -> (Vec<f32>, Vec<(usize, f64)>) {
    let ids: Vec<usize> = std::iter::once(k)
        .chain(peers.iter().map(|p| p.0))
        .collect();
    let models: Vec<&[f32]> = std::iter::once(own)
        .chain(peers.iter().map(|p| p.1))
        .collect();
    let total: f64 = ids.iter().map(|&i| env.sizes[i] as f64).sum();
    let weights: Vec<f64> = ids
        .iter()
        .map(|&i| {
            if total > 0.0 {
                env.sizes[i] as f64 / total
            } else {
                1.0 / ids.len() as f64
            }
        })
        .collect();
    let mut out = vec![0.0f32; own.len()];
    fedweave_core::vecmath::weighted_sum(&weights, &models, &mut out);
    (out, ids.into_iter().zip(weights).collect())
}

/// Fetches the models of `ids` from their peers (one transfer each),
/// skipping peers that published nothing this round.
fn fetch_all<'n>(
    net: &'n dyn PeerNet<Vec<f32>>,
    k: usize,
    ids: &[usize],
) -> Vec<(usize, &'n [f32])> {
    ids.iter()
        .filter_map(|&j| net.fetch(k, j).map(|m| (j, m.as_slice())))
        .collect()
}

// Scored: the model after local training (scored before the peer exchange).
holds_model!(DpflClient: model);

impl Algorithm for Dpfl {
    const NAMES: &'static [Info] = &[Info {
        name: "dpfl",
        summary: "no server: client k picks collaborators by randomized double greedy (GGC) on −(its validation loss of the size-weighted average), budget B_c (default ⌈0.1·N⌉, 0 = unlimited); BGGC after init_epochs = 10; period 1; graph = \"random\" ablation",
        reference: "Kharrat, Canini, Horváth 2024",
    }];
    type Params = DpflParams;
    type Client = DpflClient;
    type Server = ();
    type Down = ();
    /// The trained model, published to the peers.
    type Up = Vec<f32>;

    fn new(_: &'static str, params: Checked<DpflParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn topology(&self) -> Topology {
        Topology::PeerToPeer
    }

    fn init_client(&self, env: &Env, _: usize) -> DpflClient {
        DpflClient {
            model: env.initial_model(),
            momentum: Vec::new(),
            candidates: Vec::new(),
            collaborators: Vec::new(),
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut DpflClient,
    ) -> Trained<Vec<f32>> {
        let cfg = if cx.round == 1 {
            TrainConfig {
                iterations: 0,
                epochs: self.params.init_epochs,
                ..env.train.clone()
            }
        } else {
            env.train.clone()
        };
        let mut sgd = SgdState {
            momentum: std::mem::take(&mut state.momentum),
        };
        let train_loss = cx
            .train(env, &mut state.model, &cfg, &[], &[], Some(&mut sgd))
            .mean_loss;
        state.momentum = sgd.momentum;
        Trained {
            up: state.model.params.clone(),
            train_loss,
        }
    }

    fn receive(&self, _: &Env, _: &mut DpflClient, _: ()) {}

    fn peer_step(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut DpflClient,
        net: &dyn PeerNet<Vec<f32>>,
    ) -> PeerStep {
        let (round, k, data, rng) = (cx.round, cx.client, &cx.data, &mut cx.rng);
        let own = state.model.params.clone();
        let own_candidate = Candidate {
            id: k,
            weight: env.sizes[k] as f64,
            model: &own,
        };
        let mut evaluations = 0;
        let mut rewards = None;
        let peers = if round == 1 {
            let others: Vec<usize> = net
                .published()
                .iter()
                .copied()
                .filter(|&j| j != k)
                .collect();
            let budget = self.max_collaborators(others.len());
            state.candidates = match self.params.graph {
                PeerGraph::Random => ggc::random_selection(&others, budget, rng),
                PeerGraph::Ggc => {
                    // Streamed in batches of B_c: the client never holds
                    // more than B_c peer models besides two running sums.
                    let weights: Vec<f64> = others.iter().map(|&j| env.sizes[j] as f64).collect();
                    let sel = ggc::bggc(
                        own_candidate,
                        &others,
                        &weights,
                        budget.max(1),
                        |ids: &[usize]| {
                            ids.iter()
                                .map(|&j| net.fetch(k, j).map_or(own.as_slice(), |m| m))
                                .collect()
                        },
                        self.rule(),
                        rng,
                        &mut reward(env, data, &state.model.buffers),
                    );
                    evaluations = sel.evaluations;
                    rewards = Some((sel.reward_alone, sel.reward_chosen));
                    sel.chosen
                }
            };
            state.collaborators = state.candidates.clone();
            fetch_all(net, k, &state.collaborators)
        } else if self.params.graph == PeerGraph::Ggc
            && (round - 2).is_multiple_of(self.params.period)
        {
            let fetched = fetch_all(net, k, &state.candidates);
            let candidates: Vec<Candidate> = fetched
                .iter()
                .map(|&(j, m)| Candidate {
                    id: j,
                    weight: env.sizes[j] as f64,
                    model: m,
                })
                .collect();
            let sel = ggc::ggc(
                own_candidate,
                &candidates,
                self.rule(),
                rng,
                &mut reward(env, data, &state.model.buffers),
            );
            evaluations = sel.evaluations;
            rewards = Some((sel.reward_alone, sel.reward_chosen));
            state.collaborators = sel.chosen;
            fetched
                .into_iter()
                .filter(|(j, _)| state.collaborators.contains(j))
                .collect()
        } else {
            fetch_all(net, k, &state.collaborators)
        };
        let (mixed, row) = weighted_average(env, k, &own, &peers);
        state.model.params = mixed;
        PeerStep {
            row,
            evaluations,
            rewards,
        }
    }
}
