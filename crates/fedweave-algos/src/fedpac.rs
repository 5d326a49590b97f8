//! FedPAC (Xu, Tong, Huang, ICLR 2023): personalized FL with feature
//! alignment and classifier collaboration.
//!
//! **Model.** Every model is a body (feature extractor f) and a linear head
//! (classifier g), as [`fedweave_nn::ModelSpec::split`] cuts it.
//!
//! **Local objective** (one round, as the authors' `LocalUpdate_FedPAC`):
//! 1. statistics of the model as received, on the client's training data:
//!    class counts n_k, prior π_k = n_k/n, per-class feature means μ_k, the
//!    head-collaboration statistics h_i = (π_k μ_k)_k (a classes × d matrix)
//!    and the variance term V_i = Σ_k [π_k·mean_k ‖f(x)‖² − π_k²‖μ_k‖²]/n
//!    (the code's `statistics_extraction`, including its division by n);
//! 2. `head_epochs` (1) passes training the head alone, body frozen, with
//!    learning rate `head_lr` (the code's `lr_g = 0.1`), cross-entropy;
//! 3. the round's local steps (`train` settings) training the body alone,
//!    head frozen, on CE + λ·MSE(f(x), c_y) with c the global prototypes
//!    (λ = 1, the code's `lam`); a class the global prototypes lack pulls
//!    toward the client's own prototype from step 1, as the code does. No
//!    alignment before the first prototypes arrive (the code's `round > 0`);
//! 4. the upload: the trained model, its per-class feature means (local
//!    prototypes, after training), the class counts, h_i and V_i.
//!
//! **Graph rule.** Body: FedAvg over the participants (data-size weights p),
//! sent to every client. Prototypes: c_k = Σ_j n_jk c_jk / Σ_j n_jk over the
//! participants holding class k, sent to every client. Head of participant
//! i: Σ_j α_ij g_j with α_i the exact solution of the paper's quadratic
//! program (Eq. 10; the code's `get_head_agg_weight`)
//!
//!   min_α  Σ_j α_j² V_j + ‖Σ_j α_j (h_i − h_j)‖²_F   s.t. α ≥ 0, Σα = 1,
//!
//! i.e. αᵀ P α with P_jl = δ_jl V_j + ⟨h_i − h_j, h_i − h_l⟩, solved by the
//! active-set method [`simplex_qp`] (no external solver); weights below
//! `min_weight` (the code's `eps = 1e-3`) are zeroed and the rest
//! renormalised, as the code does. The round's graph is logged per part,
//! `("body", every row p)` and `("head", α rows; identity for absent
//! clients)`, and `graph` is their mean.
//!
//! **Evaluation.** The model after local training (the code reports
//! `acc2`, measured after `local_training`).
//!
//! **Deviations from the reference code.**
//! - Optimiser: both phases use `train`'s momentum and weight decay (the code
//!   hard-codes 0.5 and 5e-4); the body phase uses `train.lr`, the head phase
//!   `head_lr`.
//! - Statistics and prototypes are computed in evaluation mode (running
//!   batch-norm statistics); the code calls the model in training mode.
//!   Identical for models without batch norm.
//! - The code's eigenvalue clipping of P (when a numerical solver reports P
//!   not PSD) is not needed: P is PSD by construction and the active-set
//!   solver handles singular P exactly, so every participant gets α (the
//!   code's "no solution: keep the local head" branch never triggers).
//! - The body is weighted by `env.sizes` (train + validation share), as every
//!   fedweave method; the code weights by training-set size.

#![allow(clippy::needless_range_loop)] // index loops mirror the matrix formulas

use crate::Checked;
use crate::class_mean::{Normalise, weighted_class_means};
use crate::contract::check_parts;
use crate::contract::holds_model;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{
    AlgoError, Algorithm, ClientCx, Env, Info, Message, Model, ParamError, RoundOutcome, Trained,
    embed_rows, ids_of,
};
use fedweave_core::CollaborationGraph;
use fedweave_core::pairwise::{Kernels, View};
use fedweave_core::qp::simplex_qp;
use fedweave_core::vecmath::weighted_sum;
use fedweave_nn::{Predictions, PrototypePull, TrainConfig};
use serde::{Deserialize, Serialize};

