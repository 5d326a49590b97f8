//! Many clients at once: K clients' copies of one architecture trained in
//! one set of kernels.
//!
//! A [`BatchedTrainer`] stacks the K clients' parameters (one `[K, len]`
//! tensor per layout tensor, with the momentum buffers beside them) and
//! runs each step for all of them in one forward/backward pass:
//!
//! - linear layers are batched matrix products `[K, B, in] × [K, in, out]`;
//! - conv layers are one grouped convolution: the activations live as
//!   `[B, K·C, H, W]` (client k's channels are the k-th group) and the
//!   weights as `[K·O, C, kh, kw]` with `groups = K`, so pooling and ReLU
//!   need no change; a flatten turns `[B, K·O, h, w]` into `[K, B, O·h·w]`;
//! - batch norm computes per-channel statistics of `[B, K·C, H, W]`, i.e.
//!   per client and channel, over that client's valid samples only.
//!
//! Clients' mini-batches may differ in size (the last batch of a pass, or
//! clients of different sizes): batches are padded to the largest with zero
//! samples whose loss weight is 0 and which batch norm leaves out; a client
//! with no batch at a step (it has taken all its steps) keeps its
//! parameters and momentum exactly. The loss is Σ_k mean-loss_k, whose
//! gradient with respect to client k's parameters is exactly client k's
//! own gradient, since the clients share no parameter.
//!
//! What it computes is what K [`LocalTrainer`](crate::LocalTrainer)s
//! compute (the same momentum SGD, `g ← grad + wd·θ; buf ← m·buf + g;
//! θ ← θ − lr·buf`), up to the summation order inside the kernels: results
//! agree to floating-point tolerance, not bit for bit (tested against
//! [`train_local`](crate::train_local)). Supported: `mlp`, `cnn`, `cnn-bn`,
//! `cnn-dwa`, the three ResNets (their body plan walked with grouped,
//! strided, padded convolutions) and `sequential` models without embedding
//! or dropout layers; each architecture's [`crate::arch`] file has its
//! batched forward pass), classification, the task loss only (no extra terms,
//! objectives or frozen ranges): the local round of FedAvg-like methods.
//!
//! [`train_local_batched`] draws the whole round's batches first and uploads
//! them once; each step reads its own at a counter on the device and
//! writes the new state over the old, so on CUDA the step is recorded once
//! as a graph and replayed for the rest of the round (see
//! `BatchedTrainer::train_plan`; docs/results.md, "GPU, session 24").
//!
//! On the CPU backend this is a throughput experiment (one big kernel
//! instead of K small ones); the design aims at GPUs, where one small model
//! cannot fill the device (see `benches/batched.rs`).

use crate::NnError;
use crate::arch::BatchedInput;
use crate::batch::{Batch, LocalData};
use crate::kernels::{
    Around, REPLAYABLE, add_assign, bias_relu, conv2d, env_choice, masked_batch_norm,
    masked_batch_norm_folding, on_cpu, plan_inputs, plan_row, sgd_momentum_rows, swap_leading,
    weighted_cross_entropy,
};
use crate::model::{BN_EPS, BN_MOMENTUM, ModelSpec, channel_sums};
use crate::resident::{BatchStats, LossLog, RunningStats};
use crate::train::{TrainConfig, TrainStats};
use crate::trainer::{BatchSampler, SgdConfig};
use burn::backend::{Backend, Dispatch, ExecutionError};
use burn::tensor::activation::{log_softmax, relu};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Device, IndexingUpdateOp, Int, Tensor, TensorData};
use rand::Rng;

/// K clients' models of one `spec` trained together on one device.
pub struct BatchedTrainer<'a> {
    spec: &'a ModelSpec,
    /// The autodiff device the forward pass runs on.
    device: Device,
    k: usize,
    sgd: SgdConfig,
    /// `[K, len]` per layout tensor, without autodiff.
    params: Vec<Tensor<2>>,
    /// Momentum buffers, shaped as `params`.
    momentum: Vec<Tensor<2>>,
    /// Each client's batch-norm running statistics (one row each), on the
    /// device.
    running: RunningStats,
    /// Each step's per-client losses (`[K]`), on the device until
    /// [`take_losses`](BatchedTrainer::take_losses).
    losses: LossLog,
    /// Each logged step's batch sizes (0: the client sat it out).
    logged_sizes: Vec<Vec<usize>>,
    /// The clients' samples kept on the device (see
    /// [`keep_samples_on_device`](BatchedTrainer::keep_samples_on_device)).
    resident: Option<Resident<'a>>,
    /// How batch norm is lowered on this device.
    norm: BatchedNorm,
    /// How the loss is lowered on this device.
    loss: BatchedLoss,
}

/// The clients' samples on the device: client c's local sample k is row
/// `offsets[c] + k` of `table` (`[rows + 1, input_len]`, the last row zeros,
/// the padding), valid while client c reads `sources[c]`.
struct Resident<'a> {
    /// Each client's feature table and sample indices, as copied.
    sources: Vec<(&'a [f32], &'a [usize])>,
    offsets: Vec<usize>,
    table: Tensor<2>,
    /// The zero row.
    zero_row: usize,
}

impl Resident<'_> {
    /// Whether every client of `batches` reads the samples copied.
    fn covers(&self, batches: &[(LocalData, &[usize])]) -> bool {
        batches.len() == self.sources.len()
            && batches
                .iter()
                .zip(&self.sources)
                .all(|((data, _), source)| same_samples((data.features, data.indices), *source))
    }
}

/// One step's host arrays, in the layouts [`BatchedTrainer::supervision`]
/// reads, at padded batch `b`.
struct StepArrays {
    /// Resident-table row of each stacked input (`[K·B]`, the zero row for
    /// padding); empty when the step gathers its inputs on the host.
    rows: Vec<i64>,
    /// Labels, client-major (`[K·B]`, 0 for padding).
    labels: Vec<i64>,
    /// Loss weights `1/b_k` (`[K·B]`, client-major, 0 for padding), then
    /// validity (`[B·K]`, sample-major), then batch sizes (`[K]`).
    floats: Vec<f32>,
}

/// A batched round's steps, drawn up front and uploaded once: step `t` is
/// row `t` of `ints` (rows, then labels) and of `floats` (see
/// [`StepArrays`]), every step padded to the round's largest batch `b`.
struct RoundPlan {
    steps: usize,
    b: usize,
    ints: Tensor<2, Int>,
    floats: Tensor<2>,
}

/// What a replayed step keeps on the device besides the model's state.
struct Replay {
    /// The next step's index (an `f32` holding an integer).
    counter: Tensor<1>,
    /// Each client's sum of losses (`[1, K]`).
    loss_sum: Tensor<2>,
    /// `[1]` = 1: the flag of a whole-tensor assignment.
    one: Tensor<1>,
}

/// Ordinary steps before a capture: the first compiles the kernels, the
/// second runs with every buffer the pools will hand out while recording.
const WARMUP_STEPS: usize = 2;

/// Rounds shorter than this are not captured (the warm-up and the
/// recording would be most of them).
const MIN_CAPTURED_STEPS: usize = 8;

/// Whether two clients read the same samples: the same feature table and
/// the same index list (by address, as the trainer borrows them).
fn same_samples(a: (&[f32], &[usize]), b: (&[f32], &[usize])) -> bool {
    std::ptr::eq(a.0, b.0) && std::ptr::eq(a.1, b.1)
}

