//! k×k max pooling on `f32` slices, forward and backward, in one pass that
//! keeps each window's winner (its index in the plane) for the backward
//! pass. Branch-free vector selects: the seed models' 2×2 windows of
//! stride 2 as pairs of columns (by AVX-512 or AVX2 permutes where the CPU
//! has them), then of rows ([`Pairs`]); other windows of stride 1 or 2 (the
//! ResNets' 3×3 stem pools) over stride phases ([`Phases`]); the rest, and
//! planes holding NaN, a scan of each window.
//!
//! Layout `[batch, channels, h, w]`, floor mode, padding never wins. Ties go
//! to the first maximum in row-major order; a window holding NaN yields NaN,
//! so a diverged run stays visibly diverged.

use super::relu_keeps;
use super::vectors::Vectors;
use fedweave_core::wide;

/// The shape of one pooling: square windows, stride and padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PoolGeom {
    pub planes: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
    pub oh: usize,
    pub ow: usize,
}

impl PoolGeom {
    /// `planes` planes of `h × w` under k×k windows, or `None` when the
    /// window does not fit, the output is empty, or padding would fill a
    /// whole window (2·pad ≥ k + 1, which burn also refuses).
    pub fn new(
        planes: usize,
        h: usize,
        w: usize,
        k: usize,
        stride: usize,
        pad: usize,
    ) -> Option<Self> {
        if k == 0 || stride == 0 || 2 * pad > k {
            return None;
        }
        let out = |n: usize| (n + 2 * pad).checked_sub(k).map(|d| d / stride + 1);
        let (oh, ow) = (out(h)?, out(w)?);
        (planes * oh * ow > 0).then_some(Self {
            planes,
            h,
            w,
            k,
            stride,
            pad,
            oh,
            ow,
        })
    }

    /// Output elements.
    pub fn out_len(&self) -> usize {
        self.planes * self.oh * self.ow
    }

    /// Input rows (or columns) of window `o`: the part inside `0..n`.
    fn span(&self, o: usize, n: usize) -> std::ops::Range<usize> {
        let start = o * self.stride;
        start.saturating_sub(self.pad)..(start + self.k).saturating_sub(self.pad).min(n)
    }
}

wide! {
    /// The maxima, `[planes, oh, ow]` (through burn's ReLU when `relu`), and
    /// each one's index in its input plane.
    pub(crate) fn forward(g: &PoolGeom, x: &[f32], relu: bool) -> (Vec<f32>, Vec<u32>) => forward_body
}

/// [`forward`] for any target.
#[inline(always)]
fn forward_body(g: &PoolGeom, x: &[f32], relu: bool) -> (Vec<f32>, Vec<u32>) {
    let mut out = vec![0.0f32; g.out_len()];
    let mut arg = vec![0u32; g.out_len()];
    let (hw, ohw) = (g.h * g.w, g.oh * g.ow);
    let pairs = out.chunks_exact_mut(ohw).zip(arg.chunks_exact_mut(ohw));
    let planes = pairs.zip(x.chunks_exact(hw));
    // Plain loops, each with its own NaN check: a `for_each` over the zip,
    // and a closure handed to one shared loop, were left out of line at the
    // baseline target (the closure cost `resnet8` 15 % of a step).
    if (g.k, g.stride, g.pad) == (2, 2, 0) {
        let mut pairs = Pairs::new(g, Vectors::detect());
        for ((out, arg), plane) in planes {
            if holds_nan(plane) {
                pool_scan(g, plane, out, arg);
            } else {
                pairs.plane(g, plane, out, arg);
            }
        }
    } else if g.stride == 1 {
        Phases::<1>::new(g).pool(g, planes);
    } else if g.stride == 2 {
        Phases::<2>::new(g).pool(g, planes);
    } else {
        for ((out, arg), plane) in planes {
            pool_scan(g, plane, out, arg);
        }
    }
    if relu {
        for v in &mut out {
            if !relu_keeps(*v) {
                *v = 0.0;
            }
        }
    }
    (out, arg)
}

