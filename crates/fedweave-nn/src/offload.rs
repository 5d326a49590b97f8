//! The server's pairwise products on a burn device (`[device]
//! server_kernels`): Gram matrices and the mixing W·Θ as `f64` matrix
//! products, fed block by block of columns from the host's `f32` models.
//!
//! Why `f64`: the host kernels' error bound (exact `f32·f32` products,
//! `f64` sums) is what keeps `cos > 0.9` decisions and small distances
//! exact enough (see `fedweave_core::pairwise`, "Precision"); an `f32` GEMM
//! would lose 1e-6–1e-4 relative at d = 582k. Rows cross as `f32` (half the
//! bytes) and are widened on the device, where the shift is subtracted in
//! `f64` as on the host. A backend without `f64` (wgpu on most GPUs) is
//! refused when the handle is built, so the run keeps its host kernels.
//!
//! Memory on the device is one block of [`BLOCK_COLS`] columns of each
//! operand (in `f32` and `f64`) plus the n×m result, whatever d is.
//!
//! Reproducibility: on `flex` (the CPU backend, as the tests run it) the
//! result is deterministic. On a GPU the matrix product's kernel is
//! autotuned, so the last bits of a Gram entry may differ between runs;
//! every entry stays within [`Offload::gram_error_factor`] of the exact
//! value, which is what the distance kernel's direct recomputation is built
//! on.

use crate::{Backend, NnError};
use burn::tensor::{DType, Device, Element, FloatDType, Tensor, TensorCreationOptions, TensorData};
use fedweave_core::pairwise::{
    Columns, DeviceGram, Matrix, Offload, OffloadError, depth_error_factor,
};
use rayon::prelude::*;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Columns per uploaded block. It also bounds the summation depth of one
/// block's product, hence the error factor: 16384 keeps it within 5× of
/// the host's at d = 582k.
pub const BLOCK_COLS: usize = 16384;

/// A burn device that computes the pairwise products in `f64`.
#[derive(Clone, Debug)]
pub struct BurnOffload {
    backend: Backend,
    device: Device,
}

impl BurnOffload {
    /// The backend's device, checked by one small `f64` product.
    ///
    /// # Errors
    ///
    /// What [`Backend::device`] returns, or [`NnError::NoF64`] when the
    /// device cannot multiply `f64` matrices.
    pub fn new(backend: Backend) -> Result<Self, NnError> {
        let device = backend.device()?;
        let probe = Self { backend, device };
        // [[1, 2]]·[[3], [4]] = 11, exactly.
        let works = probe
            .guarded(|| {
                let a = probe.upload_f64(vec![1.0, 2.0], [1, 2]);
                let b = probe.upload_f64(vec![3.0, 4.0], [2, 1]);
                read_f64(a.matmul(b))
            })
            .is_ok_and(|v| v == [11.0]);
        if works {
            Ok(probe)
        } else {
            Err(NnError::NoF64 {
                backend: backend.name(),
            })
        }
    }

    /// Runs `f`, turning a backend panic (burn reports device failures such
    /// as an exhausted memory pool by panicking) into an error.
    fn guarded<T>(&self, f: impl FnOnce() -> Result<T, OffloadError>) -> Result<T, OffloadError> {
        catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
            let msg = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("the backend panicked");
            Err(OffloadError(format!("{}: {msg}", self.backend.name())))
        })
    }

    fn upload_f64<const D: usize>(&self, data: Vec<f64>, shape: [usize; D]) -> Tensor<D> {
        let options = TensorCreationOptions::new(self.device.clone()).with_dtype(DType::F64);
        Tensor::from_data(TensorData::new(data, shape), options)
    }

    /// `rows` on logical columns k0..k1 of `cols` as an `f64` tensor, minus
    /// the view's shift if it has one.
    fn block(&self, rows: &[&[f32]], cols: &Columns, k0: usize, k1: usize) -> Tensor<2> {
        let kc = k1 - k0;
        let mut buf = vec![0.0f32; rows.len() * kc];
        buf.par_chunks_mut(kc)
            .zip(rows)
            .for_each(|(out, row)| cols.gather_f32(row, k0, k1, out));
        let x = Tensor::<2>::from_data(TensorData::new(buf, [rows.len(), kc]), &self.device)
            .cast(FloatDType::F64);
        match cols.shift() {
            None => x,
            Some(shift) => {
                let mut s = vec![0.0f32; kc];
                cols.gather_f32(shift, k0, k1, &mut s);
                let s = Tensor::<2>::from_data(TensorData::new(s, [1, kc]), &self.device)
                    .cast(FloatDType::F64);
                x - s
            }
        }
    }
}

