//! FedEM: federated multi-task learning under a mixture of distributions
//! (Marfoq, Neglia, Bellet, Kameni, Vidal, NeurIPS 2021), as FL-bench's
//! `fedem` runs it.
//!
//! M shared components θ_1..θ_M (`components`, default 3 as the paper and
//! FL-bench) start from different random initialisations (the round-0 model
//! and M − 1 further draws). Client i keeps mixture weights π_i (uniform at
//! first) and models p_i(y|x) = Σ_m π_im p_{θ_m}(y|x). One round of a
//! participant, from the components it last received:
//! 1. E-step: per training sample k, the loss ℓ_km = −log p_{θ_m}(y_k|x_k)
//!    of every component (evaluation mode), and the responsibilities
//!    r_km = softmax_m(log π_im − ℓ_km);
//! 2. M-step: π_im = mean_k r_km;
//! 3. each component trains with the usual local training on the weighted
//!    cross-entropy Σ_k r_km·CE_km / |batch| (the reference trains the M
//!    learners on the sum of these losses over the same batches; the
//!    gradients separate, so here each component draws its own batches);
//! 4. it uploads the M trained components and π_i.
//!
//! The server averages each component with the data sizes p over the
//! participants (the paper's and FL-bench's aggregation) and sends the M
//! averages to every client. Prediction: Σ_m π_im·softmax(θ_m(x)), the
//! paper's mixture of probabilities (FL-bench mixes logits instead).
//!
//! Graph rule (derived, the method has no explicit graph): component m is
//! shaped by participant j in proportion to the data mass j assigns to it,
//! p_j·π_jm, and client i's model weighs component m by π_im, so
//! W_ij = Σ_m π_im · p_j π_jm / Σ_k p_k π_km over the round's participants
//! j. Rows sum to 1; absent clients' rows use their last uploaded π (they
//! receive the new components too), uniform before their first round.
//! Evaluation: the mixture, after local training.

use crate::Checked;
use crate::contract::HoldsModel;
use crate::ifca::Models;
use crate::params::Validate;
use crate::params::params;
use crate::{
    AlgoError, Algorithm, ClientCx, Env, Info, Message, Model, ParamError, RoundOutcome, Trained,
    distinct_inits, ids_of,
};
use fedweave_core::CollaborationGraph;
use fedweave_core::vecmath::weighted_sum;
use fedweave_nn::{EvalStats, LocalData, WeightedCrossEntropy, predict};
use serde::{Deserialize, Serialize};

params! {
    /// FedEM's parameters.
    pub struct FedEmParams {
        /// M: the number of mixture components.
        pub components: usize = 3,
    }
}

impl Validate for FedEmParams {
    fn validate(&self) -> Result<(), ParamError> {
        if self.components == 0 {
            return Err(ParamError::new("components", "must be ≥ 1"));
        }
        Ok(())
    }
}

/// FedEM.
pub struct FedEm {
    params: FedEmParams,
}

/// A FedEM client: its copies of the components and its mixture weights.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FedEmClient {
    /// θ_1..θ_M, each with the client's batch-norm statistics.
    pub components: Vec<Model>,
    /// π_i.
    pub pi: Vec<f64>,
}

/// The server remembers each client's last mixture weights (for the graph
/// rows of absent clients).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FedEmServer {
    /// π_j as last uploaded (uniform before the first upload).
    pub pi: Vec<Vec<f64>>,
}

/// A participant's upload: its trained components and its π.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Mixture {
    /// θ_1..θ_M after local training.
    pub components: Models,
    /// π_i (M scalars, not counted on the wire).
    pub pi: Vec<f64>,
}

impl Message for Mixture {
    fn vectors(&self) -> Vec<&[f32]> {
        self.components.vectors()
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        self.components.vectors_mut()
    }
}