/// 2×2 windows of stride 2 in two branch-free passes: each row's pairs of
/// columns first ([`pair_winners`], a deinterleaving the compiler does
/// not vectorise well, so it has intrinsics paths), then each output row
/// from its two rows' pair winners (a loop the compiler vectorises). Within
/// a row the left value wins ties, and the top row's winner wins them
/// against the bottom's: the first maximum in row-major order, as the
/// window scan finds it. (Rows first would not be: with 1, 5 on top and
/// 5, 0 below, the scan picks the top 5.)
struct Pairs {
    /// The pair winners' vector path, detected once per forward.
    vectors: Vectors,
    /// The rows the windows cover without their odd last column, when the
    /// width is odd: one run of pairs, `2·oh × 2·ow`.
    even: Vec<f32>,
    /// The winner of each pair of columns of those rows, `2·oh × ow`, and
    /// its index in them.
    best: Vec<f32>,
    at: Vec<u32>,
}

impl Pairs {
    fn new(g: &PoolGeom, vectors: Vectors) -> Self {
        let n = 2 * g.oh * g.ow;
        Self {
            vectors,
            even: if g.w == 2 * g.ow {
                Vec::new()
            } else {
                vec![0.0; 2 * n]
            },
            best: vec![0.0; n],
            at: vec![0; n],
        }
    }

    /// One plane without NaN.
    #[inline(always)]
    fn plane(&mut self, g: &PoolGeom, plane: &[f32], out: &mut [f32], arg: &mut [u32]) {
        // Index loops over slices of known length: the compiler keeps them
        // in this function and vectorises them (zipped iterators were left
        // out of line at the baseline target). Floor mode drops an odd last
        // row.
        let (w, ow, width) = (g.w, g.ow, 2 * g.ow);
        let n = g.oh * width;
        let Self {
            vectors,
            even,
            best,
            at,
        } = self;
        let src = if w == width {
            &plane[..2 * n]
        } else {
            // An odd last column, which no window covers, ends each row.
            for (dst, row) in even.chunks_exact_mut(width).zip(plane.chunks_exact(w)) {
                dst.copy_from_slice(&row[..width]);
            }
            &even[..]
        };
        pair_winners(*vectors, src, best, at);
        // A pair winner's index in the plane: its index in `src` plus one
        // dropped column per row above it.
        let skip = (w - width) as u32;
        for r in 0..g.oh {
            let (top, bottom) = (&best[2 * r * ow..][..ow], &best[(2 * r + 1) * ow..][..ow]);
            let (top_at, bottom_at) = (&at[2 * r * ow..][..ow], &at[(2 * r + 1) * ow..][..ow]);
            let (top_skip, bottom_skip) = (2 * r as u32 * skip, (2 * r as u32 + 1) * skip);
            let (out, arg) = (&mut out[r * ow..][..ow], &mut arg[r * ow..][..ow]);
            for c in 0..ow {
                let down = bottom[c] > top[c];
                out[c] = if down { bottom[c] } else { top[c] };
                arg[c] = if down {
                    bottom_at[c] + bottom_skip
                } else {
                    top_at[c] + top_skip
                };
            }
        }
    }
}

/// The winner of each pair of `src` (`2·best.len()` values without NaN):
/// the right value where it is larger, else the left, into `best`, and its
/// index in `src` into `at`.
#[inline(always)]
fn pair_winners(how: Vectors, src: &[f32], best: &mut [f32], at: &mut [u32]) {
    let n = best.len();
    assert!(src.len() == 2 * n && at.len() == n);
    let done = match how {
        // SAFETY: `Vectors::detect` chose it, so the CPU has AVX-512F.
        #[cfg(target_arch = "x86_64")]
        Vectors::Avx512 => unsafe { pair_winners_avx512(src, best, at) },
        // SAFETY: `Vectors::detect` chose it, so the CPU has AVX2.
        #[cfg(target_arch = "x86_64")]
        Vectors::Avx2 => unsafe { pair_winners_avx2(src, best, at) },
        _ => 0,
    };
    for m in done..n {
        let (left, right) = (src[2 * m], src[2 * m + 1]);
        let wins = right > left;
        best[m] = if wins { right } else { left };
        at[m] = 2 * m as u32 + u32::from(wins);
    }
}

