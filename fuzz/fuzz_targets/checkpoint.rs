//! Checkpoints: the safetensors container, its metadata checks (format,
//! version, algorithm, config) and the state inside, here pFedGraph's
//! (server graph state, client models). Any bytes: an error, never a panic.
//! The second parse takes the identity from the buffer itself, so the
//! fuzzer also reaches the state decoding behind the identity checks.
#![no_main]
use fedweave_algos::Algorithm;
use fedweave_algos::pfedgraph::PFedGraph;
use fedweave_sim::checkpoint::{Identity, parse};
use libfuzzer_sys::fuzz_target;

type Server = <PFedGraph as Algorithm>::Server;
type Client = <PFedGraph as Algorithm>::Client;

fuzz_target!(|data: &[u8]| {
    let id = Identity {
        algorithm: "pfedgraph",
        config: "seed = 1\n",
    };
    let _ = parse::<Server, Client>(data, &id);
    if let Ok(u) = fedweave_sim::packed::Unpacked::parse(data) {
        let id = Identity {
            algorithm: u.get("algorithm"),
            config: u.get("config"),
        };
        let _ = parse::<Server, Client>(data, &id);
    }
});
