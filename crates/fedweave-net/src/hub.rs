//! The server's meeting point between the gRPC handlers (async, many) and
//! the round driver (one thread): admission, sessions, the current phase's
//! tasks and the answers that came back. The handlers never look inside a
//! payload except a hello, which the driver's check (the server's own
//! derivation of the federation) judges when the client joins.
//!
//! Everything that arrives is hostile until checked:
//! - `Join` (the only call without a session, read under a small limit)
//!   needs the id's credential — its token, compared in constant time, or
//!   a client certificate naming the id — and a hello the server's config
//!   agrees with. A live session is replaced only by a join that names it
//!   as `previous` (with the credential, when credentials are required).
//! - A session is 128 random bits from the OS, bound to one client id;
//!   `Next` and `Report` carry (id, session) in their metadata, checked
//!   before their message is read.
//! - An answer is accepted once per phase, from the client the task was
//!   addressed to, only after the task was handed to it, and only for the
//!   current phase; it never replaces a stored answer.

use crate::auth::{self, Credential};
use crate::wire::{
    self, Ack, Answer, CLIENT_HEADER, Envelope, Hello, Poll, SESSION_HEADER, Welcome,
};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tonic::{Request, Response, Status};

/// How long a long poll waits for a task before answering `Wait`.
const POLL_WAIT: Duration = Duration::from_secs(5);

/// Calls one client may have in flight at once (an honest one has one: a
/// poll or an answer; a few more absorb retries after a transport
/// failure). Each may hold a message up to the server's limit, so this
/// bounds what one authenticated client can make the server hold.
pub const CALLS_PER_CLIENT: usize = 4;

/// One client's connection.
struct Session {
    secret: Vec<u8>,
    last_seen: Instant,
}

/// The current phase of the run.
#[derive(Default)]
struct Phase {
    seq: u64,
    /// Each client's task (None: nothing for it in this phase).
    tasks: Vec<Option<Bytes>>,
    /// Whether the task was handed to the client.
    sent: Vec<bool>,
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
    /// Each client's calls in flight.
    in_flight: Vec<usize>,
}

/// Judges a packed hello of client `i`: `Err` says why it is refused.
pub type HelloCheck = Box<dyn Fn(usize, &[u8]) -> Result<(), String> + Send + Sync>;

