//! 2-d convolution on `f32` slices, forward and backward: im2col into a
//! cache-sized block of images, one `gemm` per block.
//!
//! Layouts are burn's: input `[batch, c_in, h, w]`, weight `[c_out, c_in,
//! kh, kw]`, output `[batch, c_out, oh, ow]`, all row-major. The column
//! matrix of a block of images is `K × N` (K = c_in·kh·kw rows in the
//! weight's order, N = images·oh·ow), so a stride-1 row of it is a run of
//! an input row: im2col and its inverse copy runs, not elements. The input
//! gradient of a stride-1 "same" convolution (every 3×3 of the ResNets) is
//! itself such a convolution, of the output gradient with the flipped,
//! transposed weight ([`ConvGeom::transposed`]); other shapes fold `Wᵀ·dout`
//! back with col2im.
//!
//! Every block has the same size whatever the thread count, and each `gemm`
//! runs on the calling thread, so results are a function of the shapes only.

use super::{channels_last, sum_f64, winograd};
use fedweave_core::wide;
use std::mem::MaybeUninit;

/// Floats of one block's column matrix: with its `gemm` operands this stays
/// within a 1 MiB L2 cache.
const BLOCK_FLOATS: usize = 128 * 1024;

/// The shape of one convolution (no dilation, one group, the same stride and
/// padding on both axes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConvGeom {
    pub batch: usize,
    pub c_in: usize,
    pub h: usize,
    pub w: usize,
    pub c_out: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: usize,
    pub pad: usize,
    pub oh: usize,
    pub ow: usize,
}

// im2col's and col2im's loops are macros, not functions taking closures:
// a closure is one function shared by the three compilations `wide!` makes
// of its caller, too big to inline there, so it ran at the baseline target
// (im2col's copies four lanes wide, col2im's adds one lane: a fifth of a
// `cnn` step). A macro's body is compiled inside each.

/// Runs `$body` for each tap plane of the column matrix of `$images` (rows
/// `$ld` apart): `$at`, the start of the `oh·ow` entries that tap (`$i`,
/// `$j`) of a channel reads from the input plane starting at `$plane`.
/// `continue` in `$body` moves on to the next tap plane.
macro_rules! for_each_tap {
    ($g:expr, $images:expr, $ld:expr, |$at:ident, $plane:ident, $i:ident, $j:ident| $body:block) => {{
        let (g, images, ld): (&ConvGeom, std::ops::Range<usize>, usize) = ($g, $images, $ld);
        let (hw, ohw) = (g.h * g.w, g.ohw());
        for c in 0..g.c_in {
            for $i in 0..g.kh {
                for $j in 0..g.kw {
                    let row = ((c * g.kh + $i) * g.kw + $j) * ld;
                    for (bi, b) in images.clone().enumerate() {
                        let ($at, $plane) = (row + bi * ohw, (b * g.c_in + c) * hw);
                        $body
                    }
                }
            }
        }
    }};
}

/// Runs `$body` for the `$len / $n` rows `$r` of a `$width`-wide plane,
/// with `$n` (the width) a constant where it is one of the seed CNNs'
/// output widths: their rows are a few vectors long, and a constant width
/// turns each row's copy or add into straight-line vector code instead of a
/// loop with a remainder (im2col of `cnn-bn`'s second convolution is
/// 8-value rows, a tenth of its step when the width was a variable).
macro_rules! by_width {
    ($width:expr, $len:expr, |$n:ident, $r:ident| $body:block) => {{
        let (width, len): (usize, usize) = ($width, $len);
        match width {
            8 => by_width!(@rows 8, len, $n, $r, $body),
            13 => by_width!(@rows 13, len, $n, $r, $body),
            24 => by_width!(@rows 24, len, $n, $r, $body),
            30 => by_width!(@rows 30, len, $n, $r, $body),
            other => by_width!(@rows other, len, $n, $r, $body),
        }
    }};
    (@rows $w:expr, $len:expr, $n:ident, $r:ident, $body:block) => {{
        let $n: usize = $w;
        for $r in 0..$len / $n $body
    }};
}

impl ConvGeom {
    /// The geometry of `x` (`[b, c, h, w]`) under `weight` (`[o, c, kh,
    /// kw]`), or `None` when the shapes do not fit together or the output is
    /// empty.
    pub fn new(x: [usize; 4], weight: [usize; 4], stride: usize, pad: usize) -> Option<Self> {
        let [batch, c_in, h, w] = x;
        let [c_out, wc, kh, kw] = weight;
        if wc != c_in || stride == 0 || kh == 0 || kw == 0 {
            return None;
        }
        let out = |n: usize, k: usize| (n + 2 * pad).checked_sub(k).map(|d| d / stride + 1);
        let (oh, ow) = (out(h, kh)?, out(w, kw)?);
        (batch * c_in * c_out * oh * ow > 0).then_some(Self {
            batch,
            c_in,
            h,
            w,
            c_out,
            kh,
            kw,
            stride,
            pad,
            oh,
            ow,
        })
    }

