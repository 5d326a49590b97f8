//! The pairwise kernels against the pair-by-pair `vecmath` loops.

// (i, j) indexing mirrors the matrices under test.
#![allow(clippy::needless_range_loop)]

use std::ops::Range;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};

use fedweave_core::pairwise::{
    Columns, DeviceGram, F32_MIN_MODELS, Kernels, MIX_SPARSE_MIN_MODELS, Matrix, Offload,
    OffloadError, Precision, SQ_DIST_REL_TOL, View, gram_error_factor, gram_error_factor_f32,
};
use fedweave_core::vecmath::{cosine, dot, sq_dist, weighted_sum};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn rows(seed: u64, n: usize, d: usize, offset: f32) -> Vec<Vec<f32>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            (0..d)
                .map(|_| offset + rng.random_range(-1.0f32..1.0))
                .collect()
        })
        .collect()
}

/// The view of one row as the algorithms build it today.
fn viewed(x: &[f32], ranges: &[Range<usize>], shift: Option<&[f32]>) -> Vec<f64> {
    ranges
        .iter()
        .flat_map(|r| {
            r.clone()
                .map(move |c| f64::from(x[c]) - shift.map_or(0.0, |s| f64::from(s[c])))
        })
        .collect()
}

fn dot64(a: &[f64], b: &[f64]) -> f64 {
    // Exact enough as a reference: compensated (Kahan–Babuška) summation.
    let (mut s, mut comp) = (0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let p = x * y;
        let t = s + p;
        comp += if s.abs() >= p.abs() {
            (s - t) + p
        } else {
            (p - t) + s
        };
        s = t;
    }
    s + comp
}

fn norm64(a: &[f64]) -> f64 {
    dot64(a, a).sqrt()
}

fn bits(m: &Matrix) -> Vec<u64> {
    m.as_slice().iter().map(|x| x.to_bits()).collect()
}

/// The host kernels with exact products at every size.
fn exact() -> Kernels {
    Kernels::cpu().clone().with_precision(Precision::F64)
}

#[test]
fn gram_matches_naive_dot_across_tiles() {
    // 300 rows cross the 256-row tile; 1500 columns cross the 512-column chunk.
    let a = rows(1, 300, 1500, 0.0);
    let b = rows(2, 7, 1500, 0.3);
    let g = exact().gram(&a, &b, &View::all());
    assert_eq!((g.rows(), g.cols()), (300, 7));
    for i in 0..300 {
        for j in 0..7 {
            let naive = dot(&a[i], &b[j]);
            let scale = dot(&a[i], &a[i]).sqrt() * dot(&b[j], &b[j]).sqrt();
            let err = (g.get(i, j) - naive).abs();
            assert!(
                err <= 1e-12 * scale,
                "({i},{j}): {} vs {naive}",
                g.get(i, j)
            );
            if naive.abs() > 1e-2 * scale {
                assert!(err <= 1e-9 * naive.abs(), "({i},{j}) relative");
            }
        }
    }
    // 150 rows: the one symmetric tile is cut in halves.
    let half = exact().gram_sym(&a[..150], &View::all());
    for i in 0..150 {
        for j in 0..150 {
            let naive = dot(&a[i], &a[j]);
            assert!(
                (half.get(i, j) - naive).abs()
                    <= 1e-12 * dot(&a[i], &a[i]).max(1e-300).sqrt() * dot(&a[j], &a[j]).sqrt()
            );
            assert_eq!(half.get(i, j).to_bits(), half.get(j, i).to_bits());
        }
    }
    let s = exact().gram_sym(&a, &View::all());
    for i in 0..300 {
        for j in 0..300 {
            assert_eq!(s.get(i, j).to_bits(), s.get(j, i).to_bits());
        }
        let naive = dot(&a[i], &a[(i * 7) % 300]);
        assert!((s.get(i, (i * 7) % 300) - naive).abs() <= 1e-12 * dot(&a[i], &a[i]));
    }
}

