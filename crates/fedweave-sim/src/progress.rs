//! Progress inside a round, for a progress display: the round under way,
//! its participants and how many of them have finished local training.
//! Process-wide counters (a display reads them from another thread); with
//! several runs at once (a sweep) they describe whichever round started
//! last.

use std::sync::atomic::{AtomicUsize, Ordering};

static ROUND: AtomicUsize = AtomicUsize::new(0);
static PARTICIPANTS: AtomicUsize = AtomicUsize::new(0);
static TRAINED: AtomicUsize = AtomicUsize::new(0);

/// Round `round` starts local training on `participants` clients.
pub(crate) fn round_started(round: usize, participants: usize) {
    TRAINED.store(0, Ordering::SeqCst);
    PARTICIPANTS.store(participants, Ordering::SeqCst);
    ROUND.store(round, Ordering::SeqCst);
}

/// One more client finished local training.
pub(crate) fn client_trained() {
    TRAINED.fetch_add(1, Ordering::SeqCst);
}

/// Where the current round stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundProgress {
    /// The round under way (0: none started yet).
    pub round: usize,
    /// Clients that finished local training this round.
    pub trained: usize,
    /// Clients taking part this round.
    pub participants: usize,
}

/// The current round's progress.
pub fn current() -> RoundProgress {
    RoundProgress {
        round: ROUND.load(Ordering::SeqCst),
        trained: TRAINED.load(Ordering::SeqCst),
        participants: PARTICIPANTS.load(Ordering::SeqCst),
    }
}
