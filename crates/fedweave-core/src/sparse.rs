//! A sparse weighted relation graph between clients (CSR), such as a sensor
//! network's road or station graph. SFL propagates models along it, so it has
//! to stay sparse: `Â^m Θ` must cost O(m·nnz·d), not O(m·N²·d).

use serde::{Deserialize, Serialize};

/// An N×N sparse matrix in compressed-sparse-row form (f64 weights).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RelationGraph {
    n: usize,
    indptr: Vec<usize>,
    indices: Vec<usize>,
    weights: Vec<f64>,
}

/// Why CSR arrays do not describe a valid graph.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RelationGraphError {
    /// `indptr` has the wrong length, does not start at 0, decreases, or
    /// does not end at `indices.len()`.
    #[error("CSR indptr is malformed: {0}")]
    IndPtr(String),
    /// `indices` and `weights` differ in length.
    #[error("CSR has {indices} column indices but {weights} weights")]
    Lengths {
        /// Number of column indices.
        indices: usize,
        /// Number of weights.
        weights: usize,
    },
    /// A column index is not below N.
    #[error("CSR row {row} has column {col}, but the graph has {n} nodes")]
    Column {
        /// The row holding the bad entry.
        row: usize,
        /// The offending column.
        col: usize,
        /// Number of nodes.
        n: usize,
    },
    /// A weight is negative, NaN or infinite.
    #[error("CSR row {row}, column {col} has weight {weight}; weights must be finite and ≥ 0")]
    Weight {
        /// The row holding the bad entry.
        row: usize,
        /// Its column.
        col: usize,
        /// The offending weight.
        weight: f64,
    },
}

impl RelationGraph {
    /// Builds a graph from CSR arrays, checking every invariant (this is the
    /// entry point for graphs read from user files).
    pub fn from_csr(
        n: usize,
        indptr: Vec<usize>,
        indices: Vec<usize>,
        weights: Vec<f64>,
    ) -> Result<Self, RelationGraphError> {
        if indptr.len() != n + 1 {
            return Err(RelationGraphError::IndPtr(format!(
                "{} entries for {n} rows (expected {})",
                indptr.len(),
                n + 1
            )));
        }
        if indptr[0] != 0 || indptr[n] != indices.len() {
            return Err(RelationGraphError::IndPtr(format!(
                "must run from 0 to {} (found {} .. {})",
                indices.len(),
                indptr[0],
                indptr[n]
            )));
        }
        if let Some(r) = indptr.windows(2).position(|w| w[1] < w[0]) {
            return Err(RelationGraphError::IndPtr(format!("decreases at row {r}")));
        }
        if indices.len() != weights.len() {
            return Err(RelationGraphError::Lengths {
                indices: indices.len(),
                weights: weights.len(),
            });
        }
        for row in 0..n {
            for k in indptr[row]..indptr[row + 1] {
                let (col, weight) = (indices[k], weights[k]);
                if col >= n {
                    return Err(RelationGraphError::Column { row, col, n });
                }
                if !weight.is_finite() || weight < 0.0 {
                    return Err(RelationGraphError::Weight { row, col, weight });
                }
            }
        }
        Ok(Self {
            n,
            indptr,
            indices,
            weights,
        })
    }

    /// Builds a graph from `(row, col, weight)` triples; duplicate entries
    /// are summed.
    pub fn from_triples(
        n: usize,
        triples: impl IntoIterator<Item = (usize, usize, f64)>,
    ) -> Result<Self, RelationGraphError> {
        let mut rows: Vec<Vec<(usize, f64)>> = vec![Vec::new(); n];
        for (r, c, w) in triples {
            if r >= n {
                return Err(RelationGraphError::Column { row: r, col: c, n });
            }
            rows[r].push((c, w));
        }
        let mut indptr = Vec::with_capacity(n + 1);
        let (mut indices, mut weights) = (Vec::new(), Vec::new());
        indptr.push(0);
        for mut row in rows {
            row.sort_by_key(|&(c, _)| c);
            for (c, w) in row {
                if indices.len() > *indptr.last().unwrap_or(&0) && indices.last() == Some(&c) {
                    *weights.last_mut().expect("an entry exists") += w;
                } else {
                    indices.push(c);
                    weights.push(w);
                }
            }
            indptr.push(indices.len());
        }
        Self::from_csr(n, indptr, indices, weights)
    }