#[test]
fn f32_blocks_from_64_models_stay_within_their_bound() {
    // 300 rows with an offset and a shift (Σ|a·b| ≫ |⟨a,b⟩|, as for deltas
    // θ − θ_init), 1500 columns: several 512-column chunks of 256-column blocks.
    let d = 1500;
    let a = rows(60, 300, d, 0.05);
    let b = rows(61, 70, d, 0.02);
    let init = rows(62, 1, d, 0.04).remove(0);
    let view = View::all().with_shift(&init);
    let auto = Kernels::cpu();
    assert_eq!(auto.precision(), Precision::Auto);
    let gamma = gram_error_factor_f32(d);
    assert!(gamma > 1e-5 && gamma < 2e-5, "{gamma}");
    let shifted = |x: &[f32]| viewed(x, std::slice::from_ref(&(0..d)), Some(&init));
    let (xa, xb): (Vec<_>, Vec<_>) = (
        a.iter().map(|r| shifted(r)).collect(),
        b.iter().map(|r| shifted(r)).collect(),
    );
    let check = |g: &Matrix, left: &[Vec<f64>], right: &[Vec<f64>]| {
        let mut worst = 0.0f64;
        for (i, x) in left.iter().enumerate() {
            for (j, y) in right.iter().enumerate() {
                let exact = dot64(x, y);
                let abs: f64 = x.iter().zip(y).map(|(p, q)| (p * q).abs()).sum();
                let err = (g.get(i, j) - exact).abs();
                assert!(err <= gamma * abs, "({i},{j}): {} vs {exact}", g.get(i, j));
                worst = worst.max(err / abs);
            }
        }
        worst
    };
    let worst = check(&auto.gram(&a, &b, &view), &xa, &xb);
    // The f32 path is taken: coarser than f64's 1e-13, far inside its bound.
    assert!(worst > 1e-10 && worst < gamma / 4.0, "{worst}");
    let sym = auto.gram_sym(&a, &view);
    check(&sym, &xa, &xa);
    for i in 0..300 {
        for j in 0..300 {
            assert_eq!(sym.get(i, j).to_bits(), sym.get(j, i).to_bits());
        }
    }
    // Cosines: within the bound's share of 1, the diagonal exactly 1.
    let cos = auto.cosine_matrix_sym(&a, &view);
    for i in (0..300).step_by(7) {
        assert_eq!(cos.get(i, i), 1.0);
        for j in (0..300).step_by(11) {
            let want = dot64(&xa[i], &xa[j]) / (norm64(&xa[i]) * norm64(&xa[j]));
            assert!((cos.get(i, j) - want).abs() <= 2.0 * gamma, "({i},{j})");
        }
    }
    // Below the gate the default is the exact path, bit for bit.
    let few = &a[..F32_MIN_MODELS - 1];
    assert_eq!(
        bits(&auto.gram_sym(few, &view)),
        bits(&exact().gram_sym(few, &view))
    );
    assert_eq!(
        bits(&auto.gram(few, &b[..3], &view)),
        bits(&exact().gram(few, &b[..3], &view))
    );
    let at_gate = &a[..F32_MIN_MODELS];
    assert_ne!(
        bits(&auto.gram_sym(at_gate, &view)),
        bits(&exact().gram_sym(at_gate, &view))
    );
    // Distances keep exact products (their 1e-9 bound needs them): from 64
    // models with gemm's f64 kernels, other last bits than matrixmultiply's.
    let (fast, slow) = (
        auto.sq_dist_matrix(&a, &b, &View::all()),
        exact().sq_dist_matrix(&a, &b, &View::all()),
    );
    assert_rel(&fast, |i, j| slow.get(i, j), 2.0 * SQ_DIST_REL_TOL);
    let (fast, slow) = (
        auto.sq_dist_matrix(few, &b[..3], &View::all()),
        exact().sq_dist_matrix(few, &b[..3], &View::all()),
    );
    assert_eq!(bits(&fast), bits(&slow));
}

/// Asserts every entry of `mixed` (rows `w` over `models`) is within one
/// `f32` rounding plus the `f32` blocks' bound of `weighted_sum`; returns
/// how many entries of `mixed` and of `exact` equal it bit for bit.
fn check_f32_mixing(
    w: &[Vec<f64>],
    models: &[Vec<f32>],
    mixed: &fedweave_core::pairwise::Mixed,
    exact: &fedweave_core::pairwise::Mixed,
) -> (usize, usize) {
    let refs: Vec<&[f32]> = models.iter().map(Vec::as_slice).collect();
    let d = models[0].len();
    let gamma = gram_error_factor_f32(models.len());
    let (mut same, mut exact_same) = (0usize, 0usize);
    for (i, wi) in w.iter().enumerate() {
        let mut want = vec![0.0f32; d];
        weighted_sum(wi, &refs, &mut want);
        for (c, r) in want.iter().enumerate() {
            let bound: f64 = wi
                .iter()
                .zip(models)
                .map(|(wj, mj)| (wj * f64::from(mj[c])).abs())
                .sum();
            let g = mixed.row(i)[c];
            let tol = f64::from(f32::EPSILON) * f64::from(r.abs()) + gamma * bound;
            assert!((f64::from(g) - f64::from(*r)).abs() <= tol, "({i},{c})");
            same += usize::from(g.to_bits() == r.to_bits());
            exact_same += usize::from(exact.row(i)[c].to_bits() == r.to_bits());
        }
    }
    (same, exact_same)
}

#[test]
fn f32_mixing_from_64_models_stays_within_its_bound() {
    // 300 distinct dense rows over 300 models: the GEMM path in f32 blocks of
    // 256 models (one full block, one partial), added in f64.
    let models = rows(63, 300, 700, 0.1);
    let w = weight_rows(64, 300, 300);
    let mixed = Kernels::cpu().mix(&w, &models);
    let f64_mixed = exact().mix(&w, &models);
    let (same, exact_same) = check_f32_mixing(&w, &models, &mixed, &f64_mixed);
    // f64 products round like weighted_sum nearly always; f32 blocks often not.
    assert!(exact_same as f64 >= 0.99 * 210_000.0, "{exact_same}");
    assert!(same < exact_same, "{same} vs {exact_same}");
    // Same bits at any thread count.
    let at = |threads| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| {
                let a = rows(65, 130, 900, 0.0);
                (
                    Kernels::cpu().mix(&weight_rows(66, 90, 130), &a),
                    bits(&Kernels::cpu().gram_sym(&a, &View::all())),
                )
            })
    };
    assert_eq!(at(1), at(3));
}

#[test]
fn f32_mixing_of_more_than_two_blocks_stays_within_its_bound() {
    // 700 models: three blocks of 256, so the f64 sum starts from the first
    // two and adds the third while rounding; the same bits at any thread
    // count.
    let models = rows(67, 700, 300, 0.1);
    let w = weight_rows(68, 12, 700);
    let at = |threads| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| Kernels::cpu().mix(&w, &models))
    };
    let mixed = at(1);
    assert_eq!(mixed, at(3));
    let (_, exact_same) = check_f32_mixing(&w, &models, &mixed, &exact().mix(&w, &models));
    assert!(exact_same as f64 >= 0.99 * 3600.0, "{exact_same}");
}

