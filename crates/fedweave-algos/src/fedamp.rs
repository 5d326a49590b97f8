//! Attentive message passing: FedAMP (Huang et al., AAAI 2021) and its
//! heuristic variant HeurFedAMP (`h-fedamp`, same paper, as the pFedGraph
//! repository runs it).
//!
//! Each client keeps its own model θ_i and a "personalised cloud model"
//! u_i = Σ_j ξ_ij θ_j that the server builds for it; locally it trains θ_i
//! from where it was (it is never reset to u_i) on
//! F_i(θ) + μ/2·‖θ − u_i‖², with the real gradient μ(θ − u_i). Round 1 has
//! no cloud model yet, so no proximal term (the pFedGraph code skips it in
//! its first round too).
//!
//! **FedAMP** (`fedamp`; paper Eq. 5–7, PFLlib `serveramp.py`): for j ≠ i,
//! ξ_ij = α_K · A′(‖θ_i − θ_j‖²) with A(x) = 1 − e^{−x/σ}, i.e.
//! ξ_ij = α_K · e^{−‖θ_i − θ_j‖²/σ} / σ, and ξ_ii = 1 − Σ_{j≠i} ξ_ij.
//! The paper asks α_K small enough that ξ_ii ≥ 0; PFLlib does not check
//! and would mix with a negative self weight. fedweave keeps the row a
//! distribution: when Σ_{j≠i} ξ_ij > 1 the off-diagonal weights are scaled
//! to sum to 1 and ξ_ii = 0. The proximal coefficient is the paper's
//! λ/α_K (objective λ/(2α_K)·‖θ − u_i‖²). PFLlib adds
//! `0.5·λ/α_K·‖θ − u‖` (not squared) on `.data` tensors, so its term has
//! **no gradient** and training is plain cross-entropy; fedweave follows
//! the paper. Defaults are FedAGHN's FedAMP settings (α_K = 100, λ = 1,
//! σ = 1e4; PFLlib's own are α_K = σ = λ = 1, FedDWA's σ = 1, α_K = 1,
//! λ = 0.1). With them ξ_ij ≤ α_K/σ = 0.01, so each client keeps at least
//! 1 − 0.01·(N − 1) of itself: on 10 digits clients (MLP) the rows are
//! ≈ 0.91 self and 0.01 each other, close to Local.
//!
//! **HeurFedAMP** (`h-fedamp`; pFedGraph `fedamp/utils.py`): with
//! Δ_i = θ_i − θ_init (the round-0 model) and c_ij = cos(Δ_i, Δ_j),
//! ξ_ii = `self_weight` (0.3) and ξ_ij ∝ exp(σ·c_ij) for j ≠ i, scaled to
//! sum 1 − `self_weight`; σ = 10. Local objective
//! CE + λ/2·‖θ − u_i‖², λ = 1, with its real gradient, as the code.
//!
//! Graph rule: W = ξ over the round's participants (identity rows for
//! absent clients); each participant receives its u_i. Pairwise distances
//! and cosines come from the blocked-GEMM kernels of
//! [`fedweave_core::pairwise`], the mixing from [`Kernels::mix`](fedweave_core::pairwise::Kernels::mix).
//! Evaluation: θ_i after local training (both reference codes score the
//! trained local model).

use crate::Checked;
use crate::contract::Params;
use crate::contract::holds_model;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{
    AlgoError, Algorithm, ClientCx, Env, Info, Model, ParamError, RoundOutcome, Trained,
    embed_rows, ids_of, models_of,
};
use fedweave_core::pairwise::{Matrix, View};
use fedweave_nn::{ExtraLoss, Proximal};
use serde::{Deserialize, Serialize};

/// How a variant turns the participants' models into the rows ξ and how
/// strongly a client is pulled toward its cloud model: the only difference
/// between FedAMP and HeurFedAMP.
pub trait Attention: Params + Send + Sync + 'static {
    /// The variant's name and summary.
    const NAMES: &'static [Info];
    /// ξ over the participants, one row per participant (`models` in
    /// ascending client order), each summing to 1.
    fn rows(&self, env: &Env, models: &[&[f32]]) -> Vec<Vec<f64>>;
    /// μ of the local term μ/2·‖θ − u_i‖².
    fn mu(&self) -> f64;
}