/// Who may join and how a session lives.
pub struct Admission {
    /// Number of clients (ids 0..clients).
    pub clients: usize,
    /// `id → credential`; `None`: no tokens required.
    pub tokens: Option<HashMap<u64, Credential>>,
    /// Whether a client certificate naming the id is required (mutual TLS).
    pub client_certs: bool,
    /// A session not heard from for this long is gone: its id may be
    /// claimed again.
    pub session_timeout: Duration,
    /// The server's check of a hello.
    pub check_hello: HelloCheck,
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

/// The client a call was authenticated as (put into the request's
/// extensions by [`Hub::authenticate`]).
#[derive(Clone, Copy, Debug)]
pub struct Caller(pub usize);

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
                in_flight: vec![0; n],
                ..State::default()
            }),
            arrived: Condvar::new(),
            published: tokio::sync::Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until every client has introduced itself with a hello the
    /// server accepted; returns their packed infos in client order.
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
            sent: vec![false; n],
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
    /// `grace`) until every client that is still polling (heard from
    /// within two long polls) has been told.
    pub fn finish(&self, finish: Bytes, grace: Duration) {
        let mut s = self.lock();
        s.finished = Some(finish);
        s.phase = Phase::default();
        drop(s);
        self.published.notify_waiters();
        let started = Instant::now();
        let mut s = self.lock();
        while started.elapsed() < grace {
            let all = s.sessions.iter().zip(&s.told).all(|(sess, &told)| {
                told || sess
                    .as_ref()
                    .is_none_or(|x| x.last_seen.elapsed() > 2 * POLL_WAIT)
            });
            if all {
                return;
            }
            s = self
                .arrived
                .wait_timeout(s, Duration::from_millis(500))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// A client id in this federation.
    fn client(&self, id: u64) -> Result<usize, Status> {
        usize::try_from(id)
            .ok()
            .filter(|&i| i < self.admission.clients)
            .ok_or_else(|| {
                Status::not_found(format!(
                    "unknown client id {id} (this federation has clients 0..{})",
                    self.admission.clients
                ))
            })
    }

    /// Checks a call's headers (client id and session) against the live
    /// sessions, before its message is read; refreshes the session. With
    /// client certificates required, `cert_id` (the TLS client
    /// certificate's id) must be the same id. Returns the client.
    pub fn authenticate(
        &self,
        headers: &tonic::codegen::http::HeaderMap,
        cert_id: Option<u64>,
    ) -> Result<usize, Status> {
        let header = |key: &str| headers.get(key).and_then(|v| v.to_str().ok());
        let unauthenticated = || {
            Status::unauthenticated("no valid session: join first (the server may have restarted)")
        };
        let id: u64 = header(CLIENT_HEADER)
            .and_then(|v| v.parse().ok())
            .ok_or_else(unauthenticated)?;
        let secret = header(SESSION_HEADER)
            .and_then(wire::unhex)
            .ok_or_else(unauthenticated)?;
        let i = self.client(id)?;
        if self.admission.client_certs && cert_id != Some(id) {
            return Err(Status::unauthenticated(format!(
                "client {id}: the TLS client certificate does not name this id"
            )));
        }
        let mut s = self.lock();
        match &mut s.sessions[i] {
            Some(sess) if auth::ct_eq(&sess.secret, &secret) => {
                sess.last_seen = Instant::now();
                Ok(i)
            }
            _ => Err(Status::unauthenticated(format!(
                "client {id}: no such session (the server restarted or another connection took the id); join again"
            ))),
        }
    }

    /// Takes one of client `i`'s [`CALLS_PER_CLIENT`] slots for a call in
    /// flight (`None`: all taken); the slot is free again when the guard
    /// drops.
    fn enter(self: &Arc<Self>, i: usize) -> Option<Slot> {
        let mut s = self.lock();
        if s.in_flight[i] >= CALLS_PER_CLIENT {
            return None;
        }
        s.in_flight[i] += 1;
        Some(Slot {
            hub: self.clone(),
            client: i,
        })
    }

    /// `Join`: admission by id, credential (token and/or the TLS client
    /// certificate's id, `cert_id`), the server's check of the hello, and
    /// liveness of an existing session.
    pub fn join(&self, hello: Hello, cert_id: Option<u64>) -> Result<Welcome, Status> {
        let id = hello.id;
        let refuse = |status: Status| {
            tracing::warn!(client = id, "join refused: {}", status.message());
            Err(status)
        };
        let i = match self.client(id) {
            Ok(i) => i,
            Err(status) => return refuse(status),
        };
        if self.admission.client_certs && cert_id != Some(id) {
            return refuse(Status::unauthenticated(format!(
                "client {id}: a TLS client certificate for this id is required"
            )));
        }
        if let Some(tokens) = &self.admission.tokens {
            if hello.token.is_empty() {
                return refuse(Status::unauthenticated(format!(
                    "client {id}: a token is required"
                )));
            }
            if !tokens.get(&id).is_some_and(|c| c.matches(&hello.token)) {
                return refuse(Status::unauthenticated(format!("client {id}: wrong token")));
            }
        }
        if let Err(why) = (self.admission.check_hello)(i, &hello.info) {
            return refuse(Status::invalid_argument(format!(
                "client {id}: hello refused: {why}"
            )));
        }
        let secret = auth::new_session().map_err(|e| Status::internal(e.to_string()))?;
        let mut s = self.lock();
        let live = s.sessions[i].as_ref().is_some_and(|sess| {
            !auth::ct_eq(&sess.secret, &hello.previous)
                && sess.last_seen.elapsed() < self.admission.session_timeout
        });
        if live {
            drop(s);
            return refuse(Status::already_exists(format!(
                "client {id} is already connected"
            )));
        }
        s.sessions[i] = Some(Session {
            secret: secret.clone(),
            last_seen: Instant::now(),
        });
        s.infos[i] = Some(hello.info);
        drop(s);
        tracing::info!(client = id, "joined");
        self.arrived.notify_all();
        Ok(Welcome { session: secret })
    }

    /// `Next`: the caller's task in the current phase, waiting up to
    /// [`POLL_WAIT`] for one.
    pub async fn next(&self, caller: Caller, wait: Bytes) -> Result<Envelope, Status> {
        let i = caller.0;
        let deadline = tokio::time::Instant::now() + POLL_WAIT;
        loop {
            let notified = self.published.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.lock();
                if let Some(f) = s.finished.clone() {
                    s.told[i] = true;
                    drop(s);
                    self.arrived.notify_all();
                    return Ok(Envelope { payload: f });
                }
                let p = &mut s.phase;
                if let Some(Some(task)) = p.tasks.get(i)
                    && p.answers.get(i).is_some_and(Option::is_none)
                {
                    let payload = task.clone();
                    p.sent[i] = true;
                    return Ok(Envelope { payload });
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

    /// `Report`: stores the caller's answer to the current phase — once,
    /// and only to a task it was handed.
    pub fn report(&self, caller: Caller, answer: Answer) -> Result<Ack, Status> {
        let i = caller.0;
        let mut s = self.lock();
        let p = &mut s.phase;
        if answer.seq != p.seq || p.tasks.get(i).is_none_or(Option::is_none) {
            return Err(Status::failed_precondition(format!(
                "answer to task {} arrived after the round moved on",
                answer.seq
            )));
        }
        if !p.sent[i] {
            return Err(Status::failed_precondition(format!(
                "client {i}: no task was handed to this client in phase {}",
                p.seq
            )));
        }
        if p.answers[i].is_some() {
            return Err(Status::already_exists(format!(
                "client {i} already answered task {}",
                p.seq
            )));
        }
        p.answers[i] = Some(answer.payload);
        drop(s);
        self.arrived.notify_all();
        Ok(Ack {})
    }
}

/// A call slot of one client (see [`CALLS_PER_CLIENT`]).
struct Slot {
    hub: Arc<Hub>,
    client: usize,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.hub.lock();
        s.in_flight[self.client] = s.in_flight[self.client].saturating_sub(1);
    }
}

/// The gRPC face of the hub: `Lobby` (Join) and `Federation` (Next,
/// Report, behind a [`Gate`]).
#[derive(Clone)]
pub struct FederationService {
    /// The hub.
    pub hub: Arc<Hub>,
    /// The packed `Wait` task.
    pub wait: Bytes,
}

fn caller<T>(request: &Request<T>) -> Result<Caller, Status> {
    request
        .extensions()
        .get::<Caller>()
        .copied()
        .ok_or_else(|| Status::unauthenticated("no session"))
}

#[tonic::async_trait]
impl crate::proto::lobby_server::Lobby for FederationService {
    async fn join(&self, request: Request<Hello>) -> Result<Response<Welcome>, Status> {
        let cert_id = auth::caller_cert_id(&request);
        self.hub
            .join(request.into_inner(), cert_id)
            .map(Response::new)
    }
}

#[tonic::async_trait]
impl crate::proto::federation_server::Federation for FederationService {
    async fn next(&self, request: Request<Poll>) -> Result<Response<Envelope>, Status> {
        let who = caller(&request)?;
        self.hub
            .next(who, self.wait.clone())
            .await
            .map(Response::new)
    }

    async fn report(&self, request: Request<Answer>) -> Result<Response<Ack>, Status> {
        let who = caller(&request)?;
        self.hub
            .report(who, request.into_inner())
            .map(Response::new)
    }
}

/// Wraps the `Federation` service: authenticates every call from its
/// headers (and client certificate) before any of its message is read,
/// and holds one of the caller's [`CALLS_PER_CLIENT`] slots for the
/// whole call, its upload included. Refusals are answered at once.
#[derive(Clone)]
pub struct Gate<S> {
    /// The wrapped service.
    pub inner: S,
    /// The hub whose sessions it checks.
    pub hub: Arc<Hub>,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B> tonic::codegen::Service<tonic::codegen::http::Request<B>> for Gate<S>
where
    S: tonic::codegen::Service<
            tonic::codegen::http::Request<B>,
            Response = tonic::codegen::http::Response<tonic::body::Body>,
        > + Send,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: tonic::codegen::http::Request<B>) -> Self::Future {
        use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
        let cert_id = request
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(|i| i.peer_certs())
            .and_then(|c| c.first().and_then(|c| auth::cert_identity(c.as_ref())));
        let admitted = self
            .hub
            .authenticate(request.headers(), cert_id)
            .and_then(|i| {
                self.hub.enter(i).map(|slot| (i, slot)).ok_or_else(|| {
                    Status::resource_exhausted(format!(
                        "client {i}: more than {CALLS_PER_CLIENT} calls in flight"
                    ))
                })
            });
        match admitted {
            Ok((i, slot)) => {
                request.extensions_mut().insert(Caller(i));
                let call = self.inner.call(request);
                Box::pin(async move {
                    let response = call.await;
                    drop(slot);
                    response
                })
            }
            Err(status) => Box::pin(std::future::ready(Ok(status.into_http()))),
        }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Gate<S> {
    const NAME: &'static str = S::NAME;
}
