//! Objectives with trainable parameters of their own, beyond the model's
//! layout (FedCP's conditional policy network).
//!
//! An [`AuxObjective`] receives the batch's features, the model's head as a
//! function it may apply to any features, and an auxiliary parameter vector
//! as an autodiff leaf. [`crate::LocalTrainer::loss_and_grad_aux`]
//! differentiates the loss with respect to both the model (kept for
//! [`crate::LocalTrainer::step`]) and the auxiliary vector (returned to the
//! caller, who updates it). The model-only paths of the trainer are
//! untouched: their results stay bit-identical.

use burn::tensor::Tensor;

/// The body's output on a mini-batch and the model's head.
pub struct Body<'a> {
    /// The body's output, `[batch, feature_len]`.
    pub features: Tensor<2>,
    head: &'a dyn Fn(Tensor<2>) -> Tensor<2>,
}

impl<'a> Body<'a> {
    /// Features and the head that maps any `[batch, feature_len]` tensor to
    /// outputs (during training, differentiable in the head's parameters).
    pub fn new(features: Tensor<2>, head: &'a dyn Fn(Tensor<2>) -> Tensor<2>) -> Self {
        Self { features, head }
    }

    /// The model's head applied to `features` (e.g. a masked copy of
    /// [`Body::features`]).
    pub fn head(&self, features: Tensor<2>) -> Tensor<2> {
        (self.head)(features)
    }
}

/// A classification loss over one mini-batch that reads, besides the model,
/// an auxiliary parameter vector `aux` (rank 1, the length the caller
/// passes), differentiated by the backend. Used through
/// [`crate::LocalTrainer::loss_and_grad_aux`].
pub trait AuxObjective: Sync {
    /// The mean loss of the mini-batch, shape `[1]`; `batch` are the
    /// samples' local positions and `labels` their classes.
    fn loss(&self, body: Body, aux: Tensor<1>, batch: &[usize], labels: &[i64]) -> Tensor<1>;
}
