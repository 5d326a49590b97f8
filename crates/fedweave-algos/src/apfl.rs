//! APFL (Deng, Kamani, Mahdavi 2020, "Adaptive Personalized Federated
//! Learning"): each client mixes a global and a personal model with its
//! own learned weight α.
//!
//! Client i keeps the global model's local copy w, its personal model v and
//! α ∈ [0, 1] (initially `alpha_init` = 0.5). Its personalised model is the
//! mixture v̄ = αv + (1 − α)w. Each local step draws one mini-batch ξ and,
//! from the step's starting values (the paper's Algorithm 1):
//! - w ← w − η∇f(w; ξ)  (plain local SGD, as in FedAvg);
//! - v ← v − η∇_v f(v̄; ξ) = v − η·α∇f(v̄; ξ)  (the gradient of the
//!   mixture's loss with respect to v);
//! - α ← clip(α − η_α·∇_α f(v̄; ξ), 0, 1) with ∇_α f(v̄) = ⟨v − w, ∇f(v̄)⟩
//!   (η_α = `alpha_lr`, by default the local learning rate, as the paper
//!   and PFLlib use one step size).
//!
//! This is the paper's update, not PFLlib's: PFLlib trains v on its own
//! loss f(v) and updates α with ⟨v − w, α∇f(v) + (1 − α)∇f(w)⟩ + 0.02α
//! (METHODS.md §6), a simplification that never evaluates the mixture
//! during training.
//!
//! Graph rule: FedAvg's on the w's (every row of W = p; synchronised every
//! round, the DPFL setting τ = 1); the average replaces every client's w,
//! absent clients' included, which changes their mixture too.
//! Evaluation: v̄ after local training (a computed model); its batch-norm
//! statistics are those gathered by the forward passes of the mixture during
//! training.
//!
//! Both models train with the `[train]` optimiser (learning rate, momentum,
//! weight decay), a fresh one each round; α's step is plain gradient
//! descent.

use crate::Checked;
use crate::contract::holds_model;
use crate::fedavg::average_to_all;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{
    AlgoError, Algorithm, ClientCx, Env, Info, Model, ModelRef, ParamError, RoundOutcome, Trained,
};
use fedweave_nn::{ExtraLoss, LocalTrainer};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::sync::Mutex;

params! {
    /// APFL's parameters.
    pub struct ApflParams {
        /// α of every client before round 1.
        pub alpha_init: f64 = 0.5,
        /// η_α, the step size of α (unset: the `[train]` learning rate).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub alpha_lr: Option<f64> = None,
    }
}

impl Validate for ApflParams {
    fn validate(&self) -> Result<(), ParamError> {
        if !(0.0..=1.0).contains(&self.alpha_init) {
            return Err(ParamError::new(
                "alpha_init",
                format!("must be in [0, 1], got {}", self.alpha_init),
            ));
        }
        if let Some(lr) = self.alpha_lr {
            non_negative("alpha_lr", lr)?;
        }
        Ok(())
    }
}

/// APFL.
pub struct Apfl {
    params: ApflParams,
}

/// An APFL client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ApflClient {
    /// w: the last global model received, then its locally trained copy,
    /// with its own batch-norm statistics.
    pub global: Model,
    /// v, with the batch-norm statistics of the mixture v̄ (its forward
    /// passes run on v̄).
    pub personal: Model,
    /// The mixing weight α ∈ [0, 1].
    pub alpha: f64,
}

/// αv + (1 − α)w, element-wise in f32.
pub fn mixture(alpha: f64, v: &[f32], w: &[f32], out: &mut [f32]) {
    let a = alpha as f32;
    let b = 1.0 - a;
    for ((o, x), y) in out.iter_mut().zip(v).zip(w) {
        *o = a * x + b * y;
    }
}

