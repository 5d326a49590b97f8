//! FedDyn (Acar, Zhao, Matas, Mattina, Whatmough, Saligrama: "Federated
//! Learning Based on Dynamic Regularization", ICLR 2021): each client's
//! objective is corrected by a linear term built from its past gradients,
//! so that the local minima agree with the global one.
//!
//! Client i keeps g_i = ∇L_i(θ_i) as the paper defines it recursively
//! (zero before its first round). One round, as the paper's Algorithm 1
//! and PFLlib's `clientdyn`:
//! 1. from the received server model θ, train on
//!    L_i(θ') − ⟨g_i, θ'⟩ + α/2‖θ' − θ‖² (the [`Linear`] term with v = −g_i
//!    and the [`Proximal`] term);
//! 2. g_i ← g_i − α(θ_i − θ), with θ_i the trained model (the first-order
//!    condition of step 1), and upload θ_i.
//!
//! The server keeps h (zero at first) and the model θ it last sent:
//! h ← h − α/N·Σ_{i∈P}(θ_i − θ) (N: all clients), then
//! θ ← (1/|P|)Σ_{i∈P} θ_i − h/α, sent to every client, absent ones
//! included.
//!
//! α = `alpha` = 0.01 (the paper's choice for its vision runs among
//! {0.1, 0.01, 0.001}; PFLlib's default is 1). The penalty is the paper's
//! squared norm α/2‖θ' − θ‖²: PFLlib adds α/2‖θ' − θ‖ (the norm itself,
//! not squared), a slip in its code.
//!
//! Graph: every row is 1/|P| on each participant (the mean in θ's update;
//! the −h/α correction is a shift that is no client's model). Scored: the
//! server model θ, after receiving it. Local training uses the `[train]`
//! optimiser, a fresh one each round.

use crate::Checked;
use crate::contract::holds_model;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{
    AlgoError, Algorithm, ClientCx, Env, EvalPoint, Info, Model, ParamError, RoundOutcome, Trained,
};
use fedweave_core::CollaborationGraph;
use fedweave_nn::{Linear, Proximal};
use serde::{Deserialize, Serialize};

params! {
    /// FedDyn's parameters.
    pub struct FedDynParams {
        /// α: weight of the proximal term and step of the state updates.
        pub alpha: f64 = 0.01,
    }
}

impl Validate for FedDynParams {
    fn validate(&self) -> Result<(), ParamError> {
        non_negative("alpha", self.alpha)?;
        if self.alpha == 0.0 {
            return Err(ParamError::new(
                "alpha",
                "must be above 0 (θ subtracts h/α)",
            ));
        }
        Ok(())
    }
}

/// FedDyn.
pub struct FedDyn {
    alpha: f32,
}

/// A FedDyn client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FedDynClient {
    /// θ after receiving it, then the trained θ_i.
    pub model: Model,
    /// g_i, the client's gradient state.
    #[serde(with = "fedweave_core::stash::vector")]
    pub grad_state: Vec<f32>,
}

/// The server: its model θ and h.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FedDynServer {
    /// θ, as last sent.
    #[serde(with = "fedweave_core::stash::vector")]
    pub model: Vec<f32>,
    /// h.
    #[serde(with = "fedweave_core::stash::vector")]
    pub h: Vec<f32>,
}

holds_model!(FedDynClient: model);

