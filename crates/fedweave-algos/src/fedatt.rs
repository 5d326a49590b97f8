//! FedAtt (Ji, Pan, Long, Li, Jiang, Huang: "Learning Private Neural
//! Language Modeling with Attentive Aggregation", IJCNN 2019): the server
//! moves its model toward the clients' with layer-wise attention.
//!
//! Clients train from the server model w exactly as in FedAvg. For every
//! layer l (one parameter tensor, as the keys of the authors' state dicts)
//! the server scores each participant by the distance of its layer to its
//! own, turns the scores into attention with a softmax over the
//! participants, and steps toward them:
//!
//! ```text
//! s_i^l = ‖w^l − w_i^l‖₂,   α_i^l = softmax_i(s_i^l)
//! w^l ← w^l − ε·Σ_i α_i^l (w^l − w_i^l)
//! ```
//!
//! As in the paper and the authors' code (`aggregate_att` of
//! shaoxiongji/fed-att), the softmax is of the distance itself, so a client
//! farther from the server weighs more. ε = `step` = 1.2, the default of the
//! authors' code (`--epsilon`). With ε = 1 and equal distances the update
//! is the plain (unweighted) mean of the uploads. The authors' code also adds
//! Gaussian noise of standard deviation `dp` = 0.001 to w for privacy; it is
//! not implemented here (noise-free, as with `dp = 0`).
//!
//! Graph: per layer, every row is α^l over the round's participants (logged
//! as per-layer graphs named like `fc1.weight`); the round's graph is their
//! mean. The server's own share 1 − ε is no client's and is not in W. The
//! new w goes to every client, absent ones included; scored after
//! receiving it, as `fedavg`.

use crate::Checked;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{
    AlgoError, Algorithm, ClientCx, Env, EvalPoint, Info, Model, ParamError, RoundOutcome, Trained,
    ids_of, models_of, tensor_layers,
};
use fedweave_core::CollaborationGraph;
use std::ops::Range;

params! {
    /// FedAtt's parameters.
    pub struct FedAttParams {
        /// ε: the server's step toward the attention-weighted clients.
        pub step: f64 = 1.2,
    }
}

impl Validate for FedAttParams {
    fn validate(&self) -> Result<(), ParamError> {
        non_negative("step", self.step)?;
        if self.step == 0.0 {
            return Err(ParamError::new(
                "step",
                "must be above 0 (the model would never move)",
            ));
        }
        Ok(())
    }
}

/// FedAtt.
pub struct FedAtt {
    step: f64,
}

/// One attentive step of `server` toward `clients` on each layer of
/// `layers` with step `eps`; returns each layer's attention over the
/// clients (in their order).
pub fn attentive_step(
    server: &mut [f32],
    clients: &[&[f32]],
    layers: &[Range<usize>],
    eps: f64,
) -> Vec<Vec<f64>> {
    layers
        .iter()
        .map(|r| {
            let w = &server[r.clone()];
            let scores: Vec<f64> = clients
                .iter()
                .map(|c| {
                    w.iter()
                        .zip(&c[r.clone()])
                        .map(|(a, b)| (f64::from(*a) - f64::from(*b)).powi(2))
                        .sum::<f64>()
                        .sqrt()
                })
                .collect();
            let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let exp: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
            let total: f64 = exp.iter().sum();
            let att: Vec<f64> = exp.iter().map(|e| e / total).collect();
            for (k, x) in server[r.clone()].iter_mut().enumerate() {
                let s = f64::from(*x);
                let pull: f64 = att
                    .iter()
                    .zip(clients)
                    .map(|(a, c)| a * (s - f64::from(c[r.start + k])))
                    .sum();
                *x = (s - eps * pull) as f32;
            }
            att
        })
        .collect()
}

/// Its messages are models: it takes a personal part ([`crate::personal`]).
impl crate::personal::Splittable for FedAtt {}

