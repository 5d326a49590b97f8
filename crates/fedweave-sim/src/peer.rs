//! The simulator's peer-to-peer message layer: no server object. Each
//! client publishes its trained model; every other client may fetch it, one
//! counted transfer per fetch; each client combines what it fetched by its
//! own rule and its graph row is its own decision.

use fedweave_algos::{Message, PeerNet, PeerStep};
use fedweave_core::CollaborationGraph;
use fedweave_records::SelectionStats;
use std::sync::atomic::{AtomicU64, Ordering};

/// Published messages served from memory; counts every transfer and its
/// bytes.
pub(crate) struct SharedMemoryNet<'a, M> {
    messages: Vec<Option<&'a M>>,
    published: Vec<usize>,
    transfers: AtomicU64,
    bytes: AtomicU64,
}

impl<'a, M: Message> SharedMemoryNet<'a, M> {
    /// A network of `n` clients where the `published` (client, message)
    /// pairs are available this round.
    pub(crate) fn new(n: usize, published: &'a [(usize, M)]) -> Self {
        let mut messages = vec![None; n];
        for (i, m) in published {
            messages[*i] = Some(m);
        }
        let published = (0..n).filter(|&i| messages[i].is_some()).collect();
        Self {
            messages,
            published,
            transfers: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
        }
    }

    /// Whether client `i` published this round.
    pub(crate) fn has_published(&self, i: usize) -> bool {
        self.messages.get(i).is_some_and(Option::is_some)
    }

    /// Transfers so far.
    pub(crate) fn transfers(&self) -> u64 {
        self.transfers.load(Ordering::Relaxed)
    }

    /// Bytes moved so far.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

impl<M: Message> PeerNet<M> for SharedMemoryNet<'_, M> {
    fn fetch(&self, to: usize, peer: usize) -> Option<&M> {
        let message = self.messages.get(peer).copied().flatten()?;
        if to != peer {
            self.transfers.fetch_add(1, Ordering::Relaxed);
            self.bytes.fetch_add(message.bytes(), Ordering::Relaxed);
        }
        Some(message)
    }

    fn published(&self) -> &[usize] {
        &self.published
    }
}

/// The round's graph and selection statistics from the clients' steps
/// (`n` clients; those without a step keep their models: identity rows)
/// and the transfers they made.
pub(crate) fn assemble(
    n: usize,
    steps: &[(usize, PeerStep)],
    transfers: u64,
) -> (CollaborationGraph, SelectionStats) {
    let mut graph = CollaborationGraph::identity(n);
    let mut stats = SelectionStats::default();
    let mut gains = Vec::new();
    for (i, step) in steps {
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
    stats.transfers = transfers;
    (graph, stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfers_and_bytes_are_counted_per_fetch_and_self_fetches_are_free() {
        let published = vec![(0, vec![1.0f32, 2.0]), (2, vec![3.0f32, 4.0, 5.0])];
        let net = SharedMemoryNet::new(3, &published);
        assert_eq!(net.published(), &[0, 2]);
        assert_eq!(net.fetch(1, 2), Some(&published[1].1));
        assert_eq!(net.fetch(2, 2), Some(&published[1].1));
        assert_eq!(net.fetch(0, 1), None);
        assert_eq!(net.fetch(1, 0), Some(&published[0].1));
        assert_eq!(net.transfers(), 2);
        assert_eq!(net.bytes(), 4 * (3 + 2));
        assert!(net.has_published(2) && !net.has_published(1));
    }
}
