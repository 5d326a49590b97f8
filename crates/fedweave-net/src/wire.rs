//! What crosses the network. The gRPC messages are prost structs (no
//! .proto compile: `build.rs` generates the services from a manual
//! definition); each carries the typed message of the algorithm (its own
//! `Up`/`Down` types and the runtime's tasks and answers) as one buffer: a
//! four-byte tag, then the value in postcard (serde's compact binary
//! format), where an `f32` is its four little-endian bytes — so a model
//! arrives bit-identical (NaN payloads included) at 4 bytes a parameter,
//! with no decimal text to format or parse. Every payload is checked on
//! arrival: size limit, tag, format and trailing bytes; a bad one is an
//! error, never a panic.

use fedweave_sim::runtime::Score;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// A client introduces itself (`Lobby/Join`, the one call that needs no
/// session: read under a small size limit, [`JOIN_LIMIT`]).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Hello {
    /// Its client id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Its token (empty when the server requires none).
    #[prost(string, tag = "2")]
    pub token: String,
    /// Its packed `ClientInfo`.
    #[prost(bytes = "vec", tag = "3")]
    pub info: Vec<u8>,
    /// The session it had before a transport failure (empty: none): with
    /// it, and its credential, a client takes its id back even while that
    /// session looks live.
    #[prost(bytes = "vec", tag = "4")]
    pub previous: Vec<u8>,
}

/// The server accepts a client.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Welcome {
    /// The session: [`SESSION_BYTES`] bytes from the operating system's
    /// random source, a secret bound to this client id. Every later call
    /// carries it in its metadata ([`CLIENT_HEADER`], [`SESSION_HEADER`]).
    #[prost(bytes = "vec", tag = "1")]
    pub session: Vec<u8>,
}

/// A client asks for its next task (a long poll). Who asks is in the
/// call's metadata.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Poll {}

/// A packed typed message. Shared bytes: the server hands the same
/// encoded task to many clients without copying it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Envelope {
    /// The packed buffer.
    #[prost(bytes = "bytes", tag = "1")]
    pub payload: bytes::Bytes,
}

/// A client's answer to a task. Who answers is in the call's metadata.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Answer {
    /// The task's sequence number (stale answers are dropped).
    #[prost(uint64, tag = "1")]
    pub seq: u64,
    /// The packed answer.
    #[prost(bytes = "vec", tag = "2")]
    pub payload: Vec<u8>,
}

/// Receipt of an answer.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Ack {}

/// A peer asks another for what it published in a round. Who asks is in
/// the call's metadata (and, with mutual TLS, its certificate): a claimed
/// sender in the message would be trusted by nobody.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FetchRequest {
    /// The round.
    #[prost(uint64, tag = "1")]
    pub round: u64,
    /// Only whether it published (an empty payload), not the message.
    #[prost(bool, tag = "2")]
    pub probe: bool,
}

/// What a peer answers a fetch with.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Post {
    /// [`PostState`]: published, nothing, gone, not yet.
    #[prost(enumeration = "PostState", tag = "1")]
    pub state: i32,
    /// The packed message (published, and not a probe).
    #[prost(bytes = "bytes", tag = "2")]
    pub payload: bytes::Bytes,
    /// The latest round the peer has posted (a peer that fell behind, or
    /// came back, learns where the others are).
    #[prost(uint64, tag = "3")]
    pub latest: u64,
}

/// Whether a peer's post for a round is there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum PostState {
    /// Published: the payload holds it (empty for a probe).
    Published = 0,
    /// The peer took no part or published nothing sound that round.
    Nothing = 1,
    /// The round is older than what the peer keeps.
    Gone = 2,
    /// The peer has not reached that round yet (the long poll expired).
    NotYet = 3,
}

/// Metadata key naming the caller's client (or peer) id, in decimal.
pub const CLIENT_HEADER: &str = "fedweave-client";
/// Metadata key carrying the session, in lowercase hex.
pub const SESSION_HEADER: &str = "fedweave-session";
/// Metadata key carrying a peer's token.
pub const TOKEN_HEADER: &str = "fedweave-token";
/// Bytes of a session secret (128 bits).
pub const SESSION_BYTES: usize = 16;
/// The largest hello (or peer request) read before the caller is
/// authenticated: 1 MiB.
pub const JOIN_LIMIT: usize = 1 << 20;

/// The largest message carrying `models` model-sized vectors of a model
/// of `parameters` parameters (4 bytes each) plus 1 MiB for everything
/// else (ids, scores, label counts, framing).
pub fn message_limit(parameters: usize, models: usize) -> usize {
    parameters
        .saturating_mul(4)
        .saturating_mul(models)
        .saturating_add(1 << 20)
}

/// Model-sized vectors an upload may carry (the model, a few more for
/// methods that upload several — FedEM's components, FedCP's parts —
/// and the origin): what a server reads from an authenticated client.
pub const UPLOAD_MODELS: usize = 10;

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes of a lowercase or uppercase hex string; `None` if it is not one.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|k| u8::from_str_radix(&text[k..k + 2], 16).ok())
        .collect()
}

