//! APPLE (Luo & Wu, IJCAI 2022, "Adapt to Adaptation: Learning
//! Personalization for Cross-Silo Federated Learning").
//!
//! The paper: every client i uploads a *core model* c_i and downloads the
//! others'; its personalised model is θ̃_i = Σ_j p_ij c_j with a learnable
//! directed-relationship (DR) vector p_i. At every local step, with g the
//! loss gradient at θ̃_i, the own core takes c_i ← c_i − η·p_ii·g and every
//! p_ij ← p_ij − η_p (∂L/∂p_ij + λ(t)·μ·(p_ij − p0_ij)), where ∂L/∂p_ij =
//! ⟨g, c_j⟩ and the proximal term pulls p_i towards p0 (the data-size
//! weights, FedAvg's) with a weight λ(t) that decays from 1 to 0 along a
//! cosine over the first L rounds: λ = (1 + cos(π·t/L))/2, then 0.
//!
//! The reference code (PFLlib `clientapple.py`): p starts at 1/N; the core
//! step size is lr·N (so that p_ii·lr·N ≈ lr at the start); ∂L/∂p_ij is
//! computed as the mean over parameter tensors of the per-tensor *mean* of
//! g ⊙ c_j (a scale-free stand-in for the dot product); λ is updated after
//! a round, so round t (from 0) uses the schedule at t − 1; the core and p
//! steps are plain (no momentum, no weight decay); every client downloads
//! all N cores each round. The core a client offers the next round is not
//! its trained core but the mixture: `train` ends with `self.model_c =
//! copy.deepcopy(self.model)`, `self.model` being Σ_j p_ij c_j of the last
//! batch, and the server's `send_models` relays every client's `model_c`.
//! The trained core (updated in place through the shared list of core
//! models) reaches only the clients that train after it in the same round,
//! PFLlib training clients one after another (read at commit d832e76,
//! 2025-11-29: `clientapple.py`, `serverapple.py`).
//!
//! fedweave follows the code: DR vector over all N clients starting at 1/N,
//! p0 = data-size weights, core step lr·N·p_ii, the tensor-mean gradient,
//! plain steps with `[train] lr` for the core and `dr_lr` = 10 for p (the
//! step size of p is not in what was read; the tensor-mean gradient is
//! small, and on digits with four groups of disjoint classes ten rounds put
//! at least 0.43, 0.50 and 0.57 of every client's row inside its group with
//! `dr_lr` 1, 5 and 10; μ = 0.1 and L = 5 likewise chosen: L = 2 did
//! worse), λ(t) =
//! (1 + cos(π·(t − 1)/L))/2 for round t ≤ L (from 1; L = `prox_rounds`),
//! else 0, and every client downloading every other core. The upload is
//! the trained core, as the paper describes (each client shares its core
//! model), not PFLlib's mixture. Cores a client has
//! not received yet are the common init (PFLlib's round 0). The logged graph
//! row is p_i clipped at 0 and normalised (p itself may leave the simplex;
//! the personalised model uses it as it is). Evaluation: the personalised
//! model Σ_j p_ij c_j after the round's training.

use crate::Checked;
use crate::contract::holds_model;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::relay::{Relayed, RowUp, Store, uploaded_rows};
use crate::{AlgoError, Algorithm, ClientCx, Env, Info, Model, ModelRef, RoundOutcome, Trained};
use fedweave_core::vecmath::weighted_sum;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

params! {
    /// APPLE's parameters.
    pub struct AppleParams {
        /// η_p, the step size of the DR vector.
        pub dr_lr: f64 = 10.0,
        /// μ, the weight of the proximal pull towards p0.
        pub mu: f64 = 0.1,
        /// L: the rounds over which λ decays from 1 to 0.
        pub prox_rounds: usize = 5,
    }
}

impl Validate for AppleParams {
    fn validate(&self) -> Result<(), crate::ParamError> {
        non_negative("dr_lr", self.dr_lr)?;
        non_negative("mu", self.mu)
    }
}

/// λ at `round` (from 1): (1 + cos(π·(round − 1)/L))/2 while round ≤ L,
/// then 0.
pub fn prox_weight(round: usize, prox_rounds: usize) -> f64 {
    if round > prox_rounds {
        0.0
    } else {
        let t = round.saturating_sub(1) as f64;
        (1.0 + (std::f64::consts::PI * t / prox_rounds as f64).cos()) / 2.0
    }
}

