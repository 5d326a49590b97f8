//! Plain local training of many clients in one set of kernels, without
//! touching the algorithms.
//!
//! A GPU is filled by one big model, not by one small client model; the
//! batched trainer ([`fedweave_nn::train_local_batched`]) trains K clients'
//! copies at once. The algorithms, however, train one client at a time
//! inside [`Algorithm::local_round`](crate::Algorithm::local_round). A
//! [`TrainBatch`] joins the two: the runtime runs a group of participants'
//! `local_round`s on threads of their own, each [`ClientCx`](crate::ClientCx)
//! holds the group's `TrainBatch`, and every *plain* training call (the task
//! loss alone: no extra terms, objective, frozen ranges, persistent
//! optimiser state or augmentation) waits there instead of training. When
//! every member still in the round is waiting, the last to arrive trains all
//! the waiting calls together and hands each its result. Any other training
//! call runs on its own thread as before.
//!
//! # Determinism
//!
//! A batch runs only when every member still in the round waits, so the
//! j-th batch holds exactly the j-th plain call of each member that makes
//! one: the grouping depends on the members and their code, never on
//! timing. Within a batch the calls are ordered by client, and calls with
//! different training settings (per-client step counts) go to separate
//! batched calls. The batched kernels agree with one-at-a-time training to
//! floating-point tolerance, not bit for bit, which is why batching is an
//! opt-in (`[device] batch_clients`).

use crate::contract::Model;
use fedweave_core::RngStream;
use fedweave_nn::{
    BatchedClient, BatchedTrainer, Device, LocalData, ModelSpec, NnError, TrainConfig, TrainStats,
};
use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// A group of clients whose plain training calls meet and run batched.
///
/// It is covariant in `'d` (the mutable part holds no borrowed data), so a
/// [`ClientCx`](crate::ClientCx) can hold it for any shorter lifetime.
pub struct TrainBatch<'d> {
    spec: &'d ModelSpec,
    device: &'d Device,
    /// Each member's training data, by client.
    data: BTreeMap<usize, LocalData<'d>>,
    inner: Mutex<Inner>,
    done: Condvar,
}

/// One waiting training call.
struct Call {
    params: Vec<f32>,
    buffers: Vec<f32>,
    rng: RngStream,
    cfg: TrainConfig,
}

/// What a waiting call gets back.
type Answer = Result<(Vec<f32>, Vec<f32>, RngStream, TrainStats), String>;

struct Inner {
    /// Members that have not left yet.
    active: usize,
    /// Calls waiting for the next batch, by member.
    waiting: BTreeMap<usize, Call>,
    /// Answers not yet collected, by member.
    answers: BTreeMap<usize, Answer>,
    /// Batched kernel calls run so far, and the client calls they held.
    kernel_calls: usize,
    client_calls: usize,
}

