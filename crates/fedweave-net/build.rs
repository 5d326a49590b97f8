//! Generates the gRPC service code from a manual definition (no protoc,
//! no .proto file): the messages are prost structs in `src/wire.rs`.

fn main() {
    let method = |name: &str, route: &str, input: &str, output: &str| {
        tonic_build::manual::Method::builder()
            .name(name)
            .route_name(route)
            .input_type(format!("crate::wire::{input}"))
            .output_type(format!("crate::wire::{output}"))
            .codec_path("tonic_prost::ProstCodec")
            .build()
    };
    // Join is the one call a stranger may make: its own service, read
    // under a small size limit. Next and Report carry a session, checked
    // from the call's metadata before any message is read.
    let lobby = tonic_build::manual::Service::builder()
        .name("Lobby")
        .package("fedweave")
        .method(method("join", "Join", "Hello", "Welcome"))
        .build();
    let federation = tonic_build::manual::Service::builder()
        .name("Federation")
        .package("fedweave")
        .method(method("next", "Next", "Poll", "Envelope"))
        .method(method("report", "Report", "Answer", "Ack"))
        .build();
    let peers = tonic_build::manual::Service::builder()
        .name("Peers")
        .package("fedweave")
        .method(method("fetch", "Fetch", "FetchRequest", "Post"))
        .build();
    tonic_build::manual::Builder::new().compile(&[lobby, federation, peers]);
}
