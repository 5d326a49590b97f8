//! Pairwise kernels over sets of flat `f32` models at matrix-multiply speed:
//! Gram, cosine and squared-distance matrices, and the mixing product W·Θ.
//!
//! They compute what the pair-by-pair loops over [`crate::vecmath`] compute
//! (`dot`, `cosine`, `sq_dist`, `weighted_sum`), as blocked `f64` GEMMs,
//! through a [`Kernels`] handle (`env.kernels` in an algorithm):
//!
//! | pair by pair | here |
//! |---|---|
//! | pFedGraph `similarity_matrix(deltas, ranges, t)` | [`Kernels::cosine_matrix_sym`]`(deltas, &View::ranges(ranges))`, then the threshold (or pass the models with `.with_shift(θ_init)`) |
//! | FedDWA `sq_dist(g_i, m_j)` | [`Kernels::sq_dist_matrix`]`(guidance, models, &View::all())` |
//! | FedAGHN per-layer `dot`s | [`Kernels::gram`] / [`Kernels::sq_norms`] with `View::ranges(&[layer])` |
//! | SFL `sq_dist(θ_i, θ_j).sqrt()` | [`Kernels::sq_dist_matrix_sym`]`(models, &View::all())` |
//! | `mix_rows` (`weighted_sum` per distinct row) | [`Kernels::mix`]`(rows, uploads)` |
//!
//! **Where they run.** [`Kernels::cpu`] computes everything on the host as
//! described below. [`Kernels::offloaded`] hands the `O(N²·d)` products (the
//! Gram of a cosine or distance matrix, a mixing of more than
//! [`MIX_DIRECT_ROWS`] distinct rows) to an [`Offload`] device, a GPU through
//! burn in `fedweave-nn`; centring, norms where the device gave none,
//! the direct recomputation of close distances and non-finite rows stay on
//! the host, and every bound below holds with the device's own error factor.
//!
//! **Blocking.** Models stay separate `Vec<f32>`s. A task gathers at most
//! `TILE` (256) rows × `KC` (512) columns of them (optionally restricted to
//! index ranges and shifted) into an `f64` buffer and hands it to
//! single-threaded `matrixmultiply::dgemm` (or, in `f32` blocks,
//! `gemm`'s `f32` kernels); memory is O(threads·TILE·KC)
//! plus the outputs, never an `f64` copy of Θ. A Gram matrix is cut into
//! TILE×TILE output tiles (upper triangle only when symmetric; a symmetric
//! matrix of 128–256 rows is cut in two halves instead) and, when there
//! are few tiles, into a fixed number of contiguous column segments whose
//! partial tiles are added in segment order. In `f32` blocks and `gemm`'s
//! `f64`, a tile of at least 128 rows is multiplied in bands of ≥ 64 rows
//! (their accumulators stay in L2), a diagonal tile's bands skip the blocks
//! left of the diagonal (~5/8 of the tile instead of all of it), and the
//! right operand is handed over transposed (`gemm` then packs it by plain
//! copies); each entry is still the same `gemm` results added in the same
//! order, so the bits do not change (unit-tested). Mixing is cut into blocks of
//! `DC` (256) output columns, each converting its block of Θ once (16384 when
//! at most [`MIX_DIRECT_ROWS`] rows are distinct).
//!
//! **Precision.** An `f32·f32` product is exact in `f64`, so a Gram entry's
//! only error is the `f64` summation along a tree of depth at most
//! `h = 2·KC + 2·chunks + 136` (chunks = ⌈k/KC⌉, k the number of columns):
//! |Ĝ − G| ≤ γ_h·Σ|a_c·b_c| ≤ γ_h·‖a‖‖b‖ with γ_h = h·u/(1 − h·u), u = 2⁻⁵³;
//! ≈ 3.8e-13·‖a‖‖b‖ at k = 582k ([`gram_error_factor`]). A plain `f32` GEMM
//! (rounded products, `f32` sums along all k) would lose ~1e-6–1e-4
//! relative at these lengths, hopeless for small distances. What
//! [`Precision::Auto`] (the default) does from [`F32_MIN_MODELS`] models on,
//! for Gram matrices (cosines) and mixings, is `f32` GEMMs (`gemm`, ~2.4×
//! the `f64` rate) over blocks of [`F32_BLOCK`] columns or models whose
//! results are added in `f64`: every entry within [`gram_error_factor_f32`]
//! (≈ 1.5e-5)·Σ|a_c·b_c| whatever k is, which moves a cosine by at most
//! ~1.5e-5.
//! Below that size, and with [`Precision::F64`], products are exact as
//! above, so small federations (and every recorded golden) keep the exact
//! kernels. Distances always take exact products (from 64 models on with
//! `gemm`'s `f64` kernels, ~1.2× `matrixmultiply`'s here, same bound).
//! Squared distances use ‖a′‖² + ‖b′‖² − 2⟨a′,b′⟩ on rows centred at their
//! mean (a′ = a − c), which keeps the norms at the spread of the set rather
//! than the size of the models; every entry whose rounding bound
//! γ_h·(‖a′‖ + ‖b′‖)² exceeds [`SQ_DIST_REL_TOL`] (1e-9) of its value is
//! recomputed directly as Σ(a − b)², so each returned distance is within
//! 1e-9 relative of the exact one (the pair of a model and its one-epoch
//! guidance model typically takes the direct path). That path is taken for
//! pairs closer than ≈ 2% of ‖a′‖ + ‖b′‖ at k = 582k; were most pairs that
//! close (one far outlier inflating the centred norms), the kernel would
//! degrade to pair-by-pair cost, never to a worse result. Mixing accumulates in
//! `f64` and rounds once to `f32`, like `weighted_sum`; the two agree to one
//! `f32` ulp (bit-identical for at most [`MIX_DIRECT_ROWS`] distinct rows,
//! which use `weighted_sum`'s own loop); in `f32` blocks, to one ulp plus
//! [`gram_error_factor_f32`]·Σ_j|W_ij·θ_j|.
//!
//! **Determinism.** Every cut (tiles, chunks, segments, column blocks)
//! depends only on the shapes, never on the number of threads; rayon runs
//! independent tasks, each output element is reduced by one task in a fixed
//! order, and segment partials are added in index order. Results are
//! therefore bit-identical for any thread count on a given machine. (Across
//! CPUs with different SIMD support `matrixmultiply` selects another kernel,
//! so the last bits of Gram entries may differ between machines.)

use std::collections::HashMap;
use std::fmt;
use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

mod lanes;
mod offload;
use lanes::{dot4, weighted_block};
pub use offload::{DeviceGram, Offload, OffloadError, depth_error_factor};

use rayon::prelude::*;

/// Rows (of either operand) per Gram output tile, and distinct weight rows
/// per mixing GEMM.
const TILE: usize = 256;
/// Smallest symmetric Gram whose single tile is split in halves (below it
/// the smaller GEMMs cost what the halving saves).
const SPLIT_MIN: usize = 128;
/// Columns gathered per GEMM call.
const KC: usize = 512;
/// Rows of the bands a Gram tile is multiplied in (see `GemmIn`).
const SUB_ROWS: usize = 64;
/// Columns one `f32` GEMM sums over before its result is added in `f64`
/// (bounds the `f32` rounding: see [`gram_error_factor_f32`]). 256 deep,
/// `gemm` runs at ~1.4× its 64-deep rate and the `f64` adds are a quarter
/// (pFedGraph's server step at N = 500: −17 %); the bound is ~1.5e-5, still
/// tighter than the authors' code's plain `f32` sums over every model.
const F32_BLOCK: usize = 256;
/// Models from which [`Precision::Auto`] multiplies in `f32` blocks; the
/// recorded goldens (at most 20 clients) keep the `f64` products.
pub const F32_MIN_MODELS: usize = 64;
/// A Gram matrix is split into at least this many tasks when it has enough
/// columns (tiles × column segments).
const TARGET_TASKS: usize = 128;
/// Cap on the memory of the segment partials of one Gram matrix.
const MAX_PARTIAL_BYTES: usize = 1 << 30;
/// Output columns per mixing task (GEMM path / direct path).
const DC: usize = 256;
const DIRECT_DC: usize = 16384;
/// Mixing with at most this many distinct weight rows runs `weighted_sum`'s
/// loop (a GEMM would be memory-bound and pad its microkernel anyway).
pub const MIX_DIRECT_ROWS: usize = 4;
/// A mixing over at least this many models whose weights are at most
/// [`MIX_SPARSE_DENSITY`] non-zero runs `weighted_sum`'s loop on the non-zero
/// weights only (nnz·d work instead of the GEMM's p·m·d). Below it the GEMM
/// costs milliseconds either way; the recorded goldens (at most 20 clients)
/// keep the path they were recorded with.
pub const MIX_SPARSE_MIN_MODELS: usize = 64;
/// Largest share of non-zero weights for which the sparse loop beats the
/// GEMM: the loop runs at about a third of the GEMM's rate.
pub const MIX_SPARSE_DENSITY: f64 = 1.0 / 3.0;
/// Bytes of `f32` models one sparse mixing block reads (the block of every
/// model stays in a 256 KiB L2 while each output row gathers its terms).
const SPARSE_BLOCK_BYTES: usize = 256 * 1024;
/// How many rows ahead a gather of model blocks prefetches: enough to
/// cover a DRAM access while a block of 1–2 KB is copied.
const PREFETCH_ROWS_AHEAD: usize = 4;
/// Relative error bound of every entry of [`sq_dist_matrix`].
pub const SQ_DIST_REL_TOL: f64 = 1e-9;

/// Which part of each row the pairwise kernels see: the concatenation of
/// `ranges` (all of the row when `None`; overlapping ranges count twice, as
/// a sum of per-range dots would), minus `shift` (same length as the rows)
/// when given. The subtraction is done in `f64`, so `shift = θ_init` turns
/// models into exact deltas θ − θ_init without materialising them.
#[derive(Clone, Copy, Debug, Default)]
pub struct View<'a> {
    pub ranges: Option<&'a [Range<usize>]>,
    pub shift: Option<&'a [f32]>,
}

impl<'a> View<'a> {
    /// The whole rows, unshifted.
    pub fn all() -> Self {
        Self::default()
    }

    /// Only `ranges` of each row.
    pub fn ranges(ranges: &'a [Range<usize>]) -> Self {
        Self {
            ranges: Some(ranges),
            shift: None,
        }
    }

    /// The same view of the rows minus `shift`.
    pub fn with_shift(self, shift: &'a [f32]) -> Self {
        Self {
            shift: Some(shift),
            ..self
        }
    }
}

/// A dense row-major `f64` matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    rows: usize,
    cols: usize,
    data: Vec<f64>,
}

impl Matrix {
    fn zeros(rows: usize, cols: usize) -> Self {
        Self {
            rows,
            cols,
            data: vec![0.0; rows * cols],
        }
    }