impl<'d> TrainBatch<'d> {
    /// A batch for the `members` (client, training data) training `spec` on
    /// `device`.
    ///
    /// # Errors
    ///
    /// [`NnError::NotBatched`] when the architecture has no batched
    /// formulation.
    pub fn new(
        spec: &'d ModelSpec,
        device: &'d Device,
        members: impl IntoIterator<Item = (usize, LocalData<'d>)>,
    ) -> Result<Self, NnError> {
        let data: BTreeMap<usize, LocalData<'d>> = members.into_iter().collect();
        BatchedTrainer::check(spec)?;
        Ok(Self {
            spec,
            device,
            inner: Mutex::new(Inner {
                active: data.len(),
                waiting: BTreeMap::new(),
                answers: BTreeMap::new(),
                kernel_calls: 0,
                client_calls: 0,
            }),
            data,
            done: Condvar::new(),
        })
    }

    /// Whether member `member`'s plain training call can wait here: it is a
    /// member and its data is a non-empty classification set without
    /// augmentation (the caller has checked that nothing else is attached
    /// to the call).
    pub fn takes(&self, member: usize) -> bool {
        self.data.get(&member).is_some_and(|data| {
            !data.is_empty() && !data.is_regression() && data.augment == fedweave_nn::Augment::None
        })
    }

    /// Member `member`'s plain training call on its own training data:
    /// waits for the batch, then returns the statistics, with `model`
    /// trained and `rng` advanced exactly as [`fedweave_nn::train_local`]
    /// would leave them.
    ///
    /// # Panics
    ///
    /// If `member` is not one (check [`takes`](Self::takes)), if the batched
    /// kernels fail on inputs `takes` accepted (a bug), or the member that
    /// ran the batch panicked.
    pub fn train(
        &self,
        member: usize,
        model: &mut Model,
        cfg: &TrainConfig,
        rng: &mut RngStream,
    ) -> TrainStats {
        assert!(
            self.takes(member),
            "client {member} cannot train in this batch"
        );
        let call = Call {
            params: std::mem::take(&mut model.params),
            buffers: std::mem::take(&mut model.buffers),
            rng: rng.clone(),
            cfg: cfg.clone(),
        };
        let mut inner = self.lock();
        let previous = inner.waiting.insert(member, call);
        assert!(previous.is_none(), "member {member} is already waiting");
        inner = self.run_when_all_wait(inner);
        let answer = loop {
            if let Some(answer) = inner.answers.remove(&member) {
                break answer;
            }
            inner = self
                .done
                .wait(inner)
                .unwrap_or_else(PoisonError::into_inner);
        };
        drop(inner);
        let (params, buffers, advanced, stats) =
            answer.unwrap_or_else(|e| panic!("batched training failed: {e}"));
        model.params = params;
        model.buffers = buffers;
        *rng = advanced;
        stats
    }

    /// A member's place in the group, given up when the returned guard is
    /// dropped (its `local_round` returned, or panicked): the others no
    /// longer wait for it.
    pub fn seat(&self) -> Seat<'_, 'd> {
        Seat(self)
    }

    fn leave(&self) {
        let mut inner = self.lock();
        inner.active -= 1;
        drop(self.run_when_all_wait(inner));
    }

    /// (batched kernel calls, client calls they trained) so far.
    pub fn counts(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.kernel_calls, inner.client_calls)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// If every active member waits, trains them all (without holding the
    /// lock: nobody can arrive meanwhile, since all are waiting) and wakes
    /// them.
    fn run_when_all_wait<'g>(&'g self, mut inner: MutexGuard<'g, Inner>) -> MutexGuard<'g, Inner> {
        if inner.waiting.is_empty() || inner.waiting.len() < inner.active {
            return inner;
        }
        let calls = std::mem::take(&mut inner.waiting);
        drop(inner);
        let members: Vec<usize> = calls.keys().copied().collect();
        // A panic in the kernels must still wake the waiting members.
        let (answers, kernels) =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run(calls)))
                .unwrap_or_else(|_| {
                    let failed = || Err("the batched kernels panicked".to_string());
                    (members.into_iter().map(|m| (m, failed())).collect(), 0)
                });
        let mut inner = self.lock();
        inner.kernel_calls += kernels;
        inner.client_calls += answers.len();
        inner.answers.extend(answers);
        self.done.notify_all();
        inner
    }

    /// Trains the calls, one batched kernel call per distinct setting.
    fn run(&self, calls: BTreeMap<usize, Call>) -> (Vec<(usize, Answer)>, usize) {
        let mut groups: Vec<(TrainConfig, Vec<(usize, Call)>)> = Vec::new();
        for (member, call) in calls {
            match groups.iter_mut().find(|(cfg, _)| *cfg == call.cfg) {
                Some((_, group)) => group.push((member, call)),
                None => groups.push((call.cfg.clone(), vec![(member, call)])),
            }
        }
        let kernels = groups.len();
        let mut answers = Vec::new();
        for (cfg, mut group) in groups {
            let mut clients: Vec<BatchedClient<RngStream>> = group
                .iter_mut()
                .map(|(m, c)| BatchedClient {
                    params: &mut c.params,
                    buffers: &mut c.buffers,
                    data: self.data[m],
                    rng: &mut c.rng,
                })
                .collect();
            let result =
                fedweave_nn::train_local_batched(self.spec, self.device, &mut clients, &cfg);
            drop(clients);
            match result {
                Ok(stats) => answers.extend(
                    group
                        .into_iter()
                        .zip(stats)
                        .map(|((m, c), s)| (m, Ok((c.params, c.buffers, c.rng, s)))),
                ),
                Err(e) => answers.extend(group.into_iter().map(|(m, _)| (m, Err(e.to_string())))),
            }
        }
        (answers, kernels)
    }
}

