//! Direct 3×3 "same" convolution for inputs of a few channels: the
//! ResNets' stems (3 → 16 in `resnet8`, 3 → 64 in `resnet9`) on RGB images.
//!
//! With c_in = 3 the column matrix of im2col has only K = 27 rows, so its
//! `gemm` does 27 multiply-adds per output it loads and stores, and the
//! step around it is data movement: the matrix written and read, the
//! product copied out. Here each output row is computed in registers, 8
//! columns per vector: for every tap (c, i, j) one weight is broadcast
//! against a run of the zero-padded input row, two output channels at a
//! time so that each input load feeds two multiply-adds. The weight
//! gradient is the same loop turned around: nine accumulators per
//! (output, input) channel pair, each a dot product of the output
//! gradient's rows with one shifted input row.
//!
//! Each output (and each weight-gradient entry, image by image) is summed
//! in a fixed order that depends on the shapes only, so results are the
//! same at any thread count. They differ from im2col's in the last bits
//! (the taps are summed in another order, with fused multiply-adds).
//! x86-64 only (AVX2 + FMA intrinsics); other CPUs keep im2col.

use super::conv::{ConvGeom, ConvGrads};
use super::sum_f64;

/// Output columns per vector.
const LANES: usize = 8;

/// Output channels computed together.
const PAIR: usize = 2;

/// Whether `g` takes the direct path: a 3×3 "same" convolution (stride 1,
/// padding 1) of at most 4 input channels, an even number of output
/// channels and planes at most 32 wide (4 vectors per row), where the CPU
/// has fused multiply-adds.
pub(super) fn applies(g: &ConvGeom) -> bool {
    fused_multiply_add()
        && g.same_shape()
        && (g.kh, g.kw, g.pad) == (3, 3, 1)
        && g.c_in <= 4
        && g.c_out.is_multiple_of(PAIR)
        && g.w <= 4 * LANES
}

/// Whether the CPU has the AVX2 and FMA the loops are written in (other
/// CPUs keep im2col).
fn fused_multiply_add() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

/// One image's channels inside a border of zeros: `c_in` planes of `h + 2`
/// rows of `width` values, the image at row 1, column 1.
struct Padded {
    values: Vec<f32>,
    rows: usize,
    width: usize,
}

impl Padded {
    /// Room for one image of `g` at `vectors` vectors per output row.
    fn new(g: &ConvGeom, vectors: usize) -> Self {
        let (rows, width) = (g.h + 2, vectors * LANES + 2);
        Self {
            values: vec![0.0; g.c_in * rows * width],
            rows,
            width,
        }
    }

    /// Copies image `b` of `x` in; the border stays zero.
    fn fill(&mut self, g: &ConvGeom, x: &[f32], b: usize) {
        let plane = g.h * g.w;
        for c in 0..g.c_in {
            let src = &x[(b * g.c_in + c) * plane..][..plane];
            for (y, row) in src.chunks_exact(g.w).enumerate() {
                let at = (c * self.rows + y + 1) * self.width + 1;
                self.values[at..at + g.w].copy_from_slice(row);
            }
        }
    }

    /// Padded row `r` of channel `c`.
    fn row(&self, c: usize, r: usize) -> &[f32] {
        &self.values[(c * self.rows + r) * self.width..][..self.width]
    }
}

/// The forward pass: `[batch, c_out, h, w]`.
pub(super) fn forward(g: &ConvGeom, x: &[f32], weight: &[f32], bias: &[f32]) -> Vec<f32> {
    assert!(applies(g), "direct::forward of {g:?}");
    let mut out = vec![0.0f32; g.out_len()];
    // SAFETY: `applies` checked that the CPU has AVX2 and FMA.
    unsafe {
        match g.w.div_ceil(LANES) {
            1 => simd::forward_rows::<1>(g, x, weight, bias, &mut out),
            2 => simd::forward_rows::<2>(g, x, weight, bias, &mut out),
            3 => simd::forward_rows::<3>(g, x, weight, bias, &mut out),
            _ => simd::forward_rows::<4>(g, x, weight, bias, &mut out),
        }
    }
    out
}

