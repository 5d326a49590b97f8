//! fedweave-algos: every algorithm as a pair of rules around the
//! [`CollaborationGraph`]: how the server (or the peers) infer the graph from
//! what clients sent, and what each client optimises locally.
//!
//! One file per algorithm holds both rules and the paper's defaults:
//! [`local`], [`fedavg`] (FedAvg, FedAvg-FT, FedProx, FedProx-FT),
//! [`pfedgraph`], [`feddwa`], [`fedaghn`]. Model-poisoning and label-flip
//! attacks are in [`attack`].

#![warn(missing_docs)]

pub mod attack;
pub mod dpfl;
pub mod fedaghn;
pub mod fedavg;
pub mod feddwa;
pub mod ggc;
pub mod local;
mod params;
pub mod pfedgraph;
pub mod sfl;

use fedweave_core::{CollaborationGraph, RelationGraph, RngStream};
use fedweave_nn::{LocalData, ModelSpec, SgdState, TrainConfig};

pub use params::AlgoError;

/// What every algorithm may read about the federation.
pub struct Env<'a> {
    /// The model architecture.
    pub spec: &'a ModelSpec,
    /// Local training settings.
    pub train: &'a TrainConfig,
    /// n_i: each client's share of training data (train + validation), as
    /// the reference codes weight clients by it.
    pub sizes: &'a [usize],
    /// The common round-0 model every client starts from.
    pub init: &'a [f32],
    /// The dataset's own relation graph between clients, if it has one
    /// (the weather-station graph); SFL propagates along it.
    pub relation: Option<&'a RelationGraph>,
    /// Each client's training label counts (empty for forecasting). Only
    /// oracle graphs read it (SFL's `label_overlap`), and say so.
    pub label_counts: &'a [Vec<usize>],
}

impl Env<'_> {
    /// Number of clients.
    pub fn clients(&self) -> usize {
        self.sizes.len()
    }

    /// Data-size weights p over `who` (sums to 1), in the order of `who`.
    pub fn size_weights(&self, who: &[usize]) -> Vec<f64> {
        let total: f64 = who.iter().map(|&i| self.sizes[i] as f64).sum();
        who.iter()
            .map(|&i| self.sizes[i] as f64 / total.max(1.0))
            .collect()
    }
}

/// A client's own data.
#[derive(Clone, Copy)]
pub struct ClientData<'a> {
    /// Training samples.
    pub train: LocalData<'a>,
    /// Validation samples.
    pub val: LocalData<'a>,
}

/// What a client keeps between rounds.
#[derive(Clone, Debug, Default)]
pub struct ClientState {
    /// The model the client holds: the one it received before training, the
    /// one it trained after.
    pub model: Vec<f32>,
    /// An extra vector received with the model (pFedGraph's normalised mix).
    pub aux: Option<Vec<f32>>,
    /// Optimiser state, for methods whose optimiser persists across rounds.
    pub sgd: SgdState,
    /// Batch-norm running statistics: the client's own, never uploaded or
    /// mixed (only trainable parameters are shared).
    pub buffers: Vec<f32>,
    /// Peer-to-peer methods: the peers this client may draw from (DPFL's
    /// candidate set Ω_k).
    pub candidates: Vec<usize>,
    /// Peer-to-peer methods: the peers it currently averages with (C_k).
    pub collaborators: Vec<usize>,
}

/// What a client sends after local training.
#[derive(Clone, Debug)]
pub struct Upload {
    /// The trained model.
    pub model: Vec<f32>,
    /// Number of model-sized vectors uploaded (for byte accounting).
    pub vectors: usize,
    /// Mean local training loss of the round.
    pub train_loss: f64,
    /// A second model-sized vector, for methods that upload one (FedDWA's
    /// guidance model).
    pub extra: Option<Vec<f32>>,
}

impl Upload {
    /// An upload of one trained model.
    pub fn model(model: Vec<f32>, train_loss: f64) -> Self {
        Self {
            model,
            vectors: 1,
            train_loss,
            extra: None,
        }
    }
}

