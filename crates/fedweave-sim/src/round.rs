//! One simulated round: local training in parallel, attacks on the
//! uploads, the server's check of what arrived, graph inference (by the
//! server, or by each peer), delivery, and evaluation at the algorithm's
//! point.
//!
//! Partial participation, the same for every algorithm: a client that does
//! not take part in round t does not train and uploads nothing; it still
//! receives whatever the algorithm addresses to it (FedAvg's global model
//! goes to everyone; graph methods answer only the participants, so an
//! absent client keeps its model and gets an identity row); and it is
//! scored every round on its current personalised model, like everyone.

use crate::ExperimentConfig;
use crate::checks::{admit_download, check_loss, check_origin, check_score};
use crate::driver::{
    Clients, Exchange, HostedPeers, StepFn, TrainAsk, TrainReply, peer_round, server_round,
};
use crate::models::{Kept, Stash};
use crate::peer::{SharedMemoryNet, assemble};
use crate::protocol::{Facts, Score, Trackers, evaluate_clients, fill_means, participant_accuracy};
use crate::setup::Setup;
use fedweave_algos::attack::{AttackKind, poison};
use fedweave_algos::batching::TrainBatch;
use fedweave_algos::robust::{AggregatorConfig, AggregatorKind};
use fedweave_algos::{Algorithm, ClientCx, ClientData, Env, Message, RoundOutcome, Topology};
use fedweave_core::vecmath::mean;
use fedweave_core::{CollaborationGraph, Purpose, rng_stream};
use fedweave_records::{RoundRecord, SelectionStats};
use rand::seq::index::sample;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// Everything that changes from round to round: what a checkpoint holds.
/// A network server holds no client states (`C = ()`, none stored): the
/// clients keep and checkpoint their own.
#[derive(Serialize, Deserialize)]
pub struct RunState<S, C> {
    /// Rounds completed.
    pub round: usize,
    /// The algorithm's server state.
    pub server: S,
    /// Every client's state.
    pub clients: Vec<C>,
    /// The evaluation protocol's trackers.
    pub trackers: Trackers,
}

/// One participant's result: its id, upload, training loss, and (under the
/// `inv_grad` attack or norm clipping) the model its training started from.
pub struct Upload<U> {
    /// The client.
    pub client: usize,
    /// Its message.
    pub up: U,
    /// Its mean training loss.
    pub loss: f64,
    /// Where its training started, when asked for.
    pub origin: Option<Vec<f32>>,
}

/// Client side of a round: participant `client` trains from `state` on its
/// `data` with its own keyed batch stream, and returns its upload.
#[allow(clippy::too_many_arguments)]
pub fn train_client<A: Algorithm>(
    algo: &A,
    env: &Env,
    data: ClientData,
    seed: u64,
    round: usize,
    client: usize,
    state: &mut A::Client,
    want_origin: bool,
    batch: Option<&TrainBatch>,
) -> Upload<A::Up> {
    let mut cx = ClientCx {
        client,
        round,
        data,
        rng: rng_stream(seed, round as u64, client as u64, Purpose::Batches),
        origin: want_origin.then_some(None),
        batch,
    };
    let t = algo.local_round(env, &mut cx, state);
    Upload {
        client,
        up: t.up,
        loss: t.train_loss,
        origin: cx.origin.flatten(),
    }
}

/// A group's uploads and its batch's (kernel calls, client calls).
type GroupTrained<U> = (Vec<Upload<U>>, (usize, usize));

/// Trains one group of participants, each `local_round` on a thread of its
/// own so that their plain training calls can meet in one [`TrainBatch`].
/// Returns the uploads (in the group's order) and the batch's (kernel
/// calls, client trainings they held).
fn train_batched<C: Send, U: Send>(
    setup: &Setup,
    group: Vec<(usize, &mut C)>,
    train: &(impl Fn(usize, &mut C, Option<&TrainBatch>) -> Upload<U> + Sync),
) -> GroupTrained<U> {
    let spec = &setup.spec;
    let members = group.iter().map(|(i, _)| (*i, setup.client_data(*i).train));
    let batch = TrainBatch::new(spec, spec.device(), members)
        .expect("`device.batch_clients` is checked against the model at setup");
    let batch = &batch;
    std::thread::scope(|s| {
        let handles: Vec<_> = group
            .into_iter()
            .map(|(i, client)| {
                s.spawn(move || {
                    let _seat = batch.seat();
                    train(i, client, Some(batch))
                })
            })
            .collect();
        let uploads = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect();
        (uploads, batch.counts())
    })
}