/// E-step: r_km = softmax_m(log π_m − ℓ_km) for every sample k (`losses`:
/// one row of M losses per sample). Components with π_m = 0 get r = 0.
pub fn responsibilities(pi: &[f64], losses: &[Vec<f64>]) -> Vec<Vec<f64>> {
    losses
        .iter()
        .map(|l| {
            let logits: Vec<f64> = pi.iter().zip(l).map(|(p, l)| p.ln() - l).collect();
            let top = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = logits.iter().map(|z| (z - top).exp()).collect();
            let s: f64 = e.iter().sum();
            e.into_iter().map(|x| x / s).collect()
        })
        .collect()
}

/// M-step: π_m = mean over samples of r_km (`prior` when there are no
/// samples).
pub fn mixture_weights(r: &[Vec<f64>], prior: &[f64]) -> Vec<f64> {
    if r.is_empty() {
        return prior.to_vec();
    }
    (0..prior.len())
        .map(|m| r.iter().map(|row| row[m]).sum::<f64>() / r.len() as f64)
        .collect()
}

/// The derived graph: W_ij = Σ_m π_im · p_j π_jm / Σ_k p_k π_km, with `p`
/// the size weights of `participants` (in their order) and `pi` every
/// client's π. A component no participant uses adds nothing.
pub fn implied_graph(pi: &[Vec<f64>], participants: &[usize], p: &[f64]) -> CollaborationGraph {
    let n = pi.len();
    let m = pi.first().map_or(0, Vec::len);
    let mass: Vec<f64> = (0..m)
        .map(|c| {
            participants
                .iter()
                .zip(p)
                .map(|(&j, pj)| pj * pi[j][c])
                .sum()
        })
        .collect();
    let mut g = CollaborationGraph::identity(n);
    for (i, pi_i) in pi.iter().enumerate() {
        let mut row = vec![0.0; n];
        for (&j, pj) in participants.iter().zip(p) {
            row[j] = (0..m)
                .filter(|&c| mass[c] > 0.0)
                .map(|c| pi_i[c] * pj * pi[j][c] / mass[c])
                .sum();
        }
        g.set_row(i, &row);
    }
    g
}

/// −log softmax(logits)_y per sample, from [`predict`]'s outputs.
fn sample_losses(env: &Env, model: &Model, data: &LocalData) -> Vec<f64> {
    let out = predict(env.spec, &model.params, &model.buffers, data);
    (0..out.len())
        .map(|k| {
            let row = out.output(k);
            let top = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = top
                + row
                    .iter()
                    .map(|&z| (z as f64 - top).exp())
                    .sum::<f64>()
                    .ln();
            lse - row[data.label(k) as usize] as f64
        })
        .collect()
}

/// Uniform weights over `m` components.
fn uniform(m: usize) -> Vec<f64> {
    vec![1.0 / m as f64; m]
}

/// The component of largest weight π (the first among equals); the
/// protocol scores the whole mixture through [`Algorithm::evaluate`].
impl HoldsModel for FedEmClient {
    fn held(&self) -> &Model {
        let best = (0..self.pi.len()).fold(0, |b, m| if self.pi[m] > self.pi[b] { m } else { b });
        &self.components[best]
    }
}