/// A member's place in a [`TrainBatch`]; dropping it leaves the group.
pub struct Seat<'b, 'd>(&'b TrainBatch<'d>);

impl Drop for Seat<'_, '_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Tiny;

    /// Client 0 trains twice (the second time with more steps), client 1
    /// once, client 2 never: the first batch holds 0 and 1, the second 0
    /// alone; each call ends where `train_local` ends.
    #[test]
    fn calls_meet_by_order_and_split_by_settings() {
        let tiny = Tiny::new();
        let env = tiny.env();
        let longer = TrainConfig {
            iterations: 5,
            ..tiny.train.clone()
        };
        let members = (0..3).map(|i| (i, tiny.cx(i, 1).data.train));
        let batch = TrainBatch::new(&tiny.spec, tiny.spec.device(), members).unwrap();
        let plan: [&[&TrainConfig]; 3] = [&[&tiny.train, &longer], &[&longer], &[]];
        let run = |i: usize, batch: Option<&TrainBatch>| {
            let mut cx = tiny.cx(i, 1);
            cx.batch = batch;
            let mut model = env.initial_model();
            let losses: Vec<f64> = plan[i]
                .iter()
                .map(|cfg| cx.train(&env, &mut model, cfg, &[], &[], None).mean_loss)
                .collect();
            (model, losses)
        };
        let alone: Vec<_> = (0..3).map(|i| run(i, None)).collect();
        let together: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|i| {
                    let batch = &batch;
                    s.spawn(move || {
                        let _seat = batch.seat();
                        run(i, Some(batch))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        // First batch: client 0 (3 steps) and client 1 (5 steps) — two
        // settings, two kernel calls; second: client 0 alone.
        assert_eq!(batch.counts(), (3, 3));
        for ((a, la), (b, lb)) in alone.iter().zip(&together) {
            assert_eq!(la.len(), lb.len());
            for (x, y) in la.iter().zip(lb) {
                assert!((x - y).abs() < 1e-6, "loss {x} vs {y}");
            }
            for (x, y) in a.params.iter().zip(&b.params) {
                assert!((x - y).abs() < 1e-5, "parameter {x} vs {y}");
            }
        }
        assert_ne!(together[0].0.params, env.initial_model().params);
        assert_eq!(together[2].0.params, env.initial_model().params);
    }

    #[test]
    fn a_member_that_panics_releases_the_others() {
        let tiny = Tiny::new();
        let env = tiny.env();
        let members = (0..2).map(|i| (i, tiny.cx(i, 1).data.train));
        let batch = TrainBatch::new(&tiny.spec, tiny.spec.device(), members).unwrap();
        let trained = std::thread::scope(|s| {
            let (batch, tiny, env) = (&batch, &tiny, &env);
            let failing = s.spawn(move || {
                let _seat = batch.seat();
                panic!("client 0 fails before training");
            });
            let training = s.spawn(move || {
                let _seat = batch.seat();
                let mut cx = tiny.cx(1, 1);
                cx.batch = Some(batch);
                let mut model = env.initial_model();
                cx.train_plain(env, &mut model, &[]);
                model
            });
            assert!(failing.join().is_err());
            training.join().unwrap()
        });
        assert_ne!(trained.params, env.initial_model().params);
        assert_eq!(batch.counts(), (1, 1));
    }

    #[test]
    fn models_without_a_batched_form_are_refused() {
        let spec = ModelSpec::new(fedweave_nn::ModelKind::GRU, &[4, 2], 1).unwrap();
        let e = TrainBatch::new(&spec, spec.device(), []).err().unwrap();
        assert!(matches!(e, NnError::NotBatched { .. }), "{e}");
    }
}
