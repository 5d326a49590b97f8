//! pFedMe (T. Dinh, Tran, Nguyen: "Personalized Federated Learning with
//! Moreau Envelopes", NeurIPS 2020): each client's personalised model
//! solves a proximal problem around its local copy of the global model.
//!
//! Client i keeps w (its local copy of the global model) and θ̃ (its
//! personalised model). Each local step, as PFLlib's `clientpFedMe` and the
//! paper's Algorithm 1 (METHODS.md §6), draws one mini-batch D and:
//! 1. takes K inner steps on the Moreau-envelope problem
//!    f(θ̃; D) + λ/2‖θ̃ − w‖²: θ̃ ← θ̃ − η_p(∇f(θ̃; D) + λ(θ̃ − w))
//!    ([`Proximal`] with anchor w, plain gradient descent with
//!    `personal_lr` η_p and the `[train]` weight decay);
//! 2. moves w toward the solution: w ← w − η·λ(w − θ̃), η the `[train]`
//!    learning rate.
//!
//! θ̃ starts the round at the received global model and carries over from
//! batch to batch (PFLlib's model is θ̃; its `local_params` are w). The
//! round uploads w; θ̃ is scored after training: the paper's personalised
//! model.
//!
//! PFLlib scores something else (read at commit d832e76, 2025-11-29:
//! `clientpFedMe.py`, `serverpFedMe.py`, `fedoptimizer.py`). Its
//! `personalized_params` are the model's own parameter tensors
//! (`pFedMeOptimizer.step` returns `group['params']`), which `train`
//! overwrites with w at the end of the round (`update_parameters(self.model,
//! self.local_params)`) and `set_parameters` with the new global model at
//! the next round's `send_models`; `evaluate_personalized` runs after
//! `send_models`, so it scores the received global model, not θ̃.
//!
//! Server: the data-size weighted mean of the uploads, then
//! w_g ← (1 − β)·w_g + β·mean (`beta`), sent to every client. Graph: every
//! row is p over the participants (with β < 1 the remaining 1 − β stays on
//! the previous global, which is no client's; the logged row is p).
//!
//! Defaults: λ = 15, K = 5, η_p = 0.01, β = 1 (pFedGraph's settings; FedDWA
//! used λ = 1). η·λ must stay below 2 for the step on w not to overshoot
//! (1 means w jumps to θ̃); with fedweave's default η = 0.05 it is 0.75.

use crate::Checked;
use crate::contract::holds_model;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{AlgoError, Algorithm, ClientCx, Env, Info, Model, ParamError, RoundOutcome, Trained};
use crate::{ids_of, models_of};
use fedweave_core::CollaborationGraph;
use fedweave_core::vecmath::weighted_sum;
use fedweave_nn::{Proximal, SgdConfig};
use serde::{Deserialize, Serialize};

params! {
    /// pFedMe's parameters.
    pub struct PFedMeParams {
        /// λ of the Moreau envelope.
        pub lambda: f64 = 15.0,
        /// K: inner steps per mini-batch.
        pub k: usize = 5,
        /// η_p: the inner steps' learning rate.
        pub personal_lr: f64 = 0.01,
        /// β: the server's step toward the new mean (1: plain average).
        pub beta: f64 = 1.0,
    }
}

impl Validate for PFedMeParams {
    fn validate(&self) -> Result<(), ParamError> {
        non_negative("lambda", self.lambda)?;
        non_negative("personal_lr", self.personal_lr)?;
        if self.k == 0 {
            return Err(ParamError::new("k", "must be at least 1"));
        }
        if !(self.beta > 0.0 && self.beta <= 2.0) {
            return Err(ParamError::new(
                "beta",
                format!("must be in (0, 2], got {}", self.beta),
            ));
        }
        Ok(())
    }
}

/// pFedMe.
pub struct PFedMe {
    params: PFedMeParams,
}

