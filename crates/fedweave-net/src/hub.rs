//! The server's meeting point between the gRPC handlers (async, many) and
//! the round driver (one thread): sessions, the current phase's tasks and
//! the answers that came back. The handlers never look inside a payload;
//! the driver, which knows the algorithm's types, does.

use crate::wire::{Ack, Answer, Envelope, Hello, Poll, Welcome};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};

/// How long a long poll waits for a task before answering `Wait`.
const POLL_WAIT: Duration = Duration::from_secs(5);

/// One client's connection.
struct Session {
    id: u64,
    last_seen: Instant,
}

/// The current phase of the run.
#[derive(Default)]
struct Phase {
    seq: u64,
    /// Each client's task (None: nothing for it in this phase).
    tasks: Vec<Option<Bytes>>,
    answers: Vec<Option<Vec<u8>>>,
}

#[derive(Default)]
struct State {
    sessions: Vec<Option<Session>>,
    infos: Vec<Option<Vec<u8>>>,
    phase: Phase,
    /// The packed `Finish` task, once the run is over.
    finished: Option<Bytes>,
    /// Which clients have been told the run is over.
    told: Vec<bool>,
    next_session: u64,
}

/// Who may join and how a session lives.
pub struct Admission {
    /// Number of clients (ids 0..clients).
    pub clients: usize,
    /// `id → token`; `None`: no tokens required.
    pub tokens: Option<HashMap<u64, String>>,
    /// A session not heard from for this long is gone: its id may be
    /// claimed again.
    pub session_timeout: Duration,
}

/// Shared between the handlers and the driver.
pub struct Hub {
    admission: Admission,
    state: Mutex<State>,
    /// Wakes the driver when an answer or a hello arrives.
    arrived: Condvar,
    /// Wakes long polls when a phase begins.
    published: tokio::sync::Notify,
}