params! {
    /// FedPAC's parameters.
    pub struct FedPacParams {
        /// λ of the feature-alignment term λ·MSE(f(x), c_y) (the code's `lam`,
        /// default 1.0).
        pub lambda: f64 = 1.0,
        /// Passes over the local data training the head with the body frozen
        /// (the code's `epoch_classifier = 1`); 0 skips the head phase.
        pub head_epochs: usize = 1,
        /// Learning rate of the head phase (the code's `lr_g = 0.1`).
        pub head_lr: f64 = 0.1,
        /// Head-collaboration weights below this are zeroed and the rest
        /// renormalised (the code's `eps = 1e-3`).
        pub min_weight: f64 = 1e-3,
    }
}

impl Validate for FedPacParams {
    fn validate(&self) -> Result<(), ParamError> {
        non_negative("lambda", self.lambda)?;
        if !(self.head_lr > 0.0 && self.head_lr.is_finite()) {
            return Err(ParamError::new(
                "head_lr",
                format!("must be a finite number > 0, got {}", self.head_lr),
            ));
        }
        if !(0.0..1.0).contains(&self.min_weight) {
            return Err(ParamError::new(
                "min_weight",
                format!("must be in [0, 1), got {}", self.min_weight),
            ));
        }
        Ok(())
    }
}

/// The FedPAC algorithm.
pub struct FedPac {
    params: FedPacParams,
}

/// Class prototypes: a classes × feature_len matrix and which rows hold one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Prototypes {
    /// `classes × feature_len`, row-major; rows of unknown classes are 0.
    #[serde(with = "fedweave_core::stash::vector")]
    pub values: Vec<f32>,
    /// Whether each class has a prototype.
    pub known: Vec<bool>,
}

impl Prototypes {
    /// The known rows, packed in class order (what goes on the wire).
    fn packed(&self, d: usize) -> Vec<f32> {
        self.known
            .iter()
            .enumerate()
            .filter(|(_, k)| **k)
            .flat_map(|(c, _)| self.values[c * d..(c + 1) * d].iter().copied())
            .collect()
    }

    /// The inverse of [`Prototypes::packed`].
    fn unpack(known: Vec<bool>, packed: &[f32], d: usize) -> Self {
        let mut values = vec![0.0f32; known.len() * d];
        let mut rows = packed.chunks_exact(d.max(1));
        for (c, _) in known.iter().enumerate().filter(|(_, k)| **k) {
            if let Some(row) = rows.next() {
                values[c * d..(c + 1) * d].copy_from_slice(row);
            }
        }
        Self { values, known }
    }
}

/// A FedPAC client: its model and the latest global prototypes.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FedPacClient {
    /// The personalised model (global body, own head after receiving).
    pub model: Model,
    /// The global prototypes of the last round (none before the first).
    pub prototypes: Option<Prototypes>,
}

/// What a client uploads.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FedPacUp {
    /// The trained model (body and head).
    pub model: Vec<f32>,
    /// Training samples per class.
    pub counts: Vec<usize>,
    /// Local prototypes after training: the feature means of the classes
    /// with `counts > 0`, packed in class order (`present × feature_len`).
    pub prototypes: Vec<f32>,
    /// h_i before training: π_k μ_k for the present classes, packed like
    /// `prototypes`.
    pub h: Vec<f32>,
    /// V_i before training.
    pub v: f64,
}

impl Message for FedPacUp {
    fn vectors(&self) -> Vec<&[f32]> {
        vec![&self.model, &self.prototypes, &self.h]
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.model, &mut self.prototypes, &mut self.h]
    }
    /// The three vectors plus one 4-byte count per class (V_i is a scalar).
    fn bytes(&self) -> u64 {
        let floats: usize = self.vectors().iter().map(|v| v.len()).sum();
        4 * (floats + self.counts.len()) as u64
    }
}

/// What the server sends one client.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FedPacDown {
    /// The global body (the body range of the model).
    pub body: Vec<f32>,
    /// Which classes have a global prototype.
    pub known: Vec<bool>,
    /// The global prototypes of the known classes, packed in class order.
    pub prototypes: Vec<f32>,
    /// The client's collaborative head Σ_j α_ij g_j (participants only).
    pub head: Option<Vec<f32>>,
}