/// The stacked parameter leaves of one forward pass, reshaped per use.
pub(crate) struct Stack<'t> {
    pub(crate) leaves: &'t [Tensor<2>],
    shapes: Vec<&'t [usize]>,
    k: usize,
}

impl Stack<'_> {
    /// Linear weight `i` as `[K, in, out]`.
    pub(crate) fn lin_w(&self, i: usize) -> Tensor<3> {
        let s = self.shapes[i];
        self.leaves[i].clone().reshape([self.k, s[0], s[1]])
    }

    /// Linear bias `i` as `[K, 1, out]`.
    fn lin_b(&self, i: usize) -> Tensor<3> {
        self.leaves[i]
            .clone()
            .reshape([self.k, 1, self.shapes[i][0]])
    }

    /// `[K, B, in]` through linear layer (`i`, `i + 1`).
    pub(crate) fn linear(&self, x: Tensor<3>, i: usize) -> Tensor<3> {
        x.matmul(self.lin_w(i)) + self.lin_b(i + 1)
    }

    /// `[K, B, in]` through linear layer (`i`, `i + 1`) and ReLU: off the
    /// CPU the bias and ReLU are one kernel each way ([`bias_relu`]); the
    /// CPU keeps burn's operations (its batched results are pinned).
    pub(crate) fn linear_relu(&self, x: Tensor<3>, i: usize) -> Tensor<3> {
        if on_cpu(&x) {
            return relu(self.linear(x, i));
        }
        let bias = self.leaves[i + 1]
            .clone()
            .reshape([self.k, self.shapes[i + 1][0]]);
        bias_relu(x.matmul(self.lin_w(i)), bias)
    }

    /// `[B, K·C, H, W]` through conv layer (`i`, `i + 1`) as one grouped
    /// convolution.
    pub(crate) fn conv(&self, x: Tensor<4>, i: usize) -> Tensor<4> {
        let b = self.conv_bias(i + 1);
        self.grouped_conv(x, i, Some(b), 1, 0, 1)
    }

    /// Conv bias `i` as `[K·O]`.
    pub(crate) fn conv_bias(&self, i: usize) -> Tensor<1> {
        self.leaves[i].clone().reshape([self.k * self.shapes[i][0]])
    }

    /// Conv weight `i` (of `groups` groups per client) as one grouped
    /// convolution with `stride` and `pad`: client k's groups follow
    /// client k−1's.
    pub(crate) fn grouped_conv(
        &self,
        x: Tensor<4>,
        i: usize,
        bias: Option<Tensor<1>>,
        stride: usize,
        pad: usize,
        groups: usize,
    ) -> Tensor<4> {
        let s = self.shapes[i];
        let w = self.leaves[i]
            .clone()
            .reshape([self.k * s[0], s[1], s[2], s[3]]);
        let options = ConvOptions::new([stride, stride], [pad, pad], [1, 1], self.k * groups);
        conv2d(x, w, bias, options)
    }

    /// Scale or shift `i` of a batch norm as `[1, K·C, 1, 1]`.
    pub(crate) fn channel(&self, i: usize) -> Tensor<4> {
        self.leaves[i]
            .clone()
            .reshape([1, self.k * self.shapes[i][0], 1, 1])
    }
}

/// One step's validity on the device: what batch norm, the update and the
/// running statistics need.
pub(crate) struct Step {
    /// Largest batch of the step (padded size).
    b: usize,
    /// 1 for a client's valid samples, `[B, K]`.
    valid: Tensor<2>,
    /// Valid samples per client (0: the client sits this step out), `[K]`.
    sizes: Tensor<1>,
}

impl Step {
    /// `[B, K·C, 1, 1]`: 1 where sample b is one of client k's valid ones.
    fn channel_mask(&self, k: usize, c: usize) -> Tensor<4> {
        self.valid
            .clone()
            .reshape([self.b, k, 1])
            .expand([self.b, k, c])
            .reshape([self.b, k * c, 1, 1])
    }

    /// `[1, K·C, 1, 1]`: elements per channel of client k's batch, at least
    /// 1 so a resting client's (unused) statistics stay finite. Exact in
    /// `f32` (counts below 2²⁴), so equal to the host's integers.
    fn channel_counts(&self, k: usize, c: usize, per_sample: usize) -> Tensor<4> {
        self.sizes
            .clone()
            .reshape([k, 1])
            .expand([k, c])
            .reshape([1, k * c, 1, 1])
            .mul_scalar(per_sample as f32)
            .clamp_min(1.0)
    }
}

impl<'a> BatchedTrainer<'a> {
    /// Whether `spec` has a batched formulation.
    pub fn supports(spec: &ModelSpec) -> bool {
        spec.net().batched().is_ok()
    }

    /// [`supports`](Self::supports) as an error naming the model and why.
    ///
    /// # Errors
    ///
    /// [`NnError::NotBatched`] for an architecture without a batched
    /// formulation (or a `sequential` model with a layer that has none).
    pub fn check(spec: &ModelSpec) -> Result<(), NnError> {
        match spec.net().batched() {
            Ok(_) => Ok(()),
            Err(reason) => Err(NnError::NotBatched {
                model: spec.kind().name().into(),
                reason,
            }),
        }
    }

    /// Loads K clients' `params` and batch-norm `buffers` (K = `params.len()`)
    /// onto `device`; momentum starts at zero, as a fresh optimiser.
    ///
    /// # Errors
    ///
    /// [`NnError::NotBatched`] for an architecture without a batched
    /// formulation, no clients, or vectors of the wrong lengths.
    pub fn new(
        spec: &'a ModelSpec,
        device: &Device,
        params: &[&[f32]],
        buffers: &[&[f32]],
        sgd: SgdConfig,
    ) -> Result<Self, NnError> {
        let bad = |reason: String| NnError::NotBatched {
            model: spec.kind().name().into(),
            reason,
        };
        Self::check(spec)?;
        let k = params.len();
        if k == 0 || buffers.len() != k {
            return Err(bad(format!(
                "needs one parameter and one buffer vector per client, got {k} and {}",
                buffers.len()
            )));
        }
        let layout = spec.layout();
        if let Some(p) = params.iter().find(|p| p.len() != layout.len()) {
            return Err(bad(format!(
                "parameter vector of length {}, the model has {}",
                p.len(),
                layout.len()
            )));
        }
        if let Some(b) = buffers.iter().find(|b| b.len() != spec.buffer_len()) {
            return Err(bad(format!(
                "buffer vector of length {}, the model has {}",
                b.len(),
                spec.buffer_len()
            )));
        }
        let inner = device.clone().inner();
        let cpu = inner == Device::flex();
        let (norm, loss) = (batched_norm(cpu), batched_loss(cpu));
        let stacked: Vec<Tensor<2>> = layout
            .tensors()
            .iter()
            .map(|t| {
                let len = t.range().len();
                let mut v = Vec::with_capacity(k * len);
                for p in params {
                    v.extend_from_slice(&p[t.range()]);
                }
                Tensor::from_data(TensorData::new(v, [k, len]), &inner)
            })
            .collect();
        let momentum = stacked.iter().map(Tensor::zeros_like).collect();
        Ok(Self {
            spec,
            device: device.clone().autodiff(),
            k,
            sgd,
            params: stacked,
            momentum,
            running: RunningStats::upload(spec, buffers, &inner),
            losses: LossLog::default(),
            logged_sizes: Vec::new(),
            resident: None,
            norm,
            loss,
        })
    }

