//! The seam between the pairwise kernels and a matrix-multiply device.
//!
//! `fedweave-core` knows no deep-learning backend; a device (a GPU through
//! burn, or burn's CPU backend in tests) implements [`Offload`] in the crate
//! that owns the backend, and [`Kernels`](super::Kernels) hands it the two
//! products that cost `O(N²·d)`: Gram matrices and the mixing W·Θ.
//! Everything around them (centring, the direct recomputation of close
//! distances, cosines from norms, non-finite rows) stays in `pairwise`, so
//! every algorithm keeps one code path and the same error bounds, stated
//! with the device's own [`Offload::gram_error_factor`].

use super::{Columns, Matrix};
use std::fmt;

/// A Gram matrix computed by a device, with the squared norms of both
/// operands' views (a device has them almost for free in the same pass).
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceGram {
    /// G_ij = ⟨view(a_i), view(b_j)⟩ (n × m; for a symmetric Gram only the
    /// upper triangle and the diagonal are read).
    pub gram: Matrix,
    /// ‖view(a_i)‖² for each row of `a`.
    pub norms_a: Vec<f64>,
    /// ‖view(b_j)‖² for each row of `b` (empty for a symmetric Gram).
    pub norms_b: Vec<f64>,
}

/// Why a device could not compute a product. The kernels then compute it on
/// the host and say so once in the log: a device failure costs time, never a
/// result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffloadError(pub String);

impl fmt::Display for OffloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OffloadError {}

/// A device that computes the server's large products in `f64`.
///
/// Contract (what [`Kernels`](super::Kernels) relies on): inputs are
/// converted from `f32` to `f64` exactly and a shift is subtracted in `f64`
/// (as the host kernels do), products and sums are `f64`, and every Gram
/// entry is within `gram_error_factor(k)·Σ|a_c·b_c|` of the exact value.
pub trait Offload: Send + Sync {
    /// A short name for logs ("cuda", "flex").
    fn name(&self) -> &str;

    /// The Gram matrix of the views of `a` and `b` (`None`: of `a` with
    /// itself) on `cols`, with the rows' squared norms.
    ///
    /// # Errors
    ///
    /// Any device failure (out of memory, a lost device).
    fn gram(
        &self,
        a: &[&[f32]],
        b: Option<&[&[f32]]>,
        cols: &Columns,
    ) -> Result<DeviceGram, OffloadError>;

    /// Bound factor of [`Offload::gram`] on `k` columns (see
    /// [`gram_error_factor`](super::gram_error_factor) for the host's).
    fn gram_error_factor(&self, k: usize) -> f64;

    /// M = W·Θ: `weights` are p rows of `models.len()` entries, `models`
    /// rows of one length d; accumulated in `f64`, each entry rounded once
    /// to `f32` (p rows of d).
    ///
    /// # Errors
    ///
    /// Any device failure.
    fn mix(&self, weights: &[&[f64]], models: &[&[f32]]) -> Result<Vec<Vec<f32>>, OffloadError>;
}

/// γ_h = h·u/(1 − h·u), u = 2⁻⁵³: the bound factor of a sum of depth `h`.
pub fn depth_error_factor(h: usize) -> f64 {
    let hu = h as f64 * (f64::EPSILON / 2.0);
    hu / (1.0 - hu)
}
