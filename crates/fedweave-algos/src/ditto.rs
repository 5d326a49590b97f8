//! Ditto (Li, Hu, Beirami, Smith, ICML 2021): fair and robust federated
//! learning through personalisation.
//!
//! Every client keeps two models: a copy of the global model w, trained and
//! averaged exactly as in FedAvg, and its personal model v, trained on
//! F_i(v) + λ/2·‖v − w‖², which never leaves the client.
//!
//! One round of client i, in the order of PFLlib's `clientditto`
//! (`ptrain`, then `train`; METHODS.md §6):
//! 1. personal update: v takes the personal steps (`plocal_iterations`, or
//!    `plocal_epochs` passes; by default as many steps as the `[train]`
//!    local round) of SGD on ∇F_i(v) + λ(v − w), with w the global model
//!    received last round, held fixed;
//! 2. the global copy trains from w on plain cross-entropy, as FedAvg's
//!    client does, and is uploaded.
//!
//! Graph rule: FedAvg's. Every row of W is the data-size vector p over the
//! round's participants, and the average goes to every client, absent ones
//! included (it replaces their global copy; their v is unchanged until they
//! train again). Evaluation: v, after local training.
//!
//! λ: 1 (pFedGraph, FedAGHN); DPFL used 0.75. Both models train with the
//! `[train]` optimiser (learning rate, momentum, weight decay), a fresh one
//! each round; each model keeps its own batch-norm statistics.

use crate::Checked;
use crate::contract::holds_model;
use crate::fedavg::average_to_all;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{AlgoError, Algorithm, ClientCx, Env, Info, Model, ParamError, RoundOutcome, Trained};
use fedweave_nn::{Proximal, TrainConfig};
use serde::{Deserialize, Serialize};

params! {
    /// Ditto's parameters.
    pub struct DittoParams {
        /// λ of the personal objective F(v) + λ/2‖v − w‖².
        pub lambda: f64 = 1.0,
        /// Mini-batch steps of the personal update per round (unset, and
        /// `plocal_epochs` unset: as many as the `[train]` local round).
        #[serde(skip_serializing_if = "Option::is_none")]
        pub plocal_iterations: Option<usize> = None,
        /// Full local passes of the personal update per round (PFLlib's
        /// `plocal_epochs`); at most one of the two is set.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub plocal_epochs: Option<usize> = None,
    }
}

impl Validate for DittoParams {
    fn validate(&self) -> Result<(), ParamError> {
        non_negative("lambda", self.lambda)?;
        match (self.plocal_iterations, self.plocal_epochs) {
            (Some(_), Some(_)) => Err(ParamError::new(
                "plocal_epochs",
                "cannot be set together with algorithm.plocal_iterations",
            )),
            (Some(0), _) => Err(ParamError::new("plocal_iterations", "must be ≥ 1")),
            (_, Some(0)) => Err(ParamError::new("plocal_epochs", "must be ≥ 1")),
            _ => Ok(()),
        }
    }
}

/// Ditto.
pub struct Ditto {
    params: DittoParams,
}

/// A Ditto client: the global copy and the personal model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DittoClient {
    /// w: the last global model received, then its locally trained copy.
    pub global: Model,
    /// v: the personal model (what is scored).
    pub personal: Model,
}

impl Ditto {
    /// The `[train]` settings with the personal update's amount of work.
    fn personal_config(&self, train: &TrainConfig) -> TrainConfig {
        let mut cfg = train.clone();
        match (self.params.plocal_iterations, self.params.plocal_epochs) {
            (Some(steps), _) => {
                cfg.iterations = steps;
                cfg.epochs = 0;
            }
            (None, Some(epochs)) => {
                cfg.iterations = 0;
                cfg.epochs = epochs;
            }
            (None, None) => {}
        }
        cfg
    }
}

holds_model!(DittoClient: personal);

impl Algorithm for Ditto {
    const NAMES: &'static [Info] = &[Info {
        name: "ditto",
        summary: "FedAvg on a global copy w (every row of W = p); each client also trains a personal v on F(v) + λ/2‖v−w‖² (lambda = 1) before the global copy; evaluates v",
        reference: "Li et al., ICML 2021",
    }];
    type Params = DittoParams;
    type Client = DittoClient;
    type Server = ();
    /// The global model.
    type Down = Vec<f32>;
    /// The trained global copy.
    type Up = Vec<f32>;

    fn new(_: &'static str, params: Checked<DittoParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_client(&self, env: &Env, _: usize) -> DittoClient {
        DittoClient {
            global: env.initial_model(),
            personal: env.initial_model(),
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut DittoClient,
    ) -> Trained<Vec<f32>> {
        // The upload is the global copy: a model-poisoning attack that
        // needs the round's starting point (`inv_grad`) must see w, not v,
        // although v trains first.
        if let Some(origin @ None) = &mut cx.origin {
            *origin = Some(state.global.params.clone());
        }
        let DittoClient { global, personal } = state;
        let prox = Proximal {
            mu: self.params.lambda as f32,
            anchor: &global.params,
        };
        let cfg = self.personal_config(env.train);
        cx.train(env, personal, &cfg, &[&prox], &[], None);
        let train_loss = cx.train_plain(env, global, &[]);
        Trained {
            up: global.params.clone(),
            train_loss,
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

    fn receive(&self, _: &Env, state: &mut DittoClient, global: Vec<f32>) {
        state.global.params = global;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn train(iterations: usize, epochs: usize) -> TrainConfig {
        TrainConfig {
            lr: 0.05,
            momentum: 0.9,
            weight_decay: 0.0,
            batch_size: 32,
            iterations,
            epochs,
        }
    }

    #[test]
    fn personal_steps_default_to_the_local_round() {
        let d = |p: DittoParams| Ditto { params: p };
        let t = train(20, 0);
        assert_eq!(d(DittoParams::default()).personal_config(&t), t);
        let steps = d(DittoParams {
            plocal_iterations: Some(5),
            ..DittoParams::default()
        })
        .personal_config(&train(0, 2));
        assert_eq!((steps.iterations, steps.epochs), (5, 0));
        let epochs = d(DittoParams {
            plocal_epochs: Some(3),
            ..DittoParams::default()
        })
        .personal_config(&t);
        assert_eq!((epochs.iterations, epochs.epochs), (0, 3));
    }

    #[test]
    fn impossible_parameters_name_their_key() {
        let both = DittoParams {
            plocal_iterations: Some(1),
            plocal_epochs: Some(1),
            ..DittoParams::default()
        };
        assert_eq!(both.validate().unwrap_err().key, "plocal_epochs");
        let negative = DittoParams {
            lambda: -1.0,
            ..DittoParams::default()
        };
        assert_eq!(negative.validate().unwrap_err().key, "lambda");
        let zero = DittoParams {
            plocal_iterations: Some(0),
            ..DittoParams::default()
        };
        assert_eq!(zero.validate().unwrap_err().key, "plocal_iterations");
    }
}