/// PFLlib's ∂L/∂p_j: the mean over parameter tensors (`tensors`: their
/// ranges in the flat vector) of the per-tensor mean of g ⊙ c_j.
pub fn dr_grad(grad: &[f32], core: &[f32], tensors: &[std::ops::Range<usize>]) -> f64 {
    let per: f64 = tensors
        .iter()
        .map(|r| {
            let s: f64 = grad[r.clone()]
                .iter()
                .zip(&core[r.clone()])
                .map(|(g, c)| *g as f64 * *c as f64)
                .sum();
            s / r.len().max(1) as f64
        })
        .sum();
    per / tensors.len().max(1) as f64
}

/// One DR step: p_j ← p_j − η_p (g_j + λ·μ·(p_j − p0_j)).
pub fn dr_step(p: &mut [f64], grads: &[f64], p0: &[f64], dr_lr: f64, lambda_mu: f64) {
    for ((p, g), p0) in p.iter_mut().zip(grads).zip(p0) {
        *p -= dr_lr * (g + lambda_mu * (*p - p0));
    }
}

/// APPLE.
pub struct Apple {
    params: AppleParams,
}

/// An APPLE client.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AppleClient {
    /// Its core model c_i (shared) and its batch-norm statistics.
    pub core: Model,
    /// The DR vector p_i over all clients.
    pub p: Vec<f64>,
    /// The other clients' cores, as last received.
    pub cores: Relayed,
    /// The personalised model Σ_j p_ij c_j after the last training.
    #[serde(with = "fedweave_core::stash::vector")]
    pub personal: Vec<f32>,
}

holds_model!(AppleClient: core);

