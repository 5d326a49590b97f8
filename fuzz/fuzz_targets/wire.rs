//! What a server, client or peer decodes from the network: the gRPC frames
//! (prost) and the typed payloads inside them (tasks, answers, hellos and
//! algorithm messages). Any bytes: an error, never a panic; a payload that
//! decodes re-encodes to bytes that decode to the same encoding again.
#![no_main]
use fedweave_algos::Algorithm;
use fedweave_algos::pfedgraph::PFedGraph;
use fedweave_net::wire::{self, Answer, Envelope, FetchRequest, Hello, Poll, Reply, Task};
use fedweave_sim::runtime::ClientInfo;
use libfuzzer_sys::fuzz_target;
use prost::Message;

type Down = <PFedGraph as Algorithm>::Down;
type Up = <PFedGraph as Algorithm>::Up;

/// Decodes `data` as `T`; what decodes must survive a round trip.
fn round_trip<T: serde::Serialize + serde::de::DeserializeOwned>(data: &[u8]) {
    if let Ok(v) = wire::decode::<T>(data, 1 << 24) {
        let bytes = wire::encode(&v).unwrap();
        let again: T = wire::decode(&bytes, usize::MAX).expect("own encoding decodes");
        assert_eq!(wire::encode(&again).unwrap(), bytes);
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = Hello::decode(data);
    let _ = Poll::decode(data);
    let _ = Answer::decode(data);
    let _ = Envelope::decode(data);
    let _ = FetchRequest::decode(data);
    round_trip::<Task<Down>>(data);
    round_trip::<Reply<Up>>(data);
    round_trip::<ClientInfo>(data);
});
