//! Training-mode batch norm on `f32` slices, forward and backward, each in
//! two passes over the activations (burn's composition of mean, centring,
//! square, mean, add, sqrt, divide, scale and shift, and the autodiff steps
//! of each, took about twenty). Sums are accumulated in `f64`.
//!
//! Layout `[batch, channels, hw]`; statistics per channel over batch·hw
//! values, the variance biased (PyTorch's normalisation).
//!
//! Batch norm followed by ReLU (every one of the ResNets' and `cnn-bn`'s)
//! has its own pair, [`forward_relu`] and [`backward_relu`]: the ReLU is
//! applied as the output is written and its mask recomputed from the input
//! in the backward pass, which saves ReLU's two passes over the activations
//! each way and their buffers. The bits are those of burn's ReLU after
//! [`forward`] and its backward step before [`backward`].

use super::{extend_zip, relu_keeps, sum_f64};
use fedweave_core::wide;

/// The shape of one batch norm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BnGeom {
    pub batch: usize,
    pub channels: usize,
    pub hw: usize,
}

impl BnGeom {
    /// Every `hw`-long run in memory order, with its channel: how the
    /// outputs are written, so they need no zeroing first.
    fn runs_in_order(&self) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> + use<> {
        let (channels, hw) = (self.channels, self.hw);
        (0..self.batch * channels).map(move |r| (r % channels, r * hw..(r + 1) * hw))
    }

    fn count(&self) -> f64 {
        (self.batch * self.hw) as f64
    }
}

/// The forward pass's results.
#[derive(Debug)]
pub(crate) struct BnForward {
    /// γ·(y − mean)/√(var + ε) + β, shaped like `y`.
    pub out: Vec<f32>,
    /// Per-channel batch mean.
    pub mean: Vec<f32>,
    /// Per-channel biased batch variance.
    pub var: Vec<f32>,
    /// Per-channel 1/√(var + ε), for the backward pass.
    pub inv_std: Vec<f32>,
}

wide! {
    /// Normalises `y` by its own per-channel statistics.
    pub(crate) fn forward(g: &BnGeom, y: &[f32], gamma: &[f32], beta: &[f32], eps: f32) -> BnForward => forward_body::<false>
}

wide! {
    /// [`forward`], then ReLU on the output as it is written.
    pub(crate) fn forward_relu(g: &BnGeom, y: &[f32], gamma: &[f32], beta: &[f32], eps: f32) -> BnForward => forward_body::<true>
}

/// burn's ReLU when `RELU` (NaN kept, −0 and negatives to +0), else `v`.
#[inline(always)]
fn relu_if<const RELU: bool>(v: f32) -> f32 {
    if !RELU || relu_keeps(v) { v } else { 0.0 }
}

/// [`forward`] (and [`forward_relu`] when `RELU`) for any target.
#[inline(always)]
fn forward_body<const RELU: bool>(
    g: &BnGeom,
    y: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
) -> BnForward {
    // Each pass walks `y` in memory order; a channel's runs still add up
    // image by image, so the sums are those of a walk channel by channel.
    let mut sums = vec![0.0f64; g.channels];
    for (c, r) in g.runs_in_order() {
        sums[c] += sum_f64(&y[r], |v| v);
    }
    let mean: Vec<f32> = sums.iter().map(|&s| (s / g.count()) as f32).collect();
    let mut sq = vec![0.0f64; g.channels];
    for (c, r) in g.runs_in_order() {
        let m = mean[c];
        sq[c] += sum_f64(&y[r], |v| (v - m) * (v - m));
    }
    let var: Vec<f32> = sq.iter().map(|&s| (s / g.count()) as f32).collect();
    let inv_std: Vec<f32> = var.iter().map(|&v| 1.0 / (v + eps).sqrt()).collect();
    let affine: Vec<(f32, f32, f32)> = (0..g.channels)
        .map(|c| (mean[c], gamma[c] * inv_std[c], beta[c]))
        .collect();
    let mut out = Vec::with_capacity(y.len());
    for (c, r) in g.runs_in_order() {
        let (m, scale, shift) = affine[c];
        out.extend(
            y[r].iter()
                .map(|&x| relu_if::<RELU>((x - m) * scale + shift)),
        );
    }
    BnForward {
        out,
        mean,
        var,
        inv_std,
    }
}

/// Σ v in `f64` over 8 lanes (element i of each whole 8-chunk to lane i),
/// the tail added in order from +0, then the lanes summed and the tail
/// added: the order every backward pass has summed in. One input slice,
/// so the lanes' conversions and adds are vector operations (over two
/// slices at once the compiler built them element by element).
#[inline(always)]
fn lane_sum(v: &[f32]) -> f64 {
    let mut lanes = [0.0f64; 8];
    let chunks = v.chunks_exact(8);
    let mut tail = 0.0f64;
    for &x in chunks.remainder() {
        tail += x as f64;
    }
    for chunk in chunks {
        let chunk: &[f32; 8] = chunk.try_into().expect("a chunk of 8");
        for (l, &x) in lanes.iter_mut().zip(chunk) {
            *l += x as f64;
        }
    }
    lanes.iter().sum::<f64>() + tail
}