impl Message for FedPacDown {
    fn vectors(&self) -> Vec<&[f32]> {
        let mut v = vec![self.body.as_slice(), self.prototypes.as_slice()];
        v.extend(self.head.as_deref());
        v
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        let mut v = vec![self.body.as_mut_slice(), self.prototypes.as_mut_slice()];
        v.extend(self.head.as_deref_mut());
        v
    }
}

/// A client's feature statistics on its training data.
#[derive(Clone, Debug, PartialEq)]
pub struct FeatureStats {
    /// Samples per class.
    pub counts: Vec<usize>,
    /// Per-class feature means (prototypes), `classes × d`; zero rows for
    /// absent classes.
    pub means: Vec<f64>,
    /// h = (π_k μ_k)_k, `classes × d`.
    pub h: Vec<f64>,
    /// V = Σ_k [π_k·mean_k ‖f‖² − π_k²‖μ_k‖²] / n.
    pub v: f64,
}

/// [`FeatureStats`] of `features` (`labels.len() × d`, row-major) over
/// `classes` classes, accumulated in `f64` in sample order. Labels outside
/// `0..classes` are ignored.
pub fn feature_stats(features: &[f32], labels: &[u32], d: usize, classes: usize) -> FeatureStats {
    let mut counts = vec![0usize; classes];
    let mut sums = vec![0.0f64; classes * d];
    let mut sq = vec![0.0f64; classes];
    for (k, &y) in labels.iter().enumerate() {
        let y = y as usize;
        let Some(row) = features.get(k * d..(k + 1) * d) else {
            break;
        };
        if y >= classes {
            continue;
        }
        counts[y] += 1;
        for (s, &f) in sums[y * d..(y + 1) * d].iter_mut().zip(row) {
            *s += f as f64;
        }
        sq[y] += row.iter().map(|&f| (f as f64) * (f as f64)).sum::<f64>();
    }
    let n: usize = counts.iter().sum();
    let mut means = vec![0.0f64; classes * d];
    let mut h = vec![0.0f64; classes * d];
    let mut v = 0.0;
    for c in (0..classes).filter(|&c| counts[c] > 0) {
        let nc = counts[c] as f64;
        let pi = nc / n as f64;
        let mut mu_sq = 0.0;
        for j in c * d..(c + 1) * d {
            means[j] = sums[j] / nc;
            h[j] = pi * means[j];
            mu_sq += means[j] * means[j];
        }
        v += pi * sq[c] / nc - pi * pi * mu_sq;
    }
    if n > 0 {
        v /= n as f64;
    }
    FeatureStats {
        counts,
        means,
        h,
        v,
    }
}

/// Rows `c` of a `classes × d` matrix with `counts[c] > 0`, packed, as f32.
fn pack_present(m: &[f64], counts: &[usize], d: usize) -> Vec<f32> {
    counts
        .iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .flat_map(|(c, _)| m[c * d..(c + 1) * d].iter().map(|&x| x as f32))
        .collect()
}

/// The matrix P of client `i`'s program over the participants:
/// P_jl = δ_jl V_j + ⟨h_i − h_j, h_i − h_l⟩, from the squared distances
/// S_jl = ‖h_j − h_l‖² by polarisation: ⟨h_i − h_j, h_i − h_l⟩ =
/// ½(S_ij + S_il − S_jl).
pub fn collaboration_matrix(i: usize, sq: &[Vec<f64>], v: &[f64]) -> Vec<Vec<f64>> {
    let n = v.len();
    (0..n)
        .map(|j| {
            (0..n)
                .map(|l| {
                    let bias = 0.5 * (sq[i][j] + sq[i][l] - sq[j][l]);
                    if j == l { bias + v[j] } else { bias }
                })
                .collect()
        })
        .collect()
}

