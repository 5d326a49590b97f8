//! pFedHN (Shamsian et al., ICML 2021, "Personalized Federated Learning
//! using Hypernetworks").
//!
//! The paper: the server holds a hypernetwork h(v_i; φ) mapping a learnable
//! client embedding v_i to all of client i's model weights θ_i. Client i
//! trains θ_i locally to θ̃_i and returns Δθ_i = θ_i − θ̃_i; the server steps
//! φ (embeddings included) along (∂θ_i/∂φ)ᵀ Δθ_i, the gradient of
//! ½‖θ_i − θ̃_i‖² with θ̃_i fixed. The authors' code and FL-bench: embedding
//! width 1 + N/4 (FL-bench ⌊(1 + N)/4⌋), an MLP Linear(E, 100) followed by
//! n_hidden × [ReLU, Linear(100, 100)], one linear head per parameter tensor
//! (hidden → that tensor's size), SGD lr 1e-2, momentum 0.9, weight decay
//! 1e-3, gradient norm clipped at 50; clients one after another, each step
//! right after that client's training.
//!
//! fedweave: the same network with `embed_dim` = ⌊(1 + N)/4⌋ (at least 1),
//! `hidden_dim` = 100, `hidden_layers` = 1 (the paper's n_hidden), and the
//! heads as one linear map from the hidden layer to the whole flat vector
//! (the per-tensor heads side by side), and `hn_lr` = 1e-3: with the paper's
//! 1e-2 and momentum 0.9 the generated models diverge on pathological
//! digits from round 3 (mean test accuracy 0.98 → 0.20 by round 10: ten
//! clients' opposite updates pile up in the momentum of the shared head
//! bias), 1e-3 keeps them at 0.98. One departure, so that every client
//! starts from the common round-0 model like every other fedweave method:
//! the head's bias is that model and its weight starts at zero (the paper
//! initialises the heads randomly); the embeddings and the MLP get a
//! gradient from the second step on. In `aggregate` the server steps φ once
//! per uploading client, in ascending client order, with the Jacobian at
//! the current φ (FL-bench: the φ that generated the model, unchanged in its
//! sequential loop), Δθ_i taken against the model it sent (the round-0 model
//! before the first), then generates every participant's next model.
//! Batch-norm statistics stay with the client. The logged graph is not a
//! mixing (pFedHN mixes nothing explicitly): row i is the positive part of
//! the cosine similarity between client i's embedding and the other
//! participants' (self 1), normalised. Evaluation: the model after local
//! training.

use crate::Checked;
use crate::hypernet::{HyperNet, Sgd, Shape};
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{
    AlgoError, Algorithm, ClientCx, Env, Info, Model, ParamError, RoundOutcome, Trained,
    embed_rows, ids_of, models_of,
};
use fedweave_core::vecmath::cosine;
use fedweave_core::{Purpose, rng_stream};
use serde::{Deserialize, Serialize};

params! {
    /// pFedHN's parameters.
    pub struct PFedHnParams {
        /// Embedding width (0: ⌊(1 + N)/4⌋, at least 1).
        pub embed_dim: usize = 0,
        /// Width of the hidden layers.
        pub hidden_dim: usize = 100,
        /// Hidden Linear(100, 100) layers after the first (the paper's n_hidden).
        pub hidden_layers: usize = 1,
        /// Hypernetwork learning rate.
        pub hn_lr: f64 = 1e-3,
        /// Hypernetwork SGD momentum.
        pub hn_momentum: f64 = 0.9,
        /// Hypernetwork weight decay.
        pub hn_weight_decay: f64 = 1e-3,
        /// Gradient norm clip.
        pub norm_clip: f64 = 50.0,
    }
}

impl Validate for PFedHnParams {
    fn validate(&self) -> Result<(), ParamError> {
        if self.hidden_dim == 0 {
            return Err(ParamError::new("hidden_dim", "must be ≥ 1"));
        }
        non_negative("hn_lr", self.hn_lr)?;
        non_negative("hn_momentum", self.hn_momentum)?;
        non_negative("hn_weight_decay", self.hn_weight_decay)?;
        if self.norm_clip.is_nan() || self.norm_clip <= 0.0 {
            return Err(ParamError::new(
                "norm_clip",
                format!("must be > 0, got {}", self.norm_clip),
            ));
        }
        Ok(())
    }

    fn resolve(&mut self, clients: usize) {
        if self.embed_dim == 0 {
            self.embed_dim = ((1 + clients) / 4).max(1);
        }
    }
}

/// pFedHN.
pub struct PFedHn {
    params: PFedHnParams,
}

/// The server: the hypernetwork and the model it last sent each client.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PFedHnServer {
    /// h(v; φ).
    pub net: HyperNet,
    /// θ_i as sent (`None`: the round-0 model).
    #[serde(with = "fedweave_core::stash::opt_vectors")]
    sent: Vec<Option<Vec<f32>>>,
}

impl PFedHn {
    fn sgd(&self) -> Sgd {
        Sgd {
            lr: self.params.hn_lr as f32,
            momentum: self.params.hn_momentum as f32,
            weight_decay: self.params.hn_weight_decay as f32,
            clip: self.params.norm_clip as f32,
        }
    }
}