/// The uploads the server keeps after checking them.
pub struct Screened<U> {
    /// Sound uploads, ascending by client.
    pub sound: Vec<(usize, U)>,
    /// Training losses of the sound uploads.
    pub losses: Vec<f64>,
    /// Clients whose upload was rejected (malformed, or dropped by the
    /// robust aggregator), sorted.
    pub rejected: Vec<usize>,
    /// Bytes of the sound uploads.
    pub bytes_up: u64,
}

/// Server side: checks every upload with the shared checks of
/// [`crate::checks`] — only from a participant, once; a finite training
/// loss; the algorithm's own check (shape, finiteness); a sound origin
/// where norm clipping needs one — (a bad one is rejected and its client
/// sits the round out) and, for server methods with an `[aggregator]`
/// defence, runs it. `participants` are the round's (sorted).
pub fn screen<A: Algorithm>(
    algo: &A,
    env: &Env,
    cfg: &ExperimentConfig,
    round: usize,
    participants: &[usize],
    mut uploads: Vec<Upload<A::Up>>,
) -> Screened<A::Up> {
    let mut rejected = Vec::new();
    let mut sound = Vec::with_capacity(uploads.len());
    let mut starts = Vec::with_capacity(uploads.len());
    let mut losses = Vec::with_capacity(uploads.len());
    uploads.sort_by_key(|u| u.client);
    let want_origin = wants_origins(cfg);
    let mut last = None;
    for Upload {
        client: i,
        up,
        loss,
        origin,
    } in uploads
    {
        let verdict = if participants.binary_search(&i).is_err() {
            Err("the client was not asked to train".to_string())
        } else if last == Some(i) {
            Err("a second upload in one round".to_string())
        } else {
            check_loss(loss)
                .and_then(|()| algo.check_upload(env, &up))
                .and_then(|()| check_origin(&up, origin.as_deref(), want_origin, env.init.len()))
        };
        last = Some(i);
        match verdict {
            Ok(()) => {
                sound.push((i, up));
                starts.push(origin);
                losses.push(loss);
            }
            Err(why) => {
                tracing::warn!(
                    client = i,
                    round,
                    "upload rejected ({why}); client sits this round out"
                );
                rejected.push(i);
            }
        }
    }
    rejected.dedup();
    let bytes_up: u64 = sound.iter().map(|(_, u)| u.bytes()).sum();
    if algo.topology() == Topology::Server && !cfg.aggregator.is_mean() {
        sound = defend(&cfg.aggregator, sound, &starts, env, &mut rejected);
    }
    Screened {
        sound,
        losses,
        rejected,
        bytes_up,
    }
}

/// Server side: the round's graph and downloads from the sound uploads
/// (with none, every client keeps its model).
pub fn server_outcome<A: Algorithm>(
    algo: &A,
    env: &Env,
    server: &mut A::Server,
    round: usize,
    sound: &[(usize, A::Up)],
) -> RoundOutcome<A::Down> {
    if sound.is_empty() {
        // With no sound upload there is nothing to infer a graph from:
        // every client keeps its model this round.
        RoundOutcome::keep_all(env.clients())
    } else {
        algo.aggregate(env, server, round, sound)
    }
}

/// Scores of some clients (ascending ids, benign only) in one round.
#[derive(Clone, Debug, Default)]
pub struct Scores {
    /// The clients scored.
    pub clients: Vec<usize>,
    /// Their scores, in the same order.
    pub scores: Vec<Score>,
}

