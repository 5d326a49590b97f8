//! Seeded random streams, one per (seed, round, client, purpose).
//!
//! No random choice in fedweave reads a shared generator: each draws from a
//! stream derived from who needs it and why, so the result is the same
//! whatever the number of threads or the order in which clients run.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The generator behind every stream.
pub type RngStream = ChaCha8Rng;

/// Why a random stream is drawn; part of its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u64)]
pub enum Purpose {
    /// Initial model weights (shared by all clients).
    ModelInit = 1,
    /// Data partitioning across clients.
    Partition = 2,
    /// Train/validation split inside a client.
    ValidationSplit = 3,
    /// Mini-batch order during local training.
    Batches = 4,
    /// Which clients take part in a round.
    Participation = 5,
    /// Which clients are malicious, and their poisoned models.
    Attack = 6,
    /// Collaborator selection (DPFL's greedy search and ablations).
    Selection = 7,
    /// Dataset generation or a fixed train/test split of a bundled set.
    Dataset = 8,
    /// Anything an algorithm draws for itself (fine-tuning, dropout, …).
    Algorithm = 9,
    /// Each client's number of local steps when `train.local_iterations`
    /// is a range.
    LocalWork = 10,
    /// Training-data augmentation (crops and flips of a mini-batch).
    Augment = 11,
}

/// SplitMix64 finaliser: a bijective mixer with full avalanche.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The stream for `(seed, round, client, purpose)`. Use `u64::MAX` as the
/// client for draws that belong to no single client.
pub fn rng_stream(seed: u64, round: u64, client: u64, purpose: Purpose) -> RngStream {
    let mut key = [0u8; 32];
    let words = [
        mix(seed),
        mix(seed ^ mix(round.wrapping_add(0x1234_5678))),
        mix(client ^ mix(round).rotate_left(17)),
        mix(purpose as u64 ^ mix(seed).rotate_left(29)),
    ];
    for (i, w) in words.iter().enumerate() {
        key[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
    }
    ChaCha8Rng::from_seed(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn streams_are_reproducible_and_distinct() {
        let draw = |s, r, c, p| rng_stream(s, r, c, p).random::<u64>();
        assert_eq!(
            draw(1, 2, 3, Purpose::Batches),
            draw(1, 2, 3, Purpose::Batches)
        );
        let base = draw(1, 2, 3, Purpose::Batches);
        assert_ne!(base, draw(2, 2, 3, Purpose::Batches));
        assert_ne!(base, draw(1, 3, 3, Purpose::Batches));
        assert_ne!(base, draw(1, 2, 4, Purpose::Batches));
        assert_ne!(base, draw(1, 2, 3, Purpose::Attack));
        // Swapping round and client must not collide.
        assert_ne!(
            draw(1, 2, 3, Purpose::Batches),
            draw(1, 3, 2, Purpose::Batches)
        );
    }
}
