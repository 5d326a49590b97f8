//! fedweave-nn: models, local training and evaluation.
//!
//! This is the only crate that touches the deep-learning backend (burn with
//! its pure-Rust `flex` CPU backend). Models cross its boundary as flat `f32`
//! vectors described by a [`fedweave_core::ParamLayout`], so every piece of
//! federated-learning math outside it stays backend-independent. Within a
//! local round the model lives in the backend: a [`LocalTrainer`] loads it
//! once, runs forward/backward and the momentum-SGD steps there, and copies
//! it back at the end; the algorithms' extra loss terms ([`ExtraLoss`]) are
//! written on flat vectors. [`train_local`] is the whole round in one call;
//! algorithms that need step-level control drive a [`LocalTrainer`] and a
//! [`BatchSampler`] themselves.
//! Objectives with trainable parameters beyond the model ([`AuxObjective`],
//! e.g. FedCP's policy network in [`conditional`]) go through
//! [`LocalTrainer::loss_and_grad_aux`].

#![warn(missing_docs)]

pub mod augment;
pub mod auxiliary;
mod batch;
pub mod conditional;
mod embed;
pub mod extra;
pub mod model;
pub mod objective;
mod resnet;
pub mod train;
pub mod trainer;

pub use augment::Augment;
pub use auxiliary::{AuxObjective, Body};
pub use batch::LocalData;
/// The backend device a [`LocalTrainer`] runs on (`Device::flex()`: the CPU
/// backend, the only one enabled), re-exported so callers need no burn
/// dependency.
pub use burn::tensor::Device;
pub use conditional::{ConditionalPolicy, PolicyObjective};
pub use extra::{CosinePull, ExtraLoss, Proximal};
pub use model::{
    InputValues, MF_EMBED_DIM, ModelInput, ModelKind, ModelSpec, ModelSplit, RegressionLoss,
    TEXTCNN_EMBED_DIM,
};
pub use objective::{BalancedSoftmax, CrossEntropy, Objective, Outputs, PrototypePull};
pub use objective::{InheritedMmd, mmd_rbf};
pub use train::{
    EvalStats, MAPE_MIN_ABS, Predictions, SgdState, TrainConfig, TrainStats, evaluate, predict,
    train_local, train_local_with,
};
pub use trainer::{BatchSampler, LocalTrainer, SgdConfig};

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
