//! The exact minimiser of a convex quadratic over the probability simplex
//! ([`simplex_qp`]), with the small dense solvers it stands on (Cholesky,
//! cyclic Jacobi eigen-decomposition). FedPAC's head weights are such a
//! program; any method whose graph rows are a simplex QP can use it.

#![allow(clippy::needless_range_loop)] // index loops mirror the matrix formulas

/// The exact minimiser of ½xᵀQx + cᵀx over the probability simplex
/// {x ≥ 0, Σx = 1}, for a symmetric positive semidefinite `q`.
///
/// A primal active-set method (Nocedal & Wright, Alg. 16.3) with the
/// equality constraint always active. It starts at the best vertex; on the
/// current face (the free coordinates F) it takes the Newton step of the
/// equality-constrained problem in the null-space basis Z = [I; −1ᵀ] of
/// 1ᵀ, solving the reduced system (ZᵀQ_FF Z) u = −Zᵀg_F by Cholesky. When
/// that reduced Hessian is singular (Q only semidefinite) it is
/// eigen-decomposed (cyclic Jacobi): if the reduced gradient has a
/// component in the null space, the objective decreases linearly along it
/// and the method moves along that ray to the boundary (the simplex is
/// bounded, so it always reaches one); otherwise it takes the minimum-norm
/// Newton step. A step that would leave the simplex stops at the first
/// coordinate reaching 0, which leaves F. At a face's minimiser the
/// multipliers μ_j = g_j − ν (ν the common gradient value on F) of the
/// fixed coordinates are checked; the most negative one re-enters F, and
/// when none is negative the KKT conditions hold and x is optimal. Each
/// face's minimiser is computed exactly (up to rounding), so the result is
/// the exact solution, not an iterate of a first-order method.
///
/// Degenerate inputs never panic: an empty `c` gives an empty vector,
/// mismatched or non-finite inputs the uniform vector.
pub fn simplex_qp(q: &[Vec<f64>], c: &[f64]) -> Vec<f64> {
    let n = c.len();
    if n == 0 {
        return Vec::new();
    }
    let sound = q.len() == n
        && q.iter()
            .all(|r| r.len() == n && r.iter().all(|x| x.is_finite()))
        && c.iter().all(|x| x.is_finite());
    if !sound {
        return vec![1.0 / n as f64; n];
    }
    let scale = q
        .iter()
        .flatten()
        .chain(c)
        .fold(0.0f64, |m, x| m.max(x.abs()))
        .max(f64::MIN_POSITIVE);
    let tol_mu = 1e-11 * scale;
    let tol_step = 1e-13;
    // Start at the vertex with the smallest objective ½Q_jj + c_j.
    let start = (0..n)
        .min_by(|&a, &b| {
            (0.5 * q[a][a] + c[a])
                .partial_cmp(&(0.5 * q[b][b] + c[b]))
                .unwrap_or(std::cmp::Ordering::Equal)
        })
        .unwrap_or(0);
    let mut x = vec![0.0; n];
    x[start] = 1.0;
    let mut free = vec![start];
    let max_iter = 50 * n + 100;
    for _ in 0..max_iter {
        let g: Vec<f64> = (0..n)
            .map(|j| c[j] + (0..n).map(|l| q[j][l] * x[l]).sum::<f64>())
            .collect();
        let (p, ray) = face_step(q, &g, &free, scale);
        let moves = p.iter().any(|d| d.abs() > tol_step);
        if !moves {
            // Minimiser of the face: check the fixed coordinates' multipliers.
            let nu = free.iter().map(|&j| g[j]).sum::<f64>() / free.len() as f64;
            let entering = (0..n)
                .filter(|j| !free.contains(j))
                .map(|j| (j, g[j] - nu))
                .min_by(|a, b| a.1.partial_cmp(&b.1).unwrap_or(std::cmp::Ordering::Equal));
            match entering {
                Some((j, mu)) if mu < -tol_mu => free.push(j),
                _ => break,
            }
            continue;
        }
        // Longest step along p (≤ 1 for a Newton step) keeping x ≥ 0.
        let mut step = if ray { f64::INFINITY } else { 1.0 };
        let mut blocking = None;
        for (k, &j) in free.iter().enumerate() {
            if p[k] < 0.0 {
                let t = x[j] / -p[k];
                if t < step {
                    step = t;
                    blocking = Some(k);
                }
            }
        }
        if !step.is_finite() {
            // A ray with no decreasing coordinate cannot happen (Σp = 0 and
            // p ≠ 0); stop rather than loop.
            break;
        }
        for (k, &j) in free.iter().enumerate() {
            x[j] += step * p[k];
        }
        if let Some(k) = blocking {
            x[free[k]] = 0.0;
            free.remove(k);
        }
        for j in 0..n {
            if !free.contains(&j) {
                x[j] = 0.0;
            }
        }
    }
    // Clean rounding: clamp and renormalise.
    for xi in &mut x {
        *xi = xi.max(0.0);
    }
    let total: f64 = x.iter().sum();
    if total > 0.0 {
        x.iter_mut().for_each(|xi| *xi /= total);
        x
    } else {
        vec![1.0 / n as f64; n]
    }
}