/// The head weights of every participant: α_i = argmin αᵀP_iα on the
/// simplex, weights below `min_weight` zeroed, the rest renormalised.
pub fn head_weights(
    kernels: &Kernels,
    h: &[Vec<f32>],
    v: &[f64],
    min_weight: f64,
) -> Vec<Vec<f64>> {
    let n = h.len();
    let sq = kernels.sq_dist_matrix_sym(h, &View::all()).into_rows();
    (0..n)
        .map(|i| {
            let p = collaboration_matrix(i, &sq, v);
            // αᵀPα = ½αᵀ(2P)α.
            let q: Vec<Vec<f64>> = p
                .iter()
                .map(|r| r.iter().map(|x| 2.0 * x).collect())
                .collect();
            let alpha = simplex_qp(&q, &vec![0.0; n]);
            truncate_small(alpha, min_weight)
        })
        .collect()
}

/// Zeroes weights below `min_weight` and renormalises (unchanged when that
/// would zero them all).
fn truncate_small(alpha: Vec<f64>, min_weight: f64) -> Vec<f64> {
    let kept: Vec<f64> = alpha
        .iter()
        .map(|&a| if a < min_weight { 0.0 } else { a })
        .collect();
    let total: f64 = kept.iter().sum();
    if total > 0.0 {
        kept.iter().map(|a| a / total).collect()
    } else {
        alpha
    }
}

holds_model!(FedPacClient: model);

