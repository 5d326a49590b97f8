//! The collaboration graph: row `i` says how client `i` mixes the others'
//! models. Every algorithm produces one every round, even FedAvg (rows = p)
//! and Local (identity), so any method's graph can be logged and drawn.

use crate::vecmath::weighted_sum;
use serde::{Deserialize, Serialize};

/// A dense N×N row-stochastic matrix (row-major, f64).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CollaborationGraph {
    n: usize,
    weights: Vec<f64>,
}

impl CollaborationGraph {
    /// W = I: every client keeps its own model (Local).
    pub fn identity(n: usize) -> Self {
        let mut weights = vec![0.0; n * n];
        for i in 0..n {
            weights[i * n + i] = 1.0;
        }
        Self { n, weights }
    }

    /// Every row equals `p` (FedAvg's data-size weights).
    pub fn broadcast_row(p: &[f64]) -> Self {
        let n = p.len();
        let mut weights = Vec::with_capacity(n * n);
        for _ in 0..n {
            weights.extend_from_slice(p);
        }
        Self { n, weights }
    }

    /// Builds a graph from rows; each row is normalised to sum to 1 (a row of
    /// zeros becomes the identity row, i.e. the client keeps its own model).
    pub fn from_rows(rows: &[Vec<f64>]) -> Self {
        let n = rows.len();
        let mut g = Self::identity(n);
        for (i, r) in rows.iter().enumerate() {
            assert_eq!(
                r.len(),
                n,
                "graph row {i} has {} entries, expected {n}",
                r.len()
            );
            g.set_row(i, r);
        }
        g
    }

    /// Number of clients.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Row `i`.
    pub fn row(&self, i: usize) -> &[f64] {
        &self.weights[i * self.n..(i + 1) * self.n]
    }

    /// W_ij.
    pub fn get(&self, i: usize, j: usize) -> f64 {
        self.weights[i * self.n + j]
    }

    /// Replaces row `i` by `row / Σ row` (identity row if the sum is zero).
    pub fn set_row(&mut self, i: usize, row: &[f64]) {
        let n = self.n;
        let s: f64 = row.iter().sum();
        let dst = &mut self.weights[i * n..(i + 1) * n];
        if s > 0.0 && s.is_finite() {
            for (d, r) in dst.iter_mut().zip(row) {
                *d = r / s;
            }
        } else {
            dst.fill(0.0);
            dst[i] = 1.0;
        }
    }

    /// Replaces row `i` by `row` as given, for rows their maker has checked
    /// to be stochastic (a rule's W, whose bits the graph should keep).
    pub fn put_row(&mut self, i: usize, row: &[f64]) {
        let n = self.n;
        self.weights[i * n..(i + 1) * n].copy_from_slice(row);
    }

    /// θ̃_i = Σ_j W_ij θ_j, written into `out`.
    pub fn mix_into(&self, i: usize, models: &[&[f32]], out: &mut [f32]) {
        weighted_sum(self.row(i), models, out);
    }

    /// Share of absent off-diagonal edges (weight ≤ 1e-12); 0 for N < 2.
    pub fn sparsity(&self) -> f64 {
        let n = self.n;
        if n < 2 {
            return 0.0;
        }
        let absent = (0..n)
            .flat_map(|i| (0..n).map(move |j| (i, j)))
            .filter(|&(i, j)| i != j && self.get(i, j) <= 1e-12)
            .count();
        absent as f64 / (n * (n - 1)) as f64
    }

    /// Share of off-diagonal edges i→j whose reverse j→i also exists
    /// (1 when the graph has no off-diagonal edge).
    pub fn symmetry(&self) -> f64 {
        let n = self.n;
        let (mut edges, mut mutual) = (0usize, 0usize);
        for i in 0..n {
            for j in 0..n {
                if i != j && self.get(i, j) > 1e-12 {
                    edges += 1;
                    if self.get(j, i) > 1e-12 {
                        mutual += 1;
                    }
                }
            }
        }
        if edges == 0 {
            1.0
        } else {
            mutual as f64 / edges as f64
        }
    }