/// The weight and bias gradients (no input gradient: the stems' input is
/// the data).
pub(super) fn backward(g: &ConvGeom, x: &[f32], dout: &[f32]) -> ConvGrads {
    assert!(applies(g), "direct::backward of {g:?}");
    let mut weight = vec![0.0f32; g.c_out * g.c_in * 9];
    // SAFETY: `applies` checked that the CPU has AVX2 and FMA.
    unsafe {
        match g.w.div_ceil(LANES) {
            1 => simd::weight_grad_rows::<1>(g, x, dout, &mut weight),
            2 => simd::weight_grad_rows::<2>(g, x, dout, &mut weight),
            3 => simd::weight_grad_rows::<3>(g, x, dout, &mut weight),
            _ => simd::weight_grad_rows::<4>(g, x, dout, &mut weight),
        }
    }
    let plane = g.h * g.w;
    let mut bias = vec![0.0f64; g.c_out];
    for (p, d) in dout.chunks_exact(plane).enumerate() {
        bias[p % g.c_out] += sum_f64(d, |v| v);
    }
    ConvGrads {
        x: None,
        weight,
        bias: bias.into_iter().map(|v| v as f32).collect(),
    }
}

/// The loops in AVX2 + FMA intrinsics: written as plain loops over lane
/// arrays they were not vectorised (4–5× slower than im2col).
mod simd {
    use super::{ConvGeom, LANES, PAIR, Padded};
    use std::arch::x86_64::{
        __m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_setzero_ps,
        _mm256_storeu_ps,
    };

