//! SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh: "SCAFFOLD:
//! Stochastic Controlled Averaging for Federated Learning", ICML 2020):
//! FedAvg with control variates that correct each client's drift.
//!
//! The server keeps the global model x and a control variate c; client i
//! keeps its own control variate c_i (both start at zero). One round, as
//! the paper's Algorithm 1 with option II (and PFLlib's `clientscaffold`):
//! 1. client i receives (x, c) and takes its K local steps from x with the
//!    corrected gradient ∇f_i(y) − c_i + c (the [`Linear`] term with
//!    v = c − c_i);
//! 2. it updates c_i⁺ = c_i − c + (x − y_i)/(K̃·η) and uploads y_i and
//!    Δc_i = c_i⁺ − c_i: two model-sized vectors, both counted in the
//!    upload's bytes (the download carries x and c, also counted);
//! 3. the server sets x ← x + η_g/|S|·Σ_{i∈S}(y_i − x) and
//!    c ← c + 1/N·Σ_{i∈S} Δc_i (N: all clients), and sends (x, c) to every
//!    client, absent ones included.
//!
//! K̃ is K for plain SGD, as in the paper. With momentum ρ (the `[train]`
//! optimiser), y − x is the sum of the K gradients weighted by momentum,
//! so option II's estimate of the mean gradient divides by the total weight
//! [`effective_steps`] (FedNova's ‖a‖₁), which is K at ρ = 0; dividing by K
//! would inflate c_i by up to 1/(1 − ρ).
//!
//! Graph: every row is η_g/|S| on each participant (uniform, as the paper
//! and PFLlib average; with η_g = 1 the new x is their plain mean; with
//! η_g ≠ 1 the remaining 1 − η_g stays on the previous x, which is no
//! client's, and the logged row is normalised). Scored: x, after receiving
//! it.
//!
//! η_g = `server_lr` = 1 (the paper's experiments and PFLlib's default).
//! Clients without training data take no step and upload y = x, Δc = 0.

use crate::Checked;
use crate::contract::holds_model;
use crate::fednova::effective_steps;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{
    AlgoError, Algorithm, ClientCx, Env, EvalPoint, Info, Message, Model, ParamError, RoundOutcome,
    Trained,
};
use fedweave_core::CollaborationGraph;
use fedweave_nn::Linear;
use serde::{Deserialize, Serialize};

params! {
    /// SCAFFOLD's parameters.
    pub struct ScaffoldParams {
        /// η_g: the server's step along the mean update.
        pub server_lr: f64 = 1.0,
    }
}

impl Validate for ScaffoldParams {
    fn validate(&self) -> Result<(), ParamError> {
        non_negative("server_lr", self.server_lr)?;
        if self.server_lr == 0.0 {
            return Err(ParamError::new("server_lr", "must be above 0"));
        }
        Ok(())
    }
}

/// SCAFFOLD.
pub struct Scaffold {
    server_lr: f64,
}

/// A model-sized pair: a model and a control variate (or its change).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WithControl {
    /// The model (x down, y_i up).
    #[serde(with = "fedweave_core::stash::vector")]
    pub model: Vec<f32>,
    /// c down, Δc_i up.
    #[serde(with = "fedweave_core::stash::vector")]
    pub control: Vec<f32>,
}

impl Message for WithControl {
    fn vectors(&self) -> Vec<&[f32]> {
        vec![&self.model, &self.control]
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.model, &mut self.control]
    }
}

/// A SCAFFOLD client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScaffoldClient {
    /// x after receiving it, then the trained y_i.
    pub model: Model,
    /// c_i.
    #[serde(with = "fedweave_core::stash::vector")]
    pub control: Vec<f32>,
    /// c, as last received.
    #[serde(with = "fedweave_core::stash::vector")]
    pub server_control: Vec<f32>,
}

/// The server: x and c.
pub type ScaffoldServer = WithControl;