params! {
    /// FedAMP's parameters.
    pub struct FedAmpParams {
        /// α_K: the attention scale (ξ_ij = α_K·e^{−d/σ}/σ) and the
        /// denominator of the proximal coefficient λ/α_K.
        pub alpha_k: f64 = 100.0,
        /// λ of the local term λ/(2α_K)·‖θ − u_i‖².
        pub lambda: f64 = 1.0,
        /// σ of the kernel e^{−‖θ_i − θ_j‖²/σ}/σ.
        pub sigma: f64 = 1e4,
    }
}

impl Validate for FedAmpParams {
    fn validate(&self) -> Result<(), ParamError> {
        positive("alpha_k", self.alpha_k)?;
        positive("sigma", self.sigma)?;
        non_negative("lambda", self.lambda)
    }
}

/// `Err` unless `x` is finite and > 0.
fn positive(key: &'static str, x: f64) -> Result<(), ParamError> {
    if x > 0.0 && x.is_finite() {
        Ok(())
    } else {
        Err(ParamError::new(
            key,
            format!("must be a finite number > 0, got {x}"),
        ))
    }
}

/// FedAMP's rows from the squared distances `d` (participants ×
/// participants): ξ_ij = α_K·e^{−d_ij/σ}/σ for j ≠ i, ξ_ii = 1 − Σ_{j≠i} ξ_ij,
/// the off-diagonal part scaled to sum 1 (ξ_ii = 0) when it exceeds 1.
pub fn exp_attention(d: &Matrix, alpha_k: f64, sigma: f64) -> Vec<Vec<f64>> {
    let n = d.rows();
    (0..n)
        .map(|i| {
            let mut row: Vec<f64> = (0..n)
                .map(|j| {
                    if i == j {
                        0.0
                    } else {
                        alpha_k * (-d.get(i, j) / sigma).exp() / sigma
                    }
                })
                .collect();
            let off: f64 = row.iter().sum();
            if off > 1.0 {
                row.iter_mut().for_each(|w| *w /= off);
            } else {
                row[i] = 1.0 - off;
            }
            row
        })
        .collect()
}

impl Attention for FedAmpParams {
    const NAMES: &'static [Info] = &[Info {
        name: "fedamp",
        summary: "u_i = Σ_j ξ_ij θ_j, ξ_ij = α_K·exp(−‖θ_i−θ_j‖²/σ)/σ, ξ_ii = 1 − Σ (alpha_k 100, sigma 1e4); local CE + λ/(2α_K)‖θ−u_i‖² (lambda 1, real gradient)",
        reference: "Huang et al., AAAI 2021",
    }];

    fn rows(&self, env: &Env, models: &[&[f32]]) -> Vec<Vec<f64>> {
        let d = env.kernels.sq_dist_matrix_sym(models, &View::all());
        exp_attention(&d, self.alpha_k, self.sigma)
    }

    fn mu(&self) -> f64 {
        self.lambda / self.alpha_k
    }
}

params! {
    /// HeurFedAMP's parameters.
    pub struct HeurFedAmpParams {
        /// ξ_ii, the weight of the client's own model.
        pub self_weight: f64 = 0.3,
        /// σ of exp(σ·cos(Δ_i, Δ_j)).
        pub sigma: f64 = 10.0,
        /// λ of the local term λ/2·‖θ − u_i‖².
        pub lambda: f64 = 1.0,
    }
}

impl Validate for HeurFedAmpParams {
    fn validate(&self) -> Result<(), ParamError> {
        if !(0.0..=1.0).contains(&self.self_weight) {
            return Err(ParamError::new(
                "self_weight",
                format!("must lie in [0, 1], got {}", self.self_weight),
            ));
        }
        non_negative("sigma", self.sigma)?;
        non_negative("lambda", self.lambda)
    }
}