    /// The forward pass at `V` vectors per output row into `out`.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    // Constant indices into the accumulator arrays keep them in registers.
    #[allow(clippy::needless_range_loop)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn forward_rows<const V: usize>(
        g: &ConvGeom,
        x: &[f32],
        weight: &[f32],
        bias: &[f32],
        out: &mut [f32],
    ) {
        let taps = g.c_in * 9;
        let mut padded = Padded::new(g, V);
        let mut lanes = [[0.0f32; LANES]; V];
        for b in 0..g.batch {
            padded.fill(g, x, b);
            for o in (0..g.c_out).step_by(PAIR) {
                let w = [
                    &weight[o * taps..][..taps],
                    &weight[(o + 1) * taps..][..taps],
                ];
                for y in 0..g.h {
                    let mut acc = [[_mm256_setzero_ps(); V]; PAIR];
                    for c in 0..g.c_in {
                        for i in 0..3 {
                            let row = padded.row(c, y + i);
                            assert!(row.len() >= V * LANES + 2);
                            for j in 0..3 {
                                let t = (c * 3 + i) * 3 + j;
                                let ws = [_mm256_set1_ps(w[0][t]), _mm256_set1_ps(w[1][t])];
                                for v in 0..V {
                                    // SAFETY: lanes v·8 + j .. + 8 ≤ 8·V + 2 of `row`.
                                    let xs =
                                        unsafe { _mm256_loadu_ps(row.as_ptr().add(v * LANES + j)) };
                                    for q in 0..PAIR {
                                        acc[q][v] = _mm256_fmadd_ps(ws[q], xs, acc[q][v]);
                                    }
                                }
                            }
                        }
                    }
                    for (q, acc) in acc.iter().enumerate() {
                        for (lane, a) in lanes.iter_mut().zip(acc) {
                            // SAFETY: `lane` holds 8 floats.
                            unsafe { _mm256_storeu_ps(lane.as_mut_ptr(), *a) };
                        }
                        let dst = &mut out[((b * g.c_out + o + q) * g.h + y) * g.w..][..g.w];
                        for (col, d) in dst.iter_mut().enumerate() {
                            *d = lanes[col / LANES][col % LANES] + bias[o + q];
                        }
                    }
                }
            }
        }
    }

    /// dW[o, c, i, j] += Σ over each image's positions of dout[o, y, x] ·
    /// input[c, y + i − 1, x + j − 1], at `V` vectors per row: nine vector
    /// accumulators per (o, c), summed across lanes once per image. The
    /// output gradient's rows are copied into whole vectors, zero past `w`,
    /// so the lanes beyond the plane add nothing.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weight_grad_rows<const V: usize>(
        g: &ConvGeom,
        x: &[f32],
        dout: &[f32],
        dw: &mut [f32],
    ) {
        let mut padded = Padded::new(g, V);
        let row_len = V * LANES;
        let mut rows = vec![0.0f32; g.h * row_len];
        let mut lanes = [0.0f32; LANES];
        for b in 0..g.batch {
            padded.fill(g, x, b);
            for o in 0..g.c_out {
                let plane = &dout[(b * g.c_out + o) * g.h * g.w..][..g.h * g.w];
                for (dst, src) in rows.chunks_exact_mut(row_len).zip(plane.chunks_exact(g.w)) {
                    dst[..g.w].copy_from_slice(src);
                }
                for c in 0..g.c_in {
                    let mut acc: [__m256; 9] = [_mm256_setzero_ps(); 9];
                    for (y, d) in rows.chunks_exact(row_len).enumerate() {
                        for v in 0..V {
                            // SAFETY: `d` holds 8·V floats.
                            let dv = unsafe { _mm256_loadu_ps(d.as_ptr().add(v * LANES)) };
                            for i in 0..3 {
                                let row = padded.row(c, y + i);
                                assert!(row.len() >= V * LANES + 2);
                                for j in 0..3 {
                                    // SAFETY: lanes v·8 + j .. + 8 ≤ 8·V + 2 of `row`.
                                    let xs =
                                        unsafe { _mm256_loadu_ps(row.as_ptr().add(v * LANES + j)) };
                                    acc[i * 3 + j] = _mm256_fmadd_ps(dv, xs, acc[i * 3 + j]);
                                }
                            }
                        }
                    }
                    for (t, a) in acc.iter().enumerate() {
                        // SAFETY: `lanes` holds 8 floats.
                        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), *a) };
                        dw[(o * g.c_in + c) * 9 + t] += lanes.iter().sum::<f32>();
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::conv::tests::{close, direct};
    use super::*;

    /// Forward, weight and bias gradients against the definition, at 1–4
    /// vectors per row (widths 5, 8, 9, 17, 32), 1–4 input channels and
    /// planes taller and shorter than wide.
    #[test]
    fn matches_the_definition() {
        for (x, o) in [
            ([3, 3, 6, 5], 4),
            ([2, 1, 8, 8], 2),
            ([2, 4, 3, 9], 6),
            ([1, 2, 4, 17], 2),
            ([2, 3, 32, 32], 16),
        ] {
            let g = ConvGeom::new(x, [o, x[1], 3, 3], 1, 1).unwrap();
            assert!(applies(&g), "{g:?}");
            let fill = |n: usize, seed: usize| -> Vec<f32> {
                (0..n)
                    .map(|i| (((i * 7919 + seed * 104729) % 2000) as f32 - 1000.0) / 800.0)
                    .collect()
            };
            let (xs, w, bias) = (
                fill(g.batch * g.c_in * g.h * g.w, 1),
                fill(o * g.k(), 2),
                fill(o, 3),
            );
            let dout = fill(g.out_len(), 4);
            let (y, _, dw, db) = direct(&g, &xs, &w, &bias, &dout);
            close(&forward(&g, &xs, &w, &bias), &y, 1e-5, "y", &g);
            let grads = backward(&g, &xs, &dout);
            assert!(grads.x.is_none());
            close(&grads.weight, &dw, 1e-5, "dw", &g);
            close(&grads.bias, &db, 1e-5, "db", &g);
        }
    }

    /// The stems take it; wider inputs, odd output counts, strides, other
    /// kernels and planes wider than 32 do not.
    #[test]
    fn only_narrow_stems_apply() {
        let geom = |x, w, s, p| ConvGeom::new(x, w, s, p).unwrap();
        assert!(applies(&geom([64, 3, 32, 32], [16, 3, 3, 3], 1, 1)));
        assert!(applies(&geom([64, 3, 32, 32], [64, 3, 3, 3], 1, 1)));
        assert!(!applies(&geom([64, 16, 16, 16], [16, 16, 3, 3], 1, 1)));
        assert!(!applies(&geom([64, 3, 32, 32], [5, 3, 3, 3], 1, 1)));
        assert!(!applies(&geom([64, 3, 32, 32], [16, 3, 3, 3], 2, 1)));
        assert!(!applies(&geom([64, 3, 32, 32], [16, 3, 5, 5], 1, 2)));
        assert!(!applies(&geom([64, 3, 64, 64], [16, 3, 3, 3], 1, 1)));
        assert!(!applies(&geom([64, 1, 28, 28], [6, 1, 3, 3], 1, 0)));
    }
}