impl Scores {
    /// Adds client `client`'s score if it passes [`check_score`] (finite,
    /// in range); a refused score leaves the client unscored this round.
    pub fn admit(&mut self, client: usize, score: Score, regression: bool) -> Result<(), String> {
        check_score(&score, regression)?;
        self.clients.push(client);
        self.scores.push(score);
        Ok(())
    }

    /// The scores of `clients` (in their order) that pass [`check_score`];
    /// refusals are logged.
    pub fn checked(clients: &[usize], scores: Vec<Score>, regression: bool, round: usize) -> Self {
        let mut out = Self::default();
        for (&i, s) in clients.iter().zip(scores) {
            if let Err(why) = out.admit(i, s, regression) {
                tracing::warn!(client = i, round, "score refused ({why})");
            }
        }
        out
    }
}

/// What a round produced, for the books.
pub struct RoundBooks<'a> {
    /// The round, from 1.
    pub round: usize,
    /// When it began.
    pub started: Instant,
    /// Who was chosen to take part.
    pub participants: Vec<usize>,
    /// Absent clients (network runtime: did not answer in time).
    pub absent: Vec<usize>,
    /// The screening's result, less the sound uploads.
    pub losses: &'a [f64],
    /// Rejected clients, sorted.
    pub rejected: Vec<usize>,
    /// Bytes uploaded (peer-to-peer: moved between peers).
    pub bytes_up: u64,
    /// Bytes downloaded.
    pub bytes_down: u64,
    /// The round's graph.
    pub graph: &'a CollaborationGraph,
    /// Per-layer graphs.
    pub layers: &'a [(String, CollaborationGraph)],
    /// Peer selection statistics.
    pub selection: Option<SelectionStats>,
    /// Scores before training (`eval.when = "before_and_after"`).
    pub before: Option<Scores>,
    /// Scores at the algorithm's point.
    pub after: Scores,
}

/// Records round `round`'s checked scores in the trackers: those before
/// training, then those at the algorithm's point.
pub fn track(trackers: &mut Trackers, round: usize, before: Option<&Scores>, after: &Scores) {
    if let Some(b) = before {
        trackers.update(round, &b.clients, &b.scores);
    }
    trackers.update(round, &after.clients, &after.scores);
}

/// Server side: records the round's scores in the trackers (before, then
/// after) and builds its record.
pub fn close_round(facts: &Facts, trackers: &mut Trackers, books: RoundBooks) -> RoundRecord {
    let round = books.round;
    track(trackers, round, books.before.as_ref(), &books.after);
    let mut record = RoundRecord {
        round,
        mean_train_loss: mean(books.losses),
        seconds: books.started.elapsed().as_secs_f64(),
        bytes_up: books.bytes_up,
        bytes_down: books.bytes_down,
        participants: books.participants,
        absent: books.absent,
        rejected: books.rejected,
        graph: books.graph.to_rows(),
        graph_layers: books
            .layers
            .iter()
            .map(|(n, g)| (n.clone(), g.to_rows()))
            .collect(),
        graph_sparsity: books.graph.sparsity(),
        graph_symmetry: books.graph.symmetry(),
        selection: books.selection,
        ..Default::default()
    };
    fill_means(&mut record, facts.regression, &books.after.scores);
    if let Some(before) = books.before.filter(|_| !facts.regression) {
        let mut b = RoundRecord::default();
        fill_means(&mut b, false, &before.scores);
        record.mean_val_acc_before = b.mean_val_acc;
        record.mean_test_acc_before = b.mean_test_acc;
    }
    if !facts.regression {
        record.participant_test_acc = participant_accuracy(
            facts,
            &books.after.clients,
            &record.participants,
            &books.after.scores,
        );
    }
    record
}

