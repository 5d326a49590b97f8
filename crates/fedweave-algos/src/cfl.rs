//! Clustered federated learning (Sattler, Müller, Samek, IEEE TNNLS 2021):
//! FedAvg inside clusters that split in two when FedAvg has converged to a
//! point that is stationary for the cluster but not for its members.
//!
//! Paper and the pFedGraph repository's `cfl.py` (METHODS.md §6), which
//! fedweave follows:
//! 1. Every participant trains from its cluster's model θ_c; its update is
//!    ΔW_i = θ_i − θ_c.
//! 2. For each cluster c: when ‖mean ΔW‖ < ε1 (the cluster as a whole is
//!    near a stationary point), max_i ‖ΔW_i‖ > ε2 (some member is not) and
//!    |c| > 2, c is bipartitioned by complete-linkage agglomerative
//!    clustering on the distance −S, S_ij = cos(ΔW_i, ΔW_j) (sklearn's
//!    `AgglomerativeClustering(linkage="complete")` in the code; ties are
//!    broken here by the lowest pair of cluster indices).
//! 3. Each (new) cluster's model becomes θ_c + mean of its members' ΔW.
//!
//! ε1 = 2.0, ε2 = 2.5 are pFedGraph's values (FedAGHN used 0.5 / 0.5 for
//! its CNN): they depend on the learning rate and the local work, so a
//! setting with smaller updates needs smaller ones to split at all.
//!
//! The means: the paper weights members by their data sizes, the pFedGraph
//! code (and Sattler's) takes plain means. `weighting = "size"` (default)
//! uses p for both the criterion's mean and the aggregation;
//! `weighting = "uniform"` is the code.
//!
//! Partial participation (the reference runs full participation only): the
//! means are over the cluster's participants; a cluster splits only in a
//! round where all its members took part (the absent ones have no ΔW to
//! place); the new cluster model goes to every member, present or not.
//! A cluster without participants keeps its model.
//!
//! Graph rule: block-diagonal. The row of every member of a cluster with
//! participants holds the cluster's weights over those participants; the
//! members of a cluster without participants keep W_ii = 1. Evaluation:
//! the model after local training (the code scores the trained local
//! models). Pairwise cosines and norms come from
//! [`fedweave_core::pairwise`].

use crate::Checked;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{AlgoError, Algorithm, ClientCx, Env, Info, Model, ParamError, RoundOutcome, Trained};
use fedweave_core::pairwise::View;
use fedweave_core::{CollaborationGraph, vecmath::weighted_sum};
use serde::{Deserialize, Serialize};

/// How members are weighed inside a cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Weighting {
    /// By data size (the paper).
    #[default]
    Size,
    /// Equally (the pFedGraph and Sattler code).
    Uniform,
}

params! {
    /// CFL's parameters.
    pub struct CflParams {
        /// ε1: a cluster may split when the norm of its mean update is below it.
        pub eps1: f64 = 2.0,
        /// ε2: … and the largest member update norm is above it.
        pub eps2: f64 = 2.5,
        /// Member weights in the mean update and the aggregation.
        pub weighting: Weighting = Weighting::Size,
    }
}

impl Validate for CflParams {
    fn validate(&self) -> Result<(), ParamError> {
        non_negative("eps1", self.eps1)?;
        non_negative("eps2", self.eps2)
    }
}

/// CFL.
pub struct Cfl {
    params: CflParams,
}

/// The server's clusters and their models.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct CflServer {
    /// The clusters' members, each ascending; clusters ordered by their
    /// smallest member.
    pub clusters: Vec<Vec<usize>>,
    /// θ_c: the model each cluster's members last started from.
    #[serde(with = "fedweave_core::stash::vectors")]
    pub models: Vec<Vec<f32>>,
}

/// Sattler's split criterion: the cluster is near a stationary point of its
/// joint objective (‖mean ΔW‖ < ε1) but not of some member's (max ‖ΔW_i‖ >
/// ε2), and has more than two members.
pub fn should_split(mean_norm: f64, max_norm: f64, members: usize, eps1: f64, eps2: f64) -> bool {
    mean_norm < eps1 && max_norm > eps2 && members > 2
}