/// The uploaded models, in order.
pub(crate) fn models_of<'a>(uploads: &[&'a Upload]) -> Vec<&'a [f32]> {
    uploads.iter().map(|u| u.model.as_slice()).collect()
}

/// A model (and optional extra vector) the server sends one client.
#[derive(Clone, Debug)]
pub struct Download {
    /// The mixed model θ̃_i.
    pub model: Vec<f32>,
    /// An extra vector (pFedGraph's normalised mix in its code variant).
    pub aux: Option<Vec<f32>>,
}

/// The result of one round's graph inference and mixing.
#[derive(Clone, Debug)]
pub struct Aggregation {
    /// The round's graph over all clients (identity rows for absent ones;
    /// the mean over layers for per-layer methods).
    pub graph: CollaborationGraph,
    /// Per-layer graphs, for methods that mix layer by layer.
    pub layers: Vec<(String, CollaborationGraph)>,
    /// One entry per client: `Some` replaces the client's model.
    pub downloads: Vec<Option<Download>>,
}

impl Aggregation {
    /// One graph for the whole model (no per-layer graphs) and what each
    /// client receives.
    pub fn new(graph: CollaborationGraph, downloads: Vec<Option<Download>>) -> Self {
        Self {
            graph,
            layers: Vec::new(),
            downloads,
        }
    }

    /// Every one of `n` clients keeps its model: W = I, nothing is sent.
    pub fn keep_all(n: usize) -> Self {
        Self::new(CollaborationGraph::identity(n), vec![None; n])
    }
}

/// Which model the evaluation protocol scores for a client each round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvalPoint {
    /// The model right after local training (personalised methods, FedAvg-FT:
    /// the global model fine-tuned by a round of local training).
    AfterTraining,
    /// The model received after mixing (FedAvg: the global model).
    AfterMixing,
}

/// A federated algorithm: a local objective and a graph rule.
pub trait Algorithm: Send + Sync {
    /// The algorithm's name as in configs.
    fn name(&self) -> &'static str;

    /// Checks, before any training, that the federation gives the algorithm
    /// what it needs (e.g. SFL's `graph = "given"` needs a dataset graph);
    /// `Err` names the problem.
    fn check(&self, _env: &Env) -> Result<(), String> {
        Ok(())
    }

    /// Trains client `client` from `state.model` and returns its upload.
    /// `state.model` must hold the trained model afterwards.
    fn local_round(
        &self,
        env: &Env,
        round: usize,
        client: usize,
        data: &ClientData,
        state: &mut ClientState,
        rng: &mut RngStream,
    ) -> Upload;

    /// Infers the round's graph from the participants' uploads (in the order
    /// of `participants`) and says what each client receives. The default is
    /// Local's rule: W = I, nobody receives anything.
    fn aggregate(
        &mut self,
        env: &Env,
        _round: usize,
        _participants: &[usize],
        _uploads: &[&Upload],
    ) -> Aggregation {
        Aggregation::keep_all(env.clients())
    }

    /// Which model is evaluated.
    fn eval_point(&self) -> EvalPoint {
        EvalPoint::AfterTraining
    }

    /// Whether a server mixes the models ([`Algorithm::aggregate`]) or the
    /// clients exchange them among themselves ([`Algorithm::peer_step`]).
    fn topology(&self) -> Topology {
        Topology::Server
    }

    /// Peer-to-peer methods: client `client`, holding its trained model in
    /// `state.model`, fetches the peer models it wants through `net`,
    /// replaces `state.model` by its own combination of them and returns its
    /// graph row. No other client's state is visible: the row is the
    /// client's own decision. The default keeps the model (W_ii = 1).
    #[allow(clippy::too_many_arguments)]
    fn peer_step(
        &self,
        _env: &Env,
        _round: usize,
        client: usize,
        _data: &ClientData,
        _state: &mut ClientState,
        _net: &dyn PeerNet,
        _rng: &mut RngStream,
    ) -> PeerStep {
        PeerStep::keep(client)
    }
}