    /// A `rows × cols` matrix of row-major `data` (what a device returns).
    ///
    /// # Panics
    ///
    /// When `data` does not hold `rows · cols` entries.
    pub fn from_vec(rows: usize, cols: usize, data: Vec<f64>) -> Self {
        assert_eq!(data.len(), rows * cols, "matrix data of the wrong length");
        Self { rows, cols, data }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn get(&self, i: usize, j: usize) -> f64 {
        self.data[i * self.cols + j]
    }

    pub fn row(&self, i: usize) -> &[f64] {
        &self.data[i * self.cols..(i + 1) * self.cols]
    }

    /// All entries, row-major.
    pub fn as_slice(&self) -> &[f64] {
        &self.data
    }

    /// The rows as `Vec<Vec<f64>>` (the shape the algorithms use).
    pub fn into_rows(self) -> Vec<Vec<f64>> {
        if self.cols == 0 {
            return vec![Vec::new(); self.rows];
        }
        self.data.chunks(self.cols).map(<[f64]>::to_vec).collect()
    }

    fn set(&mut self, i: usize, j: usize, v: f64) {
        self.data[i * self.cols + j] = v;
    }
}

/// The columns of a [`View`] resolved against rows of one length: logical
/// columns `0..k`, the concatenation of the view's ranges. An [`Offload`]
/// device gathers its column blocks through it.
pub struct Columns<'a> {
    /// (start in the row, length, logical offset) of each non-empty range.
    segs: Vec<(usize, usize, usize)>,
    k: usize,
    shift: Option<&'a [f32]>,
}

impl<'a> Columns<'a> {
    /// `d`: the rows' length; without rows (`None`) nothing is seen.
    fn new(ranges: Option<&[Range<usize>]>, shift: Option<&'a [f32]>, d: Option<usize>) -> Self {
        let Some(d) = d else {
            return Self {
                segs: Vec::new(),
                k: 0,
                shift,
            };
        };
        let whole = 0..d;
        let ranges = ranges.unwrap_or(std::slice::from_ref(&whole));
        let mut segs = Vec::with_capacity(ranges.len());
        let mut k = 0;
        for r in ranges {
            assert!(
                r.start <= r.end && r.end <= d,
                "range {r:?} outside rows of length {d}"
            );
            if !r.is_empty() {
                segs.push((r.start, r.len(), k));
                k += r.len();
            }
        }
        if let Some(s) = shift {
            assert_eq!(s.len(), d, "shift length differs from the rows'");
        }
        Self { segs, k, shift }
    }

    /// Number of logical columns.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The vector subtracted from every row (in `f64`), if any.
    pub fn shift(&self) -> Option<&'a [f32]> {
        self.shift
    }

    fn chunks(&self) -> usize {
        self.k.div_ceil(KC)
    }

    /// Logical columns `k0..k1` of chunk `c`.
    fn chunk(&self, c: usize) -> (usize, usize) {
        (c * KC, ((c + 1) * KC).min(self.k))
    }

    /// Calls `f(lo, take, o)` for each piece of logical columns `k0..k1`:
    /// `take` columns starting at `lo` in the row go to `o..o + take` of
    /// the block.
    fn pieces(&self, k0: usize, k1: usize, mut f: impl FnMut(usize, usize, usize)) {
        if k0 >= k1 {
            return;
        }
        let mut s = self.segs.partition_point(|seg| seg.2 <= k0) - 1;
        let (mut k, mut o) = (k0, 0);
        while k < k1 {
            let (start, len, off) = self.segs[s];
            let within = k - off;
            let take = (len - within).min(k1 - k);
            f(start + within, take, o);
            k += take;
            o += take;
            s += 1;
        }
    }

    /// out[..k1 − k0] ← x on logical columns k0..k1, unshifted and in
    /// `f32` (what a device uploads; apply it to the shift as to a row).
    pub fn gather_f32(&self, x: &[f32], k0: usize, k1: usize, out: &mut [f32]) {
        self.pieces(k0, k1, |lo, take, o| {
            out[o..o + take].copy_from_slice(&x[lo..lo + take]);
        });
    }

    /// out[..k1 − k0] ← x − shift on logical columns k0..k1, subtracted in
    /// f64 and rounded once to `T` (exact for `f64`).
    fn gather<T: Elem>(&self, x: &[f32], k0: usize, k1: usize, out: &mut [T]) {
        self.pieces(k0, k1, |lo, take, o| {
            let src = &x[lo..lo + take];
            let dst = &mut out[o..o + take];
            match self.shift {
                None => T::convert(dst, src),
                Some(sh) => T::centre(dst, src, &sh[lo..lo + take]),
            }
        });
    }

    /// [`Columns::gather`] of each of `rows` into consecutive runs of
    /// `k1 − k0` elements of `buf`.
    fn gather_rows<R: AsRef<[f32]>, T: Elem>(
        &self,
        rows: &[R],
        k0: usize,
        k1: usize,
        buf: &mut [T],
    ) {
        for (row, out) in rows.iter().zip(buf.chunks_exact_mut(k1 - k0)) {
            self.gather(row.as_ref(), k0, k1, out);
        }
    }

    /// Σ over chunks (in order) of `f(chunk)`: the blocked reduction of the
    /// norms (and, column block by column block, of `direct_sq_dists`), so
    /// their depth stays ≤ h.
    fn blocked_sum(&self, mut f: impl FnMut(usize, usize) -> f64) -> f64 {
        let mut total = 0.0;
        for c in 0..self.chunks() {
            let (k0, k1) = self.chunk(c);
            total += f(k0, k1);
        }
        total
    }
}

/// Bound factor of the Gram kernels in [`Precision::Auto`]'s `f32` blocks
/// on `k` columns: |Ĝ − G| ≤ factor·Σ|a_c·b_c|. Each input is rounded once
/// to `f32` (a shifted one after its `f64` subtraction: 2u₃₂ per product),
/// a block of [`F32_BLOCK`] products is summed in `f32` (γ₃₂ of depth
/// `F32_BLOCK` + 1, with or without fused multiply-adds), and the blocks in
/// `f64` ([`gram_error_factor`]): ≈ 1.5e-5 at any `k`.
pub fn gram_error_factor_f32(k: usize) -> f64 {
    f32_depth_factor(F32_BLOCK) + gram_error_factor(k)
}

/// The `f32` part of the bound for blocks of `depth` products: γ₃₂ of
/// depth + 3 (the inputs' two roundings and the block's sum).
fn f32_depth_factor(depth: usize) -> f64 {
    let h = (depth + 3) as f64;
    let u = f64::from(f32::EPSILON) / 2.0;
    h * u / (1.0 - h * u)
}

/// How the host multiplies models in [`Kernels`]' Gram and mixing
/// products. Distances always take exact `f64` products (their error bound
/// needs them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Exact `f32·f32` products summed in `f64` everywhere: every entry
    /// within [`gram_error_factor`] (~1e-13) of the exact value.
    F64,
    /// `f64` below [`F32_MIN_MODELS`] models; from there, Gram and mixing
    /// products in `f32` blocks of [`F32_BLOCK`] columns (or models) whose
    /// results are added in `f64`, at ~2.4× the `f64` GEMM rate: within
    /// [`gram_error_factor_f32`] (~1.5e-5 relative to Σ|a_c·b_c|), which
    /// moves a cosine by at most ~1.5e-5 and a mixed parameter by at most
    /// ~1.5e-5 of Σ_j|W_ij·θ_j| (typically a few `f32` ulps).
    #[default]
    Auto,
}

/// Bound factor γ_h of the Gram kernels on `k` columns: every Gram entry
/// satisfies |Ĝ − G| ≤ γ_h·Σ|a_c·b_c| ≤ γ_h·‖a‖‖b‖ (norms from [`sq_norms`]
/// obey the same bound), assuming as `matrixmultiply` does that one GEMM
/// call of depth `kc` sums along a tree of depth at most 2·kc.
pub fn gram_error_factor(k: usize) -> f64 {
    let h = (2 * KC + 2 * k.div_ceil(KC) + TARGET_TASKS + 8) as f64;
    let u = f64::EPSILON / 2.0;
    h * u / (1.0 - h * u)
}

/// The common length of the rows (`None` without rows).
fn row_len<R: AsRef<[f32]>>(sets: &[&[R]]) -> Option<usize> {
    let mut d = None;
    for set in sets {
        for r in set.iter() {
            let len = r.as_ref().len();
            match d {
                None => d = Some(len),
                Some(d) => assert_eq!(d, len, "rows of different lengths"),
            }
        }
    }
    d
}

fn dims<A: AsRef<[f32]>, B: AsRef<[f32]>>(a: &[A], b: &[B]) -> Option<usize> {
    let da = row_len(&[a]);
    let db = row_len(&[b]);
    if let (Some(x), Some(y)) = (da, db) {
        assert_eq!(x, y, "rows of different lengths");
    }
    da.or(db)
}

/// How the host multiplies a Gram's blocks (see the module's "Precision").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arith {
    /// Exact `f32·f32` products, `f64` sums (`matrixmultiply::dgemm`): the
    /// kernels the goldens were recorded with.
    F64,
    /// The same arithmetic with `gemm`'s `f64` kernels (~1.2× faster here;
    /// other bits): distances from [`F32_MIN_MODELS`] models on.
    F64Gemm,
    /// `f32` GEMMs over [`F32_BLOCK`] columns (`gemm`), their results added
    /// in `f64`: ~2.4× the `f64` rate.
    F32Blocks,
    /// `f32` GEMMs over whole chunks of [`KC`] columns, added in `f64`: for
    /// estimates that only pick which entries are recomputed exactly
    /// ([`Kernels::sq_dist_nearest`]). A looser bound (more candidates) for
    /// fewer passes over the `f64` sums, which bound a 64-deep block's GEMM.
    F32Chunks,
}

/// An element type the pairwise GEMMs multiply in.
trait Elem: Copy + Default + Send + 'static {
    const ONE: Self;
    /// The value in `f64` (tests compare the types' results through it).
    #[cfg(test)]
    fn widen(self) -> f64;
    /// `x` in this type.
    #[cfg(test)]
    fn from_f32(x: f32) -> Self;
    /// dst ← src in this type.
    fn convert(dst: &mut [Self], src: &[f32]);
    /// dst ← src − shift, subtracted in `f64` and rounded once to this type.
    fn centre(dst: &mut [Self], src: &[f32], shift: &[f32]);
    /// acc ← acc + part, widened to `f64`.
    fn add_to(acc: &mut [f64], part: &[Self]);
}

impl Elem for f64 {
    const ONE: Self = 1.0;

    #[cfg(test)]
    fn widen(self) -> f64 {
        self
    }

    #[cfg(test)]
    fn from_f32(x: f32) -> Self {
        f64::from(x)
    }

    fn convert(dst: &mut [Self], src: &[f32]) {
        lanes::widen_f64(dst, src);
    }

    fn centre(dst: &mut [Self], src: &[f32], shift: &[f32]) {
        lanes::centre_f64(dst, src, shift);
    }

    fn add_to(acc: &mut [f64], part: &[Self]) {
        lanes::add_f64(acc, part);
    }
}

impl Elem for f32 {
    const ONE: Self = 1.0;

