//! Vector math on flat `f32` parameter vectors.
//!
//! Reductions accumulate in `f64` in a fixed order, so results are exact
//! enough for graph inference and identical on every run.

crate::wide! {
    /// ⟨a, b⟩. Called per training step by the cosine and proximal terms
    /// and per model by the servers, over whole models.
    pub fn dot(a: &[f32], b: &[f32]) -> f64 => dot_body
}

#[inline(always)]
fn dot_body(a: &[f32], b: &[f32]) -> f64 {
    debug_assert_eq!(a.len(), b.len());
    sum4(a, b, |x, y| f64::from(x) * f64::from(y))
}

/// Σ term(x_e, y_e) in the crate's fixed order: four accumulators, one per
/// position mod 4, added as (0 + 1) + (2 + 3), then the tail in order.
/// Walking by chunks (not by index) lets the loop vectorise without a
/// bounds check per element; the order keeps every caller's bits.
#[inline(always)]
pub(crate) fn sum4<X: Copy, Y: Copy>(x: &[X], y: &[Y], term: impl Fn(X, Y) -> f64) -> f64 {
    let [s] = sums4(x, y, |a, b| [term(a, b)]);
    s
}

/// `K` sums of [`sum4`]'s order in one pass: sum `k` has the bits of
/// `sum4` over the `k`-th component of `term`.
#[inline(always)]
fn sums4<const K: usize, X: Copy, Y: Copy>(
    x: &[X],
    y: &[Y],
    term: impl Fn(X, Y) -> [f64; K],
) -> [f64; K] {
    let mut acc = [[0.0f64; K]; 4];
    let mut xs = x.chunks_exact(4);
    let mut ys = y.chunks_exact(4);
    for (a, b) in (&mut xs).zip(&mut ys) {
        for q in 0..4 {
            let t = term(a[q], b[q]);
            for k in 0..K {
                acc[q][k] += t[k];
            }
        }
    }
    let mut s: [f64; K] =
        std::array::from_fn(|k| (acc[0][k] + acc[1][k]) + (acc[2][k] + acc[3][k]));
    for (a, b) in xs.remainder().iter().zip(ys.remainder()) {
        let t = term(*a, *b);
        for k in 0..K {
            s[k] += t[k];
        }
    }
    s
}

crate::wide! {
    /// (⟨t, x⟩, ‖x‖²) in one pass, with the bits of `dot(t, x)` and
    /// `dot(x, x)`: the cosine term needs both every training step.
    pub fn dot_and_sq_norm(t: &[f32], x: &[f32]) -> (f64, f64) => dot_and_sq_norm_body
}

#[inline(always)]
fn dot_and_sq_norm_body(t: &[f32], x: &[f32]) -> (f64, f64) {
    debug_assert_eq!(t.len(), x.len());
    let [inner, sq] = sums4(t, x, |a, b| {
        let b = f64::from(b);
        [f64::from(a) * b, b * b]
    });
    (inner, sq)
}

crate::wide! {
    /// [`dot_and_sq_norm`] of `t` and the concatenation of `x_parts`, bit
    /// for bit, without joining them: the cosine term reads θ as the
    /// trainer holds it, one slice per tensor.
    pub fn dot_and_sq_norm_parts(t: &[f32], x_parts: &[&[f32]]) -> (f64, f64) => dot_and_sq_norm_parts_body
}

#[inline(always)]
fn dot_and_sq_norm_parts_body(t: &[f32], x_parts: &[&[f32]]) -> (f64, f64) {
    let [inner, sq] = sums4_parts(t, x_parts, |a, b| {
        let b = f64::from(b);
        [f64::from(a) * b, b * b]
    });
    (inner, sq)
}

