//! Winograd's minimal filtering F(2×2, 3×3) for stride-1 3×3 convolutions
//! (every 3×3 of the ResNets and of FedDWA's CNN): each 2×2 output tile is
//! 16 products in a transformed domain instead of 36, so the forward pass,
//! the input gradient (itself such a convolution) and the weight gradient
//! each run 2.25× fewer multiply-adds than im2col's product. cuDNN and
//! oneDNN choose the same algorithm for these shapes.
//!
//! With Lavin & Gray's matrices (1-D: y = Aᵀ[(G·g) ⊙ (Bᵀ·d)], d four inputs,
//! g three taps, y two outputs):
//!
//! ```text
//! Bᵀ = [1  0 -1  0]    G = [ 1   0   0 ]    Aᵀ = [1  1  1  0]
//!      [0  1  1  0]        [1/2 1/2 1/2]         [0  1 -1 -1]
//!      [0 -1  1  0]        [1/2 -1/2 1/2]
//!      [0  1  0 -1]        [ 0   0   1 ]
//! ```
//!
//! In 2-d a tile's 4×4 input patch becomes V = Bᵀ·d·B and a filter U =
//! G·g·Gᵀ; the 16 positions ξ of the transformed tile are independent, so
//! a block of tiles is 16 products M_ξ = U_ξ (c_out × c_in) · V_ξ (c_in ×
//! tiles), and the output tile is Aᵀ·M·A. The weight gradient is that
//! forward differentiated by the taps: dW = Gᵀ·[Σ_tiles (A·dy·Aᵀ) ⊙ V]·G,
//! 16 products over the tiles, then one small transform per filter.
//!
//! Layout. A plane's patches overlap (tile (ty, tx) reads padded rows and
//! columns 2ty..2ty+4 and 2tx..2tx+4), so the padded plane is first split
//! by row and column parity into four "parity planes" of (th + 1) × tw
//! values, plus the column tw that the last tile of a row also reads (its
//! "edge", one value per sub-row): a patch is then four neighbouring values
//! (offsets 0, 1, tw, tw + 1) of each parity plane, and every transform is
//! one long, unit-stride, vectorised loop over the tiles of a piece of an
//! image. At the end of a row, offset 1 reads the next row's first column
//! instead of the edge: those tiles, one a row, are transformed again from
//! the edge afterwards. The products thus see only real tiles (a spare
//! tile a row, tried first, cost `resnet9` 6–25 % more multiply-adds: its
//! planes have 4 to 16 tiles a row), and the loops still have no break per
//! row.
//!
//! The weight gradient, and the forward on planes of at most 16 columns,
//! transform channels last instead (V_ξ as `[tiles][c_in]`): a piece's
//! padded rows are transposed to `[row][column][channel]` in 16×16
//! squares, and each tile is then sixteen loops over the channels, as
//! long on an 8×8 plane as on a 32×32 one. That layout also suits `gemm`
//! for the weight gradient, whose products sum over the tiles: it packs
//! V_ξ along the channels there, contiguous now. The values are the same
//! bits in either layout.
//!
//! Blocks are ranges of tile rows whose size depends on the shapes only,
//! and each product runs on the calling thread, so results do not depend
//! on the thread count. Rounding differs from im2col's direct sums (the
//! transforms add and halve before multiplying), by a few units in the
//! last place of the sums' magnitude.
//!
//! Which convolutions take it is chosen per layer ([`pays`]): at 16–64
//! channels each transformed value feeds too few multiply-adds to pay for
//! its transforms (all on, `resnet8` ran at ~0.6× and `cnn-dwa` at ~0.9×
//! of im2col), while `resnet9`'s 64–256-channel layers run 1.15–1.5×
//! faster (docs/results.md, sessions 26 and 28). `FEDWEAVE_WINOGRAD=1`
//! takes every convolution that fits, `0` none.

use super::conv::{ConvGeom, gemm_f32};
use fedweave_core::wide;
use std::ops::Range;
use std::sync::OnceLock;

/// Floats of one block's transformed inputs (16·channels·tiles), 1 MiB:
/// they stay in a 1–2 MiB L2 cache from the transform to the products
/// that read them (4 MiB blocks went to L3 and back; `resnet9` ran a few
/// per cent slower, session 31), and each of the 16 products still has
/// about a hundred columns or more at the ResNets' widths.
const BLOCK_FLOATS: usize = 1 << 18;

/// Which convolutions take F(2×2, 3×3), from `FEDWEAVE_WINOGRAD`.
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