/// One step of α: clip(α − η_α·⟨v − w, g⟩, 0, 1), with g = ∇f(v̄) the
/// gradient of the loss at the mixture (the chain rule through
/// v̄ = αv + (1 − α)w gives ∂f/∂α = ⟨v − w, g⟩).
pub fn alpha_step(alpha: f64, lr: f64, alpha_grad: f64) -> f64 {
    (alpha - lr * alpha_grad).clamp(0.0, 1.0)
}

/// The chain rule from the mixture back to v, applied to the gradient the
/// trainer computed at v̄: records ∂f/∂α = ⟨v − w, ∇f(v̄)⟩ and leaves
/// ∂f/∂v = α∇f(v̄) as the gradient. As an [`ExtraLoss`] it is the term
/// (α − 1)·f(v̄) of the same mini-batch, whose gradient (α − 1)∇f(v̄) turns
/// the task gradient into α∇f(v̄); its value is not computed (the trainer
/// does not use it).
struct ThroughMixture<'a> {
    alpha: f32,
    v: &'a [f32],
    w: &'a [f32],
    alpha_grad: Mutex<f64>,
}

impl ExtraLoss for ThroughMixture<'_> {
    fn add_value_and_grad(&self, _mixed: &[f32], grad: &mut [f32]) -> f64 {
        let mut dot = 0.0f64;
        for ((g, v), w) in grad.iter_mut().zip(self.v).zip(self.w) {
            dot += f64::from(v - w) * f64::from(*g);
            *g *= self.alpha;
        }
        *self.alpha_grad.lock().unwrap_or_else(|e| e.into_inner()) = dot;
        0.0
    }
}

holds_model!(ApflClient: personal);