#[test]
fn mixing_into_slices_gives_the_rows_of_mix_bit_for_bit() {
    // Dense rows over 100 models (f32 blocks), the same over 20 (f64), a
    // duplicated row, a zero row, and the direct path (three rows).
    let big = rows(70, 100, 600, 0.0);
    let small = rows(71, 20, 600, 0.0);
    for (models, mut w) in [
        (&big, weight_rows(72, 40, 100)),
        (&small, weight_rows(73, 40, 20)),
    ] {
        w[7] = w[3].clone();
        w[9] = vec![0.0; models.len()];
        for w in [w.clone(), w[..3].to_vec()] {
            let want = Kernels::cpu().mix(&w, models);
            let mut flat = vec![f32::NAN; w.len() * 700];
            // Each output is the middle of a longer row, as a layer's range is.
            let mut outs: Vec<&mut [f32]> = flat.chunks_mut(700).map(|c| &mut c[50..650]).collect();
            Kernels::cpu().mix_into(&w, models, &mut outs);
            for (i, row) in flat.chunks(700).enumerate() {
                assert_eq!(&row[50..650], want.row(i), "row {i}");
                assert!(row[..50].iter().chain(&row[650..]).all(|x| x.is_nan()));
            }
        }
    }
}

#[test]
fn mixing_layer_by_layer_gives_each_layers_mix_and_zeros_between() {
    // Two layers out of order with a gap before, between and after them,
    // over 100 models (f32 blocks) and 20 (f64); layer 2 has a duplicated
    // row and a zero row.
    for n in [100, 20] {
        let models = rows(80 + n as u64, n, 900, 0.0);
        let first = weight_rows(81, 30, n);
        let mut second = weight_rows(82, 30, n);
        second[5] = second[2].clone();
        second[6] = vec![0.0; n];
        let layers: Vec<(std::ops::Range<usize>, &[Vec<f64>])> =
            vec![(500..850, &second), (10..400, &first)];
        let got = Kernels::cpu().mix_layers(&layers, &models);
        assert_eq!(got.len(), 30);
        for (range, w) in &layers {
            let slices: Vec<&[f32]> = models.iter().map(|m| &m[range.clone()]).collect();
            let want = Kernels::cpu().mix(w, &slices);
            for (i, row) in got.iter().enumerate() {
                assert_eq!(&row[range.clone()], want.row(i), "row {i} on {range:?}");
            }
        }
        for row in &got {
            assert_eq!(row.len(), 900);
            let gaps = row[..10].iter().chain(&row[400..500]).chain(&row[850..]);
            assert!(gaps.into_iter().all(|x| x.to_bits() == 0));
        }
    }
    let models = rows(85, 4, 50, 0.0);
    let w = weight_rows(86, 2, 4);
    let overlapping: Vec<(std::ops::Range<usize>, &[Vec<f64>])> = vec![(0..30, &w), (20..50, &w)];
    let caught = std::panic::catch_unwind(|| Kernels::cpu().mix_layers(&overlapping, &models));
    assert!(caught.is_err(), "overlapping layers are refused");
}

#[test]
fn nearest_distances_are_exact_where_a_top_k_can_see_them() {
    // 100 models in 4 groups, 30 guidance models each near its own model:
    // f32 blocks for the Gram, exact recomputation of each row's candidates.
    let d = 3000;
    let centres = rows(80, 4, d, 0.0);
    let noise = rows(81, 100, d, 0.0);
    let models: Vec<Vec<f32>> = (0..100)
        .map(|j| {
            centres[j % 4]
                .iter()
                .zip(&noise[j])
                .map(|(c, e)| c + 0.05 * e)
                .collect()
        })
        .collect();
    let step = rows(82, 30, d, 0.0);
    let guidance: Vec<Vec<f32>> = (0..30)
        .map(|i| {
            models[i]
                .iter()
                .zip(&step[i])
                .map(|(x, e)| x + 0.01 * e)
                .collect()
        })
        .collect();
    let (k, floor) = (5, 1e-12);
    let got = Kernels::cpu().sq_dist_nearest(&guidance, &models, &View::all(), k, floor);
    let want = exact().sq_dist_matrix(&guidance, &models, &View::all());
    let smallest = |m: &Matrix, i: usize| {
        let mut idx: Vec<usize> = (0..100).collect();
        idx.sort_by(|&x, &y| m.get(i, x).max(floor).total_cmp(&m.get(i, y).max(floor)));
        idx.truncate(k);
        idx
    };
    let mut estimates = 0;
    for i in 0..30 {
        let top = smallest(&want, i);
        assert_eq!(smallest(&got, i), top, "row {i}");
        let kth = want.get(i, top[k - 1]);
        for j in 0..100 {
            let (g, w) = (got.get(i, j), want.get(i, j));
            if top.contains(&j) {
                assert!((g - w).abs() <= 2.0 * SQ_DIST_REL_TOL * w, "({i},{j})");
            } else {
                assert!(g >= kth, "({i},{j}): {g} below the k-th {kth}");
                assert!((g - w).abs() <= 1e-4 * w, "({i},{j})");
            }
            estimates += usize::from((g - w).abs() > 2.0 * SQ_DIST_REL_TOL * w);
        }
    }
    // Most entries are f32-block estimates; below 64 models, or with f64
    // products, this is sq_dist_matrix bit for bit.
    assert!(estimates > 1000, "{estimates}");
    assert_eq!(
        bits(&exact().sq_dist_nearest(&guidance, &models, &View::all(), k, floor)),
        bits(&want)
    );
    let few = &models[..F32_MIN_MODELS - 1];
    assert_eq!(
        bits(&Kernels::cpu().sq_dist_nearest(&guidance, few, &View::all(), k, floor)),
        bits(&exact().sq_dist_matrix(&guidance, few, &View::all()))
    );
}