crate::wide! {
    /// (⟨t, x⟩, ‖x‖², ‖t‖²) of `t` and the concatenation of `x_parts`, with
    /// the bits of `dot(t, x)`, `dot(x, x)` and `dot(t, t)`: the cosine
    /// term's first step learns ‖t‖ in the pass it makes anyway (the sums'
    /// additions are latency-bound, so a third chain adds no time).
    pub fn dot_and_sq_norms_parts(t: &[f32], x_parts: &[&[f32]]) -> (f64, f64, f64) => dot_and_sq_norms_parts_body
}

#[inline(always)]
fn dot_and_sq_norms_parts_body(t: &[f32], x_parts: &[&[f32]]) -> (f64, f64, f64) {
    let [inner, sq, sq_t] = sums4_parts(t, x_parts, |a, b| {
        let (a, b) = (f64::from(a), f64::from(b));
        [a * b, b * b, a * a]
    });
    (inner, sq, sq_t)
}

/// [`sums4`] of `x` and the concatenation of `ys`: element e still goes to
/// accumulator e mod 4 in order and the last `len mod 4` into the tail, so
/// the bits are those of the joined vectors, whatever the cut.
#[inline(always)]
fn sums4_parts<const K: usize, X: Copy, Y: Copy>(
    x: &[X],
    ys: &[&[Y]],
    term: impl Fn(X, Y) -> [f64; K],
) -> [f64; K] {
    let total: usize = ys.iter().map(|y| y.len()).sum();
    assert_eq!(x.len(), total, "parts covering the whole vector");
    let main = total - total % 4;
    // Sum k's four accumulators side by side (one vector of four lanes):
    // with [[f64; K]; 4] the three-sum pass stayed scalar (3.3× slower on
    // AVX2) and the pair ran at 0.6× of this speed.
    let mut acc = [[0.0f64; 4]; K];
    let add = |acc: &mut [[f64; 4]; K], q: usize, t: [f64; K]| {
        for k in 0..K {
            acc[k][q] += t[k];
        }
    };
    let mut pos = 0;
    for y in ys {
        let xs = &x[pos..pos + y.len()];
        // This part's elements before the tail: a head up to a multiple of
        // four, whole chunks, then the rest (the next part continues them).
        let end = y.len().min(main.saturating_sub(pos));
        let head = ((4 - pos % 4) % 4).min(end);
        for i in 0..head {
            add(&mut acc, (pos + i) % 4, term(xs[i], y[i]));
        }
        let whole = (end - head) / 4 * 4;
        let (xc, yc) = (&xs[head..head + whole], &y[head..head + whole]);
        for (a, b) in xc.chunks_exact(4).zip(yc.chunks_exact(4)) {
            let t: [[f64; K]; 4] = std::array::from_fn(|q| term(a[q], b[q]));
            for k in 0..K {
                for q in 0..4 {
                    acc[k][q] += t[q][k];
                }
            }
        }
        for i in head + whole..end {
            add(&mut acc, (pos + i) % 4, term(xs[i], y[i]));
        }
        pos += y.len();
    }
    let mut s: [f64; K] =
        std::array::from_fn(|k| (acc[k][0] + acc[k][1]) + (acc[k][2] + acc[k][3]));
    let mut pos = 0;
    for y in ys {
        for i in main.saturating_sub(pos).min(y.len())..y.len() {
            let t = term(x[pos + i], y[i]);
            for k in 0..K {
                s[k] += t[k];
            }
        }
        pos += y.len();
    }
    s
}

/// ‖a‖₂.
pub fn norm(a: &[f32]) -> f64 {
    dot(a, a).sqrt()
}

/// ‖a − b‖₂².
pub fn sq_dist(a: &[f32], b: &[f32]) -> f64 {
    debug_assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d = *x as f64 - *y as f64;
            d * d
        })
        .sum()
}

/// cos(a, b); 0 when either vector is zero.
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let na = norm(a);
    let nb = norm(b);
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot(a, b) / (na * nb)
    }
}

/// y ← y + a·x.
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += a * xi;
    }
}

