//! Extra loss terms an algorithm adds to the task loss, written on the flat
//! parameter vector with exact analytic gradients.
//!
//! The trainer adds each term's gradient to the backend's task-loss gradient
//! before the optimiser step, so FedProx, pFedGraph, Ditto, SFL or FedAMP
//! only say *what* they add, never how training works.
//!
//! Each term has two forms. The host form on flat vectors is the reference
//! and what the CPU backend runs (its f64 reductions in index order are
//! what every golden pins). The tensor form ([`ExtraLoss::on_device`], a
//! [`DeviceTerm`]) keeps the term's constant vectors on the training device
//! and adds its gradient with tensor operations, so on a GPU the
//! parameters and gradients never leave the device for a term (only the two
//! scalars of [`CosinePull`] are read back per step). A host form may also
//! take θ and the gradient cut into the trainer's tensors
//! ([`ExtraLoss::on_parts`], a [`PartsTerm`], with the flat form's bits):
//! the CPU trainer then adds it in the gradient's own buffers instead of
//! joining both into flat vectors every step.

use crate::trainer::upload_parts;
use burn::tensor::{Device, Tensor};
use fedweave_core::vecmath::{dot, dot_and_sq_norm_parts, dot_and_sq_norms_parts, norm};
use std::ops::Range;
use std::sync::OnceLock;

/// A differentiable term `R(θ)` added to the local loss.
pub trait ExtraLoss: Sync {
    /// Adds ∇R(θ) to `grad` and returns R(θ).
    fn add_value_and_grad(&self, theta: &[f32], grad: &mut [f32]) -> f64;

    /// The term as tensor operations on `device`, for parameters held as
    /// one rank-1 tensor per range of `parts` (the model layout's tensors):
    /// its constant vectors are uploaded here, once. `None` when the term
    /// has no tensor form; the trainer then runs the host form.
    fn on_device(&self, _parts: &[Range<usize>], _device: &Device) -> Option<Box<dyn DeviceTerm>> {
        None
    }

    /// The host form on θ and the gradient as the trainer holds them (one
    /// slice per tensor), when the term has one: the CPU trainer then adds
    /// it in the gradient's own buffers instead of joining both into flat
    /// vectors and splitting the gradient again. `None` (the default): the
    /// trainer joins them for [`add_value_and_grad`](Self::add_value_and_grad).
    fn on_parts(&self) -> Option<&dyn PartsTerm> {
        None
    }
}

/// An [`ExtraLoss`]'s host form on vectors cut into consecutive parts.
pub trait PartsTerm {
    /// Adds ∇R(θ) to `grad`, both cut into the same consecutive parts, with
    /// the bits of [`ExtraLoss::add_value_and_grad`] on the joined vectors.
    fn add_grad_parts(&self, theta: &[&[f32]], grad: &mut [&mut [f32]]);
}

/// An [`ExtraLoss`] whose constants live on the training device.
pub trait DeviceTerm {
    /// Adds ∇R(θ) to `grad`; both are split like the `parts` the term was
    /// made for.
    fn add_grad(&self, theta: &[Tensor<1>], grad: &mut [Tensor<1>]);
}

/// `values` cut into `parts`, each uploaded to `device`.
fn upload(values: &[f32], parts: &[Range<usize>], device: &Device) -> Vec<Tensor<1>> {
    upload_parts(values, parts.iter().cloned(), device)
}

/// Σ over parts of ⟨a_k, b_k⟩, as a rank-1 tensor of one element.
fn dot_parts(a: &[Tensor<1>], b: &[Tensor<1>]) -> Tensor<1> {
    let sums: Vec<Tensor<1>> = a
        .iter()
        .zip(b)
        .map(|(x, y)| x.clone().mul(y.clone()).sum())
        .collect();
    Tensor::cat(sums, 0).sum()
}

/// [`Proximal`] on the device: `g += μ (θ − anchor)`.
struct DeviceProximal {
    mu: f32,
    anchor: Vec<Tensor<1>>,
}

impl DeviceTerm for DeviceProximal {
    fn add_grad(&self, theta: &[Tensor<1>], grad: &mut [Tensor<1>]) {
        for ((g, t), a) in grad.iter_mut().zip(theta).zip(&self.anchor) {
            *g = g.clone().add(t.clone().sub(a.clone()).mul_scalar(self.mu));
        }
    }
}