impl Algorithm for Apfl {
    const NAMES: &'static [Info] = &[Info {
        name: "apfl",
        summary: "FedAvg on a global copy w (every row of W = p); each client trains a personal v through the mixture αv+(1−α)w and learns α by its gradient ⟨v−w, ∇f(mix)⟩ (alpha_init = 0.5, clipped to [0,1]; the paper's update); evaluates the mixture",
        reference: "Deng, Kamani, Mahdavi 2020",
    }];
    type Params = ApflParams;
    type Client = ApflClient;
    type Server = ();
    /// The global model.
    type Down = Vec<f32>;
    /// The trained global copy.
    type Up = Vec<f32>;

    fn new(_: &'static str, params: Checked<ApflParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_client(&self, env: &Env, _: usize) -> ApflClient {
        ApflClient {
            global: env.initial_model(),
            personal: env.initial_model(),
            alpha: self.params.alpha_init,
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut ApflClient,
    ) -> Trained<Vec<f32>> {
        let n = cx.data.train.len();
        if n == 0 {
            return Trained {
                up: state.global.params.clone(),
                train_loss: 0.0,
            };
        }
        let lr = env.train.lr;
        let alpha_lr = self.params.alpha_lr.unwrap_or(f64::from(lr));
        // w's session draws the batches; v's session sees the same ones.
        let (mut on_w, mut sampler) = cx.session(env, &state.global);
        let mut on_v = LocalTrainer::new(
            env.spec,
            env.spec.device(),
            &state.personal.params,
            &state.personal.buffers,
            env.train.sgd(),
            None,
        );
        on_v.augment_like(&on_w);
        let mut w = state.global.params.clone();
        let mut v = state.personal.params.clone();
        let mut mixed = vec![0.0f32; v.len()];
        let mut alpha = state.alpha;
        let steps = env.train.steps_for(n);
        let mut loss = 0.0;
        for _ in 0..steps {
            let batch = sampler.next_batch(&mut cx.rng);
            // v's step: the gradient at v̄, taken from v.
            mixture(alpha, &v, &w, &mut mixed);
            on_v.load_params(&mixed);
            let chain = ThroughMixture {
                alpha: alpha as f32,
                v: &v,
                w: &w,
                alpha_grad: Mutex::new(0.0),
            };
            loss += on_v.loss_and_grad(&cx.data.train, batch, &[&chain]);
            let alpha_grad = chain
                .alpha_grad
                .into_inner()
                .unwrap_or_else(|e| e.into_inner());
            on_v.load_params(&v);
            on_v.step(&[], lr);
            // w's step: plain local SGD on the same batch.
            on_w.loss_and_grad(&cx.data.train, batch, &[]);
            on_w.step(&[], lr);
            // α's step, from the same starting values.
            alpha = alpha_step(alpha, alpha_lr, alpha_grad);
            on_v.read_params(&mut v);
            on_w.read_params(&mut w);
        }
        on_v.store(&mut state.personal.params, &mut state.personal.buffers);
        on_w.store(&mut state.global.params, &mut state.global.buffers);
        state.alpha = alpha;
        Trained {
            up: state.global.params.clone(),
            train_loss: loss / steps as f64,
        }
    }

    fn aggregate(
        &self,
        env: &Env,
        _: &mut (),
        _: usize,
        uploads: &[(usize, Vec<f32>)],
    ) -> RoundOutcome<Vec<f32>> {
        average_to_all(env, uploads)
    }

    fn receive(&self, _: &Env, state: &mut ApflClient, global: Vec<f32>) {
        state.global.params = global;
    }

    fn personalized<'c>(&self, state: &'c ApflClient) -> ModelRef<'c> {
        let mut mixed = vec![0.0f32; state.personal.params.len()];
        mixture(
            state.alpha,
            &state.personal.params,
            &state.global.params,
            &mut mixed,
        );
        ModelRef {
            params: Cow::Owned(mixed),
            buffers: &state.personal.buffers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpha_steps_against_the_gradient_and_stays_in_the_unit_interval() {
        // v − w = (1, 1), g = (0.5, −1): ⟨v − w, g⟩ = −0.5, so with η = 0.1
        // α = 0.5 → 0.5 + 0.05 = 0.55.
        let chain = ThroughMixture {
            alpha: 0.5,
            v: &[1.0, 2.0],
            w: &[0.0, 1.0],
            alpha_grad: Mutex::new(f64::NAN),
        };
        let mut g = [0.5f32, -1.0];
        chain.add_value_and_grad(&[0.5, 1.5], &mut g);
        let dot = *chain.alpha_grad.lock().unwrap();
        assert_eq!(dot, -0.5);
        // The gradient left for v is α·g.
        assert_eq!(g, [0.25, -0.5]);
        assert!((alpha_step(0.5, 0.1, dot) - 0.55).abs() < 1e-15);
        // Clipped at both ends.
        assert_eq!(alpha_step(0.9, 1.0, dot), 1.0);
        assert_eq!(alpha_step(0.1, 1.0, 0.5), 0.0);
        assert_eq!(alpha_step(0.0, 1.0, 0.0), 0.0);
    }

    /// One full-batch step of plain SGD on a small MLP: α moves by
    /// −η_α·⟨v − w, ∇L(v̄)⟩ with the gradient computed apart, which equals
    /// −η_α·∂L(v̄)/∂α by finite differences of the mixture's loss along α;
    /// v moves by −η·α∇L(v̄).
    #[test]
    fn one_step_follows_the_derivative_of_the_mixture_loss() {
        use fedweave_core::{Purpose, rng_stream};
        use fedweave_nn::{LocalData, ModelKind, ModelSpec, TrainConfig, evaluate};
        let spec = ModelSpec::new(ModelKind::MLP, &[4], 2).unwrap();
        let init = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        let x: Vec<f32> = (0..32).map(|k| ((k * 7 % 11) as f32 - 5.0) / 4.0).collect();
        let y: Vec<u32> = (0..8).map(|k| k % 2).collect();
        let idx: Vec<usize> = (0..8).collect();
        let data = LocalData::new(&x, &y, &idx);
        let train = TrainConfig {
            lr: 0.1,
            momentum: 0.0,
            weight_decay: 0.0,
            batch_size: 8,
            iterations: 1,
            epochs: 0,
        };
        let env = Env {
            spec: &spec,
            train: &train,
            sizes: &[8],
            init: &init,
            relation: None,
            label_counts: &[],
            kernels: fedweave_core::pairwise::Kernels::cpu(),
        };
        let algo = Apfl {
            params: ApflParams {
                alpha_lr: Some(0.05),
                ..ApflParams::default()
            },
        };
        let mut state = algo.init_client(&env, 0);
        let mut rng = rng_stream(2, 0, 0, Purpose::ModelInit);
        state.personal.params = spec.init(&mut rng);
        let (v, w, alpha) = (
            state.personal.params.clone(),
            state.global.params.clone(),
            state.alpha,
        );
        let loss_at = |a: f64| {
            let mut m = vec![0.0; v.len()];
            mixture(a, &v, &w, &mut m);
            evaluate(&spec, &m, &[], &data).mean_loss()
        };
        let h = 1e-3;
        let dl_dalpha = (loss_at(alpha + h) - loss_at(alpha - h)) / (2.0 * h);
        // ∇L at the mixture, from a separate session.
        let mut mixed = vec![0.0; v.len()];
        mixture(alpha, &v, &w, &mut mixed);
        let mut probe = LocalTrainer::new(&spec, spec.device(), &mixed, &[], train.sgd(), None);
        let all: Vec<usize> = (0..8).collect();
        probe.loss_and_grad(&data, &all, &[]);
        let mut g = vec![0.0; v.len()];
        probe.read_grad(&mut g);

        let mut cx = ClientCx {
            client: 0,
            round: 1,
            data: crate::ClientData {
                train: data,
                val: data,
            },
            rng: rng_stream(3, 1, 0, Purpose::Batches),
            origin: None,
            batch: None,
        };
        algo.local_round(&env, &mut cx, &mut state);
        // By hand: α − η_α·⟨v − w, ∇L(v̄)⟩ with the gradient from the probe.
        let dot: f64 = v
            .iter()
            .zip(&w)
            .zip(&g)
            .map(|((a, b), gk)| f64::from(a - b) * f64::from(*gk))
            .sum();
        let expected = alpha - 0.05 * dot;
        assert!(
            (state.alpha - expected).abs() < 1e-9,
            "α {alpha} → {}, expected {expected}",
            state.alpha
        );
        // ⟨v − w, ∇L(v̄)⟩ is ∂L(v̄)/∂α (central differences in f32: to 1 %).
        assert!(
            (dot - dl_dalpha).abs() < 0.01 * dl_dalpha.abs(),
            "⟨v − w, ∇L⟩ = {dot}, finite differences {dl_dalpha}"
        );
        assert!((state.alpha - alpha).abs() > 1e-4, "α moved");
        for k in 0..v.len() {
            let want = v[k] - 0.1 * (alpha as f32 * g[k]);
            assert!((state.personal.params[k] - want).abs() < 1e-6, "v[{k}]");
        }
        // w took a plain step from w: it moved, v̄ is the new mixture.
        assert_ne!(state.global.params, w);
        let scored = algo.personalized(&state);
        let mut want = vec![0.0; v.len()];
        mixture(
            state.alpha,
            &state.personal.params,
            &state.global.params,
            &mut want,
        );
        assert_eq!(&*scored.params, want.as_slice());
    }

    #[test]
    fn the_mixture_interpolates() {
        let mut out = [0.0f32; 2];
        mixture(0.25, &[4.0, 0.0], &[0.0, 8.0], &mut out);
        assert_eq!(out, [1.0, 6.0]);
        mixture(1.0, &[4.0, 0.0], &[0.0, 8.0], &mut out);
        assert_eq!(out, [4.0, 0.0]);
    }
}
