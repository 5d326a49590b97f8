//! The pairwise kernels' element-wise loops, each compiled for the CPU's
//! widest vectors by [`wide!`](crate::wide): the gathers that centre and
//! round model columns, the `f64` accumulation of `f32` GEMM blocks, the
//! blocked sums of squares and the mixing's weighted sums. They were
//! SSE2 code around `gemm`'s AVX-512 kernels. Same bits on every path.

use crate::vecmath::sum4;
use crate::wide;
use std::mem::MaybeUninit;

wide! {
    /// dst ← src − shift, the `f64` difference rounded once to `f32`, which
    /// is the `f32` difference: rounding to 53 bits and then to 24 equals
    /// rounding once to 24 for a sum or difference, as 53 ≥ 2·24 + 2
    /// (Figueroa, "When is double rounding innocuous?", 1995). Computed in
    /// `f32`, without the widening and narrowing that made it a tenth of
    /// pFedGraph's server step on AVX2.
    pub(super) fn centre_f32(dst: &mut [f32], src: &[f32], shift: &[f32]) => centre_f32_body
}

wide! {
    /// dst ← src − shift in `f64` (exact for `f32` inputs' widening).
    pub(super) fn centre_f64(dst: &mut [f64], src: &[f32], shift: &[f32]) => centre_f64_body
}

wide! {
    /// dst ← src widened to `f64`.
    pub(super) fn widen_f64(dst: &mut [f64], src: &[f32]) => widen_f64_body
}

wide! {
    /// out ← acc rounded to `f32`; whether every rounded value is finite
    /// (the mixings' check for rows to recompute).
    pub(super) fn narrow_f32(out: &mut [MaybeUninit<f32>], acc: &[f64]) -> bool => narrow_f32_body
}

wide! {
    /// out ← acc + part in `f64`, rounded to `f32`: [`add_f32`] and
    /// [`narrow_f32`] in one pass; whether every rounded value is finite.
    pub(super) fn add_narrow_f32(out: &mut [MaybeUninit<f32>], acc: &[f64], part: &[f32]) -> bool => add_narrow_f32_body
}

wide! {
    /// out ← 0 + b₀ in `f64`, rounded to `f32` (−0 becomes +0, as
    /// [`narrow_f32`] of zeros plus [`add_f32`] gives); whether every value
    /// is finite.
    pub(super) fn one_narrow_f32(out: &mut [MaybeUninit<f32>], b0: &[f32]) -> bool => one_narrow_f32_body
}

wide! {
    /// out ← (0 + b₀) + b₁ in `f64`, rounded to `f32`: a mixing's two
    /// blocks without an `f64` accumulator; whether every value is finite.
    pub(super) fn two_narrow_f32(out: &mut [MaybeUninit<f32>], b0: &[f32], b1: &[f32]) -> bool => two_narrow_f32_body
}

wide! {
    /// acc ← (0 + b₀) + b₁ in `f64`: [`add_f32`] twice onto zeros, in one
    /// pass that writes no zeros.
    pub(super) fn start_two_f32(acc: &mut [f64], b0: &[f32], b1: &[f32]) => start_two_f32_body
}

wide! {
    /// acc ← acc + part, each `f32` widened to `f64`.
    pub(super) fn add_f32(acc: &mut [f64], part: &[f32]) => add_f32_body
}

wide! {
    /// acc ← acc + part.
    pub(super) fn add_f64(acc: &mut [f64], part: &[f64]) => add_f64_body
}

wide! {
    /// Σ x·y in a fixed order with four accumulators (depth ≤ len/4 + 2).
    pub(super) fn dot4(x: &[f64], y: &[f64]) -> f64 => dot4_body
}

wide! {
    /// Σ (x − y)² in [`dot4`]'s order: the differences round as a
    /// materialised `x − y` would, so it equals `dot4(d, d)` of them.
    pub(super) fn diff_dot4(x: &[f64], y: &[f64]) -> f64 => diff_dot4_body
}

wide! {
    /// `weighted_sum` on one block (columns `c0..c0 + out.len()`) of one
    /// output row, over its non-zero `terms`: the reference semantics. Four
    /// models per pass with the same per-element order of additions, so the
    /// result is bit-identical to `weighted_sum` with a quarter of the
    /// traffic on the accumulator.
    pub(super) fn weighted_block(terms: &[(f64, &[f32])], c0: usize, out: &mut [MaybeUninit<f32>], acc: &mut [f64]) => weighted_block_body
}

