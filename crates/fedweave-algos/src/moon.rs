//! MOON (Li, He, Song: "Model-Contrastive Federated Learning", CVPR 2021):
//! FedAvg whose local objective pulls each sample's representation toward
//! the global model's and away from the client's previous local model's.
//!
//! Client i, in each round it takes part in (the paper's Algorithm 1 and
//! PFLlib's `clientmoon`):
//! 1. the local model starts from the received global model w;
//! 2. it trains on CE + μ·ℓ_con with
//!    ℓ_con = −log(e^{cos(z, z_glob)/τ} / (e^{cos(z, z_glob)/τ} + e^{cos(z, z_prev)/τ})),
//!    z, z_glob, z_prev the features (the body's output, what the head
//!    reads) of the same sample under the model being trained, the global
//!    model w and the client's previous local model
//!    ([`fedweave_nn::ModelContrastive`]; w and the previous model are
//!    frozen, so their features on every training sample are computed once
//!    before training with [`fedweave_nn::predict`] and looked up per
//!    batch);
//! 3. the trained model is uploaded and kept as the next round's previous
//!    model (before the first round: the common initial model, as PFLlib).
//!
//! Server: FedAvg of the uploads, sent to every client; every row of W is
//! the data-size vector p over the participants. Scored: the global model,
//! after receiving it.
//!
//! μ = 1 and τ = 0.5: the paper's values (μ = 1 for CIFAR-100 and
//! Tiny-ImageNet, 5 for CIFAR-10; τ = 0.5 throughout). PFLlib's defaults
//! (μ = 0, τ = 1) switch the term off. The paper adds a projection head to
//! the body for the representation; fedweave, as PFLlib, contrasts the
//! body's output itself. The frozen models' features are computed in
//! evaluation mode (running batch-norm statistics); PFLlib runs them in
//! training mode on each batch — identical without batch norm.

use crate::Checked;
use crate::contract::holds_model;
use crate::fedavg::average_to_all;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{
    AlgoError, Algorithm, ClientCx, Env, EvalPoint, Info, Model, ParamError, RoundOutcome, Trained,
};
use fedweave_nn::{ModelContrastive, predict};
use serde::{Deserialize, Serialize};

params! {
    /// MOON's parameters.
    pub struct MoonParams {
        /// μ: weight of the contrastive term.
        pub mu: f64 = 1.0,
        /// τ: temperature of the contrastive term.
        pub tau: f64 = 0.5,
    }
}

impl Validate for MoonParams {
    fn validate(&self) -> Result<(), ParamError> {
        non_negative("mu", self.mu)?;
        if !(self.tau > 0.0 && self.tau.is_finite()) {
            return Err(ParamError::new(
                "tau",
                format!("must be a finite number > 0, got {}", self.tau),
            ));
        }
        Ok(())
    }
}

/// MOON.
pub struct Moon {
    params: MoonParams,
}

/// A MOON client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoonClient {
    /// The global model after receiving it, then its trained copy.
    pub model: Model,
    /// The model the client's last local round ended with.
    pub previous: Model,
}

impl Moon {
    /// The round's objective for a client holding `global` (the received
    /// model) and `previous`, on its training data.
    fn objective(
        &self,
        env: &Env,
        cx: &ClientCx,
        global: &Model,
        previous: &Model,
    ) -> ModelContrastive {
        let train = &cx.data.train;
        let glob = predict(env.spec, &global.params, &global.buffers, train);
        let prev = predict(env.spec, &previous.params, &previous.buffers, train);
        ModelContrastive {
            mu: self.params.mu as f32,
            tau: self.params.tau as f32,
            global: glob.features,
            previous: prev.features,
            feature_len: glob.feature_len,
        }
    }
}

holds_model!(MoonClient: model);

