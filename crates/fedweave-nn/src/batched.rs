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
//! On the CPU backend this is a throughput experiment (one big kernel
//! instead of K small ones); the design aims at GPUs, where one small model
//! cannot fill the device (see `benches/batched.rs`).

use crate::NnError;
use crate::arch::BatchedInput;
use crate::batch::{Batch, LocalData};
use crate::kernels::{conv2d, sgd_momentum};
use crate::model::{BN_EPS, ModelSpec, channel_sums};
use crate::resident::{BatchStats, LossLog, RunningStats};
use crate::train::{TrainConfig, TrainStats};
use crate::trainer::{BatchSampler, SgdConfig};
use burn::tensor::activation::log_softmax;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
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

/// One step's inputs in the stacked layouts, and what batch norm needs.
pub(crate) struct Step {
    /// Largest batch of the step (padded size).
    b: usize,
    /// Valid samples per client (0: the client sits this step out).
    sizes: Vec<usize>,
    /// 1 for a client's valid samples, `[B, K]` row-major.
    valid: Vec<f32>,
}

impl Step {
    /// `[B, K·C, 1, 1]`: 1 where sample b is one of client k's valid ones.
    fn channel_mask(&self, k: usize, c: usize, device: &Device) -> Tensor<4> {
        let m: Tensor<3> =
            Tensor::from_data(TensorData::new(self.valid.clone(), [self.b, k, 1]), device);
        m.expand([self.b, k, c]).reshape([self.b, k * c, 1, 1])
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
            &self.device,
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
        let spec = self.spec;
        let k = self.k;
        let (input_len, classes) = (spec.input_len(), spec.num_classes());
        let sizes: Vec<usize> = batches.iter().map(|(_, b)| b.len()).collect();
        let b = sizes.iter().copied().max().unwrap_or(0);
        if b == 0 {
            return;
        }
        let image = spec.net().batched().map(|n| n.input()) == Ok(BatchedInput::Image);
        // Images: [B, K, C·H·W] (grouped layout); mlp: [K, B, in].
        let dims = if image {
            [b, k, input_len]
        } else {
            [k, b, input_len]
        };
        let position = |c: usize, s: usize| if image { s * k + c } else { c * b + s };
        // One-hot targets weighted 1/b_k, validity.
        let mut target = vec![0.0f32; k * b * classes];
        let mut valid = vec![0.0f32; b * k];
        for (c, (data, batch)) in batches.iter().enumerate() {
            assert!(!data.is_regression(), "batched training is for classifiers");
            let weight = 1.0 / batch.len().max(1) as f32;
            for (s, &local) in batch.iter().enumerate() {
                target[(c * b + s) * classes + data.label(local) as usize] = weight;
                valid[s * k + c] = 1.0;
            }
        }
        // Inputs, zero for padding: gathered on the device from the clients'
        // resident samples when the step reads them, else on the host.
        let resident = self.resident.as_ref().filter(|r| r.covers(batches));
        let x: Tensor<3> = match resident {
            Some(r) => {
                let mut rows = vec![r.zero_row as i64; k * b];
                for (c, (_, batch)) in batches.iter().enumerate() {
                    for (s, &local) in batch.iter().enumerate() {
                        rows[position(c, s)] = (r.offsets[c] + local) as i64;
                    }
                }
                let rows =
                    Tensor::<1, Int>::from_data(TensorData::new(rows, [k * b]), &self.device);
                r.table.clone().select(0, rows).reshape(dims)
            }
            None => {
                let mut x = vec![0.0f32; k * b * input_len];
                let (mut xs, mut ys) = (Vec::new(), Batch::default());
                for (c, (data, batch)) in batches.iter().enumerate() {
                    data.gather(batch, input_len, &mut xs, &mut ys);
                    for (s, row) in xs.chunks(input_len).enumerate() {
                        let at = position(c, s);
                        x[at * input_len..(at + 1) * input_len].copy_from_slice(row);
                    }
                }
                Tensor::from_data(TensorData::new(x, dims), &self.device)
            }
        };
        let step = Step { b, sizes, valid };
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
            step: &step,
            record: &mut record,
        };
        let logits = spec
            .net()
            .batched()
            .expect("checked by BatchedTrainer::new")
            .forward(&mut cx, x);
        let target: Tensor<3> =
            Tensor::from_data(TensorData::new(target, [k, b, classes]), &self.device);
        // Σ_k Σ_b −w_kb·log p(y_kb): per client its mean cross-entropy.
        let per_client = log_softmax(logits, 2)
            .mul(target)
            .sum_dim(2)
            .sum_dim(1)
            .neg()
            .reshape([k]);
        let loss = per_client.clone().sum();
        let grads = loss.backward();
        self.losses.push(per_client.inner());
        let grad: Vec<Tensor<2>> = leaves
            .iter()
            .zip(&self.params)
            .map(|(leaf, p)| leaf.grad(&grads).unwrap_or_else(|| p.zeros_like()))
            .collect();
        self.update(grad, &step, lr);
        self.running.fold(record, &step.sizes);
        self.logged_sizes.push(step.sizes);
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

