//! Layout of a flat parameter vector: which slice is which tensor, and which
//! tensors form a layer group (a module's weight + bias).

use serde::{Deserialize, Serialize};
use std::ops::Range;

/// One tensor inside a flat vector.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorSpec {
    /// Name, e.g. `conv1.weight`.
    pub name: String,
    /// Shape in the backend's convention (linear weights are `[in, out]`).
    pub shape: Vec<usize>,
    /// Offset of the first element in the flat vector.
    pub offset: usize,
}

impl TensorSpec {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// True for a tensor with no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slice of the flat vector this tensor occupies.
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len()
    }
}

/// A layer group: consecutive tensors that belong to one module. Per-layer
/// graphs (FedAGHN) and split models (FedRep, FedPer) work on these.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerGroup {
    /// Module name, e.g. `conv1`.
    pub name: String,
    /// Contiguous slice of the flat vector.
    pub range: Range<usize>,
}

/// The layout of a flat vector: tensors in order, grouped by module.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamLayout {
    tensors: Vec<TensorSpec>,
    groups: Vec<LayerGroup>,
}

impl ParamLayout {
    /// An empty layout.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a module made of the given `(suffix, shape)` tensors, e.g.
    /// `push_group("fc1", &[("weight", vec![784, 200]), ("bias", vec![200])])`.
    pub fn push_group(&mut self, module: &str, tensors: &[(&str, Vec<usize>)]) -> &mut Self {
        let start = self.len();
        for (suffix, shape) in tensors {
            let offset = self.len();
            self.tensors.push(TensorSpec {
                name: format!("{module}.{suffix}"),
                shape: shape.clone(),
                offset,
            });
        }
        self.groups.push(LayerGroup {
            name: module.to_string(),
            range: start..self.len(),
        });
        self
    }

    /// Total number of elements.
    pub fn len(&self) -> usize {
        self.tensors.last().map_or(0, |t| t.offset + t.len())
    }

    /// True when the layout holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Tensors in flat order.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// Layer groups in flat order.
    pub fn groups(&self) -> &[LayerGroup] {
        &self.groups
    }

    /// The tensor called `name`, if any.
    pub fn tensor(&self, name: &str) -> Option<&TensorSpec> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The last layer group: the classifier head of FedRep/FedPer.
    pub fn head(&self) -> Option<&LayerGroup> {
        self.groups.last()
    }

    /// Elements of the groups whose name starts with `prefix` (e.g. `"fc"` for
    /// pFedGraph's similarity on the fully-connected layers only).
    pub fn ranges_with_prefix(&self, prefix: &str) -> Vec<Range<usize>> {
        self.groups
            .iter()
            .filter(|g| g.name.starts_with(prefix))
            .map(|g| g.range.clone())
            .collect()
    }

    /// Bytes a model with this layout takes on the wire (f32).
    pub fn wire_bytes(&self) -> u64 {
        4 * self.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_contiguous_and_cover_the_vector() {
        let mut l = ParamLayout::new();
        l.push_group("fc1", &[("weight", vec![4, 3]), ("bias", vec![3])])
            .push_group("fc2", &[("weight", vec![3, 2]), ("bias", vec![2])]);
        assert_eq!(l.len(), 12 + 3 + 6 + 2);
        assert_eq!(l.groups()[0].range, 0..15);
        assert_eq!(l.groups()[1].range, 15..23);
        assert_eq!(l.tensor("fc2.weight").unwrap().range(), 15..21);
        assert_eq!(l.head().unwrap().name, "fc2");
        assert_eq!(l.wire_bytes(), 92);
        assert_eq!(l.ranges_with_prefix("fc").len(), 2);
    }
}