    /// Copies every client's samples (`clients[c]`, one per client, in
    /// order) to the device once; from then on a step whose clients read
    /// exactly these samples uploads only the rows' indices and gathers the
    /// batch on the device. A batched step of many small models on a GPU is
    /// bound by the host, and building and uploading the stacked inputs was
    /// most of it at K = 100 (5 MB a step for `cnn` at batch 16). Clients
    /// reading the same samples (same table and indices) share their rows.
    /// On the CPU backend the copy would only cost: the host gathers there.
    ///
    /// # Panics
    ///
    /// If `clients` does not have one entry per client.
    pub fn keep_samples_on_device(&mut self, clients: &[LocalData<'a>]) {
        assert_eq!(clients.len(), self.k, "one client's data per client");
        let input_len = self.spec.input_len();
        let mut table = Vec::new();
        let mut offsets = Vec::with_capacity(clients.len());
        let mut sources: Vec<(&'a [f32], &'a [usize])> = Vec::with_capacity(clients.len());
        for data in clients {
            let source = (data.features, data.indices);
            let offset = match sources.iter().position(|&s| same_samples(s, source)) {
                Some(earlier) => offsets[earlier],
                None => {
                    let start = table.len() / input_len;
                    for &row in data.indices {
                        table.extend_from_slice(
                            &data.features[row * input_len..(row + 1) * input_len],
                        );
                    }
                    start
                }
            };
            sources.push(source);
            offsets.push(offset);
        }
        let zero_row = table.len() / input_len;
        table.resize(table.len() + input_len, 0.0);
        let table = Tensor::from_data(
            TensorData::new(table, [zero_row + 1, input_len]),
            &self.device.clone().inner(),
        );
        self.resident = Some(Resident {
            sources,
            offsets,
            table,
            zero_row,
        });
    }

    /// Number of clients trained together.
    pub fn clients(&self) -> usize {
        self.k
    }

    /// One step for every client: the gradient of each client's mean
    /// cross-entropy on its mini-batch (`batches[k]`: its data and the local
    /// positions of the batch) and one momentum-SGD step with `lr`. A client
    /// with an empty batch keeps its parameters, momentum and statistics.
    /// The losses stay on the device until [`take_losses`](Self::take_losses),
    /// so a GPU never waits for the host between steps.
    ///
    /// # Panics
    ///
    /// If `batches` does not have one entry per client or a client's data
    /// is a regression task.
    pub fn step(&mut self, batches: &[(LocalData, &[usize])], lr: f32) {
        assert_eq!(batches.len(), self.k, "one batch per client");
        let b = batches.iter().map(|(_, b)| b.len()).max().unwrap_or(0);
        if b == 0 {
            return;
        }
        let spec = self.spec;
        let (k, input_len) = (self.k, spec.input_len());
        let inner = self.device.clone().inner();
        let resident = self.resident.as_ref().filter(|r| r.covers(batches));
        let arrays = self.arrays(batches, b, resident.is_some());
        // Inputs, zero for padding: gathered on the device from the clients'
        // resident samples when the step reads them, else on the host.
        let x: Tensor<3> = match resident {
            Some(r) => {
                let rows =
                    Tensor::<1, Int>::from_data(TensorData::new(arrays.rows, [k * b]), &inner);
                r.table.clone().select(0, rows).reshape(self.input_dims(b))
            }
            None => {
                let mut x = vec![0.0f32; k * b * input_len];
                let (mut xs, mut ys) = (Vec::new(), Batch::default());
                for (c, (data, batch)) in batches.iter().enumerate() {
                    data.gather(batch, input_len, &mut xs, &mut ys);
                    for (s, row) in xs.chunks(input_len).enumerate() {
                        let at = self.position(b, c, s);
                        x[at * input_len..(at + 1) * input_len].copy_from_slice(row);
                    }
                }
                Tensor::from_data(TensorData::new(x, self.input_dims(b)), &inner)
            }
        };
        let labels = Tensor::<1, Int>::from_data(TensorData::new(arrays.labels, [k * b]), &inner);
        let width = arrays.floats.len();
        let floats = Tensor::<1>::from_data(TensorData::new(arrays.floats, [width]), &inner);
        let (target, step) = self.supervision(b, labels, floats);
        let per_client = self.train_step(x, target, &step, lr);
        self.losses.push(per_client);
        self.logged_sizes
            .push(batches.iter().map(|(_, batch)| batch.len()).collect());
    }

    /// The stacked input's dims at padded batch `b`: images `[B, K, C·H·W]`
    /// (the grouped layout), `mlp` `[K, B, in]`.
    fn input_dims(&self, b: usize) -> [usize; 3] {
        let (k, input_len) = (self.k, self.spec.input_len());
        if self.image_input() {
            [b, k, input_len]
        } else {
            [k, b, input_len]
        }
    }

    fn image_input(&self) -> bool {
        self.spec.net().batched().map(|n| n.input()) == Ok(BatchedInput::Image)
    }

    /// Row of the stacked input holding client `c`'s sample `s`.
    fn position(&self, b: usize, c: usize, s: usize) -> usize {
        if self.image_input() {
            s * self.k + c
        } else {
            c * b + s
        }
    }

    /// One step's host arrays at padded batch `b` (see [`StepArrays`]);
    /// `rows` only when the step reads the resident samples.
    ///
    /// # Panics
    ///
    /// If a client's data is a regression task.
    fn arrays(&self, batches: &[(LocalData, &[usize])], b: usize, rows: bool) -> StepArrays {
        let k = self.k;
        let mut arrays = StepArrays {
            rows: Vec::new(),
            labels: vec![0; k * b],
            floats: vec![0.0; 2 * k * b + k],
        };
        let (weights, rest) = arrays.floats.split_at_mut(k * b);
        let (valid, sizes) = rest.split_at_mut(k * b);
        for (c, (data, batch)) in batches.iter().enumerate() {
            assert!(!data.is_regression(), "batched training is for classifiers");
            let weight = 1.0 / batch.len().max(1) as f32;
            for (s, &local) in batch.iter().enumerate() {
                arrays.labels[c * b + s] = i64::from(data.label(local));
                weights[c * b + s] = weight;
                valid[s * k + c] = 1.0;
            }
            sizes[c] = batch.len() as f32;
        }
        if let Some(r) = self.resident.as_ref().filter(|_| rows) {
            arrays.rows = vec![r.zero_row as i64; k * b];
            for (c, (_, batch)) in batches.iter().enumerate() {
                for (s, &local) in batch.iter().enumerate() {
                    arrays.rows[self.position(b, c, s)] = (r.offsets[c] + local) as i64;
                }
            }
        }
        arrays
    }

    /// The targets (`[K, B, classes]`, one-hot weighted `1/b_k`, zero for
    /// padding) and the step's validity from a step's uploaded labels and
    /// floats ([`StepArrays`]), all on the device: a replayed step reads
    /// them from its plan.
    fn supervision(
        &self,
        b: usize,
        labels: Tensor<1, Int>,
        floats: Tensor<1>,
    ) -> (Tensor<3>, Step) {
        let (k, classes) = (self.k, self.spec.num_classes());
        let kb = k * b;
        let weights = floats.clone().narrow(0, 0, kb).reshape([kb, 1]);
        let valid = floats.clone().narrow(0, kb, kb).reshape([b, k]);
        let sizes = floats.narrow(0, 2 * kb, k);
        let target = Tensor::<2>::zeros([kb, classes], &labels.device()).scatter(
            1,
            labels.reshape([kb, 1]),
            weights,
            IndexingUpdateOp::Add,
        );
        let step = Step {
            b,
            valid: valid.autodiff(),
            sizes: sizes.autodiff(),
        };
        (target.reshape([k, b, classes]).autodiff(), step)
    }

    /// Forward, backward and update of one step whose inputs are on the
    /// device: `x` stacked (inner device), `target` and `step` on the
    /// autodiff device. Returns each client's loss (`[K]`, detached).
    fn train_step(&mut self, x: Tensor<3>, target: Tensor<3>, step: &Step, lr: f32) -> Tensor<1> {
        let spec = self.spec;
        let k = self.k;
        let leaves: Vec<Tensor<2>> = self
            .params
            .iter()
            .map(|p| p.clone().autodiff().require_grad())
            .collect();
        let stack = Stack {
            leaves: &leaves,
            shapes: spec
                .layout()
                .tensors()
                .iter()
                .map(|t| t.shape.as_slice())
                .collect(),
            k,
        };
        let mut record = Vec::new();
        let mut cx = BatchedCx {
            stack,
            k,
            step,
            record: &mut record,
            running: &mut self.running,
            norm: self.norm,
            loss: self.loss,
            head_bias: None,
        };
        let logits = spec
            .net()
            .batched()
            .expect("checked by BatchedTrainer::new")
            .forward(&mut cx, x.autodiff());
        let head_bias = cx.head_bias.take();
        // Σ_k Σ_b −w_kb·log p(y_kb): per client its mean cross-entropy.
        let per_client = match self.loss {
            BatchedLoss::Kernel => weighted_cross_entropy(logits, head_bias, target),
            BatchedLoss::Composed => log_softmax(logits, 2)
                .mul(target)
                .sum_dim(2)
                .sum_dim(1)
                .neg()
                .reshape([k]),
        };
        // Σ_k L_k's gradient, seeded at each client's loss (a seed of ones
        // over `[K]`: the total's sum and its backward step are launches a
        // GPU step can do without).
        let grads = per_client.backward();
        let grad: Vec<Tensor<2>> = leaves
            .iter()
            .zip(&self.params)
            .map(|(leaf, p)| leaf.grad(&grads).unwrap_or_else(|| p.zeros_like()))
            .collect();
        // Rows of the clients that take the step: those of a size other
        // than 0.
        let sizes = step.sizes.clone().inner();
        self.update(grad, &sizes, lr);
        self.running.fold_rows(record, &sizes);
        per_client.inner()
    }

    /// The losses of the [`step`](Self::step)s since the last call, read in
    /// one transfer: per step, each client's loss (`None` for those that sat
    /// it out).
    pub fn take_losses(&mut self) -> Vec<Vec<Option<f64>>> {
        let values = self.losses.take();
        let sizes = std::mem::take(&mut self.logged_sizes);
        sizes
            .iter()
            .zip(values.chunks(self.k))
            .map(|(sizes, losses)| {
                sizes
                    .iter()
                    .zip(losses)
                    .map(|(&n, &l)| (n > 0).then_some(f64::from(l)))
                    .collect()
            })
            .collect()
    }

    /// Momentum SGD on every stacked tensor, written over the old state
    /// (in its buffers on a GPU); clients whose batch size (`sizes`) is 0
    /// keep their parameters and momentum (selected, not recomputed, so
    /// they stay bit-identical).
    fn update(&mut self, grad: Vec<Tensor<2>>, sizes: &Tensor<1>, lr: f32) {
        let hyper = self.sgd.with_lr(lr);
        sgd_momentum_rows(&mut self.params, &mut self.momentum, grad, sizes, hyper);
    }

    /// Trains every step of `plan` and returns each client's sum of losses
    /// over the steps it took. With `capture` and enough steps, on a
    /// backend with graphs (CUDA), the step is recorded once after
    /// [`WARMUP_STEPS`] ordinary ones and replayed for the rest: one launch
    /// a step instead of a few hundred, each costing the host ~9 µs
    /// (docs/results.md, "GPU, session 22"). The step reads its inputs
    /// from the plan at a step counter kept on the device and leaves its
    /// state in the buffers it read, so every replay is the next step.
    ///
    /// # Errors
    ///
    /// [`NnError::Capture`] when the device refused the capture or a
    /// replay: the trainer's state is then undefined (a refused recording
    /// poisons the buffers it would have written), so the caller starts
    /// over from the host's copy of the parameters.
    fn train_plan(
        &mut self,
        plan: &RoundPlan,
        lr: f32,
        capture: bool,
    ) -> Result<Vec<f32>, NnError> {
        let inner = self.device.clone().inner();
        let mut state = Replay {
            counter: Tensor::zeros([1], &inner),
            loss_sum: Tensor::zeros([1, self.k], &inner),
            one: Tensor::ones([1], &inner),
        };
        // One client alone takes the one-model convolutions, whose dense weight
        // gradient uploads its gather index each step: not recordable.
        let captured = capture && REPLAYABLE && self.k > 1 && plan.steps >= MIN_CAPTURED_STEPS;
        let done = if captured {
            self.replay_plan(plan, &mut state, lr)?
        } else {
            0
        };
        for _ in done..plan.steps {
            self.plan_step(plan, &mut state, lr);
        }
        Ok(state
            .loss_sum
            .into_data()
            .try_into_vec::<f32>()
            .expect("f32 losses"))
    }

    /// [`train_plan`](Self::train_plan)'s capture and replays; returns the
    /// steps taken (all of them, or the warm-up steps when the backend has
    /// no graphs: the caller takes the rest one by one).
    fn replay_plan(
        &mut self,
        plan: &RoundPlan,
        state: &mut Replay,
        lr: f32,
    ) -> Result<usize, NnError> {
        let device = self.device.clone().inner();
        let dispatch = device.as_dispatch();
        let refused = |what: &str, err: ExecutionError| NnError::Capture {
            reason: format!("{what}: {err}"),
        };
        if let Err(e) = Dispatch::graph_prepare(dispatch) {
            tracing::debug!("batched round not captured: {e}");
            return Ok(0);
        }
        // Warm-up: kernels compiled and every buffer the recorded step will
        // use allocated (nothing may be allocated while recording).
        for _ in 0..WARMUP_STEPS {
            self.plan_step(plan, state, lr);
            Dispatch::sync(dispatch).map_err(|e| refused("warm-up step", e))?;
        }
        if let Err(e) = Dispatch::graph_start_capture(dispatch) {
            // No graphs on this backend: end the prepared capture.
            tracing::debug!("batched round not captured: {e}");
            let _ = Dispatch::graph_stop_capture(dispatch);
            return Ok(WARMUP_STEPS);
        }
        // Recorded, not run: the graph's first replay is this step.
        self.plan_step(plan, state, lr);
        let graph = Dispatch::graph_stop_capture(dispatch).map_err(|e| refused("capture", e))?;
        for _ in WARMUP_STEPS..plan.steps {
            // SAFETY: every buffer the recorded step read or wrote stays
            // alive until the graph is dropped below: the state in `self`
            // and `state` (written in place, same handles), the plan's
            // tables (borrowed for this call) and the resident samples;
            // intermediates are retained by the graph. Nothing else runs on
            // this thread's stream between replays.
            unsafe { Dispatch::graph_replay(dispatch, &graph) }
                .map_err(|e| refused("replay", e))?;
        }
        // The graph is destroyed when it goes out of scope, after its
        // replays have finished.
        tracing::debug!(
            "batched round of {} steps: {} replayed from one CUDA graph",
            plan.steps,
            plan.steps - WARMUP_STEPS
        );
        Ok(plan.steps)
    }

    /// The round of `drawn` steps (per step, each client's local batch
    /// positions in `data[c]`) as one upload, padded to its largest batch.
    fn plan(&self, data: &[LocalData], drawn: &[Vec<Vec<usize>>]) -> RoundPlan {
        let k = self.k;
        let b = drawn
            .iter()
            .flatten()
            .map(Vec::len)
            .max()
            .unwrap_or(0)
            .max(1);
        let (mut ints, mut floats) = (Vec::new(), Vec::new());
        for step in drawn {
            let batches: Vec<(LocalData, &[usize])> = data
                .iter()
                .zip(step)
                .map(|(d, b)| (*d, b.as_slice()))
                .collect();
            let arrays = self.arrays(&batches, b, true);
            ints.extend(arrays.rows);
            ints.extend(arrays.labels);
            floats.extend(arrays.floats);
        }
        let device = self.device.clone().inner();
        let steps = drawn.len();
        RoundPlan {
            steps,
            b,
            ints: Tensor::from_data(TensorData::new(ints, [steps, 2 * k * b]), &device),
            floats: Tensor::from_data(TensorData::new(floats, [steps, 2 * k * b + k]), &device),
        }
    }

    /// One step of `plan`: the step at the device's counter, which it then
    /// advances; the losses are added to the sums. Launches only (no
    /// upload, no read), so it can be recorded.
    fn plan_step(&mut self, plan: &RoundPlan, state: &mut Replay, lr: f32) {
        let (k, b) = (self.k, plan.b);
        // The step's row of the plan's integers, selected once, where a
        // kernel does not read it in place.
        let mut row = None;
        let mut ints = || {
            row.get_or_insert_with(|| {
                let at = state.counter.clone().int();
                plan.ints.clone().select(0, at).reshape([2 * k * b])
            })
            .clone()
        };
        let table = &self
            .resident
            .as_ref()
            .expect("a plan reads the resident samples")
            .table;
        let x = plan_inputs(&state.counter, &plan.ints, table, k * b)
            .unwrap_or_else(|| table.clone().select(0, ints().narrow(0, 0, k * b)))
            .reshape(self.input_dims(b));
        let classes = self.spec.num_classes();
        let (target, step) =
            match plan_row(&state.counter, &plan.ints, &plan.floats, [k, b, classes]) {
                // Off the CPU: one kernel.
                Some((target, valid, sizes)) => (
                    target.reshape([k, b, classes]).autodiff(),
                    Step {
                        b,
                        valid: valid.autodiff(),
                        sizes: sizes.autodiff(),
                    },
                ),
                None => {
                    let at = state.counter.clone().int();
                    let floats = plan.floats.clone().select(0, at).reshape([2 * k * b + k]);
                    self.supervision(b, ints().narrow(0, k * b, k * b), floats)
                }
            };
        let per_client = self.train_step(x, target, &step, lr);
        add_assign(&mut state.loss_sum, per_client.reshape([1, k]));
        add_assign(&mut state.counter, state.one.clone());
    }

    /// Copies client `c`'s parameters and running statistics out.
    ///
    /// # Panics
    ///
    /// If `c` is not a client or the lengths do not match the spec.
    pub fn store(&self, c: usize, params: &mut [f32], buffers: &mut [f32]) {
        assert!(c < self.k, "client {c} of {}", self.k);
        for (t, spec_t) in self.params.iter().zip(self.spec.layout().tensors()) {
            let len = spec_t.range().len();
            let row = t.clone().slice([c..c + 1, 0..len]).into_data();
            params[spec_t.range()].copy_from_slice(row.as_slice::<f32>().expect("f32 tensors"));
        }
        assert_eq!(
            buffers.len(),
            self.spec.buffer_len(),
            "buffer vector length"
        );
        self.running.read(self.spec, c, buffers);
    }
}

/// What an architecture's batched forward pass works with: the stacked
/// parameters, the step's validity and the batch-norm record.
pub(crate) struct BatchedCx<'a> {
    /// The stacked parameter leaves.
    pub(crate) stack: Stack<'a>,
    /// Clients.
    pub(crate) k: usize,
    step: &'a Step,
    /// Batch-norm statistics over `K·C` channels, in order (`None`: folded
    /// into `running` already).
    record: &'a mut Vec<Option<BatchStats>>,
    /// The running statistics the kernels fold into in place.
    running: &'a mut RunningStats,
    norm: BatchedNorm,
    loss: BatchedLoss,
    /// The output layer's bias (`[K, N]`), left for the loss's kernels
    /// ([`output_layer`](Self::output_layer)).
    head_bias: Option<Tensor<2>>,
}

