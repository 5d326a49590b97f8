//! The server half of prototype methods: per class, a weighted mean of the
//! clients' class rows. FedProto and FedPAC both average this way; they
//! differ only in when the weights are normalised, which decides the last
//! bit of every mean, so the order is a parameter rather than a choice made
//! here (each follows its authors' code, and the goldens pin both).

/// When a class's weights are divided by their sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Normalise {
    /// Σ_j (ω_j / Σ_l ω_l)·v_j: each term scaled first (FedProto's
    /// `proto_aggregation`).
    EachTerm,
    /// (Σ_j ω_j·v_j) / Σ_l ω_l: one division at the end (FedPAC's
    /// `global_protos_gen`).
    AtEnd,
}

/// Per class c, the weighted mean of the rows `(c, ω_j, v_j)` given for it,
/// `classes × dim` row-major (0 for a class with no row), and the
/// normalisers Σ_l ω_l per class (0 marks a class nobody sent). Rows of
/// classes ≥ `classes` are ignored.
pub(crate) fn weighted_class_means(
    rows: &[(usize, f64, &[f32])],
    classes: usize,
    dim: usize,
    normalise: Normalise,
) -> (Vec<f64>, Vec<f64>) {
    let rows = || rows.iter().filter(|r| r.0 < classes);
    let mut total = vec![0.0f64; classes];
    for &(c, w, _) in rows() {
        total[c] += w;
    }
    let mut sums = vec![0.0f64; classes * dim];
    for &(c, w, v) in rows() {
        let w = match normalise {
            Normalise::EachTerm => w / total[c],
            Normalise::AtEnd => w,
        };
        for (s, &x) in sums[c * dim..(c + 1) * dim].iter_mut().zip(v) {
            *s += w * x as f64;
        }
    }
    if normalise == Normalise::AtEnd {
        for (row, &t) in sums.chunks_mut(dim.max(1)).zip(&total) {
            if t > 0.0 {
                row.iter_mut().for_each(|s| *s /= t);
            }
        }
    }
    (sums, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Class 0: (1, 1) weighted 3 and (5, 1) weighted 1 → (2, 1); class 1:
    /// (2, 0) alone; class 2: nobody; class 7 is out of range.
    #[test]
    fn both_orders_give_the_hand_computed_means() {
        let rows: Vec<(usize, f64, &[f32])> = vec![
            (0, 3.0, &[1.0, 1.0]),
            (1, 1.0, &[2.0, 0.0]),
            (0, 1.0, &[5.0, 1.0]),
            (7, 1.0, &[9.0, 9.0]),
        ];
        for order in [Normalise::EachTerm, Normalise::AtEnd] {
            let (means, total) = weighted_class_means(&rows, 3, 2, order);
            assert_eq!(means, [2.0, 1.0, 2.0, 0.0, 0.0, 0.0], "{order:?}");
            assert_eq!(total, [4.0, 1.0, 0.0]);
        }
    }

    /// The orders round differently, which is why each method names its own:
    /// equal weights over 0.1, 0.2, 0.7 (as f32) give two neighbouring f64s.
    #[test]
    fn the_orders_differ_in_the_last_bit() {
        let (a, b, c) = ([0.1f32], [0.2f32], [0.7f32]);
        let rows: Vec<(usize, f64, &[f32])> = vec![(0, 1.0, &a), (0, 1.0, &b), (0, 1.0, &c)];
        let each = weighted_class_means(&rows, 1, 1, Normalise::EachTerm).0[0];
        let end = weighted_class_means(&rows, 1, 1, Normalise::AtEnd).0[0];
        let third = 1.0 / 3.0;
        let by_hand_each = third * 0.1f32 as f64 + third * 0.2f32 as f64 + third * 0.7f32 as f64;
        let by_hand_end = (0.1f32 as f64 + 0.2f32 as f64 + 0.7f32 as f64) / 3.0;
        assert_eq!(each, by_hand_each);
        assert_eq!(end, by_hand_end);
        assert_ne!(each, end);
    }
}
