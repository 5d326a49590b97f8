//! Winograd's minimal filtering F(4×4, 3×3) for stride-1 3×3 convolutions
//! (every 3×3 of the ResNets and of FedDWA's CNN): each 4×4 output tile is
//! 36 products in a transformed domain instead of 144, so the forward
//! pass, the input gradient (itself such a convolution) and the weight
//! gradient each run 4× fewer multiply-adds than im2col's product. oneDNN's
//! AVX-512 Winograd convolutions use the same tile, forward and backward.
//!
//! With Lavin & Gray's matrices (1-D: y = Aᵀ[(G·g) ⊙ (Bᵀ·d)], d six
//! inputs, g three taps, y four outputs; interpolation points 0, ±1, ±2, ∞):
//!
//! ```text
//! Bᵀ = [4  0 -5  0  1  0]   G = [ 1/4    0     0  ]   Aᵀ = [1 1  1 1  1 0]
//!      [0 -4 -4  1  1  0]       [-1/6  -1/6  -1/6 ]        [0 1 -1 2 -2 0]
//!      [0  4 -4 -1  1  0]       [-1/6   1/6  -1/6 ]        [0 1  1 4  4 0]
//!      [0 -2 -1  2  1  0]       [1/24  1/12  1/6  ]        [0 1 -1 8 -8 1]
//!      [0  2 -1 -2  1  0]       [1/24 -1/12  1/6  ]
//!      [0  4  0 -5  0  1]       [  0     0     1  ]
//! ```
//!
//! In 2-d a tile's 6×6 padded patch becomes V = Bᵀ·d·B and a filter U =
//! G·g·Gᵀ; the 36 positions ξ of the transformed tile are independent, so
//! a block of tiles is 36 products M_ξ = U_ξ (c_out × c_in) · V_ξ (c_in ×
//! tiles), and the output tile is Aᵀ·M·A. The weight gradient is that
//! forward differentiated by the taps: dW = Gᵀ·[Σ_tiles (A·dy·Aᵀ) ⊙ V]·G,
//! 36 products over the tiles, then one small transform per filter.
//!
//! Layout. Inputs and output gradients are transformed channels last
//! (V_ξ as `[tiles][c_in]`): a piece's padded rows are transposed to
//! `[row][column][channel]` in 16×16 squares (AVX-512 or AVX2 register
//! shuffles where the CPU has them), each of a tile row's six patch rows
//! is then one long loop down the columns, and each tile six loops of six
//! over its channels across, as long on an 8×8 plane as on a 32×32 one. The
//! products' rows are contiguous over (channel, tile), so the output
//! transform runs over groups of channels at once into sixteen phase
//! planes, which are interleaved into the output rows. The filter
//! transforms run over chunks of filters.
//!
//! Blocks are ranges of tile rows whose size depends on the shapes only,
//! and each product runs on the calling thread, so results do not depend
//! on the thread count. Rounding differs from im2col's direct sums: the
//! transforms scale by up to 8 (A) and 10 (B) before multiplying and by
//! 1/24 after, so the forward, the input gradient and the weight gradient
//! are within a few 1e-6 of each tensor's largest value (the tests bound
//! them by 1e-5 of it), not of each value: F(2×2, 3×3), used before
//! session 37, met 1e-5 of each value at 2.25× fewer multiply-adds than
//! im2col rather than 4× (docs/results.md).
//!
//! Which convolutions take it is chosen per layer ([`pays`]): at 16–32
//! channels each transformed value feeds too few multiply-adds to pay for
//! its transforms, while `resnet9`'s 64–256-channel layers run 18–21 %
//! faster than with F(2×2, 3×3) (docs/results.md, session 37).
//! `FEDWEAVE_WINOGRAD=1` takes every convolution that fits, `0` none.

use super::conv::{ConvGeom, gemm_f32};
use super::vectors::Vectors;
use fedweave_core::wide;
use std::ops::Range;
use std::sync::OnceLock;

/// Floats of one block's transformed inputs (36·channels·tiles), 4 MiB.
/// Single layers at batch 64 ran fastest with 2^19–2^20 (2^18, 1 MiB,
/// cost 10–25 % more on `resnet9`'s 8×8 and 16×16 layers: fewer tiles
/// per product, so each U_ξ was packed by `gemm` more often).
const BLOCK_FLOATS: usize = 1 << 20;

/// Which convolutions take F(4×4, 3×3), from `FEDWEAVE_WINOGRAD`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Unset or `auto`: those where it [`pays`].
    Auto,
    /// `1` or `on`: every one that [`fits`].
    On,
    /// `0` or `off`: none.
    Off,
}

/// `FEDWEAVE_WINOGRAD`'s mode (read once); an unknown value is `auto`,
/// with a warning.
fn mode() -> Mode {
    static MODE: OnceLock<Mode> = OnceLock::new();
    *MODE.get_or_init(|| {
        let var = std::env::var("FEDWEAVE_WINOGRAD").ok();
        parse_mode(var.as_deref()).unwrap_or_else(|other| {
            tracing::warn!("FEDWEAVE_WINOGRAD={other:?} is not auto, on/1 or off/0: using auto");
            Mode::Auto
        })
    })
}

/// The mode a value of `FEDWEAVE_WINOGRAD` names (`None`: unset), or the
/// value when it names none.
fn parse_mode(value: Option<&str>) -> Result<Mode, &str> {
    match value.map(str::trim) {
        None | Some("" | "auto") => Ok(Mode::Auto),
        Some("1" | "on") => Ok(Mode::On),
        Some("0" | "off") => Ok(Mode::Off),
        Some(other) => Err(other),
    }
}

/// Whether `g` can take F(4×4, 3×3): a 3×3 kernel at stride 1 whose
/// padding (at most 2) keeps every tile's patch within one zero ring of
/// the plane.
fn fits(g: &ConvGeom) -> bool {
    g.kh == 3 && g.kw == 3 && g.stride == 1 && g.pad <= 2
}