/// The step on the face `free` from a point with gradient `g`: the Newton
/// step of the equality-constrained problem, or (`true`) a zero-curvature
/// descent ray. Entries follow the order of `free`.
fn face_step(q: &[Vec<f64>], g: &[f64], free: &[usize], scale: f64) -> (Vec<f64>, bool) {
    let m = free.len();
    if m < 2 {
        return (vec![0.0; m], false);
    }
    let last = free[m - 1];
    let k = m - 1;
    // H = ZᵀQ_FF Z with Z = [I; −1ᵀ]; r = Zᵀg_F.
    let h: Vec<Vec<f64>> = (0..k)
        .map(|a| {
            (0..k)
                .map(|b| {
                    let (fa, fb) = (free[a], free[b]);
                    q[fa][fb] - q[fa][last] - q[last][fb] + q[last][last]
                })
                .collect()
        })
        .collect();
    let r: Vec<f64> = (0..k).map(|a| g[free[a]] - g[last]).collect();
    let tol = 1e-12 * scale.max(h.iter().flatten().fold(0.0f64, |m, x| m.max(x.abs())));
    let (u, ray) = match cholesky_solve(&h, &r, tol) {
        Some(u) => (u, false),
        None => semidefinite_step(&h, &r, tol),
    };
    let mut p: Vec<f64> = u.clone();
    p.push(-u.iter().sum::<f64>());
    (p, ray)
}

/// Solves H u = −r by Cholesky; `None` when a pivot is ≤ `tol` (H not
/// numerically positive definite).
fn cholesky_solve(h: &[Vec<f64>], r: &[f64], tol: f64) -> Option<Vec<f64>> {
    let k = r.len();
    let mut l = vec![vec![0.0; k]; k];
    for i in 0..k {
        for j in 0..=i {
            let s: f64 = h[i][j] - (0..j).map(|t| l[i][t] * l[j][t]).sum::<f64>();
            if i == j {
                if s <= tol {
                    return None;
                }
                l[i][i] = s.sqrt();
            } else {
                l[i][j] = s / l[j][j];
            }
        }
    }
    let mut y = vec![0.0; k];
    for i in 0..k {
        y[i] = (-r[i] - (0..i).map(|t| l[i][t] * y[t]).sum::<f64>()) / l[i][i];
    }
    let mut u = vec![0.0; k];
    for i in (0..k).rev() {
        u[i] = (y[i] - (i + 1..k).map(|t| l[t][i] * u[t]).sum::<f64>()) / l[i][i];
    }
    Some(u)
}

/// For a singular positive semidefinite H: a descent ray in its null space
/// when −r has a component there (`true`), else the minimum-norm solution
/// of H u = −r.
fn semidefinite_step(h: &[Vec<f64>], r: &[f64], tol: f64) -> (Vec<f64>, bool) {
    let k = r.len();
    let (values, vectors) = jacobi_eigen(h);
    let r_norm = r.iter().map(|x| x * x).sum::<f64>().sqrt();
    let mut ray = vec![0.0; k];
    let mut newton = vec![0.0; k];
    let mut has_ray = false;
    for (e, lambda) in values.iter().enumerate() {
        let v: Vec<f64> = (0..k).map(|a| vectors[a][e]).collect();
        let t: f64 = v.iter().zip(r).map(|(a, b)| a * b).sum();
        if *lambda > tol {
            for a in 0..k {
                newton[a] -= t / lambda * v[a];
            }
        } else if t.abs() > 1e-12 * r_norm.max(tol) {
            has_ray = true;
            for a in 0..k {
                ray[a] -= t * v[a];
            }
        }
    }
    if has_ray {
        (ray, true)
    } else {
        (newton, false)
    }
}