/// Runs round `state.round + 1` and returns its record and the models
/// the books keep from it (see [`crate::models`]): a server method's round
/// is [`server_round`] with the clients in memory; a peer-to-peer
/// method's, the peers' exchange through shared memory.
pub(crate) fn run_round<A: Algorithm>(
    algo: &A,
    setup: &Setup,
    facts: &Facts,
    state: &mut RunState<A::Server, A::Client>,
    pool: &rayon::ThreadPool,
) -> (RoundRecord, Kept) {
    let round = state.round + 1;
    let mut stash = Stash::new(&state.trackers, round == facts.cfg.rounds);
    let record = if algo.topology() == Topology::PeerToPeer {
        memory_peer_round(algo, setup, facts, round, state, pool, &mut stash)
    } else {
        let env = setup.env();
        let mut clients = MemoryClients {
            algo,
            setup,
            states: &mut state.clients,
            pool,
            stash: &mut stash,
        };
        server_round(
            algo,
            &env,
            facts,
            round,
            &mut state.server,
            &mut state.trackers,
            &mut clients,
        )
    };
    state.round = round;
    (record, stash.resolve(&state.trackers, round))
}

/// Trains round `round`'s participants in memory, one task per
/// participant, or one task per group of `batch_clients` participants
/// whose plain training runs batched; then model poisoning wraps the
/// malicious clients' uploads (the model, their first vector).
fn train_in_memory<A: Algorithm>(
    algo: &A,
    setup: &Setup,
    round: usize,
    participants: &[usize],
    clients: &mut [A::Client],
    pool: &rayon::ThreadPool,
) -> Vec<Upload<A::Up>> {
    let cfg = &setup.cfg;
    let mut taking_part = vec![false; cfg.clients];
    participants.iter().for_each(|&i| taking_part[i] = true);
    let attack = cfg.attack.kind;
    let inv_grad = |i: usize| attack == AttackKind::InvGrad && setup.is_malicious[i];
    let wants_origin = |i: usize| inv_grad(i) || wants_origins(cfg);
    crate::progress::round_started(round, participants.len());
    let train = |i: usize, client: &mut A::Client, batch: Option<&TrainBatch>| {
        let data = setup.client_data(i);
        let env = setup.client_env(i);
        let up = train_client(
            algo,
            &env,
            data,
            cfg.seed,
            round,
            i,
            client,
            wants_origin(i),
            batch,
        );
        crate::progress::client_trained();
        up
    };
    let taking: Vec<(usize, &mut A::Client)> = clients
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| taking_part[*i])
        .collect();
    let mut uploads: Vec<Upload<A::Up>> = match cfg.device.batch_clients {
        0 => pool.install(|| {
            taking
                .into_par_iter()
                .map(|(i, client)| train(i, client, None))
                .collect()
        }),
        k => {
            let mut groups: Vec<Vec<(usize, &mut A::Client)>> = Vec::new();
            for member in taking {
                match groups.last_mut() {
                    Some(g) if g.len() < k => g.push(member),
                    _ => groups.push(vec![member]),
                }
            }
            let trained: Vec<GroupTrained<A::Up>> = pool.install(|| {
                groups
                    .into_par_iter()
                    .map(|group| train_batched(setup, group, &train))
                    .collect()
            });
            let (kernels, calls) = trained
                .iter()
                .fold((0, 0), |(k, c), (_, (dk, dc))| (k + dk, c + dc));
            tracing::debug!(round, kernels, calls, "batched training calls");
            trained.into_iter().flat_map(|(u, _)| u).collect()
        }
    };
    if attack.poisons_models() {
        for u in uploads.iter_mut().filter(|u| setup.is_malicious[u.client]) {
            if let Some(model) = u.up.vectors_mut().into_iter().next()
                && !model.is_empty()
            {
                let start = u.origin.as_deref().unwrap_or(&setup.init);
                let (kind, uniform) = (attack, cfg.attack.uniform);
                poison(kind, uniform, model, start, cfg.seed, round, u.client);
            }
        }
    }
    uploads
}

/// The simulation's clients: every state in memory, trained in parallel
/// (batched where configured) with the attacks wrapped around their
/// uploads; every benign client scores where asked; no one is ever absent.
struct MemoryClients<'a, A: Algorithm> {
    algo: &'a A,
    setup: &'a Setup,
    states: &'a mut Vec<A::Client>,
    pool: &'a rayon::ThreadPool,
    /// Where the scored models that may be kept go.
    stash: &'a mut Stash,
}