/// Complete-linkage agglomerative clustering of `n = s.rows()` points into
/// two groups on the distance −S (`s`: the n × n cosine similarities): repeatedly
/// merges the two groups whose farthest pair is nearest. Returns the two
/// groups (positions 0..n, ascending), the one holding position 0 first.
/// Needs n ≥ 2.
pub fn bipartition(s: &[Vec<f64>]) -> (Vec<usize>, Vec<usize>) {
    let n = s.len();
    let mut groups: Vec<Vec<usize>> = (0..n).map(|i| vec![i]).collect();
    while groups.len() > 2 {
        let linkage = |a: &[usize], b: &[usize]| {
            a.iter()
                .flat_map(|&x| b.iter().map(move |&y| -s[x][y]))
                .fold(f64::NEG_INFINITY, f64::max)
        };
        let mut best = (0, 1, f64::INFINITY);
        for a in 0..groups.len() {
            for b in a + 1..groups.len() {
                let d = linkage(&groups[a], &groups[b]);
                if d < best.2 {
                    best = (a, b, d);
                }
            }
        }
        let merged = groups.remove(best.1);
        groups[best.0].extend(merged);
        groups[best.0].sort_unstable();
    }
    groups.sort_by_key(|g| g[0]);
    let second = groups.pop().unwrap_or_default();
    let first = groups.pop().unwrap_or_default();
    (first, second)
}

impl Cfl {
    /// Member weights over `who` (sum 1).
    fn weights(&self, env: &Env, who: &[usize]) -> Vec<f64> {
        match self.params.weighting {
            Weighting::Size => env.size_weights(who),
            Weighting::Uniform => vec![1.0 / who.len() as f64; who.len()],
        }
    }

    /// ‖Σ_j w_j (θ_j − θ_c)‖ in `f64`.
    fn mean_update_norm(weights: &[f64], models: &[&[f32]], base: &[f32]) -> f64 {
        (0..base.len())
            .map(|k| {
                let m: f64 = weights
                    .iter()
                    .zip(models)
                    .map(|(w, t)| w * (t[k] as f64 - base[k] as f64))
                    .sum();
                m * m
            })
            .sum::<f64>()
            .sqrt()
    }
}

