//! A client's view of its data and mini-batch assembly.

use crate::Augment;

/// The samples one client trains or evaluates on: indices into a shared
/// feature matrix, so no client copies the dataset.
#[derive(Clone, Copy, Debug)]
pub struct LocalData<'a> {
    /// The whole split's features, row-major, `input_len` per sample.
    pub features: &'a [f32],
    /// The whole split's labels (classification; empty when forecasting).
    pub labels: &'a [u32],
    /// The whole split's regression targets, `target_len` per sample, NaN
    /// where unobserved (forecasting; empty when classifying).
    pub targets: &'a [f32],
    /// Targets per sample; 0 means the data is labelled for classification.
    pub target_len: usize,
    /// `(mean, std)` mapping targets back to their unit (°C, vehicles/5 min),
    /// so errors are reported in it.
    pub target_scale: (f32, f32),
    /// Which rows belong to this client.
    pub indices: &'a [usize],
    /// `Some(C)` flips every label y → C−1−y (the label-flip attack).
    pub flip_labels: Option<usize>,
    /// Augmentation of the mini-batches a [`crate::LocalTrainer`] draws
    /// from these samples (training data only; evaluation never augments).
    pub augment: Augment,
}

impl<'a> LocalData<'a> {
    /// The rows `indices` of a split, labels as they are.
    pub fn new(features: &'a [f32], labels: &'a [u32], indices: &'a [usize]) -> Self {
        Self {
            features,
            labels,
            targets: &[],
            target_len: 0,
            target_scale: (0.0, 1.0),
            indices,
            flip_labels: None,
            augment: Augment::None,
        }
    }

    /// The rows `indices` of a forecasting split: `target_len` normalised
    /// targets per sample and the scale that restores their unit.
    pub fn forecasting(
        features: &'a [f32],
        targets: &'a [f32],
        target_len: usize,
        target_scale: (f32, f32),
        indices: &'a [usize],
    ) -> Self {
        Self {
            features,
            labels: &[],
            targets,
            target_len,
            target_scale,
            indices,
            flip_labels: None,
            augment: Augment::None,
        }
    }

    /// True for regression (forecasting) data.
    pub fn is_regression(&self) -> bool {
        self.target_len > 0
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// True when the client has no samples here.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }

    /// The label of local sample `k`, after any flip.
    pub fn label(&self, k: usize) -> u32 {
        let y = self.labels[self.indices[k]];
        match self.flip_labels {
            Some(c) => (c as u32 - 1).saturating_sub(y),
            None => y,
        }
    }

    /// The labels of every local sample, in order, after any flip.
    pub fn local_labels(&self) -> Vec<u32> {
        (0..self.len()).map(|k| self.label(k)).collect()
    }

    /// Copies the samples at local positions `which` into `x` and their
    /// labels (classification) or targets (regression) into `y`.
    pub(crate) fn gather(
        &self,
        which: &[usize],
        input_len: usize,
        x: &mut Vec<f32>,
        y: &mut Batch,
    ) {
        x.clear();
        y.clear();
        for &k in which {
            let row = self.indices[k];
            x.extend_from_slice(&self.features[row * input_len..(row + 1) * input_len]);
            if self.is_regression() {
                let t = &self.targets[row * self.target_len..(row + 1) * self.target_len];
                for &v in t {
                    y.targets.push(if v.is_nan() { 0.0 } else { v });
                    y.observed.push(if v.is_nan() { 0.0 } else { 1.0 });
                }
            } else {
                y.labels.push(self.label(k) as i64);
            }
        }
    }
}

/// The supervision of one mini-batch.
#[derive(Default)]
pub(crate) struct Batch {
    /// Class labels (classification).
    pub labels: Vec<i64>,
    /// Targets with unobserved ones set to 0 (regression).
    pub targets: Vec<f32>,
    /// 1 where the target is observed, 0 where masked (regression).
    pub observed: Vec<f32>,
}

impl Batch {
    fn clear(&mut self) {
        self.labels.clear();
        self.targets.clear();
        self.observed.clear();
    }
}