/// Asks the CPU to bring `x`'s cache lines toward L1 (a hint: no effect on
/// results, and nothing on other architectures).
#[inline]
pub(super) fn prefetch(x: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in x.chunks(16) {
        // SAFETY: a prefetch is a hint that never faults, and SSE is part of
        // x86-64's baseline.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast(),
            );
        }
    }
}

#[inline(always)]
fn centre_f32_body(dst: &mut [f32], src: &[f32], shift: &[f32]) {
    for ((d, v), c) in dst.iter_mut().zip(src).zip(shift) {
        *d = *v - *c;
    }
}

#[inline(always)]
fn centre_f64_body(dst: &mut [f64], src: &[f32], shift: &[f32]) {
    for ((d, v), c) in dst.iter_mut().zip(src).zip(shift) {
        *d = f64::from(*v) - f64::from(*c);
    }
}

#[inline(always)]
fn widen_f64_body(dst: &mut [f64], src: &[f32]) {
    for (d, v) in dst.iter_mut().zip(src) {
        *d = f64::from(*v);
    }
}

/// Writes each `f64` sum rounded to `f32` into `out`; whether every
/// rounded value is finite. The mixings' rounding passes differ only in
/// the sums they round.
#[inline(always)]
fn write_rounded(out: &mut [MaybeUninit<f32>], sums: impl Iterator<Item = f64>) -> bool {
    let mut finite = true;
    for (o, s) in out.iter_mut().zip(sums) {
        let x = s as f32;
        o.write(x);
        finite &= x.is_finite();
    }
    finite
}

#[inline(always)]
fn narrow_f32_body(out: &mut [MaybeUninit<f32>], acc: &[f64]) -> bool {
    write_rounded(out, acc.iter().copied())
}

#[inline(always)]
fn add_narrow_f32_body(out: &mut [MaybeUninit<f32>], acc: &[f64], part: &[f32]) -> bool {
    write_rounded(out, acc.iter().zip(part).map(|(s, v)| *s + f64::from(*v)))
}

#[inline(always)]
fn one_narrow_f32_body(out: &mut [MaybeUninit<f32>], b0: &[f32]) -> bool {
    write_rounded(out, b0.iter().map(|v| 0.0 + f64::from(*v)))
}

#[inline(always)]
fn two_narrow_f32_body(out: &mut [MaybeUninit<f32>], b0: &[f32], b1: &[f32]) -> bool {
    let sums = b0.iter().zip(b1);
    write_rounded(
        out,
        sums.map(|(u, v)| (0.0 + f64::from(*u)) + f64::from(*v)),
    )
}

#[inline(always)]
fn start_two_f32_body(acc: &mut [f64], b0: &[f32], b1: &[f32]) {
    for ((s, u), v) in acc.iter_mut().zip(b0).zip(b1) {
        *s = (0.0 + f64::from(*u)) + f64::from(*v);
    }
}

#[inline(always)]
fn add_f32_body(acc: &mut [f64], part: &[f32]) {
    for (s, v) in acc.iter_mut().zip(part) {
        *s += f64::from(*v);
    }
}

#[inline(always)]
fn add_f64_body(acc: &mut [f64], part: &[f64]) {
    for (s, v) in acc.iter_mut().zip(part) {
        *s += v;
    }
}

#[inline(always)]
fn dot4_body(x: &[f64], y: &[f64]) -> f64 {
    sum4(x, y, |a, b| a * b)
}

#[inline(always)]
fn diff_dot4_body(x: &[f64], y: &[f64]) -> f64 {
    sum4(x, y, |a, b| (a - b) * (a - b))
}

#[inline(always)]
fn weighted_block_body(
    terms: &[(f64, &[f32])],
    c0: usize,
    out: &mut [MaybeUninit<f32>],
    acc: &mut [f64],
) {
    let len = out.len();
    let acc = &mut acc[..len];
    acc.fill(0.0);
    let mut quads = terms.chunks_exact(4);
    for q in &mut quads {
        let [(w0, x0), (w1, x1), (w2, x2), (w3, x3)] = [q[0], q[1], q[2], q[3]];
        let (x0, x1, x2, x3) = (
            &x0[c0..c0 + len],
            &x1[c0..c0 + len],
            &x2[c0..c0 + len],
            &x3[c0..c0 + len],
        );
        for e in 0..len {
            let mut s = acc[e];
            s += w0 * f64::from(x0[e]);
            s += w1 * f64::from(x1[e]);
            s += w2 * f64::from(x2[e]);
            s += w3 * f64::from(x3[e]);
            acc[e] = s;
        }
    }
    for &(w, x) in quads.remainder() {
        for (s, v) in acc.iter_mut().zip(&x[c0..c0 + len]) {
            *s += w * f64::from(*v);
        }
    }
    for (o, s) in out.iter_mut().zip(acc.iter()) {
        o.write(*s as f32);
    }
}