    #[cfg(test)]
    fn widen(self) -> f64 {
        f64::from(self)
    }

    #[cfg(test)]
    fn from_f32(x: f32) -> Self {
        x
    }

    fn convert(dst: &mut [Self], src: &[f32]) {
        dst.copy_from_slice(src);
    }

    fn centre(dst: &mut [Self], src: &[f32], shift: &[f32]) {
        lanes::centre_f32(dst, src, shift);
    }

    fn add_to(acc: &mut [f64], part: &[Self]) {
        lanes::add_f32(acc, part);
    }
}

/// The right operand of a Gram chunk: `nj` rows of `kc` columns, element
/// (j, k) at `ptr + j·row + k·depth`.
#[derive(Clone, Copy)]
struct RightRows<E> {
    ptr: *const E,
    /// Stride between rows (j).
    row: usize,
    /// Stride along the columns summed over (k).
    depth: usize,
}

impl<E> RightRows<E> {
    /// The same operand from row `j` and column `k` on.
    ///
    /// # Safety
    /// (j, k) must lie inside the operand.
    unsafe fn at(self, j: usize, k: usize) -> Self {
        Self {
            // SAFETY: the caller's.
            ptr: unsafe { self.ptr.add(j * self.row + k * self.depth) },
            ..self
        }
    }
}

/// One way to multiply a Gram tile's column chunk.
trait BlockGemm {
    type E: Elem;
    /// Whether it wants the right operand depth-major (`kc × nj`, rows
    /// contiguous along j), which spares `gemm` a transposing pack per call.
    const DEPTH_MAJOR_RIGHT: bool;
    /// acc (ni × nj, row-major) += a·bᵀ, where `a` holds `ni` rows of `kc`
    /// columns (row stride `kc`) and `b` is `nj` such rows; `scratch` is
    /// reusable. With `upper` (`a` and `b` are the same rows, a diagonal
    /// tile) the entries below the diagonal may be left as they were: the
    /// caller reads only the upper triangle.
    ///
    /// # Safety
    /// `a` points at `ni·kc` readable elements, `b` reaches `nj × kc`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn accumulate(
        ni: usize,
        nj: usize,
        kc: usize,
        a: *const Self::E,
        b: RightRows<Self::E>,
        upper: bool,
        acc: &mut [f64],
        scratch: &mut Vec<Self::E>,
    );
}

/// `gemm` on `ni × kb` rows of `a` (row stride `kc`) and `nj × kb` of `b`
/// into the row-major `dst` (overwritten).
///
/// # Safety
/// As [`BlockGemm::accumulate`], with `dst` holding `ni·nj` elements.
unsafe fn gemm_abt<T: Elem>(
    ni: usize,
    nj: usize,
    kb: usize,
    kc: usize,
    a: *const T,
    b: RightRows<T>,
    dst: *mut T,
) {
    // SAFETY: the caller's; lhs rows of stride kc, rhs the transpose of b's
    // rows, dst row-major (read_dst = false).
    unsafe {
        gemm::gemm(
            ni,
            nj,
            kb,
            dst,
            1,
            nj as isize,
            false,
            a,
            1,
            kc as isize,
            b.ptr,
            b.row as isize,
            b.depth as isize,
            T::default(),
            T::ONE,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// [`Arith::F64`].
struct ExactMm;
/// `gemm` in `E` over blocks of `DEPTH` columns, added in `f64`:
/// [`Arith::F64Gemm`] (`f64`, one block), [`Arith::F32Blocks`] and
/// [`Arith::F32Chunks`] (`f32`).
struct GemmIn<E, const DEPTH: usize>(std::marker::PhantomData<E>);

/// Depth of [`Arith::F64Gemm`]'s blocks: a whole chunk.
const WHOLE: usize = usize::MAX;

impl BlockGemm for ExactMm {
    type E = f64;
    const DEPTH_MAJOR_RIGHT: bool = false;

    unsafe fn accumulate(
        ni: usize,
        nj: usize,
        kc: usize,
        a: *const f64,
        b: RightRows<f64>,
        _: bool,
        acc: &mut [f64],
        _: &mut Vec<f64>,
    ) {
        debug_assert!(acc.len() >= ni * nj);
        // SAFETY: the caller's a and b; the right operand is the kc×nj
        // transpose of b's rows; acc is ni×nj row-major.
        unsafe {
            matrixmultiply::dgemm(
                ni,
                kc,
                nj,
                1.0,
                a,
                kc as isize,
                1,
                b.ptr,
                b.depth as isize,
                b.row as isize,
                1.0,
                acc.as_mut_ptr(),
                nj as isize,
                1,
            );
        }
    }
}

impl<E: Elem, const DEPTH: usize> BlockGemm for GemmIn<E, DEPTH> {
    type E = E;
    const DEPTH_MAJOR_RIGHT: bool = true;

    unsafe fn accumulate(
        ni: usize,
        nj: usize,
        kc: usize,
        a: *const E,
        b: RightRows<E>,
        upper: bool,
        acc: &mut [f64],
        scratch: &mut Vec<E>,
    ) {
        // Bands of at least SUB_ROWS rows keep their slice of `acc` and the
        // GEMM's result in L2 across the column blocks, and on a diagonal
        // tile skip the blocks left of the diagonal. Every entry is the
        // same sequence of GEMM results added in the same order as one call
        // over the whole tile: one `gemm` block of depth kb ≤ 512 sums along
        // k in one pass whatever m, n and the layouts are.
        let bands = if ni >= 2 * SUB_ROWS && nj >= 16 {
            ni / SUB_ROWS
        } else {
            1
        };
        for t in 0..bands {
            let (r0, r1) = (t * ni / bands, (t + 1) * ni / bands);
            let c0 = if upper { r0.min(nj) } else { 0 };
            let (m, n) = (r1 - r0, nj - c0);
            scratch.resize(m * n, E::default());
            for k0 in (0..kc).step_by(DEPTH.clamp(1, kc.max(1))) {
                let kb = DEPTH.min(kc - k0);
                // SAFETY: rows r0..r1 of a and c0..nj of b, columns k0..k0 +
                // kb; scratch holds m·n.
                unsafe {
                    gemm_abt(
                        m,
                        n,
                        kb,
                        kc,
                        a.add(r0 * kc + k0),
                        b.at(c0, k0),
                        scratch.as_mut_ptr(),
                    );
                }
                for (r, part) in scratch.chunks_exact(n).enumerate() {
                    E::add_to(&mut acc[(r0 + r) * nj + c0..][..n], part);
                }
            }
        }
    }
}

/// `dst` (kc × rows) ← the transpose of `src` (rows × kc): eight rows at
/// a time, so that each store is eight contiguous elements.
fn transpose<E: Copy>(src: &[E], rows: usize, kc: usize, dst: &mut [E]) {
    const B: usize = 8;
    let full = rows / B * B;
    for r0 in (0..full).step_by(B) {
        let s: [&[E]; B] = std::array::from_fn(|i| &src[(r0 + i) * kc..][..kc]);
        for (k, out) in dst.chunks_exact_mut(rows).enumerate().take(kc) {
            let out: &mut [E; B] = (&mut out[r0..r0 + B]).try_into().expect("eight");
            *out = std::array::from_fn(|i| s[i][k]);
        }
    }
    for r in full..rows {
        for (k, v) in src[r * kc..][..kc].iter().enumerate() {
            dst[k * rows + r] = *v;
        }
    }
}

/// One task of a Gram: the products of some tile pairs over a run of
/// column chunks. Each tile's block of a chunk is gathered (and, for a
/// depth-major right operand, transposed) once however many of the pairs
/// use it, so a task holding every pair reads each model once per chunk
/// instead of once per pair it appears in.
struct GramTask<'a, A, B> {
    a: &'a [A],
    /// The right rows; `None` for a symmetric Gram (its right tiles are
    /// `a`'s).
    b: Option<&'a [B]>,
    /// Row ranges of `a`'s tiles and of the right tiles.
    ta: &'a [(usize, usize)],
    tb: &'a [(usize, usize)],
    /// (left tile, right tile) of each product.
    pairs: &'a [(usize, usize)],
    cols: &'a Columns<'a>,
    chunks: Range<usize>,
}

impl<A: AsRef<[f32]>, B: AsRef<[f32]>> GramTask<'_, A, B> {
    /// Each pair's partial sums (ni × nj, row-major), chunk by chunk in
    /// order: the same operations, hence the same bits, however the pairs
    /// are grouped into tasks.
    fn products<G: BlockGemm>(&self) -> Vec<Vec<f64>> {
        let len = |(lo, hi): (usize, usize)| hi - lo;
        let sym = self.b.is_none();
        let mut accs: Vec<Vec<f64>> = self
            .pairs
            .iter()
            .map(|&(ti, tj)| vec![0.0; len(self.ta[ti]) * len(self.tb[tj])])
            .collect();
        // Slots: a's tiles, then (cross Grams) the right tiles.
        let right_slot = |tj: usize| if sym { tj } else { self.ta.len() + tj };
        let slots = self.ta.len() + if sym { 0 } else { self.tb.len() };
        let mut rows: Vec<Vec<G::E>> = vec![Vec::new(); slots];
        let mut depth_major_rows: Vec<Vec<G::E>> = vec![Vec::new(); slots];
        let mut scratch = Vec::new();
        let cols = self.cols;
        for c in self.chunks.clone() {
            let (k0, k1) = cols.chunk(c);
            let kc = k1 - k0;
            let mut gathered = vec![false; slots];
            let mut transposed = vec![false; slots];
            let mut gather = |slot: usize, rows: &mut Vec<Vec<G::E>>| {
                if std::mem::replace(&mut gathered[slot], true) {
                    return;
                }
                let buf = &mut rows[slot];
                if slot < self.ta.len() {
                    let (lo, hi) = self.ta[slot];
                    buf.resize((hi - lo) * KC, G::E::default());
                    cols.gather_rows(&self.a[lo..hi], k0, k1, buf);
                } else if let Some(b) = self.b {
                    let (lo, hi) = self.tb[slot - self.ta.len()];
                    buf.resize((hi - lo) * KC, G::E::default());
                    cols.gather_rows(&b[lo..hi], k0, k1, buf);
                }
            };
            for (acc, &(ti, tj)) in accs.iter_mut().zip(self.pairs) {
                let (ni, nj) = (len(self.ta[ti]), len(self.tb[tj]));
                // A diagonal tile of a symmetric Gram multiplies one buffer by itself.
                let same = sym && ti == tj;
                let rs = right_slot(tj);
                gather(ti, &mut rows);
                gather(rs, &mut rows);
                // `gemm` takes tiles of at most 16 × 16 with rows contiguous
                // along k into horizontal kernels (other sums, other bits):
                // those keep the row-major operand.
                let b = if G::DEPTH_MAJOR_RIGHT && ni * nj > 256 {
                    let bt = &mut depth_major_rows[rs];
                    if !std::mem::replace(&mut transposed[rs], true) {
                        bt.resize(nj * KC, G::E::default());
                        transpose(&rows[rs][..nj * kc], nj, kc, &mut bt[..nj * kc]);
                    }
                    RightRows {
                        ptr: bt.as_ptr(),
                        row: 1,
                        depth: nj,
                    }
                } else {
                    RightRows {
                        ptr: rows[rs].as_ptr(),
                        row: kc,
                        depth: 1,
                    }
                };
                // SAFETY: the left slot holds ni rows of kc, b reaches nj × kc.
                unsafe { G::accumulate(ni, nj, kc, rows[ti].as_ptr(), b, same, acc, &mut scratch) };
            }
        }
        accs
    }
}

/// The (symmetric when `b` is `None`) Gram matrix of the views of `a` and `b`.
fn gram_impl<A, B>(a: &[A], b: Option<&[B]>, cols: &Columns, arith: Arith) -> Matrix
where
    A: AsRef<[f32]> + Sync,
    B: AsRef<[f32]> + Sync,
{
    let n = a.len();
    let m = b.map_or(n, <[B]>::len);
    let mut out = Matrix::zeros(n, m);
    let nchunks = cols.chunks();
    if n == 0 || m == 0 || nchunks == 0 {
        return out;
    }
    // A symmetric Gram that fits one tile is cut in two halves so that only
    // the upper triangle (3 of 4 quarters) is computed.
    let tile = if b.is_none() && (SPLIT_MIN..=TILE).contains(&n) {
        n.div_ceil(2)
    } else {
        TILE
    };
    let tiles = |len: usize| -> Vec<(usize, usize)> {
        (0..len.div_ceil(tile))
            .map(|t| (t * tile, ((t + 1) * tile).min(len)))
            .collect()
    };
    let (ta, tb) = (tiles(n), tiles(m));
    let mut pairs = Vec::new();
    for ti in 0..ta.len() {
        for tj in 0..tb.len() {
            if b.is_some() || ti <= tj {
                pairs.push((ti, tj));
            }
        }
    }
    let max_seg = (MAX_PARTIAL_BYTES / (8 * n * m)).max(1);
    let nseg = TARGET_TASKS
        .div_ceil(pairs.len())
        .min(nchunks)
        .min(max_seg)
        .max(1);
    // Consecutive pairs (sharing left tiles) go to one task, in groups of
    // equal size, as long as there are at least eight tasks per thread to
    // balance: fewer gathers, same bits.
    let groups_wanted = (8 * rayon::current_num_threads())
        .div_ceil(nseg)
        .clamp(1, pairs.len());
    let group = pairs.len().div_ceil(groups_wanted);
    let groups: Vec<Range<usize>> = (0..pairs.len())
        .step_by(group)
        .map(|p| p..(p + group).min(pairs.len()))
        .collect();
    let tasks: Vec<(usize, usize)> = (0..groups.len())
        .flat_map(|g| (0..nseg).map(move |s| (g, s)))
        .collect();
    let results: Vec<Vec<Vec<f64>>> = tasks
        .par_iter()
        .map(|&(g, s)| {
            let task = GramTask {
                a,
                b,
                ta: &ta,
                tb: &tb,
                pairs: &pairs[groups[g].clone()],
                cols,
                chunks: s * nchunks / nseg..(s + 1) * nchunks / nseg,
            };
            match arith {
                Arith::F64 => task.products::<ExactMm>(),
                Arith::F64Gemm => task.products::<GemmIn<f64, WHOLE>>(),
                Arith::F32Blocks => task.products::<GemmIn<f32, F32_BLOCK>>(),
                Arith::F32Chunks => task.products::<GemmIn<f32, KC>>(),
            }
        })
        .collect();
    // Pair p's partial of segment s.
    let part = |p: usize, s: usize| {
        let g = p / group;
        &results[g * nseg + s][p - groups[g].start]
    };
    for (p, &(ti, tj)) in pairs.iter().enumerate() {
        let ((i0, i1), (j0, j1)) = (ta[ti], tb[tj]);
        let nj = j1 - j0;
        for r in 0..i1 - i0 {
            for c in 0..nj {
                let (i, j) = (i0 + r, j0 + c);
                if b.is_none() && i > j {
                    continue;
                }
                let mut v = part(p, 0)[r * nj + c];
                for s in 1..nseg {
                    v += part(p, s)[r * nj + c];
                }
                out.set(i, j, v);
                if b.is_none() {
                    out.set(j, i, v);
                }
            }
        }
    }
    out
}

fn sq_norms_impl<R: AsRef<[f32]> + Sync>(a: &[R], cols: &Columns) -> Vec<f64> {
    a.par_iter()
        .map(|row| {
            let mut buf = vec![0.0f64; KC];
            cols.blocked_sum(|k0, k1| {
                let buf = &mut buf[..k1 - k0];
                cols.gather(row.as_ref(), k0, k1, buf);
                dot4(buf, buf)
            })
        })
        .collect()
}

/// A Gram matrix as [`Kernels`] computed it: with the norms when a device
/// gave them, and the bound factor of whoever computed it.
struct GramParts {
    g: Matrix,
    norms: Option<(Vec<f64>, Vec<f64>)>,
    gamma: f64,
}

/// Where the pairwise kernels run: on the host ([`Kernels::cpu`], the
/// default, bit-identical at any thread count), or with their `O(N²·d)`
/// products offloaded to a device ([`Kernels::offloaded`]) when they are
/// large enough to pay for the transfers. Algorithms reach it through
/// their `Env`, so the choice is the run's, not the algorithm's.
#[derive(Clone)]
pub struct Kernels {
    offload: Option<Arc<dyn Offload>>,
    /// How the host multiplies.
    precision: Precision,
    /// Products of fewer flops stay on the host.
    min_flops: f64,
    /// Set once a device failure has been logged.
    warned: Arc<AtomicBool>,
}

impl fmt::Debug for Kernels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernels")
            .field("offload", &self.device_name())
            .field("precision", &self.precision)
            .field("min_flops", &self.min_flops)
            .finish()
    }
}

