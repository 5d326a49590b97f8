//! Step-level local training: a [`LocalTrainer`] session and the
//! [`BatchSampler`] that feeds it.
//!
//! [`train_local`](crate::train_local) runs a whole local round in one call,
//! which is all FedAvg-like methods need. pFedMe, Per-FedAvg, Ditto, APFL or
//! FedRep need control *inside* the round (two batches per step, an inner
//! solver, a second model, alternating frozen parts), so the round is split
//! into its pieces: a session created once per round, a mini-batch sampler,
//! [`loss_and_grad`](LocalTrainer::loss_and_grad) and
//! [`step`](LocalTrainer::step). `train_local` is a short loop over them.
//!
//! # Where the numbers live
//!
//! The session loads the parameters into the backend once, as one rank-1
//! tensor per layout tensor, and keeps them there, with the gradient and
//! the momentum buffer, until [`store`](LocalTrainer::store): a later GPU
//! backend then moves data only for the mini-batches, not the model, at
//! every step. Each step makes autodiff leaves of these tensors (a reshape,
//! no copy) and the optimiser updates them with element-wise tensor ops.
//!
//! Batch-norm running statistics stay on the device too (`RunningStats`):
//! on the CPU they are folded after each step from the statistics the
//! forward pass records; off the CPU batch norm's kernel folds them in
//! place.
//!
//! # Exactness
//!
//! The refactor from the flat-vector trainer changes no float (a golden test
//! pins every bit, for every architecture). What makes that hold:
//!
//! - Momentum SGD is `g ← grad + wd·θ; buf ← m·buf + g; θ ← θ − lr·buf`, one
//!   rounded f32 operation per element per tensor op, exactly the
//!   arithmetic of the former host loop (the backend's element-wise kernels
//!   use no fused multiply-add). Frozen elements get their old θ and buffer
//!   back by copying, never by arithmetic.
//! - On the CPU the [`ExtraLoss`] terms run in their host form: the session
//!   reads θ and the gradient to the host, lets each term add its gradient
//!   and writes the gradient back. Their reductions (norms and dot products
//!   in f64, in index order) would round differently as backend reductions,
//!   and on `flex` "device" memory is host memory, so these copies are
//!   memcpys. On a GPU backend the terms run in their tensor form
//!   ([`ExtraLoss::on_device`]): constants uploaded once per
//!   [`Terms`], gradients added on the device, so the model stays there for
//!   the whole round. [`LocalTrainer::terms_on_device`] picks the form
//!   explicitly (the tests compare the two on the CPU).
//! - Parameters are leaves of their own contiguous buffers, as before, so
//!   the backend's kernels see the same shapes and strides.
//!
//! # Cost on the CPU backend
//!
//! On `flex`, keeping the model in the backend saves the per-step copies
//! (flat vector → tensors, gradients → flat vector) but the optimiser runs
//! as six element-wise passes with two temporaries per tensor instead of one
//! fused host loop. `benches/train_throughput.rs` (10 steps of batch 64, on
//! a shared 2-core machine, so ±10 %) measured before → after: cnn 1×28×28
//! about equal (87 → 85 ms, 105 → 107 ms), cnn-bn faster (853 → 590 ms,
//! 1020 → 881 ms: fewer large allocations per step), mlp slower (11.0 →
//! 14.2 ms, 13.1 → 14.3 ms: there the SGD passes weigh against a cheap
//! forward pass). The layout pays off on a GPU, where the copies would be
//! transfers.

use crate::Augment;
use crate::auxiliary::{AuxObjective, Body};
use crate::batch::{Batch, LocalData};
use crate::extra::{DeviceTerm, ExtraLoss, PartsTerm};
use crate::kernels::{Sgd, on_cpu, sgd_momentum, sgd_momentum_rows, with_parts, with_values};
use crate::model::{ModelSpec, Norm, ParamTensor, RegressionLoss};
use crate::objective::{Objective, Outputs, cross_entropy};
use crate::resident::{LossLog, RunningStats};
use crate::train::SgdState;
use burn::tensor::{Device, Tensor, TensorData};
use fedweave_core::{Purpose, rng_stream};
use rand::Rng;
use rand::seq::SliceRandom;
use std::ops::Range;

