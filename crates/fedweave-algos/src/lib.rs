//! fedweave-algos: every algorithm as a pair of rules around the
//! [`CollaborationGraph`]: how the server (or the peers) infer the graph from
//! what clients sent, and what each client optimises locally.
//!
//! [`contract`] is the interface every algorithm implements (its own state
//! and message types, the round protocol); [`registry`] is the one list of
//! algorithms (`fedweave list` prints it). One file per algorithm holds both
//! rules and the paper's defaults:
//! - one global model: [`local`], [`fedavg`] (FedAvg, FedAvg-FT, FedProx,
//!   FedProx-FT), [`fedavgm`] (server momentum), [`fedatt`] (attentive
//!   aggregation, layer by layer), [`scaffold`], [`feddyn`], [`fednova`],
//!   [`moon`];
//! - collaboration graphs: [`pfedgraph`], [`feddwa`], [`fedaghn`], [`sfl`],
//!   [`dpfl`] (peer to peer, with [`ggc`]), [`fedamp`] (FedAMP, HeurFedAMP);
//!   [`graph_rule`] (a rule supplied at run time, e.g. from Python);
//! - personalised models: [`ditto`], [`apfl`], [`fedala`], [`perfedavg`],
//!   [`pfedme`];
//! - split models, sharing one part through [`split`]: [`fedrep`],
//!   [`fedbabu`], [`partial`] (FedPer, LG-FedAvg, FedBN); [`personal`]
//!   gives any server-mixing method a personal head, body or batch norm
//!   (SFL + FedPer, SFL + LG-FedAvg);
//! - feature-level: [`fedrod`], [`fedproto`], [`knnper`], [`fedphp`],
//!   [`fedpac`], [`fedcp`];
//! - clustered and mixtures: [`cfl`], [`ifca`], [`fedem`];
//! - clients that weigh the others' models through the server relay of
//!   [`relay`]: [`fedfomo`], [`l2c`], [`apple`];
//! - hypernetworks on the small network of [`hypernet`]: [`pfedhn`],
//!   [`pfedla`].
//!
//! Model-poisoning and label-flip attacks are in [`attack`]; the defences
//! against them (median, trimmed mean, Krum, norm clipping) in [`robust`].
//! A unit test checks that this list names every registered module.

#![warn(missing_docs)]

pub mod apfl;
pub mod apple;
pub mod attack;
pub mod batching;
pub mod cfl;
mod class_mean;
pub mod contract;
pub mod ditto;
pub mod dpfl;
pub mod fedaghn;
pub mod fedala;
pub mod fedamp;
pub mod fedatt;
pub mod fedavg;
pub mod fedavgm;
pub mod fedbabu;
pub mod fedcp;
pub mod feddwa;
pub mod feddyn;
pub mod fedem;
pub mod fedfomo;
pub mod fednova;
pub mod fedpac;
pub mod fedphp;
pub mod fedproto;
pub mod fedrep;
pub mod fedrod;
pub mod ggc;
pub mod graph_rule;
pub mod hypernet;
pub mod ifca;
pub mod knnper;
pub mod l2c;
pub mod local;
pub mod moon;
mod params;
pub mod partial;
pub mod perfedavg;
pub mod personal;
pub mod pfedgraph;
pub mod pfedhn;
pub mod pfedla;
pub mod pfedme;
pub mod registry;
pub mod relay;
pub mod robust;
pub mod scaffold;
pub mod server_bench;
pub mod sfl;
pub mod split;
#[cfg(test)]
mod testkit;

use fedweave_core::{CollaborationGraph, LayerGroup};

pub use contract::{
    Algorithm, ClientCx, ClientData, Env, EvalPoint, Info, Message, Model, ModelRef, PeerNet,
    PeerStep, RoundOutcome, Topology, Trained, size_weights,
};
pub use params::{AlgoError, Checked, ParamError, Validate};
pub use registry::{Visitor, catalogue, check_params, dispatch};

