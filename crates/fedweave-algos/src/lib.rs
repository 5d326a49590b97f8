//! fedweave-algos: every algorithm as a pair of rules around the
//! [`CollaborationGraph`]: how the server (or the peers) infer the graph from
//! what clients sent, and what each client optimises locally.
//!
//! [`contract`] is the interface every algorithm implements (its own state
//! and message types, the round protocol); [`registry`] is the one list of
//! algorithms. One file per algorithm holds both rules and the paper's
//! defaults: [`local`], [`fedavg`] (FedAvg, FedAvg-FT, FedProx, FedProx-FT),
//! [`pfedgraph`], [`feddwa`], [`fedaghn`], [`sfl`], [`dpfl`], and the
//! personalised baselines [`ditto`], [`apfl`], [`fedala`]. Model-poisoning
//! and label-flip attacks are in [`attack`]; the defences against them
//! (median, trimmed mean, Krum, norm clipping) in [`robust`].
//! Split-model baselines: [`fedrep`], [`fedbabu`] and [`partial`] (FedPer,
//! LG-FedAvg, FedBN), sharing one part of the model through [`split`].
//! Feature-level personalised baselines: [`fedrod`], [`fedproto`],
//! [`knnper`], [`fedphp`], [`fedpac`], [`fedcp`].

#![warn(missing_docs)]

pub mod apfl;
pub mod attack;
pub mod contract;
pub mod ditto;
pub mod dpfl;
pub mod fedaghn;
pub mod fedala;
pub mod fedavg;
pub mod fedbabu;
pub mod fedcp;
pub mod feddwa;
pub mod fedpac;
pub mod fedphp;
pub mod fedproto;
pub mod fedrep;
pub mod fedrod;
pub mod ggc;
pub mod knnper;
pub mod local;
mod params;
pub mod partial;
pub mod pfedgraph;
pub mod registry;
pub mod robust;
pub mod sfl;
pub mod split;
#[cfg(test)]
mod testkit;

use fedweave_core::CollaborationGraph;

pub use contract::{
    Algorithm, ClientCx, ClientData, Env, EvalPoint, Info, Message, Model, ModelRef, PeerNet,
    PeerStep, RoundOutcome, Topology, Trained,
};
pub use params::{AlgoError, ParamError, Validate};
pub use registry::{Visitor, catalogue, check_params, dispatch};

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
/// ([`fedweave_core::pairwise::mix`]); bit-identical rows are computed once,
/// so FedAvg's N equal rows cost one weighted sum.
pub(crate) fn mix_rows(
    graph: &CollaborationGraph,
    participants: &[usize],
    uploads: &[&[f32]],
) -> Vec<(usize, Vec<f32>)> {
    let rows: Vec<Vec<f64>> = participants
        .iter()
        .map(|&i| participants.iter().map(|&j| graph.get(i, j)).collect())
        .collect();
    let mixed = fedweave_core::pairwise::mix(&rows, uploads);
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