/// [`pair_winners`] sixteen pairs at a time: two registers of values
/// split into their even and odd lanes by two-register permutes; returns
/// how many pairs it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn pair_winners_avx512(src: &[f32], best: &mut [f32], at: &mut [u32]) -> usize {
    use std::arch::x86_64::*;
    let n = best.len().min(at.len()).min(src.len() / 2) / 16 * 16;
    let lefts = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    let rights = _mm512_add_epi32(lefts, _mm512_set1_epi32(1));
    let (one, step) = (_mm512_set1_epi32(1), _mm512_set1_epi32(32));
    let mut index = lefts;
    for m in (0..n).step_by(16) {
        let pairs = &src[2 * m..][..32];
        // SAFETY: `pairs` holds the 32 floats read.
        let (a, b) = unsafe {
            (
                _mm512_loadu_ps(pairs.as_ptr()),
                _mm512_loadu_ps(pairs[16..].as_ptr()),
            )
        };
        let left = _mm512_permutex2var_ps(a, lefts, b);
        let right = _mm512_permutex2var_ps(a, rights, b);
        let wins = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(right, left);
        let (v, i) = (&mut best[m..][..16], &mut at[m..][..16]);
        // SAFETY: `v` and `i` hold the sixteen values written.
        unsafe {
            _mm512_storeu_ps(v.as_mut_ptr(), _mm512_mask_blend_ps(wins, left, right));
            _mm512_storeu_si512(
                i.as_mut_ptr().cast(),
                _mm512_mask_add_epi32(index, wins, index, one),
            );
        }
        index = _mm512_add_epi32(index, step);
    }
    n
}

/// [`pair_winners`] eight pairs at a time: two registers of values split
/// into their even and odd lanes by `shuffle_ps` within 128-bit halves,
/// then 64-bit chunks put in order; returns how many pairs it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn pair_winners_avx2(src: &[f32], best: &mut [f32], at: &mut [u32]) -> usize {
    use std::arch::x86_64::*;
    let n = best.len().min(at.len()).min(src.len() / 2) / 8 * 8;
    let (step, mut index) = (
        _mm256_set1_epi32(16),
        _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14),
    );
    // (a0 a2 b0 b2 | a4 a6 b4 b6) → (a0 a2 a4 a6 b0 b2 b4 b6).
    let in_order = |v: __m256| _mm256_castpd_ps(_mm256_permute4x64_pd::<0xD8>(_mm256_castps_pd(v)));
    for m in (0..n).step_by(8) {
        let pairs = &src[2 * m..][..16];
        // SAFETY: `pairs` holds the 16 floats read.
        let (a, b) = unsafe {
            (
                _mm256_loadu_ps(pairs.as_ptr()),
                _mm256_loadu_ps(pairs[8..].as_ptr()),
            )
        };
        let left = in_order(_mm256_shuffle_ps::<0x88>(a, b));
        let right = in_order(_mm256_shuffle_ps::<0xDD>(a, b));
        let wins = _mm256_cmp_ps::<_CMP_GT_OQ>(right, left);
        let (v, i) = (&mut best[m..][..8], &mut at[m..][..8]);
        // SAFETY: `v` and `i` hold the eight values written. A winning
        // lane's mask is −1, so subtracting it adds one to the index.
        unsafe {
            _mm256_storeu_ps(v.as_mut_ptr(), _mm256_blendv_ps(left, right, wins));
            _mm256_storeu_si256(
                i.as_mut_ptr().cast(),
                _mm256_sub_epi32(index, _mm256_castps_si256(wins)),
            );
        }
        index = _mm256_add_epi32(index, step);
    }
    n
}