/// A tensor's entries as `E` (the tensor's own element type).
fn read<E: Element, const D: usize>(t: Tensor<D>) -> Result<Vec<E>, OffloadError> {
    t.into_data()
        .try_to_vec::<E>()
        .map_err(|e| OffloadError(format!("reading a result back: {e:?}")))
}

/// A tensor's entries as `f64`.
fn read_f64<const D: usize>(t: Tensor<D>) -> Result<Vec<f64>, OffloadError> {
    read(t)
}

/// Row-wise squared norms of an n×kc block, as an `[n]` tensor.
fn row_sq_norms(x: Tensor<2>) -> Tensor<1> {
    let n = x.dims()[0];
    (x.clone() * x).sum_dim(1).reshape([n])
}

/// `acc + x`, or `x` for the first block.
fn add<const D: usize>(acc: Option<Tensor<D>>, x: Tensor<D>) -> Tensor<D> {
    match acc {
        None => x,
        Some(acc) => acc + x,
    }
}

impl Offload for BurnOffload {
    fn name(&self) -> &str {
        self.backend.name()
    }

    fn gram(
        &self,
        a: &[&[f32]],
        b: Option<&[&[f32]]>,
        cols: &Columns,
    ) -> Result<DeviceGram, OffloadError> {
        let (n, k) = (a.len(), cols.k());
        let m = b.map_or(n, <[&[f32]]>::len);
        self.guarded(|| {
            let (mut g, mut na, mut nb) = (None, None, None);
            for k0 in (0..k).step_by(BLOCK_COLS) {
                let k1 = (k0 + BLOCK_COLS).min(k);
                let xa = self.block(a, cols, k0, k1);
                let xb = b.map(|b| self.block(b, cols, k0, k1));
                let right = xb.clone().unwrap_or_else(|| xa.clone());
                g = Some(add(g, xa.clone().matmul(right.transpose())));
                na = Some(add(na, row_sq_norms(xa)));
                if let Some(xb) = xb {
                    nb = Some(add(nb, row_sq_norms(xb)));
                }
            }
            let gram = match g {
                Some(g) => Matrix::from_vec(n, m, read_f64(g)?),
                None => Matrix::from_vec(n, m, vec![0.0; n * m]),
            };
            let norms_a = na.map_or(Ok(vec![0.0; n]), read_f64)?;
            let norms_b = match (b, nb) {
                (None, _) => Vec::new(),
                (Some(_), Some(nb)) => read_f64(nb)?,
                (Some(_), None) => vec![0.0; m],
            };
            Ok(DeviceGram {
                gram,
                norms_a,
                norms_b,
            })
        })
    }

    fn gram_error_factor(&self, k: usize) -> f64 {
        // One block's product sums along at most BLOCK_COLS terms; the
        // blocks' partial results are then added one by one.
        depth_error_factor(BLOCK_COLS.min(k) + k.div_ceil(BLOCK_COLS) + 2)
    }

    fn mix(&self, weights: &[&[f64]], models: &[&[f32]]) -> Result<Vec<Vec<f32>>, OffloadError> {
        let (p, m) = (weights.len(), models.len());
        let d = models.first().map_or(0, |x| x.len());
        self.guarded(|| {
            let w = self.upload_f64(weights.concat(), [p, m]);
            let mut out = fedweave_core::vecmath::zeroed_rows(p, d);
            for c0 in (0..d).step_by(BLOCK_COLS) {
                let c1 = (c0 + BLOCK_COLS).min(d);
                let dc = c1 - c0;
                let mut buf = vec![0.0f32; m * dc];
                buf.par_chunks_mut(dc)
                    .zip(models)
                    .for_each(|(o, x)| o.copy_from_slice(&x[c0..c1]));
                let theta = Tensor::<2>::from_data(TensorData::new(buf, [m, dc]), &self.device)
                    .cast(FloatDType::F64);
                // One rounding to f32, of the f64 sum, on the device.
                let mixed = w.clone().matmul(theta).cast(FloatDType::F32);
                let block: Vec<f32> = read(mixed)?;
                for (row, src) in out.iter_mut().zip(block.chunks(dc)) {
                    row[c0..c1].copy_from_slice(src);
                }
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
// (i, j) indexing mirrors the matrices under test.
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;
    use fedweave_core::pairwise::{Kernels, SQ_DIST_REL_TOL, View, gram_error_factor};
    use fedweave_core::vecmath::weighted_sum;
    use std::ops::Range;
    use std::sync::Arc;

    /// n rows of d values around `offset` (xorshift, deterministic).
    fn rows(seed: u64, n: usize, d: usize, offset: f32) -> Vec<Vec<f32>> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                (0..d)
                    .map(|_| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        offset + ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
                    })
                    .collect()
            })
            .collect()
    }

