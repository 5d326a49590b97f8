//! What crosses the network. The gRPC messages are prost structs (no
//! .proto compile: `build.rs` generates the services from a manual
//! definition); each carries the typed message of the algorithm (its own
//! `Up`/`Down` types and the runtime's tasks and answers) as one packed
//! buffer (`fedweave_sim::packed`: safetensors with raw f32 vectors and a
//! JSON body), so a model arrives bit-identical. Every payload is checked
//! on arrival: size limit, format, and shape; a bad one is an error, never
//! a panic.

use fedweave_sim::packed::{Unpacked, pack};
use fedweave_sim::runtime::Score;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// A client introduces itself.
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
    /// The session it had before a transport failure (0: none): the
    /// server lets it take its id back even while that session looks live.
    #[prost(uint64, tag = "4")]
    pub previous: u64,
}

/// The server accepts a client.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Welcome {
    /// The session every later call names.
    #[prost(uint64, tag = "1")]
    pub session: u64,
}

/// A client asks for its next task (a long poll).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Poll {
    /// Its client id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Its session.
    #[prost(uint64, tag = "2")]
    pub session: u64,
}

/// A packed typed message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Envelope {
    /// The packed buffer.
    #[prost(bytes = "vec", tag = "1")]
    pub payload: Vec<u8>,
}

/// A client's answer to a task.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Answer {
    /// Its client id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Its session.
    #[prost(uint64, tag = "2")]
    pub session: u64,
    /// The task's sequence number (stale answers are dropped).
    #[prost(uint64, tag = "3")]
    pub seq: u64,
    /// The packed answer.
    #[prost(bytes = "vec", tag = "4")]
    pub payload: Vec<u8>,
}

/// Receipt of an answer.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Ack {}

/// A peer asks another for what it published in a round.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FetchRequest {
    /// The round.
    #[prost(uint64, tag = "1")]
    pub round: u64,
    /// Who asks.
    #[prost(uint64, tag = "2")]
    pub from: u64,
    /// Only whether it published (an empty payload), not the message.
    #[prost(bool, tag = "3")]
    pub probe: bool,
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

/// What a payload says it is.
const FORMAT: &str = "fedweave-message";
/// Bumped on incompatible changes of the message layout.
const VERSION: &str = "1";

/// Default limit on one message: 256 MiB.
pub const DEFAULT_MAX_MESSAGE: usize = 256 << 20;

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
    /// Not a fedweave message, or of another version.
    #[error("not a fedweave message (format `{format}`, version `{version}`)")]
    Format {
        /// What it said it was.
        format: String,
        /// Its version.
        version: String,
    },
    /// Malformed content.
    #[error("malformed message: {0}")]
    Malformed(String),
}

/// Packs a typed message.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, WireError> {
    let meta = HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("version".to_string(), VERSION.to_string()),
    ]);
    pack(value, meta).map_err(WireError::Malformed)
}

/// Unpacks a typed message of at most `limit` bytes.
pub fn decode<T: DeserializeOwned>(payload: &[u8], limit: usize) -> Result<T, WireError> {
    if payload.len() > limit {
        return Err(WireError::TooLarge {
            size: payload.len(),
            limit,
        });
    }
    let u = Unpacked::parse(payload).map_err(WireError::Malformed)?;
    if u.get("format") != FORMAT || u.get("version") != VERSION {
        return Err(WireError::Format {
            format: u.get("format").chars().take(64).collect(),
            version: u.get("version").chars().take(16).collect(),
        });
    }
    u.value().map_err(WireError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model as the algorithms' messages carry one: stashed, so it
    /// travels as raw floats (a plain `Vec<f32>` goes through JSON, where a
    /// NaN has no spelling).
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
            Err(WireError::Format { .. }) | Err(WireError::Malformed(_))
        ));
        let other = pack(&1u8, HashMap::new()).unwrap();
        assert!(matches!(
            decode::<Task<Model>>(&other, 1 << 20),
            Err(WireError::Format { .. })
        ));
        // The right envelope around the wrong type.
        let wrong = encode(&Reply::<Model>::Received { after: None }).unwrap();
        assert!(matches!(
            decode::<Task<Model>>(&wrong, 1 << 20),
            Err(WireError::Malformed(_))
        ));
    }
}