/// Whether `g` can take F(2×2, 3×3): a 3×3 kernel at stride 1 whose
/// padding (at most 2) keeps every tile's patch within one zero ring of
/// the plane.
fn fits(g: &ConvGeom) -> bool {
    g.kh == 3 && g.kw == 3 && g.stride == 1 && g.pad <= 2
}

/// Whether F(2×2, 3×3) is faster than im2col for `g` (forward and
/// backward together), from single layers timed at batch 64 on a Zen 4
/// core (docs/results.md, session 28): each transformed value must feed
/// enough multiply-adds (≥ 64 channels in and out; at 32 it is a wash at
/// best) and the plane must fill its tiles (≥ 8×8 outputs; measured when
/// each tile row carried a spare tile, a third of a 4×4 plane's products
/// then; without it half of a 4×4 plane's tiles are edge tiles redone one
/// by one, not measured since). So
/// `resnet9` takes it everywhere but its stem, and the stems, `resnet8`
/// (16–64 channels, 4×4–16×16 planes) and `cnn-dwa` (32–64) stay on
/// im2col.
fn pays(g: &ConvGeom) -> bool {
    g.c_in.min(g.c_out) >= 64 && g.ohw() >= 64
}

/// Whether `g` takes F(2×2, 3×3): it [`fits`], and `FEDWEAVE_WINOGRAD`'s
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
    /// Each thread's two block buffers (transformed inputs, and products or
    /// transformed gradients), kept between calls: at a few MiB each, fresh
    /// ones cost page faults on every convolution.
    static SCRATCH: std::cell::Cell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::Cell::new((Vec::new(), Vec::new())) };
}

/// The tiles of a geometry: `th × tw` 2×2 output tiles per image, taken
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
        let (th, tw) = (g.oh.div_ceil(2), g.ow.div_ceil(2));
        let per = (budget / (16 * channels * tw).max(1)).max(1);
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

/// `G·a` for three taps (the filter transform along one axis).
#[inline]
fn g_taps(a: [f32; 3]) -> [f32; 4] {
    let half = 0.5 * (a[0] + a[2]);
    [a[0], half + 0.5 * a[1], half - 0.5 * a[1], a[2]]
}

/// `Gᵀ·z` for four transformed values (the weight gradient's way back).
#[inline]
fn gt_taps(z: [f32; 4]) -> [f32; 3] {
    let (s, d) = (0.5 * (z[1] + z[2]), 0.5 * (z[1] - z[2]));
    [z[0] + s, d, s + z[3]]
}

/// The filters in the transformed domain, `[16][c_out][c_in]`.
fn transform_weight(g: &ConvGeom, weight: &[f32]) -> Vec<f32> {
    let (o_n, c_n) = (g.c_out, g.c_in);
    let mut u = vec![0.0f32; 16 * o_n * c_n];
    for (oc, k) in weight.chunks_exact(9).enumerate() {
        // Columns first (G·g), then rows ((G·g)·Gᵀ).
        let cols: [[f32; 4]; 3] = std::array::from_fn(|j| g_taps([k[j], k[3 + j], k[6 + j]]));
        for i in 0..4 {
            let row = g_taps([cols[0][i], cols[1][i], cols[2][i]]);
            for (j, v) in row.into_iter().enumerate() {
                u[(4 * i + j) * o_n * c_n + oc] = v;
            }
        }
    }
    u
}