impl Default for Kernels {
    fn default() -> Self {
        Self::cpu().clone()
    }
}

impl Kernels {
    /// The host kernels.
    pub fn cpu() -> &'static Kernels {
        static CPU: OnceLock<Kernels> = OnceLock::new();
        CPU.get_or_init(|| Kernels {
            offload: None,
            precision: Precision::Auto,
            min_flops: 0.0,
            warned: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Gram and mixing products of at least `min_flops` (2 per
    /// multiply-add) run on `device`; smaller ones, few-row mixings and
    /// everything after a device failure of that call run on the host.
    pub fn offloaded(device: Arc<dyn Offload>, min_flops: f64) -> Self {
        Self {
            offload: Some(device),
            precision: Precision::Auto,
            min_flops,
            warned: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The same kernels with the host multiplying at `precision`.
    #[must_use]
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// How the host multiplies.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The host's arithmetic for a product over `models` rows (the larger
    /// side); distances keep exact products (their bound needs them).
    fn arith(&self, models: usize, distances: bool) -> Arith {
        match self.precision {
            Precision::Auto if models >= F32_MIN_MODELS && distances => Arith::F64Gemm,
            Precision::Auto if models >= F32_MIN_MODELS => Arith::F32Blocks,
            _ => Arith::F64,
        }
    }

    /// The device's name, when products are offloaded.
    pub fn device_name(&self) -> Option<&str> {
        self.offload.as_deref().map(Offload::name)
    }

    fn device(&self, flops: f64) -> Option<&dyn Offload> {
        self.offload.as_deref().filter(|_| flops >= self.min_flops)
    }

    /// Logs a device failure once per handle; the caller falls back.
    fn fell_back(&self, what: &str, err: &OffloadError) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                device = self.device_name().unwrap_or_default(),
                "{what} on the device failed ({err}); computing it on the host (logged once)"
            );
        }
    }

    /// G of `a` and `b` (`None`: symmetric), on the device when it pays,
    /// else on the host in `arith`.
    fn gram_parts<A, B>(&self, a: &[A], b: Option<&[B]>, cols: &Columns, arith: Arith) -> GramParts
    where
        A: AsRef<[f32]> + Sync,
        B: AsRef<[f32]> + Sync,
    {
        let n = a.len();
        let m = b.map_or(n, <[B]>::len);
        let flops = (n * m * cols.k) as f64 * if b.is_some() { 2.0 } else { 1.0 };
        if let Some(dev) = self.device(flops).filter(|_| n > 0 && m > 0 && cols.k > 0) {
            let ra: Vec<&[f32]> = a.iter().map(AsRef::as_ref).collect();
            let rb: Option<Vec<&[f32]>> = b.map(|b| b.iter().map(AsRef::as_ref).collect());
            let got = dev.gram(&ra, rb.as_deref(), cols).and_then(|out| {
                let fits = out.gram.rows == n
                    && out.gram.cols == m
                    && out.norms_a.len() == n
                    && out.norms_b.len() == if b.is_some() { m } else { 0 };
                if fits {
                    Ok(out)
                } else {
                    Err(OffloadError(format!(
                        "the device returned a {}×{} Gram for {n}×{m}",
                        out.gram.rows, out.gram.cols
                    )))
                }
            });
            match got {
                Ok(DeviceGram {
                    mut gram,
                    norms_a,
                    norms_b,
                }) => {
                    let norms = if b.is_some() {
                        Some((norms_a, norms_b))
                    } else {
                        // Exactly symmetric, as on the host: the upper
                        // triangle is the result.
                        for i in 0..n {
                            for j in 0..i {
                                let v = gram.get(j, i);
                                gram.set(i, j, v);
                            }
                        }
                        None
                    };
                    return GramParts {
                        g: gram,
                        norms,
                        gamma: dev.gram_error_factor(cols.k),
                    };
                }
                Err(e) => self.fell_back("a Gram matrix", &e),
            }
        }
        GramParts {
            g: gram_impl(a, b, cols, arith),
            norms: None,
            gamma: match arith {
                Arith::F64 | Arith::F64Gemm => gram_error_factor(cols.k),
                Arith::F32Blocks => gram_error_factor_f32(cols.k),
                Arith::F32Chunks => f32_depth_factor(KC) + gram_error_factor(cols.k),
            },
        }
    }

    /// G_ij = ⟨view(a_i), view(b_j)⟩ (n × m). Error: see
    /// [`gram_error_factor`] (or the device's factor).
    pub fn gram<A, B>(&self, a: &[A], b: &[B], view: &View) -> Matrix
    where
        A: AsRef<[f32]> + Sync,
        B: AsRef<[f32]> + Sync,
    {
        let cols = Columns::new(view.ranges, view.shift, dims(a, b));
        let arith = self.arith(a.len().max(b.len()), false);
        self.gram_parts(a, Some(b), &cols, arith).g
    }

    /// G_ij = ⟨view(a_i), view(a_j)⟩, exactly symmetric, at half the cost
    /// of [`Kernels::gram`]`(a, a, view)`.
    pub fn gram_sym<R: AsRef<[f32]> + Sync>(&self, a: &[R], view: &View) -> Matrix {
        let cols = Columns::new(view.ranges, view.shift, row_len(&[a]));
        self.gram_parts::<R, R>(a, None, &cols, self.arith(a.len(), false))
            .g
    }

    /// ‖view(a_i)‖² for each row (memory-bound: always on the host).
    pub fn sq_norms<R: AsRef<[f32]> + Sync>(&self, a: &[R], view: &View) -> Vec<f64> {
        let cols = Columns::new(view.ranges, view.shift, row_len(&[a]));
        sq_norms_impl(a, &cols)
    }

    /// C_ij = cos(view(a_i), view(b_j)), 0 when either is the zero vector
    /// (as `vecmath::cosine`).
    pub fn cosine_matrix<A, B>(&self, a: &[A], b: &[B], view: &View) -> Matrix
    where
        A: AsRef<[f32]> + Sync,
        B: AsRef<[f32]> + Sync,
    {
        let cols = Columns::new(view.ranges, view.shift, dims(a, b));
        let arith = self.arith(a.len().max(b.len()), false);
        let GramParts { mut g, norms, .. } = self.gram_parts(a, Some(b), &cols, arith);
        let (na, nb) = norms.unwrap_or_else(|| (sq_norms_impl(a, &cols), sq_norms_impl(b, &cols)));
        let m = g.cols;
        for (idx, v) in g.data.iter_mut().enumerate() {
            *v = cos_of(*v, na[idx / m], nb[idx % m]);
        }
        g
    }

    /// C_ij = cos(view(a_i), view(a_j)), exactly symmetric; the diagonal is
    /// exactly 1 (0 for a zero row).
    pub fn cosine_matrix_sym<R: AsRef<[f32]> + Sync>(&self, a: &[R], view: &View) -> Matrix {
        let mut g = self.gram_sym(a, view);
        let n = g.rows;
        let norms: Vec<f64> = (0..n).map(|i| g.get(i, i)).collect();
        for i in 0..n {
            for j in 0..n {
                let v = if i == j {
                    if norms[i] == 0.0 { 0.0 } else { 1.0 }
                } else {
                    cos_of(g.get(i, j), norms[i], norms[j])
                };
                g.set(i, j, v);
            }
        }
        g
    }

    /// D_ij = ‖view(a_i) − view(b_j)‖² (the view's shift cancels and is
    /// ignored), each entry within [`SQ_DIST_REL_TOL`] relative of the exact
    /// value (NaN where `vecmath::sq_dist` gives NaN).
    pub fn sq_dist_matrix<A, B>(&self, a: &[A], b: &[B], view: &View) -> Matrix
    where
        A: AsRef<[f32]> + Sync,
        B: AsRef<[f32]> + Sync,
    {
        sq_dist_impl(self, a, Some(b), view)
    }

    /// [`Kernels::sq_dist_matrix`] for callers that only use each row's `k`
    /// smallest entries after clamping at `floor` (FedDWA's top-k): those
    /// entries, and every entry that could tie with them, are within
    /// [`SQ_DIST_REL_TOL`] of the exact value as there, so each row's `k`
    /// smallest (clamped) entries are the exact matrix's. The others are
    /// estimates within γ·(‖a′‖ + ‖b′‖)² (centred rows; γ ≈ 3.1e-5, the
    /// bound of `f32` GEMMs over whole [`KC`]-column chunks), never below
    /// the `k`-th smallest. Where [`Precision::Auto`] takes `f32` blocks (64
    /// models on, host kernels) the Gram runs in such chunks and only the
    /// candidates are recomputed directly; otherwise this is
    /// `sq_dist_matrix`.
    pub fn sq_dist_nearest<A, B>(
        &self,
        a: &[A],
        b: &[B],
        view: &View,
        k: usize,
        floor: f64,
    ) -> Matrix
    where
        A: AsRef<[f32]> + Sync,
        B: AsRef<[f32]> + Sync,
    {
        let m = b.len();
        let blocks = self.arith(a.len().max(m), false) == Arith::F32Blocks;
        if k == 0 || k >= m || !blocks || self.offload.is_some() {
            return self.sq_dist_matrix(a, b, view);
        }
        let (d, plain, center) = centring(a, b, view);
        let cols = Columns::new(view.ranges, Some(&center), d);
        let GramParts { mut g, gamma, .. } = self.gram_parts(a, Some(b), &cols, Arith::F32Chunks);
        let (na, nb) = (sq_norms_impl(a, &cols), sq_norms_impl(b, &cols));
        // The bound is on exact norms; computed ones are within γ₆₄ of them.
        let gamma = gamma * (1.0 + 1e-6);
        let mut candidates = Vec::new();
        let mut hi = vec![0.0f64; m];
        for (i, ni) in na.iter().enumerate() {
            let mut lo = vec![0.0f64; m];
            for (j, nj) in nb.iter().enumerate() {
                let v = ni + nj - 2.0 * g.get(i, j);
                let s = ni.sqrt() + nj.sqrt();
                let e = gamma * s * s;
                g.set(i, j, v);
                // Non-finite estimates are always recomputed (and never set
                // the threshold).
                (lo[j], hi[j]) = if v.is_finite() && e.is_finite() {
                    ((v - e).max(floor), (v + e).max(floor))
                } else {
                    (f64::NEG_INFINITY, f64::INFINITY)
                };
            }
            // The k-th smallest upper bound: k entries are at most this, so
            // an entry whose lower bound exceeds it is not among the k.
            let mut order = hi.clone();
            let (_, kth, _) = order.select_nth_unstable_by(k - 1, f64::total_cmp);
            let threshold = *kth;
            candidates.extend((0..m).filter(|&j| lo[j] <= threshold).map(|j| (i, j)));
        }
        set_direct(&mut g, &candidates, a, b, &plain);
        g
    }

    /// D_ij = ‖view(a_i) − view(a_j)‖², exactly symmetric with a zero
    /// diagonal, at half the cost of [`Kernels::sq_dist_matrix`]`(a, a, view)`.
    pub fn sq_dist_matrix_sym<R: AsRef<[f32]> + Sync>(&self, a: &[R], view: &View) -> Matrix {
        sq_dist_impl::<R, R>(self, a, None, view)
    }

    /// M_i = Σ_j W_ij·θ_j for each weight row W_i (length `models.len()`),
    /// with the semantics of `vecmath::weighted_sum`: `f64` accumulation, one
    /// rounding to `f32`, zero weights skipped (a non-finite model with
    /// weight 0 does not poison the row). Rows with bit-identical weights
    /// are computed once; the output rows have the models' length (0
    /// without models). At most [`MIX_DIRECT_ROWS`] distinct rows always
    /// run on the host (memory-bound; bit-identical to `weighted_sum`), and
    /// so do sparse weights over many models ([`MIX_SPARSE_MIN_MODELS`],
    /// [`MIX_SPARSE_DENSITY`]: nnz·d work, also bit-identical).
    pub fn mix<W, R>(&self, weights: &[W], models: &[R]) -> Mixed
    where
        W: AsRef<[f64]>,
        R: AsRef<[f32]> + Sync,
    {
        let d = row_len(&[models]).unwrap_or(0);
        let (distinct_w, which) = distinct_rows(weights, models.len());
        // The rows are written once, by the kernels: no zero-fill first
        // (at N = 500 it was a sixth of the traffic of pFedGraph's mixing).
        let distinct = written_rows(distinct_w.len(), d, |outs| {
            self.mix_distinct(&distinct_w, models, outs);
        });
        Mixed { distinct, which }
    }

    /// [`Kernels::mix`] written into `outs` (one slice of the models' length
    /// per weight row): the same numbers, without allocating the rows, for
    /// callers that assemble them into larger vectors.
    ///
    /// # Panics
    ///
    /// When `outs` and `weights` differ in number, or a slice's length
    /// differs from the models'.
    pub fn mix_into<W, R>(&self, weights: &[W], models: &[R], outs: &mut [&mut [f32]])
    where
        W: AsRef<[f64]>,
        R: AsRef<[f32]> + Sync,
    {
        let mut outs: Vec<&mut [MaybeUninit<f32>]> =
            outs.iter_mut().map(|o| as_uninit(o)).collect();
        self.mix_into_slots(weights, models, &mut outs);
    }

    /// Rows mixed layer by layer: on each `(range, weights)` of `layers`,
    /// row r is Σ_j W_rj·θ_j[range] ([`Kernels::mix_into`]'s numbers), and
    /// 0 on elements outside every range. Per-layer graphs (FedAGHN,
    /// `graph-rule`) get their rows in one allocation, each element written
    /// once.
    ///
    /// # Panics
    ///
    /// When the layers have different numbers of weight rows, or a range
    /// reaches past the models or overlaps another.
    pub fn mix_layers<W, R>(&self, layers: &[(Range<usize>, &[W])], models: &[R]) -> Vec<Vec<f32>>
    where
        W: AsRef<[f64]>,
        R: AsRef<[f32]> + Sync,
    {
        let d = row_len(&[models]).unwrap_or(0);
        let rows = layers.first().map_or(0, |(_, w)| w.len());
        assert!(
            layers.iter().all(|(_, w)| w.len() == rows),
            "the same number of weight rows on every layer"
        );
        let mut ranges: Vec<Range<usize>> = layers.iter().map(|(r, _)| r.clone()).collect();
        ranges.sort_by_key(|r| r.start);
        let mut gaps = Vec::new();
        let mut end = 0;
        for r in &ranges {
            assert!(
                r.start >= end && r.end <= d,
                "layer range {r:?} overlaps or passes {d}"
            );
            gaps.push(end..r.start);
            end = end.max(r.end);
        }
        gaps.push(end..d);
        written_rows(rows, d, |outs| {
            for row in outs.iter_mut() {
                for gap in &gaps {
                    row[gap.clone()].fill(MaybeUninit::new(0.0));
                }
            }
            for (range, weights) in layers {
                let slices: Vec<&[f32]> =
                    models.iter().map(|m| &m.as_ref()[range.clone()]).collect();
                let mut sub: Vec<&mut [MaybeUninit<f32>]> =
                    outs.iter_mut().map(|o| &mut o[range.clone()]).collect();
                self.mix_into_slots(weights, &slices, &mut sub);
            }
        })
    }

    /// [`Kernels::mix_into`] on slots that may be uninitialised: each is
    /// written completely.
    fn mix_into_slots<W, R>(
        &self,
        weights: &[W],
        models: &[R],
        outs: &mut [&mut [MaybeUninit<f32>]],
    ) where
        W: AsRef<[f64]>,
        R: AsRef<[f32]> + Sync,
    {
        let d = row_len(&[models]).unwrap_or(0);
        assert_eq!(outs.len(), weights.len(), "one output per weight row");
        assert!(
            outs.iter().all(|o| o.len() == d),
            "outputs of the models' length"
        );
        let (distinct_w, which) = distinct_rows(weights, models.len());
        // Each distinct row is computed into its first user, then copied.
        let mut firsts: Vec<&mut [MaybeUninit<f32>]> = Vec::with_capacity(distinct_w.len());
        let mut taken = vec![false; distinct_w.len()];
        for (out, &k) in outs.iter_mut().zip(&which) {
            if !std::mem::replace(&mut taken[k], true) {
                firsts.push(&mut **out);
            }
        }
        self.mix_distinct(&distinct_w, models, &mut firsts);
        let mut first_of = vec![usize::MAX; distinct_w.len()];
        for (i, &k) in which.iter().enumerate() {
            if first_of[k] == usize::MAX {
                first_of[k] = i;
            } else {
                let row = outs[first_of[k]].to_vec();
                outs[i].copy_from_slice(&row);
            }
        }
    }

    /// Σ_j W_rj·θ_j into `outs[r]` for each distinct weight row, every
    /// element written ([`written_rows`] relies on it).
    fn mix_distinct<R: AsRef<[f32]> + Sync>(
        &self,
        distinct_w: &[&[f64]],
        models: &[R],
        outs: &mut [&mut [MaybeUninit<f32>]],
    ) {
        let (m, p) = (models.len(), distinct_w.len());
        let d = row_len(&[models]).unwrap_or(0);
        // Models some row uses; the others are never read.
        let active: Vec<usize> = (0..m)
            .filter(|&j| distinct_w.iter().any(|w| w[j] != 0.0))
            .collect();
        let na = active.len();
        let wd: Vec<f64> = distinct_w
            .iter()
            .flat_map(|w| active.iter().map(move |&j| w[j]))
            .collect();
        let used: Vec<&[f32]> = active.iter().map(|&j| models[j].as_ref()).collect();
        if na == 0 || d == 0 {
            outs.iter_mut().for_each(|o| o.fill(MaybeUninit::new(0.0)));
            return;
        }
        let flops = 2.0 * (p * na * d) as f64;
        let gemm = p > MIX_DIRECT_ROWS && !sparse_pays(&wd, na);
        if let Some(dev) = self.device(flops).filter(|_| gemm) {
            let rows: Vec<&[f64]> = wd.chunks(na).collect();
            match dev.mix(&rows, &used) {
                Ok(got) if got.len() == p && got.iter().all(|r| r.len() == d) => {
                    // A non-finite entry may come from 0·∞ of a skipped
                    // model: such rows take the reference loop.
                    let mut acc = vec![0.0f64; d];
                    for (r, (out, row)) in outs.iter_mut().zip(got).enumerate() {
                        out.write_copy_of_slice(&row);
                        if !row.iter().all(|x| x.is_finite()) {
                            weighted_block(&terms(rows[r], &used), 0, out, &mut acc);
                        }
                    }
                    return;
                }
                Ok(got) => self.fell_back(
                    "a mixing",
                    &OffloadError(format!("the device returned {} rows for {p}", got.len())),
                ),
                Err(e) => self.fell_back("a mixing", &e),
            }
        }
        let how = if !gemm {
            MixBy::Direct
        } else {
            match self.arith(na, false) {
                Arith::F32Blocks => MixBy::Gemm32,
                _ => MixBy::Gemm64,
            }
        };
        mix_host(&wd, &used, how, outs);
    }
}

fn cos_of(g: f64, na: f64, nb: f64) -> f64 {
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        g / (na.sqrt() * nb.sqrt())
    }
}

/// The mean of the rows of `a` and `b` on the columns of `cols`, rounded to
/// f32 (0 elsewhere and where non-finite): a centre for the distance kernels.
fn mean_center<A, B>(a: &[A], b: &[B], cols: &Columns, d: usize) -> Vec<f32>
where
    A: AsRef<[f32]> + Sync,
    B: AsRef<[f32]> + Sync,
{
    const BLOCK: usize = 4096;
    let mut center = vec![0.0f32; d];
    let count = (a.len() + b.len()) as f64;
    for &(start, len, _) in &cols.segs {
        center[start..start + len]
            .par_chunks_mut(BLOCK)
            .enumerate()
            .for_each(|(bi, out)| {
                let lo = start + bi * BLOCK;
                let hi = lo + out.len();
                let mut acc = vec![0.0f64; out.len()];
                let rows = a
                    .iter()
                    .map(AsRef::as_ref)
                    .chain(b.iter().map(AsRef::as_ref));
                for row in rows {
                    lanes::add_f32(&mut acc, &row[lo..hi]);
                }
                for (o, s) in out.iter_mut().zip(&acc) {
                    let c = (s / count) as f32;
                    *o = if c.is_finite() { c } else { 0.0 };
                }
            });
    }
    center
}

/// What the Gram-based distances share: the rows' length, `view`'s plain
/// columns (for direct recomputation) and the mean of the rows of `a` and
/// `b` on them, the shift that keeps the Gram's error small.
fn centring<A, B>(a: &[A], b: &[B], view: &View) -> (Option<usize>, Columns<'static>, Vec<f32>)
where
    A: AsRef<[f32]> + Sync,
    B: AsRef<[f32]> + Sync,
{
    let d = dims(a, b);
    let plain = Columns::new(view.ranges, None, d);
    let center = mean_center(a, b, &plain, d.unwrap_or(0));
    (d, plain, center)
}

/// Partners of one row whose distances one task computes together (each
/// column block of the row is gathered once for all of them).
const DIRECT_GROUP: usize = 8;

/// Sets each listed entry (i, j) of `g` to ‖x_i − y_j‖² on `plain`'s
/// columns, computed directly (in parallel). Consecutive pairs of one row
/// share the row's reads: the candidates of a top-k search are a few per
/// row, and these kernels are bound by reading the models.
fn set_direct<X, Y>(g: &mut Matrix, pairs: &[(usize, usize)], x: &[X], y: &[Y], plain: &Columns)
where
    X: AsRef<[f32]> + Sync,
    Y: AsRef<[f32]> + Sync,
{
    let groups: Vec<&[(usize, usize)]> = pairs
        .chunk_by(|p, q| p.0 == q.0)
        .flat_map(|run| run.chunks(DIRECT_GROUP))
        .collect();
    let exact: Vec<Vec<f64>> = groups
        .par_iter()
        .map_init(
            || vec![0.0f64; 2 * KC],
            |buf, group| {
                let ys = group.iter().map(|&(_, j)| y[j].as_ref());
                direct_sq_dists(x[group[0].0].as_ref(), ys, plain, buf)
            },
        )
        .collect();
    for (&(i, j), v) in pairs.iter().zip(exact.into_iter().flatten()) {
        g.set(i, j, v);
    }
}

/// Σ_c (x_c − y_c)² on the view's columns (no shift) for each y, blocked
/// like the GEMMs: each distance is the sum over column blocks, in order,
/// of its block's [`lanes::diff_dot4`].
fn direct_sq_dists<'y>(
    x: &[f32],
    ys: impl ExactSizeIterator<Item = &'y [f32]> + Clone,
    cols: &Columns,
    buf: &mut [f64],
) -> Vec<f64> {
    let (bx, by) = buf.split_at_mut(KC);
    let mut totals = vec![0.0f64; ys.len()];
    for c in 0..cols.chunks() {
        let (k0, k1) = cols.chunk(c);
        let (bx, by) = (&mut bx[..k1 - k0], &mut by[..k1 - k0]);
        cols.gather(x, k0, k1, bx);
        for (total, y) in totals.iter_mut().zip(ys.clone()) {
            cols.gather(y, k0, k1, by);
            *total += lanes::diff_dot4(bx, by);
        }
    }
    totals
}

/// D_ij on the columns of `view` from a Gram of the rows centred at their
/// mean, with every entry too close for the Gram's bound recomputed
/// directly (see the module's "Precision").
fn sq_dist_impl<A, B>(kernels: &Kernels, a: &[A], b: Option<&[B]>, view: &View) -> Matrix
where
    A: AsRef<[f32]> + Sync,
    B: AsRef<[f32]> + Sync,
{
    let empty: &[B] = &[];
    let (d, plain, center) = centring(a, b.unwrap_or(empty), view);
    let cols = Columns::new(view.ranges, Some(&center), d);
    let GramParts {
        mut g,
        norms,
        gamma,
    } = kernels.gram_parts(
        a,
        b,
        &cols,
        kernels.arith(a.len().max(b.map_or(0, <[B]>::len)), true),
    );
    let (na, nb) = match (norms, b) {
        (Some(norms), _) => norms,
        (None, Some(b)) => (sq_norms_impl(a, &cols), sq_norms_impl(b, &cols)),
        (None, None) => {
            let diag: Vec<f64> = (0..a.len()).map(|i| g.get(i, i)).collect();
            (diag.clone(), diag)
        }
    };
    // The bound is on exact norms; computed ones are within γ of them.
    let gamma = gamma * (1.0 + 1e-6);
    let mut direct = Vec::new();
    for (i, ni) in na.iter().enumerate() {
        for (j, nj) in nb.iter().enumerate() {
            if b.is_none() && i >= j {
                continue;
            }
            let v = ni + nj - 2.0 * g.get(i, j);
            let s = ni.sqrt() + nj.sqrt();
            // Anything but "comfortably above the bound" (NaN included, from
            // non-finite inputs) takes the direct path.
            let safe = (v * SQ_DIST_REL_TOL).partial_cmp(&(gamma * s * s));
            if safe != Some(std::cmp::Ordering::Greater) {
                direct.push((i, j));
            }
            g.set(i, j, v);
        }
    }
    match b {
        Some(b) => set_direct(&mut g, &direct, a, b, &plain),
        None => set_direct(&mut g, &direct, a, a, &plain),
    }
    if b.is_none() {
        for i in 0..g.rows {
            g.set(i, i, 0.0);
            for j in 0..i {
                let v = g.get(j, i);
                g.set(i, j, v);
            }
        }
    }
    g
}

/// The distinct weight rows (by bits, in order of first appearance) and
/// each row's index among them.
fn distinct_rows<W: AsRef<[f64]>>(weights: &[W], m: usize) -> (Vec<&[f64]>, Vec<usize>) {
    let mut seen: HashMap<Vec<u64>, usize> = HashMap::new();
    let mut which = Vec::with_capacity(weights.len());
    let mut distinct: Vec<&[f64]> = Vec::new();
    for w in weights {
        let w = w.as_ref();
        assert_eq!(
            w.len(),
            m,
            "weight row length differs from the number of models"
        );
        let key: Vec<u64> = w.iter().map(|x| x.to_bits()).collect();
        let next = distinct.len();
        let k = *seen.entry(key).or_insert(next);
        if k == next {
            distinct.push(w);
        }
        which.push(k);
    }
    (distinct, which)
}

/// The result of [`Kernels::mix`]: one row per weight row, stored once per distinct
/// weight row.
#[derive(Clone, Debug, PartialEq)]
pub struct Mixed {
    distinct: Vec<Vec<f32>>,
    which: Vec<usize>,
}

impl Mixed {
    /// Number of output rows (= weight rows).
    pub fn len(&self) -> usize {
        self.which.len()
    }

