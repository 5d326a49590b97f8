//! Euclidean projection onto the probability simplex.
//!
//! pFedGraph's per-client quadratic program
//! `min_x a·xᵀx − (s + 2a·p)ᵀx  s.t. 1ᵀx = 1, x ≥ 0`
//! equals `a·‖x − (p + s/(2a))‖² + const`, so its solution is the projection
//! of `p + s/(2a)` onto the simplex: exact, O(n log n), no solver needed.

/// Projects `v` onto `{x : x ≥ 0, Σx = 1}` (sort-based, Duchi et al. 2008).
pub fn project_to_simplex(v: &[f64]) -> Vec<f64> {
    if v.is_empty() {
        return Vec::new();
    }
    let mut u: Vec<f64> = v.to_vec();
    u.sort_by(|a, b| b.total_cmp(a));
    let mut cumsum = 0.0;
    let mut theta = 0.0;
    for (k, &uk) in u.iter().enumerate() {
        cumsum += uk;
        let t = (cumsum - 1.0) / (k as f64 + 1.0);
        if uk - t > 0.0 {
            theta = t;
        }
    }
    v.iter().map(|&x| (x - theta).max(0.0)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Projected gradient descent on ½‖x − v‖² with a bisection projection:
    /// an independent, slow solver to check the closed form against.
    fn brute_force(v: &[f64]) -> Vec<f64> {
        let proj = |y: &[f64]| -> Vec<f64> {
            let (mut lo, mut hi) = (-1e3, 1e3);
            for _ in 0..200 {
                let mid = 0.5 * (lo + hi);
                let s: f64 = y.iter().map(|x| (x - mid).max(0.0)).sum();
                if s > 1.0 { lo = mid } else { hi = mid }
            }
            y.iter().map(|x| (x - hi).max(0.0)).collect()
        };
        let mut x = vec![1.0 / v.len() as f64; v.len()];
        for _ in 0..500 {
            let y: Vec<f64> = x
                .iter()
                .zip(v)
                .map(|(xi, vi)| xi - 0.5 * (xi - vi))
                .collect();
            x = proj(&y);
        }
        x
    }

    #[test]
    fn already_on_simplex_is_fixed() {
        let v = [0.2, 0.3, 0.5];
        let x = project_to_simplex(&v);
        for (a, b) in x.iter().zip(&v) {
            assert!((a - b).abs() < 1e-15);
        }
    }

    #[test]
    fn far_point_goes_to_a_vertex() {
        assert_eq!(project_to_simplex(&[10.0, 0.0, -3.0]), vec![1.0, 0.0, 0.0]);
    }

    proptest! {
        #[test]
        fn on_simplex_and_matches_projected_gradient(v in prop::collection::vec(-3.0f64..3.0, 1..12)) {
            let x = project_to_simplex(&v);
            prop_assert!(x.iter().all(|&xi| xi >= 0.0));
            prop_assert!((x.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            let y = brute_force(&v);
            for (a, b) in x.iter().zip(&y) {
                prop_assert!((a - b).abs() < 1e-6, "{x:?} vs {y:?}");
            }
        }
    }
}
