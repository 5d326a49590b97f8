//! A small server-side hypernetwork, shared by pFedHN and pFedLA: a client
//! embedding, a chain of fully connected layers with ReLUs and a linear
//! head, with its forward pass, the vector–Jacobian product
//! (∂out/∂φ)ᵀ·v that the hypernetwork methods step along, and their SGD.
//!
//! Everything is host `f32` with `f64` dot products in index order: one
//! client's pass is a few hundred thousand multiply–adds (pFedHN's head, the
//! largest piece, is hidden × model size), small next to one local training
//! step, and the fixed order makes results identical at any thread count.
//!
//! Layout of the flat parameter vector φ: the embedding table (rows ×
//! embed), then every linear layer's weight (out × in, row-major) and bias,
//! the head last.

use fedweave_core::vecmath::{axpy, dot};
use rand::Rng;
use serde::{Deserialize, Serialize};

/// The shape of a hypernetwork.
#[derive(Default, Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Shape {
    /// Rows of the embedding table (clients, or 1 for a per-client network).
    pub rows: usize,
    /// Embedding width.
    pub embed: usize,
    /// Widths of the hidden linear layers, in order.
    pub hidden: Vec<usize>,
    /// Whether a ReLU follows the last hidden layer (pFedLA) or not
    /// (pFedHN: the head reads the last linear layer's output).
    pub relu_last: bool,
    /// Head outputs.
    pub out: usize,
}

impl Shape {
    /// (in, out) of every linear layer, the head last.
    fn linears(&self) -> Vec<(usize, usize)> {
        let mut dims = vec![self.embed];
        dims.extend(&self.hidden);
        let mut l: Vec<(usize, usize)> = dims.windows(2).map(|w| (w[0], w[1])).collect();
        l.push((*dims.last().unwrap_or(&self.embed), self.out));
        l
    }

    /// Offset of every linear layer's weight in φ, and φ's length.
    fn offsets(&self) -> (Vec<usize>, usize) {
        let mut at = self.rows * self.embed;
        let mut offs = Vec::new();
        for (i, o) in self.linears() {
            offs.push(at);
            at += i * o + o;
        }
        (offs, at)
    }

    /// Offset of the head's weight and of its bias.
    pub fn head_offsets(&self) -> (usize, usize) {
        let (offs, _) = self.offsets();
        let w = *offs.last().unwrap_or(&0);
        let (i, o) = *self.linears().last().unwrap_or(&(0, 0));
        (w, w + i * o)
    }
}

/// A hypernetwork: its shape, parameters and SGD momentum.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HyperNet {
    /// The shape.
    pub shape: Shape,
    /// φ.
    #[serde(with = "fedweave_core::stash::vector")]
    pub params: Vec<f32>,
    /// SGD momentum buffer (empty until the first step with momentum).
    #[serde(with = "fedweave_core::stash::vector")]
    momentum: Vec<f32>,
}

/// One forward pass's activations: the input of every linear layer (the
/// embedding first) and the pre-activations of the hidden layers.
pub struct Pass {
    inputs: Vec<Vec<f32>>,
    pre: Vec<Vec<f32>>,
}

/// SGD settings of a hypernetwork step.
#[derive(Clone, Copy, Debug)]
pub struct Sgd {
    /// Step size.
    pub lr: f32,
    /// Momentum (0: plain SGD).
    pub momentum: f32,
    /// L2 weight decay, added after clipping (PyTorch's order).
    pub weight_decay: f32,
    /// Clip the gradient's norm to this (`f32::INFINITY`: no clipping).
    pub clip: f32,
}

impl HyperNet {
    /// PyTorch's default initialisation: embeddings N(0, 1), linear weights
    /// and biases U(−1/√in, 1/√in).
    pub fn new(shape: Shape, rng: &mut impl Rng) -> Self {
        let (offs, len) = shape.offsets();
        let mut params = vec![0.0f32; len];
        for x in &mut params[..shape.rows * shape.embed] {
            *x = rand_distr::Distribution::sample(&rand_distr::StandardNormal, rng);
        }
        for ((i, o), off) in shape.linears().into_iter().zip(offs) {
            let bound = 1.0 / (i.max(1) as f32).sqrt();
            for x in &mut params[off..off + i * o + o] {
                *x = rng.random_range(-bound..=bound);
            }
        }
        Self {
            shape,
            params,
            momentum: Vec::new(),
        }
    }