/// Whether F(4×4, 3×3) is faster than im2col for `g` (forward and
/// backward together), from single layers timed at batch 64: each
/// transformed value must feed enough multiply-adds, and the plane must
/// fill its tiles. With F(4×4, 3×3) (session 37, AVX-512 Intel): 64 → 64
/// on 8×8 −29 %, 64 → 64 on 16×16 −13 %, but 32 → 64 on `cnn-dwa`'s
/// unpadded 15×15 +34 %, 32 → 32 on 16×16 +12 %, 16 → 16 on 32×32 +37 %
/// (im2col's channels-last path is fast on those); only 32 → 64 on a
/// 32×32 plane gained (−20 %), a shape no model has. So `resnet9` takes
/// it everywhere but its stem and `resnet18` on its 64-channel 8×8
/// layers, while the stems, `resnet8` (16–32 channels on 16×16 and 8×8,
/// 64 on 4×4) and `cnn-dwa` stay on im2col.
fn pays(g: &ConvGeom) -> bool {
    g.c_in.min(g.c_out) >= 64 && g.ohw() >= 64
}

/// Whether `g` takes F(4×4, 3×3): it [`fits`], and `FEDWEAVE_WINOGRAD`'s
/// mode chooses it.
pub(super) fn applies(g: &ConvGeom) -> bool {
    fits(g)
        && match mode() {
            Mode::Auto => pays(g),
            Mode::On => true,
            Mode::Off => false,
        }
}