/// HeurFedAMP's rows from the cosines `c` of the participants' Δ:
/// ξ_ii = `self_weight`, ξ_ij = (1 − self_weight)·e^{σ c_ij}/Σ_{k≠i} e^{σ c_ik}.
/// A lone participant keeps its own model.
pub fn cosine_attention(c: &Matrix, sigma: f64, self_weight: f64) -> Vec<Vec<f64>> {
    let n = c.rows();
    (0..n)
        .map(|i| {
            if n == 1 {
                return vec![1.0];
            }
            // Shift by the largest exponent: the ratios are unchanged and
            // σ = 100 (FedAGHN's setting) cannot overflow.
            let top = (0..n)
                .filter(|&j| j != i)
                .map(|j| sigma * c.get(i, j))
                .fold(f64::NEG_INFINITY, f64::max);
            let mut row: Vec<f64> = (0..n)
                .map(|j| {
                    if i == j {
                        0.0
                    } else {
                        (sigma * c.get(i, j) - top).exp()
                    }
                })
                .collect();
            let off: f64 = row.iter().sum();
            row.iter_mut().for_each(|w| *w *= (1.0 - self_weight) / off);
            row[i] = self_weight;
            row
        })
        .collect()
}

impl Attention for HeurFedAmpParams {
    const NAMES: &'static [Info] = &[Info {
        name: "h-fedamp",
        summary: "u_i = Σ_j ξ_ij θ_j, ξ_ii = self_weight (0.3), ξ_ij ∝ exp(σ·cos(Δ_i, Δ_j)) (sigma 10), Δ = θ−θ_init; local CE + λ/2‖θ−u_i‖² (lambda 1)",
        reference: "Huang et al., AAAI 2021 (HeurFedAMP, pFedGraph's code)",
    }];

    fn rows(&self, env: &Env, models: &[&[f32]]) -> Vec<Vec<f64>> {
        let c = env
            .kernels
            .cosine_matrix_sym(models, &View::all().with_shift(env.init));
        cosine_attention(&c, self.sigma, self.self_weight)
    }

    fn mu(&self) -> f64 {
        self.lambda
    }
}

/// FedAMP (`Amp<FedAmpParams>`) or HeurFedAMP (`Amp<HeurFedAmpParams>`).
pub struct Amp<R> {
    params: R,
}

/// FedAMP.
pub type FedAmp = Amp<FedAmpParams>;
/// HeurFedAMP.
pub type HeurFedAmp = Amp<HeurFedAmpParams>;

/// A client: its own model and the last cloud model it received.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AmpClient {
    /// θ_i.
    pub model: Model,
    /// u_i (none before the first download).
    #[serde(with = "fedweave_core::stash::opt_vector")]
    pub cloud: Option<Vec<f32>>,
}

impl<R: Attention> Amp<R> {
    /// The local term toward `cloud`: μ/2·‖θ − u_i‖².
    fn proximal<'a>(&self, cloud: &'a [f32]) -> Proximal<'a> {
        Proximal {
            mu: self.params.mu() as f32,
            anchor: cloud,
        }
    }
}

holds_model!(AmpClient: model);

/// Its messages are models: it takes a personal part ([`crate::personal`]).
impl<R: Attention> crate::personal::Splittable for Amp<R> {}

impl<R: Attention> Algorithm for Amp<R> {
    const NAMES: &'static [Info] = R::NAMES;
    type Params = R;
    type Client = AmpClient;
    type Server = ();
    /// u_i.
    type Down = Vec<f32>;
    /// θ_i after training.
    type Up = Vec<f32>;

