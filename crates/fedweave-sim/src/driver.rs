//! One round of a server method, written once for every runtime: the
//! simulator (clients in memory) and `fedweave serve` (clients over gRPC)
//! differ only in the [`Clients`] they hand to [`server_round`]. The round
//! chooses the participants, asks every client to start the round (train
//! where chosen, score where the protocol asks), admits what comes back
//! with the shared checks of [`crate::checks`] (uploads only from
//! participants, once, sound; scores only where asked, in range), screens
//! the uploads (the algorithm's check and the robust aggregator), lets the
//! algorithm aggregate, delivers each client's download, admits the scores
//! after receiving, and closes the books. Attacks and batched training are
//! the simulator's own: its [`Clients`] trains and wraps the uploads before
//! they reach this round.

use crate::config::EvalWhen;
use crate::protocol::{Facts, Score, Trackers};
use crate::round::{
    RoundBooks, Scores, Upload, choose_participants, close_round, screen, server_outcome,
    wants_origins,
};
use fedweave_algos::{Algorithm, Env, EvalPoint, Message};
use fedweave_records::RoundRecord;
use std::time::Instant;

/// What a round asks of every client when it starts.
#[derive(Clone, Debug)]
pub struct TrainAsk {
    /// The round, from 1.
    pub round: usize,
    /// Who trains (sorted); the others only score where asked.
    pub participants: Vec<usize>,
    /// Score the model held before training (`eval.when =
    /// "before_and_after"`).
    pub before: bool,
    /// Score after training (the algorithm's point is after training).
    pub after: bool,
    /// Report where training started (norm clipping).
    pub origin: bool,
}

/// One client's answer to the start of a round, as it arrived (checked by
/// the round, not by the transport).
pub struct TrainReply<U> {
    /// Its upload, if it trained.
    pub upload: Option<Upload<U>>,
    /// Its score before training, if it gave one.
    pub before: Option<Score>,
    /// Its score after training, if it gave one.
    pub after: Option<Score>,
}

/// The clients of a server method, wherever they run.
pub trait Clients<A: Algorithm> {
    /// Starts round `ask.round` on every client: participants train from
    /// their state after the previous round, and each scores where asked.
    /// Returns each client's reply in client order (`None`: it did not
    /// answer in time).
    fn train(&mut self, ask: &TrainAsk) -> Vec<Option<TrainReply<A::Up>>>;

    /// Delivers round `round`'s downloads (`inbox[i]` to client i, if any)
    /// to the clients marked in `to`, each scoring afterwards if `score`.
    /// Returns, per client, `None` if it did not answer (or was not
    /// addressed), else its score if it gave one.
    fn deliver(
        &mut self,
        round: usize,
        inbox: Vec<Option<A::Down>>,
        to: &[bool],
        score: bool,
    ) -> Vec<Option<Option<Score>>>;
}

/// Runs round `round` of a server method with `clients`, updating the
/// algorithm's `server` state and the protocol's `trackers`; returns the
/// round's record.
pub fn server_round<A: Algorithm, C: Clients<A>>(
    algo: &A,
    env: &Env,
    facts: &Facts,
    round: usize,
    server: &mut A::Server,
    trackers: &mut Trackers,
    clients: &mut C,
) -> RoundRecord {
    let started = Instant::now();
    let cfg = &facts.cfg;
    let n = cfg.clients;
    let regression = facts.regression;
    let ask = TrainAsk {
        round,
        participants: choose_participants(cfg, round),
        before: cfg.eval.when == EvalWhen::BeforeAndAfter,
        after: algo.eval_point() == EvalPoint::AfterTraining,
        origin: wants_origins(cfg),
    };
    let replies = clients.train(&ask);

    let mut uploads = Vec::new();
    let mut before = Scores::default();
    let mut after = Scores::default();
    let mut answered = vec![false; n];
    for (i, reply) in replies.into_iter().enumerate().take(n) {
        let Some(r) = reply else { continue };
        answered[i] = true;
        if let Some(mut u) = r.upload {
            // An upload is its sender's, whatever it says.
            u.client = i;
            uploads.push(u);
        }
        // Scores only where asked, and only of benign clients (a
        // simulation's attackers are not scored), each checked.
        let benign = facts.benign.binary_search(&i).is_ok();
        for (wanted, score, into) in [
            (ask.before, r.before, &mut before),
            (ask.after, r.after, &mut after),
        ] {
            if let Some(s) = score.filter(|_| wanted && benign)
                && let Err(why) = into.admit(i, s, regression)
            {
                tracing::warn!(client = i, round, "score refused ({why})");
            }
        }
    }
    let screened = screen(algo, env, cfg, round, &ask.participants, uploads);
    let outcome = server_outcome(algo, env, server, round, &screened.sound);
    let bytes_down = outcome.downloads.iter().map(|(_, d)| d.bytes()).sum();
    let mut inbox: Vec<Option<A::Down>> = (0..n).map(|_| None).collect();
    for (i, d) in outcome.downloads {
        if let Some(slot) = inbox.get_mut(i) {
            *slot = Some(d);
        }
    }
    let score_after = algo.eval_point() == EvalPoint::AfterReceive;
    let received = clients.deliver(round, inbox, &answered, score_after);
    let mut absent = Vec::new();
    for i in 0..n {
        match received.get(i) {
            Some(Some(score)) => {
                let benign = facts.benign.binary_search(&i).is_ok();
                if let Some(s) = score.filter(|_| score_after && benign)
                    && let Err(why) = after.admit(i, s, regression)
                {
                    tracing::warn!(client = i, round, "score refused ({why})");
                }
            }
            _ => absent.push(i),
        }
    }
    let books = RoundBooks {
        round,
        started,
        participants: ask.participants,
        absent,
        losses: &screened.losses,
        rejected: screened.rejected,
        bytes_up: screened.bytes_up,
        bytes_down,
        graph: &outcome.graph,
        layers: &outcome.layers,
        selection: None,
        before: ask.before.then_some(before),
        after,
    };
    close_round(facts, trackers, books)
}