/// A pFedMe client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PFedMeClient {
    /// w: the global model after receiving it, then the client's update.
    pub local: Model,
    /// θ̃: the personalised model (what is scored).
    pub personal: Model,
}

/// The outer step w ← w − η·λ(w − θ̃), in place.
pub fn outer_step(w: &mut [f32], personal: &[f32], lr: f32, lambda: f32) {
    let k = lr * lambda;
    for (w, p) in w.iter_mut().zip(personal) {
        *w -= k * (*w - p);
    }
}

/// The server's rule: w_g ← (1 − β)·w_g + β·Σ p_j w_j, in place.
pub fn beta_average(global: &mut [f32], beta: f64, p: &[f64], models: &[&[f32]]) {
    let mut mean = vec![0.0f32; global.len()];
    weighted_sum(p, models, &mut mean);
    let (keep, take) = ((1.0 - beta) as f32, beta as f32);
    for (g, m) in global.iter_mut().zip(&mean) {
        *g = keep * *g + take * m;
    }
}

holds_model!(PFedMeClient: personal);

impl Algorithm for PFedMe {
    const NAMES: &'static [Info] = &[Info {
        name: "pfedme",
        summary: "per batch, K inner steps on f(θ̃) + λ/2‖θ̃ − w‖², then w ← w − ηλ(w − θ̃); server w_g ← (1−β)w_g + β·Σ p w (every row of W = p; lambda = 15, k = 5, personal_lr = 0.01, beta = 1); evaluates θ̃",
        reference: "T. Dinh, Tran, Nguyen, NeurIPS 2020",
    }];
    type Params = PFedMeParams;
    type Client = PFedMeClient;
    /// The global model w_g.
    type Server = Vec<f32>;
    /// The global model.
    type Down = Vec<f32>;
    /// The client's w.
    type Up = Vec<f32>;

    fn new(_: &'static str, params: Checked<PFedMeParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_server(&self, env: &Env) -> Vec<f32> {
        env.init.to_vec()
    }

    fn init_client(&self, env: &Env, _: usize) -> PFedMeClient {
        PFedMeClient {
            local: env.initial_model(),
            personal: env.initial_model(),
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut PFedMeClient,
    ) -> Trained<Vec<f32>> {
        let n = cx.data.train.len();
        if n == 0 {
            return Trained {
                up: state.local.params.clone(),
                train_loss: 0.0,
            };
        }
        let plain = SgdConfig {
            momentum: 0.0,
            weight_decay: env.train.weight_decay,
        };
        // θ̃ starts at the received model; its batch-norm statistics are
        // the ones w brought.
        let (mut trainer, mut sampler) = cx.session_with(env, &state.local, plain);
        let data = cx.data.train;
        let (lambda, inner_lr) = (self.params.lambda as f32, self.params.personal_lr as f32);
        let mut w = state.local.params.clone();
        let mut personal = w.clone();
        let steps = env.train.steps_for(n);
        let mut loss = 0.0;
        for _ in 0..steps {
            let batch = sampler.next_batch(&mut cx.rng);
            let prox = Proximal {
                mu: lambda,
                anchor: &w,
            };
            for k in 0..self.params.k {
                let l = trainer.loss_and_grad(&data, batch, &[&prox]);
                if k == 0 {
                    loss += l;
                }
                trainer.step(&[], inner_lr);
            }
            trainer.read_params(&mut personal);
            outer_step(&mut w, &personal, env.train.lr, lambda);
        }
        trainer.store(&mut state.personal.params, &mut state.personal.buffers);
        state.local.params = w;
        state.local.buffers.copy_from_slice(&trainer.buffers());
        Trained {
            up: state.local.params.clone(),
            train_loss: loss / steps as f64,
        }
    }

    fn aggregate(
        &self,
        env: &Env,
        global: &mut Vec<f32>,
        _: usize,
        uploads: &[(usize, Vec<f32>)],
    ) -> RoundOutcome<Vec<f32>> {
        let who = ids_of(uploads);
        let p = env.size_weights(&who);
        beta_average(global, self.params.beta, &p, &models_of(uploads));
        let mut row = vec![0.0; env.clients()];
        for (w, &j) in p.iter().zip(&who) {
            row[j] = *w;
        }
        RoundOutcome::new(
            CollaborationGraph::broadcast_row(&row),
            (0..env.clients()).map(|i| (i, global.clone())).collect(),
        )
    }

    fn receive(&self, _: &Env, state: &mut PFedMeClient, global: Vec<f32>) {
        state.local.params = global;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Tiny;
    use fedweave_nn::{Device, LocalTrainer};

    #[test]
    fn outer_step_and_beta_average_by_hand() {
        // w = (1, −1), θ̃ = (0, 1), ηλ = 0.05·15 = 0.75: w = (0.25, 0.5).
        let mut w = [1.0f32, -1.0];
        outer_step(&mut w, &[0.0, 1.0], 0.05, 15.0);
        assert!((w[0] - 0.25).abs() < 1e-6 && (w[1] - 0.5).abs() < 1e-6);
        // β = 0.5 from w_g = 2: the p-mean of (1, 4) with p = (1/3, 2/3)
        // is 3, so w_g = 2.5; β = 1 is the plain p-mean.
        let mut g = [2.0f32];
        beta_average(&mut g, 0.5, &[1.0 / 3.0, 2.0 / 3.0], &[&[1.0], &[4.0]]);
        assert!((g[0] - 2.5).abs() < 1e-6);
        let mut g = [2.0f32];
        beta_average(&mut g, 1.0, &[1.0 / 3.0, 2.0 / 3.0], &[&[1.0], &[4.0]]);
        assert!((g[0] - 3.0).abs() < 1e-6);
    }

    /// Two batches of K = 2 inner steps on Tiny, by hand from raw gradients:
    /// θ̃ ← θ̃ − η_p(∇f + wd·θ̃ + λ(θ̃ − w)), then w ← w − ηλ(w − θ̃).
    #[test]
    fn inner_and_outer_steps_by_hand() {
        let mut t = Tiny::new();
        t.train.iterations = 2;
        let env = t.env();
        let algo = PFedMe {
            params: PFedMeParams {
                lambda: 2.0,
                k: 2,
                personal_lr: 0.05,
                beta: 1.0,
            },
        };
        let d = env.init.len();
        let wd = t.train.weight_decay;
        let mut cx = t.cx(0, 3);
        let mut sampler = fedweave_nn::BatchSampler::new(12, 4, &mut cx.rng);
        let mut w = env.init.to_vec();
        let mut personal = w.clone();
        for _ in 0..2 {
            let b = sampler.next_batch(&mut cx.rng).to_vec();
            for _ in 0..2 {
                let mut probe = LocalTrainer::new(
                    &t.spec,
                    &Device::flex(),
                    &personal,
                    &[],
                    SgdConfig::default(),
                    None,
                );
                probe.loss_and_grad(&cx.data.train, &b, &[]);
                let mut g = vec![0.0; d];
                probe.read_grad(&mut g);
                for k in 0..d {
                    personal[k] -= 0.05 * (g[k] + wd * personal[k] + 2.0 * (personal[k] - w[k]));
                }
            }
            for k in 0..d {
                w[k] -= 0.1 * 2.0 * (w[k] - personal[k]);
            }
        }
        let mut state = algo.init_client(&env, 0);
        let up = algo.local_round(&env, &mut t.cx(0, 3), &mut state).up;
        for k in 0..d {
            assert!(
                (state.personal.params[k] - personal[k]).abs() < 1e-5,
                "θ̃[{k}]"
            );
            assert!((up[k] - w[k]).abs() < 1e-5, "w[{k}]");
        }
        assert_eq!(up, state.local.params);
        assert_ne!(up, state.personal.params);
    }
}