impl<A: Algorithm> MemoryClients<'_, A> {
    /// Every benign client's score, `None` for the others.
    fn scores(&mut self) -> Vec<Option<Score>> {
        let mut out = vec![None; self.states.len()];
        for (i, s) in scores_stashed(self.algo, self.setup, self.states, self.pool, self.stash) {
            out[i] = Some(s);
        }
        out
    }
}

/// Scores every benign client in memory and offers the scored models to
/// `stash`.
fn scores_stashed<A: Algorithm>(
    algo: &A,
    setup: &Setup,
    states: &[A::Client],
    pool: &rayon::ThreadPool,
    stash: &mut Stash,
) -> Vec<(usize, Score)> {
    let scores = evaluate_clients(algo, setup, states, pool);
    let scored: Vec<(usize, Score)> = setup.benign.iter().copied().zip(scores).collect();
    for (i, s) in &scored {
        stash.offer(algo, *i, s, &states[*i]);
    }
    scored
}

impl<A: Algorithm> Clients<A> for MemoryClients<'_, A> {
    fn train(&mut self, ask: &TrainAsk) -> Vec<Option<TrainReply<A::Up>>> {
        let n = self.states.len();
        // pFedGraph's protocol also scores the models held before
        // training (the received mixes).
        let mut before = if ask.before {
            self.scores()
        } else {
            vec![None; n]
        };
        let uploads = train_in_memory(
            self.algo,
            self.setup,
            ask.round,
            &ask.participants,
            self.states,
            self.pool,
        );
        let mut after = if ask.after {
            self.scores()
        } else {
            vec![None; n]
        };
        let mut replies: Vec<Option<TrainReply<A::Up>>> = (0..n)
            .map(|i| {
                Some(TrainReply {
                    upload: None,
                    before: before[i].take(),
                    after: after[i].take(),
                })
            })
            .collect();
        for u in uploads {
            let i = u.client;
            if let Some(Some(r)) = replies.get_mut(i) {
                r.upload = Some(u);
            }
        }
        replies
    }

    fn deliver(
        &mut self,
        round: usize,
        inbox: Vec<Option<A::Down>>,
        _to: &[bool],
        score: bool,
    ) -> Vec<Option<Option<Score>>> {
        deliver(self.algo, self.setup, round, self.states, inbox, self.pool);
        if score {
            self.scores().into_iter().map(Some).collect()
        } else {
            vec![Some(None); self.states.len()]
        }
    }
}

/// The simulation's peers: every client in memory, trained as
/// [`MemoryClients`] trains them, publishing through shared memory, their
/// peer steps run in parallel (each owns only its state).
struct MemoryPeers<'a, A: Algorithm> {
    algo: &'a A,
    setup: &'a Setup,
    states: &'a mut Vec<A::Client>,
    pool: &'a rayon::ThreadPool,
    /// Where the scored models that may be kept go.
    stash: &'a mut Stash,
}

impl<A: Algorithm> HostedPeers<A> for MemoryPeers<'_, A> {
    fn scores(&mut self) -> Vec<(usize, Score)> {
        scores_stashed(self.algo, self.setup, self.states, self.pool, self.stash)
    }

    fn train(&mut self, round: usize, participants: &[usize], _: bool) -> Vec<Upload<A::Up>> {
        // Origins are asked for by the same rule inside.
        train_in_memory(
            self.algo,
            self.setup,
            round,
            participants,
            self.states,
            self.pool,
        )
    }

    fn exchange(
        &mut self,
        _round: usize,
        _participants: &[usize],
        sound: Vec<(usize, A::Up)>,
        step: &StepFn<'_, A>,
    ) -> Exchange {
        let net = SharedMemoryNet::new(self.states.len(), &sound);
        let steps = self.pool.install(|| {
            self.states
                .par_iter_mut()
                .enumerate()
                .filter(|(i, _)| net.has_published(*i))
                .filter_map(|(i, state)| step(i, state, &net).map(|s| (i, s)))
                .collect()
        });
        Exchange {
            steps,
            absent: Vec::new(),
            transfers: net.transfers(),
            bytes: net.bytes(),
        }
    }
}