    fn new(_: &'static str, params: Checked<R>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_client(&self, env: &Env, _: usize) -> AmpClient {
        AmpClient {
            model: env.initial_model(),
            cloud: None,
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut AmpClient,
    ) -> Trained<Vec<f32>> {
        let prox = state.cloud.as_deref().map(|u| self.proximal(u));
        let extras: Vec<&dyn ExtraLoss> = prox.iter().map(|p| p as &dyn ExtraLoss).collect();
        let train_loss = cx.train_plain(env, &mut state.model, &extras);
        Trained {
            up: state.model.params.clone(),
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
        let participants = ids_of(uploads);
        let models = models_of(uploads);
        let rows = self.params.rows(env, &models);
        let clouds = env.kernels.mix(&rows, &models).into_rows();
        RoundOutcome::new(
            embed_rows(env.clients(), &participants, &rows),
            participants.into_iter().zip(clouds).collect(),
        )
    }

    fn receive(&self, _: &Env, state: &mut AmpClient, cloud: Vec<f32>) {
        state.cloud = Some(cloud);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Tiny;
    use fedweave_core::vecmath::sq_dist;

    fn matrix(rows: &[&[f32]]) -> Matrix {
        fedweave_core::pairwise::Kernels::cpu().sq_dist_matrix_sym(rows, &View::all())
    }

    #[test]
    fn fedamp_weights_are_the_exp_kernel_with_the_rest_on_the_diagonal() {
        // ‖θ0−θ1‖² = 1, ‖θ0−θ2‖² = 4, ‖θ1−θ2‖² = 1 (points 0, 1, 2 on a line).
        let d = matrix(&[&[0.0], &[1.0], &[2.0]]);
        let (a, s) = (0.5, 2.0);
        let rows = exp_attention(&d, a, s);
        let k = |x: f64| a * (-x / s).exp() / s;
        let expect = [
            [1.0 - k(1.0) - k(4.0), k(1.0), k(4.0)],
            [k(1.0), 1.0 - 2.0 * k(1.0), k(1.0)],
            [k(4.0), k(1.0), 1.0 - k(1.0) - k(4.0)],
        ];
        for (r, e) in rows.iter().zip(&expect) {
            for (x, y) in r.iter().zip(e) {
                assert!((x - y).abs() < 1e-12, "{rows:?}");
            }
        }
        // By hand: k(1) = 0.25·e^{-1/2} = 0.151633; ξ_11 = 1 − 2·0.151633.
        assert!((rows[1][1] - 0.696734).abs() < 1e-6);
    }

    #[test]
    fn fedamp_rows_with_too_much_attention_are_rescaled_without_negative_self_weight() {
        // Identical models: ξ_ij = α_K/σ = 0.8 each, Σ = 1.6 > 1 → 0.5, 0.5, ξ_ii = 0.
        let d = matrix(&[&[1.0], &[1.0], &[1.0]]);
        let rows = exp_attention(&d, 0.8, 1.0);
        assert_eq!(rows[0], vec![0.0, 0.5, 0.5]);
        assert_eq!(rows[2], vec![0.5, 0.5, 0.0]);
    }

    #[test]
    fn heuristic_weights_are_a_softmax_of_cosines_around_the_self_weight() {
        // Δ0 = (1,0), Δ1 = (0,1), Δ2 = (1,1): c01 = 0, c02 = c12 = 1/√2.
        let c = fedweave_core::pairwise::Kernels::cpu().cosine_matrix_sym(
            &[vec![1.0f32, 0.0], vec![0.0, 1.0], vec![1.0, 1.0]],
            &View::all(),
        );
        let rows = cosine_attention(&c, 10.0, 0.3);
        let e = (10.0 * std::f64::consts::FRAC_1_SQRT_2).exp();
        // Row 0: self 0.3; others 0.7·(1, e)/(1 + e).
        let expect0 = [0.3, 0.7 / (1.0 + e), 0.7 * e / (1.0 + e)];
        for (x, y) in rows[0].iter().zip(&expect0) {
            assert!((x - y).abs() < 1e-12, "{rows:?}");
        }
        // Row 2: both others at cosine 1/√2, so 0.35 each.
        for (x, y) in rows[2].iter().zip(&[0.35, 0.35, 0.3]) {
            assert!((x - y).abs() < 1e-12, "{rows:?}");
        }
        let lone = fedweave_core::pairwise::Kernels::cpu()
            .cosine_matrix_sym(&[vec![1.0f32]], &View::all());
        assert_eq!(cosine_attention(&lone, 10.0, 0.3), vec![vec![1.0]]);
    }

    #[test]
    fn proximal_term_has_the_papers_value_and_a_matching_gradient() {
        let amp = FedAmp::new(
            "fedamp",
            FedAmpParams {
                alpha_k: 4.0,
                lambda: 2.0,
                sigma: 1.0,
            }
            .check(Tiny::new().env().clients())
            .unwrap(),
            &Tiny::new().env(),
        )
        .unwrap();
        let u = [0.5f32, -1.0, 2.0];
        let theta = [1.0f32, 1.0, -1.0];
        let term = amp.proximal(&u);
        // λ/(2α_K)·‖θ − u‖² = 2/8·(0.25 + 4 + 9).
        let mut grad = [0.0f32; 3];
        let value = term.add_value_and_grad(&theta, &mut grad);
        assert!((value - 0.25 * 13.25).abs() < 1e-6);
        let h = 1e-3f32;
        for k in 0..3 {
            let (mut p, mut m) = (theta, theta);
            p[k] += h;
            m[k] -= h;
            let f = |x: &[f32]| 0.25 * sq_dist(x, &u);
            let fd = (f(&p) - f(&m)) / (2.0 * h as f64);
            assert!(
                (grad[k] as f64 - fd).abs() < 1e-3,
                "{k}: {} vs {fd}",
                grad[k]
            );
        }
    }

    #[test]
    fn the_term_reaches_the_trained_parameters() {
        // One plain-SGD step with and without the term differ by exactly
        // lr·μ(θ − u): the gradient is real, unlike PFLlib's `.data` term.
        let tiny = Tiny::new();
        let env = tiny.env();
        let amp = HeurFedAmp::new(
            "h-fedamp",
            HeurFedAmpParams {
                lambda: 2.0,
                ..Default::default()
            }
            .check(env.clients())
            .unwrap(),
            &env,
        )
        .unwrap();
        let u: Vec<f32> = tiny.init.iter().map(|x| x + 0.5).collect();
        let model = env.initial_model();
        let sgd = fedweave_nn::SgdConfig::default();
        let data = tiny.cx(0, 1).data.train;
        let step = |extras: &[&dyn ExtraLoss]| {
            let mut t = fedweave_nn::LocalTrainer::new(
                &tiny.spec,
                &fedweave_nn::Device::flex(),
                &model.params,
                &model.buffers,
                sgd,
                None,
            );
            t.loss_and_grad(&data, &[0, 1, 2, 3], extras);
            t.step(&[], 0.1);
            let mut out = vec![0.0; model.params.len()];
            t.read_params(&mut out);
            out
        };
        let plain = step(&[]);
        let prox = amp.proximal(&u);
        let pulled = step(&[&prox]);
        for ((a, b), (t, c)) in plain.iter().zip(&pulled).zip(tiny.init.iter().zip(&u)) {
            let expect = -0.1 * 2.0 * (t - c);
            assert!(((b - a) - expect).abs() < 1e-5, "{} vs {expect}", b - a);
        }
    }

    #[test]
    fn participants_receive_their_mixed_cloud_models_and_absent_rows_stay_identity() {
        let tiny = Tiny::new();
        let env = tiny.env();
        let amp = HeurFedAmp::new(
            "h-fedamp",
            HeurFedAmpParams::default().check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let d = tiny.init.len();
        let up = |s: f32| -> Vec<f32> {
            tiny.init
                .iter()
                .enumerate()
                .map(|(k, x)| x + s * (k % 3) as f32)
                .collect()
        };
        let uploads = vec![(0, up(1.0)), (2, up(-1.0))];
        let out = amp.aggregate(&env, &mut (), 1, &uploads);
        // Two participants: each takes 0.3 of itself and 0.7 of the other.
        for (x, y) in out.graph.row(0).iter().zip(&[0.3, 0.0, 0.7]) {
            assert!((x - y).abs() < 1e-12, "{:?}", out.graph.row(0));
        }
        assert_eq!(out.graph.row(1), &[0.0, 1.0, 0.0]);
        assert_eq!(out.downloads.len(), 2);
        let (i, u0) = &out.downloads[0];
        assert_eq!((*i, u0.len()), (0, d));
        for ((u, a), b) in u0.iter().zip(&uploads[0].1).zip(&uploads[1].1) {
            let expect = 0.3 * *a as f64 + 0.7 * *b as f64;
            assert!((*u as f64 - expect).abs() < 1e-6);
        }
    }

    #[test]
    fn impossible_parameters_name_their_key() {
        let bad = FedAmpParams {
            sigma: 0.0,
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().key, "sigma");
        let bad = HeurFedAmpParams {
            self_weight: 1.5,
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().key, "self_weight");
    }
}