thread_local! {
    /// Each thread's block buffers (transformed inputs, products or
    /// transformed gradients, transformed filters), kept between calls:
    /// at a few MiB each, fresh ones cost page faults and zeroing on
    /// every convolution.
    static SCRATCH: std::cell::Cell<[Vec<f32>; 3]> =
        const { std::cell::Cell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

/// The tiles of a geometry: `th × tw` 4×4 output tiles per image, taken
/// in blocks of whole tile rows.
#[derive(Clone, Copy, Debug)]
struct Tiling {
    th: usize,
    tw: usize,
    /// Tile rows per block.
    per: usize,
    /// Tile rows in the batch: batch·th.
    rows: usize,
}

/// A block's tile rows within one image: the image, its tile rows, and
/// the index of their first tile among the block's.
type Piece = (usize, Range<usize>, usize);

impl Tiling {
    /// Blocks of at most `budget` transformed floats of `channels` planes
    /// (at least one tile row).
    fn new(g: &ConvGeom, channels: usize, budget: usize) -> Self {
        let (th, tw) = (g.oh.div_ceil(4), g.ow.div_ceil(4));
        let per = (budget / (36 * channels * tw).max(1)).max(1);
        Self {
            th,
            tw,
            per,
            rows: g.batch * th,
        }
    }

    /// Blocks as ranges of global tile rows (image · th + tile row).
    fn blocks(&self) -> impl Iterator<Item = Range<usize>> + use<> {
        let (per, rows) = (self.per, self.rows);
        (0..rows).step_by(per).map(move |r| r..(r + per).min(rows))
    }

    /// The pieces of `block`, image by image.
    fn pieces(&self, block: &Range<usize>) -> Vec<Piece> {
        let mut out = Vec::new();
        let mut r = block.start;
        while r < block.end {
            let b = r / self.th;
            let end = block.end.min((b + 1) * self.th);
            out.push((
                b,
                r - b * self.th..end - b * self.th,
                (r - block.start) * self.tw,
            ));
            r = end;
        }
        out
    }
}

/// 1/6, 1/12 and 1/24, the fractions of G.
const SIXTH: f32 = 1.0 / 6.0;
const TWELFTH: f32 = 1.0 / 12.0;
const TWENTY_FOURTH: f32 = 1.0 / 24.0;

/// Filters per chunk of the filter transforms: their taps fit in L1.
const FILTER_CHUNK: usize = 64;

/// G·a for three taps.
#[inline(always)]
fn g_of(a: [f32; 3]) -> [f32; 6] {
    let (even, e4, o2x) = (a[0] + a[2], a[0] + 4.0 * a[2], 2.0 * a[1]);
    [
        0.25 * a[0],
        -(even + a[1]) * SIXTH,
        -(even - a[1]) * SIXTH,
        (e4 + o2x) * TWENTY_FOURTH,
        (e4 - o2x) * TWENTY_FOURTH,
        a[2],
    ]
}

/// Gᵀ·z for six transformed values (the weight gradient's way back).
#[inline(always)]
fn gt_of(z: [f32; 6]) -> [f32; 3] {
    let (s12, d12) = (z[1] + z[2], z[2] - z[1]);
    let (s34, d34) = (z[3] + z[4], z[3] - z[4]);
    [
        0.25 * z[0] - s12 * SIXTH + s34 * TWENTY_FOURTH,
        d12 * SIXTH + d34 * TWELFTH,
        (s34 - s12) * SIXTH + z[5],
    ]
}

/// The filters in the transformed domain, `[36][c_out][c_in]`: chunk by
/// chunk of filters, their taps transposed to `[9][chunk]`, then G·g down
/// the columns and across, as loops over the chunk.
#[inline(always)]
fn transform_weight_body(g: &ConvGeom, weight: &[f32], u: &mut Vec<f32>) {
    let plane = g.c_out * g.c_in;
    // Every value is written below: only new capacity is zeroed.
    u.resize(36 * plane, 0.0);
    let mut taps = vec![0.0f32; 9 * FILTER_CHUNK];
    let mut cols = vec![0.0f32; 18 * FILTER_CHUNK];
    for oc0 in (0..plane).step_by(FILTER_CHUNK) {
        let n = FILTER_CHUNK.min(plane - oc0);
        for (f, k) in weight[oc0 * 9..][..n * 9].chunks_exact(9).enumerate() {
            for (t, &w) in k.iter().enumerate() {
                taps[t * FILTER_CHUNK + f] = w;
            }
        }
        let tap = |t: usize| &taps[t * FILTER_CHUNK..][..n];
        // cols[6j + i] = (G·g)[i][j].
        for j in 0..3 {
            let out = runs(&mut cols[6 * j * FILTER_CHUNK..], FILTER_CHUNK, n);
            map_runs([tap(j), tap(3 + j), tap(6 + j)], out, g_of);
        }
        for i in 0..6 {
            let col = |j: usize| &cols[(6 * j + i) * FILTER_CHUNK..][..n];
            let out = runs(&mut u[6 * i * plane + oc0..], plane, n);
            map_runs([col(0), col(1), col(2)], out, g_of);
        }
    }
}

wide! {
    /// [`transform_weight_body`], vectorised for the CPU.
    fn transform_weight(g: &ConvGeom, weight: &[f32], u: &mut Vec<f32>) => transform_weight_body
}

/// dW = Gᵀ·Z·G of the summed products `z` (`[36][c_out·c_in]`) into
/// `dw` (`[c_out][c_in][3][3]`), chunk by chunk of filters.
#[inline(always)]
fn untransform_weight_grad_body(z: &[f32], dw: &mut [f32]) {
    let plane = z.len() / 36;
    let mut rows = vec![0.0f32; 18 * FILTER_CHUNK];
    let mut taps = vec![0.0f32; 9 * FILTER_CHUNK];
    for oc0 in (0..plane).step_by(FILTER_CHUNK) {
        let n = FILTER_CHUNK.min(plane - oc0);
        // rows[3i + c] = (Z·G)[i][c].
        for i in 0..6 {
            let zs = std::array::from_fn(|j| &z[(6 * i + j) * plane + oc0..][..n]);
            let out = runs(&mut rows[3 * i * FILTER_CHUNK..], FILTER_CHUNK, n);
            map_runs(zs, out, gt_of);
        }
        // taps[3r + c] = (Gᵀ·Z·G)[r][c], as the column c of rows r.
        for c in 0..3 {
            let col = std::array::from_fn(|i| &rows[(3 * i + c) * FILTER_CHUNK..][..n]);
            let out = runs(&mut taps[c * FILTER_CHUNK..], 3 * FILTER_CHUNK, n);
            map_runs(col, out, gt_of);
        }
        for (f, k) in dw[oc0 * 9..][..n * 9].chunks_exact_mut(9).enumerate() {
            for (t, w) in k.iter_mut().enumerate() {
                *w = taps[t * FILTER_CHUNK + f];
            }
        }
    }
}

wide! {
    /// [`untransform_weight_grad_body`], vectorised for the CPU.
    fn untransform_weight_grad(z: &[f32], dw: &mut [f32]) => untransform_weight_grad_body
}

/// `K` disjoint runs of `n` floats, `stride` apart from the start of `out`.
#[inline(always)]
fn runs<const K: usize>(out: &mut [f32], stride: usize, n: usize) -> [&mut [f32]; K] {
    let mut rest = out;
    std::array::from_fn(|j| {
        let taken = std::mem::take(&mut rest);
        let (run, tail) = if j + 1 < K {
            let (head, tail) = taken.split_at_mut(stride);
            (head, tail)
        } else {
            (taken, &mut [][..])
        };
        rest = tail;
        &mut run[..n]
    })
}

/// One transform along one axis for runs of values: `out[j][n] =
/// f(inp[..][n])[j]`, one loop over the runs (the outputs' length), which
/// the compiler vectorises across n.
#[inline(always)]
fn map_runs<const I: usize, const O: usize>(
    inp: [&[f32]; I],
    out: [&mut [f32]; O],
    f: impl Fn([f32; I]) -> [f32; O],
) {
    let n = out[0].len();
    let inp = inp.map(|r| &r[..n]);
    let mut out = out.map(|r| &mut r[..n]);
    for k in 0..n {
        let y = f(std::array::from_fn(|i| inp[i][k]));
        for (o, v) in out.iter_mut().zip(y) {
            o[k] = v;
        }
    }
}

/// Bᵀ·d for six inputs.
#[inline(always)]
fn bt_of([d0, d1, d2, d3, d4, d5]: [f32; 6]) -> [f32; 6] {
    let (a, b) = (d3 + d4 - 4.0 * d2, 4.0 * d1);
    let (c, f) = (d4 - d3 - 4.0 * d2, 2.0 * (d3 - d1));
    [
        4.0 * d0 - 5.0 * d2 + d4,
        a - b,
        c + b,
        d4 - d2 + f,
        d4 - d2 - f,
        4.0 * d1 - 5.0 * d3 + d5,
    ]
}

/// A·e for four values (the output gradient's transform).
#[inline(always)]
fn a_of([e0, e1, e2, e3]: [f32; 4]) -> [f32; 6] {
    let (s02, s13) = (e0 + e2, e1 + e3);
    let (q02, q13) = (e0 + 4.0 * e2, 2.0 * e1 + 8.0 * e3);
    [e0, s02 + s13, s02 - s13, q02 + q13, q02 - q13, e3]
}

/// Aᵀ·m for six values (the output transform).
#[inline(always)]
fn at_of(m: [f32; 6]) -> [f32; 4] {
    let (p12, d12) = (m[1] + m[2], m[1] - m[2]);
    let (p34, d34) = (m[3] + m[4], m[3] - m[4]);
    [
        m[0] + p12 + p34,
        d12 + 2.0 * d34,
        p12 + 4.0 * p34,
        d12 + 8.0 * d34 + m[5],
    ]
}

/// A piece's padded rows, channels last: padded row `r` (input row
/// `first + r − p`) and padded column `q` (input column `q − p`) at
/// `patch[(r·cols + q)·c_in + c]`, zero outside the input. A transpose,
/// in squares of 16 channels by 16 (or 8) columns.
#[inline(always)]
fn gather_patch(
    g: &ConvGeom,
    x: &[f32],
    image: usize,
    first: usize,
    cols: usize,
    patch: &mut [f32],
) {
    let (c_n, hw, p) = (g.c_in, g.h * g.w, g.pad);
    let row_len = cols * c_n;
    let planes = &x[image * c_n * hw..][..c_n * hw];
    let how = Vectors::detect();
    for (r, padded) in patch.chunks_exact_mut(row_len).enumerate() {
        let Some(row) = (first + r).checked_sub(p).filter(|&ih| ih < g.h) else {
            padded.fill(0.0);
            continue;
        };
        let (left, rest) = padded.split_at_mut(p * c_n);
        let (dst, right) = rest.split_at_mut(g.w * c_n);
        left.fill(0.0);
        right.fill(0.0);
        let src = |c: usize, q0: usize, n: usize| &planes[c * hw + row * g.w + q0..][..n];
        let mut c0 = 0;
        while c0 + 16 <= c_n {
            let mut q0 = 0;
            while q0 + 16 <= g.w {
                square::<16>(how, |c| src(c0 + c, q0, 16), &mut dst[q0 * c_n + c0..], c_n);
                q0 += 16;
            }
            if q0 + 8 <= g.w {
                square::<8>(how, |c| src(c0 + c, q0, 8), &mut dst[q0 * c_n + c0..], c_n);
                q0 += 8;
            }
            for c in c0..c0 + 16 {
                for (q, &val) in src(c, q0, g.w - q0).iter().enumerate() {
                    dst[(q0 + q) * c_n + c] = val;
                }
            }
            c0 += 16;
        }
        for c in c0..c_n {
            for (q, &val) in src(c, 0, g.w).iter().enumerate() {
                dst[q * c_n + c] = val;
            }
        }
    }
}

/// Sixteen channels' runs of `Q` (8 or 16) columns (`src(c)`) into `Q`
/// runs of sixteen channels, `ld` apart in `dst`, as `how` says (checked
/// once by the caller). The scalar path keeps its moves in L1 (storing
/// each scalar straight to its strided place cost 40 % of the transform)
/// but is still scalar: on an AVX2 CPU it was about half of the
/// channels-last transform.
#[inline(always)]
fn square<'a, const Q: usize>(
    how: Vectors,
    src: impl Fn(usize) -> &'a [f32],
    dst: &mut [f32],
    ld: usize,
) {
    #[cfg(target_arch = "x86_64")]
    match how {
        // SAFETY: `detect` chose it, so the CPU has AVX-512F.
        Vectors::Avx512 => return unsafe { square_avx512::<Q>(src, dst, ld) },
        // SAFETY: `detect` chose it, so the CPU has AVX2.
        Vectors::Avx2 => return unsafe { square_avx2::<Q>(src, dst, ld) },
        Vectors::Scalar => {}
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = how;
    let mut sq = [[0.0f32; Q]; 16];
    for (c, line) in sq.iter_mut().enumerate() {
        line.copy_from_slice(&src(c)[..Q]);
    }
    let tr: [[f32; 16]; Q] = std::array::from_fn(|q| std::array::from_fn(|c| sq[c][q]));
    for (q, line) in tr.iter().enumerate() {
        dst[q * ld..][..16].copy_from_slice(line);
    }
}

/// [`square`] in 8×8 blocks of AVX registers: eight runs of eight as rows,
/// interleaved by 32-bit unpacks, then 64-bit pairs picked by
/// `shuffle_ps` (each 128-bit half of `u[j]` is then column j, or j + 4,
/// of four rows), then the halves joined across registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn square_avx2<'a, const Q: usize>(src: impl Fn(usize) -> &'a [f32], dst: &mut [f32], ld: usize) {
    use std::arch::x86_64::*;
    assert!(Q.is_multiple_of(8) && Q <= 16 && (Q == 0 || dst.len() >= (Q - 1) * ld + 16));
    for half in 0..2 {
        for q0 in (0..Q).step_by(8) {
            let mut r = [_mm256_setzero_ps(); 8];
            for (c, row) in r.iter_mut().enumerate() {
                let run = &src(8 * half + c)[q0..q0 + 8];
                // SAFETY: the run holds the eight floats read.
                *row = unsafe { _mm256_loadu_ps(run.as_ptr()) };
            }
            let mut t = [_mm256_setzero_ps(); 8];
            for n in (0..8).step_by(2) {
                t[n] = _mm256_unpacklo_ps(r[n], r[n + 1]);
                t[n + 1] = _mm256_unpackhi_ps(r[n], r[n + 1]);
            }
            let mut u = [_mm256_setzero_ps(); 8];
            for i in [0, 4] {
                u[i] = _mm256_shuffle_ps::<0x44>(t[i], t[i + 2]);
                u[i + 1] = _mm256_shuffle_ps::<0xEE>(t[i], t[i + 2]);
                u[i + 2] = _mm256_shuffle_ps::<0x44>(t[i + 1], t[i + 3]);
                u[i + 3] = _mm256_shuffle_ps::<0xEE>(t[i + 1], t[i + 3]);
            }
            for j in 0..4 {
                let low = _mm256_permute2f128_ps::<0x20>(u[j], u[4 + j]);
                let high = _mm256_permute2f128_ps::<0x31>(u[j], u[4 + j]);
                for (q, v) in [(q0 + j, low), (q0 + 4 + j, high)] {
                    // SAFETY: the assert keeps row q's sixteen floats in `dst`.
                    unsafe { _mm256_storeu_ps(dst[q * ld + 8 * half..].as_mut_ptr(), v) };
                }
            }
        }
    }
}

/// [`square`] by AVX-512 shuffles: the sixteen runs as rows of a 16×16
/// matrix (zero past `Q`), interleaved within 128-bit lanes by 32- then
/// 64-bit unpacks (each lane k of `u[4i + j]` is then column 4k + j of
/// rows 4i..4i + 4), then the lanes gathered across registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn square_avx512<'a, const Q: usize>(src: impl Fn(usize) -> &'a [f32], dst: &mut [f32], ld: usize) {
    use std::arch::x86_64::*;
    assert!(Q <= 16 && (Q == 0 || dst.len() >= (Q - 1) * ld + 16));
    let mask: __mmask16 = ((1u32 << Q) - 1) as __mmask16;
    // Plain loops, no closures: a closure would not inherit the
    // target features, and its calls might not inline.
    let mut r = [_mm512_setzero_ps(); 16];
    for (c, row) in r.iter_mut().enumerate() {
        let run = &src(c)[..Q];
        // SAFETY: the mask reads the run's Q floats only.
        *row = unsafe { _mm512_maskz_loadu_ps(mask, run.as_ptr()) };
    }
    let mut t = [_mm512_setzero_ps(); 16];
    for n in (0..16).step_by(2) {
        t[n] = _mm512_unpacklo_ps(r[n], r[n + 1]);
        t[n + 1] = _mm512_unpackhi_ps(r[n], r[n + 1]);
    }
    let mut u = [_mm512_setzero_ps(); 16];
    for i in (0..16).step_by(4) {
        let (p0, p1) = (_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 1]));
        let (p2, p3) = (_mm512_castps_pd(t[i + 2]), _mm512_castps_pd(t[i + 3]));
        u[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(p0, p2));
        u[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(p0, p2));
        u[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(p1, p3));
        u[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(p1, p3));
    }
    for j in 0..4 {
        let w0 = _mm512_shuffle_f32x4::<0x44>(u[j], u[4 + j]);
        let w1 = _mm512_shuffle_f32x4::<0xEE>(u[j], u[4 + j]);
        let w2 = _mm512_shuffle_f32x4::<0x44>(u[8 + j], u[12 + j]);
        let w3 = _mm512_shuffle_f32x4::<0xEE>(u[8 + j], u[12 + j]);
        let out = [
            _mm512_shuffle_f32x4::<0x88>(w0, w2),
            _mm512_shuffle_f32x4::<0xDD>(w0, w2),
            _mm512_shuffle_f32x4::<0x88>(w1, w3),
            _mm512_shuffle_f32x4::<0xDD>(w1, w3),
        ];
        for (k, v) in out.into_iter().enumerate() {
            let q = 4 * k + j;
            if q < Q {
                // SAFETY: the assert keeps row q's sixteen floats in `dst`.
                unsafe { _mm512_storeu_ps(dst[q * ld..].as_mut_ptr(), v) };
            }
        }
    }
}