#[cfg(test)]
mod tests {
    use super::super::as_uninit;
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The fused passes of the `f32` mixing equal the passes they replace,
    /// bit for bit: zeros plus each block in turn (−0 becomes +0), then
    /// rounding, with the same finiteness verdict, whether the sum has one
    /// block, two, or more (an accumulator started from two).
    #[test]
    fn fused_mixing_passes_equal_the_separate_ones() {
        let bits32 = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let bits64 = |x: &[f64]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut block = |special: &[f32]| {
            let mut b: Vec<f32> = (0..4099).map(|_| rng.random_range(-3.0f32..3.0)).collect();
            b[..special.len()].copy_from_slice(special);
            b
        };
        let b0 = block(&[-0.0, 0.0, f32::MAX, f32::MIN_POSITIVE, -0.0]);
        let b1 = block(&[-0.0, 1.0, f32::MAX, 0.0]);
        let b2 = block(&[-0.0, -1.0, -f32::MAX]);
        // The separate passes: zeros, then one `add_f32` per block.
        let mut sum = vec![0.0f64; 4099];
        let rounded = |sum: &[f64]| {
            let mut out = vec![0.0f32; 4099];
            let finite = narrow_f32(as_uninit(&mut out), sum);
            (out, finite)
        };
        let mut out = vec![0.0f32; 4099];

        add_f32(&mut sum, &b0);
        let want = rounded(&sum);
        let finite = one_narrow_f32(as_uninit(&mut out), &b0);
        assert_eq!((bits32(&out), finite), (bits32(&want.0), want.1));
        assert_eq!(out[0].to_bits(), 0.0f32.to_bits(), "−0 onto zeros is +0");
        assert!(finite);

        add_f32(&mut sum, &b1);
        let want = rounded(&sum);
        let finite = two_narrow_f32(as_uninit(&mut out), &b0, &b1);
        assert_eq!((bits32(&out), finite), (bits32(&want.0), want.1));
        assert!(!finite, "f32::MAX + f32::MAX overflows the f32 range");
        assert!(out[3..].iter().all(|x| x.is_finite()));
        let mut acc = vec![1.0f64; 4099];
        start_two_f32(&mut acc, &b0, &b1);
        assert_eq!(bits64(&acc), bits64(&sum));
        assert_eq!(acc[0].to_bits(), 0.0f64.to_bits());

        let finite = add_narrow_f32(as_uninit(&mut out), &acc, &b2);
        add_f32(&mut sum, &b2);
        let want = rounded(&sum);
        assert_eq!((bits32(&out), finite), (bits32(&want.0), want.1));
        assert!(finite, "the third block brings the overflow back");
    }

    /// The `f32` difference is the `f64` one rounded to `f32`, bit for bit,
    /// on random bit patterns (every exponent gap, subnormals, ±0, ±∞) and
    /// on pairs one or two ulps apart; NaN stays NaN.
    #[test]
    fn centre_f32_is_the_f64_difference_rounded() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut src: Vec<f32> = (0..20_000).map(|_| f32::from_bits(rng.random())).collect();
        let mut shift: Vec<f32> = (0..20_000).map(|_| f32::from_bits(rng.random())).collect();
        for i in 0..5_000 {
            // Close pairs, where the difference is exact or cancels.
            let near = f32::from_bits(src[i].to_bits().wrapping_add(rng.random_range(0..3)));
            shift[i] = near;
            // Pairs whose exponents differ by up to 40, around 1.
            src[5_000 + i] = rng.random_range(1.0f32..2.0);
            shift[5_000 + i] = rng.random_range(1.0f32..2.0) * 2f32.powi(rng.random_range(-40..40));
        }
        let mut got = vec![0.0f32; src.len()];
        centre_f32(&mut got, &src, &shift);
        for ((g, &v), &c) in got.iter().zip(&src).zip(&shift) {
            let want = (f64::from(v) - f64::from(c)) as f32;
            if want.is_nan() {
                assert!(g.is_nan(), "{v:e} − {c:e}");
            } else {
                assert_eq!(g.to_bits(), want.to_bits(), "{v:e} − {c:e}");
            }
        }
    }
}