    pub fn is_empty(&self) -> bool {
        self.which.is_empty()
    }

    /// Number of distinct weight rows (= rows actually computed).
    pub fn distinct(&self) -> usize {
        self.distinct.len()
    }

    /// Index of output row `i`'s distinct row (0..distinct(), in order of
    /// first appearance).
    pub fn class_of(&self, i: usize) -> usize {
        self.which[i]
    }

    /// Output row `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.distinct[self.which[i]]
    }

    /// The distinct rows, in order of first appearance.
    pub fn distinct_rows(&self) -> &[Vec<f32>] {
        &self.distinct
    }

    /// One owned vector per output row: each distinct row is moved into its
    /// last user and cloned for the others.
    pub fn into_rows(self) -> Vec<Vec<f32>> {
        let mut last = vec![0; self.distinct.len()];
        for (i, &w) in self.which.iter().enumerate() {
            last[w] = i;
        }
        let mut rows: Vec<Option<Vec<f32>>> = self.distinct.into_iter().map(Some).collect();
        self.which
            .iter()
            .enumerate()
            .map(|(i, &w)| {
                if last[w] == i {
                    rows[w].take().expect("moved once, at its last use")
                } else {
                    rows[w].clone().expect("not moved before its last use")
                }
            })
            .collect()
    }
}