/// The optimiser's settings other than the learning rate, which
/// [`LocalTrainer::step`] takes per call so that methods with two step sizes
/// (Per-FedAvg's α and β, pFedMe's inner and outer rates) share one session.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SgdConfig {
    /// Momentum (PyTorch semantics, dampening 0; 0 = plain SGD).
    pub momentum: f32,
    /// L2 weight decay added to the gradient.
    pub weight_decay: f32,
}

impl SgdConfig {
    /// The constants of one step with learning rate `lr`.
    pub(crate) fn with_lr(self, lr: f32) -> Sgd {
        Sgd {
            lr,
            momentum: self.momentum,
            weight_decay: self.weight_decay,
        }
    }
}

/// Walks a client's samples in mini-batches in a shuffled order, reshuffled
/// at every pass; the last batch of a pass may be smaller.
///
/// Public so that algorithms writing their own loop draw batches exactly as
/// [`train_local`](crate::train_local) does (same order for the same rng),
/// and can draw several per step (Per-FedAvg).
#[derive(Clone, Debug)]
pub struct BatchSampler {
    order: Vec<usize>,
    cursor: usize,
    batch_size: usize,
}

impl BatchSampler {
    /// A sampler over local positions `0..n` in batches of `batch_size`
    /// (at least 1); draws the first pass's order from `rng` now.
    pub fn new(n: usize, batch_size: usize, rng: &mut impl Rng) -> Self {
        let mut order: Vec<usize> = (0..n).collect();
        order.shuffle(rng);
        Self {
            order,
            cursor: 0,
            batch_size: batch_size.max(1),
        }
    }

    /// The local positions of the next mini-batch (empty only when there are
    /// no samples); starts a new pass, drawing its order from `rng`, when the
    /// current one is used up.
    pub fn next_batch(&mut self, rng: &mut impl Rng) -> &[usize] {
        let n = self.order.len();
        if self.cursor >= n {
            self.order.shuffle(rng);
            self.cursor = 0;
        }
        let start = self.cursor;
        self.cursor = (start + self.batch_size).min(n);
        &self.order[start..self.cursor]
    }
}

/// One client's local training session: the model, its gradient and the
/// optimiser's momentum held by the backend for a whole local round.
///
/// Create it once per round, call [`loss_and_grad`](Self::loss_and_grad) and
/// [`step`](Self::step) as the algorithm requires, then
/// [`store`](Self::store) the result (and [`store_state`](Self::store_state)
/// when the optimiser's state must outlive the round). See the
/// [module documentation](crate::trainer) for where the numbers live and why results
/// equal those of the former flat-vector trainer bit for bit.
pub struct LocalTrainer<'a> {
    spec: &'a ModelSpec,
    /// The autodiff device the forward pass runs on.
    device: Device,
    sgd: SgdConfig,
    /// One rank-1 tensor per layout tensor, without autodiff.
    params: Vec<Tensor<1>>,
    /// Momentum buffers, shaped as `params`.
    momentum: Vec<Tensor<1>>,
    /// The gradient of the last `loss_and_grad`, shaped as `params`.
    grad: Option<Vec<Tensor<1>>>,
    /// Batch-norm running statistics (one row), on the device.
    running: RunningStats,
    /// Losses of [`loss_and_grad_deferred`](Self::loss_and_grad_deferred)
    /// steps, on the device until [`take_losses`](Self::take_losses).
    losses: LossLog,
    /// Reused mini-batch supervision.
    y: Batch,
    /// Key of the augmentation draws ([`seed_augmentation`](Self::seed_augmentation)).
    augment_key: u64,
    /// Augmented mini-batches so far: the index of the next one's draws.
    augmented: u64,
    /// Mini-batches trained with dropout so far: the index of the next
    /// one's masks (a counter of its own, so augmentation's numbering does
    /// not depend on the model).
    dropped: u64,
    /// Run the extra terms' tensor forms (GPU backends) rather than their
    /// host forms (the CPU).
    terms_on_device: bool,
    /// Flat θ and gradient for the extra terms' host forms, kept between
    /// steps so that a step does not allocate and zero two model-sized
    /// vectors.
    host_theta: Vec<f32>,
    host_grad: Vec<f32>,
    /// `[1]` = 1 on the device: the one row of the grouped update
    /// ([`step`](Self::step) off the CPU) takes the step.
    active: Tensor<1>,
}