/// Gradients of one batch norm.
#[derive(Debug)]
pub(crate) struct BnGrads {
    pub y: Vec<f32>,
    pub gamma: Vec<f32>,
    pub beta: Vec<f32>,
}

wide! {
    /// The backward pass from the output gradient `dout`: with x̂ = (y −
    /// mean)·s, dβ = Σ dout, dγ = Σ dout·x̂ and dy = γ·s·(dout − dβ/M −
    /// x̂·dγ/M) over the M values of each channel.
    pub(crate) fn backward(g: &BnGeom, y: &[f32], mean: &[f32], inv_std: &[f32], gamma: &[f32], beta: &[f32], dout: &[f32]) -> BnGrads => backward_body::<false>
}

wide! {
    /// The backward pass of [`forward_relu`]: [`backward`] of `dout` zeroed
    /// where the normalised value (recomputed from `y`, the forward's bits)
    /// was not positive, as burn's ReLU step masks it.
    pub(crate) fn backward_relu(g: &BnGeom, y: &[f32], mean: &[f32], inv_std: &[f32], gamma: &[f32], beta: &[f32], dout: &[f32]) -> BnGrads => backward_body::<true>
}

/// [`backward`] (and [`backward_relu`] when `RELU`) for any target.
#[inline(always)]
fn backward_body<const RELU: bool>(
    g: &BnGeom,
    y: &[f32],
    mean: &[f32],
    inv_std: &[f32],
    gamma: &[f32],
    beta: &[f32],
    dout: &[f32],
) -> BnGrads {
    // ReLU's mask: where burn's ReLU passes the gradient (its input, the
    // forward's output before ReLU, positive or NaN).
    let masked = |d: f32, x: f32, m: f32, scale: f32, shift: f32| {
        let z = (x - m) * scale + shift;
        if !RELU || relu_keeps(z) { d } else { 0.0 }
    };
    let (mut dgamma, mut dbeta) = (Vec::new(), Vec::new());
    let mut coef = Vec::with_capacity(g.channels);
    // In memory order, each channel's runs added image by image (as in
    // the forward pass).
    let mut sums = vec![(0.0f64, 0.0f64); g.channels];
    // A run's (masked) gradient d and d·x̂ in f32, then each one's sum.
    let (mut d_run, mut dx_run) = (Vec::with_capacity(g.hw), Vec::with_capacity(g.hw));
    for (c, r) in g.runs_in_order() {
        let (m, s) = (mean[c], inv_std[c]);
        let (scale, shift) = (gamma[c] * s, beta[c]);
        d_run.clear();
        dx_run.clear();
        extend_zip(&mut d_run, &dout[r.clone()], &y[r.clone()], |d, x| {
            masked(d, x, m, scale, shift)
        });
        extend_zip(&mut dx_run, &d_run, &y[r], |d, x| d * ((x - m) * s));
        sums[c].0 += lane_sum(&d_run);
        sums[c].1 += lane_sum(&dx_run);
    }
    for (c, &(sum_d, sum_dx)) in sums.iter().enumerate() {
        let (m, s) = (mean[c], inv_std[c]);
        let (db, dg) = (sum_d as f32, sum_dx as f32);
        let (mean_d, mean_dx) = ((sum_d / g.count()) as f32, (sum_dx / g.count()) as f32);
        coef.push((gamma[c] * s, mean_d, m, s, mean_dx, beta[c]));
        dgamma.push(dg);
        dbeta.push(db);
    }
    let mut dy = Vec::with_capacity(y.len());
    for (c, r) in g.runs_in_order() {
        let (k, mean_d, m, s, mean_dx, shift) = coef[c];
        extend_zip(&mut dy, &dout[r.clone()], &y[r], |d, x| {
            let d = masked(d, x, m, k, shift);
            k * (d - mean_d - (x - m) * s * mean_dx)
        });
    }
    BnGrads {
        y: dy,
        gamma: dgamma,
        beta: dbeta,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// burn-flex's ReLU, and its backward step's mask by the ReLU's input.
    fn burn_relu(x: f32) -> f32 {
        if x.is_nan() || x > 0.0 { x } else { 0.0 }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The fused pair has the bits of burn's ReLU after [`forward`] and of
    /// [`backward`] after burn's ReLU step: on a plane length off the
    /// 8-lane chunks, a channel whose outputs are ±0 exactly (γ = 0, β =
    /// −0) and a channel holding NaN.
    #[test]
    fn fused_relu_has_the_bits_of_relu_after_batch_norm() {
        let g = BnGeom {
            batch: 3,
            channels: 3,
            hw: 11,
        };
        let n = g.batch * g.channels * g.hw;
        let mut y: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) / 3.0)
            .collect();
        y[2 * g.hw + 4] = f32::NAN;
        let dout: Vec<f32> = (0..n).map(|i| ((i * 13 % 19) as f32 - 9.0) / 4.0).collect();
        let (gamma, beta) = ([1.25f32, 0.0, 0.75], [0.3f32, -0.0, -0.1]);
        let plain = forward(&g, &y, &gamma, &beta, 1e-5);
        let fused = forward_relu(&g, &y, &gamma, &beta, 1e-5);
        let relu_out: Vec<f32> = plain.out.iter().map(|&v| burn_relu(v)).collect();
        assert_eq!(bits(&fused.out), bits(&relu_out));
        assert!(plain.out.iter().any(|v| v.to_bits() == (-0.0f32).to_bits()));
        assert!(fused.out.iter().any(|v| v.is_nan()));
        assert_eq!(bits(&fused.mean), bits(&plain.mean));
        assert_eq!(bits(&fused.var), bits(&plain.var));
        // burn's ReLU step: the gradient where its input is positive or NaN.
        let masked: Vec<f32> = dout
            .iter()
            .zip(&plain.out)
            .map(|(&d, &z)| if z.is_nan() || z > 0.0 { d } else { 0.0 })
            .collect();
        let (m, s) = (&plain.mean, &plain.inv_std);
        let want = backward(&g, &y, m, s, &gamma, &beta, &masked);
        let got = backward_relu(&g, &y, m, s, &gamma, &beta, &dout);
        assert_eq!(bits(&got.y), bits(&want.y));
        assert_eq!(bits(&got.gamma), bits(&want.gamma));
        assert_eq!(bits(&got.beta), bits(&want.beta));
        // The mask did something: the unmasked gradient differs.
        let unmasked = backward(&g, &y, m, s, &gamma, &beta, &dout);
        assert_ne!(bits(&unmasked.y), bits(&want.y));
    }

    impl BnGeom {
        /// The `hw`-long runs of channel `c`, one per image.
        fn runs(&self, c: usize) -> impl Iterator<Item = std::ops::Range<usize>> + use<> {
            let (channels, hw) = (self.channels, self.hw);
            (0..self.batch).map(move |b| (b * channels + c) * hw..(b * channels + c + 1) * hw)
        }
    }

    /// The loss L = Σ w ⊙ bn(y) in f64 by the definition.
    fn loss(g: &BnGeom, y: &[f64], gamma: &[f64], beta: &[f64], w: &[f64]) -> f64 {
        let mut total = 0.0;
        for c in 0..g.channels {
            let vals: Vec<(usize, f64)> = g.runs(c).flatten().map(|i| (i, y[i])).collect();
            let m = vals.iter().map(|v| v.1).sum::<f64>() / g.count();
            let var = vals.iter().map(|v| (v.1 - m).powi(2)).sum::<f64>() / g.count();
            for (i, v) in vals {
                total += w[i] * (gamma[c] * (v - m) / (var + 1e-5).sqrt() + beta[c]);
            }
        }
        total
    }

    #[test]
    fn forward_and_backward_match_the_definition() {
        let g = BnGeom {
            batch: 3,
            channels: 2,
            hw: 5,
        };
        let n = g.batch * g.channels * g.hw;
        let y: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
            .collect();
        let w: Vec<f32> = (0..n).map(|i| ((i * 13 % 17) as f32 - 8.0) / 5.0).collect();
        let (gamma, beta) = ([1.5f32, -0.5], [0.25f32, 2.0]);
        let f = forward(&g, &y, &gamma, &beta, 1e-5);
        // Each channel of the output has mean β and variance γ²·var/(var+ε).
        for c in 0..2 {
            let vals: Vec<f32> = g.runs(c).flat_map(|r| f.out[r].to_vec()).collect();
            let mean = vals.iter().sum::<f32>() / 15.0;
            assert!((mean - beta[c]).abs() < 1e-5);
            let var = vals.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 15.0;
            let want = gamma[c].powi(2) * f.var[c] / (f.var[c] + 1e-5);
            assert!((var - want).abs() < 1e-4, "{var} vs {want}");
        }
        let grads = backward(&g, &y, &f.mean, &f.inv_std, &gamma, &beta, &w);
        // Central differences of the f64 definition.
        let to64 = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        let (y64, g64, b64, w64) = (to64(&y), to64(&gamma), to64(&beta), to64(&w));
        let h = 1e-6;
        // Which input a difference moves: 0 = y, 1 = γ, 2 = β.
        let diff = |which: usize, i: usize| {
            let at = |step: f64| {
                let mut v = [y64.clone(), g64.clone(), b64.clone()];
                v[which][i] += step;
                loss(&g, &v[0], &v[1], &v[2], &w64)
            };
            (at(h) - at(-h)) / (2.0 * h)
        };
        for i in 0..n {
            let want = diff(0, i);
            assert!(
                (grads.y[i] as f64 - want).abs() < 1e-3,
                "dy[{i}]: {} vs {want}",
                grads.y[i]
            );
        }
        for c in 0..2 {
            assert!((grads.gamma[c] as f64 - diff(1, c)).abs() < 1e-3, "dγ[{c}]");
            assert!((grads.beta[c] as f64 - diff(2, c)).abs() < 1e-3, "dβ[{c}]");
        }
    }
}