/// A block's tiles transformed channels last, `[36][tiles][channels]`,
/// from `x` laid out as `planes` says: per piece, the planes' rows gathered
/// channels last ([`gather_patch`]); per tile row, `f` down the columns
/// of its `R` patch rows (long loops over columns × channels); per tile,
/// `f` across its `R` columns (loops over the channels). A tile's patch is
/// `R`×`R` from row and column 4·t: six for the inputs, four for the
/// output gradients.
#[inline(always)]
fn transform_tiles<const R: usize>(
    planes: &ConvGeom,
    t: &Tiling,
    x: &[f32],
    block: &Range<usize>,
    out: &mut Vec<f32>,
    f: impl Fn([f32; R]) -> [f32; 6] + Copy,
) {
    let c_n = planes.c_in;
    let tiles = block.len() * t.tw;
    let stride = c_n * tiles;
    out.resize(36 * stride, 0.0);
    let cols = 4 * t.tw + R - 4;
    let row_len = cols * c_n;
    let (mut patch, mut down) = (Vec::new(), vec![0.0f32; 6 * row_len]);
    for (b, tys, first) in t.pieces(block) {
        patch.resize((4 * tys.len() + R - 4) * row_len, 0.0);
        gather_patch(planes, x, b, 4 * tys.start, cols, &mut patch);
        for k in 0..tys.len() {
            let rows = std::array::from_fn(|i| &patch[(4 * k + i) * row_len..][..row_len]);
            map_runs(rows, runs(&mut down, row_len, row_len), f);
            for tx in 0..t.tw {
                let at = (first + k * t.tw + tx) * c_n;
                for i in 0..6 {
                    let col =
                        std::array::from_fn(|j| &down[i * row_len + (4 * tx + j) * c_n..][..c_n]);
                    map_runs(col, runs(&mut out[6 * i * stride + at..], stride, c_n), f);
                }
            }
        }
    }
}