#[test]
fn gram_on_long_rows_stays_within_its_bound() {
    // Many chunks and column segments; an offset makes Σ|a·b| ≫ |⟨a,b⟩|.
    let d = 100_003;
    let a = rows(3, 5, d, 0.01);
    let g = Kernels::cpu().gram_sym(&a, &View::all());
    let gamma = gram_error_factor(d);
    assert!(gamma < 2e-13, "{gamma}");
    for i in 0..5 {
        for j in 0..5 {
            let x: Vec<f64> = a[i].iter().map(|v| f64::from(*v)).collect();
            let y: Vec<f64> = a[j].iter().map(|v| f64::from(*v)).collect();
            let exact = dot64(&x, &y);
            let abs: f64 = x.iter().zip(&y).map(|(p, q)| (p * q).abs()).sum();
            assert!((g.get(i, j) - exact).abs() <= gamma * abs);
            assert!((g.get(i, j) - dot(&a[i], &a[j])).abs() <= 1e-9 * exact.abs().max(1e-3 * abs));
        }
    }
}

#[test]
fn ranges_and_shift_match_sums_of_per_range_dots() {
    let d = 2000;
    let a = rows(4, 9, d, 0.0);
    let b = rows(5, 11, d, 0.0);
    let init = rows(6, 1, d, 0.5).remove(0);
    // Disjoint, unsorted, an empty one and one crossing a chunk boundary.
    let ranges = [1200..1900, 5..17, 300..300, 400..1100];
    let view = View::ranges(&ranges).with_shift(&init);
    let g = Kernels::cpu().gram(&a, &b, &view);
    let na = Kernels::cpu().sq_norms(&a, &view);
    for i in 0..9 {
        let x = viewed(&a[i], &ranges, Some(&init));
        assert!((na[i] - dot64(&x, &x)).abs() <= 1e-12 * dot64(&x, &x));
        for j in 0..11 {
            let y = viewed(&b[j], &ranges, Some(&init));
            let exact = dot64(&x, &y);
            assert!((g.get(i, j) - exact).abs() <= 1e-12 * norm64(&x) * norm64(&y));
        }
    }
    // Without a shift: the per-range dots pFedGraph sums today.
    let g = Kernels::cpu().gram(&a, &b, &View::ranges(&ranges));
    for i in 0..9 {
        for j in 0..11 {
            let naive: f64 = ranges
                .iter()
                .map(|r| dot(&a[i][r.clone()], &b[j][r.clone()]))
                .sum();
            assert!((g.get(i, j) - naive).abs() <= 1e-9 * naive.abs().max(1.0));
        }
    }
    // Nothing to see.
    let none: [Range<usize>; 0] = [];
    let g = Kernels::cpu().gram(&a, &b, &View::ranges(&none));
    assert!(g.as_slice().iter().all(|v| *v == 0.0));
    let empty: Vec<Vec<f32>> = Vec::new();
    assert_eq!(Kernels::cpu().gram(&empty, &b, &View::all()).rows(), 0);
    assert_eq!(Kernels::cpu().gram_sym(&empty, &View::all()).cols(), 0);
}

#[test]
fn cosines_match_vecmath() {
    let mut a = rows(7, 40, 777, 0.1);
    a[3] = vec![0.0; 777];
    let b = rows(8, 3, 777, -0.2);
    let c = Kernels::cpu().cosine_matrix(&a, &b, &View::all());
    let s = Kernels::cpu().cosine_matrix_sym(&a, &View::all());
    for i in 0..40 {
        for j in 0..3 {
            assert!((c.get(i, j) - cosine(&a[i], &b[j])).abs() < 1e-12);
        }
        for j in 0..40 {
            let want = if i == j && i != 3 {
                1.0
            } else {
                cosine(&a[i], &a[j])
            };
            assert!((s.get(i, j) - want).abs() < 1e-12, "({i},{j})");
        }
    }
    assert_eq!(s.get(3, 3), 0.0);
    assert_eq!(c.get(3, 1), 0.0);
}

fn assert_rel(got: &Matrix, want: impl Fn(usize, usize) -> f64, tol: f64) {
    for i in 0..got.rows() {
        for j in 0..got.cols() {
            let w = want(i, j);
            let e = (got.get(i, j) - w).abs();
            assert!(e <= tol * w.abs(), "({i},{j}): {} vs {w}", got.get(i, j));
        }
    }
}