impl Algorithm for Apple {
    const NAMES: &'static [Info] = &[Info {
        name: "apple",
        summary: "personalised Σ_j p_ij c_j over all clients' core models; per step c_i and the DR vector p_i descend the loss (dr_lr 10), p_i pulled to the data-size weights with μ = 0.1 under a cosine schedule over prox_rounds = 5",
        reference: "Luo & Wu, IJCAI 2022",
    }];
    type Params = AppleParams;
    type Client = AppleClient;
    type Server = Store;
    /// Every other client's core model.
    type Down = Relayed;
    /// The core model and the DR row.
    type Up = RowUp;

    fn new(_: &'static str, params: Checked<AppleParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_server(&self, env: &Env) -> Store {
        Store::new(env.clients())
    }

    fn init_client(&self, env: &Env, _: usize) -> AppleClient {
        let n = env.clients();
        AppleClient {
            core: env.initial_model(),
            p: vec![1.0 / n as f64; n],
            cores: Relayed::default(),
            personal: env.init.to_vec(),
        }
    }

    fn local_round(&self, env: &Env, cx: &mut ClientCx, state: &mut AppleClient) -> Trained<RowUp> {
        let (n, me) = (env.clients(), cx.client);
        // Every client's core: received, own, or the common init.
        let mut cores: Vec<Vec<f32>> = vec![env.init.to_vec(); n];
        for (&j, m) in state.cores.ids.iter().zip(&state.cores.models) {
            cores[j] = m.clone();
        }
        cores[me] = state.core.params.clone();
        let tensors: Vec<std::ops::Range<usize>> = env
            .spec
            .layout()
            .tensors()
            .iter()
            .map(|t| t.offset..t.offset + t.shape.iter().product::<usize>())
            .collect();
        let p0 = env.size_weights(&(0..n).collect::<Vec<_>>());
        let lambda_mu = prox_weight(cx.round, self.params.prox_rounds) * self.params.mu;
        let lr = env.train.lr * n as f32;
        let mut personal = vec![0.0f32; env.init.len()];
        let mut train_loss = 0.0;
        let steps = env.train.steps_for(cx.data.train.len());
        if steps > 0 {
            let (mut trainer, mut sampler) = cx.session(env, &state.core);
            let mut grad = vec![0.0f32; personal.len()];
            for _ in 0..steps {
                let refs: Vec<&[f32]> = cores.iter().map(|c| c.as_slice()).collect();
                weighted_sum(&state.p, &refs, &mut personal);
                trainer.load_params(&personal);
                let batch = sampler.next_batch(&mut cx.rng).to_vec();
                train_loss += trainer.loss_and_grad(&cx.data.train, &batch, &[]);
                trainer.read_grad(&mut grad);
                let step = lr * state.p[me] as f32;
                for (c, g) in cores[me].iter_mut().zip(&grad) {
                    *c -= step * g;
                }
                let grads: Vec<f64> = cores.iter().map(|c| dr_grad(&grad, c, &tensors)).collect();
                dr_step(&mut state.p, &grads, &p0, self.params.dr_lr, lambda_mu);
            }
            train_loss /= steps as f64;
            state.core.buffers = trainer.buffers();
        }
        state.core.params.clone_from(&cores[me]);
        let refs: Vec<&[f32]> = cores.iter().map(|c| c.as_slice()).collect();
        weighted_sum(&state.p, &refs, &mut personal);
        state.personal = personal;
        let row = state
            .p
            .iter()
            .enumerate()
            .map(|(j, w)| (j, w.max(0.0)))
            .collect();
        Trained {
            up: RowUp {
                model: state.core.params.clone(),
                row,
                extra: (),
            },
            train_loss,
        }
    }

    fn aggregate(
        &self,
        env: &Env,
        store: &mut Store,
        _: usize,
        uploads: &[(usize, RowUp)],
    ) -> RoundOutcome<Relayed> {
        store.update(uploads);
        let known = store.known();
        let downloads = uploads
            .iter()
            .map(|(i, _)| {
                let others: Vec<usize> = known.iter().copied().filter(|j| j != i).collect();
                (*i, store.relay(&others))
            })
            .collect();
        RoundOutcome::new(uploaded_rows(env.clients(), uploads), downloads)
    }

    fn check_download(&self, env: &Env, down: &Relayed) -> Result<(), String> {
        down.check(env)
    }

    fn receive(&self, _: &Env, state: &mut AppleClient, down: Relayed) {
        state.cores = down;
    }

    fn personalized<'c>(&self, state: &'c AppleClient) -> ModelRef<'c> {
        ModelRef {
            params: Cow::Borrowed(&state.personal),
            buffers: &state.core.buffers,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Tiny;

    #[test]
    fn proximal_weight_follows_the_cosine_schedule() {
        assert_eq!(prox_weight(1, 4), 1.0);
        assert!(
            (prox_weight(2, 4) - (1.0 + (std::f64::consts::PI / 4.0).cos()) / 2.0).abs() < 1e-12
        );
        assert!((prox_weight(3, 4) - 0.5).abs() < 1e-12);
        assert!(prox_weight(5, 4).abs() < 1e-12);
        assert_eq!(prox_weight(6, 4), 0.0);
        assert_eq!(prox_weight(100, 4), 0.0);
        assert_eq!(prox_weight(1, 0), 0.0);
        assert_eq!(prox_weight(2, 0), 0.0);
    }

    #[test]
    fn dr_gradient_and_step_by_hand() {
        // Two tensors: [0, 2) and [2, 3).
        let g = [1.0f32, -2.0, 4.0];
        let c = [0.5f32, 0.25, 1.0];
        // Tensor means: (0.5 − 0.5)/2 = 0 and 4/1 = 4; their mean: 2.
        assert!((dr_grad(&g, &c, &[0..2, 2..3]) - 2.0).abs() < 1e-12);
        let mut p = vec![0.5, 0.5];
        dr_step(&mut p, &[2.0, -1.0], &[0.25, 0.75], 0.1, 0.5);
        // 0.5 − 0.1(2 + 0.5·0.25) = 0.2875; 0.5 − 0.1(−1 + 0.5·(−0.25)) = 0.6125.
        assert!((p[0] - 0.2875).abs() < 1e-12, "{p:?}");
        assert!((p[1] - 0.6125).abs() < 1e-12, "{p:?}");
    }

    /// On Tiny, one round of a client holding another client's well-trained
    /// core and a harmful one raises the good core's DR weight above the
    /// harmful one's, and the personalised model is Σ p_j c_j.
    #[test]
    fn dr_vector_moves_towards_useful_cores() {
        let tiny = Tiny::new();
        let env = tiny.env();
        let params = AppleParams {
            mu: 0.0,
            ..Default::default()
        };
        let algo = Apple::new("apple", params.check(env.clients()).unwrap(), &env).unwrap();
        let mut good = env.initial_model();
        for r in 1..=5 {
            tiny.cx(2, r).train_plain(&env, &mut good, &[]);
        }
        let bad: Vec<f32> = good.params.iter().map(|x| -x).collect();
        let mut state = algo.init_client(&env, 0);
        algo.receive(
            &env,
            &mut state,
            Relayed {
                ids: vec![1, 2],
                models: vec![bad.clone(), good.params.clone()],
            },
        );
        let up = algo.local_round(&env, &mut tiny.cx(0, 1), &mut state).up;
        assert!(state.p[2] > state.p[1], "{:?}", state.p);
        let refs: Vec<&[f32]> = vec![&state.core.params, &bad, &good.params];
        let mut expect = vec![0.0f32; env.init.len()];
        weighted_sum(&state.p, &refs, &mut expect);
        assert_eq!(state.personal, expect);
        assert_eq!(up.model, state.core.params);
        assert_eq!(up.row.len(), 3);
    }
}