    /// The embedding of `row`.
    pub fn embedding(&self, row: usize) -> &[f32] {
        let e = self.shape.embed;
        &self.params[row * e..(row + 1) * e]
    }

    /// The head's weight (out × hidden) and bias, to initialise them.
    pub fn head_mut(&mut self) -> (&mut [f32], &mut [f32]) {
        let (w, b) = self.shape.head_offsets();
        let (head_w, bias) = self.params[w..].split_at_mut(b - w);
        (head_w, bias)
    }

    /// The forward pass for embedding `row` up to the head's input.
    pub fn pass(&self, row: usize) -> Pass {
        let linears = self.shape.linears();
        let (offs, _) = self.shape.offsets();
        let hidden = linears.len() - 1;
        let mut inputs = vec![self.embedding(row).to_vec()];
        let mut pre = Vec::with_capacity(hidden);
        for l in 0..hidden {
            let z = self.linear(offs[l], linears[l], &inputs[l]);
            let relu = l + 1 < hidden || self.shape.relu_last;
            inputs.push(
                z.iter()
                    .map(|x| if relu { x.max(0.0) } else { *x })
                    .collect(),
            );
            pre.push(z);
        }
        Pass { inputs, pre }
    }

    /// The head's output for a pass.
    pub fn output(&self, pass: &Pass) -> Vec<f32> {
        let linears = self.shape.linears();
        let (offs, _) = self.shape.offsets();
        let last = linears.len() - 1;
        self.linear(offs[last], linears[last], &pass.inputs[last])
    }

    /// W x + b for the linear layer at `off` of shape `(i, o)`.
    fn linear(&self, off: usize, (i, o): (usize, usize), x: &[f32]) -> Vec<f32> {
        let w = &self.params[off..off + i * o];
        let b = &self.params[off + i * o..off + i * o + o];
        (0..o)
            .map(|k| (dot(&w[k * i..(k + 1) * i], x) + b[k] as f64) as f32)
            .collect()
    }

    /// (∂out/∂φ)ᵀ·v for the pass of embedding `row`: the gradient of
    /// ⟨out, v⟩ with respect to φ (zero outside the row's embedding and the
    /// layers).
    pub fn backward(&self, row: usize, pass: &Pass, v: &[f32]) -> Vec<f32> {
        let linears = self.shape.linears();
        let (offs, len) = self.shape.offsets();
        let mut grad = vec![0.0f32; len];
        let hidden = linears.len() - 1;
        let mut g = v.to_vec();
        for l in (0..=hidden).rev() {
            let (i, o) = linears[l];
            let off = offs[l];
            let x = &pass.inputs[l];
            // dW = g xᵀ, db = g, dx = Wᵀ g.
            let mut dx = vec![0.0f32; i];
            for k in 0..o {
                if g[k] == 0.0 {
                    continue;
                }
                let gw = &mut grad[off + k * i..off + (k + 1) * i];
                axpy(g[k], x, gw);
                axpy(g[k], &self.params[off + k * i..off + (k + 1) * i], &mut dx);
            }
            grad[off + i * o..off + i * o + o].copy_from_slice(&g);
            if l > 0 {
                let relu = l < hidden || self.shape.relu_last;
                if relu {
                    for (d, z) in dx.iter_mut().zip(&pass.pre[l - 1]) {
                        if *z <= 0.0 {
                            *d = 0.0;
                        }
                    }
                }
            } else {
                let e = self.shape.embed;
                grad[row * e..(row + 1) * e].copy_from_slice(&dx);
            }
            g = dx;
        }
        grad
    }