    /// Rows of the column matrix: c_in·kh·kw.
    pub(super) fn k(&self) -> usize {
        self.c_in * self.kh * self.kw
    }

    /// Output positions per image.
    pub(super) fn ohw(&self) -> usize {
        self.oh * self.ow
    }

    /// Output elements: batch·c_out·oh·ow.
    pub fn out_len(&self) -> usize {
        self.batch * self.c_out * self.ohw()
    }

    /// The blocks of images, each a range of image indices.
    pub(super) fn blocks(&self) -> impl Iterator<Item = std::ops::Range<usize>> + use<> {
        let per = (BLOCK_FLOATS / (self.k() * self.ohw()).max(1)).max(1);
        let batch = self.batch;
        (0..batch)
            .step_by(per)
            .map(move |b| b..(b + per).min(batch))
    }

    /// Output columns `ow` whose input column `ow·s + j − p` lies inside
    /// `0..w`, as a range.
    fn inside(&self, j: usize) -> std::ops::Range<usize> {
        inside(j, self.w, self.ow, self.stride, self.pad)
    }

    /// Output rows `oh` whose input row `oh·s + i − p` lies inside `0..h`.
    fn inside_rows(&self, i: usize) -> std::ops::Range<usize> {
        inside(i, self.h, self.oh, self.stride, self.pad)
    }

    /// Stride 1 without padding (the seed CNNs' 5×5s, `cnn-dwa`'s 3×3s):
    /// every tap of every output reads inside the plane.
    fn valid_unit_stride(&self) -> bool {
        self.stride == 1 && self.pad == 0
    }

    /// Stride 1 with "same" padding: the output plane has the input's
    /// shape, so each column-matrix row of an image is the input plane
    /// shifted, copied in one run.
    pub(super) fn same_shape(&self) -> bool {
        self.stride == 1 && (self.oh, self.ow) == (self.h, self.w)
    }

    /// The output gradient of `images` as a `c_out × images·oh·ow` matrix
    /// into `dmat` (rows [`row_stride`] apart, returned), and its row sums
    /// added to the bias gradient `db`.
    pub(super) fn gather_dout(
        &self,
        dout: &[f32],
        images: std::ops::Range<usize>,
        dmat: &mut Vec<f32>,
        db: &mut [f32],
    ) -> usize {
        let (ohw, n) = (self.ohw(), images.len() * self.ohw());
        let ld = row_stride(n);
        dmat.resize(self.c_out * ld, 0.0);
        for (bi, b) in images.enumerate() {
            for o in 0..self.c_out {
                dmat[o * ld + bi * ohw..][..ohw]
                    .copy_from_slice(&dout[(b * self.c_out + o) * ohw..][..ohw]);
            }
        }
        for (o, d) in db.iter_mut().enumerate() {
            *d += sum_f64(&dmat[o * ld..][..n], |v| v) as f32;
        }
        ld
    }

    /// For a [`ConvGeom::same_shape`] convolution, the convolution that
    /// maps its output gradient to its input gradient, with that
    /// convolution's weight: dx = conv(dout, W′), W′[c, o, i, j] = W[o, c,
    /// k−1−i, k−1−j], at the same padding (2p = k − 1). Its column matrix
    /// has K = c_out·kh·kw rows, so the product is deep, where Wᵀ·dout is
    /// K = c_out shallow and needs col2im's scattered adds after it.
    fn transposed(&self, weight: &[f32]) -> Option<(ConvGeom, Vec<f32>)> {
        if !self.same_shape() {
            return None;
        }
        let t = ConvGeom {
            c_in: self.c_out,
            c_out: self.c_in,
            ..*self
        };
        let (kh, kw) = (self.kh, self.kw);
        let mut wt = Vec::with_capacity(weight.len());
        for c in 0..self.c_in {
            for o in 0..self.c_out {
                for i in (0..kh).rev() {
                    for j in (0..kw).rev() {
                        wt.push(weight[((o * self.c_in + c) * kh + i) * kw + j]);
                    }
                }
            }
        }
        Some((t, wt))
    }

    /// The column matrix of `images` (K × images·oh·ow) into `cols`, its
    /// rows [`row_stride`] apart; returns that stride.
    fn im2col(&self, x: &[f32], images: std::ops::Range<usize>, cols: &mut Vec<f32>) -> usize {
        im2col_wide(self, x, images, cols)
    }