/// The non-zero terms (weight, model) of one weight row, in model order:
/// what [`weighted_block`] sums.
fn terms<'a>(w: &[f64], models: &[&'a [f32]]) -> Vec<(f64, &'a [f32])> {
    w.iter()
        .zip(models)
        .filter(|(w, _)| **w != 0.0)
        .map(|(w, x)| (*w, *x))
        .collect()
}

/// Whether the sparse loop pays for weights `wd` (rows of `na`): many
/// models and few non-zero weights.
fn sparse_pays(wd: &[f64], na: usize) -> bool {
    let nnz = wd.iter().filter(|w| **w != 0.0).count();
    na >= MIX_SPARSE_MIN_MODELS && (nnz as f64) <= MIX_SPARSE_DENSITY * wd.len() as f64
}

/// How the host computes one mixing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MixBy {
    /// `weighted_block` row by row: few rows, or sparse ones.
    Direct,
    /// `f64` GEMMs on Θ converted to `f64`.
    Gemm64,
    /// `f32` GEMMs over [`F32_BLOCK`] models at a time, added in `f64`.
    Gemm32,
}

/// The host's W·Θ on `p` distinct rows `wd` (row-major, `models.len()`
/// columns) into `distinct`: blocks of columns in parallel, each computed
/// as `how` says.
fn mix_host(wd: &[f64], models: &[&[f32]], how: MixBy, distinct: &mut [&mut [MaybeUninit<f32>]]) {
    let (p, na) = (distinct.len(), models.len());
    let d = distinct.first().map_or(0, |r| r.len());
    // Few rows: long blocks stream each model; sparse rows: blocks whose
    // models all fit in L2 while the rows gather from them; dense rows:
    // short blocks keep the converted block of Θ in cache across the GEMM's
    // row tiles. Widths depend on the shapes only.
    let width = if p <= MIX_DIRECT_ROWS {
        DIRECT_DC
    } else if how == MixBy::Direct {
        (SPARSE_BLOCK_BYTES / (4 * na) / 64 * 64).clamp(64, DIRECT_DC)
    } else {
        DC
    };
    let mut blocks: Vec<Vec<&mut [MaybeUninit<f32>]>> =
        (0..d.div_ceil(width)).map(|_| Vec::new()).collect();
    for row in distinct.iter_mut() {
        for (c, chunk) in row.chunks_mut(width).enumerate() {
            blocks[c].push(chunk);
        }
    }
    // Each row's non-zero terms, once (not once per column block: at
    // 1000 models and 9000 blocks that filtering cost seconds).
    let row_terms: Vec<Vec<(f64, &[f32])>> = match how {
        MixBy::Direct => (0..p)
            .map(|r| terms(&wd[r * na..(r + 1) * na], models))
            .collect(),
        _ => Vec::new(),
    };
    let w_row = |r: usize| terms(&wd[r * na..(r + 1) * na], models);
    let wf: Vec<f32> = match how {
        MixBy::Gemm32 => wd.iter().map(|w| *w as f32).collect(),
        _ => Vec::new(),
    };
    blocks
        .into_par_iter()
        .enumerate()
        .for_each_init(MixBuffers::default, |bufs, (c, mut outs)| {
            let c0 = c * width;
            let dc = outs[0].len();
            let tiles = (0..p).step_by(TILE);
            let acc = grown(&mut bufs.acc, TILE.min(p) * dc);
            match how {
                MixBy::Direct => {
                    for (r, out) in outs.iter_mut().enumerate() {
                        weighted_block(&row_terms[r], c0, out, acc);
                    }
                }
                MixBy::Gemm64 => {
                    let theta = grown(&mut bufs.theta64, na * dc);
                    theta_block(models, c0, lanes::widen_f64, theta);
                    for i0 in tiles {
                        let ni = TILE.min(p - i0);
                        // SAFETY: wd holds p rows of na (row stride na), theta
                        // na rows of dc (row stride dc), acc at least ni rows
                        // of dc (β = 0: written, not read).
                        unsafe {
                            matrixmultiply::dgemm(
                                ni,
                                na,
                                dc,
                                1.0,
                                wd[i0 * na..].as_ptr(),
                                na as isize,
                                1,
                                theta.as_ptr(),
                                dc as isize,
                                1,
                                0.0,
                                acc.as_mut_ptr(),
                                dc as isize,
                                1,
                            );
                        }
                        round_rows(&mut outs, i0, ni, Blocks::Sum(acc), |r, out, acc| {
                            weighted_block(&w_row(r), c0, out, acc)
                        });
                    }
                }
                MixBy::Gemm32 => {
                    let theta = grown(&mut bufs.theta32, na * dc);
                    theta_block(models, c0, <[f32]>::copy_from_slice, theta);
                    let first = grown(&mut bufs.first, TILE.min(p) * dc);
                    let part = grown(&mut bufs.part, TILE.min(p) * dc);
                    let blocks = na.div_ceil(F32_BLOCK);
                    for i0 in tiles {
                        let ni = TILE.min(p - i0);
                        let n = ni * dc;
                        for b in 0..blocks {
                            let j0 = b * F32_BLOCK;
                            let kb = F32_BLOCK.min(na - j0);
                            let dst = if b == 0 { &mut *first } else { &mut *part };
                            // SAFETY: wf holds p rows of na, theta na rows of
                            // dc; dst ni rows of dc, overwritten (β = 0).
                            unsafe {
                                gemm::gemm(
                                    ni,
                                    dc,
                                    kb,
                                    dst.as_mut_ptr(),
                                    1,
                                    dc as isize,
                                    false,
                                    wf[i0 * na + j0..].as_ptr(),
                                    1,
                                    na as isize,
                                    theta[j0 * dc..].as_ptr(),
                                    1,
                                    dc as isize,
                                    0.0,
                                    1.0,
                                    false,
                                    false,
                                    false,
                                    gemm::Parallelism::None,
                                );
                            }
                            // The blocks' sum 0 + b₀ + b₁ + … in `f64`: the
                            // first two added as they are widened (no pass
                            // writing zeros or b₀ alone), the last added
                            // while rounding to the outputs.
                            let (first, part) = (&first[..n], &part[..n]);
                            let last = b + 1 == blocks;
                            let sum = match b {
                                0 if last => Blocks::One(first),
                                0 => continue,
                                1 if last => Blocks::Two(first, part),
                                1 => {
                                    lanes::start_two_f32(&mut acc[..n], first, part);
                                    continue;
                                }
                                _ if last => Blocks::SumAnd(&acc[..n], part),
                                _ => {
                                    lanes::add_f32(&mut acc[..n], part);
                                    continue;
                                }
                            };
                            round_rows(&mut outs, i0, ni, sum, |r, out, acc| {
                                weighted_block(&w_row(r), c0, out, acc)
                            });
                        }
                    }
                }
            }
        });
}