/// `rows` zeroed vectors of `len` elements, each allocated zeroed.
///
/// `vec![vec![0.0; len]; rows]` clones its first row into the others, a copy
/// of `rows·len` floats read and written; a zeroed allocation is one write
/// at most, and none when the allocator hands out fresh pages. Outputs a
/// kernel then overwrites (a round's mixed models) are allocated this way.
pub fn zeroed_rows(rows: usize, len: usize) -> Vec<Vec<f32>> {
    (0..rows).map(|_| vec![0.0f32; len]).collect()
}

/// out ← a − b.
pub fn sub_into(a: &[f32], b: &[f32], out: &mut [f32]) {
    for ((o, x), y) in out.iter_mut().zip(a).zip(b) {
        *o = x - y;
    }
}

/// out ← Σ_j w_j · models_j, skipping zero weights. Accumulates in f64 per
/// element so that a row of the graph mixes exactly, whatever its sparsity.
pub fn weighted_sum(weights: &[f64], models: &[&[f32]], out: &mut [f32]) {
    debug_assert_eq!(weights.len(), models.len());
    let mut acc = vec![0.0f64; out.len()];
    for (w, m) in weights.iter().zip(models) {
        if *w == 0.0 {
            continue;
        }
        for (a, x) in acc.iter_mut().zip(m.iter()) {
            *a += w * *x as f64;
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        *o = *a as f32;
    }
}

crate::wide! {
    /// True when every element is finite. Every model that crosses a
    /// boundary is checked, so this runs over gigabytes a round: it tests
    /// blocks without branching (which vectorises) and stops at the first
    /// block holding a NaN or an infinity.
    pub fn all_finite(a: &[f32]) -> bool => all_finite_body
}

#[inline(always)]
fn all_finite_body(a: &[f32]) -> bool {
    // An `f32` is finite when its exponent bits are not all ones.
    const EXP: u32 = 0x7f80_0000;
    a.chunks(1024).all(|block| {
        block
            .iter()
            .fold(true, |ok, x| ok & (x.to_bits() & EXP != EXP))
    })
}

/// Mean of a slice of f64 (0 for an empty slice).
pub fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

/// Population standard deviation (0 for fewer than two values).
pub fn std_dev(xs: &[f64]) -> f64 {
    if xs.len() < 2 {
        return 0.0;
    }
    let m = mean(xs);
    (xs.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / xs.len() as f64).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `dot`'s order written out by index: accumulator k takes the
    /// positions ≡ k (mod 4), they are added as (0 + 1) + (2 + 3), then the
    /// tail in order.
    fn dot_by_index(a: &[f32], b: &[f32]) -> f64 {
        let mut acc = [0.0f64; 4];
        let chunks = a.len() / 4;
        for c in 0..chunks {
            for k in 0..4 {
                acc[k] += a[4 * c + k] as f64 * b[4 * c + k] as f64;
            }
        }
        let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        for i in 4 * chunks..a.len() {
            s += a[i] as f64 * b[i] as f64;
        }
        s
    }

    #[test]
    fn dot_and_its_fused_pair_have_the_bits_of_their_order_at_every_length() {
        // Values of mixed magnitude and sign, so that another order of
        // additions would round differently.
        let a: Vec<f32> = (0..1031)
            .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 10f32.powi(i % 7 - 3))
            .collect();
        let b: Vec<f32> = (0..1031)
            .map(|i| ((i * 104_729 % 997) as f32 - 498.0) * 10f32.powi(i % 5 - 2))
            .collect();
        for len in (0..12).chain([255, 256, 257, 1030, 1031]) {
            let (x, y) = (&a[..len], &b[..len]);
            assert_eq!(
                dot(x, y).to_bits(),
                dot_by_index(x, y).to_bits(),
                "length {len}"
            );
            let (inner, sq) = dot_and_sq_norm(x, y);
            assert_eq!(
                inner.to_bits(),
                dot_by_index(x, y).to_bits(),
                "length {len}"
            );
            assert_eq!(sq.to_bits(), dot_by_index(y, y).to_bits(), "length {len}");
        }
        // The order matters on these values: a plain left-to-right sum differs.
        let serial: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
        assert_ne!(serial.to_bits(), dot(&a, &b).to_bits());
        // Cut into parts anywhere (empty ones, parts shorter than four, a
        // tail across parts), the pair keeps the joined vector's bits.
        for len in [0, 1, 3, 4, 7, 8, 13, 257, 1031] {
            let (x, y) = (&a[..len], &b[..len]);
            let want = dot_and_sq_norm(x, y);
            for cuts in [
                vec![],
                vec![0, 0],
                vec![1],
                vec![2, 3, 5],
                vec![len / 3, len / 2, len - len / 5],
            ] {
                let mut bounds: Vec<usize> = cuts.into_iter().filter(|c| *c <= len).collect();
                bounds.push(len);
                let mut parts = Vec::new();
                let mut lo = 0;
                for hi in bounds {
                    parts.push(&y[lo..hi.max(lo)]);
                    lo = hi.max(lo);
                }
                let got = dot_and_sq_norm_parts(x, &parts);
                let (inner, sq, sq_x) = dot_and_sq_norms_parts(x, &parts);
                let at = format!("length {len}, {} parts", parts.len());
                assert_eq!(got.0.to_bits(), want.0.to_bits(), "{at}");
                assert_eq!(got.1.to_bits(), want.1.to_bits(), "{at}");
                // The three-sum pass: the same two, and ‖x‖² as `dot`.
                assert_eq!(inner.to_bits(), want.0.to_bits(), "{at}");
                assert_eq!(sq.to_bits(), want.1.to_bits(), "{at}");
                assert_eq!(sq_x.to_bits(), dot(x, x).to_bits(), "{at}");
            }
        }
    }

    #[test]
    fn all_finite_finds_every_non_finite_value_anywhere() {
        let finite = [
            0.0f32,
            -0.0,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            1e-45,
            -1e-45,
        ];
        let mut a: Vec<f32> = (0..2500).map(|i| finite[i % finite.len()]).collect();
        assert!(all_finite(&a));
        assert!(all_finite(&[]));
        // Across block boundaries (1024) and in the tail.
        for at in [0, 1, 1023, 1024, 1025, 2047, 2048, 2499] {
            for bad in [f32::NAN, -f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let keep = a[at];
                a[at] = bad;
                assert!(!all_finite(&a), "{bad} at {at}");
                assert!(!all_finite(&a[at..at + 1]));
                a[at] = keep;
            }
        }
        assert!(all_finite(&a));
    }

    #[test]
    fn basic_identities() {
        let a = [1.0, 2.0, 3.0, 4.0, 5.0];
        let b = [5.0, 4.0, 3.0, 2.0, 1.0];
        assert_eq!(dot(&a, &b), 35.0);
        assert!((norm(&[3.0, 4.0]) - 5.0).abs() < 1e-12);
        assert_eq!(sq_dist(&a, &b), 40.0);
        assert!((cosine(&[1.0, 0.0], &[0.0, 2.0])).abs() < 1e-12);
        assert!((cosine(&[1.0, 1.0], &[-2.0, -2.0]) + 1.0).abs() < 1e-12);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 1.0]), 0.0);
        let mut out = [0.0f32; 2];
        weighted_sum(&[0.25, 0.75], &[&[4.0, 0.0], &[0.0, 4.0]], &mut out);
        assert_eq!(out, [1.0, 3.0]);
        let mut y = [1.0f32, 1.0];
        axpy(2.0, &[1.0, -1.0], &mut y);
        assert_eq!(y, [3.0, -1.0]);
        assert!((std_dev(&[1.0, 3.0]) - 1.0).abs() < 1e-12);
    }
}