    /// [`ConvGeom::im2col`] for any target.
    #[inline(always)]
    fn im2col_body(&self, x: &[f32], images: std::ops::Range<usize>, cols: &mut Vec<f32>) -> usize {
        let ld = row_stride(images.len() * self.ohw());
        cols.resize(self.k() * ld, 0.0);
        if self.same_shape() {
            self.im2col_shifted(x, images, ld, cols);
        } else {
            self.im2col_rows(x, images, ld, cols);
        }
        ld
    }

    /// [`ConvGeom::im2col`] for [`ConvGeom::same_shape`]: row (c, i, j) of
    /// image b is plane (b, c) moved by (i − p, j − p), zero where that
    /// leaves the plane. One copy of the rows that stay inside, then the
    /// entries the flat copy wrapped across a row edge are zeroed.
    #[inline(always)]
    fn im2col_shifted(
        &self,
        x: &[f32],
        images: std::ops::Range<usize>,
        ld: usize,
        cols: &mut [f32],
    ) {
        let (h, w, p) = (self.h, self.w, self.pad as isize);
        let hw = h * w;
        for c in 0..self.c_in {
            for i in 0..self.kh {
                let dr = i as isize - p;
                // Output rows whose source row is inside the plane.
                let (r_lo, r_hi) = (
                    ((-dr).max(0) as usize).min(h),
                    (h as isize - dr).min(h as isize),
                );
                let r_hi = r_hi.max(r_lo as isize) as usize;
                for j in 0..self.kw {
                    let dc = j as isize - p;
                    let row = ((c * self.kh + i) * self.kw + j) * ld;
                    // Output columns whose source column is outside.
                    let edge = if dc < 0 {
                        0..((-dc) as usize).min(w)
                    } else {
                        w.saturating_sub(dc as usize)..w
                    };
                    let off = dr * w as isize + dc;
                    for (bi, b) in images.clone().enumerate() {
                        let plane = &x[(b * self.c_in + c) * hw..][..hw];
                        let dst = &mut cols[row + bi * hw..][..hw];
                        zero_edge(&mut dst[..r_lo * w]);
                        zero_edge(&mut dst[r_hi * w..]);
                        // dst[q] = plane[q + off] where that index exists.
                        let qa = (r_lo * w).max((-off).max(0) as usize);
                        let qb = (r_hi * w).min((hw as isize - off).max(0) as usize);
                        if qa < qb {
                            let from = (qa as isize + off) as usize;
                            dst[qa..qb].copy_from_slice(&plane[from..from + (qb - qa)]);
                        }
                        for r in r_lo..r_hi {
                            zero_edge(&mut dst[r * w + edge.start..r * w + edge.end]);
                        }
                    }
                }
            }
        }
    }

    /// [`ConvGeom::im2col`] one output row at a time: the rows and columns
    /// that read the plane found once per tap, then strided copies.
    #[inline(always)]
    fn im2col_rows(&self, x: &[f32], images: std::ops::Range<usize>, ld: usize, cols: &mut [f32]) {
        let (s, p, w, ow) = (self.stride, self.pad, self.w, self.ow);
        if self.valid_unit_stride() {
            // Every tap reads whole output rows: oh rows of ow values, w apart.
            let ohw = self.ohw();
            for_each_tap!(self, images, ld, |at, plane, i, j| {
                let src = &x[plane + i * w + j..];
                by_width!(ow, ohw, |n, r| {
                    copy_run(&mut cols[at + r * n..][..n], &src[r * w..][..n]);
                });
            });
            return;
        }
        for_each_tap!(self, images, ld, |at, plane, i, j| {
            let dst = &mut cols[at..][..self.ohw()];
            let (rows, inside) = (self.inside_rows(i), self.inside(j));
            if rows.is_empty() || inside.is_empty() {
                dst.fill(0.0);
                continue;
            }
            dst[..rows.start * ow].fill(0.0);
            dst[rows.end * ow..].fill(0.0);
            let from = plane + inside.start * s + j - p;
            for r in rows {
                let d = &mut dst[r * ow..][..ow];
                zero_edge(&mut d[..inside.start]);
                zero_edge(&mut d[inside.end..]);
                let d = &mut d[inside.clone()];
                let src = &x[from + (r * s + i - p) * w..][..(d.len() - 1) * s + 1];
                match s {
                    1 => copy_run(d, src),
                    2 => {
                        for (d, pair) in d.iter_mut().zip(src.chunks(2)) {
                            *d = pair[0];
                        }
                    }
                    _ => {
                        for (d, v) in d.iter_mut().zip(src.iter().step_by(s)) {
                            *d = *v;
                        }
                    }
                }
            }
        });
    }

    /// Adds the column matrix `cols` of `images` (rows `ld` apart) back
    /// into `dx`.
    fn col2im(&self, cols: &[f32], images: std::ops::Range<usize>, ld: usize, dx: &mut [f32]) {
        col2im_wide(self, cols, images, ld, dx);
    }