/// `out[n] = f(a[n], b[n])` over a run: one vectorised loop.
#[inline(always)]
fn zip2(out: &mut [f32], a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

/// `out[n] = f(a[n], b[n], c[n])` over a run.
#[inline(always)]
fn zip3(out: &mut [f32], a: &[f32], b: &[f32], c: &[f32], f: impl Fn(f32, f32, f32) -> f32) {
    for (((o, &x), &y), &z) in out.iter_mut().zip(a).zip(b).zip(c) {
        *o = f(x, y, z);
    }
}

/// Splits rows of a padded plane into parity planes of `tw` columns:
/// padded row `r` (input row `r − p`, zero outside `0..h`) to sub-row
/// `r / 2` of the planes `2·(r % 2) + column parity`, padded column `q`
/// (input column `q − p`) to column `q / 2` when that is below `tw`, to
/// sub-row `r / 2` of the same plane of `edge` (four planes of one value
/// per sub-row) when it is `tw`, and nowhere past it. Writes the same
/// positions for every plane of a geometry: the caller zeroes `s` and
/// `edge` once, for the padding.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn split_rows(
    plane: &[f32],
    (h, w, p): (usize, usize, usize),
    first: usize,
    count: usize,
    tw: usize,
    len: usize,
    s: &mut [f32],
    edge: &mut [f32],
) {
    let sub_rows = edge.len() / 4;
    // Input column 2j (padded 2j + p) goes to the plane of parity p % 2
    // at column j + ⌊p/2⌋, column 2j + 1 to the other at j + ⌈p/2⌉: as many
    // pairs as fit below tw in one pass (a vectorised deinterleave; a
    // strided walk per parity was scalar, a fifth of the transform), the
    // few columns left one by one.
    let (se, so) = (p / 2, p.div_ceil(2));
    let pairs = (w / 2).min(tw.saturating_sub(so));
    for r in 0..count {
        let Some(row) = (first + r).checked_sub(p).filter(|&ih| ih < h) else {
            continue;
        };
        let src = &plane[row * w..(row + 1) * w];
        let (rp, k) = (r % 2, r / 2);
        let base = k * tw;
        let (p0, p1) = s[2 * rp * len..][..2 * len].split_at_mut(len);
        let (even, odd) = if p % 2 == 0 { (p0, p1) } else { (p1, p0) };
        let (even, odd) = (
            &mut even[base + se..][..pairs],
            &mut odd[base + so..][..pairs],
        );
        for ((e, o), pair) in even.iter_mut().zip(odd.iter_mut()).zip(src.chunks_exact(2)) {
            (*e, *o) = (pair[0], pair[1]);
        }
        for (col, &x) in src.iter().enumerate().skip(2 * pairs) {
            let (cp, sc) = ((col + p) % 2, (col + p) / 2);
            if sc < tw {
                s[(2 * rp + cp) * len + base + sc] = x;
            } else if sc == tw {
                edge[(2 * rp + cp) * sub_rows + k] = x;
            }
        }
    }
}

/// `Bᵀ·d` of four inputs along one axis (one sub-row's or column's).
#[inline(always)]
fn bt(d0: f32, d1: f32, d2: f32, d3: f32) -> [f32; 4] {
    [d0 - d2, d1 + d2, d2 - d1, d1 - d3]
}

/// Bᵀ·d·B of the `n` tiles of a piece from its parity planes `s` (`len`
/// apart) and their edges (four planes of one value per sub-row), into
/// `v[ξ·stride..][..n]`, with `t` as scratch (8·`len`). Down the columns first, for both column
/// parities: with E and O the even and odd rows, d0..d3 = E[i], O[i],
/// E[i + tw], O[i + tw], so Bᵀ·d is four long loops; then across: d0..d3
/// = even[i], odd[i], even[i + 1], odd[i + 1] of each result, sixteen
/// long loops; then the last tile of each row again, its d2 and d3 from
/// the edges.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn input_tiles(
    (s, edge): (&[f32], &[f32]),
    len: usize,
    tw: usize,
    n: usize,
    t: &mut [f32],
    v: &mut [f32],
    stride: usize,
) {
    let m = n + 1;
    let sub_rows = edge.len() / 4;
    let plane = |k: usize, off: usize| &s[k * len + off..][..m];
    for cp in 0..2 {
        let (e, o) = (cp, 2 + cp);
        let rows = &mut t[4 * cp * len..];
        let (t0, rest) = rows.split_at_mut(len);
        let (t1, rest) = rest.split_at_mut(len);
        let (t2, t3) = rest.split_at_mut(len);
        zip2(&mut t0[..m], plane(e, 0), plane(e, tw), |a, b| a - b);
        zip2(&mut t1[..m], plane(o, 0), plane(e, tw), |a, b| a + b);
        zip2(&mut t2[..m], plane(e, tw), plane(o, 0), |a, b| a - b);
        zip2(&mut t3[..m], plane(o, 0), plane(o, tw), |a, b| a - b);
    }
    for i in 0..4 {
        let ev = &t[i * len..][..m];
        let od = &t[(4 + i) * len..][..m];
        zip2(
            &mut v[(4 * i) * stride..][..n],
            &ev[..n],
            &ev[1..],
            |a, b| a - b,
        );
        zip2(
            &mut v[(4 * i + 1) * stride..][..n],
            &od[..n],
            &ev[1..],
            |a, b| a + b,
        );
        zip2(
            &mut v[(4 * i + 2) * stride..][..n],
            &ev[1..],
            &od[..n],
            |a, b| a - b,
        );
        zip2(
            &mut v[(4 * i + 3) * stride..][..n],
            &od[..n],
            &od[1..],
            |a, b| a - b,
        );
    }
    for ty in 0..n / tw {
        let at = ty * tw + tw - 1;
        let e = |k: usize, sub: usize| edge[k * sub_rows + ty + sub];
        // The edge column down (columns 2 and 3 of the patch), then across.
        let [c2, c3] = [0, 1].map(|cp| bt(e(cp, 0), e(2 + cp, 0), e(cp, 1), e(2 + cp, 1)));
        for i in 0..4 {
            let (c0, c1) = (t[i * len + at], t[(4 + i) * len + at]);
            for (j, x) in bt(c0, c1, c2[i], c3[i]).into_iter().enumerate() {
                v[(4 * i + j) * stride + at] = x;
            }
        }
    }
}