impl Algorithm for Cfl {
    const NAMES: &'static [Info] = &[Info {
        name: "cfl",
        summary: "block-diagonal W: FedAvg inside clusters; a cluster with ‖mean ΔW‖ < eps1 (2.0), max ‖ΔW_i‖ > eps2 (2.5) and > 2 members splits in two by complete linkage on −cos(ΔW_i, ΔW_j); local CE; evaluates the trained model",
        reference: "Sattler, Müller, Samek, IEEE TNNLS 2021",
    }];
    type Params = CflParams;
    type Client = Model;
    type Server = CflServer;
    /// The cluster's new model.
    type Down = Vec<f32>;
    /// θ_i after training.
    type Up = Vec<f32>;

    fn new(_: &'static str, params: Checked<CflParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_server(&self, env: &Env) -> CflServer {
        CflServer {
            clusters: vec![(0..env.clients()).collect()],
            models: vec![env.init.to_vec()],
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
        server: &mut CflServer,
        _: usize,
        uploads: &[(usize, Vec<f32>)],
    ) -> RoundOutcome<Vec<f32>> {
        let upload_of = |i: usize| {
            uploads
                .binary_search_by_key(&i, |(j, _)| *j)
                .ok()
                .map(|k| uploads[k].1.as_slice())
        };
        let (eps1, eps2) = (self.params.eps1, self.params.eps2);
        let mut clusters = Vec::new();
        let mut models = Vec::new();
        for (members, base) in server.clusters.iter().zip(&server.models) {
            let present: Vec<usize> = members
                .iter()
                .copied()
                .filter(|&i| upload_of(i).is_some())
                .collect();
            let thetas: Vec<&[f32]> = present.iter().filter_map(|&i| upload_of(i)).collect();
            if present.len() == members.len() && !present.is_empty() {
                let view = View::all().with_shift(base);
                let max_norm = env
                    .kernels
                    .sq_norms(&thetas, &view)
                    .into_iter()
                    .fold(0.0, f64::max)
                    .sqrt();
                let w = self.weights(env, &present);
                let mean_norm = Self::mean_update_norm(&w, &thetas, base);
                if should_split(mean_norm, max_norm, members.len(), eps1, eps2) {
                    let s = env.kernels.cosine_matrix_sym(&thetas, &view).into_rows();
                    let (a, b) = bipartition(&s);
                    for half in [a, b] {
                        clusters.push(half.iter().map(|&k| members[k]).collect());
                        models.push(base.clone());
                    }
                    continue;
                }
            }
            clusters.push(members.clone());
            models.push(base.clone());
        }
        let mut graph = CollaborationGraph::identity(env.clients());
        let mut downloads = Vec::new();
        for (members, model) in clusters.iter().zip(models.iter_mut()) {
            let present: Vec<usize> = members
                .iter()
                .copied()
                .filter(|&i| upload_of(i).is_some())
                .collect();
            if present.is_empty() {
                continue;
            }
            let thetas: Vec<&[f32]> = present.iter().filter_map(|&i| upload_of(i)).collect();
            let w = self.weights(env, &present);
            // θ_c + Σ w_j ΔW_j = Σ w_j θ_j, as the weights sum to 1.
            weighted_sum(&w, &thetas, model);
            let mut row = vec![0.0; env.clients()];
            for (x, &j) in w.iter().zip(&present) {
                row[j] = *x;
            }
            for &i in members {
                graph.set_row(i, &row);
                downloads.push((i, model.clone()));
            }
        }
        let mut order: Vec<usize> = (0..clusters.len()).collect();
        order.sort_by_key(|&c| clusters[c][0]);
        server.clusters = order.iter().map(|&c| clusters[c].clone()).collect();
        server.models = order.iter().map(|&c| models[c].clone()).collect();
        downloads.sort_by_key(|(i, _)| *i);
        RoundOutcome::new(graph, downloads)
    }

    fn receive(&self, _: &Env, model: &mut Model, cluster_model: Vec<f32>) {
        model.params = cluster_model;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Tiny;

    #[test]
    fn the_split_criterion_needs_all_three_conditions() {
        assert!(should_split(1.0, 3.0, 3, 2.0, 2.5));
        assert!(
            !should_split(2.0, 3.0, 3, 2.0, 2.5),
            "mean norm not below ε1"
        );
        assert!(
            !should_split(1.0, 2.5, 3, 2.0, 2.5),
            "max norm not above ε2"
        );
        assert!(
            !should_split(1.0, 3.0, 2, 2.0, 2.5),
            "two members never split"
        );
    }

    #[test]
    fn complete_linkage_separates_opposed_updates() {
        // Updates 0, 2, 3 point along +x (roughly), 1 and 4 along −x.
        let u = [
            vec![1.0f32, 0.1],
            vec![-1.0, 0.2],
            vec![1.0, -0.2],
            vec![0.9, 0.3],
            vec![-1.0, -0.1],
        ];
        let s = fedweave_core::pairwise::Kernels::cpu()
            .cosine_matrix_sym(&u, &View::all())
            .into_rows();
        assert_eq!(bipartition(&s), (vec![0, 2, 3], vec![1, 4]));
    }

    #[test]
    fn complete_linkage_uses_the_farthest_pair() {
        // Hand-made similarities: single linkage would chain 0–1–2 (0.9,
        // 0.9) and leave 3 alone; complete linkage sees cos(0, 2) = −1 and
        // merges {2} with {3} (worst pair 0.5) rather than with {0, 1}.
        let s = vec![
            vec![1.0, 0.9, -1.0, -0.5],
            vec![0.9, 1.0, 0.9, -0.6],
            vec![-1.0, 0.9, 1.0, 0.5],
            vec![-0.5, -0.6, 0.5, 1.0],
        ];
        assert_eq!(bipartition(&s), (vec![0, 1], vec![2, 3]));
    }

    #[test]
    fn a_split_cluster_gets_two_blocks_and_each_block_its_own_average() {
        let tiny = Tiny::new();
        let env = tiny.env();
        let cfl = Cfl::new(
            "cfl",
            CflParams {
                eps1: 10.0,
                eps2: 0.5,
                weighting: Weighting::Size,
            }
            .check(env.clients())
            .unwrap(),
            &env,
        )
        .unwrap();
        let mut server = cfl.init_server(&env);
        let d = env.init.len();
        let shifted = |s: f32| -> Vec<f32> {
            env.init
                .iter()
                .enumerate()
                .map(|(k, x)| x + if k == 0 { s } else { 0.0 })
                .collect()
        };
        // Clients 0 and 2 move +1 along the first coordinate, client 1 −1:
        // mean ‖ΔW‖ (sizes 12, 12, 24) = |(1 − 1 + 2)/4| = 0.5 < 10, max 1 > 0.5.
        let uploads = vec![(0, shifted(1.0)), (1, shifted(-1.0)), (2, shifted(1.0))];
        let out = cfl.aggregate(&env, &mut server, 1, &uploads);
        assert_eq!(server.clusters, vec![vec![0, 2], vec![1]]);
        // Block {0, 2} weighted 12:24; {1} alone.
        let third = 1.0 / 3.0;
        assert_eq!(out.graph.row(0), &[third, 0.0, 2.0 * third]);
        assert_eq!(out.graph.row(2), &[third, 0.0, 2.0 * third]);
        assert_eq!(out.graph.row(1), &[0.0, 1.0, 0.0]);
        assert_eq!(out.downloads.len(), 3);
        assert_eq!(out.downloads[0].1, shifted(1.0));
        assert_eq!(out.downloads[1].1, shifted(-1.0));
        assert_eq!(server.models[1].len(), d);
        // Next round: only client 0 of {0, 2} takes part; client 2 still
        // receives the block's model and keeps its row in the block.
        let out = cfl.aggregate(&env, &mut server, 2, &[(0, shifted(3.0))]);
        assert_eq!(server.clusters, vec![vec![0, 2], vec![1]]);
        assert_eq!(out.graph.row(2), &[1.0, 0.0, 0.0]);
        assert_eq!(out.graph.row(1), &[0.0, 1.0, 0.0], "no participant: kept");
        let who: Vec<usize> = out.downloads.iter().map(|(i, _)| *i).collect();
        assert_eq!(who, vec![0, 2]);
    }

    #[test]
    fn no_split_below_the_criterion_and_uniform_weights_follow_the_code() {
        let tiny = Tiny::new();
        let env = tiny.env();
        let cfl = Cfl::new(
            "cfl",
            CflParams {
                weighting: Weighting::Uniform,
                ..CflParams::default()
            }
            .check(env.clients())
            .unwrap(),
            &env,
        )
        .unwrap();
        let mut server = cfl.init_server(&env);
        let up = |s: f32| -> Vec<f32> {
            let mut v = env.init.to_vec();
            v[0] += s;
            v
        };
        // Tiny updates: max ‖ΔW‖ ≪ 2.5, so FedAvg with uniform rows.
        let uploads = vec![(0, up(0.01)), (1, up(-0.01)), (2, up(0.02))];
        let out = cfl.aggregate(&env, &mut server, 1, &uploads);
        assert_eq!(server.clusters, vec![vec![0, 1, 2]]);
        for i in 0..3 {
            for w in out.graph.row(i) {
                assert!((w - 1.0 / 3.0).abs() < 1e-12);
            }
        }
    }
}
