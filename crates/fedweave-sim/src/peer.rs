//! The simulator's peer-to-peer message layer: no server object. Each
//! client publishes its trained model; every other client may fetch it, one
//! counted transfer per fetch; each client combines what it fetched by its
//! own rule and its graph row is its own decision.

use crate::records::SelectionStats;
use fedweave_algos::{Algorithm, ClientData, ClientState, Env, PeerNet, PeerStep};
use fedweave_core::{CollaborationGraph, Purpose, rng_stream};
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering};

/// Published models served from memory; counts every transfer.
pub(crate) struct SharedMemoryNet<'a> {
    models: Vec<Option<&'a [f32]>>,
    published: Vec<usize>,
    transfers: AtomicU64,
}

impl<'a> SharedMemoryNet<'a> {
    /// A network of `n` clients where `published` (client, model) pairs are
    /// available this round.
    pub(crate) fn new(n: usize, published: impl IntoIterator<Item = (usize, &'a [f32])>) -> Self {
        let mut models = vec![None; n];
        for (i, m) in published {
            models[i] = Some(m);
        }
        let published = (0..n).filter(|&i| models[i].is_some()).collect();
        Self {
            models,
            published,
            transfers: AtomicU64::new(0),
        }
    }

    /// Model transfers so far.
    pub(crate) fn transfers(&self) -> u64 {
        self.transfers.load(Ordering::Relaxed)
    }
}

impl PeerNet for SharedMemoryNet<'_> {
    fn fetch(&self, to: usize, peer: usize) -> Option<&[f32]> {
        let model = self.models.get(peer).copied().flatten()?;
        if to != peer {
            self.transfers.fetch_add(1, Ordering::Relaxed);
        }
        Some(model)
    }

    fn published(&self) -> &[usize] {
        &self.published
    }
}

/// Runs every selecting client's `peer_step` in parallel (each owns only its
/// state) and assembles the round's graph from their rows; other clients
/// keep their models (identity rows).
#[allow(clippy::too_many_arguments)]
pub(crate) fn exchange<'d>(
    algo: &dyn Algorithm,
    env: &Env,
    seed: u64,
    round: usize,
    states: &mut [ClientState],
    selecting: &[bool],
    data: &(dyn Fn(usize) -> ClientData<'d> + Sync),
    net: &SharedMemoryNet,
) -> (CollaborationGraph, SelectionStats) {
    let n = states.len();
    let steps: Vec<(usize, PeerStep)> = states
        .par_iter_mut()
        .enumerate()
        .filter(|(i, _)| selecting[*i])
        .map(|(i, state)| {
            let mut rng = rng_stream(seed, round as u64, i as u64, Purpose::Selection);
            let step = algo.peer_step(env, round, i, &data(i), state, net, &mut rng);
            (i, step)
        })
        .collect();
    let mut graph = CollaborationGraph::identity(n);
    let mut stats = SelectionStats::default();
    let mut gains = Vec::new();
    for (i, step) in &steps {
        let mut row = vec![0.0; n];
        for &(j, w) in &step.row {
            row[j] += w;
        }
        graph.set_row(*i, &row);
        stats.reward_evaluations += step.evaluations;
        if let Some((alone, chosen)) = step.rewards {
            gains.push(chosen - alone);
        }
    }
    stats.selecting_clients = gains.len();
    if !gains.is_empty() {
        stats.no_worse_share =
            gains.iter().filter(|&&g| g >= 0.0).count() as f64 / gains.len() as f64;
        stats.mean_reward_gain = gains.iter().sum::<f64>() / gains.len() as f64;
        stats.worst_reward_gain = gains.iter().copied().fold(0.0, f64::min);
    }
    stats.transfers = net.transfers();
    (graph, stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfers_are_counted_per_fetch_and_self_fetches_are_free() {
        let a = vec![1.0f32, 2.0];
        let b = vec![3.0f32, 4.0];
        let net = SharedMemoryNet::new(3, [(0, a.as_slice()), (2, b.as_slice())]);
        assert_eq!(net.published(), &[0, 2]);
        assert_eq!(net.fetch(1, 2), Some(b.as_slice()));
        assert_eq!(net.fetch(2, 2), Some(b.as_slice()));
        assert_eq!(net.fetch(0, 1), None);
        assert_eq!(net.fetch(1, 0), Some(a.as_slice()));
        assert_eq!(net.transfers(), 2);
    }
}
