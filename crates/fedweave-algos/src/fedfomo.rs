//! FedFomo (Zhang et al., ICLR 2021, "Personalized Federated Learning with
//! First Order Model Optimization").
//!
//! The paper: the server keeps an affinity matrix P (client i's estimate of
//! how useful client j's model is to it) and sends each client M other
//! clients' models: the top M by P[i], or, with probability ε (ε-greedy
//! exploration, ε decaying over rounds), M clients drawn at random. Client
//! i weighs each received θ_j by the first-order estimate of how much moving
//! to it lowers its validation loss per unit of distance,
//!
//! w_j = (L_val(θ_i) − L_val(θ_j)) / ‖θ_j − θ_i‖,
//!
//! clips at 0 and normalises; its new model is Σ_j w_j θ_j, or its own when
//! no received model helps (every w_j ≤ 0). The affinity P[i][j] grows by
//! the score w_j itself, before clipping: a model that hurt gets a negative
//! affinity, so the top-M choice passes it over in favour of clients never
//! tried (affinity 0).
//!
//! Which w goes into P: fedweave adds the signed score, as PFLlib
//! (`clientfomo.py` keeps the raw scores in `weight_vector`, which
//! `serverfomo.py` adds to P), FL-bench and the authors' code
//! (NVlabs/FedFomo `federation.py`, which first divides the scores by
//! |Σ_j w_j|: the same signs and order within a round) do, and as the
//! paper's Algorithm 1 reads as we recall it (the paper's text could not be
//! re-read when this was written; every implementation agrees). Before
//! this, fedweave added the clipped, normalised weights, so a harmful
//! client stayed at affinity 0, tied with clients never tried, and the
//! random tie-break kept drawing it whenever N > M + 1.

//! The reference codes: PFLlib (`clientfomo.py`, `serverfomo.py`) adds 1e-5
//! to the distance, starts P at the identity and sends the top M of P[i]
//! (so the client's own model takes one of the M slots), and has no
//! exploration. Its losses are measured on the client's last training
//! batches: L_ is the mean loss during its last training, compared with
//! each received model's loss on those batches. The own model is at
//! distance 0, so its weight is (L_ − L_own)/1e-5: whenever its training
//! lowered the loss on those batches it dominates the mix, and only
//! otherwise is it clipped to 0. FL-bench sends the top M among the
//! previous round's participants plus the client's own model.
//!
//! fedweave: the ε-greedy exploration of the paper (`epsilon` = 0.3 at round
//! 1, minus `epsilon_decay` = 0.05 per round, floored at 0: the paper's
//! description, not checked against its code), M = `m` = 5 *other* clients
//! (the client holds its own model), ties in P broken by a seeded random
//! order (so round 1, where every affinity is 0, is exploration), the 1e-5
//! of PFLlib, and the client's validation split as the validation data (its
//! training data when it has none). The client weighs what it received at
//! the start of its next round (it needs its own data), then trains and
//! uploads its model with the weights it used and the scores; the server
//! logs the weights as the round's graph (identity rows for clients that kept their
//! own model and, in round 1, for everyone); the signed scores go into P.
//! Evaluation: the trained model.

use crate::Checked;
use crate::contract::holds_model;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::relay::{Relayed, RowUp, Store, holdout, uploaded_rows};

/// A FedFomo upload: the trained model, the row it mixed with and the
/// signed score of every model it weighed (harmful ones negative).
pub type FomoUp = RowUp<Vec<(usize, f64)>>;
use crate::{AlgoError, Algorithm, ClientCx, Env, Info, Model, ParamError, RoundOutcome, Trained};
use fedweave_core::vecmath::{sq_dist, weighted_sum};
use fedweave_core::{Purpose, rng_stream};
use fedweave_nn::LocalData;
use rand::Rng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