impl Algorithm for FedPac {
    const NAMES: &'static [Info] = &[Info {
        name: "fedpac",
        summary: "body: FedAvg (p); head_i = Σ_j α_ij head_j, α_i the exact simplex QP min Σα_j²V_j + ‖Σα_j(h_i−h_j)‖² on feature statistics; local: head 1 epoch (body frozen), then body on CE + λ‖f(x)−c_y‖² to global prototypes (λ = 1)",
        reference: "Xu, Tong, Huang, ICLR 2023",
    }];
    type Params = FedPacParams;
    type Client = FedPacClient;
    type Server = ();
    type Down = FedPacDown;
    type Up = FedPacUp;

    fn new(
        name: &'static str,
        params: Checked<FedPacParams>,
        env: &Env,
    ) -> Result<Self, AlgoError> {
        if env.label_counts.iter().all(|c| c.is_empty()) {
            return Err(AlgoError::Unsupported {
                algorithm: name.to_string(),
                message: "FedPAC needs classification data (class prototypes)".into(),
            });
        }
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_client(&self, env: &Env, _: usize) -> FedPacClient {
        FedPacClient {
            model: env.initial_model(),
            prototypes: None,
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut FedPacClient,
    ) -> Trained<FedPacUp> {
        let spec = env.spec;
        let (classes, d) = (spec.num_classes(), spec.feature_len());
        let split = spec.split();
        let train = cx.data.train;
        let labels = train.local_labels();
        // 1. Statistics of the received model.
        let before = fedweave_nn::predict(spec, &state.model.params, &state.model.buffers, &train);
        let stats = feature_stats(&before.features, &labels, d, classes);
        // 2. The head alone, body frozen.
        if self.params.head_epochs > 0 && !train.is_empty() {
            let head_cfg = TrainConfig {
                lr: self.params.head_lr as f32,
                iterations: 0,
                epochs: self.params.head_epochs,
                ..env.train.clone()
            };
            cx.train(
                env,
                &mut state.model,
                &head_cfg,
                &[],
                std::slice::from_ref(&split.base),
                None,
            );
        }
        // 3. The body alone, head frozen, pulled toward the prototypes.
        let pull = state
            .prototypes
            .as_ref()
            .filter(|_| self.params.lambda > 0.0)
            .map(|global| alignment_targets(global, &stats, d, self.params.lambda as f32));
        let body_stats = cx.train_with(
            env,
            &mut state.model,
            env.train,
            &[],
            std::slice::from_ref(&split.head),
            None,
            pull.as_ref().map(|p| p as &dyn fedweave_nn::Objective),
        );
        // 4. Local prototypes of the trained model.
        let after: Predictions =
            fedweave_nn::predict(spec, &state.model.params, &state.model.buffers, &train);
        let trained = feature_stats(&after.features, &labels, d, classes);
        Trained {
            up: FedPacUp {
                model: state.model.params.clone(),
                prototypes: pack_present(&trained.means, &stats.counts, d),
                h: pack_present(&stats.h, &stats.counts, d),
                counts: stats.counts,
                v: stats.v,
            },
            train_loss: body_stats.mean_loss,
        }
    }

    fn check_upload(&self, env: &Env, up: &FedPacUp) -> Result<(), String> {
        let (classes, d) = (env.spec.num_classes(), env.spec.feature_len());
        crate::contract::check_whole_models(env, vec![&up.model])?;
        if up.counts.len() != classes {
            return Err(format!(
                "{} class counts where the model has {classes} classes",
                up.counts.len()
            ));
        }
        let present = up.counts.iter().filter(|&&n| n > 0).count();
        check_parts(&[
            ("prototypes", &up.prototypes, present * d),
            ("h", &up.h, present * d),
        ])?;
        if !(up.v.is_finite() && up.v >= 0.0) {
            return Err(format!("variance term {} is not finite and ≥ 0", up.v));
        }
        Ok(())
    }

    fn aggregate(
        &self,
        env: &Env,
        _: &mut (),
        _: usize,
        uploads: &[(usize, FedPacUp)],
    ) -> RoundOutcome<FedPacDown> {
        let (classes, d) = (env.spec.num_classes(), env.spec.feature_len());
        let split = env.spec.split();
        let participants = ids_of(uploads);
        let p = env.size_weights(&participants);
        // Body: FedAvg.
        let bodies: Vec<&[f32]> = uploads
            .iter()
            .map(|(_, u)| &u.model[split.base.clone()])
            .collect();
        let mut body = vec![0.0f32; split.base.len()];
        weighted_sum(&p, &bodies, &mut body);
        // Prototypes: count-weighted class means.
        let global = aggregate_prototypes(uploads, classes, d);
        let packed = global.packed(d);
        // Heads: α from each participant's program.
        let h: Vec<Vec<f32>> = uploads
            .iter()
            .map(|(_, u)| dense_rows(&u.h, &u.counts, d))
            .collect();
        let v: Vec<f64> = uploads.iter().map(|(_, u)| u.v).collect();
        let alpha = head_weights(env.kernels, &h, &v, self.params.min_weight);
        let heads: Vec<&[f32]> = uploads
            .iter()
            .map(|(_, u)| &u.model[split.head.clone()])
            .collect();
        let mut downloads: Vec<(usize, FedPacDown)> = (0..env.clients())
            .map(|i| {
                (
                    i,
                    FedPacDown {
                        body: body.clone(),
                        known: global.known.clone(),
                        prototypes: packed.clone(),
                        head: None,
                    },
                )
            })
            .collect();
        for (&i, head) in participants
            .iter()
            .zip(env.kernels.mix(&alpha, &heads).into_rows())
        {
            downloads[i].1.head = Some(head);
        }
        let mut row = vec![0.0; env.clients()];
        for (w, &j) in p.iter().zip(&participants) {
            row[j] = *w;
        }
        let body_graph = CollaborationGraph::broadcast_row(&row);
        let head_graph = embed_rows(env.clients(), &participants, &alpha);
        let graph = CollaborationGraph::mean(&[body_graph.clone(), head_graph.clone()]);
        RoundOutcome {
            graph,
            layers: vec![("body".into(), body_graph), ("head".into(), head_graph)],
            downloads,
        }
    }

    fn check_download(&self, env: &Env, down: &FedPacDown) -> Result<(), String> {
        let (classes, d) = (env.spec.num_classes(), env.spec.feature_len());
        let split = env.spec.split();
        if down.known.len() != classes {
            return Err(format!(
                "{} class marks where the model has {classes} classes",
                down.known.len()
            ));
        }
        let known = down.known.iter().filter(|&&k| k).count();
        check_parts(&[
            ("body", &down.body, split.base.len()),
            ("prototypes", &down.prototypes, known * d),
        ])?;
        match &down.head {
            Some(head) => check_parts(&[("head", head, split.head.len())]),
            None => Ok(()),
        }
    }

    fn receive(&self, env: &Env, state: &mut FedPacClient, down: FedPacDown) {
        let split = env.spec.split();
        let d = env.spec.feature_len();
        if down.body.len() == split.base.len() {
            state.model.params[split.base.clone()].copy_from_slice(&down.body);
        }
        if let Some(head) = down.head.filter(|h| h.len() == split.head.len()) {
            state.model.params[split.head].copy_from_slice(&head);
        }
        state.prototypes = Some(Prototypes::unpack(down.known, &down.prototypes, d));
    }
}

/// A `classes × d` f32 matrix from rows packed for the classes with
/// `counts > 0`.
fn dense_rows(packed: &[f32], counts: &[usize], d: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; counts.len() * d];
    let mut rows = packed.chunks_exact(d.max(1));
    for (c, _) in counts.iter().enumerate().filter(|(_, n)| **n > 0) {
        if let Some(row) = rows.next() {
            out[c * d..(c + 1) * d].copy_from_slice(row);
        }
    }
    out
}

