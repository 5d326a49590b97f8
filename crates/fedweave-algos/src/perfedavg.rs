//! Per-FedAvg (Fallah, Mokhtari, Ozdaglar: "Personalized Federated
//! Learning with Theoretical Guarantees: A Model-Agnostic Meta-Learning
//! Approach", NeurIPS 2020), first-order version (FO-MAML), as PFLlib's
//! `clientperavg` runs it (METHODS.md §6).
//!
//! The global model is trained to be a good starting point for one local
//! gradient step. Each local step of client i draws two mini-batches D, D'
//! (PFLlib: one batch of 2B split in halves) and, from the current θ:
//! 1. temporary step on D: θ' = θ − α∇f(θ; D);
//! 2. gradient at θ' on D': g = ∇f(θ'; D');
//! 3. meta step from the original point: θ ← θ − β·g.
//!
//! The round takes the `[train]` number of such steps (each uses two
//! batches) from the received global model and uploads θ. Server: FedAvg
//! (every row of W is the data-size vector p over the participants; the
//! average goes to every client).
//!
//! Scored model: the personalisation Per-FedAvg is about, the global model
//! adapted by one step of α on one mini-batch of the client's training data
//! (PFLlib's `train_one_step`, run by its `evaluate_one_step` on the
//! received global before the round's training). fedweave computes it in the
//! round from the model the round started from (the received global) and
//! scores it after training; a client that has not trained yet is scored
//! on the initial model. PFLlib's `train_one_step` draws that batch from the
//! test loader in some versions; fedweave uses training data only.
//!
//! Both steps are plain SGD (no momentum; the `[train]` weight decay), as
//! the paper and PFLlib's `PerAvgOptimizer`. Defaults: α = 0.01 (temporary
//! and adaptation step; DPFL's value), β = the `[train]` learning rate
//! (METHODS.md §6: PFLlib sets β = lr; pFedGraph ran α = 0.001, β = 0.01).
//! pFedGraph's pair makes the one adaptation step negligible: on fedweave's
//! pathological digits (10 rounds, lr 0.05) Per-FedAvg with α = 0.001,
//! β = 0.01 scores 0.81 in the last round, below FedAvg's global model
//! (0.84); with the defaults (α = 0.01, β = 0.05) it scores 0.96
//! (`tests/it/baselines.rs`).

use crate::Checked;
use crate::contract::holds_model;
use crate::fedavg::average_to_all;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{AlgoError, Algorithm, ClientCx, Env, Info, Model, ParamError, RoundOutcome, Trained};
use fedweave_nn::SgdConfig;
use serde::{Deserialize, Serialize};

params! {
    /// Per-FedAvg's parameters.
    pub struct PerFedAvgParams {
        /// α: the temporary step of each meta step, and the one adaptation
        /// step of the scored model.
        pub alpha: f64 = 0.01,
        /// β: the meta step (unset: the `[train]` learning rate).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub beta: Option<f64> = None,
    }
}

impl Validate for PerFedAvgParams {
    fn validate(&self) -> Result<(), ParamError> {
        non_negative("alpha", self.alpha)?;
        self.beta.map_or(Ok(()), |b| non_negative("beta", b))
    }
}

/// Per-FedAvg.
pub struct PerFedAvg {
    alpha: f32,
    beta: Option<f32>,
}

/// A Per-FedAvg client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PerFedAvgClient {
    /// The global model after receiving it, then its meta-trained copy.
    pub model: Model,
    /// The round's starting model adapted by one α step (what is scored).
    pub adapted: Model,
}

holds_model!(PerFedAvgClient: adapted);