#[test]
fn sq_distances_match_naive() {
    let a = rows(9, 30, 3000, 0.0);
    let b = rows(10, 20, 3000, 0.0);
    let exact = |x: &[f32], y: &[f32]| {
        let d: Vec<f64> = x
            .iter()
            .zip(y)
            .map(|(p, q)| f64::from(*p) - f64::from(*q))
            .collect();
        dot64(&d, &d)
    };
    let d = Kernels::cpu().sq_dist_matrix(&a, &b, &View::all());
    assert_rel(&d, |i, j| exact(&a[i], &b[j]), SQ_DIST_REL_TOL);
    assert_rel(&d, |i, j| sq_dist(&a[i], &b[j]), SQ_DIST_REL_TOL);
    let s = Kernels::cpu().sq_dist_matrix_sym(&a, &View::all());
    assert_rel(&s, |i, j| exact(&a[i], &a[j]), SQ_DIST_REL_TOL);
    for i in 0..30 {
        assert_eq!(s.get(i, i), 0.0);
        for j in 0..30 {
            assert_eq!(s.get(i, j).to_bits(), s.get(j, i).to_bits());
        }
    }
    let ranges = [10..20, 2500..2990];
    let r = Kernels::cpu().sq_dist_matrix(&a, &b, &View::ranges(&ranges));
    assert_rel(
        &r,
        |i, j| {
            let x = viewed(&a[i], &ranges, None);
            let y = viewed(&b[j], &ranges, None);
            let dd: Vec<f64> = x.iter().zip(&y).map(|(p, q)| p - q).collect();
            dot64(&dd, &dd)
        },
        SQ_DIST_REL_TOL,
    );
}

/// FedDWA: the guidance model is one epoch from the trained one, so the
/// distance is tiny next to the norms; ‖a‖² + ‖b‖² − 2⟨a,b⟩ alone would lose
/// most of its digits.
#[test]
fn tiny_distances_keep_their_precision() {
    let d = 20_000;
    // Models far from the origin (norm² ≈ 2·10⁴·(4 + 1/3)), spread ~1 apart.
    let models = rows(11, 12, d, 2.0);
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let guidance: Vec<Vec<f32>> = models
        .iter()
        .map(|m| {
            m.iter()
                .map(|x| x + rng.random_range(-1e-4f32..1e-4))
                .collect()
        })
        .collect();
    let exact = |x: &[f32], y: &[f32]| {
        let d: Vec<f64> = x
            .iter()
            .zip(y)
            .map(|(p, q)| f64::from(*p) - f64::from(*q))
            .collect();
        dot64(&d, &d)
    };
    let got = Kernels::cpu().sq_dist_matrix(&guidance, &models, &View::all());
    assert_rel(
        &got,
        |i, j| exact(&guidance[i], &models[j]),
        SQ_DIST_REL_TOL,
    );
    // The guidance–own pair is ~1e-8 of the norms: the naive formula on the
    // same Gram (uncentred) is far off; ours is not.
    let g = Kernels::cpu().gram(&guidance, &models, &View::all());
    let (ng, nm) = (
        Kernels::cpu().sq_norms(&guidance, &View::all()),
        Kernels::cpu().sq_norms(&models, &View::all()),
    );
    let naive_formula = ng[0] + nm[0] - 2.0 * g.get(0, 0);
    let want = exact(&guidance[0], &models[0]);
    assert!(want < 1e-6 * nm[0]);
    assert!((got.get(0, 0) - want).abs() <= SQ_DIST_REL_TOL * want);
    assert!((naive_formula - want).abs() > 100.0 * SQ_DIST_REL_TOL * want);
    // Identical rows are exactly 0 apart, in both kernels.
    let twin = vec![models[0].clone(), models[0].clone(), models[1].clone()];
    let s = Kernels::cpu().sq_dist_matrix_sym(&twin, &View::all());
    assert_eq!(s.get(0, 1), 0.0);
    assert_eq!(
        Kernels::cpu()
            .sq_dist_matrix(&twin, &twin, &View::all())
            .get(1, 0),
        0.0
    );
}

#[test]
fn non_finite_rows_only_poison_their_own_distances() {
    let mut a = rows(13, 6, 1000, 0.0);
    a[2][500] = f32::NAN;
    let cross = Kernels::cpu().sq_dist_matrix(&a, &a, &View::all());
    assert!(cross.get(2, 2).is_nan() && cross.get(2, 3).is_nan() && cross.get(1, 1) == 0.0);
    let s = Kernels::cpu().sq_dist_matrix_sym(&a, &View::all());
    for i in 0..6 {
        for j in 0..6 {
            if i == j {
                // The symmetric kernel's diagonal is 0 by definition.
                assert_eq!(s.get(i, j), 0.0);
            } else if i == 2 || j == 2 {
                assert!(s.get(i, j).is_nan());
            } else {
                let w = sq_dist(&a[i], &a[j]);
                assert!((s.get(i, j) - w).abs() <= SQ_DIST_REL_TOL * w, "({i},{j})");
            }
        }
    }
}

fn weight_rows(seed: u64, n: usize, m: usize) -> Vec<Vec<f64>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let raw: Vec<f64> = (0..m)
                .map(|_| {
                    if rng.random_bool(0.3) {
                        0.0
                    } else {
                        rng.random_range(0.0..1.0)
                    }
                })
                .collect();
            let s: f64 = raw.iter().sum::<f64>().max(1e-9);
            raw.iter().map(|w| w / s).collect()
        })
        .collect()
}