impl Algorithm for FedAtt {
    const NAMES: &'static [Info] = &[Info {
        name: "fedatt",
        summary: "server model w; per tensor l: α_i = softmax_i(‖w^l − w_i^l‖), w^l ← w^l − ε·Σ α_i (w^l − w_i^l), step ε = 1.2; rows = α (per-tensor graphs); evaluates w",
        reference: "Ji et al., IJCNN 2019",
    }];
    type Params = FedAttParams;
    /// The server model (after receiving it), then the trained one.
    type Client = Model;
    /// w, as last sent.
    type Server = Vec<f32>;
    /// w.
    type Down = Vec<f32>;
    /// The trained model.
    type Up = Vec<f32>;

    fn new(_: &'static str, p: Checked<FedAttParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self { step: p.step })
    }

    fn init_server(&self, env: &Env) -> Vec<f32> {
        env.init.to_vec()
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
        server: &mut Vec<f32>,
        _: usize,
        uploads: &[(usize, Vec<f32>)],
    ) -> RoundOutcome<Vec<f32>> {
        let n = env.clients();
        let participants = ids_of(uploads);
        let layers = tensor_layers(env);
        let ranges: Vec<Range<usize>> = layers.iter().map(|l| l.range.clone()).collect();
        let att = attentive_step(server, &models_of(uploads), &ranges, self.step);
        let layer_graphs: Vec<(String, CollaborationGraph)> = layers
            .iter()
            .zip(&att)
            .map(|(l, a)| {
                let mut row = vec![0.0; n];
                for (w, &j) in a.iter().zip(&participants) {
                    row[j] = *w;
                }
                (l.name.clone(), CollaborationGraph::broadcast_row(&row))
            })
            .collect();
        let graphs: Vec<CollaborationGraph> = layer_graphs.iter().map(|(_, g)| g.clone()).collect();
        RoundOutcome {
            graph: CollaborationGraph::mean(&graphs),
            layers: layer_graphs,
            downloads: (0..n).map(|i| (i, server.clone())).collect(),
        }
    }

    fn receive(&self, _: &Env, model: &mut Model, global: Vec<f32>) {
        model.params = global;
    }

    fn eval_point(&self) -> EvalPoint {
        EvalPoint::AfterReceive
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::parse;
    use crate::testkit::Tiny;

    /// Two clients, two layers (elements 0..2 and 2..3), server at 0, ε = 1.2.
    /// Layer 1: client A = (3, 4) at distance 5, client B = (0, 0) at 0:
    /// α_A = e⁵/(e⁵ + 1), w = ε·α_A·(3, 4).
    /// Layer 2: A = 1 at distance 1, B = 2 at distance 2:
    /// α_A = 1/(1 + e), α_B = e/(1 + e), w = ε·(α_A + 2α_B).
    #[test]
    fn attention_weights_by_hand() {
        let e = std::f64::consts::E;
        let mut server = vec![0.0f32; 3];
        let a = [3.0f32, 4.0, 1.0];
        let b = [0.0f32, 0.0, 2.0];
        let att = attentive_step(&mut server, &[&a, &b], &[0..2, 2..3], 1.2);
        let a1 = e.powi(5) / (e.powi(5) + 1.0);
        let a2 = 1.0 / (1.0 + e);
        assert!((att[0][0] - a1).abs() < 1e-12 && (att[0][1] - (1.0 - a1)).abs() < 1e-12);
        assert!((att[1][0] - a2).abs() < 1e-12 && (att[1][1] - (1.0 - a2)).abs() < 1e-12);
        let want = [
            1.2 * a1 * 3.0,
            1.2 * a1 * 4.0,
            1.2 * (a2 + 2.0 * (1.0 - a2)),
        ];
        for (g, w) in server.iter().zip(want) {
            assert!((f64::from(*g) - w).abs() < 1e-6, "{g} vs {w}");
        }
        // Numbers for the record: 3.5747, 4.7663, 2.0773.
        assert!((server[2] - 2.077_27).abs() < 1e-4);
    }

    /// ε = 1 and every client at the same distance on every layer: uniform
    /// attention, and the new model is the plain mean of the uploads.
    #[test]
    fn unit_step_and_equal_distances_give_the_plain_mean() {
        let t = Tiny::new();
        let env = t.env();
        let d = env.init.len();
        let server: Vec<f32> = (0..d).map(|k| (k % 5) as f32 * 0.25).collect();
        // Client 0: +0.5 everywhere; client 1: −0.5 on even elements, +0.5
        // on odd ones; client 2: +0.5 on even, −0.5 on odd. Equal norms on
        // every layer.
        let shift = |f: &dyn Fn(usize) -> f32| -> Vec<f32> {
            server.iter().enumerate().map(|(k, s)| s + f(k)).collect()
        };
        let uploads = vec![
            (0, shift(&|_| 0.5)),
            (1, shift(&|k| if k % 2 == 0 { -0.5 } else { 0.5 })),
            (2, shift(&|k| if k % 2 == 0 { 0.5 } else { -0.5 })),
        ];
        let algo = FedAtt { step: 1.0 };
        let mut state = server.clone();
        let out = algo.aggregate(&env, &mut state, 1, &uploads);
        for (k, got) in state.iter().enumerate() {
            let mean = (uploads[0].1[k] + uploads[1].1[k] + uploads[2].1[k]) / 3.0;
            assert!((got - mean).abs() < 1e-6, "element {k}");
        }
        let tensors = env.spec.layout().tensors().len();
        assert!(tensors >= 2);
        assert_eq!(out.layers.len(), tensors);
        for (_, g) in &out.layers {
            for j in 0..3 {
                assert!((g.get(1, j) - 1.0 / 3.0).abs() < 1e-12);
            }
        }
        assert_eq!(out.downloads.len(), 3);
        assert!(out.downloads.iter().all(|(_, m)| m == &state));
    }

    /// The attention differs between layers when the distances do, and
    /// the per-layer graphs say so: client 0 far on the first tensor only.
    #[test]
    fn attention_is_per_tensor() {
        let t = Tiny::new();
        let env = t.env();
        let first = tensor_layers(&env)[0].range.clone();
        let server = env.init.to_vec();
        let mut far = server.clone();
        far[first.clone()].iter_mut().for_each(|x| *x += 1.0);
        let algo = FedAtt { step: 1.2 };
        let mut state = server.clone();
        let out = algo.aggregate(&env, &mut state, 1, &[(0, far), (2, server.clone())]);
        let (g0, g1) = (&out.layers[0].1, &out.layers[1].1);
        assert!(g0.get(1, 0) > 0.99, "{}", g0.get(1, 0));
        assert_eq!((g1.get(1, 0), g1.get(1, 2)), (0.5, 0.5));
        // Only the first tensor moves: by ε·α_0 toward client 0.
        let moved = state[first.start] - server[first.start];
        assert!((f64::from(moved) - 1.2 * g0.get(1, 0)).abs() < 1e-5);
        assert_eq!(state[first.end..], server[first.end..]);
    }

    #[test]
    fn impossible_steps_are_rejected_naming_the_key() {
        for text in ["step = 0.0", "step = -1.0", "epsilon = 1.0"] {
            let table: toml::Table = toml::from_str(text).unwrap();
            let e = parse::<FedAttParams>("fedatt", &table, 3)
                .unwrap_err()
                .to_string();
            let key = if text.starts_with("step") {
                "step"
            } else {
                "epsilon"
            };
            assert!(e.contains(&format!("algorithm.{key}")), "{text}: {e}");
        }
    }
}