/// How a round's models meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// Clients upload, a server aggregates and sends models back.
    Server,
    /// No server: every client fetches peer models and combines them itself.
    PeerToPeer,
}

/// The message layer between peers: what a client can ask of the others.
/// The simulator serves published models from memory and counts every
/// transfer; a deployment serves them over the network.
pub trait PeerNet: Sync {
    /// The model `peer` published this round, delivered to `to` (one
    /// transfer), or `None` when `peer` published nothing (absent, rejected).
    fn fetch(&self, to: usize, peer: usize) -> Option<&[f32]>;
    /// The peers that published a model this round (ascending).
    fn published(&self) -> &[usize];
}

/// What one client decided in a peer-to-peer round.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerStep {
    /// The client's graph row: (peer, weight) pairs, itself included,
    /// weights summing to 1.
    pub row: Vec<(usize, f64)>,
    /// Reward evaluations the client spent choosing (DPFL: validation
    /// passes over averaged models).
    pub evaluations: usize,
    /// Reward of the client alone and of the set it chose, when it ran a
    /// selection (to check that choosing never made things worse).
    pub rewards: Option<(f64, f64)>,
}

impl PeerStep {
    /// The client keeps its own model.
    pub fn keep(client: usize) -> Self {
        Self {
            row: vec![(client, 1.0)],
            evaluations: 0,
            rewards: None,
        }
    }
}

/// Plain local training of `state.model` with optional extra loss terms;
/// returns the mean training loss.
pub(crate) fn train_plain(
    env: &Env,
    data: &ClientData,
    state: &mut ClientState,
    extras: &[&dyn fedweave_nn::ExtraLoss],
    rng: &mut RngStream,
) -> f64 {
    fedweave_nn::train_local(
        env.spec,
        &mut state.model,
        &mut state.buffers,
        &data.train,
        env.train,
        extras,
        &[],
        None,
        rng,
    )
    .mean_loss
}

/// Mixes the participants' uploads along `graph` rows (indices over all
/// clients) for every participant; rows identical to the previous one reuse
/// its result, so FedAvg's N equal rows cost one weighted sum.
pub(crate) fn mix_rows(
    graph: &CollaborationGraph,
    participants: &[usize],
    uploads: &[&[f32]],
) -> Vec<(usize, Vec<f32>)> {
    use rayon::prelude::*;
    let rows: Vec<Vec<f64>> = participants
        .iter()
        .map(|&i| participants.iter().map(|&j| graph.get(i, j)).collect())
        .collect();
    let d = uploads.first().map_or(0, |u| u.len());
    // Distinct rows only: FedAvg-style broadcasts become one computation.
    let mut distinct: Vec<usize> = Vec::new();
    let mut which = Vec::with_capacity(rows.len());
    for r in &rows {
        match distinct.iter().position(|&k| rows[k] == *r) {
            Some(pos) => which.push(pos),
            None => {
                which.push(distinct.len());
                distinct.push(which.len() - 1);
            }
        }
    }
    let mixed: Vec<Vec<f32>> = distinct
        .par_iter()
        .map(|&k| {
            let mut out = vec![0.0f32; d];
            fedweave_core::vecmath::weighted_sum(&rows[k], uploads, &mut out);
            out
        })
        .collect();
    participants
        .iter()
        .zip(which)
        .map(|(&i, w)| (i, mixed[w].clone()))
        .collect()
}

/// The graph over all `n` clients whose rows for `participants` are `rows`
/// (entries over participants) and identity elsewhere.
pub(crate) fn embed_rows(
    n: usize,
    participants: &[usize],
    rows: &[Vec<f64>],
) -> CollaborationGraph {
    let mut g = CollaborationGraph::identity(n);
    for (r, &i) in rows.iter().zip(participants) {
        let mut full = vec![0.0; n];
        for (w, &j) in r.iter().zip(participants) {
            full[j] = *w;
        }
        g.set_row(i, &full);
    }
    g
}