/// A plane padded with −∞ and split into its S×S stride phases (rows and
/// columns by their remainder mod S): in a phase plane, the element at one
/// window offset of every window is one contiguous run, so each of the k·k
/// steps of the row-major window scan is a branch-free select over the
/// whole output that the compiler vectorises. (A scalar scan mispredicts
/// about every other compare.) Outputs are computed on a grid `wide`
/// columns wide, the phase planes' width, and the spare columns dropped.
struct Phases<const S: usize> {
    /// The S·S phase planes, `rows × wide` each; padded row `a·S + i` and
    /// column `b·S + j` of the input is phase `(i, j)`'s row `a`, column `b`.
    phases: Vec<f32>,
    /// One padded input row, `wide · S` long.
    row: Vec<f32>,
    wide: usize,
    rows: usize,
    /// The running maxima and their indices, `oh × wide`.
    best: Vec<f32>,
    at: Vec<u32>,
    /// Each window's first element inside the plane (where an all −∞
    /// window points, as in [`scan_window`]).
    first: Vec<u32>,
    /// `r·S·w + c·S`: a window's offset in the plane, less the padding.
    offsets: Vec<u32>,
}

impl<const S: usize> Phases<S> {
    fn new(g: &PoolGeom) -> Self {
        let padded = |o: usize, n: usize| ((o - 1) * S + g.k).max(g.pad + n).div_ceil(S);
        // A spare row: the last row's runs reach past the grid's edge.
        let (rows, wide) = (padded(g.oh, g.h) + 1, padded(g.ow, g.w));
        let grid = g.oh * wide;
        let (mut first, mut offsets) = (vec![0; grid], vec![0; grid]);
        for r in 0..g.oh {
            for c in 0..g.ow {
                first[r * wide + c] = (g.span(r, g.h).start * g.w + g.span(c, g.w).start) as u32;
                offsets[r * wide + c] = (r * S * g.w + c * S) as u32;
            }
        }
        Self {
            phases: vec![f32::NEG_INFINITY; S * S * rows * wide],
            row: vec![f32::NEG_INFINITY; S * wide],
            wide,
            rows,
            best: vec![0.0; grid],
            at: vec![0; grid],
            first,
            offsets,
        }
    }

    /// Pools each `(out, arg)` from its plane ([`pool_scan`] for planes
    /// holding NaN).
    #[inline(always)]
    fn pool<'a>(
        &mut self,
        g: &PoolGeom,
        planes: impl Iterator<Item = ((&'a mut [f32], &'a mut [u32]), &'a [f32])>,
    ) {
        for ((out, arg), plane) in planes {
            if holds_nan(plane) {
                pool_scan(g, plane, out, arg);
            } else {
                self.plane(g, plane, out, arg);
            }
        }
    }

    /// One plane without NaN.
    #[inline(always)]
    fn plane(&mut self, g: &PoolGeom, plane: &[f32], out: &mut [f32], arg: &mut [u32]) {
        let (w, wide, size) = (g.w, self.wide, self.rows * self.wide);
        // Each row goes through `row` (−∞ beyond the plane's columns) into
        // its S phases; the phase planes' padding rows keep their −∞.
        for (i, x) in plane.chunks_exact(w).enumerate() {
            self.row[g.pad..][..w].copy_from_slice(x);
            let (a, i) = ((i + g.pad) / S, (i + g.pad) % S);
            for q in 0..S {
                let dst = &mut self.phases[(i * S + q) * size + a * wide..][..wide];
                for (d, m) in dst.iter_mut().zip(self.row.chunks_exact(S)) {
                    *d = m[q];
                }
            }
        }
        let grid = g.oh * wide;
        self.best.fill(f32::NEG_INFINITY);
        self.at.copy_from_slice(&self.first);
        for di in 0..g.k {
            for dj in 0..g.k {
                let phase = ((di % S) * S + dj % S) * size;
                let run = &self.phases[phase + (di / S) * wide + dj / S..][..grid];
                // Input index of this step's element: offset + (di − pad)·w + dj − pad.
                let base = ((di * w + dj) as u32).wrapping_sub((g.pad * w + g.pad) as u32);
                let (best, at, offsets) = (
                    &mut self.best[..grid],
                    &mut self.at[..grid],
                    &self.offsets[..grid],
                );
                for e in 0..grid {
                    let v = run[e];
                    let wins = v > best[e];
                    best[e] = if wins { v } else { best[e] };
                    at[e] = if wins {
                        base.wrapping_add(offsets[e])
                    } else {
                        at[e]
                    };
                }
            }
        }
        let rows = out.chunks_exact_mut(g.ow).zip(arg.chunks_exact_mut(g.ow));
        for (r, (out, arg)) in rows.enumerate() {
            out.copy_from_slice(&self.best[r * wide..][..g.ow]);
            arg.copy_from_slice(&self.at[r * wide..][..g.ow]);
        }
    }
}