/// The transformed inputs of a block of tile rows, `[36][tiles][c_in]`:
/// Bᵀ·d·B of each tile's padded 6×6 patch.
#[inline(always)]
fn transform_inputs_body(
    g: &ConvGeom,
    t: &Tiling,
    x: &[f32],
    block: &Range<usize>,
    v: &mut Vec<f32>,
) {
    transform_tiles::<6>(g, t, x, block, v, bt_of);
}

wide! {
    /// [`transform_inputs_body`], vectorised for the CPU.
    fn transform_inputs(g: &ConvGeom, t: &Tiling, x: &[f32], block: &Range<usize>, v: &mut Vec<f32>) => transform_inputs_body
}

/// The forward pass, `[batch, c_out, oh, ow]`, of a stride-1 3×3
/// convolution with padding at most 2.
pub(super) fn forward(g: &ConvGeom, x: &[f32], weight: &[f32], bias: &[f32]) -> Vec<f32> {
    forward_in_blocks(g, x, weight, bias, BLOCK_FLOATS)
}

/// [`forward`] in blocks of `budget` floats.
fn forward_in_blocks(
    g: &ConvGeom,
    x: &[f32],
    weight: &[f32],
    bias: &[f32],
    budget: usize,
) -> Vec<f32> {
    let t = Tiling::new(g, g.c_in.max(g.c_out), budget);
    let [mut v, mut m, mut u] = SCRATCH.take();
    transform_weight(g, weight, &mut u);
    let (c_n, o_n) = (g.c_in, g.c_out);
    let mut out = vec![0.0f32; g.out_len()];
    for block in t.blocks() {
        let tiles = block.len() * t.tw;
        transform_inputs(g, &t, x, &block, &mut v);
        m.resize(36 * o_n * tiles, 0.0);
        for xi in 0..36 {
            gemm_f32(
                o_n,
                tiles,
                c_n,
                (&mut m[xi * o_n * tiles..][..o_n * tiles], tiles),
                false,
                &u[xi * o_n * c_n..][..o_n * c_n],
                (c_n, 1),
                &v[xi * c_n * tiles..][..c_n * tiles],
                (1, c_n),
            );
        }
        untransform_block(g, &t, &m, &block, bias, &mut out);
    }
    SCRATCH.set([v, m, u]);
    out
}