/// [`Linear`] on the device: `g += v`.
struct DeviceLinear {
    coef: Vec<Tensor<1>>,
}

impl DeviceTerm for DeviceLinear {
    fn add_grad(&self, _theta: &[Tensor<1>], grad: &mut [Tensor<1>]) {
        for (g, v) in grad.iter_mut().zip(&self.coef) {
            *g = g.clone().add(v.clone());
        }
    }
}

/// [`CosinePull`] on the device; ‖target‖ (or 1) is computed once on the
/// host, ‖θ‖² and ⟨t, θ⟩ on the device and read back as two scalars.
struct DeviceCosinePull {
    coef: f32,
    target: Vec<Tensor<1>>,
    target_norm: f64,
}

impl DeviceTerm for DeviceCosinePull {
    fn add_grad(&self, theta: &[Tensor<1>], grad: &mut [Tensor<1>]) {
        let k = self.target_norm;
        let both = Tensor::cat(
            vec![dot_parts(theta, theta), dot_parts(&self.target, theta)],
            0,
        );
        let data = both.into_data();
        let &[nt2, inner] = data.as_slice::<f32>().expect("two f32 scalars") else {
            unreachable!("two dot products make two scalars");
        };
        let (nt, inner) = ((nt2 as f64).sqrt(), inner as f64);
        if nt == 0.0 || k == 0.0 {
            return;
        }
        let a = (self.coef as f64 / (k * nt)) as f32;
        let b = (self.coef as f64 * inner / (k * nt * nt * nt)) as f32;
        for ((g, t), x) in grad.iter_mut().zip(&self.target).zip(theta) {
            *g = g
                .clone()
                .add(t.clone().mul_scalar(a))
                .sub(x.clone().mul_scalar(b));
        }
    }
}

/// The proximal term `μ/2 · ‖θ − anchor‖²` (FedProx, Ditto, SFL, FedAMP).
#[derive(Clone, Debug)]
pub struct Proximal<'a> {
    /// μ.
    pub mu: f32,
    /// The model to stay close to.
    pub anchor: &'a [f32],
}

impl ExtraLoss for Proximal<'_> {
    fn add_value_and_grad(&self, theta: &[f32], grad: &mut [f32]) -> f64 {
        let mut value = 0.0f64;
        for ((g, t), a) in grad.iter_mut().zip(theta).zip(self.anchor) {
            let d = t - a;
            *g += self.mu * d;
            value += (d as f64) * (d as f64);
        }
        0.5 * self.mu as f64 * value
    }

    fn on_device(&self, parts: &[Range<usize>], device: &Device) -> Option<Box<dyn DeviceTerm>> {
        Some(Box::new(DeviceProximal {
            mu: self.mu,
            anchor: upload(self.anchor, parts, device),
        }))
    }
}

/// The linear term `⟨v, θ⟩`, whose gradient is the constant `v`: the
/// smallest hook that shifts every local gradient by a fixed vector.
/// SCAFFOLD's drift correction (v = c − c_i) and FedDyn's dynamic
/// regulariser (v = −h_i, the client's running gradient state) are this
/// term.
#[derive(Clone, Debug)]
pub struct Linear<'a> {
    /// v.
    pub coef: &'a [f32],
}

impl ExtraLoss for Linear<'_> {
    fn add_value_and_grad(&self, theta: &[f32], grad: &mut [f32]) -> f64 {
        for (g, v) in grad.iter_mut().zip(self.coef) {
            *g += v;
        }
        dot(self.coef, theta)
    }

    fn on_device(&self, parts: &[Range<usize>], device: &Device) -> Option<Box<dyn DeviceTerm>> {
        Some(Box::new(DeviceLinear {
            coef: upload(self.coef, parts, device),
        }))
    }
}

/// `coef · ⟨t, θ⟩ / (‖θ‖ · ‖t‖)` when `divide_by_target_norm`, else
/// `coef · ⟨t, θ⟩ / ‖θ‖`.
///
/// pFedGraph's paper pulls θ toward its mixed model with `coef = −λ` and the
/// cosine form; its authors' code adds `+λ·⟨c, θ⟩/‖θ‖` with `c` the mix of
/// normalised models — both are this term with different arguments.
#[derive(Clone, Debug)]
pub struct CosinePull<'a> {
    coef: f32,
    target: &'a [f32],
    /// ‖t‖, or 1 without the division (set at once). The target is fixed
    /// for a round, so ‖t‖ is learnt once, in the first step's pass over
    /// t and θ (a pass of its own per client and round was ~1 % of a
    /// pFedGraph round).
    target_norm: OnceLock<f64>,
}