    /// Momentum SGD on every stacked tensor; clients without samples this
    /// step get their old parameters and momentum back (selected, not
    /// recomputed, so they stay bit-identical).
    fn update(&mut self, grad: Vec<Tensor<2>>, step: &Step, lr: f32) {
        let hyper = self.sgd.with_lr(lr);
        let resting: Vec<bool> = step.sizes.iter().map(|&n| n == 0).collect();
        let any_resting = resting.iter().any(|&r| r);
        let inner = self.device.clone().inner();
        let params = std::mem::take(&mut self.params);
        let buffers = std::mem::take(&mut self.momentum);
        for ((theta, buf), g) in params.into_iter().zip(buffers).zip(grad) {
            let (mut new_theta, mut new_buf) = sgd_momentum(theta.clone(), buf.clone(), g, hyper);
            if any_resting {
                let len = theta.dims()[1];
                let mask = Tensor::<2, Bool>::from_data(
                    TensorData::new(resting.clone(), [self.k, 1]),
                    &inner,
                )
                .expand([self.k, len]);
                new_theta = new_theta.mask_where(mask.clone(), theta);
                new_buf = new_buf.mask_where(mask, buf);
            }
            self.params.push(new_theta);
            self.momentum.push(new_buf);
        }
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
    /// Batch-norm statistics over `K·C` channels, in order.
    record: &'a mut Vec<BatchStats>,
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
        y.reshape([b, self.k, ko / self.k * h * w]).swap_dims(0, 1)
    }

    /// Batch norm with scale `i` and shift `i + 1` (see [`batch_norm`]).
    pub(crate) fn batch_norm(&mut self, y: Tensor<4>, i: usize) -> Tensor<4> {
        batch_norm(y, &self.stack, i, self.step, self.k, self.record)
    }
}

/// Batch norm with scale `i` and shift `i + 1` on `[B, K·C, H, W]`, with
/// statistics over each client's valid samples; records them.
fn batch_norm(
    y: Tensor<4>,
    p: &Stack,
    i: usize,
    step: &Step,
    k: usize,
    record: &mut Vec<BatchStats>,
) -> Tensor<4> {
    let [_, kc, h, w] = y.dims();
    let device = y.device();
    let mask = step.channel_mask(k, kc / k, &device);
    // Elements per channel; at least 1 so a resting client's (unused)
    // statistics stay finite.
    let counts: Vec<f32> = step
        .sizes
        .iter()
        .flat_map(|&n| std::iter::repeat_n((n * h * w).max(1) as f32, kc / k))
        .collect();
    let counts: Tensor<4> = Tensor::from_data(TensorData::new(counts, [1, kc, 1, 1]), &device);
    let mean = channel_sums(y.clone() * mask.clone()).div(counts.clone());
    let centred = y - mean.clone();
    let var = channel_sums((centred.clone() * mask).square()).div(counts);
    record.push(BatchStats::of(&mean, &var, h * w));
    centred / (var + BN_EPS).sqrt() * p.channel(i) + p.channel(i + 1)
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
    let params: Vec<&[f32]> = clients.iter().map(|c| &*c.params).collect();
    let buffers: Vec<&[f32]> = clients.iter().map(|c| &*c.buffers).collect();
    let mut trainer = BatchedTrainer::new(spec, device, &params, &buffers, cfg.sgd())?;
    if device.clone().inner() != Device::flex() {
        let data: Vec<LocalData> = clients.iter().map(|c| c.data).collect();
        trainer.keep_samples_on_device(&data);
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
    let mut samplers: Vec<BatchSampler> = clients
        .iter_mut()
        .map(|c| BatchSampler::new(c.data.len(), cfg.batch_size, &mut *c.rng))
        .collect();
    let mut stats = vec![TrainStats::default(); clients.len()];
    let mut batches: Vec<Vec<usize>> = vec![Vec::new(); clients.len()];
    for t in 0..steps.iter().copied().max().unwrap_or(0) {
        for (c, client) in clients.iter_mut().enumerate() {
            batches[c].clear();
            if t < steps[c] {
                batches[c].extend_from_slice(samplers[c].next_batch(&mut *client.rng));
            }
        }
        let step: Vec<(LocalData, &[usize])> = clients
            .iter()
            .zip(&batches)
            .map(|(c, b)| (c.data, b.as_slice()))
            .collect();
        trainer.step(&step, cfg.lr);
        for (s, b) in stats.iter_mut().zip(&batches) {
            if !b.is_empty() {
                s.steps += 1;
                s.samples += b.len();
            }
        }
    }
    for losses in trainer.take_losses() {
        for (s, loss) in stats.iter_mut().zip(losses) {
            if let Some(loss) = loss {
                s.mean_loss += loss;
            }
        }
    }
    for (c, (client, s)) in clients.iter_mut().zip(&mut stats).enumerate() {
        trainer.store(c, client.params, client.buffers);
        if s.steps > 0 {
            s.mean_loss /= s.steps as f64;
        }
    }
    Ok(stats)
}
