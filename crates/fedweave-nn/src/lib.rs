//! fedweave-nn: models, local training and evaluation.
//!
//! This is the only crate that touches the deep-learning backend (burn with
//! its pure-Rust `flex` CPU backend). Models cross its boundary as flat `f32`
//! vectors described by a [`fedweave_core::ParamLayout`], so every piece of
//! federated-learning math outside it stays backend-independent. Within a
//! local round the model lives in the backend: a [`LocalTrainer`] loads it
//! once, runs forward/backward and the momentum-SGD steps there, and copies
//! it back at the end; the algorithms' extra loss terms ([`ExtraLoss`]) are
//! written on flat vectors, with a tensor form ([`DeviceTerm`]) that keeps
//! them on a GPU. [`train_local`] is the whole round in one call;
//! algorithms that need step-level control drive a [`LocalTrainer`] and a
//! [`BatchSampler`] themselves.
//! The architectures are a registry ([`arch`]): one file per model behind
//! one trait, named by a [`ModelKind`] handle; `sequential` builds a model
//! from a configured layer list ([`SequentialConfig`]).
//! Objectives with trainable parameters beyond the model ([`AuxObjective`],
//! e.g. FedCP's policy network in [`conditional`]) go through
//! [`LocalTrainer::loss_and_grad_aux`].

#![warn(missing_docs)]

pub mod arch;
pub mod augment;
pub mod auxiliary;
pub mod backend;
mod batch;
pub mod batched;
pub mod conditional;
pub mod extra;
mod kernels;
pub mod model;
pub mod objective;
pub mod offload;
mod resident;
pub mod throughput;
pub mod train;
pub mod trainer;

pub use arch::sequential::{LayerConfig, SequentialConfig, Width};
pub use arch::{LayerDesc, ModelInfo};
pub use augment::Augment;
pub use auxiliary::{AuxObjective, Body};
pub use backend::{Backend, CpuKernelClass};
pub use batch::LocalData;
pub use batched::{BatchedClient, BatchedTrainer, train_local_batched};
/// The backend device a [`LocalTrainer`] runs on (`Device::flex()`: the CPU
/// backend, the only one enabled), re-exported so callers need no burn
/// dependency.
pub use burn::tensor::Device;
pub use conditional::{ConditionalPolicy, PolicyObjective};
pub use extra::{CosinePull, DeviceTerm, ExtraLoss, Linear, PartsTerm, Proximal};
pub use model::{
    InputValues, MF_EMBED_DIM, ModelInput, ModelKind, ModelSpec, ModelSplit, RegressionLoss,
    TEXTCNN_EMBED_DIM,
};
pub use objective::{
    BalancedSoftmax, CrossEntropy, Objective, Outputs, PrototypePull, WeightedCrossEntropy,
};
pub use objective::{InheritedMmd, ModelContrastive, mmd_rbf};
pub use offload::BurnOffload;
pub use train::{
    EvalStats, MAPE_MIN_ABS, Predictions, SgdState, TrainConfig, TrainStats, evaluate, predict,
    train_local, train_local_with,
};
pub use trainer::{BatchSampler, LocalTrainer, SgdConfig, Terms};

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
    /// A `sequential` model's layer list does not fit its input (or is
    /// malformed): `at` names the layer (`model.layers[3] (linear)`).
    #[error("{at}: {message}")]
    BadLayer {
        /// Where: `model.layers[3] (linear)`, `model.head`.
        at: String,
        /// What is wrong, with the shapes involved.
        message: String,
    },
    /// The configuration asks for a backend this binary was built without.
    #[error(
        "backend `{backend}` is not built into this binary: rebuild with `cargo build --release -p fedweave-cli --features {backend}` (CPU: backend = \"cpu\")"
    )]
    BackendMissing {
        /// The backend's configuration name (= its cargo feature).
        backend: &'static str,
    },
    /// The backend is built in but its device does not work (no GPU, no
    /// driver library).
    #[error(
        "backend `{backend}` is built in but its device does not work here (no GPU or no driver library found)"
    )]
    DeviceUnavailable {
        /// The backend's configuration name.
        backend: &'static str,
    },
    /// A CUDA binary built on LLVM's NVPTX backend finds no
    /// `libdevice.10.bc`, which kernels calling `exp`, `log` or `tanh` link.
    #[error(
        "backend `cuda` needs libdevice.10.bc for kernels using exp/log/tanh, and it is not at {looked}: set CUDA_PATH to a CUDA toolkit (the folder holding nvvm/), or `pip install nvidia-cuda-nvcc-cu12` and set CUDA_PATH to its site-packages/nvidia/cuda_nvcc folder"
    )]
    LibdeviceMissing {
        /// The path(s) looked at.
        looked: String,
    },
    /// The backend's device cannot multiply `f64` matrices, which the
    /// server kernels need (wgpu on most GPUs).
    #[error(
        "backend `{backend}` cannot compute in f64, which the server kernels need: set `device.server_kernels = \"host\"`"
    )]
    NoF64 {
        /// The backend's configuration name.
        backend: &'static str,
    },
    /// A batched round's step could not be recorded or replayed as a
    /// CUDA graph (the round is then trained step by step).
    #[error("capturing a batched training step failed: {reason}")]
    Capture {
        /// What the device said.
        reason: String,
    },
    /// K clients cannot be trained together this way.
    #[error("model `{model}` cannot be trained batched: {reason}")]
    NotBatched {
        /// Model name.
        model: String,
        /// Why.
        reason: String,
    },
}