/// A training call's extra terms, made ready for a session by
/// [`LocalTrainer::prepare`]: tensor forms with their constants on the
/// device where the session runs terms there, host forms otherwise.
pub struct Terms<'t> {
    on_device: Vec<Box<dyn DeviceTerm>>,
    on_host: Vec<&'t dyn ExtraLoss>,
}

impl<'a> LocalTrainer<'a> {
    /// Loads `params` and batch-norm `buffers` of a `spec` model onto
    /// `device` (autodiff is enabled on it here; `Device::flex()` is the CPU
    /// backend). The momentum buffer starts from `state` when it has one of
    /// the right length, else at zero, as a fresh PyTorch optimiser.
    ///
    /// # Panics
    ///
    /// If `params` or `buffers` do not match the spec's lengths.
    pub fn new(
        spec: &'a ModelSpec,
        device: &Device,
        params: &[f32],
        buffers: &[f32],
        sgd: SgdConfig,
        state: Option<&SgdState>,
    ) -> Self {
        let layout = spec.layout();
        assert_eq!(params.len(), layout.len(), "parameter vector length");
        assert_eq!(buffers.len(), spec.buffer_len(), "buffer vector length");
        let inner = device.clone().inner();
        let upload =
            |v: &[f32]| upload_parts(v, layout.tensors().iter().map(|t| t.range()), &inner);
        let momentum = match state {
            Some(s) if s.momentum.len() == params.len() => upload(&s.momentum),
            _ => layout
                .tensors()
                .iter()
                .map(|t| Tensor::zeros([t.range().len()], &inner))
                .collect(),
        };
        Self {
            spec,
            device: device.clone().autodiff(),
            sgd,
            params: upload(params),
            momentum,
            grad: None,
            running: RunningStats::upload(spec, &[buffers], &inner),
            losses: LossLog::default(),
            y: Batch::default(),
            augment_key: 0,
            augmented: 0,
            dropped: 0,
            terms_on_device: *device != Device::flex(),
            host_theta: Vec::new(),
            host_grad: Vec::new(),
            active: Tensor::ones([1], &inner),
        }
    }

    /// Runs the extra terms in their tensor form on the session's device
    /// (`true`) or in their host form (`false`). The default is the tensor
    /// form on GPU backends and the host form on the CPU, whose results
    /// every golden pins; the two agree to floating-point tolerance.
    pub fn terms_on_device(mut self, on: bool) -> Self {
        self.terms_on_device = on;
        self
    }

