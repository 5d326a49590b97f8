//! L2C (Li et al., CVPR 2022, "Learning to Collaborate in Decentralized
//! Learning of Personalized Models").
//!
//! The paper: every client i keeps learnable mixing logits β_i over all N
//! clients, α_i = softmax(β_i). Each round it trains locally, mixes the
//! neighbours' models θ̃_i = Σ_j α_ij θ_j and updates β_i by the gradient of
//! its validation loss at the mixture. The mixture is linear in the models,
//! so ∂L/∂α_ij = ⟨∇L(θ̃_i), θ_j⟩ and, through the softmax,
//! ∂L/∂β_ij = α_ij (⟨∇L(θ̃_i), θ_j⟩ − Σ_k α_ik ⟨∇L(θ̃_i), θ_k⟩). After a
//! warm-up the client keeps only its top-K neighbours by weight (sparse
//! communication from then on). The authors' code was not read (specs
//! METHODS.md §11): this follows the paper and FedDWA's description.
//!
//! fedweave: the exchange goes through the server, which relays the models
//! a client asked for (all the others' latest models until it prunes, its
//! top-K afterwards; the client itself is always in its mixture): each
//! upload names the neighbours the client keeps (none until it prunes), so
//! under partial participation a client's mixture reaches every client the
//! server has heard from, including those absent at its first upload.
//! (Before, the server relayed only the ids of the uploaded row, which held
//! only ids relayed before: clients absent at a client's first upload never
//! entered its mixture.) As with
//! FedFomo, a client mixes what it received at the start of its next round
//! (it needs its validation data), with the weights it had, then takes one
//! plain gradient step of size `lr` = 1 on β_i (an SGD step: the paper's
//! optimiser for β is not specified in what was read), trains its mixed
//! model and uploads it with the row α_i it used, which the server logs as
//! the round's graph. β_i starts at 0 (uniform weights). From round
//! `warmup` + 1 (default 5) the client keeps itself and its `top_k` = 5
//! others with the largest β. Validation: the client's validation split
//! (training data when it has none), as one batch. Evaluation: the trained
//! model.

use crate::Checked;
use crate::contract::holds_model;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::relay::{Relayed, RowUp, Store, holdout, holdout_grad, uploaded_rows};
use crate::{AlgoError, Algorithm, ClientCx, Env, Info, Model, ParamError, RoundOutcome, Trained};
use fedweave_core::vecmath::{dot, weighted_sum};
use fedweave_nn::LocalData;
use serde::{Deserialize, Serialize};

params! {
    /// L2C's parameters.
    pub struct L2cParams {
        /// Step size of the logits β.
        pub lr: f64 = 1.0,
        /// Rounds of dense mixing before pruning to the top K.
        pub warmup: usize = 5,
        /// K: the other clients kept after the warm-up.
        pub top_k: usize = 5,
    }
}

impl Validate for L2cParams {
    fn validate(&self) -> Result<(), ParamError> {
        non_negative("lr", self.lr)?;
        if self.top_k == 0 {
            return Err(ParamError::new("top_k", "must be ≥ 1"));
        }
        Ok(())
    }
}

/// softmax(β) over the entries of `logits` at `who`.
pub fn softmax_at(logits: &[f64], who: &[usize]) -> Vec<f64> {
    let max = who
        .iter()
        .map(|&j| logits[j])
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = who.iter().map(|&j| (logits[j] - max).exp()).collect();
    let total: f64 = e.iter().sum();
    e.iter().map(|x| x / total).collect()
}

/// ∂L/∂β_k = α_k (g_k − Σ_l α_l g_l) from the weights α and the gradients
/// g_k = ∂L/∂α_k = ⟨∇L(θ̃), θ_k⟩.
pub fn logit_grad(alpha: &[f64], dots: &[f64]) -> Vec<f64> {
    let mean: f64 = alpha.iter().zip(dots).map(|(a, g)| a * g).sum();
    alpha
        .iter()
        .zip(dots)
        .map(|(a, g)| a * (g - mean))
        .collect()
}