/// The transformed inputs of a block of tile rows, `[16][c_in][tiles]`.
#[inline(always)]
fn transform_inputs_body(
    g: &ConvGeom,
    t: &Tiling,
    x: &[f32],
    block: &Range<usize>,
    v: &mut Vec<f32>,
) {
    let tiles = block.len() * t.tw;
    let stride = g.c_in * tiles;
    v.resize(16 * stride, 0.0);
    let hw = g.h * g.w;
    let (mut s, mut edge, mut scratch) = (Vec::new(), Vec::new(), Vec::new());
    for (b, tys, first) in t.pieces(block) {
        // Patches reach one sub-row past the piece's tiles, and the long
        // loops one column past its last.
        let n = tys.len() * t.tw;
        let len = n + t.tw + 1;
        let sub_rows = tys.len() + 1;
        s.clear();
        s.resize(4 * len, 0.0);
        edge.clear();
        edge.resize(4 * sub_rows, 0.0);
        scratch.resize(8 * len, 0.0);
        for c in 0..g.c_in {
            let plane = &x[(b * g.c_in + c) * hw..][..hw];
            split_rows(
                plane,
                (g.h, g.w, g.pad),
                2 * tys.start,
                2 * tys.len() + 2,
                t.tw,
                len,
                &mut s,
                &mut edge,
            );
            let out = &mut v[c * tiles + first..];
            input_tiles((&s, &edge), len, t.tw, n, &mut scratch, out, stride);
        }
    }
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
    #[cfg(target_arch = "x86_64")]
    let fast = fedweave_core::simd::has_x86_64_v4();
    #[cfg(not(target_arch = "x86_64"))]
    let fast = false;
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
                square::<16>(
                    fast,
                    |c| src(c0 + c, q0, 16),
                    &mut dst[q0 * c_n + c0..],
                    c_n,
                );
                q0 += 16;
            }
            if q0 + 8 <= g.w {
                square::<8>(fast, |c| src(c0 + c, q0, 8), &mut dst[q0 * c_n + c0..], c_n);
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

/// Sixteen channels' runs of `Q` ≤ 16 columns (`src(c)`) into `Q` runs of
/// sixteen channels, `ld` apart in `dst`. With AVX-512 (`fast`, checked
/// once by the caller) by register shuffles; otherwise through a small
/// array, where the moves stay in L1 (storing each scalar straight to its
/// strided place cost 40 % of the transform).
#[inline(always)]
fn square<'a, const Q: usize>(
    fast: bool,
    src: impl Fn(usize) -> &'a [f32],
    dst: &mut [f32],
    ld: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if fast {
        // SAFETY: `fast` is `has_x86_64_v4()`, so the CPU has AVX-512F.
        unsafe { square_avx512::<Q>(src, dst, ld) };
        return;
    }
    let mut sq = [[0.0f32; Q]; 16];
    for (c, line) in sq.iter_mut().enumerate() {
        line.copy_from_slice(&src(c)[..Q]);
    }
    let tr: [[f32; 16]; Q] = std::array::from_fn(|q| std::array::from_fn(|c| sq[c][q]));
    for (q, line) in tr.iter().enumerate() {
        dst[q * ld..][..16].copy_from_slice(line);
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

/// The transformed inputs of a block of tile rows, `[16][tiles][c_in]`:
/// per piece, its padded rows gathered channels last; per tile row, Bᵀ·d
/// down the columns (four long loops over the row's columns and
/// channels); per tile, Bᵀ·d·B across (sixteen loops over the channels,
/// 16 lanes at a time, whatever the plane's width).
#[inline(always)]
fn transform_inputs_last_body(
    g: &ConvGeom,
    t: &Tiling,
    x: &[f32],
    block: &Range<usize>,
    v: &mut Vec<f32>,
) {
    let c_n = g.c_in;
    let tiles = block.len() * t.tw;
    let stride = c_n * tiles;
    v.resize(16 * stride, 0.0);
    // Tile tx reads padded columns 2tx..2tx + 4.
    let cols = 2 * t.tw + 2;
    let row_len = cols * c_n;
    let (mut patch, mut down) = (Vec::new(), vec![0.0f32; 4 * row_len]);
    for (b, tys, first) in t.pieces(block) {
        patch.resize((2 * tys.len() + 2) * row_len, 0.0);
        gather_patch(g, x, b, 2 * tys.start, cols, &mut patch);
        for k in 0..tys.len() {
            let row = |i: usize| &patch[(2 * k + i) * row_len..][..row_len];
            let (d0, rest) = down.split_at_mut(row_len);
            let (d1, rest) = rest.split_at_mut(row_len);
            let (d2, d3) = rest.split_at_mut(row_len);
            zip2(d0, row(0), row(2), |a, b| a - b);
            zip2(d1, row(1), row(2), |a, b| a + b);
            zip2(d2, row(2), row(1), |a, b| a - b);
            zip2(d3, row(1), row(3), |a, b| a - b);
            for tx in 0..t.tw {
                let at = (first + k * t.tw + tx) * c_n;
                for i in 0..4 {
                    let col = |j: usize| &down[i * row_len + (2 * tx + j) * c_n..][..c_n];
                    let out = |j: usize| (4 * i + j) * stride + at;
                    zip2(&mut v[out(0)..][..c_n], col(0), col(2), |a, b| a - b);
                    zip2(&mut v[out(1)..][..c_n], col(1), col(2), |a, b| a + b);
                    zip2(&mut v[out(2)..][..c_n], col(2), col(1), |a, b| a - b);
                    zip2(&mut v[out(3)..][..c_n], col(1), col(3), |a, b| a - b);
                }
            }
        }
    }
}

wide! {
    /// [`transform_inputs_body`], vectorised for the CPU.
    fn transform_inputs(g: &ConvGeom, t: &Tiling, x: &[f32], block: &Range<usize>, v: &mut Vec<f32>) => transform_inputs_body
}

/// Whether the forward takes its inputs channels last. `gemm` packs
/// the products' tile side, so it wants V_ξ contiguous along the tiles
/// (the default layout) on wide planes, where the blocks have many tiles;
/// on planes of at most 8 tiles a row the channels-last transform, whose
/// loops do not shorten with the plane, costs less than the packing's
/// strided reads (single layers at batch 64, docs/results.md).
fn forward_channels_last(g: &ConvGeom) -> bool {
    g.ow <= 16
}

wide! {
    /// [`transform_inputs_last_body`], vectorised for the CPU.
    fn transform_inputs_last(g: &ConvGeom, t: &Tiling, x: &[f32], block: &Range<usize>, v: &mut Vec<f32>) => transform_inputs_last_body
}

/// The forward pass, `[batch, c_out, oh, ow]`, of a geometry that
/// [`applies`].
pub(super) fn forward(g: &ConvGeom, x: &[f32], weight: &[f32], bias: &[f32]) -> Vec<f32> {
    forward_in_blocks(g, x, weight, bias, BLOCK_FLOATS, forward_channels_last(g))
}

/// [`forward`] in blocks of `budget` floats, its inputs transformed
/// channels `last` or tile-contiguous (the same values either way).
fn forward_in_blocks(
    g: &ConvGeom,
    x: &[f32],
    weight: &[f32],
    bias: &[f32],
    budget: usize,
    last: bool,
) -> Vec<f32> {
    let t = Tiling::new(g, g.c_in.max(g.c_out), budget);
    let u = transform_weight(g, weight);
    let (c_n, o_n) = (g.c_in, g.c_out);
    let mut out = vec![0.0f32; g.out_len()];
    let (mut v, mut m) = SCRATCH.take();
    for block in t.blocks() {
        let tiles = block.len() * t.tw;
        // V_ξ as c_in × tiles, by its (row, column) strides.
        let v_strides = if last {
            transform_inputs_last(g, &t, x, &block, &mut v);
            (1, c_n)
        } else {
            transform_inputs(g, &t, x, &block, &mut v);
            (tiles, 1)
        };
        m.resize(16 * o_n * tiles, 0.0);
        for xi in 0..16 {
            gemm_f32(
                o_n,
                tiles,
                c_n,
                (&mut m[xi * o_n * tiles..][..o_n * tiles], tiles),
                false,
                &u[xi * o_n * c_n..][..o_n * c_n],
                (c_n, 1),
                &v[xi * c_n * tiles..][..c_n * tiles],
                v_strides,
            );
        }
        untransform_block(g, &t, &m, &block, bias, &mut out);
    }
    SCRATCH.set((v, m));
    out
}

/// Aᵀ·M·A of the first `len` tiles of a block's products `m` (`stride`
/// apart) into the four output parity planes `y` (`len` apart), with `t`
/// as scratch (8·`len`): down (over the rows of ξ), then across.
#[inline(always)]
fn output_tiles(m: &[f32], stride: usize, len: usize, t: &mut [f32], y: &mut [f32]) {
    let row = |xi: usize| &m[xi * stride..][..len];
    for j in 0..4 {
        let (s0, s1) = t[2 * j * len..(2 * j + 2) * len].split_at_mut(len);
        zip3(s0, row(j), row(4 + j), row(8 + j), |a, b, c| a + b + c);
        zip3(s1, row(4 + j), row(8 + j), row(12 + j), |b, c, d| b - c - d);
    }
    for r in 0..2 {
        let col = |j: usize| &t[(2 * j + r) * len..][..len];
        let (y0, y1) = y[2 * r * len..(2 * r + 2) * len].split_at_mut(len);
        zip3(y0, col(0), col(1), col(2), |a, b, c| a + b + c);
        zip3(y1, col(1), col(2), col(3), |b, c, d| b - c - d);
    }
}

/// Aᵀ·M·A of a block's products `m` (`[16][c_out][tiles]`), plus the
/// bias, into the output planes, piece by piece.
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
    let (mut y, mut scratch) = (Vec::new(), Vec::new());
    for (b, tys, first) in t.pieces(block) {
        let len = tys.len() * t.tw;
        y.resize(4 * len, 0.0);
        scratch.resize(8 * len, 0.0);
        for o in 0..o_n {
            let mo = &m[o * tiles + first..];
            output_tiles(mo, stride, len, &mut scratch, &mut y);
            // Interleave the parity planes into the output rows.
            let plane = &mut out[(b * o_n + o) * ohw..][..ohw];
            for (k, ty) in tys.clone().enumerate() {
                for r in 0..2 {
                    let oy = 2 * ty + r;
                    if oy >= g.oh {
                        break;
                    }
                    let dst = &mut plane[oy * g.ow..(oy + 1) * g.ow];
                    let even = &y[2 * r * len + k * t.tw..][..t.tw];
                    let odd = &y[(2 * r + 1) * len + k * t.tw..][..t.tw];
                    let mut pairs = dst.chunks_exact_mut(2);
                    for ((pair, e), od) in (&mut pairs).zip(even).zip(odd) {
                        pair[0] = e + bias[o];
                        pair[1] = od + bias[o];
                    }
                    if let [last] = pairs.into_remainder() {
                        *last = even[t.tw - 1] + bias[o];
                    }
                }
            }
        }
    }
}

wide! {
    /// [`untransform_block_body`], vectorised for the CPU.
    fn untransform_block(g: &ConvGeom, t: &Tiling, m: &[f32], block: &Range<usize>, bias: &[f32], out: &mut [f32]) => untransform_block_body
}

/// The input gradient of a geometry that [`applies`]: the convolution of
/// `dout` with the flipped, transposed weight at padding 2 − p, which is
/// again a stride-1 3×3 convolution whose output has the input's shape.
pub(super) fn input_grad(g: &ConvGeom, weight: &[f32], dout: &[f32]) -> Vec<f32> {
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
    forward(&t, dout, &wt, &vec![0.0; g.c_in])
}

/// A·dy·Aᵀ of the first `len` tiles from the output gradient's parity
/// planes `s` (`len` apart) into `d[ξ·stride..][..len]`, with `t` as
/// scratch (8·`len`): down, (e, e + f, e − f, −f) of the even and odd
/// rows for both column parities, then across the same way.
#[inline(always)]
fn grad_tiles(s: &[f32], len: usize, t: &mut [f32], d: &mut [f32], stride: usize) {
    let plane = |k: usize| &s[k * len..][..len];
    for cp in 0..2 {
        let (e, f) = (plane(cp), plane(2 + cp));
        let rows = &mut t[4 * cp * len..];
        let (t0, rest) = rows.split_at_mut(len);
        let (t1, rest) = rest.split_at_mut(len);
        let (t2, t3) = rest.split_at_mut(len);
        t0[..len].copy_from_slice(e);
        zip2(t1, e, f, |a, b| a + b);
        zip2(t2, e, f, |a, b| a - b);
        zip2(&mut t3[..len], e, f, |_, b| -b);
    }
    for i in 0..4 {
        let e = &t[i * len..][..len];
        let f = &t[(4 + i) * len..][..len];
        d[4 * i * stride..][..len].copy_from_slice(e);
        zip2(&mut d[(4 * i + 1) * stride..][..len], e, f, |a, b| a + b);
        zip2(&mut d[(4 * i + 2) * stride..][..len], e, f, |a, b| a - b);
        zip2(&mut d[(4 * i + 3) * stride..][..len], e, f, |_, b| -b);
    }
}

/// The transformed output gradients of a block of tile rows,
/// `[16][c_out][tiles]`; the tiles' positions past the output's edge
/// are zero.
#[inline(always)]
fn transform_grads_body(
    g: &ConvGeom,
    t: &Tiling,
    dout: &[f32],
    block: &Range<usize>,
    d: &mut Vec<f32>,
) {
    let tiles = block.len() * t.tw;
    let stride = g.c_out * tiles;
    d.resize(16 * stride, 0.0);
    let ohw = g.oh * g.ow;
    let (mut s, mut scratch) = (Vec::new(), Vec::new());
    for (b, tys, first) in t.pieces(block) {
        let len = tys.len() * t.tw;
        s.clear();
        s.resize(4 * len, 0.0);
        scratch.resize(8 * len, 0.0);
        for o in 0..g.c_out {
            let plane = &dout[(b * g.c_out + o) * ohw..][..ohw];
            // Output rows 2·ty.. of the piece, split by parity; the padded
            // plane has no offset (p = 0) and no rows past the output.
            split_rows(
                plane,
                (g.oh, g.ow, 0),
                2 * tys.start,
                2 * tys.len(),
                t.tw,
                len,
                &mut s,
                // Without padding no column reaches tw: no edge.
                &mut [],
            );
            let out = &mut d[o * tiles + first..];
            grad_tiles(&s, len, &mut scratch, out, stride);
        }
    }
}

wide! {
    /// [`transform_grads_body`], vectorised for the CPU.
    fn transform_grads(g: &ConvGeom, t: &Tiling, dout: &[f32], block: &Range<usize>, d: &mut Vec<f32>) => transform_grads_body
}

/// The weight gradient, `[c_out, c_in, 3, 3]`, of a geometry that
/// [`applies`].
pub(super) fn weight_grad(g: &ConvGeom, x: &[f32], dout: &[f32]) -> Vec<f32> {
    weight_grad_in_blocks(g, x, dout, BLOCK_FLOATS)
}

/// [`weight_grad`] in blocks of `budget` floats.
fn weight_grad_in_blocks(g: &ConvGeom, x: &[f32], dout: &[f32], budget: usize) -> Vec<f32> {
    let t = Tiling::new(g, g.c_in.max(g.c_out), budget);
    let (c_n, o_n) = (g.c_in, g.c_out);
    let mut z = vec![0.0f32; 16 * o_n * c_n];
    let (mut v, mut d) = SCRATCH.take();
    for (n, block) in t.blocks().enumerate() {
        let tiles = block.len() * t.tw;
        transform_inputs_last(g, &t, x, &block, &mut v);
        transform_grads(g, &t, dout, &block, &mut d);
        let stride = o_n * tiles;
        // Z_ξ (+)= D_ξ · V_ξᵀ, summed over the block's tiles.
        for xi in 0..16 {
            gemm_f32(
                o_n,
                c_n,
                tiles,
                (&mut z[xi * o_n * c_n..][..o_n * c_n], c_n),
                n > 0,
                &d[xi * stride..][..stride],
                (tiles, 1),
                &v[xi * c_n * tiles..][..c_n * tiles],
                (c_n, 1),
            );
        }
    }
    SCRATCH.set((v, d));
    // dW = Gᵀ·Z·G per filter.
    let plane = o_n * c_n;
    let mut dw = vec![0.0f32; 9 * plane];
    for (oc, k) in dw.chunks_exact_mut(9).enumerate() {
        let zz = |xi: usize| z[xi * plane + oc];
        let cols: [[f32; 3]; 4] = std::array::from_fn(|i| {
            gt_taps([zz(4 * i), zz(4 * i + 1), zz(4 * i + 2), zz(4 * i + 3)])
        });
        for j in 0..3 {
            let col = gt_taps([cols[0][j], cols[1][j], cols[2][j], cols[3][j]]);
            for (i, v) in col.into_iter().enumerate() {
                k[3 * i + j] = v;
            }
        }
    }
    dw
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::conv::tests::{close, direct, filled};

    /// Which layers take it by default: `resnet9`'s 3×3s past its stem,
    /// not the stems, `resnet8`'s (16–64 channels, 4×4 planes), `cnn-dwa`'s
    /// (32 channels in) or a 5×5.
    #[test]
    fn only_wide_layers_on_full_planes_pay() {
        let geom = |x, w, p| ConvGeom::new(x, w, 1, p).unwrap();
        for (c_in, c_out, hw) in [(64, 128, 32), (128, 128, 16), (128, 256, 16), (256, 256, 8)] {
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

    /// Paddings 0–2, odd and even planes (partial tiles on the bottom and
    /// right edges), one channel and several, planes narrower than a tile.
    fn cases() -> Vec<ConvGeom> {
        [
            ([2, 3, 9, 7], [4, 3, 3, 3], 0),
            ([3, 2, 8, 8], [4, 2, 3, 3], 1),
            ([2, 5, 7, 10], [3, 5, 3, 3], 1),
            ([2, 2, 4, 5], [2, 2, 3, 3], 2),
            ([1, 1, 3, 3], [2, 1, 3, 3], 0),
            ([4, 1, 1, 2], [3, 1, 3, 3], 1),
            ([5, 6, 6, 6], [7, 6, 3, 3], 1),
            // Odd widths at padding 1 (the last column's own copy).
            ([2, 3, 6, 7], [3, 3, 3, 3], 1),
            ([1, 2, 5, 1], [2, 2, 3, 3], 1),
            // Input columns in both parities' edges (w = 2·tw + 2, no
            // padding), several tile rows a piece.
            ([2, 3, 10, 10], [2, 3, 3, 3], 0),
            // Channels last: whole 16×16 and 16×8 squares of the
            // transpose and their remainders.
            ([1, 17, 5, 18], [3, 17, 3, 3], 1),
            ([2, 32, 6, 24], [4, 32, 3, 3], 1),
        ]
        .into_iter()
        .map(|(x, w, p)| ConvGeom::new(x, w, 1, p).unwrap())
        .collect()
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
                for last in [false, true] {
                    let fwd = forward_in_blocks(&g, &x, &w, &b, budget, last);
                    close(&fwd, &y, 1e-5, "y", &g);
                }
                close(
                    &weight_grad_in_blocks(&g, &x, &dout, budget),
                    &dw,
                    1e-5,
                    "dw",
                    &g,
                );
            }
            close(&input_grad(&g, &w, &dout), &dx, 1e-5, "dx", &g);
        }
    }

    /// Every tile row of the batch is in exactly one block, in order, and
    /// a block's pieces stay within images.
    #[test]
    fn squares_transpose_by_shuffles_or_scalars_alike() {
        fn check<const Q: usize>(fast: bool) {
            // Sixteen runs of Q columns, 20 apart; rows of 16 written 19
            // apart into a destination that starts filled with −1.
            let src: Vec<f32> = (0..16 * 20).map(|n| n as f32).collect();
            let ld = 19;
            let mut dst = vec![-1.0f32; (Q - 1) * ld + 16 + 3];
            square::<Q>(fast, |c| &src[c * 20..][..Q], &mut dst, ld);
            for (n, &v) in dst.iter().enumerate() {
                let (q, c) = (n / ld, n % ld);
                let want = if q < Q && c < 16 {
                    (c * 20 + q) as f32
                } else {
                    -1.0
                };
                assert_eq!(v, want, "Q = {Q}, fast = {fast}, at {n}");
            }
        }
        #[cfg(target_arch = "x86_64")]
        let paths = [false, fedweave_core::simd::has_x86_64_v4()];
        #[cfg(not(target_arch = "x86_64"))]
        let paths = [false];
        for fast in paths {
            check::<16>(fast);
            check::<8>(fast);
        }
    }

    #[test]
    fn blocks_cover_the_tile_rows_once() {
        let g = ConvGeom::new([3, 4, 9, 9], [2, 4, 3, 3], 1, 1).unwrap();
        // 5 × 5 tiles per image, 16·4·5 = 320 floats per
        // tile row.
        let t = Tiling::new(&g, 4, 800);
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
