//! pFedGraph (Ye et al., ICML 2023): personalized FL with inferred
//! collaboration graphs.
//!
//! Graph rule: S_ij = cos(θ_i − θ_init, θ_j − θ_init) with θ_init the round-0
//! model, values above 0.9 set to 1; row i of W is the Euclidean projection
//! of p + s_i/(2·alpha) onto the simplex — the exact solution of the paper's
//! per-client quadratic program (see `fedweave_core::simplex`). Mixed model
//! θ̃_i = Σ_j W_ij θ_j; each client starts its next round from θ̃_i.
//!
//! Local objective (from the second round on): CE − λ·cos(θ, θ̃_i), the
//! paper's pull toward the mixed model. `reg_sign = "code"` and
//! `reg_target = "normalized"` reproduce the authors' code, which adds
//! +λ·⟨c_i, θ⟩/‖θ‖ with c_i = Σ_j W_ij θ_j/‖θ_j‖ (METHODS.md §1.4).
//!
//! Partial participation: the graph is inferred over the round's
//! participants only; an absent client gets an identity row and keeps the
//! mix θ̃_i it last received (and its regulariser target), untrained since —
//! the authors' code keeps `personalized_model_list[i]` the same way — so
//! when it next takes part it starts from that stale mix, and between
//! times it is scored on it. `fedweave-sim`'s partial-participation test
//! checks this for every algorithm (absent: no training, identity row,
//! model unchanged unless the method addresses it).

use crate::Checked;
use crate::contract::holds_model;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{
    AlgoError, Algorithm, ClientCx, Env, Info, Message, Model, ParamError, RoundOutcome, Trained,
    embed_rows, ids_of, mix_rows, models_of,
};
use fedweave_core::pairwise::{Kernels, View};
use fedweave_core::vecmath::norm;
use fedweave_core::{CollaborationGraph, project_to_simplex};
use fedweave_nn::CosinePull;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// Which layers the similarity is computed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SimilarityOn {
    /// The whole model (the code's `difference_measure = "all"`).
    All,
    /// Only the layer groups whose name starts with `fc`.
    Fc,
}

/// Sign of the cosine regulariser.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RegSign {
    /// −λ·cos: pull toward the mixed model (paper Eq. 3; the default).
    Paper,
    /// +λ·…: the authors' code (open issue #1 of their repository).
    Code,
}

/// Target of the cosine regulariser.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RegTarget {
    /// cos(θ, θ̃_i) with the mixed model itself (one download).
    Mixed,
    /// ⟨c_i, θ⟩/‖θ‖ with c_i = Σ_j W_ij θ_j/‖θ_j‖ (the code; two downloads).
    Normalized,
}

params! {
    /// pFedGraph's parameters.
    pub struct PFedGraphParams {
        /// The code's `alpha` (larger ⇒ closer to data-size weights); default
        /// 0.08·K.
        pub alpha: Option<f64> = None,
        /// λ of the cosine regulariser.
        pub lambda: f64 = 0.01,
        /// Similarities above this become 1.
        pub threshold: f64 = 0.9,
        /// Similarity on all layers or on the fc layers only.
        pub similarity: SimilarityOn = SimilarityOn::All,
        /// Regulariser sign.
        pub reg_sign: RegSign = RegSign::Paper,
        /// Regulariser target.
        pub reg_target: RegTarget = RegTarget::Mixed,
    }
}

impl Validate for PFedGraphParams {
    fn validate(&self) -> Result<(), ParamError> {
        if let Some(a) = self.alpha
            && !(a > 0.0 && a.is_finite())
        {
            return Err(ParamError::new("alpha", format!("must be > 0, got {a}")));
        }
        non_negative("lambda", self.lambda)
    }

    fn resolve(&mut self, clients: usize) {
        self.alpha.get_or_insert(0.08 * clients as f64);
    }
}

/// The pFedGraph algorithm.
pub struct PFedGraph {
    params: PFedGraphParams,
    alpha: f64,
}