params! {
    /// FedFomo's parameters.
    pub struct FedFomoParams {
        /// M: how many other clients' models each client receives per round.
        pub m: usize = 5,
        /// ε at round 1: the probability that a client receives M random
        /// clients instead of its top M.
        pub epsilon: f64 = 0.3,
        /// How much ε drops per round.
        pub epsilon_decay: f64 = 0.05,
    }
}

impl Validate for FedFomoParams {
    fn validate(&self) -> Result<(), ParamError> {
        if self.m == 0 {
            return Err(ParamError::new("m", "must be ≥ 1"));
        }
        if !(0.0..=1.0).contains(&self.epsilon) {
            return Err(ParamError::new(
                "epsilon",
                format!("must be in [0, 1], got {}", self.epsilon),
            ));
        }
        non_negative("epsilon_decay", self.epsilon_decay)
    }
}

/// FedFomo's scores from the client's own validation loss, each received
/// model's validation loss and its distance to the client's model:
/// w_j = (L_own − L_j) / (d_j + 1e-5), negative for a model that hurts.
pub fn fomo_scores(own_loss: f64, losses: &[f64], dists: &[f64]) -> Vec<f64> {
    losses
        .iter()
        .zip(dists)
        .map(|(l, d)| (own_loss - l) / (d + 1e-5))
        .collect()
}

/// The mixing weights from the scores: max(0, w_j), normalised to sum 1;
/// `None` when no received model helps (the client keeps its own).
pub fn fomo_weights(scores: &[f64]) -> Option<Vec<f64>> {
    let w: Vec<f64> = scores.iter().map(|x| x.max(0.0)).collect();
    let total: f64 = w.iter().sum();
    (total > 0.0 && total.is_finite()).then(|| w.iter().map(|x| x / total).collect())
}

/// ε at `round` (from 1): `epsilon − (round − 1)·decay`, floored at 0.
pub fn epsilon_at(p: &FedFomoParams, round: usize) -> f64 {
    (p.epsilon - p.epsilon_decay * round.saturating_sub(1) as f64).max(0.0)
}

/// The M clients sent to client `me`: with probability `eps` M random ones
/// among `known` (others only), else the top M by `affinity`, ties broken by
/// the same random order.
pub fn choose(
    affinity: &[f64],
    me: usize,
    known: &[usize],
    m: usize,
    eps: f64,
    rng: &mut impl Rng,
) -> Vec<usize> {
    let explore = rng.random::<f64>() < eps;
    let mut pool: Vec<usize> = known.iter().copied().filter(|&j| j != me).collect();
    pool.shuffle(rng);
    if !explore {
        pool.sort_by(|&a, &b| affinity[b].total_cmp(&affinity[a]));
    }
    pool.truncate(m);
    pool
}

/// FedFomo.
pub struct FedFomo {
    params: FedFomoParams,
    seed: u64,
}

/// A FedFomo client: its model and the models received for its next round.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FedFomoClient {
    /// Its model (trained; what is scored).
    pub model: Model,
    /// The other clients' models to weigh at the start of the next round.
    pub received: Relayed,
}

/// The server: the affinity matrix and every client's latest model.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FedFomoServer {
    /// P, row i = client i's accumulated weights.
    pub affinity: Vec<Vec<f64>>,
    store: Store,
}