    /// Makes `extras` ready for this session: on the device, each term's
    /// constants are uploaded here, so a round that keeps its terms
    /// prepares them once and calls
    /// [`loss_and_grad_prepared`](Self::loss_and_grad_prepared).
    pub fn prepare<'t>(&self, extras: &[&'t dyn ExtraLoss]) -> Terms<'t> {
        let mut terms = Terms {
            on_device: Vec::new(),
            on_host: Vec::new(),
        };
        if !self.terms_on_device {
            terms.on_host = extras.to_vec();
            return terms;
        }
        let parts: Vec<Range<usize>> = self
            .spec
            .layout()
            .tensors()
            .iter()
            .map(|t| t.range())
            .collect();
        let device = self.device.clone().inner();
        for &e in extras {
            match e.on_device(&parts, &device) {
                Some(t) => terms.on_device.push(t),
                None => terms.on_host.push(e),
            }
        }
        terms
    }

    /// Keys the augmentation of this session's mini-batches with a draw
    /// from `rng` (the client's batch stream), so batch `b` of the session
    /// is augmented from the stream `(key, b)`: a function of (seed, round,
    /// client, call, batch), whatever the thread count. Call it once, after
    /// creating the [`BatchSampler`], when the training data has an
    /// [`Augment`]; without it the key is 0.
    pub fn seed_augmentation(&mut self, rng: &mut impl Rng) {
        self.augment_key = rng.random();
    }

    /// Gives this session `other`'s augmentation key and position, so two
    /// sessions fed the same batches see the same augmented images (APFL's
    /// global and personal models).
    pub fn augment_like(&mut self, other: &LocalTrainer) {
        self.augment_key = other.augment_key;
        self.augmented = other.augmented;
        self.dropped = other.dropped;
    }

    /// Computes the mean task loss of the samples at local positions `batch`
    /// of `data` (cross-entropy, or the model's masked regression loss,
    /// [`crate::ModelSpec::regression_loss`]) and
    /// its gradient, adds every `extras` term's gradient at the current
    /// parameters, and keeps the sum in the session for the next
    /// [`step`](Self::step) (replacing any earlier gradient). Batch norm
    /// normalises with the batch's statistics and folds them into the
    /// session's running buffers. Returns the task loss only: the extra
    /// terms' values are the algorithms' business.
    ///
    /// # Panics
    ///
    /// If `batch` is empty.
    pub fn loss_and_grad(
        &mut self,
        data: &LocalData,
        batch: &[usize],
        extras: &[&dyn ExtraLoss],
    ) -> f64 {
        let terms = self.prepare(extras);
        scalar(&self.backward_with(data, batch, &terms, Loss::Task))
    }

    /// As [`loss_and_grad`](Self::loss_and_grad) (or
    /// [`loss_and_grad_with`](Self::loss_and_grad_with) when `objective` is
    /// given) with terms made ready once by [`prepare`](Self::prepare).
    pub fn loss_and_grad_prepared(
        &mut self,
        data: &LocalData,
        batch: &[usize],
        terms: &Terms,
        objective: Option<&dyn Objective>,
    ) -> f64 {
        scalar(&self.backward_prepared(data, batch, terms, objective))
    }

    /// As [`loss_and_grad_prepared`](Self::loss_and_grad_prepared), but the
    /// loss stays on the device, appended to the session's log, until
    /// [`take_losses`](Self::take_losses): on a GPU the host then queues
    /// the next step while the device runs this one. The loop of
    /// [`train_local`](crate::train_local).
    pub fn loss_and_grad_deferred(
        &mut self,
        data: &LocalData,
        batch: &[usize],
        terms: &Terms,
        objective: Option<&dyn Objective>,
    ) {
        let loss = self.backward_prepared(data, batch, terms, objective);
        debug_assert_eq!(loss.dims(), [1], "a loss is one value");
        self.losses.push(loss);
    }

    /// The losses of the [`loss_and_grad_deferred`](Self::loss_and_grad_deferred)
    /// steps since the last call, in order, read in one transfer.
    pub fn take_losses(&mut self) -> Vec<f64> {
        self.losses.take().into_iter().map(f64::from).collect()
    }

    fn backward_prepared(
        &mut self,
        data: &LocalData,
        batch: &[usize],
        terms: &Terms,
        objective: Option<&dyn Objective>,
    ) -> Tensor<1> {
        let loss = match objective {
            Some(objective) => Loss::Objective(objective),
            None => Loss::Task,
        };
        self.backward_with(data, batch, terms, loss)
    }

    /// As [`loss_and_grad`](Self::loss_and_grad), with `objective` in place
    /// of the task loss: it sees the batch's features and logits (FedRoD's
    /// balanced softmax, FedProto's prototype pull). Returns the objective's
    /// value. Classification only.
    ///
    /// # Panics
    ///
    /// If `batch` is empty.
    pub fn loss_and_grad_with(
        &mut self,
        data: &LocalData,
        batch: &[usize],
        extras: &[&dyn ExtraLoss],
        objective: &dyn Objective,
    ) -> f64 {
        let terms = self.prepare(extras);
        scalar(&self.backward_with(data, batch, &terms, Loss::Objective(objective)))
    }

    /// As [`loss_and_grad_with`](Self::loss_and_grad_with) for an objective
    /// with trainable parameters of its own (FedCP's conditional policy
    /// network): `aux` becomes an autodiff leaf the objective reads, and the
    /// gradient of the loss with respect to it is written to `aux_grad`
    /// (zeros where the loss does not depend on it). The model's gradient is
    /// kept for [`step`](Self::step) as usual; updating `aux` is the
    /// caller's business. Returns the objective's value. Classification
    /// only.
    ///
    /// # Panics
    ///
    /// If `batch` is empty or `aux_grad` is not as long as `aux`.
    pub fn loss_and_grad_aux(
        &mut self,
        data: &LocalData,
        batch: &[usize],
        extras: &[&dyn ExtraLoss],
        objective: &dyn AuxObjective,
        aux: &[f32],
        aux_grad: &mut [f32],
    ) -> f64 {
        assert_eq!(aux.len(), aux_grad.len(), "auxiliary gradient length");
        let terms = self.prepare(extras);
        scalar(&self.backward_with(data, batch, &terms, Loss::Aux(objective, aux, aux_grad)))
    }

    fn backward_with(
        &mut self,
        data: &LocalData,
        batch: &[usize],
        terms: &Terms,
        objective: Loss,
    ) -> Tensor<1> {
        assert!(!batch.is_empty(), "a mini-batch needs samples");
        let spec = self.spec;
        let input_len = spec.input_len();
        let mut x = Vec::with_capacity(batch.len() * input_len);
        data.gather(batch, input_len, &mut x, &mut self.y);
        if data.augment != Augment::None {
            let shape = <[usize; 3]>::try_from(spec.input_shape())
                .expect("augmentation is checked against the input shape at setup");
            let mut rng = rng_stream(self.augment_key, self.augmented, 0, Purpose::Augment);
            data.augment.apply(shape, &mut x, &mut rng);
            self.augmented += 1;
        }
        let leaves: Vec<ParamTensor> = self
            .params
            .iter()
            .zip(spec.layout().tensors())
            .map(|(p, t)| ParamTensor::leaf(p.clone(), &t.shape))
            .collect();
        let xt: Tensor<2> =
            Tensor::from_data(TensorData::new(x, [batch.len(), input_len]), &self.device);
        // Dropout masks: stream (key, b) on a client slot of their own.
        let masks = spec.draws_in_training().then(|| {
            self.dropped += 1;
            Box::new(rng_stream(
                self.augment_key,
                self.dropped - 1,
                1,
                Purpose::Augment,
            ))
        });
        // The running statistics, lent to the forward pass: off the CPU its
        // batch norms fold the batch into them in place.
        let mut running = std::mem::replace(&mut self.running, RunningStats::empty());
        let mut norm = Norm::Batch(Vec::new(), masks, Some(&mut running));
        let mut aux_leaf = None;
        let loss = match &objective {
            Loss::Objective(objective) => {
                let features = spec.features(&leaves, xt, &mut norm);
                let logits = spec.head(&leaves, features.clone());
                objective.loss(Outputs { features, logits }, batch, &self.y.labels)
            }
            Loss::Aux(objective, aux, _) => {
                let leaf = flat_tensor(aux, &self.device.clone().inner())
                    .autodiff()
                    .require_grad();
                aux_leaf = Some(leaf.clone());
                let features = spec.features(&leaves, xt, &mut norm);
                let head = |f: Tensor<2>| spec.head(&leaves, f);
                objective.loss(Body::new(features, &head), leaf, batch, &self.y.labels)
            }
            Loss::Task => {
                let out = spec.forward(&leaves, xt, &mut norm);
                if data.is_regression() {
                    masked_error(out, &self.y, &self.device, spec.regression_loss())
                } else {
                    cross_entropy(out, &self.y.labels)
                }
            }
        };
        let mut grads = loss.backward();
        let value = loss.inner();
        if let (Loss::Aux(_, _, aux_grad), Some(leaf)) = (objective, aux_leaf) {
            match leaf.grad(&grads) {
                Some(g) => with_values(&g, |g| aux_grad.copy_from_slice(g)),
                None => aux_grad.fill(0.0),
            }
        }
        let mut grad: Vec<Tensor<1>> = leaves
            .iter()
            .zip(&self.params)
            .map(|(leaf, p)| leaf.grad_flat(&mut grads).unwrap_or_else(|| p.zeros_like()))
            .collect();
        for t in &terms.on_device {
            t.add_grad(&self.params, &mut grad);
        }
        let on_parts: Option<Vec<&dyn PartsTerm>> =
            terms.on_host.iter().map(|e| e.on_parts()).collect();
        if let Some(parts_terms) = on_parts.filter(|p| !p.is_empty()) {
            // In the gradient's own buffers, θ read in place.
            grad = with_parts(&self.params, grad, |theta, g| {
                for e in &parts_terms {
                    e.add_grad_parts(theta, g);
                }
            })
            .unwrap_or_else(|grad| self.add_host_terms_flat(&terms.on_host, grad));
        } else if !terms.on_host.is_empty() {
            grad = self.add_host_terms_flat(&terms.on_host, grad);
        }
        self.grad = Some(grad);
        if let Norm::Batch(record, _, _) = norm {
            running.fold(record, &[batch.len()]);
        }
        self.running = running;
        value
    }

    /// One momentum-SGD step with learning rate `lr` along the gradient of
    /// the last [`loss_and_grad`](Self::loss_and_grad):
    /// `buf ← m·buf + (g + wd·θ)`, `θ ← θ − lr·buf` (PyTorch, dampening 0).
    /// Elements in any of the `frozen` ranges of the flat vector (e.g. a
    /// layer group's `range` from the layout; FedRep's alternating head and
    /// base) keep their parameter and momentum. The gradient stays, so a
    /// step can be repeated or taken from other parameters
    /// ([`load_params`](Self::load_params), Per-FedAvg).
    ///
    /// # Panics
    ///
    /// If no gradient has been computed yet.
    pub fn step(&mut self, frozen: &[Range<usize>], lr: f32) {
        let grad = self
            .grad
            .as_ref()
            .expect("LocalTrainer::step needs a gradient: call loss_and_grad first");
        let hyper = self.sgd.with_lr(lr);
        if frozen.is_empty() && !on_cpu(&self.active) {
            // Off the CPU: a few tensors a launch, in their buffers.
            let rows = |ts: &[Tensor<1>]| -> Vec<Tensor<2>> {
                ts.iter()
                    .map(|t| t.clone().reshape([1, t.dims()[0]]))
                    .collect()
            };
            let (mut thetas, mut bufs) = (rows(&self.params), rows(&self.momentum));
            sgd_momentum_rows(&mut thetas, &mut bufs, rows(grad), &self.active, hyper);
            let flat = |ts: Vec<Tensor<2>>| -> Vec<Tensor<1>> {
                ts.into_iter()
                    .map(|t| {
                        let n = t.dims()[1];
                        t.reshape([n])
                    })
                    .collect()
            };
            (self.params, self.momentum) = (flat(thetas), flat(bufs));
            return;
        }
        let params = std::mem::take(&mut self.params);
        let buffers = std::mem::take(&mut self.momentum);
        let tensors = self.spec.layout().tensors();
        for (((theta, buf), g), spec_t) in params.into_iter().zip(buffers).zip(grad).zip(tensors) {
            let range = spec_t.range();
            let kept = frozen_within(frozen, &range);
            if kept.first() == Some(&(0..range.len())) {
                self.params.push(theta);
                self.momentum.push(buf);
                continue;
            }
            let (old_theta, old_buf) = if kept.is_empty() {
                (None, None)
            } else {
                (Some(theta.clone()), Some(buf.clone()))
            };
            let (mut theta, mut buf) = sgd_momentum(theta, buf, g.clone(), hyper);
            if let (Some(old_theta), Some(old_buf)) = (old_theta, old_buf) {
                for r in kept {
                    theta = theta.slice_assign([r.clone()], old_theta.clone().slice([r.clone()]));
                    buf = buf.slice_assign([r.clone()], old_buf.clone().slice([r]));
                }
            }
            self.params.push(theta);
            self.momentum.push(buf);
        }
    }

    /// Copies the current parameters into `params` and the running
    /// batch-norm statistics into `buffers`: the end of a round.
    ///
    /// # Panics
    ///
    /// If the lengths do not match the spec.
    pub fn store(&self, params: &mut [f32], buffers: &mut [f32]) {
        self.read_params(params);
        assert_eq!(
            buffers.len(),
            self.spec.buffer_len(),
            "buffer vector length"
        );
        self.running.read(self.spec, 0, buffers);
    }

    /// Saves the momentum buffer into `state`, for optimisers that survive
    /// rounds (DPFL); pass it to the next round's [`new`](Self::new).
    pub fn store_state(&self, state: &mut SgdState) {
        state.momentum = self.read_all(&self.momentum);
    }

    /// Copies the current parameters into `out` (e.g. for a term that needs
    /// them, or pFedMe's outer update).
    ///
    /// # Panics
    ///
    /// If `out` does not have the parameter vector's length.
    pub fn read_params(&self, out: &mut [f32]) {
        self.read_into(&self.params, out);
    }

    /// Replaces the parameters mid-round (pFedMe's inner problem,
    /// Per-FedAvg's step from the pre-adaptation model), keeping the
    /// momentum buffer, the gradient and the running statistics.
    ///
    /// # Panics
    ///
    /// If `params` does not have the parameter vector's length.
    pub fn load_params(&mut self, params: &[f32]) {
        assert_eq!(
            params.len(),
            self.spec.layout().len(),
            "parameter vector length"
        );
        self.params = self.upload(params);
    }

    /// Copies the gradient of the last [`loss_and_grad`](Self::loss_and_grad)
    /// (task loss plus extra terms) into `out`, for methods that combine
    /// gradients themselves.
    ///
    /// # Panics
    ///
    /// If no gradient has been computed yet, or `out` has the wrong length.
    pub fn read_grad(&self, out: &mut [f32]) {
        let grad = self.grad.as_ref().expect("no gradient computed yet");
        self.read_into(grad, out);
    }

    /// The running batch-norm statistics as updated so far this round
    /// (read from the device).
    pub fn buffers(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.spec.buffer_len()];
        self.running.read(self.spec, 0, &mut out);
        out
    }

    /// One tensor per layout tensor from a flat vector, on the inner device.
    /// The host terms on θ and `grad` joined into flat vectors (terms
    /// without a parts form, or tensors off the CPU), `grad` split again.
    fn add_host_terms_flat(
        &mut self,
        terms: &[&dyn ExtraLoss],
        grad: Vec<Tensor<1>>,
    ) -> Vec<Tensor<1>> {
        let mut theta = std::mem::take(&mut self.host_theta);
        let mut g = std::mem::take(&mut self.host_grad);
        flatten(&self.params, &mut theta);
        flatten(&grad, &mut g);
        for e in terms {
            e.add_value_and_grad(&theta, &mut g);
        }
        let grad = self.upload(&g);
        (self.host_theta, self.host_grad) = (theta, g);
        grad
    }

    fn upload(&self, flat: &[f32]) -> Vec<Tensor<1>> {
        let ranges = self.spec.layout().tensors().iter().map(|t| t.range());
        upload_parts(flat, ranges, &self.device.clone().inner())
    }

    fn read_all(&self, parts: &[Tensor<1>]) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.spec.layout().len());
        flatten(parts, &mut out);
        out
    }

    fn read_into(&self, parts: &[Tensor<1>], out: &mut [f32]) {
        assert_eq!(
            out.len(),
            self.spec.layout().len(),
            "parameter vector length"
        );
        for (t, spec_t) in parts.iter().zip(self.spec.layout().tensors()) {
            with_values(t, |v| out[spec_t.range()].copy_from_slice(v));
        }
    }
}

