//! FedAvgM (Hsu, Qi, Brown: "Measuring the Effects of Non-Identical Data
//! Distribution for Federated Visual Classification", arXiv 2019): FedAvg
//! with momentum on the server.
//!
//! Clients train from the global model w exactly as in FedAvg. The server
//! treats the difference between w and the data-size weighted average of
//! the uploads as a pseudo-gradient and takes a heavy-ball step:
//!
//! ```text
//! Δ = w − Σ_i p_i w_i        (p: data-size weights over the participants)
//! v ← β·v + Δ                (v = 0 before round 1)
//! w ← w − η·v                (η·(Δ + β·v) with `nesterov = true`)
//! ```
//!
//! β = `server_momentum` = 0.1 (FedDWA's choice from its grid
//! {0, 0.1, 0.5, 0.9, 0.99}); `nesterov` = false is the paper's plain
//! momentum (the Nesterov form is PyTorch's `SGD(nesterov=True)` step).
//! η = `server_lr` = 1: the paper has no server learning rate (w ← w − v);
//! the option is FedOpt's (Reddi et al. 2021). With β = 0 and η = 1 the
//! update is w ← Σ_i p_i w_i, FedAvg bit for bit (the step is computed in
//! f64, where w − (w − avg) = avg exactly).
//!
//! Graph: every row is p over the round's participants (the averaging part;
//! the momentum is a shift that is no client's model). The new w goes to
//! every client, absent ones included. Scored: the global model, after
//! receiving it, as `fedavg`.

use crate::Checked;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{
    AlgoError, Algorithm, ClientCx, Env, EvalPoint, Info, Model, ParamError, RoundOutcome, Trained,
    ids_of, models_of,
};
use fedweave_core::CollaborationGraph;
use fedweave_core::vecmath::weighted_sum;
use serde::{Deserialize, Serialize};

params! {
    /// FedAvgM's parameters.
    pub struct FedAvgMParams {
        /// β: the server momentum, in [0, 1).
        pub server_momentum: f64 = 0.1,
        /// Nesterov momentum: step by Δ + β·v instead of v.
        pub nesterov: bool = false,
        /// η: the server learning rate (1 = the paper's update).
        pub server_lr: f64 = 1.0,
    }
}

impl Validate for FedAvgMParams {
    fn validate(&self) -> Result<(), ParamError> {
        non_negative("server_momentum", self.server_momentum)?;
        if self.server_momentum >= 1.0 {
            return Err(ParamError::new(
                "server_momentum",
                format!(
                    "must be below 1 (the momentum would not decay), got {}",
                    self.server_momentum
                ),
            ));
        }
        non_negative("server_lr", self.server_lr)?;
        if self.server_lr == 0.0 {
            return Err(ParamError::new(
                "server_lr",
                "must be above 0 (the model would never move)",
            ));
        }
        Ok(())
    }
}

/// FedAvgM.
pub struct FedAvgM {
    beta: f64,
    nesterov: bool,
    lr: f64,
}

/// The server: the global model and the momentum buffer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FedAvgMServer {
    /// w, as last sent.
    #[serde(with = "fedweave_core::stash::vector")]
    pub model: Vec<f32>,
    /// v, the momentum buffer.
    #[serde(with = "fedweave_core::stash::vector")]
    pub momentum: Vec<f32>,
}

/// Its messages are models: it takes a personal part ([`crate::personal`]).
impl crate::personal::Splittable for FedAvgM {}