impl<'a> CosinePull<'a> {
    /// The term with signed coefficient `coef` (negative = pull toward
    /// `target`), dividing by ‖target‖ (the true cosine) or not (the
    /// code's normalised form).
    pub fn new(coef: f32, target: &'a [f32], divide_by_target_norm: bool) -> Self {
        let target_norm = OnceLock::new();
        if !divide_by_target_norm {
            target_norm.get_or_init(|| 1.0);
        }
        Self {
            coef,
            target,
            target_norm,
        }
    }

    /// ‖target‖ (or 1), for the device form, which has no pass to share.
    fn target_norm(&self) -> f64 {
        *self.target_norm.get_or_init(|| norm(self.target))
    }
}

impl CosinePull<'_> {
    /// Adds the gradient on the parts and returns the term's value (0 when
    /// θ or the target is zero).
    fn add_on_parts(&self, theta: &[&[f32]], grad: &mut [&mut [f32]]) -> f64 {
        // One pass for the sums, with the bits of `dot(t, θ)`, `norm(θ)`
        // and (the first time) `norm(t)`.
        let (inner, sq, k) = match self.target_norm.get() {
            Some(&k) => {
                let (inner, sq) = dot_and_sq_norm_parts(self.target, theta);
                (inner, sq, k)
            }
            None => {
                let (inner, sq, sq_t) = dot_and_sq_norms_parts(self.target, theta);
                (inner, sq, *self.target_norm.get_or_init(|| sq_t.sqrt()))
            }
        };
        let nt = sq.sqrt();
        if nt == 0.0 || k == 0.0 {
            return 0.0;
        }
        // ∂/∂θ ⟨t,θ⟩/‖θ‖ = t/‖θ‖ − ⟨t,θ⟩ θ/‖θ‖³
        let a = (self.coef as f64 / (k * nt)) as f32;
        let b = (self.coef as f64 * inner / (k * nt * nt * nt)) as f32;
        let mut start = 0;
        for (g, x) in grad.iter_mut().zip(theta) {
            pull(g, &self.target[start..start + x.len()], x, a, b);
            start += x.len();
        }
        self.coef as f64 * inner / (k * nt)
    }
}

fedweave_core::wide! {
    /// g ← g + a·t − b·x, element by element.
    fn pull(g: &mut [f32], t: &[f32], x: &[f32], a: f32, b: f32) => pull_body
}

#[inline(always)]
fn pull_body(g: &mut [f32], t: &[f32], x: &[f32], a: f32, b: f32) {
    for ((g, t), x) in g.iter_mut().zip(t).zip(x) {
        *g += a * t - b * x;
    }
}

impl ExtraLoss for CosinePull<'_> {
    fn add_value_and_grad(&self, theta: &[f32], grad: &mut [f32]) -> f64 {
        self.add_on_parts(&[theta], &mut [grad])
    }

    fn on_device(&self, parts: &[Range<usize>], device: &Device) -> Option<Box<dyn DeviceTerm>> {
        Some(Box::new(DeviceCosinePull {
            coef: self.coef,
            target: upload(self.target, parts, device),
            target_norm: self.target_norm(),
        }))
    }

    fn on_parts(&self) -> Option<&dyn PartsTerm> {
        Some(self)
    }
}

