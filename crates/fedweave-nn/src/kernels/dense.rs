//! Dense layers, `x · W + b` (`x` of `[m, k]`, `W` of `[k, n]`, row-major),
//! forward and backward, into buffers of their own. burn-flex allocates
//! every matmul output zeroed and then copies it into a realigned buffer
//! (`FlexTensor::empty` → `Bytes::from_bytes_vec`): a zeroing and a copy of
//! each product, ~2 % of a `cnn-dwa` step for its 4.7 MB weight gradient.
//! The products here are the calls burn's `linear` and its backward make
//! (the same shapes, strides and threading; burn-flex is built without
//! rayon, so one thread), and the bias is added and summed by the same
//! operations, so the bits are the same.

use super::conv::gemm_f32_uninit;
use std::mem::MaybeUninit;

/// `lhs · rhs` (`m × n`, row-major) for operands given by their (row,
/// column) strides: burn-flex's `matmul_2d_strided` call (overwriting, one
/// thread), without its allocation, into a vector `gemm` writes once (a
/// zero-filled one was 3.5 % of a FedDWA round at N = 500).
fn product(
    (m, n, k): (usize, usize, usize),
    lhs: &[f32],
    lhs_strides: (usize, usize),
    rhs: &[f32],
    rhs_strides: (usize, usize),
) -> Vec<f32> {
    let mut dst = Vec::with_capacity(m * n);
    let slots = &mut dst.spare_capacity_mut()[..m * n];
    // Debug builds (the tests) start from NaNs, which any element `gemm`
    // left unwritten would carry into the compared results.
    if cfg!(debug_assertions) {
        slots.fill(MaybeUninit::new(f32::NAN));
    }
    gemm_f32_uninit((m, n, k), slots, (lhs, lhs_strides), (rhs, rhs_strides));
    // SAFETY: `gemm_f32_uninit` wrote all m·n elements.
    unsafe { dst.set_len(m * n) };
    dst
}

/// `x · W + b` for `x` of `[m, k]`, `W` of `[k, n]` and `b` of `[n]`: the
/// product, then the bias added to each row (burn's broadcast add).
pub(super) fn forward(m: usize, k: usize, n: usize, x: &[f32], w: &[f32], b: &[f32]) -> Vec<f32> {
    let mut out = product((m, n, k), x, (k, 1), w, (n, 1));
    if n > 0 {
        for row in out.chunks_exact_mut(n) {
            for (o, &bias) in row.iter_mut().zip(b) {
                *o += bias;
            }
        }
    }
    out
}

/// The input's gradient, `dout · Wᵀ` (`[m, k]`): burn multiplies by the
/// transposed view of `W`.
pub(super) fn input_grad(m: usize, k: usize, n: usize, dout: &[f32], w: &[f32]) -> Vec<f32> {
    product((m, k, n), dout, (n, 1), w, (1, n))
}

/// The weight's gradient, `xᵀ · dout` (`[k, n]`): burn multiplies the
/// transposed view of `x`.
pub(super) fn weight_grad(m: usize, k: usize, n: usize, x: &[f32], dout: &[f32]) -> Vec<f32> {
    product((k, n, m), x, (1, k), dout, (n, 1))
}
