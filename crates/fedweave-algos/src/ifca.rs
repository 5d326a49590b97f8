//! IFCA, the Iterative Federated Clustering Algorithm (Ghosh, Chung, Yin,
//! Ramchandran, NeurIPS 2020), model-averaging version (the paper's
//! Algorithm 2 with local steps).
//!
//! The server keeps M cluster models θ_1..θ_M (`clusters`, default 4),
//! started from different random initialisations (identical ones would
//! never separate): the round-0 model and M − 1 further draws of the
//! architecture's initialiser. Each round, every participant:
//! 1. evaluates all M models on its training data (mean task loss:
//!    cross-entropy, or the masked MAE of forecasting; evaluation mode) and picks ĵ = argmin (ties: the lowest index);
//! 2. trains θ_ĵ with the usual local training and uploads (ĵ, θ).
//!
//! The server replaces each cluster model by the data-size weighted average
//! of the uploads that chose it (a cluster nobody chose keeps its model)
//! and sends the M models to every client, absent ones included, so each
//! starts its next round from the current models (M models per download).
//!
//! Graph rule: cluster membership. The row of participant i holds the
//! size weights p over the round's participants that chose i's cluster
//! (itself included). An absent client receives the M models too (so its
//! next round starts from the current ones) and its row is p over all the
//! round's participants, whose uploads those models carry together (as
//! Ditto's absent clients show FedAvg's row); its scored model changes only
//! when it trains again. Evaluation: the
//! client's trained copy of its cluster's model, after local training, as
//! the pFedGraph code scores its baselines (the paper reports the chosen
//! cluster model).
//!
//! Not done: IFCA's weight-sharing variant (shared lower layers) and its
//! random restarts.

use crate::Checked;
use crate::contract::holds_model;
use crate::params::Validate;
use crate::params::params;
use crate::{
    AlgoError, Algorithm, ClientCx, Env, Info, Message, Model, ParamError, RoundOutcome, Trained,
    distinct_inits, embed_rows, ids_of,
};
use fedweave_core::vecmath::weighted_sum;
use fedweave_nn::{LocalData, evaluate};
use serde::{Deserialize, Serialize};

params! {
    /// IFCA's parameters.
    pub struct IfcaParams {
        /// M: the number of cluster models.
        pub clusters: usize = 4,
    }
}

impl Validate for IfcaParams {
    fn validate(&self) -> Result<(), ParamError> {
        if self.clusters == 0 {
            return Err(ParamError::new("clusters", "must be ≥ 1"));
        }
        Ok(())
    }
}

/// IFCA.
pub struct Ifca {
    params: IfcaParams,
}

/// Several whole models in one message (IFCA's cluster models, FedEM's
/// components).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Models(#[serde(with = "fedweave_core::stash::vectors")] pub Vec<Vec<f32>>);

impl Message for Models {
    fn vectors(&self) -> Vec<&[f32]> {
        self.0.iter().map(Vec::as_slice).collect()
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        self.0.iter_mut().map(Vec::as_mut_slice).collect()
    }
}

impl Models {
    /// `count` whole, finite models.
    pub fn check(&self, env: &Env, count: usize) -> Result<(), String> {
        if self.0.len() != count {
            return Err(format!(
                "{} models where {count} are expected",
                self.0.len()
            ));
        }
        crate::contract::check_whole_models(env, self.vectors())
    }
}

/// What a participant uploads: the cluster it chose and its trained model.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Chosen {
    /// ĵ.
    pub cluster: usize,
    /// θ after local training.
    pub model: Vec<f32>,
}

impl Message for Chosen {
    fn vectors(&self) -> Vec<&[f32]> {
        vec![&self.model]
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.model]
    }
}

/// An IFCA client.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IfcaClient {
    /// The M cluster models last received.
    #[serde(with = "fedweave_core::stash::vectors")]
    pub clusters: Vec<Vec<f32>>,
    /// Its trained copy of the chosen cluster's model (what is scored) and
    /// its batch-norm statistics.
    pub model: Model,
    /// The cluster chosen last (none before its first round).
    pub chosen: Option<usize>,
}