/// Aᵀ·M·A of a block's products `m` (`[36][c_out][tiles]`), plus the
/// bias, into the output planes. Each product's rows are contiguous, so
/// the transforms run over groups of output channels at once, down and
/// across into sixteen phase planes (output row 4ty + r, column 4tx + c
/// of tile (ty, tx) in plane 4r + c): loops of at least [`UNTRANSFORM_RUN`]
/// floats even where an image has 4 tiles. The phase planes are then
/// interleaved into the output rows.
#[inline(always)]
fn untransform_block_body(
    g: &ConvGeom,
    t: &Tiling,
    m: &[f32],
    block: &Range<usize>,
    bias: &[f32],
    out: &mut [f32],
) {
    let o_n = g.c_out;
    let tiles = block.len() * t.tw;
    let stride = o_n * tiles;
    let ohw = g.oh * g.ow;
    let group = UNTRANSFORM_RUN.div_ceil(tiles).min(o_n);
    let pieces = t.pieces(block);
    let (mut y, mut s) = (Vec::new(), Vec::new());
    for o0 in (0..o_n).step_by(group) {
        let oc = group.min(o_n - o0);
        let len = oc * tiles;
        y.resize(16 * len, 0.0);
        s.resize(24 * len, 0.0);
        let mo = &m[o0 * tiles..];
        // Down: s[4j + r] = Σ_i Aᵀ[r][i]·M[i][j].
        for j in 0..6 {
            let rows = std::array::from_fn(|i| &mo[(6 * i + j) * stride..][..len]);
            map_runs(rows, runs(&mut s[4 * j * len..], len, len), at_of);
        }
        // Across: y[4r + c] = Σ_j s[4j + r]·A[j][c].
        for r in 0..4 {
            let cols = std::array::from_fn(|j| &s[(4 * j + r) * len..][..len]);
            map_runs(cols, runs(&mut y[4 * r * len..], len, len), at_of);
        }
        for &(b, ref tys, first) in &pieces {
            for o in o0..o0 + oc {
                let plane = &mut out[(b * o_n + o) * ohw..][..ohw];
                let at = (o - o0) * tiles + first;
                for (k, ty) in tys.clone().enumerate() {
                    for r in 0..4 {
                        let oy = 4 * ty + r;
                        if oy >= g.oh {
                            break;
                        }
                        let dst = &mut plane[oy * g.ow..(oy + 1) * g.ow];
                        let phase = |c: usize| &y[(4 * r + c) * len + at + k * t.tw..][..t.tw];
                        let (p0, p1, p2, p3) = (phase(0), phase(1), phase(2), phase(3));
                        let mut quads = dst.chunks_exact_mut(4);
                        for (tx, quad) in (&mut quads).enumerate() {
                            quad[0] = p0[tx] + bias[o];
                            quad[1] = p1[tx] + bias[o];
                            quad[2] = p2[tx] + bias[o];
                            quad[3] = p3[tx] + bias[o];
                        }
                        for (c, last) in quads.into_remainder().iter_mut().enumerate() {
                            *last = phase(c)[t.tw - 1] + bias[o];
                        }
                    }
                }
            }
        }
    }
}

/// The shortest loop of the output transform, in floats: whole 16-lane
/// vectors with little remainder.
const UNTRANSFORM_RUN: usize = 256;

wide! {
    /// [`untransform_block_body`], vectorised for the CPU.
    fn untransform_block(g: &ConvGeom, t: &Tiling, m: &[f32], block: &Range<usize>, bias: &[f32], out: &mut [f32]) => untransform_block_body
}

/// The input gradient: the convolution of `dout` with the flipped,
/// transposed weight at padding 2 − p.
pub(super) fn input_grad(g: &ConvGeom, weight: &[f32], dout: &[f32]) -> Vec<f32> {
    let (t, wt) = transposed(g, weight);
    forward(&t, dout, &wt, &vec![0.0; g.c_in])
}

/// The stride-1 3×3 convolution whose forward is `g`'s input gradient:
/// its geometry (c_out planes of oh × ow in, padding 2 − p) and weight
/// (each filter flipped, in and out channels swapped).
fn transposed(g: &ConvGeom, weight: &[f32]) -> (ConvGeom, Vec<f32>) {
    let t = ConvGeom {
        c_in: g.c_out,
        c_out: g.c_in,
        h: g.oh,
        w: g.ow,
        pad: 2 - g.pad,
        oh: g.h,
        ow: g.w,
        ..*g
    };
    let mut wt = Vec::with_capacity(weight.len());
    for c in 0..g.c_in {
        for o in 0..g.c_out {
            let k = &weight[(o * g.c_in + c) * 9..][..9];
            wt.extend(k.iter().rev());
        }
    }
    (t, wt)
}

/// The transformed output gradients of a block of tile rows,
/// `[36][tiles][c_out]`: A·dy·Aᵀ of each tile's 4×4 output gradients (zero
/// past the output's edge).
#[inline(always)]
fn transform_grads_body(
    g: &ConvGeom,
    t: &Tiling,
    dout: &[f32],
    block: &Range<usize>,
    d: &mut Vec<f32>,
) {
    // The output as a 3×3 convolution's unpadded input of c_out planes.
    let planes = ConvGeom {
        c_in: g.c_out,
        h: g.oh,
        w: g.ow,
        pad: 0,
        ..*g
    };
    transform_tiles::<4>(&planes, t, dout, block, d, a_of);
}