impl Algorithm for Moon {
    const NAMES: &'static [Info] = &[Info {
        name: "moon",
        summary: "FedAvg (every row of W = p) with the model-contrastive loss CE + μ·ℓ_con pulling features toward the global model's and away from the previous local model's (mu = 1, tau = 0.5); evaluates the global model",
        reference: "Li, He, Song, CVPR 2021",
    }];
    type Params = MoonParams;
    type Client = MoonClient;
    type Server = ();
    /// The global model.
    type Down = Vec<f32>;
    /// The trained model.
    type Up = Vec<f32>;

    fn new(_: &'static str, params: Checked<MoonParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_client(&self, env: &Env, _: usize) -> MoonClient {
        MoonClient {
            model: env.initial_model(),
            previous: env.initial_model(),
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut MoonClient,
    ) -> Trained<Vec<f32>> {
        let objective = self.objective(env, cx, &state.model, &state.previous);
        let stats = cx.train_with(
            env,
            &mut state.model,
            env.train,
            &[],
            &[],
            None,
            Some(&objective),
        );
        state.previous = state.model.clone();
        Trained {
            up: state.model.params.clone(),
            train_loss: stats.mean_loss,
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

    fn receive(&self, _: &Env, state: &mut MoonClient, global: Vec<f32>) {
        state.model.params = global;
    }

    fn eval_point(&self) -> EvalPoint {
        EvalPoint::AfterReceive
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Tiny;

    /// The objective handed to training carries the global (received) and
    /// previous models' features of the client's samples; after the round
    /// the previous model is the trained one. With μ = 0 the round is plain
    /// FedAvg local training (same batches, same model).
    #[test]
    fn features_of_both_frozen_models_and_the_previous_model_moves() {
        let t = Tiny::new();
        let env = t.env();
        let algo = Moon {
            params: MoonParams::default(),
        };
        let mut state = algo.init_client(&env, 2);
        state.previous.params = state.previous.params.iter().map(|p| p * 0.5).collect();
        let cx = t.cx(2, 1);
        let obj = algo.objective(&env, &cx, &state.model, &state.previous);
        let glob = predict(&t.spec, &state.model.params, &[], &cx.data.train);
        let prev = predict(&t.spec, &state.previous.params, &[], &cx.data.train);
        assert_eq!(obj.global, glob.features);
        assert_eq!(obj.previous, prev.features);
        assert_eq!(obj.global.len(), 24 * obj.feature_len);
        assert_ne!(obj.global, obj.previous);

        let up = algo.local_round(&env, &mut t.cx(2, 1), &mut state).up;
        assert_eq!(state.previous, state.model);
        assert_eq!(up, state.model.params);

        let off = Moon {
            params: MoonParams { mu: 0.0, tau: 0.5 },
        };
        let mut a = off.init_client(&env, 2);
        off.local_round(&env, &mut t.cx(2, 1), &mut a);
        let mut b = env.initial_model();
        t.cx(2, 1).train_plain(&env, &mut b, &[]);
        assert!(
            a.model
                .params
                .iter()
                .zip(&b.params)
                .all(|(x, y)| (x - y).abs() < 1e-6)
        );
        // With μ = 1 and a previous model unlike the global one, the
        // contrastive term changes the trained model. (When the two are
        // equal, as before round 1, ℓ_con = log 2 whatever z: no gradient.)
        let mut on = algo.init_client(&env, 2);
        on.previous.params = state.previous.params.clone();
        algo.local_round(&env, &mut t.cx(2, 1), &mut on);
        assert!(
            on.model
                .params
                .iter()
                .zip(&b.params)
                .any(|(x, y)| (x - y).abs() > 1e-5)
        );
        let mut same = algo.init_client(&env, 2);
        algo.local_round(&env, &mut t.cx(2, 1), &mut same);
        assert!(
            same.model
                .params
                .iter()
                .zip(&b.params)
                .all(|(x, y)| (x - y).abs() < 1e-5)
        );
    }

    #[test]
    fn temperature_must_be_positive() {
        let bad = MoonParams { mu: 1.0, tau: 0.0 };
        assert_eq!(bad.validate().unwrap_err().key, "tau");
        let neg = MoonParams { mu: -1.0, tau: 0.5 };
        assert_eq!(neg.validate().unwrap_err().key, "mu");
    }
}