impl Algorithm for FedAvgM {
    const NAMES: &'static [Info] = &[Info {
        name: "fedavgm",
        summary: "FedAvg with server momentum: Δ = w − Σ p_i w_i, v ← βv + Δ, w ← w − ηv (server_momentum β = 0.1, nesterov = false, server_lr η = 1); every row of W = p; evaluates the global model",
        reference: "Hsu, Qi, Brown, arXiv 2019",
    }];
    type Params = FedAvgMParams;
    /// The global model (after receiving it), then the trained one.
    type Client = Model;
    type Server = FedAvgMServer;
    /// The global model.
    type Down = Vec<f32>;
    /// The trained model.
    type Up = Vec<f32>;

    fn new(_: &'static str, p: Checked<FedAvgMParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            beta: p.server_momentum,
            nesterov: p.nesterov,
            lr: p.server_lr,
        })
    }

    fn init_server(&self, env: &Env) -> FedAvgMServer {
        FedAvgMServer {
            model: env.init.to_vec(),
            momentum: vec![0.0; env.init.len()],
        }
    }

    fn init_client(&self, env: &Env, _: usize) -> Model {
        env.initial_model()
    }

    fn local_round(&self, env: &Env, cx: &mut ClientCx, model: &mut Model) -> Trained<Vec<f32>> {
        cx.train_whole(env, model)
    }

    fn aggregate(
        &self,
        env: &Env,
        server: &mut FedAvgMServer,
        _: usize,
        uploads: &[(usize, Vec<f32>)],
    ) -> RoundOutcome<Vec<f32>> {
        let participants = ids_of(uploads);
        let p = env.size_weights(&participants);
        let mut avg = vec![0.0f32; server.model.len()];
        weighted_sum(&p, &models_of(uploads), &mut avg);
        for ((w, v), a) in server
            .model
            .iter_mut()
            .zip(server.momentum.iter_mut())
            .zip(&avg)
        {
            let delta = f64::from(*w) - f64::from(*a);
            let velocity = self.beta * f64::from(*v) + delta;
            let step = if self.nesterov {
                delta + self.beta * velocity
            } else {
                velocity
            };
            *v = velocity as f32;
            *w = (f64::from(*w) - self.lr * step) as f32;
        }
        let mut row = vec![0.0; env.clients()];
        for (w, &j) in p.iter().zip(&participants) {
            row[j] = *w;
        }
        RoundOutcome::new(
            CollaborationGraph::broadcast_row(&row),
            (0..env.clients())
                .map(|i| (i, server.model.clone()))
                .collect(),
        )
    }

    fn receive(&self, _: &Env, model: &mut Model, global: Vec<f32>) {
        model.params = global;
    }

    fn eval_point(&self) -> EvalPoint {
        EvalPoint::AfterReceive
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fedavg::average_to_all;
    use crate::params::parse;
    use crate::testkit::Tiny;

    fn algo(beta: f64, nesterov: bool, lr: f64) -> FedAvgM {
        FedAvgM { beta, nesterov, lr }
    }

    /// Two rounds by hand, N = 3 with sizes 12, 12, 24 (p = ¼, ¼, ½ over
    /// all three; ⅓, ⅔ over clients 0 and 2), β = 0.5, η = 1, w₀ = 1.
    /// Round 1, all upload 2, 4, 0: avg = ½ + 1 + 0 = 1.5, Δ = −0.5,
    /// v = −0.5, w = 1.5.
    /// Round 2, clients 0 and 2 upload 3 and 6: avg = 1 + 4 = 5,
    /// Δ = 1.5 − 5 = −3.5, v = −0.25 − 3.5 = −3.75, w = 1.5 + 3.75 = 5.25.
    /// Nesterov, same uploads: round 1 step = Δ + βv = −0.75, w = 1.75;
    /// round 2 Δ = 1.75 − 5 = −3.25, v = −0.25 − 3.25 = −3.5,
    /// step = −3.25 − 1.75 = −5, w = 6.75.
    #[test]
    fn two_rounds_of_momentum_by_hand() {
        let t = Tiny::new();
        let env = t.env();
        let d = env.init.len();
        for (nesterov, w1, v1, w2, v2) in [
            (false, 1.5, -0.5, 5.25, -3.75),
            (true, 1.75, -0.5, 6.75, -3.5),
        ] {
            let a = algo(0.5, nesterov, 1.0);
            let mut server = FedAvgMServer {
                model: vec![1.0; d],
                momentum: vec![0.0; d],
            };
            let out = a.aggregate(
                &env,
                &mut server,
                1,
                &[(0, vec![2.0; d]), (1, vec![4.0; d]), (2, vec![0.0; d])],
            );
            assert!(server.model.iter().all(|&w| w == w1), "{}", server.model[0]);
            assert!(server.momentum.iter().all(|&v| v == v1));
            assert_eq!(out.downloads.len(), 3);
            assert_eq!(
                (
                    out.graph.get(1, 0),
                    out.graph.get(1, 1),
                    out.graph.get(1, 2)
                ),
                (0.25, 0.25, 0.5)
            );
            let out = a.aggregate(
                &env,
                &mut server,
                2,
                &[(0, vec![3.0; d]), (2, vec![6.0; d])],
            );
            assert!(
                server.model.iter().all(|&w| (w - w2).abs() < 1e-6),
                "nesterov {nesterov}: {}",
                server.model[0]
            );
            assert!(server.momentum.iter().all(|&v| (v - v2).abs() < 1e-6));
            // Absent client 1 receives w too; its row (like every row) is p
            // over the participants.
            assert_eq!(out.downloads.len(), 3);
            assert!(out.downloads.iter().all(|(_, m)| m == &server.model));
            assert!((out.graph.get(1, 0) - 1.0 / 3.0).abs() < 1e-12);
            assert_eq!(out.graph.get(1, 1), 0.0);
        }
    }

    /// η scales the step: η = 0.5, β = 0, w₀ = 1, avg 3 → w = 1 + 0.5·2.
    #[test]
    fn the_server_lr_scales_the_step() {
        let t = Tiny::new();
        let env = t.env();
        let d = env.init.len();
        let a = algo(0.0, false, 0.5);
        let mut server = a.init_server(&env);
        server.model = vec![1.0; d];
        a.aggregate(&env, &mut server, 1, &[(1, vec![3.0; d])]);
        assert!(server.model.iter().all(|&w| w == 2.0));
    }

    /// With β = 0 (plain or Nesterov) and η = 1 the server sends exactly
    /// FedAvg's average, bit for bit, from irregular models and weights.
    #[test]
    fn zero_momentum_is_fedavg_bit_for_bit() {
        let t = Tiny::new();
        let env = t.env();
        let d = env.init.len();
        let model = |s: f32| -> Vec<f32> {
            (0..d)
                .map(|k| ((k as f32 * 0.37 + s).sin() * 3.7).powi(3) * 1e-2)
                .collect()
        };
        let uploads = vec![(0, model(0.1)), (2, model(1.3))];
        let want = average_to_all(&env, &uploads);
        for nesterov in [false, true] {
            let a = algo(0.0, nesterov, 1.0);
            let mut server = a.init_server(&env);
            server.model = model(2.9);
            let got = a.aggregate(&env, &mut server, 1, &uploads);
            for ((i, g), (j, w)) in got.downloads.iter().zip(&want.downloads) {
                assert_eq!(i, j);
                assert!(g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
            assert_eq!(got.graph, want.graph);
        }
    }

    #[test]
    fn impossible_parameters_are_rejected_naming_the_key() {
        let check = |text: &str| {
            let table: toml::Table = toml::from_str(text).unwrap();
            parse::<FedAvgMParams>("fedavgm", &table, 3)
                .err()
                .map(|e| e.to_string())
        };
        assert_eq!(check("server_momentum = 0.9\nnesterov = true"), None);
        for (text, key) in [
            ("server_momentum = 1.0", "server_momentum"),
            ("server_momentum = -0.1", "server_momentum"),
            ("server_lr = 0.0", "server_lr"),
            ("momentum = 0.5", "momentum"),
        ] {
            let e = check(text).unwrap_or_else(|| panic!("{text} accepted"));
            assert!(e.contains(&format!("algorithm.{key}")), "{text}: {e}");
        }
    }
}
