//! One round, written once for every runtime.
//!
//! A server method's round: the simulator (clients in memory) and
//! `fedweave serve` (clients over gRPC) differ only in the [`Clients`] they
//! hand to [`server_round`]. The round
//! chooses the participants, asks every client to start the round (train
//! where chosen, score where the protocol asks), admits what comes back
//! with the shared checks of [`crate::checks`] (uploads only from
//! participants, once, sound; scores only where asked, in range), screens
//! the uploads (the algorithm's check and the robust aggregator), lets the
//! algorithm aggregate, delivers each client's download, admits the scores
//! after receiving, and closes the books. Attacks and batched training are
//! the simulator's own: its [`Clients`] trains and wraps the uploads before
//! they reach this round.
//!
//! A peer-to-peer method's round: the simulator (every client in memory)
//! and `fedweave peer` (one client per process, the others over gRPC)
//! differ only in the [`HostedPeers`] they hand to [`peer_round`]. The round
//! chooses the participants, scores the hosted clients where the protocol
//! asks, trains the hosted participants, screens their uploads with the
//! same checks as a server's, publishes the sound ones, and runs each
//! publishing client's `peer_step` (its own choice of collaborators)
//! through whatever carries the others' messages.

use crate::config::EvalWhen;
use crate::protocol::{Facts, Score, Trackers};
use crate::round::{
    RoundBooks, Scores, Screened, Upload, choose_participants, close_round, screen, server_outcome,
    wants_origins,
};
use crate::runtime::selection_cx;
use crate::setup::Setup;
use fedweave_algos::{Algorithm, Env, EvalPoint, Message, PeerNet, PeerStep};
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
        before: cfg.eval.when == EvalWhen::BeforeAndAfter && algo.scores_before_training(),
        after: algo.eval_point() == EvalPoint::AfterTraining,
        origin: wants_origins(cfg),
    };
    let replies = clients.train(&ask);
    let trained = Instant::now();

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
    let checked = Instant::now();
    let outcome = server_outcome(algo, env, server, round, &screened.sound);
    let aggregated = Instant::now();
    let bytes_down = outcome.downloads.iter().map(|(_, d)| d.bytes()).sum();
    let mut inbox: Vec<Option<A::Down>> = (0..n).map(|_| None).collect();
    for (i, d) in outcome.downloads {
        if let Some(slot) = inbox.get_mut(i) {
            *slot = Some(d);
        }
    }
    let score_after = algo.eval_point() == EvalPoint::AfterReceive;
    let received = clients.deliver(round, inbox, &answered, score_after);
    // Where a round's time goes (`-vv`): what a speed question asks first.
    tracing::debug!(
        round,
        train_s = (trained - started).as_secs_f64(),
        screen_s = (checked - trained).as_secs_f64(),
        server_s = (aggregated - checked).as_secs_f64(),
        deliver_s = aggregated.elapsed().as_secs_f64(),
        "round phases"
    );
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

/// A hosted client's peer step, as [`HostedPeers::exchange`] runs it: client
/// `i` from its `state`, fetching through the net; `None` when the client
/// does not choose this round (an attacker under `attack.run_selection =
/// false`).
pub type StepFn<'a, A> = dyn Fn(usize, &mut <A as Algorithm>::Client, &dyn PeerNet<<A as Algorithm>::Up>) -> Option<PeerStep>
    + Sync
    + 'a;

/// The clients of a peer-to-peer method that one runtime hosts: all of
/// them (the simulator) or one (`fedweave peer`).
pub trait HostedPeers<A: Algorithm> {
    /// Scores every hosted benign client on the model it holds now
    /// (unchecked: the round checks them).
    fn scores(&mut self) -> Vec<(usize, Score)>;

    /// Trains the hosted clients among round `round`'s `participants`
    /// from their states; `origin`: each reports where its training
    /// started. Returns their uploads.
    fn train(&mut self, round: usize, participants: &[usize], origin: bool) -> Vec<Upload<A::Up>>;

    /// Publishes the hosted clients' `sound` messages of round `round`,
    /// learns which other `participants` published, and runs `step` for
    /// every hosted client that published, through a [`PeerNet`] serving
    /// the published messages (each checked on arrival).
    fn exchange(
        &mut self,
        round: usize,
        participants: &[usize],
        sound: Vec<(usize, A::Up)>,
        step: &StepFn<'_, A>,
    ) -> Exchange;
}

/// What the exchange of a peer-to-peer round did for the hosted clients.
#[derive(Debug, Default)]
pub struct Exchange {
    /// The steps of the hosted clients that chose (ascending).
    pub steps: Vec<(usize, PeerStep)>,
    /// Participants not reached within the round's deadline (absent this
    /// round for the hosted clients).
    pub absent: Vec<usize>,
    /// Messages the hosted clients fetched from other clients.
    pub transfers: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// What a peer-to-peer round produced for the hosted clients.
pub struct PeerOutcome {
    /// The round's participants.
    pub participants: Vec<usize>,
    /// Hosted clients' checked scores before training
    /// (`eval.when = "before_and_after"`).
    pub before: Option<Scores>,
    /// Hosted clients' checked scores at the algorithm's point.
    pub after: Scores,
    /// Training losses of the hosted sound uploads.
    pub losses: Vec<f64>,
    /// Hosted clients whose upload was rejected.
    pub rejected: Vec<usize>,
    /// Hosted clients that published a sound message.
    pub published: Vec<usize>,
    /// The exchange.
    pub exchange: Exchange,
}

/// Runs round `round` of a peer-to-peer method for the clients `peers`
/// hosts; the runtime keeps the books (the simulator assembles the whole
/// graph, a peer its own row).
pub(crate) fn peer_round<A: Algorithm, P: HostedPeers<A>>(
    algo: &A,
    setup: &Setup,
    round: usize,
    peers: &mut P,
) -> PeerOutcome {
    let cfg = &setup.cfg;
    let env = setup.env();
    let participants = choose_participants(cfg, round);
    // Every score passes the same check, wherever it was computed.
    let checked = |scores: Vec<(usize, Score)>| {
        let (clients, scores): (Vec<usize>, Vec<Score>) = scores.into_iter().unzip();
        Scores::checked(&clients, scores, setup.regression, round)
    };
    let before = (cfg.eval.when == EvalWhen::BeforeAndAfter && algo.scores_before_training())
        .then(|| checked(peers.scores()));
    let uploads = peers.train(round, &participants, wants_origins(cfg));
    let Screened {
        sound,
        losses,
        rejected,
        ..
    } = screen(algo, &env, cfg, round, &participants, uploads);
    let mut after = Scores::default();
    if algo.eval_point() == EvalPoint::AfterTraining {
        after = checked(peers.scores());
    }
    let published = sound.iter().map(|(i, _)| *i).collect();
    // Attackers choose collaborators only where the attack says so.
    let chooses = |i: usize| cfg.attack.run_selection || !setup.is_malicious[i];
    let step = |i: usize, state: &mut A::Client, net: &dyn PeerNet<A::Up>| {
        chooses(i).then(|| {
            let mut cx = selection_cx(setup.client_data(i), cfg.seed, round, i);
            algo.peer_step(&setup.client_env(i), &mut cx, state, net)
        })
    };
    let exchange = peers.exchange(round, &participants, sound, &step);
    if algo.eval_point() == EvalPoint::AfterReceive {
        after = checked(peers.scores());
    }
    PeerOutcome {
        participants,
        before,
        after,
        losses,
        rejected,
        published,
        exchange,
    }
}