/// Option II: c_i⁺ = c_i − c + (x − y)/(K̃·η), returned as Δc = c_i⁺ − c_i
/// = (x − y)/(K̃·η) − c.
pub fn control_delta(x: &[f32], y: &[f32], c: &[f32], steps: f64, lr: f32) -> Vec<f32> {
    let scale = (1.0 / (steps * f64::from(lr))) as f32;
    x.iter()
        .zip(y)
        .zip(c)
        .map(|((x, y), c)| (x - y) * scale - c)
        .collect()
}

holds_model!(ScaffoldClient: model);

impl Algorithm for Scaffold {
    const NAMES: &'static [Info] = &[Info {
        name: "scaffold",
        summary: "one global model x with server and client control variates c, c_i; local gradients corrected by c − c_i, c_i updated by option II; uploads y_i and Δc_i (two vectors); every row of W = 1/|S| (server_lr = 1)",
        reference: "Karimireddy et al., ICML 2020",
    }];
    type Params = ScaffoldParams;
    type Client = ScaffoldClient;
    type Server = ScaffoldServer;
    /// (x, c).
    type Down = WithControl;
    /// (y_i, Δc_i).
    type Up = WithControl;

    fn new(_: &'static str, p: Checked<ScaffoldParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            server_lr: p.server_lr,
        })
    }

    fn init_server(&self, env: &Env) -> ScaffoldServer {
        WithControl {
            model: env.init.to_vec(),
            control: vec![0.0; env.init.len()],
        }
    }

    fn init_client(&self, env: &Env, _: usize) -> ScaffoldClient {
        ScaffoldClient {
            model: env.initial_model(),
            control: vec![0.0; env.init.len()],
            server_control: vec![0.0; env.init.len()],
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut ScaffoldClient,
    ) -> Trained<WithControl> {
        let x = state.model.params.clone();
        let correction: Vec<f32> = state
            .server_control
            .iter()
            .zip(&state.control)
            .map(|(c, ci)| c - ci)
            .collect();
        let stats = cx.train(
            env,
            &mut state.model,
            env.train,
            &[&Linear { coef: &correction }],
            &[],
            None,
        );
        let delta = if stats.steps == 0 {
            vec![0.0; x.len()]
        } else {
            let steps = effective_steps(stats.steps, env.train.momentum);
            control_delta(
                &x,
                &state.model.params,
                &state.server_control,
                steps,
                env.train.lr,
            )
        };
        for (ci, d) in state.control.iter_mut().zip(&delta) {
            *ci += d;
        }
        Trained {
            up: WithControl {
                model: state.model.params.clone(),
                control: delta,
            },
            train_loss: stats.mean_loss,
        }
    }

    fn aggregate(
        &self,
        env: &Env,
        server: &mut ScaffoldServer,
        _: usize,
        uploads: &[(usize, WithControl)],
    ) -> RoundOutcome<WithControl> {
        let n = env.clients();
        let x_scale = (self.server_lr / uploads.len() as f64) as f32;
        let c_scale = (1.0 / n as f64) as f32;
        let start = server.model.clone();
        for (_, up) in uploads {
            for ((x, y), s) in server.model.iter_mut().zip(&up.model).zip(&start) {
                *x += x_scale * (y - s);
            }
            for (c, d) in server.control.iter_mut().zip(&up.control) {
                *c += c_scale * d;
            }
        }
        let mut row = vec![0.0; n];
        for (j, _) in uploads {
            row[*j] = 1.0 / uploads.len() as f64;
        }
        RoundOutcome::new(
            CollaborationGraph::broadcast_row(&row),
            (0..n).map(|i| (i, server.clone())).collect(),
        )
    }

    fn receive(&self, _: &Env, state: &mut ScaffoldClient, down: WithControl) {
        state.model.params = down.model;
        state.server_control = down.control;
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

    /// Option II by hand: x = (1, 2), y = (0.5, 3), c = (0.1, −0.2), K = 4
    /// plain steps of η = 0.25: (x − y)/(Kη) = (0.5, −1), Δc = (0.4, −0.8).
    #[test]
    fn option_two_by_hand() {
        let d = control_delta(&[1.0, 2.0], &[0.5, 3.0], &[0.1, -0.2], 4.0, 0.25);
        assert!(
            (d[0] - 0.4).abs() < 1e-6 && (d[1] + 0.8).abs() < 1e-6,
            "{d:?}"
        );
    }

    /// One plain-SGD client round on Tiny, checked step by step: the
    /// corrected gradient is the task gradient plus c − c_i, the new c_i is
    /// c_i − c + (x − y)/(Kη), and Δc is uploaded with y (two vectors).
    #[test]
    fn a_client_round_corrects_its_gradient_and_updates_its_control() {
        let mut t = Tiny::new();
        t.train = TrainConfig {
            momentum: 0.0,
            weight_decay: 0.0,
            ..t.train
        };
        let env = t.env();
        let algo = Scaffold { server_lr: 1.0 };
        let d = env.init.len();
        let mut state = algo.init_client(&env, 0);
        state.control = (0..d).map(|k| (k % 5) as f32 * 0.01).collect();
        state.server_control = (0..d).map(|k| (k % 3) as f32 * -0.02).collect();
        let (ci, c) = (state.control.clone(), state.server_control.clone());
        let x = state.model.params.clone();

        // By hand: 3 plain steps with the same batches, gradient + c − c_i.
        let mut cx = t.cx(0, 1);
        let (mut trainer, mut sampler) = cx.session(&env, &state.model);
        let v: Vec<f32> = c.iter().zip(&ci).map(|(a, b)| a - b).collect();
        for _ in 0..3 {
            let b = sampler.next_batch(&mut cx.rng).to_vec();
            trainer.loss_and_grad(&cx.data.train, &b, &[]);
            let mut g = vec![0.0; d];
            trainer.read_grad(&mut g);
            let mut p = vec![0.0; d];
            trainer.read_params(&mut p);
            for k in 0..d {
                p[k] -= 0.1 * (g[k] + v[k]);
            }
            trainer.load_params(&p);
        }
        let mut y = vec![0.0; d];
        trainer.read_params(&mut y);

        let up = algo.local_round(&env, &mut t.cx(0, 1), &mut state).up;
        for k in 0..d {
            assert!((up.model[k] - y[k]).abs() < 1e-5, "y[{k}]");
            let want_ci = ci[k] - c[k] + (x[k] - y[k]) / (3.0 * 0.1);
            assert!((state.control[k] - want_ci).abs() < 1e-3, "c_i[{k}]");
            assert!((up.control[k] - (state.control[k] - ci[k])).abs() < 1e-6);
        }
        assert_eq!(up.bytes(), 8 * d as u64);
    }

    /// Server: x moves by the mean update (η_g = 0.5 halves it), c by the
    /// sum of the Δc_i over N = 3 clients; every client gets (x, c).
    #[test]
    fn the_server_steps_both_states() {
        let t = Tiny::new();
        let env = t.env();
        let d = env.init.len();
        let algo = Scaffold { server_lr: 0.5 };
        let mut server = WithControl {
            model: vec![1.0; d],
            control: vec![0.3; d],
        };
        let up = |y: f32, dc: f32| WithControl {
            model: vec![y; d],
            control: vec![dc; d],
        };
        let out = algo.aggregate(
            &env,
            &mut server,
            1,
            &[(0, up(3.0, 0.6)), (2, up(5.0, -0.3))],
        );
        // x = 1 + 0.5·((2 + 4)/2) = 2.5; c = 0.3 + (0.6 − 0.3)/3 = 0.4.
        assert!(server.model.iter().all(|x| (x - 2.5).abs() < 1e-6));
        assert!(server.control.iter().all(|c| (c - 0.4).abs() < 1e-6));
        assert_eq!(out.downloads.len(), 3);
        assert!(out.downloads.iter().all(|(_, m)| m == &server));
        for i in 0..3 {
            assert_eq!(
                (
                    out.graph.get(i, 0),
                    out.graph.get(i, 1),
                    out.graph.get(i, 2)
                ),
                (0.5, 0.0, 0.5)
            );
        }
        let mut state = algo.init_client(&env, 1);
        algo.receive(&env, &mut state, server.clone());
        assert_eq!(state.model.params, server.model);
        assert_eq!(state.server_control, server.control);
    }
}
