//! FedDWA (Liu et al., IJCAI 2023): personalized FL with dynamic weight
//! adjustment.
//!
//! Client: trains as configured to ŵ_i, then derives a *guidance model*
//! ŵ*_i — a guess of where its own optimum lies — from one more local epoch
//! of mini-batch SGD on a copy (the authors' code and the paper's Alg. 1;
//! `guidance = "full_batch"` takes the single full-batch gradient step of
//! Eq. 16 instead). Both are uploaded.
//!
//! Graph rule over the round's participants (recipient i, source j, self
//! included): P_ij ∝ 1/‖ŵ*_i − ŵ_j‖², normalised per recipient, then only the
//! `top_k` largest (K = 5) are kept and renormalised. The next model of i is
//! Σ_j P_ij ŵ_j — the *trained* models, not the guidance models. This is the
//! diagonal approximation of min_P ‖ŵ*_i − Σ_j P_ij ŵ_j‖² (paper Eq. 15).
//!
//! Every element of fedweave's flat parameter vector is a trainable
//! parameter (batch-norm running statistics are never part of it), so
//! "only trainable parameters are mixed; BN buffers stay local" holds by
//! construction.
//!
//! The self distance ‖ŵ*_i − ŵ_i‖² is one guidance epoch of movement, so the
//! rows carry real off-diagonal weight only while that is comparable with the
//! distances between clients — the paper's regime of E = 1 local epoch. With
//! many local steps per round the rows approach the identity (FedDWA then
//! behaves like Local), and they do so over rounds as local models converge.
//!
//! Evaluation: FedDWA scores each client's aggregated personalised model
//! before it trains again (METHODS.md §4.4), so fedweave evaluates after
//! mixing. Absent clients keep their last personalised model.

use crate::Checked;
use crate::params::Validate;
use crate::params::params;
use crate::{
    AlgoError, Algorithm, ClientCx, Env, EvalPoint, Info, Message, Model, ParamError, RoundOutcome,
    Trained, embed_rows, ids_of, mix_rows,
};
use fedweave_core::CollaborationGraph;
use fedweave_core::pairwise::{Kernels, View};
use fedweave_nn::TrainConfig;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Smallest squared distance used in 1/‖ŵ*_i − ŵ_j‖², so that a guidance
/// model equal to some trained model gives a huge but finite weight, never
/// a division by zero.
pub const MIN_SQ_DIST: f64 = 1e-12;

/// How the guidance model ŵ*_i is derived from the trained model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Guidance {
    /// One more local epoch of mini-batch SGD on a copy (code and Alg. 1; the
    /// default).
    Epoch,
    /// One gradient step on the whole local training set, no momentum
    /// (paper Eq. 16).
    FullBatch,
}

params! {
    /// FedDWA's parameters.
    pub struct FedDwaParams {
        /// K: collaborators kept per recipient, self included (paper: 5, robust
        /// over 1–10).
        pub top_k: usize = 5,
        /// How the guidance model is computed.
        pub guidance: Guidance = Guidance::Epoch,
    }
}

impl Validate for FedDwaParams {
    fn validate(&self) -> Result<(), ParamError> {
        if self.top_k == 0 {
            return Err(ParamError::new("top_k", "must be at least 1"));
        }
        Ok(())
    }
}

/// The FedDWA algorithm.
pub struct FedDwa {
    params: FedDwaParams,
}

/// A FedDWA upload: the trained model ŵ_i and the guidance model ŵ*_i.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Guided {
    /// ŵ_i, what the others mix.
    pub model: Vec<f32>,
    /// ŵ*_i, where client i's optimum seems to lie.
    pub guidance: Vec<f32>,
}

impl Message for Guided {
    fn vectors(&self) -> Vec<&[f32]> {
        vec![&self.model, &self.guidance]
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.model, &mut self.guidance]
    }
}

impl crate::personal::ModelMessage for Guided {
    fn map_models(self, mut f: impl FnMut(Vec<f32>) -> Vec<f32>) -> Self {
        Self {
            model: f(self.model),
            guidance: f(self.guidance),
        }
    }
}

