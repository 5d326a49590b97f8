//! What a server, client or peer decodes from the network: the gRPC frames
//! (prost) and the typed payloads inside them (tasks, answers, hellos and
//! algorithm messages), and the checks every runtime applies to what they
//! carry (a hello against a derivation, a score's range, a claimed
//! certificate identity, a token file value). Any bytes: an error or a
//! refusal, never a panic; a payload that decodes re-encodes to bytes that
//! decode to the same encoding again.
#![no_main]
use fedweave_algos::Algorithm;
use fedweave_algos::pfedgraph::PFedGraph;
use fedweave_net::wire::{
    self, Answer, Envelope, FetchRequest, Hello, Poll, Post, Reply, Task, Welcome,
};
use fedweave_sim::runtime::{ClientInfo, Score, check_hello, check_score};
use libfuzzer_sys::fuzz_target;
use prost::Message;

type Down = <PFedGraph as Algorithm>::Down;
type Up = <PFedGraph as Algorithm>::Up;

/// Decodes `data` as `T`; what decodes must survive a round trip.
fn round_trip<T: serde::Serialize + serde::de::DeserializeOwned>(data: &[u8]) -> Option<T> {
    let v = wire::decode::<T>(data, 1 << 24).ok()?;
    let bytes = wire::encode(&v).unwrap();
    let again: T = wire::decode(&bytes, usize::MAX).expect("own encoding decodes");
    assert_eq!(wire::encode(&again).unwrap(), bytes);
    Some(v)
}

fuzz_target!(|data: &[u8]| {
    let _ = Hello::decode(data);
    let _ = Welcome::decode(data);
    let _ = Poll::decode(data);
    let _ = Answer::decode(data);
    let _ = Envelope::decode(data);
    let _ = FetchRequest::decode(data);
    let _ = Post::decode(data);
    let _ = round_trip::<Task<Down>>(data);
    if let Some(Reply::Trained {
        before: Some(s), ..
    }) = round_trip::<Reply<Up>>(data)
    {
        let _ = check_score(&s, false);
        let _ = check_score(&s, true);
    }
    if let Some(s) = round_trip::<Score>(data) {
        let _ = check_score(&s, false);
    }
    if let Some(info) = round_trip::<ClientInfo>(data) {
        // Against itself as a derivation, and as a claim bounded by any
        // limit.
        assert!(check_hello(&info, true, &info, 0).is_ok());
        let _ = check_hello(&info, false, &info, usize::MAX);
        let _ = check_hello(&info, false, &info, 1000);
    }
    let _ = fedweave_net::auth::cert_identity(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = wire::unhex(text);
        let _ = fedweave_net::auth::Credential::parse(text).map(|c| c.matches(text));
    }
});