/// Whether `plane` holds a NaN, which no `>` selects: such planes take
/// [`pool_scan`] (a diverged run, not a hot path).
#[inline(always)]
fn holds_nan(plane: &[f32]) -> bool {
    // NaN's bits, sign cleared, are the only ones above +∞'s; a max over
    // integers vectorises (an `any` stops early and does not).
    let top = plane.iter().map(|v| v.to_bits() & 0x7fff_ffff).max();
    top > Some(f32::INFINITY.to_bits())
}

/// One plane, window by window in row-major order (the definition).
fn pool_scan(g: &PoolGeom, plane: &[f32], out: &mut [f32], arg: &mut [u32]) {
    for r in 0..g.oh {
        let rows = g.span(r, g.h);
        for c in 0..g.ow {
            let (best, at) = scan_window(plane, g.w, &rows, &g.span(c, g.w));
            out[r * g.ow + c] = best;
            arg[r * g.ow + c] = at as u32;
        }
    }
}

/// The winner of the window of rows `rows` and columns `cols`, in row-major
/// order: the first NaN, else the first maximum.
fn scan_window(
    plane: &[f32],
    w: usize,
    rows: &std::ops::Range<usize>,
    cols: &std::ops::Range<usize>,
) -> (f32, usize) {
    let (mut best, mut at) = (f32::NEG_INFINITY, rows.start * w + cols.start);
    for i in rows.clone() {
        for j in cols.clone() {
            let v = plane[i * w + j];
            if v.is_nan() {
                return (v, i * w + j);
            }
            if v > best {
                (best, at) = (v, i * w + j);
            }
        }
    }
    (best, at)
}

