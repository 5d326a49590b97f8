//! Stopping a run at a safe point. A process-wide flag, set by a signal
//! handler (the `fedweave` binary registers SIGINT and SIGTERM on it) or by
//! [`request_stop`]: a simulated run that sees it after a round writes that
//! round's checkpoint and returns [`crate::RunError::Interrupted`]; a sweep
//! starts no further runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};

static STOP: LazyLock<Arc<AtomicBool>> = LazyLock::new(|| Arc::new(AtomicBool::new(false)));

/// The flag itself, to hand to a signal handler (e.g.
/// `signal_hook::flag::register`).
pub fn stop_flag() -> Arc<AtomicBool> {
    Arc::clone(&STOP)
}

/// Asks every run in this process to stop after its current round.
pub fn request_stop() {
    STOP.store(true, Ordering::SeqCst);
}

/// Whether a stop was asked for.
pub fn stop_requested() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Forgets a stop request, so the next run in this process runs to its end
/// (a library caller that stopped one run and starts another).
pub fn clear_stop() {
    STOP.store(false, Ordering::SeqCst);
}