    /// Number of nodes.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Number of stored entries.
    pub fn nnz(&self) -> usize {
        self.indices.len()
    }

    /// Row `i` as (column, weight) pairs in column order.
    pub fn row(&self, i: usize) -> impl Iterator<Item = (usize, f64)> + '_ {
        let span = self.indptr[i]..self.indptr[i + 1];
        self.indices[span.clone()]
            .iter()
            .copied()
            .zip(self.weights[span].iter().copied())
    }

    /// The weight of edge i→j (0 when absent).
    pub fn get(&self, i: usize, j: usize) -> f64 {
        self.row(i).find(|&(c, _)| c == j).map_or(0.0, |(_, w)| w)
    }

    /// Â: every node gets a self-loop of weight `self_weight` (added to any
    /// existing one), then each row is scaled to sum to 1. The operator GCN
    /// aggregation propagates with.
    pub fn with_self_loops_row_normalized(&self, self_weight: f64) -> Self {
        let triples = (0..self.n).flat_map(|i| {
            self.row(i)
                .map(move |(j, w)| (i, j, w))
                .chain(std::iter::once((i, i, self_weight)))
        });
        let mut g = Self::from_triples(self.n, triples.collect::<Vec<_>>())
            .expect("a valid graph plus self-loops stays valid");
        for i in 0..g.n {
            let span = g.indptr[i]..g.indptr[i + 1];
            let total: f64 = g.weights[span.clone()].iter().sum();
            if total > 0.0 {
                g.weights[span].iter_mut().for_each(|w| *w /= total);
            }
        }
        g
    }

    /// Dense rows (for logging a small graph as a collaboration matrix).
    pub fn to_dense_rows(&self) -> Vec<Vec<f64>> {
        (0..self.n)
            .map(|i| {
                let mut row = vec![0.0; self.n];
                self.row(i).for_each(|(j, w)| row[j] += w);
                row
            })
            .collect()
    }

    /// Undirected edges without self-loops as `(i, j)` with `i < j`, each
    /// once (an edge present in either direction counts).
    pub fn undirected_edges(&self) -> Vec<(usize, usize)> {
        let mut edges: Vec<(usize, usize)> = (0..self.n)
            .flat_map(|i| {
                self.row(i)
                    .filter(move |&(j, w)| j != i && w > 0.0)
                    .map(move |(j, _)| (i.min(j), i.max(j)))
            })
            .collect();
        edges.sort_unstable();
        edges.dedup();
        edges
    }

    /// `out = Σ_j A_ij · models[j]` for one row `i` (f64 accumulation in
    /// `acc`, which is resized as needed). Costs O(nnz(row)·d); rows are
    /// independent, so callers may compute them in parallel.
    pub fn propagate_row(
        &self,
        i: usize,
        models: &[Vec<f32>],
        acc: &mut Vec<f64>,
        out: &mut Vec<f32>,
    ) {
        let d = models.first().map_or(0, Vec::len);
        acc.clear();
        acc.resize(d, 0.0);
        for (j, w) in self.row(i) {
            for (a, &x) in acc.iter_mut().zip(&models[j]) {
                *a += w * f64::from(x);
            }
        }
        out.clear();
        out.extend(acc.iter().map(|&a| a as f32));
    }

    /// The dense matrix `A^m` (row-major rows), computed as m sparse-times-
    /// dense products in O(m·nnz·N): how m hops of propagation mix the nodes.
    pub fn dense_power(&self, m: usize) -> Vec<Vec<f64>> {
        let n = self.n;
        let mut cur: Vec<Vec<f64>> = (0..n)
            .map(|i| {
                let mut r = vec![0.0; n];
                r[i] = 1.0;
                r
            })
            .collect();
        for _ in 0..m {
            cur = (0..n)
                .map(|i| {
                    let mut r = vec![0.0; n];
                    for (j, w) in self.row(i) {
                        for (a, &b) in r.iter_mut().zip(&cur[j]) {
                            *a += w * b;
                        }
                    }
                    r
                })
                .collect();
        }
        cur
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path3() -> RelationGraph {
        // 0 — 1 — 2, weight 2 on every edge.
        RelationGraph::from_triples(3, [(0, 1, 2.0), (1, 0, 2.0), (1, 2, 2.0), (2, 1, 2.0)])
            .unwrap()
    }

    #[test]
    fn self_loops_and_row_normalisation_by_hand() {
        let a = path3().with_self_loops_row_normalized(2.0);
        // Row 0: self 2, to 1 weight 2 → 1/2 each; row 1: 2,2,2 → 1/3 each.
        assert_eq!(a.to_dense_rows()[0], vec![0.5, 0.5, 0.0]);
        let third = 1.0 / 3.0;
        assert_eq!(a.to_dense_rows()[1], vec![third, third, third]);
        assert_eq!(a.nnz(), 7);
    }

    #[test]
    fn propagate_matches_dense_product() {
        let a = path3().with_self_loops_row_normalized(2.0);
        let models = vec![vec![3.0f32, 0.0], vec![0.0, 3.0], vec![6.0, 6.0]];
        let mut acc = Vec::new();
        let out: Vec<Vec<f32>> = (0..3)
            .map(|i| {
                let mut row = Vec::new();
                a.propagate_row(i, &models, &mut acc, &mut row);
                row
            })
            .collect();
        assert_eq!(out[0], vec![1.5, 1.5]);
        assert_eq!(out[1], vec![3.0, 3.0]);
        assert_eq!(out[2], vec![3.0, 4.5]);
        // Two hops: A² row 0 = 0.5·row0 + 0.5·row1 = [5/12, 5/12, 1/6].
        let a2 = a.dense_power(2);
        let want = [5.0 / 12.0, 5.0 / 12.0, 1.0 / 6.0];
        assert!(a2[0].iter().zip(want).all(|(x, y)| (x - y).abs() < 1e-15));
        assert!(
            a2.iter()
                .all(|r| (r.iter().sum::<f64>() - 1.0).abs() < 1e-12)
        );
    }

    #[test]
    fn duplicates_are_summed_and_edges_listed_once() {
        let g = RelationGraph::from_triples(3, [(0, 2, 1.0), (0, 2, 0.5), (2, 0, 1.0)]).unwrap();
        assert_eq!(g.get(0, 2), 1.5);
        assert_eq!(g.nnz(), 2);
        assert_eq!(g.undirected_edges(), vec![(0, 2)]);
    }

    #[test]
    fn malformed_csr_is_rejected_with_a_reason() {
        let err = RelationGraph::from_csr(2, vec![0, 1], vec![0], vec![1.0]).unwrap_err();
        assert!(matches!(err, RelationGraphError::IndPtr(_)));
        let err = RelationGraph::from_csr(2, vec![0, 1, 1], vec![5], vec![1.0]).unwrap_err();
        assert_eq!(
            err,
            RelationGraphError::Column {
                row: 0,
                col: 5,
                n: 2
            }
        );
        let err = RelationGraph::from_csr(2, vec![0, 1, 1], vec![1], vec![f64::NAN]).unwrap_err();
        assert!(matches!(err, RelationGraphError::Weight { .. }));
        let err =
            RelationGraph::from_csr(2, vec![0, 2, 1], vec![0, 1], vec![1.0, 1.0]).unwrap_err();
        assert!(matches!(err, RelationGraphError::IndPtr(_)));
    }
}