impl Algorithm for FedEm {
    const NAMES: &'static [Info] = &[Info {
        name: "fedem",
        summary: "M = components (3) shared models averaged with p; client mixture weights π_i by EM (E-step responsibilities per sample, M-step π = mean), components trained on responsibility-weighted CE; predicts Σ_m π_im p_m(y|x); W_ij = Σ_m π_im p_j π_jm / Σ_k p_k π_km",
        reference: "Marfoq et al., NeurIPS 2021",
    }];
    type Params = FedEmParams;
    type Client = FedEmClient;
    type Server = FedEmServer;
    /// The averaged components.
    type Down = Models;
    type Up = Mixture;

    fn new(name: &'static str, params: Checked<FedEmParams>, env: &Env) -> Result<Self, AlgoError> {
        if env.label_counts.iter().all(|c| c.is_empty()) {
            return Err(AlgoError::Unsupported {
                algorithm: name.to_string(),
                message: "FedEM's E-step needs class likelihoods; this dataset has no classes"
                    .into(),
            });
        }
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_server(&self, env: &Env) -> FedEmServer {
        FedEmServer {
            pi: vec![uniform(self.params.components); env.clients()],
        }
    }

    fn init_client(&self, env: &Env, _: usize) -> FedEmClient {
        FedEmClient {
            components: distinct_inits(env, self.params.components)
                .into_iter()
                .map(|params| Model {
                    params,
                    buffers: env.spec.init_buffers(),
                })
                .collect(),
            pi: uniform(self.params.components),
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut FedEmClient,
    ) -> Trained<Mixture> {
        let train = cx.data.train;
        let per_component: Vec<Vec<f64>> = state
            .components
            .iter()
            .map(|c| sample_losses(env, c, &train))
            .collect();
        let losses: Vec<Vec<f64>> = (0..train.len())
            .map(|k| per_component.iter().map(|l| l[k]).collect())
            .collect();
        let r = responsibilities(&state.pi, &losses);
        state.pi = mixture_weights(&r, &state.pi);
        let mut train_loss = 0.0;
        for (m, component) in state.components.iter_mut().enumerate() {
            let objective = WeightedCrossEntropy {
                weights: r.iter().map(|row| row[m] as f32).collect(),
            };
            train_loss += cx
                .train_with(env, component, env.train, &[], &[], None, Some(&objective))
                .mean_loss;
        }
        Trained {
            up: Mixture {
                components: Models(state.components.iter().map(|c| c.params.clone()).collect()),
                pi: state.pi.clone(),
            },
            train_loss,
        }
    }

    fn check_upload(&self, env: &Env, up: &Mixture) -> Result<(), String> {
        let m = self.params.components;
        if up.components.0.len() != m || up.pi.len() != m {
            return Err(format!(
                "{} components and {} weights where the mixture has {m}",
                up.components.0.len(),
                up.pi.len()
            ));
        }
        if !up.pi.iter().all(|w| w.is_finite() && *w >= 0.0) || up.pi.iter().sum::<f64>() <= 0.0 {
            return Err("mixture weights must be finite, ≥ 0 and not all 0".into());
        }
        crate::contract::check_whole_models(env, up.vectors())
    }

    fn aggregate(
        &self,
        env: &Env,
        server: &mut FedEmServer,
        _: usize,
        uploads: &[(usize, Mixture)],
    ) -> RoundOutcome<Models> {
        let participants = ids_of(uploads);
        let p = env.size_weights(&participants);
        let averaged: Vec<Vec<f32>> = (0..self.params.components)
            .map(|m| {
                let models: Vec<&[f32]> = uploads
                    .iter()
                    .map(|(_, u)| u.components.0[m].as_slice())
                    .collect();
                let mut out = vec![0.0f32; env.init.len()];
                weighted_sum(&p, &models, &mut out);
                out
            })
            .collect();
        for (i, up) in uploads {
            let s: f64 = up.pi.iter().sum();
            server.pi[*i] = up.pi.iter().map(|w| w / s).collect();
        }
        let graph = implied_graph(&server.pi, &participants, &p);
        let down = Models(averaged);
        RoundOutcome::new(
            graph,
            (0..env.clients()).map(|i| (i, down.clone())).collect(),
        )
    }

    fn check_download(&self, env: &Env, down: &Models) -> Result<(), String> {
        down.check(env, self.params.components)
    }

    fn receive(&self, _: &Env, state: &mut FedEmClient, models: Models) {
        for (c, theta) in state.components.iter_mut().zip(models.0) {
            c.params = theta;
        }
    }

    fn scores_personalized(&self) -> bool {
        false
    }

    fn evaluate(
        &self,
        env: &Env,
        state: &FedEmClient,
        _: &LocalData,
        sets: &[&LocalData],
    ) -> Vec<EvalStats> {
        sets.iter()
            .map(|on| score_mixture(env, state, on))
            .collect()
    }
}

/// Accuracy and cross-entropy of the π-weighted mixture of the components'
/// softmax outputs on `on`.
fn score_mixture(env: &Env, state: &FedEmClient, on: &LocalData) -> EvalStats {
    let outs: Vec<_> = state
        .components
        .iter()
        .map(|c| predict(env.spec, &c.params, &c.buffers, on))
        .collect();
    let classes = env.spec.num_classes();
    let mut stats = EvalStats::default();
    for k in 0..on.len() {
        let mut p = vec![0.0f64; classes];
        for (out, w) in outs.iter().zip(&state.pi) {
            let row = out.output(k);
            let top = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let e: Vec<f64> = row.iter().map(|&z| (z as f64 - top).exp()).collect();
            let s: f64 = e.iter().sum();
            for (pc, ec) in p.iter_mut().zip(&e) {
                *pc += w * ec / s;
            }
        }
        let y = on.label(k) as usize;
        let lp = p[y].ln();
        stats.loss_sum += if lp.is_finite() { -lp } else { 1e4 };
        stats.loss_terms += 1;
        let best = (0..classes).fold(0, |b, c| if p[c] > p[b] { c } else { b });
        stats.correct += usize::from(best == y);
        stats.total += 1;
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Tiny;

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12)
    }

    #[test]
    fn e_step_and_m_step_by_hand_on_two_components() {
        // π = (0.25, 0.75); sample 0: losses (ln 2, ln 4) → likelihoods
        // (1/2, 1/4): r ∝ (0.25·0.5, 0.75·0.25) = (0.125, 0.1875) → (0.4, 0.6).
        // Sample 1: losses (ln 4, ln 2) → (0.0625, 0.375) → (1/7, 6/7).
        let pi = [0.25, 0.75];
        let losses = vec![vec![2f64.ln(), 4f64.ln()], vec![4f64.ln(), 2f64.ln()]];
        let r = responsibilities(&pi, &losses);
        assert!(close(&r[0], &[0.4, 0.6]), "{r:?}");
        assert!(close(&r[1], &[1.0 / 7.0, 6.0 / 7.0]), "{r:?}");
        let new_pi = mixture_weights(&r, &pi);
        assert!(close(
            &new_pi,
            &[(0.4 + 1.0 / 7.0) / 2.0, (0.6 + 6.0 / 7.0) / 2.0]
        ));
        assert_eq!(mixture_weights(&[], &pi), pi.to_vec());
        // A component with π = 0 takes no responsibility.
        let r = responsibilities(&[0.0, 1.0], &losses);
        assert_eq!(r[0], vec![0.0, 1.0]);
    }

    #[test]
    fn the_implied_graph_by_hand() {
        // Two participants (p = 1/2 each), π_0 = (1, 0), π_1 = (1/2, 1/2);
        // component masses: m0 = ½·1 + ½·½ = ¾, m1 = ¼.
        // W_00 = 1·(½·1)/¾ = 2/3, W_01 = 1·(½·½)/¾ = 1/3;
        // W_10 = ½·(½/¾) + ½·0 = 1/3, W_11 = ½·(¼/¾) + ½·(¼/¼) = 2/3.
        let pi = vec![vec![1.0, 0.0], vec![0.5, 0.5]];
        let g = implied_graph(&pi, &[0, 1], &[0.5, 0.5]);
        assert!(
            close(g.row(0), &[2.0 / 3.0, 1.0 / 3.0]),
            "{:?}",
            g.to_rows()
        );
        assert!(
            close(g.row(1), &[1.0 / 3.0, 2.0 / 3.0]),
            "{:?}",
            g.to_rows()
        );
        // An absent client 2 with π = (0, 1) reads component 1 only:
        // participant 1 alone shaped it.
        let pi = vec![vec![1.0, 0.0], vec![0.5, 0.5], vec![0.0, 1.0]];
        let g = implied_graph(&pi, &[0, 1], &[0.5, 0.5]);
        assert!(close(g.row(2), &[0.0, 1.0, 0.0]), "{:?}", g.to_rows());
    }

    #[test]
    fn a_round_updates_pi_from_the_e_step_and_trains_every_component() {
        let tiny = Tiny::new();
        let env = tiny.env();
        let fedem = FedEm::new(
            "fedem",
            FedEmParams { components: 2 }.check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let mut state = fedem.init_client(&env, 0);
        // Component 1 already fits client 0's data: the E-step must give it
        // most of the responsibility.
        let mut cx = tiny.cx(0, 1);
        for _ in 0..5 {
            cx.train_plain(&env, &mut state.components[1], &[]);
        }
        let before: Vec<Vec<f32>> = state.components.iter().map(|c| c.params.clone()).collect();
        let train = tiny.cx(0, 1).data.train;
        let losses: Vec<Vec<f64>> = {
            let l0 = sample_losses(&env, &state.components[0], &train);
            let l1 = sample_losses(&env, &state.components[1], &train);
            l0.into_iter().zip(l1).map(|(a, b)| vec![a, b]).collect()
        };
        let expect_pi = mixture_weights(&responsibilities(&[0.5, 0.5], &losses), &[0.5, 0.5]);
        let up = fedem.local_round(&env, &mut tiny.cx(0, 2), &mut state).up;
        assert!(close(&state.pi, &expect_pi));
        assert!(state.pi[1] > 0.7, "{:?}", state.pi);
        assert_eq!(up.pi, state.pi);
        for (m, b) in before.iter().enumerate() {
            assert_ne!(&up.components.0[m], b, "component {m} trained");
        }
        // The per-sample losses agree with the evaluator's mean loss.
        let mean = losses.iter().map(|l| l[1]).sum::<f64>() / losses.len() as f64;
        let eval =
            fedweave_nn::evaluate(env.spec, &before[1], &state.components[1].buffers, &train);
        assert!(
            (mean - eval.mean_loss()).abs() < 1e-4,
            "{mean} vs {}",
            eval.mean_loss()
        );
    }

    #[test]
    fn the_mixture_is_scored_with_mixed_probabilities() {
        let tiny = Tiny::new();
        let env = tiny.env();
        let fedem = FedEm::new(
            "fedem",
            FedEmParams { components: 2 }.check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let mut state = fedem.init_client(&env, 0);
        let data = tiny.cx(0, 1).data.train;
        // π = (1, 0): the mixture is component 0 exactly.
        state.pi = vec![1.0, 0.0];
        let mixed = fedem.evaluate(&env, &state, &data, &[&data]).remove(0);
        let alone = fedweave_nn::evaluate(
            env.spec,
            &state.components[0].params,
            &state.components[0].buffers,
            &data,
        );
        assert_eq!((mixed.correct, mixed.total), (alone.correct, alone.total));
        assert!((mixed.mean_loss() - alone.mean_loss()).abs() < 1e-4);
    }

    #[test]
    fn uploads_with_broken_mixture_weights_are_rejected() {
        let tiny = Tiny::new();
        let env = tiny.env();
        let fedem = FedEm::new(
            "fedem",
            FedEmParams { components: 2 }.check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let d = env.init.len();
        let up = |pi: Vec<f64>| Mixture {
            components: Models(vec![vec![0.0; d]; 2]),
            pi,
        };
        assert!(fedem.check_upload(&env, &up(vec![0.5, 0.5])).is_ok());
        assert!(fedem.check_upload(&env, &up(vec![f64::NAN, 0.5])).is_err());
        assert!(fedem.check_upload(&env, &up(vec![0.5])).is_err());
        assert!(fedem.check_upload(&env, &up(vec![0.0, 0.0])).is_err());
    }
}
