//! Dense layers, `x · W + b` (`x` of `[m, k]`, `W` of `[k, n]`, row-major),
//! forward and backward, into buffers of their own. burn-flex allocates
//! every matmul output zeroed and then copies it into a realigned buffer
//! (`FlexTensor::empty` → `Bytes::from_bytes_vec`): a zeroing and a copy of
//! each product, ~2 % of a `cnn-dwa` step for its 4.7 MB weight gradient.
//! The products here are the calls burn's `linear` and its backward make
//! (the same shapes, strides and threading; burn-flex is built without
//! rayon, so one thread), and the bias is added and summed by the same
//! operations, so the bits are the same.

use super::conv::gemm_f32;

/// `lhs · rhs` (`m × n`, row-major) for operands given by their (row,
/// column) strides: burn-flex's `matmul_2d_strided` call (overwriting, one
/// thread), without its allocation.
fn product(
    (m, n, k): (usize, usize, usize),
    lhs: &[f32],
    lhs_strides: (usize, usize),
    rhs: &[f32],
    rhs_strides: (usize, usize),
) -> Vec<f32> {
    let mut dst = vec![0.0f32; m * n];
    gemm_f32(
        m,
        n,
        k,
        (&mut dst, n),
        false,
        lhs,
        lhs_strides,
        rhs,
        rhs_strides,
    );
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