impl FedFomo {
    /// Weighs the received models on `data` and moves `state.model` to
    /// their mixture; returns the row used (empty: kept its own model) and
    /// the signed score of every received model.
    fn combine(&self, env: &Env, data: &LocalData, state: &mut FedFomoClient) -> Weighed {
        let received = std::mem::take(&mut state.received);
        if received.ids.is_empty() || data.is_empty() {
            return Weighed::default();
        }
        let model = &mut state.model;
        let loss = |p: &[f32]| fedweave_nn::evaluate(env.spec, p, &model.buffers, data).mean_loss();
        let own = loss(&model.params);
        let losses: Vec<f64> = received.models.iter().map(|m| loss(m)).collect();
        let dists: Vec<f64> = received
            .models
            .iter()
            .map(|m| sq_dist(m, &model.params).sqrt())
            .collect();
        let scores = fomo_scores(own, &losses, &dists);
        let row = match fomo_weights(&scores) {
            None => Vec::new(),
            Some(w) => {
                let refs: Vec<&[f32]> = received.models.iter().map(|m| m.as_slice()).collect();
                weighted_sum(&w, &refs, &mut model.params);
                received
                    .ids
                    .iter()
                    .zip(&w)
                    .filter(|(_, w)| **w > 0.0)
                    .map(|(&j, &w)| (j, w))
                    .collect()
            }
        };
        Weighed {
            row,
            scores: received.ids.iter().copied().zip(scores).collect(),
        }
    }
}

/// What a client's weighing produced: the row it mixed with and the scores.
#[derive(Debug, Default, PartialEq)]
struct Weighed {
    row: Vec<(usize, f64)>,
    scores: Vec<(usize, f64)>,
}

holds_model!(FedFomoClient: model);

