//! A client's view of its data and mini-batch assembly.

/// The samples one client trains or evaluates on: indices into a shared
/// feature matrix, so no client copies the dataset.
#[derive(Clone, Copy, Debug)]
pub struct LocalData<'a> {
    /// The whole split's features, row-major, `input_len` per sample.
    pub features: &'a [f32],
    /// The whole split's labels.
    pub labels: &'a [u32],
    /// Which rows belong to this client.
    pub indices: &'a [usize],
    /// `Some(C)` flips every label y → C−1−y (the label-flip attack).
    pub flip_labels: Option<usize>,
}

impl<'a> LocalData<'a> {
    /// The rows `indices` of a split, labels as they are.
    pub fn new(features: &'a [f32], labels: &'a [u32], indices: &'a [usize]) -> Self {
        Self {
            features,
            labels,
            indices,
            flip_labels: None,
        }
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

    /// Copies the samples at local positions `which` into `x` and `y`.
    pub(crate) fn gather(
        &self,
        which: &[usize],
        input_len: usize,
        x: &mut Vec<f32>,
        y: &mut Vec<i64>,
    ) {
        x.clear();
        y.clear();
        for &k in which {
            let row = self.indices[k];
            x.extend_from_slice(&self.features[row * input_len..(row + 1) * input_len]);
            y.push(self.label(k) as i64);
        }
    }
}