/// A pFedGraph client: its model and, in the code variant, the mix of
/// normalised models its regulariser pulls toward.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PFedGraphClient {
    /// θ̃_i after receiving it, θ_i after training.
    pub model: Model,
    /// c_i = Σ_j W_ij θ_j/‖θ_j‖ (`reg_target = "normalized"` only).
    #[serde(with = "fedweave_core::stash::opt_vector")]
    pub target: Option<Vec<f32>>,
}

/// The server keeps no state between rounds (a braced struct, so that
/// checkpoints keep the `{}` they have always stored).
#[derive(Default, Serialize, Deserialize)]
pub struct PFedGraphServer {}

/// What client i receives: θ̃_i and, in the code variant, c_i.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Mixed {
    /// θ̃_i = Σ_j W_ij θ_j.
    pub model: Vec<f32>,
    /// c_i, when the regulariser targets normalised models.
    pub normalized: Option<Vec<f32>>,
}

impl Message for Mixed {
    fn vectors(&self) -> Vec<&[f32]> {
        std::iter::once(self.model.as_slice())
            .chain(self.normalized.as_deref())
            .collect()
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        std::iter::once(self.model.as_mut_slice())
            .chain(self.normalized.as_deref_mut())
            .collect()
    }
}

impl crate::personal::ModelMessage for Mixed {
    fn map_models(self, mut f: impl FnMut(Vec<f32>) -> Vec<f32>) -> Self {
        Self {
            model: f(self.model),
            normalized: self.normalized.map(&mut f),
        }
    }
}

/// S_ij = cos(θ_i − θ_init, θ_j − θ_init) over the `ranges` of each model,
/// with values above `threshold` set to 1 (so S_ii = 1): one blocked Gram
/// matrix ([`Kernels::cosine_matrix_sym`], exact `f64` products below 64
/// models, `f32` blocks from there under the default precision), the
/// differences taken on the fly (no N×d buffer of deltas), deterministic at
/// any thread count.
pub fn similarity_matrix<R: AsRef<[f32]> + Sync>(
    kernels: &Kernels,
    models: &[R],
    init: &[f32],
    ranges: &[Range<usize>],
    threshold: f64,
) -> Vec<Vec<f64>> {
    let view = View::ranges(ranges).with_shift(init);
    let mut s = kernels.cosine_matrix_sym(models, &view).into_rows();
    for (i, row) in s.iter_mut().enumerate() {
        for (j, c) in row.iter_mut().enumerate() {
            if i == j || *c > threshold {
                *c = 1.0;
            }
        }
    }
    s
}

/// Row i = Π_simplex(p + s_i/(2·alpha)): the solution of
/// min_x alpha·xᵀx − (s_i + 2·alpha·p)ᵀx over the simplex.
pub fn infer_graph(similarity: &[Vec<f64>], p: &[f64], alpha: f64) -> Vec<Vec<f64>> {
    similarity
        .iter()
        .map(|s| {
            let v: Vec<f64> = p
                .iter()
                .zip(s)
                .map(|(pi, si)| pi + si / (2.0 * alpha))
                .collect();
            project_to_simplex(&v)
        })
        .collect()
}

/// What pFedGraph's server step needs besides the uploads.
pub struct ServerInput<'a> {
    /// θ_init, the round-0 model the similarity is measured from.
    pub init: &'a [f32],
    /// The element ranges the similarity is computed on.
    pub ranges: &'a [Range<usize>],
    /// Similarities above this become 1.
    pub threshold: f64,
    /// The participants' data-size weights (summing to 1).
    pub p: &'a [f64],
    /// The QP's alpha.
    pub alpha: f64,
}

/// The result of [`server_step`].
pub struct ServerStep {
    /// W's rows over the participants as inferred (before embedding).
    pub rows: Vec<Vec<f64>>,
    /// The graph over all clients (identity rows for absent ones).
    pub graph: CollaborationGraph,
    /// (participant, θ̃_i = Σ_j W_ij θ_j), in the participants' order.
    pub mixed: Vec<(usize, Vec<f32>)>,
}