    fn flex() -> Kernels {
        Kernels::offloaded(Arc::new(BurnOffload::new(Backend::Cpu).unwrap()), 0.0)
    }

    /// |x − y| over max(|y|, floor).
    fn rel(x: f64, y: f64, floor: f64) -> f64 {
        (x - y).abs() / y.abs().max(floor)
    }

    /// Three blocks of columns (d > 2·BLOCK_COLS), two ranges and a shift:
    /// every product the device computes agrees with the host's within the
    /// two kernels' bounds.
    #[test]
    fn offloaded_products_match_the_host_within_their_bounds() {
        let d = 2 * BLOCK_COLS + 1234;
        let (a, b) = (rows(1, 7, d, 0.2), rows(2, 5, d, -0.1));
        let shift = rows(3, 1, d, 0.0).remove(0);
        let ranges: [Range<usize>; 2] = [100..BLOCK_COLS + 900, BLOCK_COLS + 2000..d];
        let k = ranges.iter().map(Range::len).sum::<usize>();
        let view = View::ranges(&ranges).with_shift(&shift);
        let (dev, host) = (flex(), Kernels::cpu());
        let off = BurnOffload::new(Backend::Cpu).unwrap();
        let gamma = off.gram_error_factor(k) + gram_error_factor(k);
        // At the size of the 582k-parameter CNN the device's bound is within 5×.
        assert!(off.gram_error_factor(582_218) < 5.0 * gram_error_factor(582_218));

        let norms_a = host.sq_norms(&a, &view);
        let norms_b = host.sq_norms(&b, &view);
        let (gd, gh) = (dev.gram(&a, &b, &view), host.gram(&a, &b, &view));
        for i in 0..7 {
            for j in 0..5 {
                let bound = gamma * (norms_a[i] * norms_b[j]).sqrt();
                let diff = (gd.get(i, j) - gh.get(i, j)).abs();
                assert!(diff <= bound, "G[{i}][{j}]: {diff} > {bound}");
            }
        }
        let (cd, ch) = (
            dev.cosine_matrix(&a, &b, &view),
            host.cosine_matrix(&a, &b, &view),
        );
        let (sd, sh) = (
            dev.cosine_matrix_sym(&a, &view),
            host.cosine_matrix_sym(&a, &view),
        );
        for (x, y) in cd.as_slice().iter().zip(ch.as_slice()) {
            assert!((x - y).abs() < 1e-12, "{x} vs {y}");
        }
        for i in 0..7 {
            assert_eq!(sd.get(i, i), 1.0);
            for j in 0..7 {
                assert_eq!(sd.get(i, j), sd.get(j, i), "exactly symmetric");
                assert!((sd.get(i, j) - sh.get(i, j)).abs() < 1e-12);
            }
        }
        // Distances: both within 1e-9 of the exact value, so within 2e-9 of
        // each other; the shift cancels.
        let plain = View::ranges(&ranges);
        let (dd, dh) = (
            dev.sq_dist_matrix(&a, &b, &view),
            host.sq_dist_matrix(&a, &b, &plain),
        );
        for (x, y) in dd.as_slice().iter().zip(dh.as_slice()) {
            assert!(rel(*x, *y, 0.0) <= 2.0 * SQ_DIST_REL_TOL, "{x} vs {y}");
        }
        let dsym = dev.sq_dist_matrix_sym(&a, &plain);
        let hsym = host.sq_dist_matrix_sym(&a, &plain);
        for i in 0..7 {
            assert_eq!(dsym.get(i, i), 0.0);
            for j in 0..7 {
                assert_eq!(dsym.get(i, j), dsym.get(j, i));
                assert!(rel(dsym.get(i, j), hsym.get(i, j), 1e-300) <= 2.0 * SQ_DIST_REL_TOL);
            }
        }
    }