impl PartsTerm for CosinePull<'_> {
    fn add_grad_parts(&self, theta: &[&[f32]], grad: &mut [&mut [f32]]) {
        self.add_on_parts(theta, grad);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Central finite differences of `term` at `theta`, in f64 on a copy.
    fn finite_diff(term: &dyn ExtraLoss, theta: &[f32]) -> Vec<f64> {
        (0..theta.len())
            .map(|i| {
                let h = 1e-2f32;
                let mut plus = theta.to_vec();
                plus[i] += h;
                let mut minus = theta.to_vec();
                minus[i] -= h;
                let mut sink = vec![0.0; theta.len()];
                let fp = term.add_value_and_grad(&plus, &mut sink);
                let fm = term.add_value_and_grad(&minus, &mut sink);
                (fp - fm) / (2.0 * h as f64)
            })
            .collect()
    }

    proptest! {
        #[test]
        fn cosine_gradient_matches_finite_differences(
            theta in prop::collection::vec(0.5f32..3.0, 6),
            target in prop::collection::vec(-3.0f32..3.0, 6),
            coef in -1.0f32..1.0,
            normed in any::<bool>(),
        ) {
            let term = CosinePull::new(coef, &target, normed);
            let mut grad = vec![0.0f32; 6];
            term.add_value_and_grad(&theta, &mut grad);
            let fd = finite_diff(&term, &theta);
            for (g, f) in grad.iter().zip(&fd) {
                prop_assert!((*g as f64 - f).abs() < 2e-3 * (1.0 + f.abs()), "{grad:?} vs {fd:?}");
            }
        }

        #[test]
        fn proximal_gradient_matches_finite_differences(
            theta in prop::collection::vec(-3.0f32..3.0, 5),
            anchor in prop::collection::vec(-3.0f32..3.0, 5),
        ) {
            let term = Proximal { mu: 0.3, anchor: &anchor };
            let mut grad = vec![0.0f32; 5];
            term.add_value_and_grad(&theta, &mut grad);
            let fd = finite_diff(&term, &theta);
            for (g, f) in grad.iter().zip(&fd) {
                prop_assert!((*g as f64 - f).abs() < 1e-3);
            }
        }
    }

    /// Each term's tensor form adds the host form's gradient, for a vector
    /// cut into uneven parts.
    #[test]
    fn tensor_forms_add_the_host_gradient() {
        let n = 23;
        let theta: Vec<f32> = (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) / 4.0).collect();
        let other: Vec<f32> = (0..n).map(|i| ((i * 13 % 7) as f32 - 3.0) / 2.0).collect();
        let start: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
        let parts = [0..5, 5..6, 6..17, 17..23];
        let device = Device::flex();
        let terms: Vec<Box<dyn ExtraLoss>> = vec![
            Box::new(Proximal {
                mu: 0.3,
                anchor: &other,
            }),
            Box::new(Linear { coef: &other }),
            Box::new(CosinePull::new(-0.7, &other, true)),
            Box::new(CosinePull::new(0.4, &other, false)),
        ];
        for term in &terms {
            let mut want = start.clone();
            term.add_value_and_grad(&theta, &mut want);
            let device_term = term.on_device(&parts, &device).expect("a tensor form");
            let mut grad = upload(&start, &parts, &device);
            device_term.add_grad(&upload(&theta, &parts, &device), &mut grad);
            let got: Vec<f32> = grad
                .into_iter()
                .flat_map(|t| t.into_data().try_to_vec::<f32>().unwrap())
                .collect();
            assert_eq!(got.len(), n);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
            }
        }
        // A zero θ leaves the cosine's gradient alone, as on the host.
        let zero = vec![0.0f32; n];
        let cos = CosinePull::new(1.0, &other, true);
        let mut grad = upload(&start, &parts, &device);
        cos.on_device(&parts, &device)
            .unwrap()
            .add_grad(&upload(&zero, &parts, &device), &mut grad);
        let got: Vec<f32> = grad
            .into_iter()
            .flat_map(|t| t.into_data().try_to_vec::<f32>().unwrap())
            .collect();
        assert_eq!(got, start);
    }

    #[test]
    fn linear_term_adds_its_vector() {
        let v = [0.5f32, -2.0, 1.0];
        let term = Linear { coef: &v };
        let mut g = [1.0f32, 1.0, 1.0];
        let value = term.add_value_and_grad(&[2.0, 1.0, -1.0], &mut g);
        // ⟨v, θ⟩ = 1 − 2 − 1 = −2; the gradient gains v.
        assert_eq!(value, -2.0);
        assert_eq!(g, [1.5, -1.0, 2.0]);
        let fd = finite_diff(&term, &[2.0, 1.0, -1.0]);
        for (f, v) in fd.iter().zip(&v) {
            assert!((f - *v as f64).abs() < 1e-4, "{fd:?}");
        }
    }

    #[test]
    fn cosine_value_is_the_cosine() {
        let term = CosinePull::new(-2.0, &[0.0, 3.0], true);
        let mut g = [0.0f32; 2];
        let v = term.add_value_and_grad(&[1.0, 1.0], &mut g);
        assert!((v + 2.0 * std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-6);
        // Pull toward the target: the descent direction (−g) increases θ₂ and decreases θ₁.
        assert!(g[1] < 0.0 && g[0] > 0.0);
    }
}