/// One worker's buffers for the mixing's column blocks, reused from block
/// to block: each is written completely before it is read, so nothing is
/// zero-filled per block (at N = 500 that was ~1 GB of `memset` per
/// mixing).
#[derive(Default)]
struct MixBuffers {
    theta32: Vec<f32>,
    theta64: Vec<f64>,
    acc: Vec<f64>,
    first: Vec<f32>,
    part: Vec<f32>,
}

/// The first `len` elements of `buf`, grown (with zeros) when shorter.
fn grown<T: Clone + Default>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    if buf.len() < len {
        buf.resize(len, T::default());
    }
    &mut buf[..len]
}

/// `rows` vectors of `len` elements, each element written by `fill`
/// (which must write every one: the rows skip the zero-fill that
/// `vec![0.0; len]` would spend a pass of memory traffic on).
fn written_rows(
    rows: usize,
    len: usize,
    fill: impl FnOnce(&mut [&mut [MaybeUninit<f32>]]),
) -> Vec<Vec<f32>> {
    let mut out: Vec<Vec<f32>> = (0..rows).map(|_| Vec::with_capacity(len)).collect();
    let mut spare: Vec<&mut [MaybeUninit<f32>]> = out
        .iter_mut()
        .map(|r| &mut r.spare_capacity_mut()[..len])
        .collect();
    // Tests run with debug assertions: a pattern no kernel computes marks
    // the elements, and any left unwritten fail below.
    if cfg!(debug_assertions) {
        spare
            .iter_mut()
            .for_each(|r| r.fill(MaybeUninit::new(f32::from_bits(UNWRITTEN))));
    }
    fill(&mut spare);
    for row in &mut out {
        // SAFETY: `fill` wrote all `len` elements (the capacity is at least
        // `len`): the fillers are `mix_distinct`, which writes every output,
        // and `mix_layers`, which writes the gaps between its layers too.
        unsafe { row.set_len(len) };
        debug_assert!(
            row.iter().all(|x| x.to_bits() != UNWRITTEN),
            "a mixing left an element unwritten"
        );
    }
    out
}

/// A signalling NaN with a payload no arithmetic produces (arithmetic
/// quietens NaNs), marking unwritten outputs in debug builds.
const UNWRITTEN: u32 = 0x7f80_dead;

/// `x` as slots to write: the kernels write outputs through one type
/// whether they were allocated uninitialised or handed in initialised.
fn as_uninit(x: &mut [f32]) -> &mut [MaybeUninit<f32>] {
    // SAFETY: `MaybeUninit<f32>` has `f32`'s layout, and the kernels only
    // ever write initialised values through the result, so `x` stays
    // initialised.
    unsafe { &mut *(std::ptr::from_mut(x) as *mut [MaybeUninit<f32>]) }
}

/// Columns `c0..c0 + dc` of every model into `theta` (one row of `dc` per
/// model, `dc = theta.len() / models.len()`), written by `fill(dst, src)`
/// (a copy or a widening).
fn theta_block<T>(models: &[&[f32]], c0: usize, fill: impl Fn(&mut [T], &[f32]), theta: &mut [T]) {
    let dc = theta.len() / models.len();
    for (r, (row, x)) in theta.chunks_exact_mut(dc).zip(models).enumerate() {
        // Each model is a separate allocation, so every row starts a new
        // stream the hardware prefetcher has not seen: ask for a later
        // row's block while this one is copied.
        if let Some(ahead) = models.get(r + PREFETCH_ROWS_AHEAD) {
            lanes::prefetch(&ahead[c0..c0 + dc]);
        }
        fill(row, &x[c0..c0 + dc]);
    }
}