    /// Two models one part in 1e7 apart: their distance cancels almost all
    /// of the Gram, so it must take the direct path and keep its precision.
    #[test]
    fn close_pairs_keep_their_precision_on_the_device() {
        let d = BLOCK_COLS + 77;
        let mut a = rows(4, 3, d, 1.0);
        let mut close = a[0].clone();
        for x in close.iter_mut().step_by(3) {
            *x *= 1.0 + 1e-7;
        }
        a.push(close);
        let dev = flex().sq_dist_matrix_sym(&a, &View::all());
        let exact: f64 = a[0]
            .iter()
            .zip(&a[3])
            .map(|(x, y)| (f64::from(*x) - f64::from(*y)).powi(2))
            .sum();
        assert!(exact > 0.0);
        assert!(
            rel(dev.get(0, 3), exact, 0.0) <= SQ_DIST_REL_TOL,
            "{} vs {exact}",
            dev.get(0, 3)
        );
    }

    /// Mixing on the device rounds the same `f64` sums once: within one
    /// `f32` ulp of `weighted_sum`, rows with equal weights computed once,
    /// and a 0·∞ from a skipped non-finite model recomputed on the host.
    #[test]
    fn offloaded_mixing_matches_weighted_sum() {
        let d = BLOCK_COLS + 500;
        let mut models = rows(5, 7, d, 0.3);
        let mut weights: Vec<Vec<f64>> = (0..6)
            .map(|r| {
                let w: Vec<f64> = (0..7).map(|j| 1.0 / (1 + (j + r) % 7 + r) as f64).collect();
                let t: f64 = w.iter().sum();
                w.iter().map(|x| x / t).collect()
            })
            .collect();
        weights.push(weights[1].clone());
        let mixed = flex().mix(&weights, &models);
        assert_eq!((mixed.len(), mixed.distinct()), (7, 6));
        for (r, w) in weights.iter().enumerate() {
            let refs: Vec<&[f32]> = models.iter().map(Vec::as_slice).collect();
            let mut want = vec![0.0f32; d];
            weighted_sum(w, &refs, &mut want);
            for (x, y) in mixed.row(r).iter().zip(&want) {
                let ulp = f32::EPSILON * y.abs().max(f32::MIN_POSITIVE);
                assert!((x - y).abs() <= ulp, "row {r}: {x} vs {y}");
            }
        }
        // Model 6 turns infinite; rows 0..5 give it weight 0 (it stays in use
        // through row 5), so the device's 0·∞ = NaN there is redone.
        models[6][10] = f32::INFINITY;
        for w in weights.iter_mut().take(5) {
            w[6] = 0.0;
        }
        let mixed = flex().mix(&weights, &models);
        for r in 0..5 {
            assert!(mixed.row(r).iter().all(|x| x.is_finite()), "row {r}");
            let refs: Vec<&[f32]> = models.iter().map(Vec::as_slice).collect();
            let mut want = vec![0.0f32; d];
            weighted_sum(&weights[r], &refs, &mut want);
            assert_eq!(mixed.row(r), want.as_slice());
        }
        assert!(!mixed.row(5)[10].is_finite());
    }

    /// Below `min_flops` nothing leaves the host: bit-identical results.
    #[test]
    fn small_products_stay_on_the_host() {
        let a = rows(6, 6, 300, 0.1);
        let dev = BurnOffload::new(Backend::Cpu).unwrap();
        let gated = Kernels::offloaded(Arc::new(dev), 1e12);
        let host = Kernels::cpu();
        let view = View::all();
        assert_eq!(
            gated.cosine_matrix_sym(&a, &view),
            host.cosine_matrix_sym(&a, &view)
        );
        assert_eq!(
            gated.sq_dist_matrix_sym(&a, &view),
            host.sq_dist_matrix_sym(&a, &view)
        );
        let w: Vec<Vec<f64>> = (0..6).map(|i| vec![(i + 1) as f64 / 21.0; 6]).collect();
        assert_eq!(gated.mix(&w, &a), host.mix(&w, &a));
        // Offloaded, the same products differ from the host in the last bits
        // (so the gate above is what kept them equal).
        assert_ne!(flex().gram(&a, &a, &view), host.gram(&a, &a, &view));
    }

    #[test]
    fn the_flex_device_is_deterministic() {
        let a = rows(7, 9, BLOCK_COLS + 5, 0.0);
        let view = View::all();
        assert_eq!(flex().gram_sym(&a, &view), flex().gram_sym(&a, &view));
        let w: Vec<Vec<f64>> = (0..9).map(|i| vec![1.0 / (i + 1) as f64; 9]).collect();
        assert_eq!(flex().mix(&w, &a), flex().mix(&w, &a));
    }
}