/// Row i: max(0, cos(v_i, v_j)) over `who`, normalised (the self term is 1).
pub fn embedding_rows(net: &HyperNet, who: &[usize]) -> Vec<Vec<f64>> {
    who.iter()
        .map(|&i| {
            let row: Vec<f64> = who
                .iter()
                .map(|&j| cosine(net.embedding(i), net.embedding(j)).max(0.0))
                .collect();
            let total: f64 = row.iter().sum();
            row.iter().map(|w| w / total).collect()
        })
        .collect()
}

impl Algorithm for PFedHn {
    const NAMES: &'static [Info] = &[Info {
        name: "pfedhn",
        summary: "server hypernetwork: client embedding → MLP (hidden_dim 100) → all model weights, stepped by (∂θ/∂φ)ᵀ(θ_sent − θ_trained) (hn_lr 1e-3, momentum 0.9); graph = positive embedding cosines",
        reference: "Shamsian et al., ICML 2021",
    }];
    type Params = PFedHnParams;
    type Client = Model;
    type Server = PFedHnServer;
    /// The generated model.
    type Down = Vec<f32>;
    /// The trained model.
    type Up = Vec<f32>;

    fn new(_: &'static str, params: Checked<PFedHnParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_server(&self, env: &Env) -> PFedHnServer {
        let p = &self.params;
        let shape = Shape {
            rows: env.clients(),
            embed: p.embed_dim.max(1),
            hidden: vec![p.hidden_dim; 1 + p.hidden_layers],
            relu_last: false,
            out: env.init.len(),
        };
        let seed = crate::init_seed(env.init);
        let mut net = HyperNet::new(
            shape,
            &mut rng_stream(seed, 0, u64::MAX, Purpose::Algorithm),
        );
        let (w, b) = net.head_mut();
        w.fill(0.0);
        b.copy_from_slice(env.init);
        PFedHnServer {
            net,
            sent: vec![None; env.clients()],
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
        server: &mut PFedHnServer,
        _: usize,
        uploads: &[(usize, Vec<f32>)],
    ) -> RoundOutcome<Vec<f32>> {
        let participants = ids_of(uploads);
        for (&i, trained) in participants.iter().zip(models_of(uploads)) {
            let sent = server.sent[i].as_deref().unwrap_or(env.init);
            let delta: Vec<f32> = sent.iter().zip(trained).map(|(s, t)| s - t).collect();
            let pass = server.net.pass(i);
            let grad = server.net.backward(i, &pass, &delta);
            server.net.step(grad, self.sgd());
        }
        let downloads: Vec<(usize, Vec<f32>)> = participants
            .iter()
            .map(|&i| {
                let theta = server.net.output(&server.net.pass(i));
                server.sent[i] = Some(theta.clone());
                (i, theta)
            })
            .collect();
        let rows = embedding_rows(&server.net, &participants);
        RoundOutcome::new(embed_rows(env.clients(), &participants, &rows), downloads)
    }

    fn receive(&self, _: &Env, model: &mut Model, theta: Vec<f32>) {
        model.params = theta;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Tiny;

    /// Round 0 hands out the common model; one aggregate with a single
    /// client moving its model by Δ moves that client's next model towards
    /// where it trained (the pFedHN sign), and the graph rows are stochastic.
    #[test]
    fn generated_models_start_at_init_and_follow_the_clients() {
        let tiny = Tiny::new();
        let env = tiny.env();
        let params = PFedHnParams {
            hn_momentum: 0.0,
            hn_weight_decay: 0.0,
            embed_dim: 2,
            ..Default::default()
        };
        let algo = PFedHn::new("pfedhn", params.check(env.clients()).unwrap(), &env).unwrap();
        let mut server = algo.init_server(&env);
        for i in 0..3 {
            assert_eq!(server.net.output(&server.net.pass(i)), env.init);
        }
        let mut trained = env.initial_model();
        tiny.cx(0, 1).train_plain(&env, &mut trained, &[]);
        let uploads = vec![(0, trained.params.clone()), (1, env.init.to_vec())];
        let out = algo.aggregate(&env, &mut server, 1, &uploads);
        let next = &out.downloads[0].1;
        let dist = |a: &[f32], b: &[f32]| fedweave_core::vecmath::sq_dist(a, b);
        assert!(
            dist(next, &trained.params) < dist(env.init, &trained.params),
            "the generated model moves towards the trained one"
        );
        assert_eq!(out.downloads.len(), 2);
        assert!(out.graph.max_row_sum_error() < 1e-12);
        assert_eq!(out.graph.row(2), &[0.0, 0.0, 1.0]);
    }

    #[test]
    fn embedding_width_resolves_from_the_clients() {
        let mut p = PFedHnParams::default();
        p.resolve(50);
        assert_eq!(p.embed_dim, 12);
        let mut p = PFedHnParams::default();
        p.resolve(2);
        assert_eq!(p.embed_dim, 1);
        let bad = PFedHnParams {
            norm_clip: 0.0,
            ..Default::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("algorithm.norm_clip")
        );
    }
}
