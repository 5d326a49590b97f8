//! What a hostile (or broken) server can do to a client: send it
//! downloads of the wrong shape or with non-finite values. The client
//! refuses them, keeps its model, answers, and carries on; it neither
//! panics nor scores a poisoned model.

use crate::common::*;
use fedweave_net::proto::federation_server::{Federation, FederationServer};
use fedweave_net::proto::lobby_server::{Lobby, LobbyServer};
use fedweave_net::wire::{self, Ack, Answer, Envelope, Hello, Poll, Reply, Task, Welcome};
use fedweave_sim::runtime::{Derived, Score};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tonic::{Request, Response, Status};

/// A server that hands out `tasks` in turn, then `Finish`, and keeps the
/// answers it gets.
#[derive(Default)]
struct Scripted {
    tasks: Mutex<VecDeque<Task<Vec<f32>>>>,
    answers: Mutex<Vec<Answer>>,
}

#[tonic::async_trait]
impl Lobby for Scripted {
    async fn join(&self, _: Request<Hello>) -> Result<Response<Welcome>, Status> {
        Ok(Response::new(Welcome {
            session: vec![7; 16],
        }))
    }
}

#[tonic::async_trait]
impl Federation for Scripted {
    async fn next(&self, _: Request<Poll>) -> Result<Response<Envelope>, Status> {
        let task = self.tasks.lock().unwrap().pop_front();
        let payload = wire::encode(&task.unwrap_or(Task::Finish)).unwrap();
        Ok(Response::new(Envelope {
            payload: payload.into(),
        }))
    }

    async fn report(&self, request: Request<Answer>) -> Result<Response<Ack>, Status> {
        self.answers.lock().unwrap().push(request.into_inner());
        Ok(Response::new(Ack {}))
    }
}

/// Downloads of the wrong length, with NaN or infinite values, are
/// refused: the client keeps the model it held (its score after each
/// equals its score after an empty download) and finishes the run; a
/// sound download is applied (its score differs).
#[test]
fn a_client_refuses_wrong_shaped_or_non_finite_downloads_and_carries_on() {
    let cfg = config("fedavg", &[]);
    let d = Derived::load(&cfg).unwrap().env().init.len();
    let receive = |seq: u64, down: Option<Vec<f32>>| Task::Receive {
        seq,
        round: 1,
        down,
        after: true,
    };
    let script = Arc::new(Scripted::default());
    script.tasks.lock().unwrap().extend([
        receive(1, None),
        receive(2, Some(vec![0.5; 3])),
        receive(3, Some(vec![0.5; d + 1])),
        receive(4, Some(vec![f32::NAN; d])),
        receive(5, Some(vec![f32::INFINITY; d])),
        receive(6, Some(vec![0.0; d])),
    ]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(LobbyServer::from_arc(script.clone()))
            .add_service(FederationServer::from_arc(script.clone()))
            .serve_with_incoming(incoming),
    );
    let client = start_clients(&cfg, url, vec![0], |_| {});
    join(client, 60).expect("the client finishes without error");
    let answers = script.answers.lock().unwrap();
    let scores: Vec<(u64, Score)> = answers
        .iter()
        .map(
            |a| match wire::decode::<Reply<Vec<f32>>>(&a.payload, usize::MAX).unwrap() {
                Reply::Received { after: Some(s) } => (a.seq, s),
                other => panic!("task {}: {other:?}", a.seq),
            },
        )
        .collect();
    assert_eq!(
        scores.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6],
        "every task answered once, in order"
    );
    let kept = scores[0].1;
    for (seq, s) in &scores[1..5] {
        assert_eq!(
            *s, kept,
            "task {seq}: the refused download changed the model"
        );
    }
    assert_ne!(scores[5].1, kept, "a sound download is applied");
}
