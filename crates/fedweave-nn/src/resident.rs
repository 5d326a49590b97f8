//! What a training session keeps on the device between steps: batch-norm
//! running statistics and the steps' losses.
//!
//! Reading a value back to the host makes the host wait until the device
//! has finished everything queued before it. A GPU step is ~30 small
//! kernels; when every step read its loss (and every batch-norm layer its
//! batch mean and variance) the host could never queue the next step while
//! the device ran this one, and a step cost a fixed ~1.5 ms on an H100
//! whatever its size (docs/results.md, "First GPU figures"). Here both stay
//! on the device until the session ends and are read in one transfer each.
//!
//! The arithmetic is the host loop's, element for element (one rounded
//! `f32` operation per tensor op, the same order, no fused multiply-add), so
//! the CPU backend's results are bit-identical to the former host-side
//! updates (the goldens pin them).

use crate::kernels::{assign_rows, fold_running_rows};
use crate::model::{BN_MOMENTUM, ModelSpec};
use burn::tensor::{Device, Tensor, TensorData};

/// One batch-norm layer's statistics over a training batch, as computed by
/// the forward pass: per-channel mean and biased variance of `rows`
/// stacked batches (`[rows · C]`, row-major: clients trained together, 1
/// for one client), and the elements per channel of one sample (`h · w`).
pub(crate) struct BatchStats {
    mean: Tensor<1>,
    var: Tensor<1>,
    per_sample: usize,
}

impl BatchStats {
    /// Records `mean` and `var` (shaped `[1, rows · C, 1, 1]`), detached
    /// from the autodiff graph and left on the device.
    pub(crate) fn of(mean: &Tensor<4>, var: &Tensor<4>, per_sample: usize) -> Self {
        let flat = |t: &Tensor<4>| {
            let n = t.shape().num_elements();
            t.clone().inner().reshape([n])
        };
        Self {
            mean: flat(mean),
            var: flat(var),
            per_sample,
        }
    }
}

/// Batch-norm running statistics during training, on the device: per
/// batch-norm layer a `[rows, C]` tensor of running means and one of
/// running variances, one row per client trained together.
pub(crate) struct RunningStats {
    /// `(means, variances)` per batch-norm layer of the spec, in order.
    layers: Vec<(Tensor<2>, Tensor<2>)>,
    rows: usize,
}

impl RunningStats {
    /// No layers and no rows: a placeholder while the statistics are lent.
    pub(crate) fn empty() -> Self {
        Self {
            layers: Vec::new(),
            rows: 0,
        }
    }

    /// Uploads each row's buffer vector (laid out as
    /// [`ModelSpec::batch_norms`] says) to `device`.
    pub(crate) fn upload(spec: &ModelSpec, rows: &[&[f32]], device: &Device) -> Self {
        let stacked = |range: std::ops::Range<usize>| {
            let mut v = Vec::with_capacity(rows.len() * range.len());
            for b in rows {
                v.extend_from_slice(&b[range.clone()]);
            }
            Tensor::from_data(TensorData::new(v, [rows.len(), range.len()]), device)
        };
        let layers = spec
            .batch_norms()
            .iter()
            .map(|&(c, at)| (stacked(at..at + c), stacked(at + c..at + 2 * c)))
            .collect();
        Self {
            layers,
            rows: rows.len(),
        }
    }

    /// Folds one step's `record` into the running statistics as PyTorch
    /// does (momentum 0.1, unbiased variance; `None`: a layer the forward
    /// pass folded already): row `r`'s batch had
    /// `sizes[r]` samples (every row takes the step: the one-model trainer;
    /// the batched one, whose clients may rest, folds with
    /// [`fold_rows`](Self::fold_rows)).
    ///
    /// # Panics
    ///
    /// If `sizes` does not have one entry per row or `record` is not one
    /// entry per batch-norm layer.
    pub(crate) fn fold(&mut self, record: Vec<Option<BatchStats>>, sizes: &[usize]) {
        assert_eq!(sizes.len(), self.rows, "one batch size per row");
        if record.is_empty() {
            return;
        }
        assert_eq!(record.len(), self.layers.len(), "one record per batch norm");
        let device = self.layers[0].0.device();
        let unfolded = self.layers.iter_mut().zip(record);
        for ((rm, rv), stats) in unfolded.filter_map(|(layer, s)| Some((layer, s?))) {
            let rows = rm.dims()[0];
            let unbias: Vec<f32> = sizes
                .iter()
                .map(|&n| {
                    let count = n * stats.per_sample;
                    if count > 1 {
                        count as f32 / (count - 1) as f32
                    } else {
                        1.0
                    }
                })
                .collect();
            let unbias: Tensor<2> = Tensor::from_data(TensorData::new(unbias, [rows, 1]), &device);
            (*rm, *rv) = blend(rm, rv, stats, unbias);
        }
    }