    /// [`ConvGeom::col2im`] for any target.
    #[inline(always)]
    fn col2im_body(&self, cols: &[f32], images: std::ops::Range<usize>, ld: usize, dx: &mut [f32]) {
        let (s, p, w, ow) = (self.stride, self.pad, self.w, self.ow);
        if self.valid_unit_stride() {
            let ohw = self.ohw();
            for_each_tap!(self, images, ld, |at, plane, i, j| {
                let base = plane + i * w + j;
                by_width!(ow, ohw, |n, r| {
                    let d = &mut dx[base + r * w..][..n];
                    for (d, v) in d.iter_mut().zip(&cols[at + r * n..][..n]) {
                        *d += v;
                    }
                });
            });
            return;
        }
        for_each_tap!(self, images, ld, |at, plane, i, j| {
            let (rows, inside) = (self.inside_rows(i), self.inside(j));
            if inside.is_empty() {
                continue;
            }
            let from = plane + inside.start * s + j - p;
            for r in rows {
                let src = &cols[at + r * ow..][inside.clone()];
                let d = &mut dx[from + (r * s + i - p) * w..][..(src.len() - 1) * s + 1];
                for (d, v) in d.iter_mut().step_by(s).zip(src) {
                    *d += v;
                }
            }
        });
    }
}

// im2col's and col2im's loops copy and add short rows: compiled for the
// CPU's widest vectors, not the baseline's four lanes (col2im's adds were
// 4 % of a `cnn-bn` step at four lanes).
wide! {
    fn im2col_wide(g: &ConvGeom, x: &[f32], images: std::ops::Range<usize>, cols: &mut Vec<f32>) -> usize => ConvGeom::im2col_body
}

wide! {
    fn col2im_wide(g: &ConvGeom, cols: &[f32], images: std::ops::Range<usize>, ld: usize, dx: &mut [f32]) => ConvGeom::col2im_body
}

/// Outputs `o` of `0..o_n` whose input `o·s + t − p` (tap `t`) lies inside
/// `0..n`, as a range.
fn inside(t: usize, n: usize, o_n: usize, s: usize, p: usize) -> std::ops::Range<usize> {
    // o·s + t ≥ p  ⇔  o ≥ ⌈(p − t) / s⌉
    let lo = p.saturating_sub(t).div_ceil(s);
    // o·s + t − p ≤ n − 1  ⇔  o ≤ ⌊(n − 1 + p − t) / s⌋
    let hi = match (n + p).checked_sub(t + 1) {
        Some(top) => (top / s + 1).min(o_n),
        None => 0,
    };
    lo.min(hi)..hi
}

/// The distance between a column matrix's rows of `n` entries: `n` rounded
/// up to whole 64-byte lines, made an odd number of lines. `gemm` walks
/// several rows at once; rows a power-of-two number of lines apart (n =
/// 4096, 1024, …: whole images of 32×32, 16×16 planes) share an L1 set and
/// evict each other, an odd distance spreads them over every set.
pub(super) fn row_stride(n: usize) -> usize {
    let lines = n.div_ceil(16);
    (lines | 1) * 16
}

/// Zeroes a run of im2col padding: the one or two entries at the ends of a
/// row at the usual paddings written in place (`fill` calls `memset` per
/// run), longer runs filled.
#[inline(always)]
fn zero_edge(dst: &mut [f32]) {
    match dst {
        [] => {}
        [a] => *a = 0.0,
        [a, b] => (*a, *b) = (0.0, 0.0),
        _ => dst.fill(0.0),
    }
}

/// `dst = src` for the short runs of im2col (an output row): whole vectors
/// of 8 inline, where `copy_from_slice` would call `memcpy` per run.
#[inline(always)]
pub(super) fn copy_run(dst: &mut [f32], src: &[f32]) {
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (d8, s8) in (&mut d).zip(&mut s) {
        let s8: &[f32; 8] = s8.try_into().expect("a chunk of 8");
        let d8: &mut [f32; 8] = d8.try_into().expect("a chunk of 8");
        *d8 = *s8;
    }
    for (a, b) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *a = *b;
    }
}

/// `dst (m × n, rows dst_stride apart) = [dst +] lhs · rhs` for row-major
/// operands given by their (row, column) strides.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_f32(
    m: usize,
    n: usize,
    k: usize,
    (dst, dst_stride): (&mut [f32], usize),
    accumulate: bool,
    lhs: &[f32],
    lhs_strides: (usize, usize),
    rhs: &[f32],
    rhs_strides: (usize, usize),
) {
    assert!(n <= dst_stride && (m == 0 || n == 0 || (m - 1) * dst_stride + n <= dst.len()));
    // SAFETY: dst's rows are in bounds (asserted), and dst does not alias
    // the operands (it is a distinct &mut).
    unsafe {
        gemm_f32_raw(
            (m, n, k),
            (dst.as_mut_ptr(), dst_stride),
            accumulate,
            (lhs, lhs_strides),
            (rhs, rhs_strides),
        );
    }
}