/// Builds an algorithm by name from its config table (without `name`).
/// Returns the algorithm and its fully resolved parameters.
pub fn build(
    name: &str,
    params: &toml::Table,
    clients: usize,
) -> Result<(Box<dyn Algorithm>, toml::Table), AlgoError> {
    match name {
        "local" => params::build::<local::LocalParams, _>(name, params, clients, |p| {
            Box::new(local::Local::new(p))
        }),
        "fedavg" | "fedavg-ft" | "fedprox" | "fedprox-ft" => {
            params::build::<fedavg::FedAvgParams, _>(name, params, clients, |p| {
                Box::new(fedavg::FedAvg::new(name, p))
            })
        }
        "pfedgraph" => params::build::<pfedgraph::PFedGraphParams, _>(name, params, clients, |p| {
            Box::new(pfedgraph::PFedGraph::new(p, clients))
        }),
        "feddwa" => params::build::<feddwa::FedDwaParams, _>(name, params, clients, |p| {
            Box::new(feddwa::FedDwa::new(p))
        }),
        "fedaghn" => params::build::<fedaghn::FedAghnParams, _>(name, params, clients, |p| {
            Box::new(fedaghn::FedAghn::new(p, clients))
        }),
        "sfl" => params::build::<sfl::SflParams, _>(name, params, clients, |p| {
            Box::new(sfl::Sfl::new(p, clients))
        }),
        "dpfl" => params::build::<dpfl::DpflParams, _>(name, params, clients, |p| {
            Box::new(dpfl::Dpfl::new(p))
        }),
        _ => Err(AlgoError::UnknownAlgorithm {
            name: name.to_string(),
            known: catalogue()
                .iter()
                .map(|c| c.0)
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// `(name, description, reference)` of every algorithm, for `fedweave list`.
pub fn catalogue() -> &'static [(&'static str, &'static str, &'static str)] {
    &[
        ("local", "each client trains alone; W = I", "—"),
        (
            "fedavg",
            "one global model; every row of W = data-size weights p; evaluates the global model",
            "McMahan et al., AISTATS 2017",
        ),
        (
            "fedavg-ft",
            "FedAvg, evaluated after each client fine-tunes the global model for a round of local training",
            "pFedGraph/DPFL baseline",
        ),
        (
            "fedprox",
            "FedAvg with the proximal term μ/2‖θ−θ_g‖² (mu = 0.01)",
            "Li et al., MLSys 2020",
        ),
        (
            "fedprox-ft",
            "FedProx, evaluated after local fine-tuning",
            "pFedGraph baseline",
        ),
        (
            "pfedgraph",
            "W_i = simplex projection of p + s_i/(2·alpha), s = cos(θ−θ_init); local CE − λ·cos(θ, θ̃_i)",
            "Ye et al., ICML 2023",
        ),
        (
            "feddwa",
            "W_ij ∝ 1/‖ŵ*_i − ŵ_j‖² (ŵ* = guidance model, one extra local epoch), top_k = 5 per row; evaluates the mixed model; option guidance = \"full_batch\" (Eq. 16)",
            "Liu et al., IJCAI 2023",
        ),
        (
            "fedaghn",
            "per layer: W_ii = p/(1+p), W_ij = softmax_{j≠i}(q·cos(Δ_i, Δ_j))/(1+p); p, q learned by a hypernetwork step (p_init 0.03, q_init 0.5, hn_lr 0.005); option hn_sign = \"pfedhn\"",
            "Song et al., FedAGHN",
        ),
        (
            "sfl",
            "U = Â^m Θ along a relation graph (hops = 3; graph = given | label_overlap (oracle) | learned = SFL*, adj_beta 0.05); local CE + λ(½‖v−w‖² + ½‖v−u_i‖²); option code_compat",
            "Chen et al., IJCAI 2022",
        ),
        (
            "dpfl",
            "no server: client k picks collaborators by randomized double greedy (GGC) on −(its validation loss of the size-weighted average), budget B_c (default ⌈0.1·N⌉, 0 = unlimited); BGGC after init_epochs = 10; period 1; graph = \"random\" ablation",
            "Kharrat, Canini, Horváth 2024",
        ),
    ]
}
