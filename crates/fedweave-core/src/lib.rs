//! fedweave-core: the backend-independent vocabulary of fedweave.
//!
//! Models cross every boundary as flat `f32` vectors described by a
//! [`ParamLayout`]; every algorithm expresses "who learns from whom" as a
//! [`CollaborationGraph`]; every random choice comes from an [`RngStream`]
//! keyed by (seed, round, client, purpose) so results never depend on thread
//! scheduling.

pub mod graph;
pub mod layout;
pub mod pairwise;
pub mod qp;
pub mod rng;
pub mod simd;
pub mod simplex;
pub mod sparse;
pub mod stash;
pub mod vecmath;

pub use graph::CollaborationGraph;
pub use layout::{LayerGroup, ParamLayout, TensorSpec};
pub use rng::{Purpose, RngStream, rng_stream};
pub use simplex::project_to_simplex;
pub use sparse::{RelationGraph, RelationGraphError};