#[test]
fn mixing_matches_weighted_sum() {
    // 300 distinct rows cross the 256-row GEMM tile; 1000 columns end in a
    // partial 256-column block.
    let models = rows(14, 20, 1000, 0.0);
    let refs: Vec<&[f32]> = models.iter().map(Vec::as_slice).collect();
    let w = weight_rows(15, 300, 20);
    let mixed = Kernels::cpu().mix(&w, &models);
    assert_eq!((mixed.len(), mixed.distinct()), (300, 300));
    let mut same = 0usize;
    for (i, wi) in w.iter().enumerate() {
        let mut want = vec![0.0f32; 1000];
        weighted_sum(wi, &refs, &mut want);
        for (c, (g, r)) in mixed.row(i).iter().zip(&want).enumerate() {
            let bound: f64 = wi
                .iter()
                .zip(&models)
                .map(|(wj, mj)| (wj * f64::from(mj[c])).abs())
                .sum();
            // One f32 rounding apart at most, plus the f64 summation error.
            let tol = f64::from(f32::EPSILON) * f64::from(r.abs()) + 1e-13 * bound;
            assert!((f64::from(*g) - f64::from(*r)).abs() <= tol, "({i},{c})");
            same += usize::from(g.to_bits() == r.to_bits());
        }
    }
    // Nearly all entries round to the same f32.
    assert!(same as f64 >= 0.99 * 300_000.0, "{same}");
}

#[test]
fn identical_rows_are_mixed_once_and_bit_exactly() {
    let models = rows(16, 50, 3000, 0.0);
    let refs: Vec<&[f32]> = models.iter().map(Vec::as_slice).collect();
    let p = weight_rows(17, 1, 50).remove(0);
    let w = vec![p.clone(); 50];
    let mixed = Kernels::cpu().mix(&w, &refs);
    assert_eq!(mixed.distinct(), 1);
    let mut want = vec![0.0f32; 3000];
    weighted_sum(&p, &refs, &mut want);
    assert_eq!(mixed.row(49), want.as_slice());
    let owned = mixed.into_rows();
    assert_eq!(owned.len(), 50);
    assert!(owned.iter().all(|r| *r == want));
    // Two classes, interleaved.
    let q = weight_rows(18, 1, 50).remove(0);
    let w2 = vec![p.clone(), q.clone(), p, q];
    let m2 = Kernels::cpu().mix(&w2, &models);
    assert_eq!(m2.distinct(), 2);
    assert_eq!((m2.class_of(2), m2.class_of(3)), (0, 1));
    assert_eq!(m2.row(0), m2.row(2));
}

#[test]
fn zero_weights_skip_non_finite_models() {
    let mut models = rows(19, 10, 600, 0.0);
    models[4] = vec![f32::NAN; 600];
    models[7][3] = f32::INFINITY;
    let refs: Vec<&[f32]> = models.iter().map(Vec::as_slice).collect();
    // 8 distinct rows (the GEMM path) and 1 row (the direct path).
    for n in [8, 1] {
        let mut w = weight_rows(20 + n as u64, n, 10);
        for row in &mut w {
            row[4] = 0.0;
            row[7] = 0.0;
        }
        w[0][7] = 0.5;
        let mixed = Kernels::cpu().mix(&w, &models);
        for (i, wi) in w.iter().enumerate() {
            let mut want = vec![0.0f32; 600];
            weighted_sum(wi, &refs, &mut want);
            let got = mixed.row(i);
            for c in 0..600 {
                let (g, r) = (got[c], want[c]);
                assert_eq!(g.is_finite(), r.is_finite(), "n={n} ({i},{c})");
                assert!(g == r || (g - r).abs() <= 2.0 * f32::EPSILON * r.abs());
            }
            assert_eq!(got.iter().all(|x| x.is_finite()), i != 0);
        }
    }
    // No models, no weights.
    let none: Vec<Vec<f32>> = Vec::new();
    let m = Kernels::cpu().mix(&[Vec::<f64>::new(), Vec::new()], &none);
    assert_eq!((m.len(), m.distinct(), m.row(1).len()), (2, 1, 0));
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let a = rows(21, 270, 2100, 0.5);
    let b = rows(22, 5, 2100, 0.5);
    let mut close = b.clone();
    close[0] = a[0].iter().map(|x| x + 1e-5).collect();
    let ranges = [0..700, 900..2100];
    let w = weight_rows(23, 270, 270);
    // Nine column chunks: one thread puts all three tile pairs of its
    // Grams in one task, three and four threads one pair per task.
    let long = rows(24, 140, 4200, 0.5);
    let run = || {
        let view = View::ranges(&ranges);
        (
            bits(&Kernels::cpu().gram_sym(&long, &View::all())),
            bits(&Kernels::cpu().gram_sym(&a, &View::all())),
            bits(&Kernels::cpu().gram_sym(&a[..150], &View::all())),
            bits(&Kernels::cpu().gram(&a, &b, &view)),
            bits(&Kernels::cpu().cosine_matrix_sym(&a, &view)),
            bits(&Kernels::cpu().sq_dist_matrix(&a, &close, &View::all())),
            bits(&Kernels::cpu().sq_dist_matrix_sym(&a, &view)),
            Kernels::cpu()
                .mix(&w, &a)
                .into_rows()
                .concat()
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<u32>>(),
        )
    };
    let with = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("thread pool")
            .install(run)
    };
    let one = with(1);
    assert!(one == with(4));
    assert!(one == with(3));
}

/// A stand-in device: fails, answers with the wrong shape, or computes the
/// exact products naively; counts its calls.
struct Mock {
    mode: MockMode,
    calls: AtomicUsize,
}

#[derive(Clone, Copy, PartialEq)]
enum MockMode {
    Fail,
    WrongShape,
    Naive,
}

impl Mock {
    fn kernels(mode: MockMode, min_flops: f64) -> (Arc<Mock>, Kernels) {
        let mock = Arc::new(Mock {
            mode,
            calls: AtomicUsize::new(0),
        });
        let kernels = Kernels::offloaded(mock.clone(), min_flops);
        (mock, kernels)
    }

    fn calls(&self) -> usize {
        self.calls.load(AtomicOrdering::SeqCst)
    }
}