impl Algorithm for FedDyn {
    const NAMES: &'static [Info] = &[Info {
        name: "feddyn",
        summary: "one server model; clients train on L_i − ⟨g_i, θ⟩ + α/2‖θ − θ_server‖² and update g_i; server keeps h and sends mean(θ_i) − h/α; every row of W = 1/|P| (alpha = 0.01)",
        reference: "Acar et al., ICLR 2021",
    }];
    type Params = FedDynParams;
    type Client = FedDynClient;
    type Server = FedDynServer;
    /// θ.
    type Down = Vec<f32>;
    /// θ_i.
    type Up = Vec<f32>;

    fn new(_: &'static str, p: Checked<FedDynParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            alpha: p.alpha as f32,
        })
    }

    fn init_server(&self, env: &Env) -> FedDynServer {
        FedDynServer {
            model: env.init.to_vec(),
            h: vec![0.0; env.init.len()],
        }
    }

    fn init_client(&self, env: &Env, _: usize) -> FedDynClient {
        FedDynClient {
            model: env.initial_model(),
            grad_state: vec![0.0; env.init.len()],
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut FedDynClient,
    ) -> Trained<Vec<f32>> {
        let server = state.model.params.clone();
        let minus_g: Vec<f32> = state.grad_state.iter().map(|g| -g).collect();
        let linear = Linear { coef: &minus_g };
        let prox = Proximal {
            mu: self.alpha,
            anchor: &server,
        };
        let train_loss = cx.train_plain(env, &mut state.model, &[&linear, &prox]);
        for ((g, t), s) in state
            .grad_state
            .iter_mut()
            .zip(&state.model.params)
            .zip(&server)
        {
            *g -= self.alpha * (t - s);
        }
        Trained {
            up: state.model.params.clone(),
            train_loss,
        }
    }

    fn aggregate(
        &self,
        env: &Env,
        server: &mut FedDynServer,
        _: usize,
        uploads: &[(usize, Vec<f32>)],
    ) -> RoundOutcome<Vec<f32>> {
        let n = env.clients();
        let per_client = self.alpha / n as f32;
        let share = 1.0 / uploads.len() as f32;
        let mut mean = vec![0.0f32; server.model.len()];
        for (_, theta) in uploads {
            for (((h, m), t), s) in server
                .h
                .iter_mut()
                .zip(mean.iter_mut())
                .zip(theta)
                .zip(&server.model)
            {
                *h -= per_client * (t - s);
                *m += share * t;
            }
        }
        for ((s, m), h) in server.model.iter_mut().zip(&mean).zip(&server.h) {
            *s = m - h / self.alpha;
        }
        let mut row = vec![0.0; n];
        for (j, _) in uploads {
            row[*j] = 1.0 / uploads.len() as f64;
        }
        RoundOutcome::new(
            CollaborationGraph::broadcast_row(&row),
            (0..n).map(|i| (i, server.model.clone())).collect(),
        )
    }

    fn receive(&self, _: &Env, state: &mut FedDynClient, model: Vec<f32>) {
        state.model.params = model;
    }

    fn eval_point(&self) -> EvalPoint {
        EvalPoint::AfterReceive
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Tiny;
    use fedweave_nn::TrainConfig;

    /// Server with α = 0.5, N = 3, θ = 1 and h = 0.2 per element; clients 0
    /// and 2 upload 2 and 4: h = 0.2 − 0.5/3·(1 + 3) = −7/15,
    /// θ = 3 − (−7/15)/0.5 = 3 + 14/15.
    #[test]
    fn the_server_state_by_hand() {
        let t = Tiny::new();
        let env = t.env();
        let d = env.init.len();
        let algo = FedDyn { alpha: 0.5 };
        let mut server = FedDynServer {
            model: vec![1.0; d],
            h: vec![0.2; d],
        };
        let out = algo.aggregate(
            &env,
            &mut server,
            1,
            &[(0, vec![2.0; d]), (2, vec![4.0; d])],
        );
        assert!(
            server.h.iter().all(|h| (h + 7.0 / 15.0).abs() < 1e-6),
            "{}",
            server.h[0]
        );
        let want = 3.0 + 14.0 / 15.0;
        assert!(server.model.iter().all(|m| (m - want).abs() < 1e-5));
        assert!(out.downloads.iter().all(|(_, m)| m == &server.model));
        assert_eq!(out.downloads.len(), 3);
        assert_eq!((out.graph.get(1, 0), out.graph.get(1, 2)), (0.5, 0.5));
    }

    /// A client round with plain SGD, checked step by step: the gradient
    /// is ∇L − g_i + α(θ' − θ), and afterwards g_i ← g_i − α(θ_i − θ).
    #[test]
    fn a_client_round_by_hand() {
        let mut t = Tiny::new();
        t.train = TrainConfig {
            momentum: 0.0,
            weight_decay: 0.0,
            ..t.train
        };
        let env = t.env();
        let algo = FedDyn { alpha: 0.3 };
        let d = env.init.len();
        let mut state = algo.init_client(&env, 1);
        state.grad_state = (0..d).map(|k| ((k % 7) as f32 - 3.0) * 0.05).collect();
        let g0 = state.grad_state.clone();
        let server = state.model.params.clone();

        let mut cx = t.cx(1, 2);
        let (mut trainer, mut sampler) = cx.session(&env, &state.model);
        for _ in 0..3 {
            let b = sampler.next_batch(&mut cx.rng).to_vec();
            trainer.loss_and_grad(&cx.data.train, &b, &[]);
            let mut g = vec![0.0; d];
            trainer.read_grad(&mut g);
            let mut p = vec![0.0; d];
            trainer.read_params(&mut p);
            for k in 0..d {
                p[k] -= 0.1 * (g[k] - g0[k] + 0.3 * (p[k] - server[k]));
            }
            trainer.load_params(&p);
        }
        let mut want = vec![0.0; d];
        trainer.read_params(&mut want);

        let up = algo.local_round(&env, &mut t.cx(1, 2), &mut state).up;
        for k in 0..d {
            assert!((up[k] - want[k]).abs() < 1e-5, "θ_i[{k}]");
            let g = g0[k] - 0.3 * (up[k] - server[k]);
            assert!((state.grad_state[k] - g).abs() < 1e-6, "g_i[{k}]");
        }
        assert_ne!(state.grad_state, g0);
    }
}