/// Rows of P over the participants: row i ∝ 1/max(‖guidance_i − models_j‖²,
/// [`MIN_SQ_DIST`]), normalised, cut to its `top_k` largest entries (ties go
/// to the lower index, so the result is deterministic) and renormalised.
/// The distances are one blocked GEMM ([`Kernels::sq_dist_nearest`]: every
/// distance that can reach the top-k within 1e-9 relative of the exact value;
/// from 64 models on the others are `f32`-block estimates, which only enter
/// the normalisation that the top-k cut undoes).
pub fn dwa_rows(
    kernels: &Kernels,
    guidance: &[&[f32]],
    models: &[&[f32]],
    top_k: usize,
) -> Vec<Vec<f64>> {
    kernels
        .sq_dist_nearest(guidance, models, &View::all(), top_k, MIN_SQ_DIST)
        .into_rows()
        .into_par_iter()
        .map(|dist| {
            let inv: Vec<f64> = dist.iter().map(|d| 1.0 / d.max(MIN_SQ_DIST)).collect();
            let total: f64 = inv.iter().sum();
            let mut row: Vec<f64> = inv.iter().map(|w| w / total).collect();
            if top_k < row.len() {
                let mut order: Vec<usize> = (0..row.len()).collect();
                // Stable sort: equal weights keep index order.
                order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
                for &j in &order[top_k..] {
                    row[j] = 0.0;
                }
                let kept: f64 = row.iter().sum();
                row.iter_mut().for_each(|w| *w /= kept);
            }
            row
        })
        .collect()
}

/// FedDWA's server step, the one implementation behind
/// [`Algorithm::aggregate`] and the Python binding (`fedweave.servers`,
/// the Flower strategy): the rows of [`dwa_rows`] over the `participants`
/// (indices among `n` clients, ascending) embedded over all clients
/// (identity rows for absent ones), and each participant's Σ_j P_ij ŵ_j.
pub fn server_step(
    kernels: &Kernels,
    n: usize,
    participants: &[usize],
    guidance: &[&[f32]],
    models: &[&[f32]],
    top_k: usize,
) -> (CollaborationGraph, Vec<(usize, Vec<f32>)>) {
    let rows = dwa_rows(kernels, guidance, models, top_k);
    let graph = embed_rows(n, participants, &rows);
    let downloads = mix_rows(kernels, &graph, participants, models);
    (graph, downloads)
}

/// Its messages are models: it takes a personal part ([`crate::personal`]).
impl crate::personal::Splittable for FedDwa {}