impl Offload for Mock {
    fn name(&self) -> &str {
        "mock"
    }

    fn gram(
        &self,
        a: &[&[f32]],
        b: Option<&[&[f32]]>,
        cols: &Columns,
    ) -> Result<DeviceGram, OffloadError> {
        self.calls.fetch_add(1, AtomicOrdering::SeqCst);
        let view = |x: &[f32]| -> Vec<f64> {
            let mut raw = vec![0.0f32; cols.k()];
            cols.gather_f32(x, 0, cols.k(), &mut raw);
            let mut sh = vec![0.0f32; cols.k()];
            if let Some(s) = cols.shift() {
                cols.gather_f32(s, 0, cols.k(), &mut sh);
            }
            raw.iter()
                .zip(&sh)
                .map(|(x, s)| f64::from(*x) - f64::from(*s))
                .collect()
        };
        let va: Vec<Vec<f64>> = a.iter().map(|x| view(x)).collect();
        let vb: Vec<Vec<f64>> = b.unwrap_or(a).iter().map(|x| view(x)).collect();
        let m = if self.mode == MockMode::WrongShape {
            vb.len() + 1
        } else {
            vb.len()
        };
        let mut g = vec![0.0; va.len() * m];
        for (i, x) in va.iter().enumerate() {
            for (j, y) in vb.iter().enumerate() {
                g[i * m + j] = dot64(x, y);
            }
        }
        match self.mode {
            MockMode::Fail => Err(OffloadError("out of memory".into())),
            _ => Ok(DeviceGram {
                gram: Matrix::from_vec(va.len(), m, g),
                norms_a: va.iter().map(|x| dot64(x, x)).collect(),
                norms_b: if b.is_some() {
                    vb.iter().map(|x| dot64(x, x)).collect()
                } else {
                    Vec::new()
                },
            }),
        }
    }

    fn gram_error_factor(&self, k: usize) -> f64 {
        gram_error_factor(k)
    }

    fn mix(&self, weights: &[&[f64]], models: &[&[f32]]) -> Result<Vec<Vec<f32>>, OffloadError> {
        self.calls.fetch_add(1, AtomicOrdering::SeqCst);
        if self.mode == MockMode::Fail {
            return Err(OffloadError("device lost".into()));
        }
        let d = models[0].len();
        let extra = usize::from(self.mode == MockMode::WrongShape);
        Ok(weights
            .iter()
            .map(|w| {
                let mut out = vec![0.0f32; d + extra];
                weighted_sum(w, models, &mut out[..d]);
                out
            })
            .collect())
    }
}

/// A device that fails, or answers with the wrong shape, costs time and
/// never a result: every product is the host's, bit for bit.
#[test]
fn a_failing_device_falls_back_to_the_host_bit_for_bit() {
    let a = rows(31, 9, 700, 0.2);
    let b = rows(32, 4, 700, -0.3);
    let w = weight_rows(33, 6, 9);
    let host = Kernels::cpu();
    let view = View::all().with_shift(&b[0]);
    for mode in [MockMode::Fail, MockMode::WrongShape] {
        let (mock, dev) = Mock::kernels(mode, 0.0);
        assert_eq!(
            bits(&dev.cosine_matrix(&a, &b, &view)),
            bits(&host.cosine_matrix(&a, &b, &view))
        );
        assert_eq!(
            bits(&dev.cosine_matrix_sym(&a, &view)),
            bits(&host.cosine_matrix_sym(&a, &view))
        );
        assert_eq!(
            bits(&dev.sq_dist_matrix_sym(&a, &view)),
            bits(&host.sq_dist_matrix_sym(&a, &view))
        );
        assert_eq!(dev.mix(&w, &a), host.mix(&w, &a));
        assert_eq!(
            mock.calls(),
            4,
            "every product was tried on the device first"
        );
    }
}

/// The device's Gram and norms are what the kernels build on: with exact
/// products the cosines equal the pair loops', and the gates keep small
/// products and few-row mixings on the host.
#[test]
fn device_products_feed_the_kernels_and_the_gates_hold() {
    let a = rows(41, 6, 500, 0.1);
    let (mock, dev) = Mock::kernels(MockMode::Naive, 0.0);
    let c = dev.cosine_matrix(&a, &a[..2], &View::all());
    for i in 0..6 {
        for j in 0..2 {
            assert!((c.get(i, j) - cosine(&a[i], &a[j])).abs() < 1e-12);
        }
    }
    assert_eq!(mock.calls(), 1);
    // Four distinct weight rows: the host's exact loop, no device call.
    let four = weight_rows(42, 4, 6);
    let mixed = dev.mix(&four, &a);
    assert_eq!(mock.calls(), 1);
    assert_eq!(mixed, Kernels::cpu().mix(&four, &a));
    // Five: the device.
    dev.mix(&weight_rows(43, 5, 6), &a);
    assert_eq!(mock.calls(), 2);
    // Under the flop gate: the host.
    let (gated_mock, gated) = Mock::kernels(MockMode::Naive, 1e9);
    gated.cosine_matrix_sym(&a, &View::all());
    gated.mix(&weight_rows(43, 5, 6), &a);
    assert_eq!(gated_mock.calls(), 0);
}

mod random_shapes {
    use super::*;
    use proptest::prelude::*;

    type Case = (Vec<Vec<f32>>, Vec<Vec<f32>>, Vec<Range<usize>>);