/// A peer-to-peer method's round in memory: [`peer_round`] with every
/// client hosted here, and the whole graph assembled from their rows.
fn memory_peer_round<A: Algorithm>(
    algo: &A,
    setup: &Setup,
    facts: &Facts,
    round: usize,
    state: &mut RunState<A::Server, A::Client>,
    pool: &rayon::ThreadPool,
    stash: &mut Stash,
) -> RoundRecord {
    let started = Instant::now();
    let mut peers = MemoryPeers {
        algo,
        setup,
        states: &mut state.clients,
        pool,
        stash,
    };
    let outcome = peer_round(algo, setup, round, &mut peers);
    let ex = &outcome.exchange;
    let (graph, stats) = assemble(setup.cfg.clients, &ex.steps, ex.transfers);
    let books = RoundBooks {
        round,
        started,
        participants: outcome.participants,
        absent: Vec::new(),
        losses: &outcome.losses,
        rejected: outcome.rejected,
        // Every transfer leaves one peer and reaches another.
        bytes_up: ex.bytes,
        bytes_down: ex.bytes,
        graph: &graph,
        layers: &[],
        selection: Some(stats),
        before: outcome.before,
        after: outcome.after,
    };
    close_round(facts, &mut state.trackers, books)
}

/// Whether every participant reports where its training started (norm
/// clipping measures updates from there).
pub fn wants_origins(cfg: &ExperimentConfig) -> bool {
    cfg.aggregator.kind == AggregatorKind::NormClip
}

/// Runs the `[aggregator]` defence on the sound uploads' models; uploads
/// Krum drops join `rejected` (sorted).
fn defend<U: Message>(
    aggregator: &AggregatorConfig,
    mut sound: Vec<(usize, U)>,
    starts: &[Option<Vec<f32>>],
    env: &Env,
    rejected: &mut Vec<usize>,
) -> Vec<(usize, U)> {
    let starts: Vec<&[f32]> = starts
        .iter()
        .map(|s| s.as_deref().unwrap_or(env.init))
        .collect();
    let mut models: Vec<&mut [f32]> = sound
        .iter_mut()
        .filter_map(|(_, u)| u.vectors_mut().into_iter().next())
        .collect();
    if models.len() != starts.len() || models.iter().any(|m| m.len() != models[0].len()) {
        // Uploads without one common model vector (prototype-only methods):
        // nothing a model-space defence can act on.
        return sound;
    }
    let keep = aggregator.apply(env.kernels, &mut models, &starts);
    if keep.len() == sound.len() {
        return sound;
    }
    let mut kept = Vec::with_capacity(keep.len());
    for (k, upload) in sound.into_iter().enumerate() {
        if keep.binary_search(&k).is_ok() {
            kept.push(upload);
        } else {
            tracing::debug!(client = upload.0, "upload dropped by the robust aggregator");
            rejected.push(upload.0);
        }
    }
    rejected.sort_unstable();
    kept
}

/// Applies each download of round `round` (`inbox[i]` to client i) that
/// passes the client's check, in parallel.
fn deliver<A: Algorithm>(
    algo: &A,
    setup: &Setup,
    round: usize,
    clients: &mut [A::Client],
    mut inbox: Vec<Option<A::Down>>,
    pool: &rayon::ThreadPool,
) {
    let env = setup.env();
    pool.install(|| {
        clients
            .par_iter_mut()
            .zip(inbox.par_iter_mut())
            .enumerate()
            .for_each(|(i, (client, d))| {
                if let Some(d) = d
                    .take()
                    .and_then(|d| admit_download(algo, &env, i, round, d))
                {
                    algo.receive(&env, client, d);
                }
            });
    });
}