    /// Element-wise mean of several graphs of the same size (the summary of
    /// per-layer graphs).
    pub fn mean(graphs: &[CollaborationGraph]) -> Self {
        assert!(!graphs.is_empty(), "mean of zero graphs");
        let n = graphs[0].n;
        let mut weights = vec![0.0; n * n];
        for g in graphs {
            for (w, x) in weights.iter_mut().zip(&g.weights) {
                *w += x;
            }
        }
        // Sum, then divide: layers that agree (an absent client's identity
        // rows) give their common value exactly, not 1 − ε.
        let k = graphs.len() as f64;
        weights.iter_mut().for_each(|w| *w /= k);
        Self { n, weights }
    }

    /// Rows as nested vectors (the JSON form of `rounds.jsonl`).
    pub fn to_rows(&self) -> Vec<Vec<f64>> {
        (0..self.n).map(|i| self.row(i).to_vec()).collect()
    }

    /// Largest |Σ_j W_ij − 1| over rows: 0 up to rounding for a valid graph.
    pub fn max_row_sum_error(&self) -> f64 {
        (0..self.n)
            .map(|i| (self.row(i).iter().sum::<f64>() - 1.0).abs())
            .fold(0.0, f64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_and_broadcast() {
        let g = CollaborationGraph::identity(3);
        assert_eq!(g.sparsity(), 1.0);
        assert_eq!(g.symmetry(), 1.0);
        let p = [0.5, 0.25, 0.25];
        let f = CollaborationGraph::broadcast_row(&p);
        assert_eq!(f.row(2), &p);
        assert_eq!(f.sparsity(), 0.0);
        assert!(f.max_row_sum_error() < 1e-15);
    }

    #[test]
    fn the_mean_of_agreeing_layers_is_exact() {
        // Six per-tensor graphs (pFedLA's MLP) that agree on an absent
        // client's identity row: 1/6 added six times would be 1 − 2⁻⁵³.
        let g = CollaborationGraph::mean(&vec![CollaborationGraph::identity(3); 6]);
        assert_eq!(g, CollaborationGraph::identity(3));
        let a = CollaborationGraph::from_rows(&[vec![1.0, 0.0], vec![0.0, 1.0]]);
        let b = CollaborationGraph::from_rows(&[vec![0.0, 1.0], vec![0.5, 0.5]]);
        let m = CollaborationGraph::mean(&[a, b]);
        assert_eq!(m.row(0), &[0.5, 0.5]);
        assert_eq!(m.row(1), &[0.25, 0.75]);
    }

    #[test]
    fn rows_are_normalised_and_zero_rows_become_identity() {
        let g = CollaborationGraph::from_rows(&[vec![2.0, 2.0], vec![0.0, 0.0]]);
        assert_eq!(g.row(0), &[0.5, 0.5]);
        assert_eq!(g.row(1), &[0.0, 1.0]);
    }

    #[test]
    fn sparsity_and_symmetry_of_a_directed_graph() {
        // 0→1, 1→0, 2→0: three edges, two of them mutual; 3 of 6 absent.
        let g = CollaborationGraph::from_rows(&[
            vec![1.0, 1.0, 0.0],
            vec![1.0, 1.0, 0.0],
            vec![1.0, 0.0, 1.0],
        ]);
        assert!((g.sparsity() - 0.5).abs() < 1e-12);
        assert!((g.symmetry() - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn mixing_follows_the_row() {
        let g = CollaborationGraph::from_rows(&[vec![0.0, 1.0], vec![0.25, 0.75]]);
        let a = [4.0f32, 8.0];
        let b = [0.0f32, 4.0];
        let mut out = [0.0f32; 2];
        g.mix_into(1, &[&a, &b], &mut out);
        assert_eq!(out, [1.0, 5.0]);
    }
}