/// The client itself and its `k` other clients of largest logit (ties by
/// index), ascending.
pub fn prune(logits: &[f64], me: usize, k: usize) -> Vec<usize> {
    let mut others: Vec<usize> = (0..logits.len()).filter(|&j| j != me).collect();
    others.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    others.truncate(k);
    others.push(me);
    others.sort_unstable();
    others
}

/// What an L2C client uploads: the trained model, the row α_i it mixed
/// with and the neighbours it keeps after pruning, itself included (empty
/// before it prunes: it asks for every other client's model).
pub type L2cUp = RowUp<Vec<usize>>;

/// L2C.
pub struct L2c {
    params: L2cParams,
}

/// An L2C client.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct L2cClient {
    /// Its model (mixed, then trained; what is scored).
    pub model: Model,
    /// β_i over all clients.
    pub logits: Vec<f64>,
    /// The neighbours kept after the warm-up, itself included (empty: all).
    pub kept: Vec<usize>,
    /// Models received for the next round's mixture.
    pub received: Relayed,
}

impl L2c {
    /// Mixes the received models with the client's weights, steps β on the
    /// validation loss of the mixture and moves the model there; returns
    /// the row used (empty: nothing received).
    fn combine(
        &self,
        env: &Env,
        data: &LocalData,
        me: usize,
        round: usize,
        state: &mut L2cClient,
    ) -> Vec<(usize, f64)> {
        if round > self.params.warmup && state.kept.is_empty() {
            state.kept = prune(&state.logits, me, self.params.top_k);
        }
        let received = std::mem::take(&mut state.received);
        let mut who = vec![me];
        let mut models: Vec<&[f32]> = vec![&state.model.params];
        for (&j, m) in received.ids.iter().zip(&received.models) {
            if j != me && (state.kept.is_empty() || state.kept.contains(&j)) {
                who.push(j);
                models.push(m);
            }
        }
        if who.len() == 1 {
            return Vec::new();
        }
        let alpha = softmax_at(&state.logits, &who);
        let mut mixed = vec![0.0f32; state.model.params.len()];
        weighted_sum(&alpha, &models, &mut mixed);
        if let Some((_, grad)) = holdout_grad(env, data, &mixed, &state.model.buffers) {
            let dots: Vec<f64> = models.iter().map(|m| dot(&grad, m)).collect();
            for (&j, g) in who.iter().zip(logit_grad(&alpha, &dots)) {
                state.logits[j] -= self.params.lr * g;
            }
        }
        state.model.params = mixed;
        who.into_iter().zip(alpha).collect()
    }
}

holds_model!(L2cClient: model);