wide! {
    /// [`transform_grads_body`], vectorised for the CPU.
    fn transform_grads(g: &ConvGeom, t: &Tiling, dout: &[f32], block: &Range<usize>, d: &mut Vec<f32>) => transform_grads_body
}

/// The weight gradient, `[c_out, c_in, 3, 3]`.
pub(super) fn weight_grad(g: &ConvGeom, x: &[f32], dout: &[f32]) -> Vec<f32> {
    weight_grad_in_blocks(g, x, dout, BLOCK_FLOATS)
}

/// [`weight_grad`] in blocks of `budget` floats.
fn weight_grad_in_blocks(g: &ConvGeom, x: &[f32], dout: &[f32], budget: usize) -> Vec<f32> {
    let t = Tiling::new(g, g.c_in.max(g.c_out), budget);
    let (c_n, o_n) = (g.c_in, g.c_out);
    let plane = o_n * c_n;
    let mut z = vec![0.0f32; 36 * plane];
    let [mut v, mut d, u] = SCRATCH.take();
    for (n, block) in t.blocks().enumerate() {
        let tiles = block.len() * t.tw;
        transform_inputs(g, &t, x, &block, &mut v);
        transform_grads(g, &t, dout, &block, &mut d);
        // Z_ξ (+)= D_ξ · V_ξᵀ, summed over the block's tiles.
        for xi in 0..36 {
            gemm_f32(
                o_n,
                c_n,
                tiles,
                (&mut z[xi * plane..][..plane], c_n),
                n > 0,
                &d[xi * o_n * tiles..][..o_n * tiles],
                (1, o_n),
                &v[xi * c_n * tiles..][..c_n * tiles],
                (c_n, 1),
            );
        }
    }
    SCRATCH.set([v, d, u]);
    let mut dw = vec![0.0f32; 9 * plane];
    untransform_weight_grad(&z, &mut dw);
    dw
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::conv::tests::{direct, filled};

    /// Which layers take it by default: `resnet9`'s 3×3s past its stem
    /// and `resnet18`'s 64-channel 8×8 layers; not the stems, `resnet8`'s
    /// (16–32 channels, or 64 on 4×4 planes), `cnn-dwa`'s (32 channels
    /// in) or a 5×5.
    #[test]
    fn only_wide_layers_on_full_planes_pay() {
        let geom = |x, w, p| ConvGeom::new(x, w, 1, p).unwrap();
        for (c_in, c_out, hw) in [
            (64, 128, 32),
            (128, 128, 16),
            (128, 256, 16),
            (256, 256, 8),
            (64, 64, 8),
        ] {
            let g = geom([64, c_in, hw, hw], [c_out, c_in, 3, 3], 1);
            assert!(fits(&g) && pays(&g), "{g:?}");
        }
        for (c_in, c_out, hw) in [
            (3, 64, 32),
            (3, 16, 32),
            (16, 16, 16),
            (32, 32, 8),
            (64, 64, 4),
        ] {
            let g = geom([64, c_in, hw, hw], [c_out, c_in, 3, 3], 1);
            assert!(!pays(&g), "{g:?}");
        }
        assert!(!pays(&geom([64, 32, 15, 15], [64, 32, 3, 3], 0)));
        assert!(!fits(&geom([64, 64, 16, 16], [64, 64, 5, 5], 2)));
    }

    #[test]
    fn the_variable_names_a_mode_or_is_refused() {
        assert_eq!(parse_mode(None), Ok(Mode::Auto));
        assert_eq!(parse_mode(Some(" auto")), Ok(Mode::Auto));
        assert_eq!(parse_mode(Some("")), Ok(Mode::Auto));
        assert_eq!(parse_mode(Some("1")), Ok(Mode::On));
        assert_eq!(parse_mode(Some("on\n")), Ok(Mode::On));
        assert_eq!(parse_mode(Some("0")), Ok(Mode::Off));
        assert_eq!(parse_mode(Some("off")), Ok(Mode::Off));
        assert_eq!(parse_mode(Some(" yes ")), Err("yes"));
    }

    /// Paddings 0–2, planes that are not whole tiles (partial tiles on
    /// the bottom and right edges), one channel and several, planes
    /// narrower than a tile, several tile rows a piece.
    fn cases() -> Vec<ConvGeom> {
        [
            ([2, 3, 9, 7], [4, 3, 3, 3], 0),
            ([3, 2, 8, 8], [4, 2, 3, 3], 1),
            ([2, 5, 7, 10], [3, 5, 3, 3], 1),
            ([2, 2, 4, 5], [2, 2, 3, 3], 2),
            ([1, 1, 3, 3], [2, 1, 3, 3], 0),
            ([4, 1, 1, 2], [3, 1, 3, 3], 1),
            ([5, 6, 6, 6], [7, 6, 3, 3], 1),
            ([2, 3, 6, 7], [3, 3, 3, 3], 1),
            ([1, 2, 5, 1], [2, 2, 3, 3], 1),
            ([2, 3, 14, 13], [2, 3, 3, 3], 0),
            // Whole 16×16 and 16×8 squares of the transpose and their
            // remainders, in channels and columns.
            ([1, 17, 5, 18], [3, 17, 3, 3], 1),
            ([2, 32, 9, 24], [4, 32, 3, 3], 1),
        ]
        .into_iter()
        .map(|(x, w, p)| ConvGeom::new(x, w, 1, p).unwrap())
        .collect()
    }

    /// Whether `got` is within `tol` of `want` relative to the largest
    /// `|want|`: F(4×4, 3×3)'s rounding follows the transformed sums'
    /// magnitudes, not each output's (module docs).
    fn close_to_scale(got: &[f32], want: &[f64], tol: f64, what: &str, g: &ConvGeom) {
        assert_eq!(got.len(), want.len(), "{what} of {g:?}");
        let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let worst = got
            .iter()
            .zip(want)
            .map(|(&a, e)| (a as f64 - e).abs())
            .fold(0.0, f64::max);
        assert!(
            worst <= tol * scale,
            "{what} of {g:?}: off by {worst:e} at a scale of {scale:e}"
        );
    }

    /// Forward, input gradient and weight gradient against the f64
    /// definition, in one block and in blocks of one tile row (the
    /// weight gradient then sums over blocks).
    #[test]
    fn winograd_matches_the_definition_in_any_blocks() {
        for g in cases() {
            assert!(fits(&g));
            let x = filled(g.batch * g.c_in * g.h * g.w, 11);
            let w = filled(g.c_out * g.c_in * 9, 12);
            let b = filled(g.c_out, 13);
            let dout = filled(g.out_len(), 14);
            let (y, dx, dw, _) = direct(&g, &x, &w, &b, &dout);
            for budget in [BLOCK_FLOATS, 1] {
                let y_got = forward_in_blocks(&g, &x, &w, &b, budget);
                close_to_scale(&y_got, &y, 1e-5, "y", &g);
                let dw_got = weight_grad_in_blocks(&g, &x, &dout, budget);
                close_to_scale(&dw_got, &dw, 1e-5, "dw", &g);
            }
            close_to_scale(&input_grad(&g, &w, &dout), &dx, 1e-5, "dx", &g);
        }
    }

    /// The filter transforms against their matrices: G·g·Gᵀ of a filter
    /// of ones at one tap, and Gᵀ·Z·G of a Z of ones at one position,
    /// computed with the matrices in f64.
    #[test]
    fn filter_transforms_are_g_g_gt_and_back() {
        const G: [[f64; 3]; 6] = [
            [0.25, 0.0, 0.0],
            [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
            [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
            [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
            [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
            [0.0, 0.0, 1.0],
        ];
        // Two output channels and 35 inputs: 70 filters, a whole chunk and
        // a remainder.
        let g = ConvGeom::new([1, 35, 4, 4], [2, 35, 3, 3], 1, 1).unwrap();
        let plane = 70;
        for tap in 0..9 {
            let mut weight = vec![0.0f32; 9 * plane];
            for f in (0..plane).step_by(3) {
                weight[9 * f + tap] = 1.0 + f as f32;
            }
            let mut u = Vec::new();
            transform_weight(&g, &weight, &mut u);
            for f in 0..plane {
                let scale = if f % 3 == 0 { 1.0 + f as f64 } else { 0.0 };
                for xi in 0..36 {
                    let want = scale * G[xi / 6][tap / 3] * G[xi % 6][tap % 3];
                    let got = u[xi * plane + f] as f64;
                    assert!(
                        (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                        "U[{xi}] of filter {f}, tap {tap}"
                    );
                }
            }
        }
        for xi in 0..36 {
            let mut z = vec![0.0f32; 36 * plane];
            z[xi * plane..][..plane].fill(2.0);
            let mut dw = vec![0.0f32; 9 * plane];
            untransform_weight_grad(&z, &mut dw);
            for (n, &got) in dw.iter().enumerate() {
                let tap = n % 9;
                let want = 2.0 * G[xi / 6][tap / 3] * G[xi % 6][tap % 3];
                assert!((got as f64 - want).abs() <= 1e-6, "dW[{n}] from ξ = {xi}");
            }
        }
    }

    /// Every tile row of the batch is in exactly one block, in order, and
    /// a block's pieces stay within images.
    #[test]
    fn squares_transpose_by_shuffles_or_scalars_alike() {
        fn check<const Q: usize>(how: Vectors) {
            // Sixteen runs of Q columns, 20 apart; rows of 16 written 19
            // apart into a destination that starts filled with −1.
            let src: Vec<f32> = (0..16 * 20).map(|n| n as f32).collect();
            let ld = 19;
            let mut dst = vec![-1.0f32; (Q - 1) * ld + 16 + 3];
            square::<Q>(how, |c| &src[c * 20..][..Q], &mut dst, ld);
            for (n, &v) in dst.iter().enumerate() {
                let (q, c) = (n / ld, n % ld);
                let want = if q < Q && c < 16 {
                    (c * 20 + q) as f32
                } else {
                    -1.0
                };
                assert_eq!(v, want, "Q = {Q}, {how:?}, at {n}");
            }
        }
        for &how in Vectors::runnable() {
            check::<16>(how);
            check::<8>(how);
        }
    }

    #[test]
    fn blocks_cover_the_tile_rows_once() {
        let g = ConvGeom::new([3, 4, 17, 17], [2, 4, 3, 3], 1, 1).unwrap();
        // 5 × 5 tiles per image, 36·4·5 = 720 floats per tile row.
        let t = Tiling::new(&g, 4, 1800);
        assert_eq!((t.th, t.tw, t.per, t.rows), (5, 5, 2, 15));
        let blocks: Vec<_> = t.blocks().collect();
        assert_eq!(blocks.len(), 8);
        assert_eq!(blocks.iter().map(|b| b.len()).sum::<usize>(), 15);
        assert!(blocks.windows(2).all(|w| w[0].end == w[1].start));
        // A block across two images is two pieces; the second's tiles
        // follow the first's (one row of 5).
        assert_eq!(t.pieces(&blocks[2]), [(0, 4..5, 0), (1, 0..1, 5)]);
    }

    /// Zero taps transform to zeros: the output is exactly the bias.
    #[test]
    fn the_transforms_keep_a_weight_of_zeros_exact() {
        let g = ConvGeom::new([1, 2, 6, 6], [1, 2, 3, 3], 1, 1).unwrap();
        let x = filled(72, 3);
        let y = forward(&g, &x, &[0.0; 18], &[0.5]);
        assert!(y.iter().all(|&v| v == 0.5), "{y:?}");
    }
}