impl BatchedCx<'_> {
    /// The `[B, K, C·H·W]` stacked input as `[B, K·C, H, W]`.
    pub(crate) fn image(&self, x: Tensor<3>, [c, h, w]: [usize; 3]) -> Tensor<4> {
        let [b, _, _] = x.dims();
        x.reshape([b, self.k * c, h, w])
    }

    /// `[B, K·O, h, w]` to `[K, B, O·h·w]` (each client's features in the
    /// one-client flatten order).
    pub(crate) fn flatten(&self, y: Tensor<4>) -> Tensor<3> {
        let [b, ko, h, w] = y.dims();
        swap_leading(y.reshape([b, self.k, ko / self.k * h * w]))
    }

    /// The logits from `[K, B, in]` through the output layer (`i`, `i + 1`):
    /// with the loss's kernels (off the CPU) the product alone, its bias
    /// left for the loss to add (one launch each way fewer); else
    /// [`Stack::linear`].
    pub(crate) fn output_layer(&mut self, x: Tensor<3>, i: usize) -> Tensor<3> {
        if self.loss != BatchedLoss::Kernel {
            return self.stack.linear(x, i);
        }
        let classes = self.stack.shapes[i + 1][0];
        self.head_bias = Some(self.stack.leaves[i + 1].clone().reshape([self.k, classes]));
        x.matmul(self.stack.lin_w(i))
    }

    /// Batch norm with scale `i` and shift `i + 1` (see
    /// [`batch_norm_around`](Self::batch_norm_around)).
    pub(crate) fn batch_norm(&mut self, y: Tensor<4>, i: usize) -> Tensor<4> {
        self.batch_norm_around(y, i, Around::default())
    }

    /// [`batch_norm`](Self::batch_norm), then ReLU when `relu`: one
    /// operation off the CPU.
    pub(crate) fn batch_norm_relu(&mut self, y: Tensor<4>, i: usize, relu: bool) -> Tensor<4> {
        self.batch_norm_around(y, i, Around { bias: None, relu })
    }

    /// Conv layer (`at`, `at + 1`: weight and bias) as in
    /// [`Stack::conv`], then batch norm with scale `i` and shift `i + 1`:
    /// off the CPU the bias is added inside the batch norm's kernels (one
    /// launch each way fewer).
    pub(crate) fn conv_batch_norm(&mut self, x: Tensor<4>, at: usize, i: usize) -> Tensor<4> {
        if self.norm != BatchedNorm::Kernel {
            let y = self.stack.conv(x, at);
            return self.batch_norm(y, i);
        }
        let y = self.stack.grouped_conv(x, at, None, 1, 0, 1);
        let bias = Some(self.stack.conv_bias(at + 1));
        self.batch_norm_around(y, i, Around { bias, relu: false })
    }

    /// Batch norm with scale `i` and shift `i + 1` on `[B, K·C, H, W]`
    /// plus `around`'s bias, then its ReLU, with statistics over each
    /// client's valid samples: folded into the running statistics in the
    /// operation where the backend can, else recorded for
    /// [`RunningStats::fold_rows`].
    fn batch_norm_around(&mut self, y: Tensor<4>, i: usize, around: Around) -> Tensor<4> {
        let [_, kc, h, w] = y.dims();
        let p = &self.stack;
        if self.norm == BatchedNorm::Kernel {
            let affine = [i, i + 1].map(|at| p.leaves[at].clone().reshape([kc]));
            let valid = self.step.valid.clone().inner();
            let sizes = self.step.sizes.clone().inner();
            let layer = self.running.layer(self.record.len());
            let folding = (&affine, &valid, &sizes, &around, layer);
            if let Some(out) = masked_batch_norm_folding(&y, folding, BN_EPS, BN_MOMENTUM) {
                self.record.push(None);
                return out;
            }
            let (out, mean, var) = masked_batch_norm(y, affine, valid, sizes, BN_EPS, around);
            self.record.push(Some(BatchStats::of(&mean, &var, h * w)));
            return out;
        }
        let k = self.k;
        let y = match around.bias {
            Some(b) => y + b.reshape([1, kc, 1, 1]),
            None => y,
        };
        let mask = self.step.channel_mask(k, kc / k);
        let counts = self.step.channel_counts(k, kc / k, h * w);
        let mean = channel_sums(y.clone() * mask.clone()).div(counts.clone());
        // One row of ones for the layer's four operands.
        let ones =
            (self.norm == BatchedNorm::Product).then(|| Tensor::<2>::ones([1, h * w], &y.device()));
        let spread = |v: Tensor<4>| match &ones {
            None => v,
            Some(ones) => spread_over_plane(v, ones, [h, w]),
        };
        let centred = y - spread(mean.clone());
        let var = channel_sums((centred.clone() * mask).square()).div(counts);
        self.record.push(Some(BatchStats::of(&mean, &var, h * w)));
        let out = centred / spread((var + BN_EPS).sqrt()) * spread(p.channel(i))
            + spread(p.channel(i + 1));
        if around.relu { relu(out) } else { out }
    }
}