impl Algorithm for FedDwa {
    const NAMES: &'static [Info] = &[Info {
        name: "feddwa",
        summary: "W_ij ∝ 1/‖ŵ*_i − ŵ_j‖² (ŵ* = guidance model, one extra local epoch), top_k = 5 per row; evaluates the mixed model; option guidance = \"full_batch\" (Eq. 16)",
        reference: "Liu et al., IJCAI 2023",
    }];
    type Params = FedDwaParams;
    type Client = Model;
    type Server = ();
    /// Σ_j P_ij ŵ_j.
    type Down = Vec<f32>;
    type Up = Guided;

    fn new(_: &'static str, params: Checked<FedDwaParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_client(&self, env: &Env, _: usize) -> Model {
        env.initial_model()
    }

    fn local_round(&self, env: &Env, cx: &mut ClientCx, model: &mut Model) -> Trained<Guided> {
        let train_loss = cx.train_plain(env, model, &[]);
        // The guidance model is trained on a copy, batch-norm statistics
        // included: the client keeps (and uploads as its model) ŵ_i itself.
        let mut guidance = model.clone();
        let cfg = match self.params.guidance {
            Guidance::Epoch => TrainConfig {
                iterations: 0,
                epochs: 1,
                ..env.train.clone()
            },
            Guidance::FullBatch => TrainConfig {
                batch_size: cx.data.train.len().max(1),
                iterations: 1,
                momentum: 0.0,
                ..env.train.clone()
            },
        };
        cx.train(env, &mut guidance, &cfg, &[], &[], None);
        Trained {
            up: Guided {
                model: model.params.clone(),
                guidance: guidance.params,
            },
            train_loss,
        }
    }

    fn aggregate(
        &self,
        env: &Env,
        _: &mut (),
        _: usize,
        uploads: &[(usize, Guided)],
    ) -> RoundOutcome<Vec<f32>> {
        let participants = ids_of(uploads);
        let models: Vec<&[f32]> = uploads.iter().map(|(_, u)| u.model.as_slice()).collect();
        let guidance: Vec<&[f32]> = uploads.iter().map(|(_, u)| u.guidance.as_slice()).collect();
        let (graph, downloads) = server_step(
            env.kernels,
            env.clients(),
            &participants,
            &guidance,
            &models,
            self.params.top_k,
        );
        RoundOutcome::new(graph, downloads)
    }

    fn receive(&self, _: &Env, model: &mut Model, mixed: Vec<f32>) {
        model.params = mixed;
    }

    /// After receiving: FedDWA evaluates the personalised model each client
    /// receives, before it trains on it (METHODS.md §4.4).
    fn eval_point(&self) -> EvalPoint {
        EvalPoint::AfterReceive
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(v: &[Vec<f32>]) -> Vec<&[f32]> {
        v.iter().map(|x| x.as_slice()).collect()
    }

    /// Trained models at 0, 1 and 3 on a line; client 0's guidance at 0.5.
    fn setup() -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
        let models = vec![vec![0.0f32, 0.0], vec![1.0, 0.0], vec![3.0, 0.0]];
        let guidance = vec![vec![0.5f32, 0.0], vec![1.0, 1.0], vec![3.0, 2.0]];
        (models, guidance)
    }

    #[test]
    fn row_is_normalised_inverse_squared_distance() {
        let (m, g) = setup();
        let rows = dwa_rows(Kernels::cpu(), &refs(&g), &refs(&m), 5);
        // Squared distances from (0.5, 0): 0.25, 0.25, 6.25 → 4, 4, 0.16.
        let total = 4.0 + 4.0 + 0.16;
        let want = [4.0 / total, 4.0 / total, 0.16 / total];
        for (w, e) in rows[0].iter().zip(want) {
            assert!((w - e).abs() < 1e-12, "{:?}", rows[0]);
        }
        // From (1, 1): 2, 1, 5 → 0.5, 1, 0.2.
        let total = 0.5 + 1.0 + 0.2;
        let want = [0.5 / total, 1.0 / total, 0.2 / total];
        for (w, e) in rows[1].iter().zip(want) {
            assert!((w - e).abs() < 1e-12, "{:?}", rows[1]);
        }
    }

    #[test]
    fn top_k_keeps_the_nearest_and_renormalises() {
        let (m, g) = setup();
        let rows = dwa_rows(Kernels::cpu(), &refs(&g), &refs(&m), 1);
        // Client 0's guidance is equally near 0 and 1: the tie goes to 0.
        assert_eq!(rows[0], vec![1.0, 0.0, 0.0]);
        assert_eq!(rows[1], vec![0.0, 1.0, 0.0]);
        // From (3, 2): 13, 8, 4 → the nearest is client 2.
        assert_eq!(rows[2], vec![0.0, 0.0, 1.0]);
        let two = dwa_rows(Kernels::cpu(), &refs(&g), &refs(&m), 2);
        assert_eq!(two[1][2], 0.0);
        assert!((two[1][0] - 1.0 / 3.0).abs() < 1e-12, "{:?}", two[1]);
        assert!((two[1][1] - 2.0 / 3.0).abs() < 1e-12, "{:?}", two[1]);
    }

    #[test]
    fn rows_over_many_models_equal_the_exact_kernels_rows() {
        // 80 models (f32 blocks from 64) on a grid of ties and near-ties:
        // the top-5 support is the exact one, the weights agree to 1e-9.
        let models: Vec<Vec<f32>> = (0..80)
            .map(|j| {
                (0..300)
                    .map(|c| ((j / 2) as f32) * 0.01 + (c % 7) as f32)
                    .collect()
            })
            .collect();
        let guidance: Vec<Vec<f32>> = (0..80)
            .map(|i| {
                models[i]
                    .iter()
                    .map(|x| x + 0.001 * (i % 3) as f32)
                    .collect()
            })
            .collect();
        let exact = Kernels::cpu()
            .clone()
            .with_precision(fedweave_core::pairwise::Precision::F64);
        let got = dwa_rows(Kernels::cpu(), &refs(&guidance), &refs(&models), 5);
        let want = dwa_rows(&exact, &refs(&guidance), &refs(&models), 5);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            for (j, (a, b)) in g.iter().zip(w).enumerate() {
                assert_eq!(*a == 0.0, *b == 0.0, "support ({i},{j})");
                assert!((a - b).abs() <= 1e-9 * b.abs(), "({i},{j}): {a} vs {b}");
            }
        }
    }

    #[test]
    fn zero_distance_gives_no_nan() {
        let m = vec![vec![1.0f32, 2.0], vec![1.0, 2.0], vec![5.0, 5.0]];
        let g = vec![vec![1.0f32, 2.0]];
        let rows = dwa_rows(Kernels::cpu(), &refs(&g), &refs(&m), 5);
        assert!(rows[0].iter().all(|w| w.is_finite()), "{:?}", rows[0]);
        assert!((rows[0].iter().sum::<f64>() - 1.0).abs() < 1e-12);
        // Two identical models at distance zero share the weight.
        assert!((rows[0][0] - 0.5).abs() < 1e-9 && (rows[0][1] - 0.5).abs() < 1e-9);
        assert!(rows[0][2] < 1e-9);
    }

    #[test]
    fn top_k_zero_is_rejected() {
        let p = FedDwaParams {
            top_k: 0,
            ..Default::default()
        };
        assert!(
            p.validate()
                .unwrap_err()
                .to_string()
                .contains("algorithm.top_k")
        );
    }
}