/// `out` becomes the concatenation of `parts`' `f32` values (its capacity
/// reserved once: grown part by part, a new trainer's first step copied
/// the vector at every doubling).
fn flatten(parts: &[Tensor<1>], out: &mut Vec<f32>) {
    out.clear();
    out.reserve(parts.iter().map(|t| t.dims()[0]).sum());
    for t in parts {
        with_values(t, |v| out.extend_from_slice(v));
    }
}

/// What a backward pass differentiates.
enum Loss<'o> {
    /// The task loss on the outputs.
    Task,
    /// A feature-level objective.
    Objective(&'o dyn Objective),
    /// An objective with its own parameters, and where their gradient goes.
    Aux(&'o dyn AuxObjective, &'o [f32], &'o mut [f32]),
}

/// `values` cut at `parts` (the layout's tensors), one rank-1 tensor each on
/// `device`.
pub(crate) fn upload_parts(
    values: &[f32],
    parts: impl IntoIterator<Item = Range<usize>>,
    device: &Device,
) -> Vec<Tensor<1>> {
    parts
        .into_iter()
        .map(|r| flat_tensor(&values[r], device))
        .collect()
}

fn flat_tensor(values: &[f32], device: &Device) -> Tensor<1> {
    Tensor::from_data(TensorData::new(values.to_vec(), [values.len()]), device)
}

/// The parts of `range` that lie in any `frozen` range, merged, sorted and
/// relative to `range.start`.
fn frozen_within(frozen: &[Range<usize>], range: &Range<usize>) -> Vec<Range<usize>> {
    let mut parts: Vec<Range<usize>> = frozen
        .iter()
        .map(|r| r.start.max(range.start)..r.end.min(range.end))
        .filter(|r| r.start < r.end)
        .map(|r| r.start - range.start..r.end - range.start)
        .collect();
    parts.sort_by_key(|r| r.start);
    let mut merged: Vec<Range<usize>> = Vec::with_capacity(parts.len());
    for r in parts {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    merged
}

/// Mean absolute error (the standard loss of graph traffic forecasting;
/// robust to the outliers of sensor data and the metric reported) or mean
/// squared error (matrix factorisation of ratings) over the observed
/// targets of a batch. Unobserved targets carry no gradient.
fn masked_error(pred: Tensor<2>, y: &Batch, device: &Device, loss: RegressionLoss) -> Tensor<1> {
    let shape = pred.dims();
    let target: Tensor<2> = Tensor::from_data(TensorData::new(y.targets.clone(), shape), device);
    let observed: Tensor<2> = Tensor::from_data(TensorData::new(y.observed.clone(), shape), device);
    let count = y.observed.iter().sum::<f32>().max(1.0);
    let diff = pred - target;
    let err = match loss {
        RegressionLoss::Mae => diff.abs(),
        RegressionLoss::Mse => diff.square(),
    };
    err.mul(observed).sum().div_scalar(count).reshape([1])
}

fn scalar(t: &Tensor<1>) -> f64 {
    t.to_data()
        .as_slice::<f32>()
        .map(|s| s[0] as f64)
        .unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_parts_are_clipped_merged_and_relative() {
        let r = 10..20;
        assert!(frozen_within(&[], &r).is_empty());
        assert!(frozen_within(&[0..10, 20..30], &r).is_empty());
        assert_eq!(
            frozen_within(std::slice::from_ref(&(0..30)), &r),
            vec![0..10]
        );
        assert_eq!(
            frozen_within(&[15..18, 12..16, 19..25, 3..11], &r),
            vec![0..1, 2..8, 9..10]
        );
        assert_eq!(
            frozen_within(std::slice::from_ref(&(12..12)), &r),
            Vec::<Range<usize>>::new()
        );
    }
}
