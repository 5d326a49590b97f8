//! fedweave-nn: models, local training and evaluation.
//!
//! This is the only crate that touches the deep-learning backend (burn with
//! its pure-Rust `flex` CPU backend). Models cross its boundary as flat `f32`
//! vectors described by a [`fedweave_core::ParamLayout`]: each training step
//! builds the parameter tensors from the flat vector, lets burn's autodiff
//! compute the task-loss gradient, and returns to flat vectors, where the
//! optimiser and the algorithms' extra loss terms ([`ExtraLoss`]) live. That
//! keeps every piece of federated-learning math backend-independent and
//! testable, at a cost of one copy of the parameters per step.

#![warn(missing_docs)]

mod batch;
pub mod extra;
pub mod model;
pub mod train;

pub use batch::LocalData;
pub use extra::{CosinePull, ExtraLoss, Proximal};
pub use model::{ModelKind, ModelSpec};
pub use train::{
    EvalStats, MAPE_MIN_ABS, SgdState, TrainConfig, TrainStats, evaluate, train_local,
};

/// Errors from model construction.
#[derive(Debug, thiserror::Error)]
pub enum NnError {
    /// The model cannot take inputs of this shape.
    #[error("model `{model}` cannot take input of shape {shape:?}: {reason}")]
    BadInputShape {
        /// Model name.
        model: String,
        /// The offending input shape.
        shape: Vec<usize>,
        /// Why.
        reason: String,
    },
}