impl Hub {
    /// A hub for `admission.clients` clients.
    pub fn new(admission: Admission) -> Arc<Self> {
        let n = admission.clients;
        Arc::new(Self {
            admission,
            state: Mutex::new(State {
                sessions: (0..n).map(|_| None).collect(),
                infos: vec![None; n],
                told: vec![false; n],
                ..State::default()
            }),
            arrived: Condvar::new(),
            published: tokio::sync::Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until every client has introduced itself; returns their packed
    /// infos in client order.
    pub fn wait_for_hellos(&self) -> Vec<Vec<u8>> {
        let mut s = self.lock();
        loop {
            if s.infos.iter().all(Option::is_some) {
                return s.infos.iter().flatten().cloned().collect();
            }
            s = self.arrived.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Publishes phase `seq` with each client's task and waits for the
    /// answers: until every addressed client answered, or, once `timeout`
    /// has passed, as soon as at least `min_answers` (at most the number
    /// addressed) did. Returns each client's answer.
    pub fn run_phase(
        &self,
        seq: u64,
        tasks: Vec<Option<Bytes>>,
        timeout: Duration,
        min_answers: usize,
    ) -> Vec<Option<Vec<u8>>> {
        let addressed = tasks.iter().filter(|t| t.is_some()).count();
        let need = min_answers.min(addressed);
        let started = Instant::now();
        let mut s = self.lock();
        let n = tasks.len();
        s.phase = Phase {
            seq,
            tasks,
            answers: vec![None; n],
        };
        drop(s);
        self.published.notify_waiters();
        let mut s = self.lock();
        let mut warned = false;
        loop {
            let got = s.phase.answers.iter().filter(|a| a.is_some()).count();
            let elapsed = started.elapsed();
            if got == addressed || (elapsed >= timeout && got >= need) {
                if got < addressed {
                    tracing::warn!(
                        seq,
                        got,
                        addressed,
                        "round timeout: going on without the missing clients"
                    );
                }
                // The phase is over: no more tasks handed out, late
                // answers refused.
                s.phase.tasks.clear();
                return std::mem::take(&mut s.phase.answers);
            }
            if elapsed >= timeout && !warned {
                tracing::warn!(
                    seq,
                    got,
                    need,
                    "round timeout passed with too few answers; waiting"
                );
                warned = true;
            }
            let wait = if elapsed < timeout {
                timeout - elapsed
            } else {
                POLL_WAIT
            };
            s = self
                .arrived
                .wait_timeout(s, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Ends the run: every poll from now on gets `finish`. Waits (up to
    /// `grace`) until every client with a session has been told.
    pub fn finish(&self, finish: Bytes, grace: Duration) {
        let mut s = self.lock();
        s.finished = Some(finish);
        s.phase = Phase::default();
        drop(s);
        self.published.notify_waiters();
        let started = Instant::now();
        let mut s = self.lock();
        while started.elapsed() < grace {
            let all = s
                .sessions
                .iter()
                .zip(&s.told)
                .all(|(sess, &told)| sess.is_none() || told);
            if all {
                return;
            }
            s = self
                .arrived
                .wait_timeout(s, grace.saturating_sub(started.elapsed()))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Checks a call's session; refreshes it.
    fn check_session(&self, s: &mut State, id: u64, session: u64) -> Result<usize, Status> {
        let i = usize::try_from(id)
            .ok()
            .filter(|&i| i < self.admission.clients)
            .ok_or_else(|| Status::not_found(format!("unknown client id {id}")))?;
        match &mut s.sessions[i] {
            Some(sess) if sess.id == session => {
                sess.last_seen = Instant::now();
                Ok(i)
            }
            _ => Err(Status::unauthenticated(format!(
                "client {id}: no such session (the server restarted or another connection took the id); join again"
            ))),
        }
    }

    /// `Join`: admission by id, token and liveness of an existing session.
    pub fn join(&self, hello: Hello) -> Result<Welcome, Status> {
        let id = hello.id;
        let refuse = |status: Status| {
            tracing::warn!(client = id, "join refused: {}", status.message());
            Err(status)
        };
        let Some(i) = usize::try_from(id)
            .ok()
            .filter(|&i| i < self.admission.clients)
        else {
            return refuse(Status::not_found(format!(
                "unknown client id {id} (this federation has clients 0..{})",
                self.admission.clients
            )));
        };
        if let Some(tokens) = &self.admission.tokens {
            match tokens.get(&id) {
                _ if hello.token.is_empty() => {
                    return refuse(Status::unauthenticated(format!(
                        "client {id}: a token is required"
                    )));
                }
                Some(t) if *t == hello.token => {}
                _ => {
                    return refuse(Status::unauthenticated(format!("client {id}: wrong token")));
                }
            }
        }
        let mut s = self.lock();
        let live = s.sessions[i].as_ref().is_some_and(|sess| {
            sess.id != hello.previous && sess.last_seen.elapsed() < self.admission.session_timeout
        });
        if live {
            drop(s);
            return refuse(Status::already_exists(format!(
                "client {id} is already connected"
            )));
        }
        // A session tells connections apart; it is not a secret (tokens
        // and TLS are the security).
        s.next_session += 1;
        let session = s.next_session;
        s.sessions[i] = Some(Session {
            id: session,
            last_seen: Instant::now(),
        });
        s.infos[i] = Some(hello.info);
        drop(s);
        tracing::info!(client = id, "joined");
        self.arrived.notify_all();
        Ok(Welcome { session })
    }

    /// `Next`: the client's task in the current phase, waiting up to
    /// [`POLL_WAIT`] for one.
    pub async fn next(&self, poll: Poll, wait: Bytes) -> Result<Envelope, Status> {
        let deadline = tokio::time::Instant::now() + POLL_WAIT;
        loop {
            let notified = self.published.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.lock();
                let i = self.check_session(&mut s, poll.id, poll.session)?;
                if let Some(f) = s.finished.clone() {
                    s.told[i] = true;
                    drop(s);
                    self.arrived.notify_all();
                    return Ok(Envelope { payload: f.clone() });
                }
                let p = &s.phase;
                if let Some(Some(task)) = p.tasks.get(i)
                    && p.answers.get(i).is_some_and(Option::is_none)
                {
                    return Ok(Envelope {
                        payload: task.clone(),
                    });
                }
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => {
                    return Ok(Envelope { payload: wait });
                }
            }
        }
    }

    /// `Report`: stores an answer to the current phase.
    pub fn report(&self, answer: Answer) -> Result<Ack, Status> {
        let mut s = self.lock();
        let i = self.check_session(&mut s, answer.id, answer.session)?;
        if answer.seq != s.phase.seq || s.phase.tasks.get(i).is_none_or(Option::is_none) {
            return Err(Status::failed_precondition(format!(
                "answer to task {} arrived after the round moved on",
                answer.seq
            )));
        }
        s.phase.answers[i] = Some(answer.payload);
        drop(s);
        self.arrived.notify_all();
        Ok(Ack {})
    }
}

/// The gRPC face of the hub.
pub struct FederationService {
    /// The hub.
    pub hub: Arc<Hub>,
    /// The packed `Wait` task.
    pub wait: Bytes,
}

#[tonic::async_trait]
impl crate::proto::federation_server::Federation for FederationService {
    async fn join(&self, request: Request<Hello>) -> Result<Response<Welcome>, Status> {
        self.hub.join(request.into_inner()).map(Response::new)
    }

    async fn next(&self, request: Request<Poll>) -> Result<Response<Envelope>, Status> {
        self.hub
            .next(request.into_inner(), self.wait.clone())
            .await
            .map(Response::new)
    }

    async fn report(&self, request: Request<Answer>) -> Result<Response<Ack>, Status> {
        self.hub.report(request.into_inner()).map(Response::new)
    }
}