    /// Rows, a second set, and ranges (possibly empty, unsorted or overlapping).
    fn case() -> impl Strategy<Value = Case> {
        (0usize..5, 0usize..5, 0usize..1300).prop_flat_map(|(n, m, d)| {
            let row = prop::collection::vec(-4.0f32..4.0, d);
            let bound = d + 1;
            (
                prop::collection::vec(row.clone(), n),
                prop::collection::vec(row, m),
                prop::collection::vec((0..bound, 0..bound), 0..4).prop_map(|v| {
                    v.into_iter()
                        .map(|(x, y)| x.min(y)..x.max(y))
                        .collect::<Vec<_>>()
                }),
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn kernels_match_the_pair_loops((a, b, ranges) in case()) {
            let view = View::ranges(&ranges);
            let on = |x: &[f32], y: &[f32]| -> (f64, f64) {
                ranges.iter().fold((0.0, 0.0), |(s, ab), r| {
                    let (x, y) = (&x[r.clone()], &y[r.clone()]);
                    let abs: f64 = x.iter().zip(y).map(|(p, q)| (f64::from(*p) * f64::from(*q)).abs()).sum();
                    (s + dot(x, y), ab + abs)
                })
            };
            let g = Kernels::cpu().gram(&a, &b, &view);
            let d2 = Kernels::cpu().sq_dist_matrix(&a, &b, &view);
            prop_assert_eq!((g.rows(), g.cols()), (a.len(), b.len()));
            for i in 0..a.len() {
                for j in 0..b.len() {
                    let (want, abs) = on(&a[i], &b[j]);
                    prop_assert!((g.get(i, j) - want).abs() <= 1e-12 * abs.max(1e-300));
                    let diff: f64 = ranges.iter().map(|r| sq_dist(&a[i][r.clone()], &b[j][r.clone()])).sum();
                    prop_assert!((d2.get(i, j) - diff).abs() <= 2.0 * SQ_DIST_REL_TOL * diff);
                }
            }
            let s = Kernels::cpu().gram_sym(&a, &view);
            for i in 0..a.len() {
                for j in 0..a.len() {
                    let (want, abs) = on(&a[i], &a[j]);
                    prop_assert!((s.get(i, j) - want).abs() <= 1e-12 * abs.max(1e-300));
                }
            }
            // Mixing b's rows by weights over a's rows.
            if !a.is_empty() {
                let refs: Vec<&[f32]> = a.iter().map(Vec::as_slice).collect();
                let w: Vec<Vec<f64>> = (0..b.len() + 5)
                    .map(|i| (0..a.len()).map(|j| ((i * 7 + j * 3) % 5) as f64 * 0.1).collect())
                    .collect();
                let mixed = Kernels::cpu().mix(&w, &a);
                for (i, wi) in w.iter().enumerate() {
                    let mut want = vec![0.0f32; a[0].len()];
                    weighted_sum(wi, &refs, &mut want);
                    for (x, y) in mixed.row(i).iter().zip(&want) {
                        prop_assert!((x - y).abs() <= f32::EPSILON * y.abs() + 1e-30);
                    }
                }
            }
        }
    }
}

/// `n` rows over `m` models with `k` non-zero weights each (at `k`
/// scattered positions), normalised.
fn sparse_rows(seed: u64, n: usize, m: usize, k: usize) -> Vec<Vec<f64>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let mut w = vec![0.0f64; m];
            for _ in 0..k {
                w[rng.random_range(0..m)] = rng.random_range(0.01..1.0);
            }
            let s: f64 = w.iter().sum();
            w.iter().map(|x| x / s).collect()
        })
        .collect()
}

#[test]
fn sparse_mixing_over_many_models_takes_the_exact_loop_and_dense_the_gemm() {
    // 100 models, 120 distinct rows of at most 10 non-zero weights (10 %):
    // the sparse loop (`weighted_sum` on the non-zeros, block by block), on
    // the host even where a device takes every product.
    let models = rows(44, 100, 2500, 0.0);
    let refs: Vec<&[f32]> = models.iter().map(Vec::as_slice).collect();
    let w = sparse_rows(45, 120, 100, 10);
    const { assert!(MIX_SPARSE_MIN_MODELS <= 100) };
    let (mock, dev) = Mock::kernels(MockMode::Naive, 0.0);
    let mixed = dev.mix(&w, &models);
    assert_eq!(mock.calls(), 0, "a sparse mixing went to the GEMM's device");
    for (i, wi) in w.iter().enumerate() {
        let mut want = vec![0.0f32; 2500];
        weighted_sum(wi, &refs, &mut want);
        assert_eq!(mixed.row(i), want.as_slice(), "row {i}");
    }
    assert_eq!(mixed, Kernels::cpu().mix(&w, &models));
    // Dense rows (70 %) over the same models take the GEMM (the device).
    dev.mix(&weight_rows(46, 120, 100), &models);
    assert_eq!(mock.calls(), 1);
    // Sparse rows over fewer models than the gate: the GEMM too.
    let few = rows(47, MIX_SPARSE_MIN_MODELS - 1, 300, 0.0);
    dev.mix(&sparse_rows(48, 10, few.len(), 2), &few);
    assert_eq!(mock.calls(), 2);
}

#[test]
fn sparse_mixing_is_the_same_at_any_thread_count() {
    let models = rows(47, 80, 5000, 0.0);
    let w = sparse_rows(48, 80, 80, 8);
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
        .install(|| Kernels::cpu().mix(&w, &models));
    let three = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap()
        .install(|| Kernels::cpu().mix(&w, &models));
    assert_eq!(one, three);
}