/// What a column block's outputs are rounded from: each slice holds the
/// block's rows (of its width) for one row tile.
enum Blocks<'a> {
    /// The `f64` sum of every block.
    Sum(&'a [f64]),
    /// The `f64` sum of all blocks but the last, and the last.
    SumAnd(&'a [f64], &'a [f32]),
    /// The only block (0 + b₀).
    One(&'a [f32]),
    /// The only two blocks ((0 + b₀) + b₁).
    Two(&'a [f32], &'a [f32]),
}

/// Rounds output rows `i0..i0 + ni` of a column block from `sum`; a row
/// with a non-finite entry, which may come from 0·∞ of a skipped model, is
/// recomputed by `reference(row, out, scratch)`, the `weighted_sum` loop.
fn round_rows(
    outs: &mut [&mut [MaybeUninit<f32>]],
    i0: usize,
    ni: usize,
    sum: Blocks,
    mut reference: impl FnMut(usize, &mut [MaybeUninit<f32>], &mut [f64]),
) {
    let dc = outs[0].len();
    let mut redo = Vec::new();
    for r in 0..ni {
        let out = &mut *outs[i0 + r];
        let row = r * dc..(r + 1) * dc;
        let finite = match sum {
            Blocks::Sum(acc) => lanes::narrow_f32(out, &acc[row]),
            Blocks::SumAnd(acc, last) => lanes::add_narrow_f32(out, &acc[row.clone()], &last[row]),
            Blocks::One(b0) => lanes::one_narrow_f32(out, &b0[row]),
            Blocks::Two(b0, b1) => lanes::two_narrow_f32(out, &b0[row.clone()], &b1[row]),
        };
        if !finite {
            redo.push(i0 + r);
        }
    }
    if !redo.is_empty() {
        let mut scratch = vec![0.0f64; dc];
        for r in redo {
            reference(r, &mut *outs[r], &mut scratch);
        }
    }
}

/// This machine's matrix-multiply throughput with the same crate the
/// kernels use, in GFLOP/s (2 flops per multiply-add): the yardstick that
/// benchmarks state the pairwise kernels' speed against.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemmThroughput {
    /// Threads of the rayon pool it was measured on.
    pub threads: usize,
    /// One `f64` GEMM on one thread.
    pub dgemm_one: f64,
    /// `threads` independent `f64` GEMMs at once, summed.
    pub dgemm_all: f64,
    /// `threads` independent `f32` GEMMs at once, summed.
    pub sgemm_all: f64,
}

/// Measures [`GemmThroughput`] with `size`³ products (best of `reps`;
/// 1024 and 3 take about a second per thread at 25 GFLOP/s).
pub fn gemm_throughput(size: usize, reps: usize) -> GemmThroughput {
    use std::time::Instant;
    let threads = rayon::current_num_threads();
    let a: Vec<f64> = (0..size * size).map(|i| (i % 17) as f64 * 0.1).collect();
    let af: Vec<f32> = a.iter().map(|x| *x as f32).collect();
    let flops = 2.0 * (size * size * size) as f64;
    let run64 = || {
        let mut c = vec![0.0f64; size * size];
        // SAFETY: size×size row-major operands (b read transposed) and output.
        unsafe {
            matrixmultiply::dgemm(
                size,
                size,
                size,
                1.0,
                a.as_ptr(),
                size as isize,
                1,
                a.as_ptr(),
                1,
                size as isize,
                0.0,
                c.as_mut_ptr(),
                size as isize,
                1,
            );
        }
        c[0]
    };
    let run32 = || {
        let mut c = vec![0.0f32; size * size];
        // SAFETY: as above.
        unsafe {
            matrixmultiply::sgemm(
                size,
                size,
                size,
                1.0,
                af.as_ptr(),
                size as isize,
                1,
                af.as_ptr(),
                1,
                size as isize,
                0.0,
                c.as_mut_ptr(),
                size as isize,
                1,
            );
        }
        f64::from(c[0])
    };
    let best = |f: &dyn Fn() -> f64| {
        (0..reps.max(1))
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(f());
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let all = |f: &(dyn Fn() -> f64 + Sync)| {
        best(&|| (0..threads).into_par_iter().map(|_| f()).sum::<f64>())
    };
    GemmThroughput {
        threads,
        dgemm_one: flops / best(&run64) / 1e9,
        dgemm_all: threads as f64 * flops / all(&run64) / 1e9,
        sgemm_all: threads as f64 * flops / all(&run32) / 1e9,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` rows of `k` values in [−0.5, 0.5) from a seeded xorshift.
    fn rows(seed: u64, n: usize, k: usize) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n * k)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// What `GemmIn::accumulate` did before it worked in bands: one `gemm`
    /// per column block over the whole tile, the right operand row-major.
    fn one_call<E: Elem, const DEPTH: usize>(
        ni: usize,
        nj: usize,
        kc: usize,
        a: &[E],
        b: &[E],
    ) -> Vec<f64> {
        let mut acc = vec![0.0f64; ni * nj];
        let mut scratch = vec![E::default(); ni * nj];
        for k0 in (0..kc).step_by(DEPTH.min(kc)) {
            let kb = DEPTH.min(kc - k0);
            let right = RightRows {
                ptr: b[k0..].as_ptr(),
                row: kc,
                depth: 1,
            };
            // SAFETY: a holds ni rows of kc, b nj rows of kc, scratch ni·nj.
            unsafe {
                gemm_abt(
                    ni,
                    nj,
                    kb,
                    kc,
                    a[k0..].as_ptr(),
                    right,
                    scratch.as_mut_ptr(),
                )
            };
            E::add_to(&mut acc, &scratch);
        }
        acc
    }

    /// `GemmIn::accumulate` of `a` (`ni` rows of `KC`) and `b` (`nj` rows),
    /// `b` handed over depth-major as `GramTask` does.
    fn banded<E: Elem, const DEPTH: usize>(
        ni: usize,
        nj: usize,
        a: &[E],
        b: &[E],
        upper: bool,
    ) -> Vec<f64> {
        let mut bt = vec![E::default(); nj * KC];
        transpose(b, nj, KC, &mut bt);
        for (k, col) in bt.chunks_exact(nj).enumerate() {
            for (j, v) in col.iter().enumerate() {
                assert_eq!(v.widen(), b[j * KC + k].widen());
            }
        }
        let right = RightRows {
            ptr: bt.as_ptr(),
            row: 1,
            depth: nj,
        };
        let mut got = vec![0.0f64; ni * nj];
        // SAFETY: a holds ni rows of KC, bt is nj × KC depth-major.
        unsafe {
            GemmIn::<E, DEPTH>::accumulate(
                ni,
                nj,
                KC,
                a.as_ptr(),
                right,
                upper,
                &mut got,
                &mut Vec::new(),
            );
        }
        got
    }

    /// Bands, the depth-major right operand and the skipped lower blocks of
    /// a diagonal tile change no bit of what the caller reads.
    #[test]
    fn banded_tiles_give_the_bits_of_one_call() {
        fn check<E: Elem, const DEPTH: usize>(ni: usize, nj: usize) {
            let a: Vec<E> = rows(3, ni, KC).into_iter().map(E::from_f32).collect();
            let b: Vec<E> = rows(4, nj, KC).into_iter().map(E::from_f32).collect();
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let (got, want) = (
                banded::<E, DEPTH>(ni, nj, &a, &b, false),
                one_call::<E, DEPTH>(ni, nj, KC, &a, &b),
            );
            assert_eq!(bits(&got), bits(&want), "{ni}×{nj}");
            if ni == nj {
                let (got, want) = (
                    banded::<E, DEPTH>(ni, ni, &a, &a, true),
                    one_call::<E, DEPTH>(ni, ni, KC, &a, &a),
                );
                for i in 0..ni {
                    for j in i..ni {
                        assert_eq!(
                            got[i * ni + j].to_bits(),
                            want[i * ni + j].to_bits(),
                            "({i},{j})"
                        );
                    }
                }
            }
        }
        for (ni, nj) in [
            (256, 256),
            (244, 244),
            (256, 244),
            (130, 17),
            (200, 200),
            (90, 300),
        ] {
            check::<f32, F32_BLOCK>(ni, nj);
            check::<f32, KC>(ni, nj);
        }
        check::<f64, WHOLE>(256, 256);
        check::<f64, WHOLE>(150, 40);
    }

    /// The direct distances, computed for up to [`DIRECT_GROUP`] partners
    /// of a row at once and at the CPU's vector width, have the bits of
    /// each pair summed alone in scalar code: per column block, four
    /// accumulators over the `f64` differences, the blocks added in order.
    #[test]
    fn grouped_direct_distances_have_the_bits_of_each_pair_alone() {
        let k = 2 * KC + 301;
        let (x, y) = (rows(7, 3, k), rows(8, 20, k));
        let xs: Vec<&[f32]> = x.chunks(k).collect();
        let ys: Vec<&[f32]> = y.chunks(k).collect();
        let ranges = [3..KC + 10, KC + 40..k - 2];
        let alone = |x: &[f32], y: &[f32], view: &View| -> f64 {
            let (xv, yv): (Vec<f32>, Vec<f32>) = match view.ranges {
                None => (x.to_vec(), y.to_vec()),
                Some(rs) => rs
                    .iter()
                    .flat_map(|r| r.clone())
                    .map(|c| (x[c], y[c]))
                    .unzip(),
            };
            let mut total = 0.0f64;
            for (bx, by) in xv.chunks(KC).zip(yv.chunks(KC)) {
                let d: Vec<f64> = bx
                    .iter()
                    .zip(by)
                    .map(|(p, q)| f64::from(*p) - f64::from(*q))
                    .collect();
                let mut acc = [0.0f64; 4];
                for quad in d.chunks_exact(4) {
                    for q in 0..4 {
                        acc[q] += quad[q] * quad[q];
                    }
                }
                let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
                for v in d.chunks_exact(4).remainder() {
                    s += v * v;
                }
                total += s;
            }
            total
        };
        // Row 0 with 20 partners (three groups), row 1 with one, row 2 with
        // nine (two groups).
        let mut pairs: Vec<(usize, usize)> = (0..20).map(|j| (0, j)).collect();
        pairs.push((1, 13));
        pairs.extend((5..14).map(|j| (2, j)));
        for view in [View::all(), View::ranges(&ranges)] {
            let plain = Columns::new(view.ranges, None, Some(k));
            let mut g = Matrix::zeros(3, 20);
            set_direct(&mut g, &pairs, &xs, &ys, &plain);
            for &(i, j) in &pairs {
                let want = alone(xs[i], ys[j], &view);
                assert_eq!(g.get(i, j).to_bits(), want.to_bits(), "({i},{j})");
            }
        }
    }
}