impl Algorithm for PerFedAvg {
    const NAMES: &'static [Info] = &[Info {
        name: "per-fedavg",
        summary: "FedAvg (every row of W = p) trained by first-order MAML: per step θ' = θ − α∇f(θ; D), θ ← θ − β∇f(θ'; D') (alpha = 0.01, beta = [train] lr); evaluates the global model after one α step on one local batch",
        reference: "Fallah, Mokhtari, Ozdaglar, NeurIPS 2020",
    }];
    type Params = PerFedAvgParams;
    type Client = PerFedAvgClient;
    type Server = ();
    /// The global model.
    type Down = Vec<f32>;
    /// The meta-trained model.
    type Up = Vec<f32>;

    fn new(_: &'static str, p: Checked<PerFedAvgParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            alpha: p.alpha as f32,
            beta: p.beta.map(|b| b as f32),
        })
    }

    fn init_client(&self, env: &Env, _: usize) -> PerFedAvgClient {
        PerFedAvgClient {
            model: env.initial_model(),
            adapted: env.initial_model(),
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut PerFedAvgClient,
    ) -> Trained<Vec<f32>> {
        let n = cx.data.train.len();
        if n == 0 {
            state.adapted = state.model.clone();
            return Trained {
                up: state.model.params.clone(),
                train_loss: 0.0,
            };
        }
        let plain = SgdConfig {
            momentum: 0.0,
            weight_decay: env.train.weight_decay,
        };
        let (mut trainer, mut sampler) = cx.session_with(env, &state.model, plain);
        let data = cx.data.train;
        let start = state.model.params.clone();
        let mut theta = start.clone();
        let steps = env.train.steps_for(n);
        let beta = self.beta.unwrap_or(env.train.lr);
        let mut loss = 0.0;
        for _ in 0..steps {
            loss += trainer.loss_and_grad(&data, sampler.next_batch(&mut cx.rng), &[]);
            trainer.step(&[], self.alpha);
            trainer.loss_and_grad(&data, sampler.next_batch(&mut cx.rng), &[]);
            trainer.load_params(&theta);
            trainer.step(&[], beta);
            trainer.read_params(&mut theta);
        }
        trainer.store(&mut state.model.params, &mut state.model.buffers);
        // The scored model: the round's starting point after one α step on
        // the next batch.
        trainer.load_params(&start);
        trainer.loss_and_grad(&data, sampler.next_batch(&mut cx.rng), &[]);
        trainer.step(&[], self.alpha);
        trainer.store(&mut state.adapted.params, &mut state.adapted.buffers);
        Trained {
            up: state.model.params.clone(),
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

    fn receive(&self, _: &Env, state: &mut PerFedAvgClient, global: Vec<f32>) {
        state.model.params = global;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Tiny;
    use fedweave_nn::LocalTrainer;

    /// Three first-order MAML steps on Tiny, by hand from raw gradients
    /// (plain SGD, weight decay 1e-3 as Tiny's `[train]`): the meta step
    /// takes the gradient at the temporary point and applies it from the
    /// original one; the scored model is the start plus one α step on the
    /// seventh batch.
    #[test]
    fn first_order_maml_steps_by_hand() {
        let t = Tiny::new();
        let env = t.env();
        let algo = PerFedAvg {
            alpha: 0.05,
            beta: Some(0.2),
        };
        let mut state = algo.init_client(&env, 2);
        let d = env.init.len();
        let wd = t.train.weight_decay;
        let mut cx = t.cx(2, 1);
        let mut sampler = fedweave_nn::BatchSampler::new(24, 4, &mut cx.rng);
        let grad_at = |p: &[f32], batch: &[usize]| {
            let mut probe = LocalTrainer::new(
                &t.spec,
                &fedweave_nn::Device::flex(),
                p,
                &[],
                SgdConfig::default(),
                None,
            );
            probe.loss_and_grad(&cx.data.train, batch, &[]);
            let mut g = vec![0.0; d];
            probe.read_grad(&mut g);
            g
        };
        let sgd = |p: &[f32], g: &[f32], lr: f32| -> Vec<f32> {
            p.iter()
                .zip(g)
                .map(|(p, g)| p - lr * (g + wd * p))
                .collect()
        };
        let mut theta = env.init.to_vec();
        for _ in 0..3 {
            let b1 = sampler.next_batch(&mut cx.rng).to_vec();
            let b2 = sampler.next_batch(&mut cx.rng).to_vec();
            let temp = sgd(&theta, &grad_at(&theta, &b1), 0.05);
            theta = sgd(&theta, &grad_at(&temp, &b2), 0.2);
        }
        let b = sampler.next_batch(&mut cx.rng).to_vec();
        let adapted = sgd(env.init, &grad_at(env.init, &b), 0.05);

        let up = algo.local_round(&env, &mut t.cx(2, 1), &mut state).up;
        for k in 0..d {
            assert!((up[k] - theta[k]).abs() < 1e-5, "θ[{k}]");
            assert!(
                (state.adapted.params[k] - adapted[k]).abs() < 1e-6,
                "adapted[{k}]"
            );
        }
        assert_eq!(
            algo.personalized(&state).params.as_ref(),
            &state.adapted.params[..]
        );
        assert_ne!(state.adapted.params, env.init);
    }
}