/// Routes each output gradient to its window's winner (windows that
/// overlap add up): `dx` of `[planes, h, w]`. With `relu_out` (the output
/// of [`forward`] with ReLU), burn's ReLU step first: a gradient passes
/// where that output is positive or NaN, else +0 is routed.
pub(crate) fn backward(
    g: &PoolGeom,
    dout: &[f32],
    arg: &[u32],
    relu_out: Option<&[f32]>,
) -> Vec<f32> {
    let (hw, ohw) = (g.h * g.w, g.oh * g.ow);
    let mut dx = vec![0.0f32; g.planes * hw];
    let planes = dx.chunks_exact_mut(hw).zip(dout.chunks_exact(ohw));
    for (p, ((dx, dout), arg)) in planes.zip(arg.chunks_exact(ohw)).enumerate() {
        match relu_out {
            None => {
                for (&d, &a) in dout.iter().zip(arg) {
                    dx[a as usize] += d;
                }
            }
            Some(out) => {
                for ((&d, &a), &o) in dout.iter().zip(arg).zip(&out[p * ohw..][..ohw]) {
                    dx[a as usize] += if relu_keeps(o) { d } else { 0.0 };
                }
            }
        }
    }
    dx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maxima_and_their_gradient_by_hand() {
        // One 3×4 plane (the odd last row is dropped):
        //  1 5 | 2 2
        //  3 0 | 2 7
        //  9 9   9 9
        let x = [1.0, 5.0, 2.0, 2.0, 3.0, 0.0, 2.0, 7.0, 9.0, 9.0, 9.0, 9.0];
        let g = PoolGeom::new(1, 3, 4, 2, 2, 0).unwrap();
        let (out, arg) = forward(&g, &x, false);
        assert_eq!(out, [5.0, 7.0]);
        assert_eq!(arg, [1, 7]);
        let dx = backward(&g, &[10.0, 20.0], &arg, None);
        assert_eq!(
            dx,
            [0.0, 10.0, 0.0, 0.0, 0.0, 0.0, 0.0, 20.0, 0.0, 0.0, 0.0, 0.0]
        );
    }

    #[test]
    fn ties_go_to_the_first_and_nan_wins() {
        let x = [4.0, 4.0, 4.0, 4.0, 1.0, f32::NAN, 2.0, f32::NAN];
        let g = PoolGeom::new(2, 2, 2, 2, 2, 0).unwrap();
        let (out, arg) = forward(&g, &x, false);
        assert_eq!((out[0], arg[0]), (4.0, 0));
        assert!(out[1].is_nan());
        assert_eq!(arg[1], 1);
        // Top right before bottom left: row-major order, not columns first.
        let one = PoolGeom::new(1, 2, 2, 2, 2, 0).unwrap();
        let (out, arg) = forward(&one, &[1.0, 5.0, 5.0, 0.0], false);
        assert_eq!((out, arg), (vec![5.0], vec![1]));
        let any = PoolGeom::new(2, 2, 2, 2, 1, 0).unwrap();
        let (out, arg) = forward(&any, &x, false);
        assert_eq!((out[0], arg[0]), (4.0, 0));
        assert!(out[1].is_nan());
        assert_eq!(arg[1], 1);
    }

    /// 3×3 windows, stride 2, padding 1 (FedDWA's ResNet-8) on a 4×5 plane,
    /// by hand: windows are rows {0,1}, {1,2,3} × columns {0,1}, {1,2,3},
    /// {3,4}; overlapping windows that pick the same input add gradients.
    #[test]
    fn padded_overlapping_windows_by_hand() {
        #[rustfmt::skip]
        let x = [
            0.0, 1.0, 2.0, 3.0, 4.0,
            5.0, 6.0, 7.0, 9.0, 8.0,
            1.0, 1.0, 1.0, 1.0, 1.0,
            0.0, 0.0, 0.0, 0.0, 0.0,
        ];
        let g = PoolGeom::new(1, 4, 5, 3, 2, 1).unwrap();
        assert_eq!((g.oh, g.ow), (2, 3));
        let (out, arg) = forward(&g, &x, false);
        assert_eq!(out, [6.0, 9.0, 9.0, 6.0, 9.0, 9.0]);
        assert_eq!(arg, [6, 8, 8, 6, 8, 8]);
        let dx = backward(&g, &[1.0; 6], &arg, None);
        assert_eq!(dx[6], 2.0);
        assert_eq!(dx[8], 4.0);
        assert_eq!(dx.iter().sum::<f32>(), 6.0);
    }

    #[test]
    fn planes_are_independent() {
        // The middle plane holds a NaN: it alone takes the scan.
        let mut x: Vec<f32> = (0..3 * 6 * 7).map(|v| ((v * 7) % 11) as f32).collect();
        x[42 + 15] = f32::NAN;
        let g = PoolGeom::new(3, 6, 7, 3, 2, 1).unwrap();
        let (out, arg) = forward(&g, &x, false);
        let one = PoolGeom { planes: 1, ..g };
        for p in 0..3 {
            let n = g.oh * g.ow;
            let (o, a) = forward(&one, &x[p * 42..][..42], false);
            let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&out[p * n..][..n]), bits(&o));
            assert_eq!(&arg[p * n..][..n], &a[..]);
        }
    }

    /// The definition, one window at a time in row-major order: the first
    /// NaN, else the first maximum (padding never wins).
    fn scan(g: &PoolGeom, plane: &[f32]) -> Vec<(u32, u32)> {
        let mut found = Vec::new();
        for r in 0..g.oh {
            for c in 0..g.ow {
                let mut best: Option<(f32, usize)> = None;
                'window: for i in g.span(r, g.h) {
                    for j in g.span(c, g.w) {
                        let v = plane[i * g.w + j];
                        match best {
                            _ if v.is_nan() => {
                                best = Some((v, i * g.w + j));
                                break 'window;
                            }
                            Some((b, _)) if v <= b => {}
                            _ => best = Some((v, i * g.w + j)),
                        }
                    }
                }
                let (v, at) = best.unwrap();
                found.push((v.to_bits(), at as u32));
            }
        }
        found
    }

    /// Every vector path of the pair winners this CPU runs gives the plain
    /// loop's values and indices, at lengths around the vector widths, on
    /// runs full of ties, ±0 and −∞.
    #[test]
    fn pair_winners_alike_on_every_path() {
        let values = [1.0, 2.0, 2.0, -1.0, f32::NEG_INFINITY, 0.0, -0.0];
        for n in 0..=40 {
            let src: Vec<f32> = (0..2 * n).map(|i| values[(i * 5 + i * i) % 7]).collect();
            let run = |how| {
                let (mut best, mut at) = (vec![9.0f32; n], vec![99u32; n]);
                pair_winners(how, &src, &mut best, &mut at);
                let bits: Vec<u32> = best.iter().map(|v| v.to_bits()).collect();
                (bits, at)
            };
            let want = run(Vectors::Scalar);
            for (m, &a) in want.1.iter().enumerate() {
                let (l, r) = (src[2 * m], src[2 * m + 1]);
                assert_eq!(a as usize, 2 * m + usize::from(r > l), "n {n}, pair {m}");
            }
            for &how in Vectors::runnable() {
                assert_eq!(run(how), want, "n {n}, {how:?}");
            }
        }
    }

    /// The row loop (planes without NaN) and the NaN planes' scan equal
    /// the window scan on planes full of ties, −∞ and NaN, for windows
    /// 1–4, strides 1–3 and paddings up to k/2.
    #[test]
    fn forward_is_the_window_scan() {
        let values = [1.0, 2.0, 2.0, -1.0, f32::NEG_INFINITY, f32::NAN, 0.0, -0.0];
        for (h, w) in [(5, 7), (8, 8), (3, 4), (1, 9), (12, 11)] {
            for k in 1..=4 {
                for stride in 1..=3 {
                    for pad in 0..=k / 2 {
                        let Some(g) = PoolGeom::new(1, h, w, k, stride, pad) else {
                            continue;
                        };
                        for seed in 0..6usize {
                            let plane: Vec<f32> = (0..h * w)
                                .map(|i| {
                                    let pick = (i * 7 + seed * 13 + i * i * seed) % 23;
                                    values[if seed % 2 == 0 { pick % 5 } else { pick % 8 }]
                                })
                                .collect();
                            let (out, arg) = forward(&g, &plane, false);
                            let got: Vec<(u32, u32)> =
                                out.iter().map(|v| v.to_bits()).zip(arg).collect();
                            assert_eq!(got, scan(&g, &plane), "{g:?} seed {seed}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn windows_that_do_not_fit_have_no_geometry() {
        assert_eq!(PoolGeom::new(1, 1, 4, 2, 2, 0), None);
        assert_eq!(PoolGeom::new(1, 4, 4, 2, 2, 2), None);
        assert_eq!(PoolGeom::new(1, 4, 4, 2, 0, 0), None);
        assert!(PoolGeom::new(1, 2, 2, 3, 2, 1).is_some());
    }
}