/// How the batched trainer's batch norm is lowered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BatchedNorm {
    /// burn's operations, the per-channel operands (`[1, C, 1, 1]`)
    /// broadcast by the element-wise operations. Under autodiff each
    /// operand's gradient is then a sum over the batch and the plane, which
    /// burn-cubecl runs on two blocks of 256 threads: ~130 µs each at
    /// `cnn-bn`'s first layer with K = 10, batch 10 (Nsight Compute on an
    /// H100, docs/results.md "GPU, session 24"). The CPU's choice.
    Implicit,
    /// burn's operations, the operands spread over the plane first by a
    /// product with ones ([`spread_over_plane`]): the gradient is a product
    /// too, and the sum left over the batch is one of many contiguous
    /// outputs. +11 % client-steps/s over `Implicit` for `cnn-bn` (K = 10,
    /// batch 10) with the columns' convolutions on an H200 (docs/results.md,
    /// "GPU, session 44").
    Product,
    /// One operation with a hand-written backward step
    /// ([`masked_batch_norm`]): on the cube backends one kernel each way
    /// per layer instead of ~50 launches. The choice off the CPU.
    Kernel,
}

/// The lowering for tensors on the CPU or off it, unless the environment
/// sets `FEDWEAVE_BATCHED_BN=implicit|product|kernel` (read once, to
/// compare).
fn batched_norm(cpu: bool) -> BatchedNorm {
    static CHOICE: std::sync::OnceLock<Option<BatchedNorm>> = std::sync::OnceLock::new();
    let chosen = *CHOICE.get_or_init(|| {
        env_choice(
            "FEDWEAVE_BATCHED_BN",
            &[
                ("implicit", BatchedNorm::Implicit),
                ("product", BatchedNorm::Product),
                ("kernel", BatchedNorm::Kernel),
            ],
        )
    });
    match chosen {
        Some(c) => c,
        None if cpu => BatchedNorm::Implicit,
        None => BatchedNorm::Kernel,
    }
}