impl Algorithm for L2c {
    const NAMES: &'static [Info] = &[Info {
        name: "l2c",
        summary: "client i mixes Σ softmax(β_i)_j θ_j over the relayed models, β_i descends its validation loss of the mixture (lr 1); after warmup = 5 rounds it keeps itself and its top_k = 5",
        reference: "Li et al., CVPR 2022",
    }];
    type Params = L2cParams;
    type Client = L2cClient;
    type Server = Store;
    /// The models the client mixes.
    type Down = Relayed;
    /// The trained model, the weights used and the neighbours kept.
    type Up = L2cUp;

    fn new(_: &'static str, params: Checked<L2cParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_server(&self, env: &Env) -> Store {
        Store::new(env.clients())
    }

    fn init_client(&self, env: &Env, _: usize) -> L2cClient {
        L2cClient {
            model: env.initial_model(),
            logits: vec![0.0; env.clients()],
            kept: Vec::new(),
            received: Relayed::default(),
        }
    }

    fn local_round(&self, env: &Env, cx: &mut ClientCx, state: &mut L2cClient) -> Trained<L2cUp> {
        let row = self.combine(env, &holdout(cx), cx.client, cx.round, state);
        let train_loss = cx.train_plain(env, &mut state.model, &[]);
        Trained {
            up: L2cUp {
                model: state.model.params.clone(),
                row,
                extra: state.kept.clone(),
            },
            train_loss,
        }
    }

    fn aggregate(
        &self,
        env: &Env,
        store: &mut Store,
        _: usize,
        uploads: &[(usize, L2cUp)],
    ) -> RoundOutcome<Relayed> {
        store.update(uploads);
        let known = store.known();
        let downloads = uploads
            .iter()
            .map(|(i, up)| {
                // What it asked for: every other known client until it
                // prunes, its kept neighbours after; never itself (it holds
                // its own model).
                let asked = if up.extra.is_empty() {
                    &known
                } else {
                    &up.extra
                };
                let ids: Vec<usize> = asked.iter().copied().filter(|j| j != i).collect();
                (*i, store.relay(&ids))
            })
            .collect();
        RoundOutcome::new(uploaded_rows(env.clients(), uploads), downloads)
    }

    fn check_download(&self, env: &Env, down: &Relayed) -> Result<(), String> {
        down.check(env)
    }

    fn receive(&self, _: &Env, state: &mut L2cClient, down: Relayed) {
        state.received = down;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Tiny;

    /// L(β) = L_val(Σ softmax(β)_k θ_k) on the Tiny fixture.
    fn val_loss(env: &Env, data: &LocalData, logits: &[f64], models: &[Vec<f32>]) -> f64 {
        let who: Vec<usize> = (0..models.len()).collect();
        let alpha = softmax_at(logits, &who);
        let refs: Vec<&[f32]> = models.iter().map(|m| m.as_slice()).collect();
        let mut mixed = vec![0.0f32; models[0].len()];
        weighted_sum(&alpha, &refs, &mut mixed);
        fedweave_nn::evaluate(env.spec, &mixed, &[], data).mean_loss()
    }

    #[test]
    fn logit_gradient_matches_finite_differences_of_the_validation_loss() {
        let tiny = Tiny::new();
        let env = tiny.env();
        // Three different models: trained on clients 0, 1 and a scaled init.
        let mut models = Vec::new();
        for c in 0..2 {
            let mut m = env.initial_model();
            tiny.cx(c, 1).train_plain(&env, &mut m, &[]);
            models.push(m.params);
        }
        models.push(env.init.iter().map(|x| -0.5 * x).collect());
        let cx = tiny.cx(2, 1);
        let data = holdout(&cx);
        let logits = [0.3, -0.2, 0.1];
        let who = [0, 1, 2];
        let alpha = softmax_at(&logits, &who);
        let refs: Vec<&[f32]> = models.iter().map(|m| m.as_slice()).collect();
        let mut mixed = vec![0.0f32; env.init.len()];
        weighted_sum(&alpha, &refs, &mut mixed);
        let (loss, grad) = holdout_grad(&env, &data, &mixed, &[]).unwrap();
        assert!((loss - val_loss(&env, &data, &logits, &models)).abs() < 1e-5);
        let dots: Vec<f64> = refs.iter().map(|m| dot(&grad, m)).collect();
        let analytic = logit_grad(&alpha, &dots);
        let h = 1e-2;
        for k in 0..3 {
            let (mut hi, mut lo) = (logits, logits);
            hi[k] += h;
            lo[k] -= h;
            let fd = (val_loss(&env, &data, &hi, &models) - val_loss(&env, &data, &lo, &models))
                / (2.0 * h);
            assert!(
                (fd - analytic[k]).abs() < 0.02 * analytic[k].abs().max(0.05),
                "β_{k}: finite difference {fd} vs analytic {}",
                analytic[k]
            );
        }
        // The softmax gradient sums to zero (shifting every logit changes nothing).
        assert!(analytic.iter().sum::<f64>().abs() < 1e-12);
    }

    #[test]
    fn pruning_keeps_self_and_top_k() {
        assert_eq!(prune(&[0.0, 0.5, -1.0, 0.5, 2.0], 0, 2), vec![0, 1, 4]);
        assert_eq!(prune(&[0.0, 0.5, -1.0, 0.5, 2.0], 4, 2), vec![1, 3, 4]);
        assert_eq!(prune(&[0.0, 1.0], 1, 5), vec![0, 1]);
    }

    /// A client given a useful and a harmful model raises the useful one's
    /// logit, lowers the other's, and after the warm-up mixes only the kept
    /// neighbours; the server relays exactly the neighbours it keeps.
    #[test]
    fn client_learns_weights_prunes_and_server_relays_what_it_keeps() {
        let tiny = Tiny::new();
        let env = tiny.env();
        let params = L2cParams {
            warmup: 1,
            top_k: 1,
            ..Default::default()
        };
        let algo = L2c::new("l2c", params.check(env.clients()).unwrap(), &env).unwrap();
        let mut good = env.initial_model();
        for r in 1..=5 {
            tiny.cx(2, r).train_plain(&env, &mut good, &[]);
        }
        let bad: Vec<f32> = good.params.iter().map(|x| -x).collect();
        let relayed = || Relayed {
            ids: vec![1, 2],
            models: vec![bad.clone(), good.params.clone()],
        };
        let mut state = algo.init_client(&env, 0);
        state.received = relayed();
        let cx = tiny.cx(0, 1);
        let row = algo.combine(&env, &holdout(&cx), 0, 1, &mut state);
        assert_eq!(row.iter().map(|r| r.0).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert!(row.iter().all(|r| (r.1 - 1.0 / 3.0).abs() < 1e-12));
        assert!(
            state.logits[2] > 0.0 && state.logits[1] < 0.0,
            "{:?}",
            state.logits
        );
        // Round 2 is past the warm-up: keep itself and client 2.
        state.received = relayed();
        let row = algo.combine(&env, &holdout(&cx), 0, 2, &mut state);
        assert_eq!(state.kept, vec![0, 2]);
        assert_eq!(row.iter().map(|r| r.0).collect::<Vec<_>>(), vec![0, 2]);
        let mut store = algo.init_server(&env);
        let uploads: Vec<(usize, L2cUp)> = (0..3)
            .map(|i| {
                let up = L2cUp {
                    model: env.init.to_vec(),
                    ..L2cUp::default()
                };
                match i {
                    0 => (
                        i,
                        L2cUp {
                            row: row.clone(),
                            extra: state.kept.clone(),
                            ..up
                        },
                    ),
                    _ => (i, up),
                }
            })
            .collect();
        let out = algo.aggregate(&env, &mut store, 2, &uploads);
        assert_eq!(out.downloads[0].1.ids, vec![2]);
        assert_eq!(out.downloads[1].1.ids, vec![0, 2]);
        assert!((out.graph.get(0, 2) - row[1].1).abs() < 1e-12);
    }

    /// Participation 0.5: client 0 first uploads when only client 1 has,
    /// client 2 uploads for the first time the round after; during the
    /// warm-up client 0's mixture must reach client 2 (before, the server
    /// relayed only the ids of client 0's row, and client 2 never entered).
    #[test]
    fn the_mixture_reaches_clients_absent_at_the_first_upload() {
        let tiny = Tiny::new();
        let env = tiny.env();
        let algo = L2c::new(
            "l2c",
            L2cParams::default().check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let mut store = algo.init_server(&env);
        let mut clients: Vec<L2cClient> = (0..3).map(|i| algo.init_client(&env, i)).collect();
        let mut mixed_with = Vec::new();
        for (round, picked) in [(1, [0, 1]), (2, [0, 2]), (3, [0, 1]), (4, [0, 2])] {
            let uploads: Vec<(usize, L2cUp)> = picked
                .iter()
                .map(|&i| {
                    let up = algo.local_round(&env, &mut tiny.cx(i, round), &mut clients[i]);
                    (i, up.up)
                })
                .collect();
            mixed_with.push(uploads[0].1.row.iter().map(|r| r.0).collect::<Vec<_>>());
            let out = algo.aggregate(&env, &mut store, round, &uploads);
            for (i, down) in out.downloads {
                algo.receive(&env, &mut clients[i], down);
            }
        }
        assert_eq!(mixed_with[0], Vec::<usize>::new());
        assert_eq!(mixed_with[1], vec![0, 1]);
        assert_eq!(mixed_with[2], vec![0, 1, 2]);
        assert_eq!(mixed_with[3], vec![0, 1, 2]);
    }
}