/// A seed for an algorithm's own initial draws (FedCP's policy network,
/// IFCA's and FedEM's extra components, pFedHN's and pFedLA's
/// hypernetworks, FedFomo's exploration), keyed by the round-0 model, itself
/// drawn from the experiment's seed: FNV-1a over its bits. The contract
/// hands algorithms no seed, and this one is the same at every thread count
/// and after a resume.
pub(crate) fn init_seed(init: &[f32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in init {
        for b in x.to_bits().to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// `m` initial models for methods with several shared models (IFCA's
/// clusters, FedEM's components): the common round-0 model first, then
/// independent draws of the architecture's initialiser seeded by
/// [`init_seed`], so the models differ (identical ones would never
/// separate) and depend only on the experiment's seed.
pub(crate) fn distinct_inits(env: &Env, m: usize) -> Vec<Vec<f32>> {
    let seed = init_seed(env.init);
    (0..m)
        .map(|k| {
            if k == 0 {
                env.init.to_vec()
            } else {
                let mut rng =
                    fedweave_core::rng_stream(seed, 0, k as u64, fedweave_core::Purpose::Algorithm);
                env.spec.init(&mut rng)
            }
        })
        .collect()
}

/// The uploads' first vectors (their models), in order.
pub(crate) fn models_of<M: Message>(uploads: &[(usize, M)]) -> Vec<&[f32]> {
    uploads
        .iter()
        .map(|(_, u)| u.vectors().first().copied().unwrap_or(&[]))
        .collect()
}

/// The uploading clients, in order.
pub(crate) fn ids_of<M>(uploads: &[(usize, M)]) -> Vec<usize> {
    uploads.iter().map(|(i, _)| *i).collect()
}

/// Mixes the participants' uploads along `graph` rows (indices over all
/// clients) for every participant, as one blocked product W·Θ
/// ([`Kernels::mix`](fedweave_core::pairwise::Kernels::mix)); bit-identical
/// rows are computed once, so FedAvg's N equal rows cost one weighted sum.
pub(crate) fn mix_rows(
    kernels: &fedweave_core::pairwise::Kernels,
    graph: &CollaborationGraph,
    participants: &[usize],
    uploads: &[&[f32]],
) -> Vec<(usize, Vec<f32>)> {
    let rows: Vec<Vec<f64>> = participants
        .iter()
        .map(|&i| participants.iter().map(|&j| graph.get(i, j)).collect())
        .collect();
    let mixed = kernels.mix(&rows, uploads);
    participants
        .iter()
        .copied()
        .zip(mixed.into_rows())
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

/// The per-layer outcome of a layer-wise method (FedAGHN, pFedLA): one
/// graph per layer group from each participant's rows (`layer_rows[r]` holds
/// the participants' rows on group r, with entries over the clients `cols`),
/// embedded over all `n` clients, and their mean as the round's graph.
pub(crate) fn layered_outcome<D>(
    n: usize,
    participants: &[usize],
    cols: &[usize],
    groups: &[LayerGroup],
    layer_rows: &[Vec<Vec<f64>>],
    downloads: Vec<(usize, D)>,
) -> RoundOutcome<D> {
    let layers: Vec<(String, CollaborationGraph)> = groups
        .iter()
        .zip(layer_rows)
        .map(|(g, rows)| {
            let mut graph = CollaborationGraph::identity(n);
            for (row, &i) in rows.iter().zip(participants) {
                let mut full = vec![0.0; n];
                for (w, &j) in row.iter().zip(cols) {
                    full[j] = *w;
                }
                graph.set_row(i, &full);
            }
            (g.name.clone(), graph)
        })
        .collect();
    let graphs: Vec<CollaborationGraph> = layers.iter().map(|(_, g)| g.clone()).collect();
    RoundOutcome {
        graph: CollaborationGraph::mean(&graphs),
        layers,
        downloads,
    }
}

/// Every parameter tensor of the model as its own layer (weight and bias
/// apart), named like `fc1.weight`: the unit pFedLA and FedAtt weigh by.
pub(crate) fn tensor_layers(env: &Env) -> Vec<LayerGroup> {
    env.spec
        .layout()
        .tensors()
        .iter()
        .map(|t| LayerGroup {
            name: t.name.clone(),
            range: t.offset..t.offset + t.shape.iter().product::<usize>(),
        })
        .collect()
}

/// The layer groups of the model (a module's weight and bias), or one group
/// over the whole vector for a layout without groups: the unit layer-wise
/// methods mix by.
pub(crate) fn layer_groups(env: &Env) -> Vec<LayerGroup> {
    let groups = env.spec.layout().groups();
    if groups.is_empty() {
        vec![LayerGroup {
            name: "all".into(),
            range: 0..env.init.len(),
        }]
    } else {
        groups.to_vec()
    }
}