/// The round's participants: everyone, or a seeded subset of
/// max(1, round(participation·N)) clients, sorted.
pub fn choose_participants(cfg: &ExperimentConfig, round: usize) -> Vec<usize> {
    if cfg.participation >= 1.0 {
        return (0..cfg.clients).collect();
    }
    let k = ((cfg.participation * cfg.clients as f64).round() as usize).clamp(1, cfg.clients);
    let mut rng = rng_stream(cfg.seed, round as u64, u64::MAX, Purpose::Participation);
    let mut chosen = sample(&mut rng, cfg.clients, k).into_vec();
    chosen.sort_unstable();
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ExperimentConfig;
    use fedweave_algos::Visitor;

    /// Runs three rounds at 50 % participation and checks the semantics in
    /// this module's doc for one algorithm.
    struct AbsentClients<'a> {
        setup: &'a Setup,
    }

    impl Visitor for AbsentClients<'_> {
        type Output = ();

        fn visit<A: Algorithm>(self, algo: A, _: toml::Table) {
            let setup = self.setup;
            let env = setup.env();
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .build()
                .unwrap();
            let n = setup.cfg.clients;
            let mut state = RunState {
                round: 0,
                server: algo.init_server(&env),
                clients: (0..n).map(|i| algo.init_client(&env, i)).collect(),
                trackers: Trackers::new(n),
            };
            // A client's whole state, not only its scored model: Ditto's
            // or FedALA's download replaces the global copy they keep
            // beside the model they are scored on.
            let held = |s: &RunState<A::Server, A::Client>| -> Vec<String> {
                s.clients
                    .iter()
                    .map(|c| serde_json::to_string(c).unwrap())
                    .collect()
            };
            for _ in 0..3 {
                let before = held(&state);
                let (record, _) = run_round(&algo, setup, &setup.facts(), &mut state, &pool);
                let after = held(&state);
                assert_eq!(record.participants.len(), n / 2, "{}", algo.name());
                let received = |i: usize| {
                    let mut identity = vec![0.0; n];
                    identity[i] = 1.0;
                    record.graph[i] != identity
                };
                for i in (0..n).filter(|i| !record.participants.contains(i)) {
                    // An absent client never trains: its state changes only
                    // when the algorithm addresses it (FedAvg's broadcast),
                    // which its graph row then shows.
                    assert_eq!(
                        before[i] != after[i],
                        received(i),
                        "{}: absent client {i} in round {}",
                        algo.name(),
                        record.round
                    );
                }
                // Every benign client is scored every round, present or not.
                assert!(state.trackers.best.iter().all(|b| b.round >= 1));
            }
        }
    }

    #[test]
    fn absent_clients_hold_receive_and_are_scored_the_same_way_for_every_algorithm() {
        // `graph-rule` needs a rule installed: FedAvg's.
        fedweave_algos::graph_rule::install(Some(std::sync::Arc::new(
            fedweave_algos::graph_rule::SizeWeights,
        )));
        for info in fedweave_algos::catalogue() {
            let text = "seed = 4\nclients = 6\nparticipation = 0.5\n[data]\ndataset = \"digits\"\n[partition]\nkind = \"iid\"\n[model]\nkind = \"mlp\"\n[train]\nlocal_iterations = 2\n";
            let cfg = ExperimentConfig::from_toml_str(
                text,
                &[
                    format!("algorithm.name={}", info.name),
                    "algorithm.init_epochs=1".to_string(),
                ]
                .into_iter()
                .filter(|o| info.name == "dpfl" || !o.contains("init_epochs"))
                .collect::<Vec<_>>(),
            )
            .unwrap();
            let setup = Setup::load(&cfg).unwrap();
            let env = setup.env();
            fedweave_algos::dispatch(
                info.name,
                &cfg.algorithm_params(),
                &env,
                AbsentClients { setup: &setup },
            )
            .unwrap();
        }
    }

    /// Trains every client of round 1 one at a time and in groups of three
    /// through [`train_batched`], from the same states, and compares the
    /// uploads and states; returns the batches' (kernel calls, client calls).
    struct BatchedLikeOneAtATime<'a> {
        setup: &'a Setup,
    }

    impl Visitor for BatchedLikeOneAtATime<'_> {
        type Output = (usize, usize);

        fn visit<A: Algorithm>(self, algo: A, _: toml::Table) -> (usize, usize) {
            let setup = self.setup;
            let env = setup.env();
            let n = setup.cfg.clients;
            let init = || -> Vec<A::Client> { (0..n).map(|i| algo.init_client(&env, i)).collect() };
            let train = |i: usize, client: &mut A::Client, batch: Option<&TrainBatch>| {
                let env = setup.client_env(i);
                train_client(
                    &algo,
                    &env,
                    setup.client_data(i),
                    4,
                    1,
                    i,
                    client,
                    false,
                    batch,
                )
            };
            let json = |uploads: &[Upload<A::Up>], states: &[A::Client]| {
                let ups: Vec<_> = uploads.iter().map(|u| (u.client, &u.up, u.loss)).collect();
                serde_json::to_value((ups, states)).unwrap()
            };
            let mut alone = init();
            let uploads: Vec<_> = alone
                .iter_mut()
                .enumerate()
                .map(|(i, c)| train(i, c, None))
                .collect();
            let expected = json(&uploads, &alone);
            let mut together = init();
            let mut uploads = Vec::new();
            let mut counts = (0, 0);
            let mut members = together.iter_mut().enumerate().peekable();
            while members.peek().is_some() {
                let group: Vec<_> = members.by_ref().take(3).collect();
                let (u, (k, c)) = train_batched(setup, group, &train);
                uploads.extend(u);
                counts = (counts.0 + k, counts.1 + c);
            }
            // The batched kernels round differently (not bit for bit).
            let worst = largest_difference(&json(&uploads, &together), &expected)
                .unwrap_or_else(|e| panic!("{}: {e}", algo.name()));
            assert!(worst < 1e-5, "{}: numbers differ by {worst:e}", algo.name());
            counts
        }
    }

    /// The largest difference between two JSON documents' numbers, relative
    /// to max(1, |number|); `Err` where their shapes or other values differ.
    fn largest_difference(a: &serde_json::Value, b: &serde_json::Value) -> Result<f64, String> {
        use serde_json::Value;
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => {
                let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
                Ok((x - y).abs() / x.abs().max(1.0))
            }
            (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
                .iter()
                .zip(y)
                .try_fold(0.0f64, |m, (x, y)| Ok(m.max(largest_difference(x, y)?))),
            (Value::Object(x), Value::Object(y)) if x.len() == y.len() => {
                x.iter().try_fold(0.0f64, |m, (k, v)| match y.get(k) {
                    Some(w) => Ok(m.max(largest_difference(v, w)?)),
                    None => Err(format!("key {k} missing")),
                })
            }
            _ if a == b => Ok(0.0),
            _ => Err(format!("{a} differs from {b}")),
        }
    }

    #[test]
    fn batched_clients_train_as_one_at_a_time_for_every_algorithm() {
        // `graph-rule` needs a rule installed: FedAvg's.
        fedweave_algos::graph_rule::install(Some(std::sync::Arc::new(
            fedweave_algos::graph_rule::SizeWeights,
        )));
        for info in fedweave_algos::catalogue() {
            let text = "seed = 4\nclients = 6\n[data]\ndataset = \"digits\"\n[partition]\nkind = \"dirichlet\"\nbeta = 0.5\n[model]\nkind = \"mlp\"\n[train]\nlocal_epochs = 1\nlocal_iterations = 0\nbatch_size = 16\nmomentum = 0.9\n[device]\nbatch_clients = 3\n";
            let mut overrides = vec![format!("algorithm.name={}", info.name)];
            if info.name == "dpfl" {
                overrides.push("algorithm.init_epochs=1".into());
            }
            let cfg = ExperimentConfig::from_toml_str(text, &overrides).unwrap();
            let setup = Setup::load(&cfg).unwrap();
            let env = setup.env();
            let (kernels, calls) = fedweave_algos::dispatch(
                info.name,
                &cfg.algorithm_params(),
                &env,
                BatchedLikeOneAtATime { setup: &setup },
            )
            .unwrap();
            assert!(kernels <= calls, "{}", info.name);
            // Methods whose first round is plain training on one model per
            // client batch all six clients, two groups of three: one kernel
            // call per group (Dirichlet sizes differ, epochs do not).
            if ["local", "fedavg", "fedavg-ft", "pfedgraph", "cfl"].contains(&info.name) {
                assert_eq!((kernels, calls), (2, 6), "{}", info.name);
            }
        }
    }
}
