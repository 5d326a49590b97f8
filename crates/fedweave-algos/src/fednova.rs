//! FedNova (Wang, Liu, Liang, Joshi, Poor: "Tackling the Objective
//! Inconsistency Problem in Heterogeneous Federated Optimization", NeurIPS
//! 2020): FedAvg with each client's update normalised by the amount of
//! local work it did.
//!
//! When clients take different numbers of local steps τ_i, FedAvg's
//! average of their models drifts toward the clients that trained longest
//! (it minimises a mixture of the local objectives weighted by p_i·τ_i, not
//! by p_i). FedNova divides each update by its client's *effective* number
//! of steps a_i = ‖a_i‖₁ of the paper (τ_i for plain SGD; with momentum ρ,
//! [τ_i − ρ(1 − ρ^τ_i)/(1 − ρ)]/(1 − ρ), the sum of the weights momentum
//! gives the τ_i gradients, [`effective_steps`]) and rescales the average
//! by τ_eff = Σ_i p_i·a_i:
//!
//! w ← w + τ_eff·Σ_i p_i·(w_i − w)/a_i = w + Σ_i q_i·(w_i − w),
//! q_i = p_i·τ_eff/a_i ([`nova_weights`]),
//!
//! with p the data-size weights over the round's participants (the paper's
//! p_i = n_i/n). With equal a_i, q = p and FedNova is FedAvg.
//!
//! Clients: local SGD from the global model with the `[train]` optimiser;
//! each uploads its model and a_i (a scalar, not counted in the bytes, as
//! every message's ids and scalars). The server keeps the global model w
//! (the update needs w − w_i). Different step counts per client come from
//! `train.local_iterations = [lo, hi]` (each client draws a fixed count in
//! that range from the seed; see the README's config section), or from
//! `local_epochs` with unequal data sizes.
//!
//! Graph: every row is q over the participants, normalised to sum to 1
//! (the relative weight of each client's update in the new global model;
//! with unequal steps Σq ≠ 1 and the remaining 1 − Σq stays on the previous
//! global model, which is no client's). The new global goes to every client,
//! absent ones included. Scored: the global model, after receiving it.
//!
//! Reference code: the authors' `FedNova` optimiser (`local_normalizing_vec`,
//! `tau_eff = Σ p_i·a_i`) and FL-bench's client, which this follows; weight
//! decay is left out of a_i, as the authors' code does for the plain-SGD
//! case. Clients with no training data take no step (a_i = 0) and are left
//! out of the average.

use crate::Checked;
use crate::params::Validate;
use crate::{AlgoError, Algorithm, ClientCx, Env, Info, Message, Model, RoundOutcome};
use crate::{EvalPoint, Trained};
use fedweave_core::CollaborationGraph;
use serde::{Deserialize, Serialize};

/// FedNova has no parameters of its own: the local work comes from
/// `[train]`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FedNovaParams {}

impl Validate for FedNovaParams {}

/// FedNova.
pub struct FedNova;

/// A FedNova upload: the trained model and the client's effective number
/// of local steps a_i.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NovaUp {
    /// The trained model w_i.
    pub model: Vec<f32>,
    /// a_i.
    pub steps: f64,
}

impl Message for NovaUp {
    fn vectors(&self) -> Vec<&[f32]> {
        vec![&self.model]
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.model]
    }
}

/// ‖a‖₁ of the FedNova paper: how many plain-gradient steps `steps` steps
/// of SGD with heavy-ball momentum ρ amount to. Momentum weighs the k-th
/// gradient by (1 − ρ^(τ−k+1))/(1 − ρ) in the sum of the round's moves;
/// their total is [τ − ρ(1 − ρ^τ)/(1 − ρ)]/(1 − ρ), which is τ at ρ = 0.
/// SCAFFOLD's option-II control variate divides by the same amount.
pub fn effective_steps(steps: usize, momentum: f32) -> f64 {
    let rho = f64::from(momentum);
    let tau = steps as f64;
    if rho == 0.0 {
        return tau;
    }
    (tau - rho * (1.0 - rho.powi(steps as i32)) / (1.0 - rho)) / (1.0 - rho)
}

/// FedNova's weights q_i = p_i·τ_eff/a_i on the updates w_i − w, with
/// τ_eff = Σ p_i·a_i; `p` and `a` in the same order.
pub fn nova_weights(p: &[f64], a: &[f64]) -> Vec<f64> {
    let tau_eff: f64 = p.iter().zip(a).map(|(p, a)| p * a).sum();
    p.iter().zip(a).map(|(p, a)| p * tau_eff / a).collect()
}