/// c_k = Σ_j n_jk c_jk / Σ_j n_jk over the uploads holding class k.
fn aggregate_prototypes(uploads: &[(usize, FedPacUp)], classes: usize, d: usize) -> Prototypes {
    let rows: Vec<(usize, f64, &[f32])> = uploads
        .iter()
        .flat_map(|(_, u)| {
            u.counts
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .zip(u.prototypes.chunks_exact(d.max(1)))
                .map(|((c, &n), row)| (c, n as f64, row))
        })
        .collect();
    let (means, totals) = weighted_class_means(&rows, classes, d, Normalise::AtEnd);
    Prototypes {
        values: means.iter().map(|&m| m as f32).collect(),
        known: totals.iter().map(|&t| t > 0.0).collect(),
    }
}

/// The body phase's objective: CE + λ·MSE(f(x), target_y), the target the
/// global prototype of y, or the client's own prototype (before training)
/// when the global prototypes lack y.
fn alignment_targets(
    global: &Prototypes,
    local: &FeatureStats,
    d: usize,
    lambda: f32,
) -> PrototypePull {
    let classes = local.counts.len();
    let mut prototypes = vec![0.0f32; classes * d];
    let mut known = vec![false; classes];
    for c in 0..classes {
        let rows = c * d..(c + 1) * d;
        if global.known.get(c).copied().unwrap_or(false) && global.values.len() >= rows.end {
            prototypes[rows.clone()].copy_from_slice(&global.values[rows]);
            known[c] = true;
        } else if local.counts[c] > 0 {
            for j in rows {
                prototypes[j] = local.means[j] as f32;
            }
            known[c] = true;
        }
    }
    PrototypePull {
        lambda,
        prototypes,
        known,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_close(got: &[f64], want: &[f64], tol: f64) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < tol, "got {got:?}, want {want:?}");
        }
    }

    #[test]
    fn feature_statistics_by_hand() {
        // d = 2, three classes; class 0: (1, 0), (3, 0); class 2: (0, 2).
        let f = [1.0f32, 0.0, 3.0, 0.0, 0.0, 2.0];
        let s = feature_stats(&f, &[0, 0, 2], 2, 3);
        assert_eq!(s.counts, [2, 0, 1]);
        assert_eq!(s.means, [2.0, 0.0, 0.0, 0.0, 0.0, 2.0]);
        // π = (2/3, 0, 1/3): h = (4/3, 0 | 0, 0 | 0, 2/3).
        assert_close(&s.h, &[4.0 / 3.0, 0.0, 0.0, 0.0, 0.0, 2.0 / 3.0], 1e-15);
        // V·n = π_0·(1 + 9)/2 − π_0²·4 + π_2·4 − π_2²·4
        //     = 10/3 − 16/9 + 4/3 − 4/9 = 22/9; n = 3.
        assert!((s.v - 22.0 / 27.0).abs() < 1e-15, "{}", s.v);
    }

    #[test]
    fn collaboration_matrix_is_the_papers_p() {
        // h_0 = (0, 0), h_1 = (1, 0), h_2 = (0, 2); V = (0.5, 0.25, 1).
        let h = [vec![0.0f32, 0.0], vec![1.0, 0.0], vec![0.0, 2.0]];
        let v = [0.5, 0.25, 1.0];
        let sq: Vec<Vec<f64>> = h
            .iter()
            .map(|a| {
                h.iter()
                    .map(|b| fedweave_core::vecmath::sq_dist(a, b))
                    .collect()
            })
            .collect();
        // For i = 0: ⟨h_0 − h_j, h_0 − h_l⟩ = ⟨h_j, h_l⟩.
        let p = collaboration_matrix(0, &sq, &v);
        let want = [
            [0.5, 0.0, 0.0],
            [0.0, 1.0 + 0.25, 0.0],
            [0.0, 0.0, 4.0 + 1.0],
        ];
        for (r, w) in p.iter().zip(&want) {
            assert_close(r, w, 1e-15);
        }
        // min 0.5a² + 1.25b² + 5c²: α ∝ (2, 0.8, 0.2) = (0.666…, 0.2666…, 0.0666…).
        let alpha = head_weights(Kernels::cpu(), &h, &v, 0.0);
        assert_close(&alpha[0], &[2.0 / 3.0, 0.8 / 3.0, 0.2 / 3.0], 1e-12);
        // With V = 0 everyone can only do as well as keeping its own head.
        let own = head_weights(Kernels::cpu(), &h, &[0.0; 3], 0.0);
        for (i, row) in own.iter().enumerate() {
            assert!((row[i] - 1.0).abs() < 1e-12, "{own:?}");
        }
        // Identical statistics: weights ∝ 1/V_j.
        let same = vec![vec![1.0f32, 1.0]; 3];
        let w = head_weights(Kernels::cpu(), &same, &[1.0, 2.0, 4.0], 0.0);
        assert_close(&w[1], &[4.0 / 7.0, 2.0 / 7.0, 1.0 / 7.0], 1e-12);
        // Truncation at 0.15 zeroes 1/7 and renormalises the rest.
        let t = head_weights(Kernels::cpu(), &same, &[1.0, 2.0, 4.0], 0.15);
        assert_close(&t[1], &[2.0 / 3.0, 1.0 / 3.0, 0.0], 1e-12);
    }

    #[test]
    fn prototypes_are_count_weighted_and_pack_round_trips() {
        let up = |counts: Vec<usize>, prototypes: Vec<f32>| FedPacUp {
            model: Vec::new(),
            counts,
            prototypes,
            h: Vec::new(),
            v: 0.0,
        };
        // d = 2, classes 3. Client A: class 0 (3 samples) at (1, 1), class 1
        // (1 sample) at (2, 0). Client B: class 0 (1 sample) at (5, 1).
        let uploads = vec![
            (0, up(vec![3, 1, 0], vec![1.0, 1.0, 2.0, 0.0])),
            (1, up(vec![1, 0, 0], vec![5.0, 1.0])),
        ];
        let g = aggregate_prototypes(&uploads, 3, 2);
        assert_eq!(g.known, [true, true, false]);
        assert_eq!(g.values, [2.0, 1.0, 2.0, 0.0, 0.0, 0.0]);
        let packed = g.packed(2);
        assert_eq!(packed, [2.0, 1.0, 2.0, 0.0]);
        assert_eq!(Prototypes::unpack(g.known.clone(), &packed, 2), g);
    }

    #[test]
    fn alignment_falls_back_to_the_clients_own_prototype() {
        let global = Prototypes {
            values: vec![1.0, 1.0, 0.0, 0.0],
            known: vec![true, false],
        };
        let local = feature_stats(&[3.0, 4.0, 5.0, 6.0], &[1, 1], 2, 2);
        let pull = alignment_targets(&global, &local, 2, 1.0);
        assert_eq!(pull.known, [true, true]);
        assert_eq!(pull.prototypes, [1.0, 1.0, 4.0, 5.0]);
    }

    #[test]
    fn params_are_checked() {
        let ok = FedPacParams::default();
        assert!(ok.validate().is_ok());
        let bad = FedPacParams {
            head_lr: 0.0,
            ..ok.clone()
        };
        assert_eq!(bad.validate().unwrap_err().key, "head_lr");
        let bad = FedPacParams {
            min_weight: 1.0,
            ..ok.clone()
        };
        assert_eq!(bad.validate().unwrap_err().key, "min_weight");
        let bad = FedPacParams { lambda: -1.0, ..ok };
        assert_eq!(bad.validate().unwrap_err().key, "lambda");
    }
}