/// What the server asks of one client.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Task<D> {
    /// Nothing yet: poll again.
    Wait,
    /// Round `round` begins: start from the state after round `round − 1`,
    /// train if `participate`, score where asked.
    Train {
        /// Sequence number to answer with.
        seq: u64,
        /// The round.
        round: usize,
        /// Whether the client was chosen to train.
        participate: bool,
        /// Score before training (`eval.when = "before_and_after"`).
        before: bool,
        /// Score after training (the algorithm's point is after training).
        after: bool,
        /// Report where training started (norm clipping).
        origin: bool,
    },
    /// Round `round`'s download (if any) for this client.
    Receive {
        /// Sequence number to answer with.
        seq: u64,
        /// The round.
        round: usize,
        /// The algorithm's message, if the server addressed this client.
        down: Option<D>,
        /// Score after applying it (the algorithm's point is after
        /// receiving).
        after: bool,
    },
    /// The run is over.
    Finish,
}

/// A client's answer to a task.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Reply<U> {
    /// After `Train`.
    Trained {
        /// The upload, its training loss and (if asked) where training
        /// started.
        upload: Option<WireUpload<U>>,
        /// The score before training, if asked.
        before: Option<Score>,
        /// The score after training, if asked.
        after: Option<Score>,
    },
    /// After `Receive`.
    Received {
        /// The score after receiving, if asked.
        after: Option<Score>,
    },
}

/// An upload as it travels.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WireUpload<U> {
    /// The algorithm's message.
    pub up: U,
    /// Mean training loss.
    pub loss: f64,
    /// Where training started, when asked.
    #[serde(with = "fedweave_core::stash::opt_vector")]
    pub origin: Option<Vec<f32>>,
}

/// What a payload starts with: "fedweave message", layout version 2
/// (bumped on incompatible changes of the message layout).
const TAG: [u8; 4] = *b"FWM2";

/// A payload that cannot be decoded.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Larger than the limit.
    #[error("message of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Not a fedweave message, or of another layout version.
    #[error("not a fedweave message of this version (it starts with {found:?})")]
    Format {
        /// Its first bytes.
        found: Vec<u8>,
    },
    /// Malformed content.
    #[error("malformed message: {0}")]
    Malformed(String),
}

/// Encodes a typed message.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, WireError> {
    postcard::to_extend(value, TAG.to_vec()).map_err(|e| WireError::Malformed(e.to_string()))
}

/// Decodes a typed message of at most `limit` bytes; every byte must belong
/// to it.
pub fn decode<T: DeserializeOwned>(payload: &[u8], limit: usize) -> Result<T, WireError> {
    if payload.len() > limit {
        return Err(WireError::TooLarge {
            size: payload.len(),
            limit,
        });
    }
    let Some(body) = payload.strip_prefix(&TAG) else {
        return Err(WireError::Format {
            found: payload.iter().take(TAG.len()).copied().collect(),
        });
    };
    let (value, rest) =
        postcard::take_from_bytes(body).map_err(|e| WireError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(WireError::Malformed(format!(
            "{} bytes after the message",
            rest.len()
        )));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model as some algorithms' messages carry one (stashed in
    /// checkpoints, inline on the wire).
    #[derive(Clone, Debug, Serialize, Deserialize)]
    struct Model {
        #[serde(with = "fedweave_core::stash::vector")]
        weights: Vec<f32>,
    }

    #[test]
    fn tasks_round_trip_with_exact_floats_and_garbage_is_a_typed_error() {
        let down = vec![0.1f32, f32::NAN, -3.5e-40];
        let t = Task::Receive {
            seq: 7,
            round: 3,
            down: Some(Model {
                weights: down.clone(),
            }),
            after: true,
        };
        let bytes = encode(&t).unwrap();
        let Task::Receive {
            seq,
            round,
            down: Some(d),
            after,
        } = decode::<Task<Model>>(&bytes, 1 << 20).unwrap()
        else {
            panic!("wrong variant");
        };
        assert_eq!((seq, round, after), (7, 3, true));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&d.weights), bits(&down));
        assert!(matches!(
            decode::<Task<Model>>(&bytes, 10),
            Err(WireError::TooLarge { .. })
        ));
        assert!(matches!(
            decode::<Task<Model>>(b"\x08\0\0\0\0\0\0\0{}      ", 1 << 20),
            Err(WireError::Format { .. })
        ));
        // Cut short, or with bytes after the message.
        assert!(matches!(
            decode::<Task<Model>>(&bytes[..bytes.len() - 1], 1 << 20),
            Err(WireError::Malformed(_))
        ));
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(matches!(
            decode::<Task<Model>>(&longer, 1 << 20),
            Err(WireError::Malformed(_))
        ));
        // The right envelope around the wrong type.
        let wrong = encode(&Reply::<Model>::Received { after: None }).unwrap();
        assert!(decode::<Task<Model>>(&wrong, 1 << 20).is_err());
    }

    /// A plain `Vec<f32>` (most algorithms' `Up`) costs 4 bytes a
    /// parameter plus a few bytes of framing, and keeps every bit.
    #[test]
    fn a_model_costs_four_bytes_a_parameter() {
        let model: Vec<f32> = (0..10_000u32)
            .map(|k| f32::from_bits(0x3f80_0000 ^ k.wrapping_mul(2_654_435_761u32)))
            .collect();
        let up = Reply::Trained {
            upload: Some(WireUpload {
                up: model.clone(),
                loss: 0.25,
                origin: None,
            }),
            before: None,
            after: None,
        };
        let bytes = encode(&up).unwrap();
        assert!(bytes.len() <= 4 * model.len() + 32, "{} bytes", bytes.len());
        let Reply::Trained {
            upload: Some(back), ..
        } = decode::<Reply<Vec<f32>>>(&bytes, 1 << 20).unwrap()
        else {
            panic!("wrong variant");
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back.up), bits(&model));
    }
}