impl Algorithm for FedNova {
    const NAMES: &'static [Info] = &[Info {
        name: "fednova",
        summary: "one global model; updates normalised by each client's effective local steps a_i and rescaled by τ_eff = Σ p_i a_i; W rows = q_i ∝ p_i/a_i (per-client step counts: train.local_iterations = [lo, hi])",
        reference: "Wang et al., NeurIPS 2020",
    }];
    type Params = FedNovaParams;
    /// The global model (after receiving it) or its trained copy.
    type Client = Model;
    /// The global model w.
    type Server = Vec<f32>;
    /// The global model.
    type Down = Vec<f32>;
    type Up = NovaUp;

    fn new(_: &'static str, _: Checked<FedNovaParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self)
    }

    fn init_server(&self, env: &Env) -> Vec<f32> {
        env.init.to_vec()
    }

    fn init_client(&self, env: &Env, _: usize) -> Model {
        env.initial_model()
    }

    fn local_round(&self, env: &Env, cx: &mut ClientCx, model: &mut Model) -> Trained<NovaUp> {
        let stats = cx.train(env, model, env.train, &[], &[], None);
        Trained {
            up: NovaUp {
                model: model.params.clone(),
                steps: effective_steps(stats.steps, env.train.momentum),
            },
            train_loss: stats.mean_loss,
        }
    }

    fn aggregate(
        &self,
        env: &Env,
        global: &mut Vec<f32>,
        _: usize,
        uploads: &[(usize, NovaUp)],
    ) -> RoundOutcome<Vec<f32>> {
        let trained: Vec<&(usize, NovaUp)> =
            uploads.iter().filter(|(_, u)| u.steps > 0.0).collect();
        let n = env.clients();
        if trained.is_empty() {
            return RoundOutcome::new(
                CollaborationGraph::identity(n),
                (0..n).map(|i| (i, global.clone())).collect(),
            );
        }
        let who: Vec<usize> = trained.iter().map(|(i, _)| *i).collect();
        let a: Vec<f64> = trained.iter().map(|(_, u)| u.steps).collect();
        let q = nova_weights(&env.size_weights(&who), &a);
        let start = global.clone();
        for (qi, (_, u)) in q.iter().zip(&trained) {
            let qi = *qi as f32;
            for ((g, w), s) in global.iter_mut().zip(&u.model).zip(&start) {
                *g += qi * (w - s);
            }
        }
        let total: f64 = q.iter().sum();
        let mut row = vec![0.0; n];
        for (qi, &j) in q.iter().zip(&who) {
            row[j] = qi / total;
        }
        RoundOutcome::new(
            CollaborationGraph::broadcast_row(&row),
            (0..n).map(|i| (i, global.clone())).collect(),
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
    use crate::testkit::Tiny;

    #[test]
    fn effective_steps_by_hand() {
        assert_eq!(effective_steps(7, 0.0), 7.0);
        // ρ = 0.5, τ = 3: weights 1, 1.5, 1.75 → 4.25 = [3 − 0.5·0.875/0.5]/0.5.
        assert!((effective_steps(3, 0.5) - 4.25).abs() < 1e-12);
        assert_eq!(effective_steps(0, 0.9), 0.0);
    }

    /// Two clients of sizes 12 and 24 (p = 1/3, 2/3) with 10 and 30 plain
    /// steps: τ_eff = 10/3 + 20 = 70/3, q = (1/3·7/3, 2/3·7/9) = (7/9, 14/27).
    /// From w = 0 with updates w_1 = 2 and w_2 = 3 (per element), the new
    /// global is 7/9·2 + 14/27·3 = 28/9, not FedAvg's 1/3·2 + 2/3·3 = 8/3.
    #[test]
    fn unequal_steps_are_normalised() {
        let q = nova_weights(&[1.0 / 3.0, 2.0 / 3.0], &[10.0, 30.0]);
        assert!((q[0] - 7.0 / 9.0).abs() < 1e-12 && (q[1] - 14.0 / 27.0).abs() < 1e-12);
        // Equal steps: q = p.
        let same = nova_weights(&[0.25, 0.75], &[5.0, 5.0]);
        assert!((same[0] - 0.25).abs() < 1e-12 && (same[1] - 0.75).abs() < 1e-12);

        let t = Tiny::new();
        let env = t.env();
        let d = env.init.len();
        let mut global = vec![0.0f32; d];
        let up = |v: f32, steps| NovaUp {
            model: vec![v; d],
            steps,
        };
        let out = FedNova.aggregate(
            &env,
            &mut global,
            1,
            &[(1, up(2.0, 10.0)), (2, up(3.0, 30.0))],
        );
        assert!(
            global.iter().all(|g| (g - 28.0 / 9.0).abs() < 1e-5),
            "{}",
            global[0]
        );
        // Row: q normalised, (7/9, 14/27)/(35/27) = (0.6, 0.4); client 0 absent.
        for i in 0..3 {
            assert_eq!(out.graph.get(i, 0), 0.0);
            assert!((out.graph.get(i, 1) - 0.6).abs() < 1e-12);
            assert!((out.graph.get(i, 2) - 0.4).abs() < 1e-12);
        }
        assert_eq!(out.downloads.len(), 3);
        assert!(out.downloads.iter().all(|(_, g)| g == &global));
        // A client without data (a = 0) is left out.
        let mut g2 = vec![0.0f32; d];
        FedNova.aggregate(&env, &mut g2, 1, &[(0, up(9.0, 0.0)), (2, up(3.0, 30.0))]);
        assert!(g2.iter().all(|g| (g - 3.0).abs() < 1e-6));
    }

    #[test]
    fn the_upload_reports_the_effective_steps_of_the_round() {
        let t = Tiny::new();
        let env = t.env();
        let mut model = FedNova.init_client(&env, 0);
        let up = FedNova.local_round(&env, &mut t.cx(0, 1), &mut model).up;
        // Tiny trains 3 steps with momentum 0.9.
        assert!((up.steps - effective_steps(3, 0.9)).abs() < 1e-12);
        assert!((up.steps - (1.0 + 1.9 + 2.71)).abs() < 1e-5);
        assert_eq!(up.model, model.params);
        assert_ne!(up.model, env.init);
        assert_eq!(up.bytes(), 4 * env.init.len() as u64);
    }
}