/// The index of the smallest loss (the first on ties; NaN never wins).
pub fn argmin(losses: &[f64]) -> usize {
    let mut best = 0;
    for (k, l) in losses.iter().enumerate() {
        if *l < losses[best] || losses[best].is_nan() {
            best = k;
        }
    }
    best
}

impl Ifca {
    /// Mean training loss of each cluster model on `train`.
    fn losses(env: &Env, state: &IfcaClient, train: &LocalData) -> Vec<f64> {
        state
            .clusters
            .iter()
            .map(|theta| evaluate(env.spec, theta, &state.model.buffers, train).mean_loss())
            .collect()
    }
}

holds_model!(IfcaClient: model);

impl Algorithm for Ifca {
    const NAMES: &'static [Info] = &[Info {
        name: "ifca",
        summary: "M cluster models (clusters = 4, distinct inits); each participant picks the one with the lowest training loss and trains it; the server averages each cluster's uploads with p (W_ij = p_j within i's cluster); local CE; evaluates the trained model",
        reference: "Ghosh et al., NeurIPS 2020",
    }];
    type Params = IfcaParams;
    type Client = IfcaClient;
    /// The M cluster models.
    type Server = Models;
    /// The M cluster models.
    type Down = Models;
    type Up = Chosen;

    fn new(_: &'static str, params: Checked<IfcaParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_server(&self, env: &Env) -> Models {
        Models(distinct_inits(env, self.params.clusters))
    }

    fn init_client(&self, env: &Env, _: usize) -> IfcaClient {
        IfcaClient {
            clusters: distinct_inits(env, self.params.clusters),
            model: env.initial_model(),
            chosen: None,
        }
    }

    fn local_round(&self, env: &Env, cx: &mut ClientCx, state: &mut IfcaClient) -> Trained<Chosen> {
        let cluster = argmin(&Self::losses(env, state, &cx.data.train));
        state.model.params = state.clusters[cluster].clone();
        state.chosen = Some(cluster);
        let train_loss = cx.train_plain(env, &mut state.model, &[]);
        Trained {
            up: Chosen {
                cluster,
                model: state.model.params.clone(),
            },
            train_loss,
        }
    }

    fn check_upload(&self, env: &Env, up: &Chosen) -> Result<(), String> {
        if up.cluster >= self.params.clusters {
            return Err(format!(
                "cluster {} of {} clusters",
                up.cluster, self.params.clusters
            ));
        }
        crate::contract::check_whole_models(env, up.vectors())
    }

    fn check_download(&self, env: &Env, down: &Models) -> Result<(), String> {
        down.check(env, self.params.clusters)
    }

    fn aggregate(
        &self,
        env: &Env,
        server: &mut Models,
        _: usize,
        uploads: &[(usize, Chosen)],
    ) -> RoundOutcome<Models> {
        let participants = ids_of(uploads);
        let mut rows = vec![Vec::new(); participants.len()];
        for (m, theta) in server.0.iter_mut().enumerate() {
            let members: Vec<usize> = (0..uploads.len())
                .filter(|&k| uploads[k].1.cluster == m)
                .collect();
            if members.is_empty() {
                continue;
            }
            let ids: Vec<usize> = members.iter().map(|&k| uploads[k].0).collect();
            let p = env.size_weights(&ids);
            let models: Vec<&[f32]> = members
                .iter()
                .map(|&k| uploads[k].1.model.as_slice())
                .collect();
            weighted_sum(&p, &models, theta);
            let mut row = vec![0.0; participants.len()];
            for (w, &k) in p.iter().zip(&members) {
                row[k] = *w;
            }
            for &k in &members {
                rows[k] = row.clone();
            }
        }
        let mut graph = embed_rows(env.clients(), &participants, &rows);
        // An absent client receives all M models, which together carry
        // every participant's upload: its row is p over the participants.
        let mut everyone = vec![0.0; env.clients()];
        for (w, &j) in env.size_weights(&participants).iter().zip(&participants) {
            everyone[j] = *w;
        }
        for i in (0..env.clients()).filter(|i| participants.binary_search(i).is_err()) {
            graph.set_row(i, &everyone);
        }
        RoundOutcome::new(
            graph,
            (0..env.clients()).map(|i| (i, server.clone())).collect(),
        )
    }

    fn receive(&self, _: &Env, state: &mut IfcaClient, models: Models) {
        state.clusters = models.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_download_holds_exactly_one_whole_model_per_cluster() {
        let t = Tiny::new();
        let env = t.env();
        let ok = Models(vec![t.init.clone(); 2]);
        assert_eq!(ok.check(&env, 2), Ok(()));
        assert!(ok.check(&env, 3).is_err());
        assert!(
            Models(vec![t.init.clone(), vec![1.0]])
                .check(&env, 2)
                .is_err()
        );
    }
    use crate::testkit::Tiny;

    #[test]
    fn argmin_takes_the_first_smallest_and_skips_nan() {
        assert_eq!(argmin(&[0.7, 0.2, 0.9]), 1);
        assert_eq!(argmin(&[0.5, 0.2, 0.2]), 1);
        assert_eq!(argmin(&[f64::NAN, 3.0, 1.0]), 2);
    }

    #[test]
    fn each_client_trains_the_cluster_model_with_the_lowest_training_loss() {
        let tiny = Tiny::new();
        let env = tiny.env();
        let ifca = Ifca::new(
            "ifca",
            IfcaParams { clusters: 3 }.check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let mut state = ifca.init_client(&env, 0);
        // Cluster 2 is a model trained on client 0's data: the best fit.
        let mut good = env.initial_model();
        let mut cx = tiny.cx(0, 1);
        for _ in 0..5 {
            cx.train_plain(&env, &mut good, &[]);
        }
        state.clusters[2] = good.params.clone();
        let losses = Ifca::losses(&env, &state, &tiny.cx(0, 1).data.train);
        assert!(losses[2] < losses[0] && losses[2] < losses[1], "{losses:?}");
        let up = ifca.local_round(&env, &mut tiny.cx(0, 2), &mut state).up;
        assert_eq!((up.cluster, state.chosen), (2, Some(2)));
        // It trained from cluster 2's model: one more local round from it.
        let mut expect = Model {
            params: good.params.clone(),
            buffers: state.model.buffers.clone(),
        };
        tiny.cx(0, 2).train_plain(&env, &mut expect, &[]);
        assert_eq!(up.model, expect.params);
    }

    #[test]
    fn clusters_average_their_own_uploads_and_the_graph_is_membership() {
        let tiny = Tiny::new();
        let env = tiny.env();
        let ifca = Ifca::new(
            "ifca",
            IfcaParams { clusters: 3 }.check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let mut server = ifca.init_server(&env);
        assert_ne!(server.0[0], server.0[1], "distinct initial models");
        let untouched = server.0[1].clone();
        let fill = |v: f32| vec![v; env.init.len()];
        let uploads = vec![
            (
                0,
                Chosen {
                    cluster: 2,
                    model: fill(1.0),
                },
            ),
            (
                1,
                Chosen {
                    cluster: 0,
                    model: fill(5.0),
                },
            ),
            (
                2,
                Chosen {
                    cluster: 2,
                    model: fill(4.0),
                },
            ),
        ];
        let out = ifca.aggregate(&env, &mut server, 1, &uploads);
        // Cluster 2: sizes 12 and 24 → (1·12 + 4·24)/36 = 3.
        assert_eq!(server.0[2], fill(3.0));
        assert_eq!(server.0[0], fill(5.0));
        assert_eq!(server.0[1], untouched, "nobody chose cluster 1");
        let third = 1.0 / 3.0;
        assert_eq!(out.graph.row(0), &[third, 0.0, 2.0 * third]);
        assert_eq!(out.graph.row(1), &[0.0, 1.0, 0.0]);
        assert_eq!(out.downloads.len(), 3);
        // Client 1 absent next round: it still receives the models, and
        // its row is p over the participants 0 and 2.
        let two = vec![uploads[0].clone(), uploads[2].clone()];
        let out = ifca.aggregate(&env, &mut server, 2, &two);
        assert_eq!(out.graph.row(1), &[third, 0.0, 2.0 * third]);
        assert_eq!(out.downloads.len(), 3);
        assert_eq!(out.downloads[1].1.0, server.0);
        let bad = Chosen {
            cluster: 3,
            model: fill(0.0),
        };
        assert!(ifca.check_upload(&env, &bad).is_err());
    }
}