    /// [`fold`](Self::fold) with the batch sizes on the device (`sizes`,
    /// `[rows]`, integers as `f32`) and the new statistics written over the
    /// old (in their buffers on a GPU) for the rows whose size is not 0:
    /// what a replayed step does. The same arithmetic as `fold`, bit for
    /// bit (the unbiasing factor n/(n − 1) of exact integers); on the cube
    /// backends one kernel per layer ([`fold_running_rows`]).
    pub(crate) fn fold_rows(&mut self, record: Vec<Option<BatchStats>>, sizes: &Tensor<1>) {
        if record.is_empty() {
            return;
        }
        assert_eq!(record.len(), self.layers.len(), "one record per batch norm");
        let unfolded = self.layers.iter_mut().zip(record);
        for ((rm, rv), stats) in unfolded.filter_map(|(layer, s)| Some((layer, s?))) {
            let batch = (stats.mean.clone(), stats.var.clone());
            if fold_running_rows(rm, rv, batch, sizes, stats.per_sample, BN_MOMENTUM).is_some() {
                continue;
            }
            let rows = rm.dims()[0];
            let count = sizes.clone().mul_scalar(stats.per_sample as f32);
            let unbias = count
                .clone()
                .div(count.clone().sub_scalar(1.0))
                .mask_fill(count.lower_equal_elem(1.0), 1.0)
                .reshape([rows, 1]);
            let (new_m, new_v) = blend(rm, rv, stats, unbias);
            assign_rows(rm, new_m, sizes);
            assign_rows(rv, new_v, sizes);
        }
    }

    /// Layer `i`'s running means and variances (`[rows, C]`), for an
    /// operation that folds a batch into them in place.
    pub(crate) fn layer(&mut self, i: usize) -> [&mut Tensor<2>; 2] {
        let (mean, var) = &mut self.layers[i];
        [mean, var]
    }

    /// Writes row `row`'s statistics into a buffer vector `out` of the
    /// spec's layout (one transfer per tensor).
    pub(crate) fn read(&self, spec: &ModelSpec, row: usize, out: &mut [f32]) {
        assert!(row < self.rows, "row {row} of {}", self.rows);
        for (&(c, at), (rm, rv)) in spec.batch_norms().iter().zip(&self.layers) {
            for (t, to) in [(rm, at..at + c), (rv, at + c..at + 2 * c)] {
                let data = t.clone().slice([row..row + 1, 0..c]).into_data();
                out[to].copy_from_slice(data.as_slice::<f32>().expect("f32 statistics"));
            }
        }
    }
}

/// PyTorch's running-statistics update of one layer: `(1 − m)·old + m·batch`,
/// the variance's batch term unbiased by `unbias` (`[rows, 1]`).
fn blend(
    rm: &Tensor<2>,
    rv: &Tensor<2>,
    stats: BatchStats,
    unbias: Tensor<2>,
) -> (Tensor<2>, Tensor<2>) {
    let [rows, c] = rm.dims();
    let mean = stats.mean.reshape([rows, c]);
    let var = stats.var.reshape([rows, c]);
    let new_m = rm
        .clone()
        .mul_scalar(1.0 - BN_MOMENTUM)
        .add(mean.mul_scalar(BN_MOMENTUM));
    let new_v = rv
        .clone()
        .mul_scalar(1.0 - BN_MOMENTUM)
        .add(var.mul_scalar(BN_MOMENTUM).mul(unbias.expand([rows, c])));
    (new_m, new_v)
}

/// The losses of a session's steps, kept on the device until read.
///
/// Every [`COMPACT`] entries are concatenated into one tensor (a device op,
/// no transfer), so a long round holds a few handles, not thousands.
#[derive(Default)]
pub(crate) struct LossLog {
    parts: Vec<Tensor<1>>,
}

/// Entries kept apart before [`LossLog`] concatenates them.
const COMPACT: usize = 256;

impl LossLog {
    /// Appends one step's losses (`[k]`, detached).
    pub(crate) fn push(&mut self, losses: Tensor<1>) {
        if self.parts.len() >= COMPACT {
            let all = Tensor::cat(std::mem::take(&mut self.parts), 0);
            self.parts.push(all);
        }
        self.parts.push(losses);
    }

    /// Every logged value in order, in one transfer; empties the log.
    pub(crate) fn take(&mut self) -> Vec<f32> {
        if self.parts.is_empty() {
            return Vec::new();
        }
        Tensor::cat(std::mem::take(&mut self.parts), 0)
            .into_data()
            .try_into_vec::<f32>()
            .expect("f32 losses")
    }
}