/// pFedGraph's server step, the one implementation behind
/// [`Algorithm::aggregate`] and the Python binding (`fedweave.servers`,
/// the Flower strategy): the similarity of the `participants`' `uploads`
/// (indices among `n` clients, ascending), the graph rows
/// ([`infer_graph`]) embedded over all clients, and the mixed models.
pub fn server_step(
    kernels: &Kernels,
    n: usize,
    participants: &[usize],
    uploads: &[&[f32]],
    input: &ServerInput,
) -> ServerStep {
    let s = similarity_matrix(kernels, uploads, input.init, input.ranges, input.threshold);
    let rows = infer_graph(&s, input.p, input.alpha);
    let graph = embed_rows(n, participants, &rows);
    let mixed = mix_rows(kernels, &graph, participants, uploads);
    ServerStep { rows, graph, mixed }
}

holds_model!(PFedGraphClient: model);

/// Its messages are models: it takes a personal part ([`crate::personal`]).
impl crate::personal::Splittable for PFedGraph {}

impl Algorithm for PFedGraph {
    const NAMES: &'static [Info] = &[Info {
        name: "pfedgraph",
        summary: "W_i = simplex projection of p + s_i/(2·alpha), s = cos(θ−θ_init); local CE − λ·cos(θ, θ̃_i)",
        reference: "Ye et al., ICML 2023",
    }];
    type Params = PFedGraphParams;
    type Client = PFedGraphClient;
    type Server = PFedGraphServer;
    type Down = Mixed;
    type Up = Vec<f32>;

    fn new(
        _: &'static str,
        params: Checked<PFedGraphParams>,
        env: &Env,
    ) -> Result<Self, AlgoError> {
        let alpha = params.alpha.unwrap_or(0.08 * env.clients() as f64);
        Ok(Self {
            params: params.into_inner(),
            alpha,
        })
    }

    fn init_client(&self, env: &Env, _: usize) -> PFedGraphClient {
        PFedGraphClient {
            model: env.initial_model(),
            target: None,
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut PFedGraphClient,
    ) -> Trained<Vec<f32>> {
        // The client starts from θ̃_i; from the second round on the
        // regulariser pulls it toward θ̃_i (or c_i in the code variant).
        let train_loss = if cx.round > 1 && self.params.lambda > 0.0 {
            let coef = match self.params.reg_sign {
                RegSign::Paper => -self.params.lambda as f32,
                RegSign::Code => self.params.lambda as f32,
            };
            let target = match (&self.params.reg_target, &state.target) {
                (RegTarget::Normalized, Some(c)) => c.clone(),
                _ => state.model.params.clone(),
            };
            let term = CosinePull::new(coef, &target, self.params.reg_target == RegTarget::Mixed);
            cx.train_plain(env, &mut state.model, &[&term])
        } else {
            cx.train_plain(env, &mut state.model, &[])
        };
        Trained {
            up: state.model.params.clone(),
            train_loss,
        }
    }

    fn aggregate(
        &self,
        env: &Env,
        _: &mut PFedGraphServer,
        _: usize,
        uploads: &[(usize, Vec<f32>)],
    ) -> RoundOutcome<Mixed> {
        let participants = ids_of(uploads);
        let uploads = &models_of(uploads)[..];
        let ranges: Vec<Range<usize>> = match self.params.similarity {
            SimilarityOn::All => std::iter::once(0..env.init.len()).collect(),
            SimilarityOn::Fc => env.spec.layout().ranges_with_prefix("fc"),
        };
        let ServerStep { rows, graph, mixed } = server_step(
            env.kernels,
            env.clients(),
            &participants,
            uploads,
            &ServerInput {
                init: env.init,
                ranges: &ranges,
                threshold: self.params.threshold,
                p: &env.size_weights(&participants),
                alpha: self.alpha,
            },
        );
        let normalized: Option<Vec<Vec<f32>>> = (self.params.reg_target == RegTarget::Normalized)
            .then(|| {
                let unit: Vec<Vec<f32>> = uploads
                    .iter()
                    .map(|u| {
                        let nu = norm(u).max(1e-12) as f32;
                        u.iter().map(|x| x / nu).collect()
                    })
                    .collect();
                env.kernels.mix(&rows, &unit).into_rows()
            });
        let downloads = mixed
            .into_iter()
            .enumerate()
            .map(|(k, (i, model))| {
                let normalized = normalized.as_ref().map(|c| c[k].clone());
                (i, Mixed { model, normalized })
            })
            .collect();
        RoundOutcome::new(graph, downloads)
    }

    fn receive(&self, _: &Env, state: &mut PFedGraphClient, down: Mixed) {
        state.model.params = down.model;
        state.target = down.normalized;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    /// METHODS.md §1.2, pair case: K = 10, equal sizes, alpha = 0.8; client 0
    /// is similar (1, thresholded) only to itself and client 5.
    #[test]
    fn pair_case_gives_half_and_half() {
        let mut s = vec![0.1; 10];
        s[0] = 1.0;
        s[5] = 1.0;
        let row = &infer_graph(&[s], &[0.1; 10], 0.8)[0];
        let mut want = vec![0.0; 10];
        want[0] = 0.5;
        want[5] = 0.5;
        assert!(close(row, &want), "{row:?}");
    }

    #[test]
    fn homogeneous_case_gives_data_size_weights() {
        let p = [0.05, 0.15, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1];
        let row = &infer_graph(&[vec![1.0; 10]], &p, 0.8)[0];
        assert!(close(row, &p), "{row:?}");
    }

    #[test]
    fn sign_flipped_clients_get_zero_weight() {
        let mut s = vec![1.0; 10];
        for m in [2, 6, 8, 9] {
            s[m] = -1.0;
        }
        let row = &infer_graph(&[s], &[0.1; 10], 0.8)[0];
        for (j, w) in row.iter().enumerate() {
            let want = if [2, 6, 8, 9].contains(&j) {
                0.0
            } else {
                1.0 / 6.0
            };
            assert!((w - want).abs() < 1e-9, "{row:?}");
        }
    }

    #[test]
    fn similarity_thresholds_and_is_symmetric() {
        let d = vec![
            vec![1.0f32, 0.0],
            vec![1.0, 0.1],
            vec![0.0, 1.0],
            vec![-1.0, 0.0],
        ];
        let zero = [0.0f32; 2];
        let s = similarity_matrix(
            Kernels::cpu(),
            &d,
            &zero,
            std::slice::from_ref(&(0..2)),
            0.9,
        );
        assert_eq!(s[0][1], 1.0, "cos 0.995 > 0.9 becomes 1");
        assert!((s[0][2]).abs() < 1e-12);
        assert!((s[0][3] + 1.0).abs() < 1e-12);
        assert!((s[1][2] - 0.1 / 1.01f64.sqrt()).abs() < 1e-6);
        for (i, row) in s.iter().enumerate() {
            assert_eq!(row[i], 1.0);
            for (j, v) in row.iter().enumerate() {
                assert_eq!(*v, s[j][i]);
            }
        }
        // Restricting to the first coordinate changes client 2's similarity.
        let s0 = similarity_matrix(
            Kernels::cpu(),
            &d,
            &zero,
            std::slice::from_ref(&(0..1)),
            0.9,
        );
        // The shift is subtracted first: cos(d − c) with c = (1, 0) differs.
        let c = [1.0f32, 0.0];
        let sc = similarity_matrix(Kernels::cpu(), &d, &c, std::slice::from_ref(&(0..2)), 0.9);
        assert_eq!(sc[0][1], 0.0, "θ_0 − c is the zero vector");
        assert!((sc[2][3] - 0.5f64.sqrt()).abs() < 1e-12, "{}", sc[2][3]);
        assert_eq!(s0[0][2], 0.0);
        assert_eq!(s0[0][1], 1.0);
    }
}