/// How the batched trainer's loss (each client's cross-entropy) is lowered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BatchedLoss {
    /// burn's log-softmax, product and sums, differentiated by autodiff:
    /// the CPU's choice.
    Composed,
    /// One operation with a hand-written backward step
    /// ([`weighted_cross_entropy`]): on the cube backends one kernel each
    /// way instead of ~25 launches. The choice off the CPU.
    Kernel,
}

/// The loss's lowering on the CPU or off it, unless the environment sets
/// `FEDWEAVE_BATCHED_LOSS=composed|kernel` (read once, to compare).
fn batched_loss(cpu: bool) -> BatchedLoss {
    static CHOICE: std::sync::OnceLock<Option<BatchedLoss>> = std::sync::OnceLock::new();
    let chosen = *CHOICE.get_or_init(|| {
        env_choice(
            "FEDWEAVE_BATCHED_LOSS",
            &[
                ("composed", BatchedLoss::Composed),
                ("kernel", BatchedLoss::Kernel),
            ],
        )
    });
    match chosen {
        Some(c) => c,
        None if cpu => BatchedLoss::Composed,
        None => BatchedLoss::Kernel,
    }
}

/// `v` (`[1, C, 1, 1]`) as `[1, C, H, W]`: `v · 1ᵀ` with `ones` the
/// `[1, H·W]` row of ones. Each value is `v`'s own (a product by one), so
/// the forward pass is unchanged; the gradient `dS · 1` is a matmul.
fn spread_over_plane(v: Tensor<4>, ones: &Tensor<2>, [h, w]: [usize; 2]) -> Tensor<4> {
    let [_, c, _, _] = v.dims();
    v.reshape([c, 1]).matmul(ones.clone()).reshape([1, c, h, w])
}

/// Whether batched rounds may be recorded as CUDA graphs: yes unless the
/// environment sets `FEDWEAVE_CUDA_GRAPHS=0` (to compare, or to rule the
/// graphs out when chasing a problem).
fn graphs_enabled() -> bool {
    std::env::var_os("FEDWEAVE_CUDA_GRAPHS").is_none_or(|v| v != "0")
}

/// Says once per process that a capture failed (the round then runs step
/// by step, correct but slower).
fn warn_capture_failed(reason: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tracing::warn!(
            "batched training could not be captured as a CUDA graph ({reason}); \
             rounds run step by step"
        );
    });
}

/// One client's part of a batched local round.
pub struct BatchedClient<'a, R> {
    /// Parameters, trained in place.
    pub params: &'a mut [f32],
    /// Batch-norm running statistics, updated in place.
    pub buffers: &'a mut [f32],
    /// The client's training data.
    pub data: LocalData<'a>,
    /// The client's training rng (draws the batches, as in `train_local`).
    pub rng: &'a mut R,
}