    /// One SGD step along `grad`: clip its norm, add weight decay, momentum.
    pub fn step(&mut self, mut grad: Vec<f32>, sgd: Sgd) {
        let norm = dot(&grad, &grad).sqrt() as f32;
        if norm > sgd.clip {
            let s = sgd.clip / (norm + 1e-6);
            grad.iter_mut().for_each(|g| *g *= s);
        }
        if sgd.weight_decay != 0.0 {
            axpy(sgd.weight_decay, &self.params, &mut grad);
        }
        if sgd.momentum != 0.0 {
            if self.momentum.len() != grad.len() {
                self.momentum = vec![0.0; grad.len()];
            }
            for (b, g) in self.momentum.iter_mut().zip(&grad) {
                *b = sgd.momentum * *b + g;
            }
            axpy(-sgd.lr, &self.momentum, &mut self.params);
        } else {
            axpy(-sgd.lr, &grad, &mut self.params);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedweave_core::{Purpose, rng_stream};

    /// ⟨out(φ), v⟩ in f64.
    fn objective(net: &HyperNet, row: usize, v: &[f32]) -> f64 {
        dot(&net.output(&net.pass(row)), v)
    }

    /// The vector–Jacobian product against central finite differences, for
    /// both ReLU placements, on every parameter the row reaches.
    #[test]
    fn backward_matches_finite_differences() {
        for relu_last in [false, true] {
            let shape = Shape {
                rows: 3,
                embed: 2,
                hidden: vec![5, 4],
                relu_last,
                out: 6,
            };
            let mut rng = rng_stream(4, 0, 0, Purpose::Algorithm);
            let net = HyperNet::new(shape, &mut rng);
            let v: Vec<f32> = (0..6).map(|k| (k as f32 * 0.7).sin()).collect();
            let row = 1;
            let grad = net.backward(row, &net.pass(row), &v);
            let h = 1e-3f32;
            let mut checked = 0;
            for (p, &analytic) in grad.iter().enumerate() {
                let (mut hi, mut lo) = (net.clone(), net.clone());
                hi.params[p] += h;
                lo.params[p] -= h;
                let fd = (objective(&hi, row, &v) - objective(&lo, row, &v)) / (2.0 * h as f64);
                let tol = 2e-3 * fd.abs().max(1.0);
                assert!(
                    (fd - analytic as f64).abs() < tol,
                    "relu_last {relu_last}, φ[{p}]: finite difference {fd} vs {analytic}"
                );
                checked += usize::from(analytic != 0.0);
            }
            // Other rows' embeddings get nothing; most of the rest does.
            assert!(grad[..2].iter().chain(&grad[4..6]).all(|g| *g == 0.0));
            assert!(checked > net.params.len() / 2, "{checked}");
        }
    }

    #[test]
    fn step_clips_decays_and_keeps_momentum() {
        let shape = Shape {
            rows: 1,
            embed: 1,
            hidden: vec![],
            relu_last: false,
            out: 1,
        };
        // φ = [embedding, head weight, head bias].
        let mut net = HyperNet::new(shape, &mut rng_stream(1, 0, 0, Purpose::Algorithm));
        net.params = vec![1.0, 2.0, -1.0];
        let sgd = Sgd {
            lr: 0.1,
            momentum: 0.5,
            weight_decay: 0.1,
            clip: 5.0,
        };
        // ‖(0, 30, 40)‖ = 50 → clipped to (0, 3, 4); + 0.1 φ = (0.1, 3.2, 3.9).
        net.step(vec![0.0, 30.0, 40.0], sgd);
        let expect = [1.0 - 0.01, 2.0 - 0.32, -1.0 - 0.39];
        for (p, e) in net.params.iter().zip(expect) {
            assert!((p - e).abs() < 1e-6, "{:?}", net.params);
        }
        // Zero gradient: only decay and half the previous momentum.
        let before = net.params.clone();
        net.step(vec![0.0; 3], sgd);
        let b1 = 0.5 * 3.2 + 0.1 * before[1];
        assert!((net.params[1] - (before[1] - 0.1 * b1)).abs() < 1e-6);
    }
}