/// `dst (m × n, row-major) = lhs · rhs` into slots that may be
/// uninitialised: `gemm` with `read_dst` off writes every element (zeros
/// when k = 0) and reads none (its α = 0 kernels store β·acc), so a fresh
/// output needs no zero-fill.
pub(super) fn gemm_f32_uninit(
    (m, n, k): (usize, usize, usize),
    dst: &mut [MaybeUninit<f32>],
    (lhs, lhs_strides): (&[f32], (usize, usize)),
    (rhs, rhs_strides): (&[f32], (usize, usize)),
) {
    assert_eq!(dst.len(), m * n, "a row-major m × n output");
    // SAFETY: dst holds exactly m·n slots, does not alias the operands,
    // and is written, not read.
    unsafe {
        gemm_f32_raw(
            (m, n, k),
            (dst.as_mut_ptr().cast(), n),
            false,
            (lhs, lhs_strides),
            (rhs, rhs_strides),
        );
    }
}

/// The `gemm` call behind [`gemm_f32`] and [`gemm_f32_uninit`], after
/// checking that the strides keep the operands in bounds.
///
/// # Safety
/// `dst` reaches `m` rows of `n` elements, `dst_stride` apart, that alias
/// neither operand; with `accumulate` they are initialised.
unsafe fn gemm_f32_raw(
    (m, n, k): (usize, usize, usize),
    (dst, dst_stride): (*mut f32, usize),
    accumulate: bool,
    (lhs, lhs_strides): (&[f32], (usize, usize)),
    (rhs, rhs_strides): (&[f32], (usize, usize)),
) {
    assert!(m == 0 || k == 0 || (m - 1) * lhs_strides.0 + (k - 1) * lhs_strides.1 < lhs.len());
    assert!(n == 0 || k == 0 || (k - 1) * rhs_strides.0 + (n - 1) * rhs_strides.1 < rhs.len());
    // SAFETY: the asserts keep every index the strides reach inside the
    // operands; the caller vouches for dst.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_stride as isize,
            accumulate,
            lhs.as_ptr(),
            lhs_strides.1 as isize,
            lhs_strides.0 as isize,
            rhs.as_ptr(),
            rhs_strides.1 as isize,
            rhs_strides.0 as isize,
            if accumulate { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// The `ohw`-long runs of a block's product (`channels × images·ohw`, the
/// column order of im2col, rows `ld` apart) in the memory order of
/// `[images, channels, ohw]`, with their channel: how a block's output is
/// appended.
fn image_runs(
    prod: &[f32],
    ld: usize,
    channels: usize,
    images: usize,
    ohw: usize,
) -> impl Iterator<Item = (usize, &[f32])> {
    (0..images)
        .flat_map(move |bi| (0..channels).map(move |c| (c, &prod[c * ld + bi * ohw..][..ohw])))
}

/// The forward pass: `[batch, c_out, oh, ow]`.
pub(crate) fn forward(g: &ConvGeom, x: &[f32], weight: &[f32], bias: &[f32]) -> Vec<f32> {
    if winograd::applies(g) {
        return winograd::forward(g, x, weight, bias);
    }
    if channels_last::applies(g) {
        return channels_last::forward(g, x, weight, bias);
    }
    forward_by_blocks(g, weight, bias, |images, cols| {
        (g.im2col(x, images, cols), 1)
    })
}

/// The forward pass over [`ConvGeom::blocks`]: `columns(images, cols)`
/// writes a block's column matrix (K × n, or n × K) and returns its
/// (row, column) strides as the right-hand side of `weight · cols`.
pub(super) fn forward_by_blocks(
    g: &ConvGeom,
    weight: &[f32],
    bias: &[f32],
    mut columns: impl FnMut(std::ops::Range<usize>, &mut Vec<f32>) -> (usize, usize),
) -> Vec<f32> {
    let (k, ohw) = (g.k(), g.ohw());
    // Filled in memory order (image, channel), so never zeroed first.
    let mut out = Vec::with_capacity(g.out_len());
    let (mut cols, mut prod) = (Vec::new(), Vec::new());
    for images in g.blocks() {
        let n = images.len() * ohw;
        let strides = columns(images.clone(), &mut cols);
        let ld = row_stride(n);
        prod.resize(g.c_out * ld, 0.0);
        gemm_f32(
            g.c_out,
            n,
            k,
            (&mut prod, ld),
            false,
            weight,
            (k, 1),
            &cols,
            strides,
        );
        append_with_bias(&prod, ld, images.len(), ohw, bias, &mut out);
    }
    out
}

wide! {
    /// Appends a block's product (`bias.len()` channels × `images·ohw`,
    /// rows `ld` apart) to `out` in `[images, channels, ohw]` order, each
    /// channel's bias added: at full vector width (four lanes at the
    /// baseline target were 2 % of a `cnn` step).
    fn append_with_bias(prod: &[f32], ld: usize, images: usize, ohw: usize, bias: &[f32], out: &mut Vec<f32>) => append_with_bias_body
}

/// [`append_with_bias`] for any target.
#[inline(always)]
fn append_with_bias_body(
    prod: &[f32],
    ld: usize,
    images: usize,
    ohw: usize,
    bias: &[f32],
    out: &mut Vec<f32>,
) {
    for (o, run) in image_runs(prod, ld, bias.len(), images, ohw) {
        let b = bias[o];
        out.extend(run.iter().map(|s| s + b));
    }
}

/// Gradients of one convolution.
#[derive(Debug)]
pub(crate) struct ConvGrads {
    /// With respect to the input, when asked for.
    pub x: Option<Vec<f32>>,
    /// With respect to the weight.
    pub weight: Vec<f32>,
    /// With respect to the bias.
    pub bias: Vec<f32>,
}

/// The backward pass from the output's gradient `dout`.
pub(crate) fn backward(
    g: &ConvGeom,
    x: &[f32],
    weight: &[f32],
    dout: &[f32],
    want_x: bool,
) -> ConvGrads {
    if winograd::applies(g) {
        let ohw = g.ohw();
        let mut db = vec![0.0f64; g.c_out];
        for (plane, d) in dout.chunks_exact(ohw).zip((0..g.c_out).cycle()) {
            db[d] += sum_f64(plane, |v| v);
        }
        return ConvGrads {
            x: want_x.then(|| winograd::input_grad(g, weight, dout)),
            weight: winograd::weight_grad(g, x, dout),
            bias: db.into_iter().map(|v| v as f32).collect(),
        };
    }
    if channels_last::applies(g) {
        return channels_last::backward(g, x, weight, dout, want_x);
    }
    let (k, ohw) = (g.k(), g.ohw());
    // dW, or dW transposed (K × c_out): see the product below.
    let pack_dout = g.c_out <= k;
    let mut dw = vec![0.0f32; k * g.c_out];
    let mut db = vec![0.0f32; g.c_out];
    let transposed = want_x.then(|| g.transposed(weight)).flatten();
    // col2im adds into a zeroed dx; the transposed convolution fills it in
    // memory order (blocks are ranges of images), so it starts empty.
    let mut dx = want_x.then(|| match transposed {
        Some(_) => Vec::with_capacity(x.len()),
        None => vec![0.0f32; x.len()],
    });
    let (mut cols, mut dmat, mut dcols, mut prod) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (block, images) in g.blocks().enumerate() {
        let n = images.len() * ohw;
        // dout of the block as c_out × n (the column order of `cols`).
        let ld = g.gather_dout(dout, images.clone(), &mut dmat, &mut db);
        // dW += dout · colsᵀ. Both operands run along n, and `gemm` wants
        // one of them along its output's columns: it copies that one
        // element by element into its panels. Written as dW that is `cols`
        // (K × n), as dWᵀ = cols · doutᵀ it is `dout` (c_out × n), so the
        // product is written whichever way packs fewer rows. The same dot
        // products in the same order either way, so the same bits.
        let ld_cols = g.im2col(x, images.clone(), &mut cols);
        let (lhs, rhs) = ((&dmat, ld), (&cols, ld_cols));
        let (rows, (lhs, ld_lhs), (rhs, ld_rhs)) = if pack_dout {
            (k, rhs, lhs)
        } else {
            (g.c_out, lhs, rhs)
        };
        let width = dw.len() / rows;
        gemm_f32(
            rows,
            width,
            n,
            (&mut dw, width),
            block > 0,
            lhs,
            (ld_lhs, 1),
            rhs,
            (1, ld_rhs),
        );
        if let (Some(dx), Some((tg, wt))) = (dx.as_mut(), transposed.as_ref()) {
            // dx of the block = the transposed convolution of its dout,
            // appended image by image.
            let ld_cols = tg.im2col(dout, images.clone(), &mut cols);
            let tk = tg.k();
            prod.resize(g.c_in * ld, 0.0);
            gemm_f32(
                g.c_in,
                n,
                tk,
                (&mut prod, ld),
                false,
                wt,
                (tk, 1),
                &cols,
                (ld_cols, 1),
            );
            debug_assert_eq!(dx.len(), images.start * g.c_in * ohw);
            for (_, run) in image_runs(&prod, ld, g.c_in, images.len(), ohw) {
                dx.extend_from_slice(run);
            }
        } else if let Some(dx) = dx.as_mut() {
            // dcols = Wᵀ · dout, folded back onto the input.
            dcols.resize(k * ld, 0.0);
            gemm_f32(
                k,
                n,
                g.c_out,
                (&mut dcols, ld),
                false,
                weight,
                (1, k),
                &dmat,
                (ld, 1),
            );
            g.col2im(&dcols, images, ld, dx);
        }
    }
    if pack_dout {
        let dwt = std::mem::take(&mut dw);
        dw = vec![0.0f32; dwt.len()];
        channels_last::transpose_each(&dwt, &mut dw, k, g.c_out);
    }
    ConvGrads {
        x: dx,
        weight: dw,
        bias: db,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The definition in f64, one (output, tap) pair at a time: the output
    /// and, for the output gradient `dout`, the three gradients (each term
    /// y += x·w sends dout·w to dx, dout·x to dw and dout to db).
    pub(crate) fn direct(
        g: &ConvGeom,
        x: &[f32],
        w: &[f32],
        b: &[f32],
        dout: &[f32],
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
        let mut out = vec![0.0f64; g.out_len()];
        let (mut dx, mut dw) = (vec![0.0f64; x.len()], vec![0.0f64; w.len()]);
        let mut db = vec![0.0f64; g.c_out];
        for n in 0..g.batch {
            for o in 0..g.c_out {
                for oh in 0..g.oh {
                    for ow in 0..g.ow {
                        let at = ((n * g.c_out + o) * g.oh + oh) * g.ow + ow;
                        let d = dout[at] as f64;
                        let mut s = b[o] as f64;
                        db[o] += d;
                        for c in 0..g.c_in {
                            for i in 0..g.kh {
                                for j in 0..g.kw {
                                    let (ih, iw) = (oh * g.stride + i, ow * g.stride + j);
                                    if ih < g.pad || iw < g.pad {
                                        continue;
                                    }
                                    let (ih, iw) = (ih - g.pad, iw - g.pad);
                                    if ih >= g.h || iw >= g.w {
                                        continue;
                                    }
                                    let xi = ((n * g.c_in + c) * g.h + ih) * g.w + iw;
                                    let wi = ((o * g.c_in + c) * g.kh + i) * g.kw + j;
                                    s += x[xi] as f64 * w[wi] as f64;
                                    dx[xi] += d * w[wi] as f64;
                                    dw[wi] += d * x[xi] as f64;
                                }
                            }
                        }
                        out[at] = s;
                    }
                }
            }
        }
        (out, dx, dw, db)
    }

    pub(crate) fn filled(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let v = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8;
                (v % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// Shapes with stride 1–3, padding 0–2, kernels wider than the
    /// padding and blocks of one image and of several.
    fn cases() -> Vec<ConvGeom> {
        [
            ([2, 2, 11, 10], [3, 2, 5, 5], 3, 2),
            ([2, 1, 9, 7], [3, 1, 5, 5], 1, 0),
            ([3, 2, 8, 8], [4, 2, 3, 3], 1, 1),
            ([2, 3, 9, 10], [2, 3, 3, 3], 2, 1),
            ([1, 2, 5, 6], [3, 2, 1, 1], 2, 0),
            ([2, 2, 4, 4], [2, 2, 3, 3], 1, 2),
            ([70, 3, 6, 6], [5, 3, 3, 3], 1, 1),
            ([5, 8, 20, 20], [4, 8, 5, 5], 1, 0),
            // Valid stride 1 at the widths `by_width` fixes (8, 13, 24).
            ([3, 4, 12, 12], [5, 4, 5, 5], 1, 0),
            ([2, 2, 15, 15], [3, 2, 3, 3], 1, 0),
            ([2, 1, 28, 28], [3, 1, 5, 5], 1, 0),
            // "Same" shapes, whose input gradient is a convolution.
            ([2, 3, 7, 6], [4, 3, 5, 5], 1, 2),
            ([2, 4, 5, 5], [3, 4, 1, 1], 1, 0),
            ([40, 2, 9, 9], [6, 2, 3, 3], 1, 1),
        ]
        .into_iter()
        .map(|(x, w, s, p)| ConvGeom::new(x, w, s, p).unwrap())
        .collect()
    }

    pub(crate) fn close(got: &[f32], want: &[f64], tol: f64, what: &str, g: &ConvGeom) {
        assert_eq!(got.len(), want.len(), "{what} of {g:?}");
        for (at, (a, e)) in got.iter().zip(want).enumerate() {
            assert!(
                (*a as f64 - e).abs() <= tol * (1.0 + e.abs()),
                "{what}[{at}] of {g:?}: {a} vs {e}"
            );
        }
    }

    /// `forward` and `backward` of `g` on fixed values against
    /// [`direct`], within 1e-4 relative, with and without the input gradient.
    pub(crate) fn check_against_definition(
        g: &ConvGeom,
        forward: impl Fn(&ConvGeom, &[f32], &[f32], &[f32]) -> Vec<f32>,
        backward: impl Fn(&ConvGeom, &[f32], &[f32], &[f32], bool) -> ConvGrads,
    ) {
        let x = filled(g.batch * g.c_in * g.h * g.w, 1);
        let w = filled(g.c_out * g.k(), 2);
        let b = filled(g.c_out, 3);
        let dout = filled(g.out_len(), 4);
        let (y, dx, dw, db) = direct(g, &x, &w, &b, &dout);
        close(&forward(g, &x, &w, &b), &y, 1e-4, "y", g);
        let grads = backward(g, &x, &w, &dout, true);
        close(grads.x.as_ref().unwrap(), &dx, 1e-4, "dx", g);
        close(&grads.weight, &dw, 1e-4, "dw", g);
        close(&grads.bias, &db, 1e-4, "db", g);
        assert!(backward(g, &x, &w, &dout, false).x.is_none());
    }

    #[test]
    fn forward_and_backward_match_the_definition() {
        for g in cases() {
            check_against_definition(&g, forward, backward);
        }
    }

    /// The one-copy im2col of "same" shapes equals the row-by-row one
    /// (kernels 1, 3, 5 with their same padding, and a plane narrower than
    /// the kernel's reach).
    #[test]
    fn shifted_im2col_equals_the_row_by_row_one() {
        for (x, w, p) in [
            ([2, 3, 6, 5], [2, 3, 3, 3], 1),
            ([1, 2, 7, 9], [3, 2, 5, 5], 2),
            ([2, 2, 4, 4], [1, 2, 1, 1], 0),
            ([1, 1, 2, 3], [1, 1, 5, 5], 2),
            ([1, 1, 1, 3], [1, 1, 5, 5], 2),
        ] {
            let g = ConvGeom::new(x, w, 1, p).unwrap();
            assert!(g.same_shape(), "{g:?}");
            let mut input = filled(x.iter().product(), 9);
            // Non-finite values on every plane's edges: the padding must
            // stay +0.0, never a neighbouring plane's value.
            let (h, wd) = (x[2], x[3]);
            for (k, v) in input.iter_mut().enumerate() {
                let (r, q) = ((k / wd) % h, k % wd);
                if r == 0 || q == 0 || r == h - 1 || q == wd - 1 {
                    *v = [f32::NAN, f32::INFINITY, -0.0, f32::NEG_INFINITY][k % 4];
                }
            }
            let n = g.k() * g.batch * g.ohw();
            let (mut a, mut b) = (vec![1.0f32; n], vec![2.0f32; n]);
            let ld = g.batch * g.ohw();
            g.im2col_shifted(&input, 0..g.batch, ld, &mut a);
            g.im2col_rows(&input, 0..g.batch, ld, &mut b);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{g:?}");
            // A block of images from the middle of the batch too.
            if g.batch > 1 {
                let m = g.k() * g.ohw();
                let (mut a, mut b) = (vec![1.0f32; m], vec![2.0f32; m]);
                g.im2col_shifted(&input, 1..2, g.ohw(), &mut a);
                g.im2col_rows(&input, 1..2, g.ohw(), &mut b);
                assert_eq!(bits(&a), bits(&b), "{g:?}, image 1");
            }
        }
    }

    #[test]
    fn the_blocks_cover_the_batch_once() {
        let g = ConvGeom::new([5, 8, 20, 20], [4, 8, 5, 5], 1, 0).unwrap();
        let blocks: Vec<_> = g.blocks().collect();
        assert_eq!(blocks, [0..2, 2..4, 4..5]);
    }

    #[test]
    fn shapes_that_do_not_fit_have_no_geometry() {
        assert_eq!(ConvGeom::new([1, 2, 4, 4], [3, 1, 3, 3], 1, 0), None);
        assert_eq!(ConvGeom::new([1, 1, 2, 2], [3, 1, 3, 3], 1, 0), None);
        assert_eq!(ConvGeom::new([1, 1, 4, 4], [3, 1, 3, 3], 0, 0), None);
        assert_eq!(ConvGeom::new([0, 1, 4, 4], [3, 1, 3, 3], 1, 0), None);
        let g = ConvGeom::new([1, 1, 2, 2], [3, 1, 3, 3], 2, 1).unwrap();
        assert_eq!((g.oh, g.ow), (1, 1));
    }
}