impl Algorithm for FedFomo {
    const NAMES: &'static [Info] = &[Info {
        name: "fedfomo",
        summary: "client i mixes the M = 5 models the server sends (top M of its affinity row, ε-greedy: epsilon 0.3 − 0.05/round) with w_j ∝ max(0, ΔL_val/‖θ_j − θ_i‖), own model if none helps; P[i] += ΔL_val/‖θ_j − θ_i‖ (signed)",
        reference: "Zhang et al., ICLR 2021",
    }];
    type Params = FedFomoParams;
    type Client = FedFomoClient;
    type Server = FedFomoServer;
    /// The M chosen clients' models.
    type Down = Relayed;
    /// The trained model and the weights used.
    type Up = FomoUp;

    fn new(_: &'static str, params: Checked<FedFomoParams>, env: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            params: params.into_inner(),
            seed: crate::init_seed(env.init),
        })
    }

    fn init_server(&self, env: &Env) -> FedFomoServer {
        let n = env.clients();
        let mut affinity = vec![vec![0.0; n]; n];
        for (i, row) in affinity.iter_mut().enumerate() {
            row[i] = 1.0;
        }
        FedFomoServer {
            affinity,
            store: Store::new(n),
        }
    }

    fn init_client(&self, env: &Env, _: usize) -> FedFomoClient {
        FedFomoClient {
            model: env.initial_model(),
            received: Relayed::default(),
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut FedFomoClient,
    ) -> Trained<FomoUp> {
        let Weighed { row, scores } = self.combine(env, &holdout(cx), state);
        let train_loss = cx.train_plain(env, &mut state.model, &[]);
        Trained {
            up: RowUp {
                model: state.model.params.clone(),
                row,
                extra: scores,
            },
            train_loss,
        }
    }

    fn aggregate(
        &self,
        env: &Env,
        server: &mut FedFomoServer,
        round: usize,
        uploads: &[(usize, FomoUp)],
    ) -> RoundOutcome<Relayed> {
        server.store.update(uploads);
        for (i, up) in uploads {
            for &(j, w) in &up.extra {
                server.affinity[*i][j] += w;
            }
        }
        let known = server.store.known();
        let eps = epsilon_at(&self.params, round);
        let downloads = uploads
            .iter()
            .map(|(i, _)| {
                let mut rng = rng_stream(self.seed, round as u64, *i as u64, Purpose::Selection);
                let ids = choose(
                    &server.affinity[*i],
                    *i,
                    &known,
                    self.params.m,
                    eps,
                    &mut rng,
                );
                (*i, server.store.relay(&ids))
            })
            .collect();
        RoundOutcome::new(uploaded_rows(env.clients(), uploads), downloads)
    }

    fn check_download(&self, env: &Env, down: &Relayed) -> Result<(), String> {
        down.check(env)
    }

    fn receive(&self, _: &Env, state: &mut FedFomoClient, down: Relayed) {
        state.received = down;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Tiny;

    #[test]
    fn weights_are_improvement_per_distance_clipped_and_normalised() {
        // Own loss 1.0; model a improves by 0.5 at distance 1, b by 0.5 at
        // distance 4, c makes things worse.
        let scores = fomo_scores(1.0, &[0.5, 0.5, 1.2], &[1.0, 4.0, 1.0]);
        let (a, b) = (0.5 / (1.0 + 1e-5), 0.5 / (4.0 + 1e-5));
        assert_eq!(scores, [a, b, (1.0 - 1.2) / (1.0 + 1e-5)]);
        let w = fomo_weights(&scores).unwrap();
        assert!((w[0] - a / (a + b)).abs() < 1e-12);
        assert!((w[1] - b / (a + b)).abs() < 1e-12);
        assert!((w[0] - 0.8).abs() < 1e-5, "{w:?}");
        assert_eq!(w[2], 0.0);
        // Nothing helps: keep the own model.
        assert_eq!(
            fomo_weights(&fomo_scores(1.0, &[1.0, 3.0], &[1.0, 1.0])),
            None
        );
    }

    #[test]
    fn epsilon_decays_to_zero_and_choice_follows_affinity() {
        let p = FedFomoParams::default();
        assert!((epsilon_at(&p, 1) - 0.3).abs() < 1e-12);
        assert!((epsilon_at(&p, 3) - 0.2).abs() < 1e-12);
        assert_eq!(epsilon_at(&p, 7), 0.0);
        assert_eq!(epsilon_at(&p, 70), 0.0);
        let affinity = [1.0, 0.1, 0.7, 0.0, 0.9];
        let known = [0, 1, 2, 3, 4];
        let mut rng = rng_stream(1, 1, 0, Purpose::Selection);
        for _ in 0..20 {
            assert_eq!(choose(&affinity, 0, &known, 2, 0.0, &mut rng), vec![4, 2]);
        }
        // ε = 1: random others, never the client itself, M distinct.
        let mut seen = [0usize; 5];
        for _ in 0..200 {
            let c = choose(&affinity, 0, &known, 2, 1.0, &mut rng);
            assert_eq!(c.len(), 2);
            assert_ne!(c[0], c[1]);
            for j in c {
                seen[j] += 1;
            }
        }
        assert_eq!(seen[0], 0);
        assert!(seen[1..].iter().all(|&s| s > 50), "{seen:?}");
    }

    /// A round on the Tiny fixture: a client that receives a model trained on
    /// its own data and a useless one moves to the first, uploads that row,
    /// and the server adds the row to P and logs it.
    #[test]
    fn client_mixes_helpful_models_and_server_updates_affinity() {
        let tiny = Tiny::new();
        let env = tiny.env();
        let algo = FedFomo::new(
            "fedfomo",
            FedFomoParams::default().check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let mut server = algo.init_server(&env);
        // Client 2's data covers client 0's classes: train a good model there.
        let mut good = env.initial_model();
        for r in 1..=5 {
            tiny.cx(2, r).train_plain(&env, &mut good, &[]);
        }
        let useless: Vec<f32> = env.init.iter().map(|x| x * 40.0).collect();
        let mut state = algo.init_client(&env, 0);
        algo.receive(
            &env,
            &mut state,
            Relayed {
                ids: vec![1, 2],
                models: vec![useless, good.params.clone()],
            },
        );
        let mut cx = tiny.cx(0, 2);
        let weighed = algo.combine(&env, &holdout(&cx), &mut state);
        assert_eq!(weighed.row, vec![(2, 1.0)]);
        let (useless_score, good_score) = (weighed.scores[0], weighed.scores[1]);
        assert_eq!((useless_score.0, good_score.0), (1, 2));
        assert!(useless_score.1 < 0.0 && good_score.1 > 0.0, "{weighed:?}");
        assert_eq!(state.model.params, good.params);
        assert!(state.received.ids.is_empty());
        // Nothing received: the client keeps its model and uploads no row.
        let up = algo.local_round(&env, &mut cx, &mut state).up;
        assert!(up.row.is_empty() && up.extra.is_empty());
        let uploads = vec![
            (
                0,
                FomoUp {
                    model: up.model,
                    row: weighed.row,
                    extra: weighed.scores,
                },
            ),
            (
                1,
                FomoUp {
                    model: env.init.to_vec(),
                    ..FomoUp::default()
                },
            ),
        ];
        let out = algo.aggregate(&env, &mut server, 2, &uploads);
        // P grows by the signed scores; the graph logs the mixing row.
        assert_eq!(server.affinity[0], vec![1.0, useless_score.1, good_score.1]);
        assert_eq!(out.graph.row(0), &[0.0, 0.0, 1.0]);
        assert_eq!(out.graph.row(1), &[0.0, 1.0, 0.0]);
        // Client 0 is sent the one other known model, client 1's.
        let (_, d0) = &out.downloads[0];
        assert_eq!(d0.ids, vec![1]);
    }

    /// N = 20 > M + 1: a client that received a harmful model gives it a
    /// negative affinity, so the top-M choice draws it less often than the
    /// clients it never tried (before, its affinity stayed 0, tied with
    /// theirs, and the random tie-break kept drawing it).
    #[test]
    fn a_harmful_client_is_drawn_less_than_untried_ones() {
        let tiny = Tiny::new();
        let sizes = vec![12; 20];
        let env = Env {
            sizes: &sizes,
            ..tiny.env()
        };
        let algo = FedFomo::new(
            "fedfomo",
            FedFomoParams::default().check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let (harmful, helpful) = (7, 2);
        let mut good = env.initial_model();
        for r in 1..=5 {
            tiny.cx(2, r).train_plain(&env, &mut good, &[]);
        }
        let bad: Vec<f32> = env.init.iter().map(|x| x * 40.0).collect();
        let mut state = algo.init_client(&env, 0);
        algo.receive(
            &env,
            &mut state,
            Relayed {
                ids: vec![harmful, helpful],
                models: vec![bad, good.params.clone()],
            },
        );
        let mut server = algo.init_server(&env);
        let mut drawn = [0usize; 20];
        for round in 2..=40 {
            let up = algo
                .local_round(&env, &mut tiny.cx(0, round), &mut state)
                .up;
            let mut uploads = vec![(0, up)];
            uploads.extend((1..20).map(|i| {
                (
                    i,
                    FomoUp {
                        model: env.init.to_vec(),
                        ..FomoUp::default()
                    },
                )
            }));
            let out = algo.aggregate(&env, &mut server, round, &uploads);
            // Client 0 weighs only what it was first sent; what it is sent
            // now is counted.
            for &j in &out.downloads[0].1.ids {
                drawn[j] += 1;
            }
        }
        assert!(
            server.affinity[0][harmful] < 0.0,
            "{:?}",
            server.affinity[0]
        );
        assert!(server.affinity[0][helpful] > 0.0);
        let untried: Vec<usize> = (1..20).filter(|&j| j != harmful && j != helpful).collect();
        let fewest_untried = untried.iter().map(|&j| drawn[j]).min().unwrap();
        assert!(
            drawn[harmful] < fewest_untried,
            "harmful drawn {} times, untried at least {fewest_untried}: {drawn:?}",
            drawn[harmful]
        );
    }

    #[test]
    fn bad_parameters_are_rejected() {
        let bad = FedFomoParams {
            m: 0,
            ..Default::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("algorithm.m")
        );
        let bad = FedFomoParams {
            epsilon: 1.5,
            ..Default::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("algorithm.epsilon")
        );
    }
}