/// Eigenvalues and eigenvectors (as columns) of a symmetric matrix by the
/// cyclic Jacobi method.
fn jacobi_eigen(a: &[Vec<f64>]) -> (Vec<f64>, Vec<Vec<f64>>) {
    let k = a.len();
    let mut a: Vec<Vec<f64>> = a.to_vec();
    let mut v: Vec<Vec<f64>> = (0..k)
        .map(|i| (0..k).map(|j| if i == j { 1.0 } else { 0.0 }).collect())
        .collect();
    for _sweep in 0..100 {
        let off: f64 = (0..k)
            .flat_map(|i| (0..k).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| a[i][j] * a[i][j])
            .sum();
        let total: f64 = a.iter().flatten().map(|x| x * x).sum();
        if off <= 1e-30 * total.max(f64::MIN_POSITIVE) {
            break;
        }
        for p in 0..k {
            for q in p + 1..k {
                if a[p][q] == 0.0 {
                    continue;
                }
                let theta = (a[q][q] - a[p][p]) / (2.0 * a[p][q]);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let cs = 1.0 / (t * t + 1.0).sqrt();
                let sn = t * cs;
                for r in 0..k {
                    let (arp, arq) = (a[r][p], a[r][q]);
                    a[r][p] = cs * arp - sn * arq;
                    a[r][q] = sn * arp + cs * arq;
                }
                for r in 0..k {
                    let (apr, aqr) = (a[p][r], a[q][r]);
                    a[p][r] = cs * apr - sn * aqr;
                    a[q][r] = sn * apr + cs * aqr;
                }
                for r in 0..k {
                    let (vrp, vrq) = (v[r][p], v[r][q]);
                    v[r][p] = cs * vrp - sn * vrq;
                    v[r][q] = sn * vrp + cs * vrq;
                }
            }
        }
    }
    ((0..k).map(|i| a[i][i]).collect(), v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Purpose, rng_stream};
    use rand::Rng;

    fn objective(q: &[Vec<f64>], c: &[f64], x: &[f64]) -> f64 {
        let n = x.len();
        let mut f = 0.0;
        for i in 0..n {
            f += c[i] * x[i];
            for j in 0..n {
                f += 0.5 * x[i] * q[i][j] * x[j];
            }
        }
        f
    }

    fn assert_close(got: &[f64], want: &[f64], tol: f64) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < tol, "got {got:?}, want {want:?}");
        }
    }

    /// The KKT conditions of the simplex program at `x`: feasibility,
    /// g_j = ν on the support and g_j ≥ ν off it.
    fn assert_kkt(q: &[Vec<f64>], c: &[f64], x: &[f64], tol: f64) {
        let n = x.len();
        assert!(x.iter().all(|&v| v >= 0.0), "{x:?}");
        assert!((x.iter().sum::<f64>() - 1.0).abs() < 1e-12, "{x:?}");
        let g: Vec<f64> = (0..n)
            .map(|j| c[j] + (0..n).map(|l| q[j][l] * x[l]).sum::<f64>())
            .collect();
        let nu = (0..n)
            .filter(|&j| x[j] > 1e-9)
            .map(|j| g[j])
            .fold(f64::INFINITY, f64::min);
        for j in 0..n {
            if x[j] > 1e-9 {
                assert!((g[j] - nu).abs() < tol, "stationarity: g {g:?}, x {x:?}");
            } else {
                assert!(g[j] >= nu - tol, "dual feasibility: g {g:?}, x {x:?}");
            }
        }
    }

    #[test]
    fn two_variables_by_hand() {
        // ½(a x² + b y²), x + y = 1 → x = b/(a+b).
        let x = simplex_qp(&[vec![2.0, 0.0], vec![0.0, 6.0]], &[0.0, 0.0]);
        assert_close(&x, &[0.75, 0.25], 1e-15);
        // Q = I, c = (0, 3): the interior stationary point x = (2, −1) is
        // infeasible, the optimum is the vertex e_0.
        let x = simplex_qp(&[vec![1.0, 0.0], vec![0.0, 1.0]], &[0.0, 3.0]);
        assert_eq!(x, [1.0, 0.0]);
        // Q = I, c = (0.5, 0): stationarity x + 0.5 = y with x + y = 1.
        let x = simplex_qp(&[vec![1.0, 0.0], vec![0.0, 1.0]], &[0.5, 0.0]);
        assert_close(&x, &[0.25, 0.75], 1e-15);
    }

    #[test]
    fn three_variables_by_hand() {
        let i3 = vec![
            vec![1.0, 0.0, 0.0],
            vec![0.0, 1.0, 0.0],
            vec![0.0, 0.0, 1.0],
        ];
        assert_close(&simplex_qp(&i3, &[0.0; 3]), &[1.0 / 3.0; 3], 1e-15);
        // diag(1, 2, 3): x ∝ (1, 1/2, 1/3) = (6, 3, 2)/11.
        let d = vec![
            vec![1.0, 0.0, 0.0],
            vec![0.0, 2.0, 0.0],
            vec![0.0, 0.0, 3.0],
        ];
        assert_close(
            &simplex_qp(&d, &[0.0; 3]),
            &[6.0 / 11.0, 3.0 / 11.0, 2.0 / 11.0],
            1e-15,
        );
        // Q = I, c = (0, 0, 1): on all three x_3 = ν − 1 = −1/3 < 0, so
        // x = (½, ½, 0) with multiplier μ_3 = 1 − ½ > 0.
        let x = simplex_qp(&i3, &[0.0, 0.0, 1.0]);
        assert_close(&x, &[0.5, 0.5, 0.0], 1e-15);
        assert_eq!(x[2], 0.0);
        // A coupled case: Q = [[2,1,0],[1,2,0],[0,0,1]], c = 0. Stationarity
        // 3x = 3y = z (x = y by symmetry) with 2x + z = 1: x = y = 1/5,
        // z = 3/5.
        let q = vec![
            vec![2.0, 1.0, 0.0],
            vec![1.0, 2.0, 0.0],
            vec![0.0, 0.0, 1.0],
        ];
        assert_close(&simplex_qp(&q, &[0.0; 3]), &[0.2, 0.2, 0.6], 1e-15);
    }

    #[test]
    fn singular_programs_are_solved_exactly() {
        // Q = 0: a linear program, the vertex of the smallest c.
        let zero = vec![vec![0.0; 3]; 3];
        assert_eq!(simplex_qp(&zero, &[2.0, 1.0, 3.0]), [0.0, 1.0, 0.0]);
        // Q = 11ᵀ is constant on the simplex: again the smallest c.
        let ones = vec![vec![1.0; 3]; 3];
        assert_eq!(simplex_qp(&ones, &[0.5, 0.0, 0.2]), [0.0, 1.0, 0.0]);
        // Q = [[1,1],[1,1]]: its reduced Hessian on the edge is 0, the
        // gradient along it is c_0 − c_1 = −0.5, so the ray reaches e_0.
        assert_eq!(
            simplex_qp(&[vec![1.0, 1.0], vec![1.0, 1.0]], &[0.0, 0.5]),
            [1.0, 0.0]
        );
        // Rank one, Q = aaᵀ with a = (1, −1, 0), c = (0, 0, 0.1): f =
        // ½(x_0 − x_1)² + 0.1·x_2 is 0 at (½, ½, 0). The method starts at
        // e_2 (f = 0.1), moves to (0.1, 0, 0.9) on the edge {2, 0}, then on
        // the whole simplex the reduced Hessian is singular with the
        // gradient along its null direction e_0 + e_1 − 2e_2: the ray step.
        let q = vec![
            vec![1.0, -1.0, 0.0],
            vec![-1.0, 1.0, 0.0],
            vec![0.0, 0.0, 0.0],
        ];
        let c = [0.0, 0.0, 0.1];
        let (p, ray) = face_step(&q, &[0.1, -0.1, 0.1], &[2, 0, 1], 1.0);
        assert!(ray);
        // Along the ray x_2 decreases twice as fast as x_0 and x_1 grow.
        assert!((p[0] + 2.0 * p[1]).abs() < 1e-12 && (p[1] - p[2]).abs() < 1e-12);
        assert!(p[0] < 0.0, "{p:?}");
        assert_close(&simplex_qp(&q, &c), &[0.5, 0.5, 0.0], 1e-12);
    }

    #[test]
    fn bad_inputs_give_a_feasible_answer() {
        assert!(simplex_qp(&[], &[]).is_empty());
        assert_eq!(simplex_qp(&[vec![1.0]], &[0.0, 1.0]), [0.5, 0.5]);
        assert_eq!(
            simplex_qp(&[vec![f64::NAN, 0.0], vec![0.0, 1.0]], &[0.0, 0.0]),
            [0.5, 0.5]
        );
        assert_eq!(simplex_qp(&[vec![3.0]], &[1.0]), [1.0]);
    }

    /// Solves the equality-constrained program on support `s` by Gaussian
    /// elimination on its KKT system; `None` when singular.
    fn kkt_on_support(q: &[Vec<f64>], c: &[f64], s: &[usize]) -> Option<Vec<f64>> {
        let m = s.len();
        let mut a = vec![vec![0.0; m + 2]; m + 1];
        for (r, &i) in s.iter().enumerate() {
            for (k, &j) in s.iter().enumerate() {
                a[r][k] = q[i][j];
            }
            a[r][m] = -1.0;
            a[r][m + 1] = -c[i];
        }
        for k in 0..m {
            a[m][k] = 1.0;
        }
        a[m][m + 1] = 1.0;
        for col in 0..=m {
            let piv = (col..=m).max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))?;
            if a[piv][col].abs() < 1e-12 {
                return None;
            }
            a.swap(col, piv);
            for r in 0..=m {
                if r != col {
                    let f = a[r][col] / a[col][col];
                    for k in col..m + 2 {
                        a[r][k] -= f * a[col][k];
                    }
                }
            }
        }
        let mut x = vec![0.0; c.len()];
        for (r, &i) in s.iter().enumerate() {
            x[i] = a[r][m + 1] / a[r][r];
        }
        Some(x)
    }

    /// Positive definite random programs: the solver equals the best
    /// feasible stationary point over all 2^n − 1 supports (brute force).
    #[test]
    fn matches_brute_force_enumeration_on_random_programs() {
        let mut rng = rng_stream(11, 0, 0, Purpose::Algorithm);
        for case in 0..300 {
            let n = 2 + case % 5;
            let a: Vec<Vec<f64>> = (0..n)
                .map(|_| (0..n).map(|_| rng.random_range(-1.0..1.0)).collect())
                .collect();
            let mut q = vec![vec![0.0; n]; n];
            for i in 0..n {
                for j in 0..n {
                    q[i][j] = (0..n).map(|k| a[k][i] * a[k][j]).sum::<f64>();
                }
                q[i][i] += 0.05;
            }
            let c: Vec<f64> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut best: Option<(f64, Vec<f64>)> = None;
            for mask in 1u32..(1 << n) {
                let s: Vec<usize> = (0..n).filter(|i| mask >> i & 1 == 1).collect();
                if let Some(x) = kkt_on_support(&q, &c, &s)
                    && x.iter().all(|&v| v >= -1e-12)
                {
                    let f = objective(&q, &c, &x);
                    if best.as_ref().is_none_or(|(bf, _)| f < *bf) {
                        best = Some((f, x));
                    }
                }
            }
            let (want_f, want) = best.unwrap();
            let got = simplex_qp(&q, &c);
            assert_close(&got, &want, 1e-9);
            assert!((objective(&q, &c, &got) - want_f).abs() < 1e-12);
            assert_kkt(&q, &c, &got, 1e-9);
        }
    }

    /// Rank-deficient random programs (no unique minimiser): the result
    /// satisfies the KKT conditions and is no worse than a long projected
    /// gradient run.
    #[test]
    fn semidefinite_random_programs_satisfy_kkt() {
        let mut rng = rng_stream(12, 0, 0, Purpose::Algorithm);
        for case in 0..200 {
            let n = 2 + case % 6;
            let rank = 1 + case % n.max(1);
            let a: Vec<Vec<f64>> = (0..rank)
                .map(|_| (0..n).map(|_| rng.random_range(-1.0..1.0)).collect())
                .collect();
            let mut q = vec![vec![0.0; n]; n];
            for i in 0..n {
                for j in 0..n {
                    q[i][j] = (0..rank).map(|k| a[k][i] * a[k][j]).sum::<f64>();
                }
            }
            let c: Vec<f64> = if case % 3 == 0 {
                vec![0.0; n]
            } else {
                (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
            };
            let got = simplex_qp(&q, &c);
            assert_kkt(&q, &c, &got, 1e-9);
            let lipschitz: f64 = q.iter().flatten().map(|x| x * x).sum::<f64>().sqrt() + 1e-9;
            let mut x = vec![1.0 / n as f64; n];
            for _ in 0..20_000 {
                let g: Vec<f64> = (0..n)
                    .map(|j| c[j] + (0..n).map(|l| q[j][l] * x[l]).sum::<f64>())
                    .collect();
                let y: Vec<f64> = (0..n).map(|j| x[j] - g[j] / lipschitz).collect();
                x = crate::project_to_simplex(&y);
            }
            assert!(objective(&q, &c, &got) <= objective(&q, &c, &x) + 1e-9);
        }
    }
}