/// [`train_local`](crate::train_local) for K clients at once (no extra
/// terms, objective or frozen ranges; a fresh optimiser): each client draws
/// its batches from its own rng exactly as `train_local` would and takes
/// `cfg.steps_for(n_k)` steps, so the results agree with K separate calls
/// to floating-point tolerance.
///
/// # Errors
///
/// As [`BatchedTrainer::new`], and for regression data.
pub fn train_local_batched<R: Rng>(
    spec: &ModelSpec,
    device: &Device,
    clients: &mut [BatchedClient<R>],
    cfg: &TrainConfig,
) -> Result<Vec<TrainStats>, NnError> {
    if clients.iter().any(|c| c.data.is_regression()) {
        return Err(NnError::NotBatched {
            model: spec.kind().name().into(),
            reason: "regression targets (batched training is for classifiers)".into(),
        });
    }
    let steps: Vec<usize> = clients
        .iter()
        .map(|c| {
            if c.data.is_empty() {
                0
            } else {
                cfg.steps_for(c.data.len())
            }
        })
        .collect();
    // Every step's batches, drawn in the order the one-step-at-a-time loop
    // draws them (each client from its own rng).
    let mut samplers: Vec<BatchSampler> = clients
        .iter_mut()
        .map(|c| BatchSampler::new(c.data.len(), cfg.batch_size, &mut *c.rng))
        .collect();
    let rounds = steps.iter().copied().max().unwrap_or(0);
    let mut drawn: Vec<Vec<Vec<usize>>> = Vec::with_capacity(rounds);
    for t in 0..rounds {
        drawn.push(
            clients
                .iter_mut()
                .enumerate()
                .map(|(c, client)| {
                    if t < steps[c] {
                        samplers[c].next_batch(&mut *client.rng).to_vec()
                    } else {
                        Vec::new()
                    }
                })
                .collect(),
        );
    }
    let mut stats = vec![TrainStats::default(); clients.len()];
    for step in &drawn {
        for (s, b) in stats.iter_mut().zip(step) {
            if !b.is_empty() {
                s.steps += 1;
                s.samples += b.len();
            }
        }
    }
    if drawn.is_empty() {
        // No client has a sample: nothing to train, nothing to upload.
        return Ok(stats);
    }
    let params: Vec<&[f32]> = clients.iter().map(|c| &*c.params).collect();
    let buffers: Vec<&[f32]> = clients.iter().map(|c| &*c.buffers).collect();
    let data: Vec<LocalData> = clients.iter().map(|c| c.data).collect();
    let start = || -> Result<(BatchedTrainer, RoundPlan), NnError> {
        let mut trainer = BatchedTrainer::new(spec, device, &params, &buffers, cfg.sgd())?;
        trainer.keep_samples_on_device(&data);
        let plan = trainer.plan(&data, &drawn);
        Ok((trainer, plan))
    };
    let (mut trainer, plan) = start()?;
    let loss_sums = match trainer.train_plan(&plan, cfg.lr, graphs_enabled()) {
        Ok(sums) => sums,
        Err(NnError::Capture { reason }) => {
            // The recorded step's buffers are poisoned: start over from the
            // host's parameters, step by step.
            warn_capture_failed(&reason);
            let (mut fresh, plan) = start()?;
            let sums = fresh.train_plan(&plan, cfg.lr, false)?;
            trainer = fresh;
            sums
        }
        Err(other) => return Err(other),
    };
    for (s, sum) in stats.iter_mut().zip(loss_sums) {
        if s.steps > 0 {
            s.mean_loss = f64::from(sum) / s.steps as f64;
        }
    }
    for (c, client) in clients.iter_mut().enumerate() {
        trainer.store(c, client.params, client.buffers);
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ModelKind;
    use crate::TrainConfig;

    /// A group whose clients hold no sample takes no step and keeps its
    /// models (no empty tables are uploaded).
    #[test]
    fn clients_without_samples_keep_their_models() {
        let spec = ModelSpec::new(ModelKind::MLP, &[6], 3).unwrap();
        let init = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        let (mut p0, mut p1) = (init.clone(), init.clone());
        let (mut b0, mut b1) = (spec.init_buffers(), spec.init_buffers());
        let (mut r0, mut r1) = (
            rng_stream(2, 0, 0, Purpose::Batches),
            rng_stream(2, 1, 0, Purpose::Batches),
        );
        let none = LocalData::new(&[], &[], &[]);
        let mut clients = vec![
            BatchedClient {
                params: &mut p0,
                buffers: &mut b0,
                data: none,
                rng: &mut r0,
            },
            BatchedClient {
                params: &mut p1,
                buffers: &mut b1,
                data: none,
                rng: &mut r1,
            },
        ];
        let cfg = TrainConfig {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 0.0,
            batch_size: 4,
            iterations: 3,
            epochs: 0,
        };
        let stats = train_local_batched(&spec, &Device::flex(), &mut clients, &cfg).unwrap();
        assert!(stats.iter().all(|s| s.steps == 0 && s.samples == 0));
        assert_eq!((p0, p1), (init.clone(), init));
    }
    use fedweave_core::{Purpose, rng_stream};

    /// A per-channel operand spread over the plane by a product with ones
    /// takes the implicit broadcast's values bit for bit, and its gradient
    /// is the sum over the batch and the plane (hand-summed in `f64`).
    #[test]
    fn spreading_a_channel_operand_keeps_values_and_sums_its_gradient() {
        let device = Device::flex().autodiff();
        let (b, c, h, w) = (3, 4, 5, 6);
        let xs: Vec<f32> = (0..b * c * h * w)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        let vs: Vec<f32> = (0..c).map(|i| 0.5 + i as f32 * 0.25).collect();
        let x: Tensor<4> = Tensor::from_data(TensorData::new(xs.clone(), [b, c, h, w]), &device);
        let v = || -> Tensor<4> {
            Tensor::from_data(TensorData::new(vs.clone(), [1, c, 1, 1]), &device).require_grad()
        };
        let (v_implicit, v_spread) = (v(), v());
        let implicit = x.clone() * v_implicit.clone();
        let ones = Tensor::<2>::ones([1, h * w], &device);
        let spread = x.clone() * spread_over_plane(v_spread.clone(), &ones, [h, w]);
        let values = |t: &Tensor<4>| t.clone().into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(values(&implicit), values(&spread));
        let grad = |out: Tensor<4>, leaf: &Tensor<4>| {
            let g = out.sum().backward();
            leaf.grad(&g)
                .unwrap()
                .into_data()
                .try_to_vec::<f32>()
                .unwrap()
        };
        let (g_implicit, g_spread) = (grad(implicit, &v_implicit), grad(spread, &v_spread));
        for ch in 0..c {
            let want: f64 = (0..b)
                .flat_map(|n| (0..h * w).map(move |q| (n * c + ch) * h * w + q))
                .map(|i| f64::from(xs[i]))
                .sum();
            for got in [g_implicit[ch], g_spread[ch]] {
                assert!((f64::from(got) - want).abs() <= 1e-4, "{got} vs {want}");
            }
        }
    }

    /// Three `cnn-bn` clients on random 28×28 images of 4 classes, and a
    /// round of steps in which client 1 takes a full batch of 4 every step
    /// (so every step's padded size is the plan's), client 0 rests on every
    /// third step and client 2 stops after six.
    struct ThreeClients {
        spec: ModelSpec,
        x: Vec<f32>,
        y: Vec<u32>,
        subsets: [Vec<usize>; 3],
        inits: Vec<Vec<f32>>,
        buffers: Vec<Vec<f32>>,
        drawn: Vec<Vec<Vec<usize>>>,
    }

    impl ThreeClients {
        fn new() -> Self {
            let spec = ModelSpec::new(ModelKind::CNN_BN, &[1, 28, 28], 4).unwrap();
            let mut rng = rng_stream(3, 0, 0, Purpose::Dataset);
            let n = 30;
            let x: Vec<f32> = (0..n * spec.input_len())
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect();
            let y: Vec<u32> = (0..n).map(|_| rng.random_range(0..4)).collect();
            let inits: Vec<Vec<f32>> = (0..3)
                .map(|c| spec.init(&mut rng_stream(5, c, 0, Purpose::ModelInit)))
                .collect();
            let drawn = (0..MIN_CAPTURED_STEPS + 2)
                .map(|t| {
                    let first = if t % 3 == 2 {
                        vec![]
                    } else {
                        vec![t % 10, (t + 3) % 10]
                    };
                    let third = if t < 6 { vec![(2 * t) % 10] } else { vec![] };
                    vec![first, (0..4).map(|i| (4 * t + i) % 20).collect(), third]
                })
                .collect();
            Self {
                buffers: vec![spec.init_buffers(); 3],
                spec,
                x,
                y,
                subsets: [(0..10).collect(), (10..30).collect(), (5..15).collect()],
                inits,
                drawn,
            }
        }

        fn data(&self) -> Vec<LocalData<'_>> {
            self.subsets
                .iter()
                .map(|s| LocalData::new(&self.x, &self.y, s))
                .collect()
        }

        /// A trainer on the CPU with the clients' samples kept on it.
        fn trainer(&self) -> BatchedTrainer<'_> {
            let params: Vec<&[f32]> = self.inits.iter().map(Vec::as_slice).collect();
            let buffers: Vec<&[f32]> = self.buffers.iter().map(Vec::as_slice).collect();
            let sgd = SgdConfig {
                momentum: 0.9,
                weight_decay: 1e-3,
            };
            let mut t =
                BatchedTrainer::new(&self.spec, &Device::flex(), &params, &buffers, sgd).unwrap();
            t.keep_samples_on_device(&self.data());
            t
        }

        /// Client `c`'s parameters and buffers out of `trainer`.
        fn stored(&self, trainer: &BatchedTrainer, c: usize) -> (Vec<f32>, Vec<f32>) {
            let (mut p, mut b) = (self.inits[c].clone(), self.spec.init_buffers());
            trainer.store(c, &mut p, &mut b);
            (p, b)
        }
    }

    /// Off the CPU batch norm and the loss are one operation each; a CPU
    /// trainer takes burn's operations (batch norm's operands broadcast).
    #[test]
    fn the_kernels_are_for_devices_off_the_cpu() {
        if std::env::var_os("FEDWEAVE_BATCHED_BN").is_none() {
            assert_eq!(batched_norm(true), BatchedNorm::Implicit);
            assert_eq!(batched_norm(false), BatchedNorm::Kernel);
            assert_eq!(ThreeClients::new().trainer().norm, BatchedNorm::Implicit);
        }
        if std::env::var_os("FEDWEAVE_BATCHED_LOSS").is_none() {
            assert_eq!(batched_loss(true), BatchedLoss::Composed);
            assert_eq!(batched_loss(false), BatchedLoss::Kernel);
            assert_eq!(ThreeClients::new().trainer().loss, BatchedLoss::Composed);
        }
    }

    /// The GPU's lowerings train what the CPU's train (with clients resting
    /// on some steps and short batches on others), here in their CPU forms:
    /// batch norm's operands spread by a product (the forward pass the same
    /// bits: a product by one), batch norm as one operation
    /// ([`masked_batch_norm`]: the same sums, the gradient's closed form),
    /// the loss as one operation ([`weighted_cross_entropy`]), and both
    /// operations (the GPU's default). After one step the running
    /// statistics are equal and the parameters differ by the gradients'
    /// rounding alone (measured ≤ 4.2e-7); over a round of ten steps the
    /// drift grows (measured ≤ 2.7e-5 and 3.6e-4), within 1e-4 (parameters)
    /// and 1e-3 (statistics) relative.
    #[test]
    fn gpu_lowerings_train_as_the_cpus() {
        let f = ThreeClients::new();
        let data = f.data();
        let lowerings = [
            (BatchedNorm::Product, BatchedLoss::Composed),
            (BatchedNorm::Kernel, BatchedLoss::Composed),
            (BatchedNorm::Implicit, BatchedLoss::Kernel),
            (BatchedNorm::Kernel, BatchedLoss::Kernel),
        ];
        for (norm, loss) in lowerings {
            for (steps, params_bound, buffers_bound) in
                [(1, 1e-6, 0.0), (f.drawn.len(), 1e-4, 1e-3)]
            {
                let (mut cpu, mut other) = (f.trainer(), f.trainer());
                assert_eq!(
                    (cpu.norm, cpu.loss),
                    (BatchedNorm::Implicit, BatchedLoss::Composed)
                );
                (other.norm, other.loss) = (norm, loss);
                let sums: Vec<Vec<f32>> = [&mut cpu, &mut other]
                    .into_iter()
                    .map(|t| {
                        let plan = t.plan(&data, &f.drawn[..steps]);
                        t.train_plan(&plan, 0.05, false).unwrap()
                    })
                    .collect();
                let case = format!("{norm:?} and {loss:?}, {steps} steps");
                for (a, b) in sums[0].iter().zip(&sums[1]) {
                    assert!(
                        (a - b).abs() <= 1e-5 * a.abs().max(1.0),
                        "{case}: losses {a} vs {b}"
                    );
                }
                for c in 0..3 {
                    let (p1, b1) = f.stored(&cpu, c);
                    let (p2, b2) = f.stored(&other, c);
                    assert_ne!(p1, f.inits[c], "client {c} trained");
                    for (what, a, b, bound) in [
                        ("parameters", &p1, &p2, params_bound),
                        ("statistics", &b1, &b2, buffers_bound),
                    ] {
                        let worst = a
                            .iter()
                            .zip(b)
                            .map(|(u, v)| (u - v).abs() / u.abs().max(1e-2))
                            .fold(0.0f32, f32::max);
                        assert!(
                            worst <= bound,
                            "{case}, client {c}'s {what}: relative difference {worst}"
                        );
                    }
                }
            }
        }
    }

    /// A round drawn up front and read at a device counter (through the
    /// capture driver, which on the CPU warms up, is refused a recording
    /// and goes on step by step) trains what [`BatchedTrainer::step`]
    /// trains, bit for bit: parameters, momentum-driven updates, batch-norm
    /// statistics and each client's loss sum, with clients resting on some
    /// steps and short batches on others.
    #[test]
    fn a_planned_round_trains_as_step_by_step() {
        let f = ThreeClients::new();
        let (data, drawn) = (f.data(), &f.drawn);
        let (mut stepped, mut planned) = (f.trainer(), f.trainer());
        for step in drawn {
            let batches: Vec<(LocalData, &[usize])> = data
                .iter()
                .zip(step)
                .map(|(d, b)| (*d, b.as_slice()))
                .collect();
            stepped.step(&batches, 0.05);
        }
        let plan = planned.plan(&data, drawn);
        assert_eq!((plan.steps, plan.b), (drawn.len(), 4));
        let sums = planned.train_plan(&plan, 0.05, true).unwrap();
        let mut want = vec![0.0f32; 3];
        for losses in stepped.take_losses() {
            for (w, l) in want.iter_mut().zip(losses) {
                *w += l.map_or(0.0, |l| l as f32);
            }
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&sums), bits(&want), "loss sums");
        for (c, init) in f.inits.iter().enumerate() {
            let (p1, b1) = f.stored(&stepped, c);
            let (p2, b2) = f.stored(&planned, c);
            assert_eq!(bits(&p1), bits(&p2), "client {c}'s parameters");
            assert_eq!(bits(&b1), bits(&b2), "client {c}'s buffers");
            assert_ne!(&p1, init, "client {c} trained");
        }
    }
}
