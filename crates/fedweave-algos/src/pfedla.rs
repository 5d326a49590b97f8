//! pFedLA (Ma et al., CVPR 2022, "Layer-wised Model Aggregation for
//! Personalized Federated Learning").
//!
//! The paper and the code (FL-bench's `pfedla.py`, METHODS.md §6): the
//! server keeps one hypernetwork *per client*: an embedding (width 100) →
//! 3 × [Linear(100) + ReLU] → one Linear(100 → N) per model layer, weights
//! uniform in [0, 1) and zero bias, then ReLU. Its outputs a^l are client
//! i's aggregation weights on layer l: θ̄_i^l = Σ_j (a_j^l / Σ_k a_k^l) θ_j^l
//! over every client's latest model (self only when a layer's outputs are
//! all 0). After client i trains θ̄_i to θ_i^new, its hypernetwork takes an
//! SGD step (lr 5e-3, no momentum) along (∂θ̄_i/∂φ_i)ᵀ (θ_i^new − θ̄_i), the
//! sign FedAGHN inherited (FL-bench passes the negated difference as
//! `grad_outputs`); the opposite sign is pFedHN's. A "layer" is one
//! parameter tensor (weight and bias separately). HeurpFedLA (fixing the
//! top-K layers to self) is not implemented.
//!
//! fedweave: the same networks (`embedding_dim`, `hidden_dim` = 100,
//! `hn_lr` = 5e-3, `hn_sign` as in [`crate::fedaghn`]), per parameter tensor,
//! with closed-form gradients: ∂⟨θ̄^l, g⟩/∂a_j^l = (⟨θ_j^l, g⟩ − ⟨θ̄^l, g⟩)/S^l
//! through the ReLU, then the network's backward pass. The server stores
//! each uploader's trained model as its latest model (FL-bench adds the
//! update to its stored copy instead); clients that have not uploaded yet
//! count with the round-0 model. In `aggregate` each uploader's network
//! steps with the derivative of the θ̄_i it trained from (kept on the
//! server; before its first download the client trained the round-0 model
//! and there is no step), taken with its network as it built θ̄_i (only
//! that client's own step changes it) and the server's models before the
//! round's uploads are stored: exactly the models θ̄_i mixed under full
//! participation, the newer ones of clients that uploaded in between under
//! partial participation (keeping every θ̄_i's N mixed models would cost N²
//! model copies). Then every participant's θ̄_i is built from the round's
//! models. Per-tensor weights
//! are logged as per-layer graphs (`graph_layers`, named like `fc1.weight`),
//! their mean as the round's graph. Evaluation: the model after local
//! training.

use crate::Checked;
use crate::fedaghn::HnSign;
use crate::hypernet::{HyperNet, Sgd, Shape};
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{
    AlgoError, Algorithm, ClientCx, Env, Info, Model, ParamError, RoundOutcome, Trained, ids_of,
    layered_outcome, models_of, tensor_layers,
};
use fedweave_core::vecmath::{dot, weighted_sum};
use fedweave_core::{Purpose, rng_stream};
use rand::Rng;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

params! {
    /// pFedLA's parameters.
    pub struct PFedLaParams {
        /// Embedding width.
        pub embedding_dim: usize = 100,
        /// Width of the three hidden layers.
        pub hidden_dim: usize = 100,
        /// Hypernetwork learning rate.
        pub hn_lr: f64 = 5e-3,
        /// Direction of the hypernetwork step.
        pub hn_sign: HnSign = HnSign::Fedaghn,
    }
}

impl Validate for PFedLaParams {
    fn validate(&self) -> Result<(), ParamError> {
        if self.embedding_dim == 0 {
            return Err(ParamError::new("embedding_dim", "must be ≥ 1"));
        }
        if self.hidden_dim == 0 {
            return Err(ParamError::new("hidden_dim", "must be ≥ 1"));
        }
        non_negative("hn_lr", self.hn_lr)
    }
}

/// Each layer's weights over the `n` clients from the head's raw outputs
/// (layer-major): ReLU, then normalised; the one-hot row of `me` when a
/// layer's outputs are all ≤ 0.
pub fn layer_weights(raw: &[f32], n: usize, me: usize) -> Vec<Vec<f64>> {
    raw.chunks(n)
        .map(|z| {
            let a: Vec<f64> = z.iter().map(|x| x.max(0.0) as f64).collect();
            let s: f64 = a.iter().sum();
            if s > 0.0 {
                a.iter().map(|x| x / s).collect()
            } else {
                (0..n).map(|j| if j == me { 1.0 } else { 0.0 }).collect()
            }
        })
        .collect()
}

/// ∂⟨θ̄, g⟩/∂raw on one layer from the raw outputs `z` and the products
/// d_j = ⟨θ_j^l, g^l⟩: (d_j − Σ_k w_k d_k)/S for z_j > 0, else 0 (and 0
/// everywhere when S = 0: the fallback does not depend on z).
pub fn raw_grad(z: &[f32], dots: &[f64]) -> Vec<f32> {
    let s: f64 = z.iter().map(|x| x.max(0.0) as f64).sum();
    if s <= 0.0 {
        return vec![0.0; z.len()];
    }
    let mean: f64 = z
        .iter()
        .zip(dots)
        .map(|(x, d)| x.max(0.0) as f64 * d)
        .sum::<f64>()
        / s;
    z.iter()
        .zip(dots)
        .map(|(x, d)| {
            if *x > 0.0 {
                ((d - mean) / s) as f32
            } else {
                0.0
            }
        })
        .collect()
}

/// pFedLA.
pub struct PFedLa {
    params: PFedLaParams,
}

/// The server: a hypernetwork per client, the latest models, and what it
/// last built for each client.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PFedLaServer {
    /// Client i's hypernetwork.
    pub nets: Vec<HyperNet>,
    /// θ_j, each client's latest model (`None`: the round-0 model).
    #[serde(with = "fedweave_core::stash::opt_vectors")]
    models: Vec<Option<Vec<f32>>>,
    /// θ̄_i as last sent (`None`: never sent).
    #[serde(with = "fedweave_core::stash::opt_vectors")]
    built: Vec<Option<Vec<f32>>>,
}

impl PFedLa {
    /// The step of client `me`'s network after it trained `built` (θ̄) to
    /// `trained`, with `mixed` the models θ̄ was built from: the
    /// vector–Jacobian product through the weights, then the network.
    fn step(
        &self,
        env: &Env,
        net: &mut HyperNet,
        mixed: &[&[f32]],
        built: &[f32],
        trained: &[f32],
    ) {
        let sign = match self.params.hn_sign {
            HnSign::Fedaghn => 1.0f32,
            HnSign::Pfedhn => -1.0,
        };
        let g: Vec<f32> = trained
            .iter()
            .zip(built)
            .map(|(t, b)| sign * (t - b))
            .collect();
        let pass = net.pass(0);
        let raw = net.output(&pass);
        let v = output_grad(env, &raw, mixed, &g);
        let grad = net.backward(0, &pass, &v);
        net.step(
            grad,
            Sgd {
                lr: self.params.hn_lr as f32,
                momentum: 0.0,
                weight_decay: 0.0,
                clip: f32::INFINITY,
            },
        );
    }
}

/// ∂⟨θ̄, g⟩/∂raw over every layer (layer-major, like `raw`), with θ̄ built
/// from `mixed` (one model per client).
pub fn output_grad(env: &Env, raw: &[f32], mixed: &[&[f32]], g: &[f32]) -> Vec<f32> {
    tensor_layers(env)
        .iter()
        .zip(raw.chunks(mixed.len()))
        .flat_map(|(layer, z)| {
            let r = layer.range.clone();
            let dots: Vec<f64> = mixed
                .iter()
                .map(|m| dot(&m[r.clone()], &g[r.clone()]))
                .collect();
            raw_grad(z, &dots)
        })
        .collect()
}

/// θ̄_i from client `me`'s network and every client's model, and its
/// per-layer weights over all clients.
pub fn build(env: &Env, net: &HyperNet, me: usize, mixed: &[&[f32]]) -> (Vec<f32>, Vec<Vec<f64>>) {
    let raw = net.output(&net.pass(0));
    let weights = layer_weights(&raw, mixed.len(), me);
    let mut model = vec![0.0f32; env.init.len()];
    for (layer, w) in tensor_layers(env).iter().zip(&weights) {
        let r = layer.range.clone();
        let slices: Vec<&[f32]> = mixed.iter().map(|m| &m[r.clone()]).collect();
        weighted_sum(w, &slices, &mut model[r]);
    }
    (model, weights)
}

impl Algorithm for PFedLa {
    const NAMES: &'static [Info] = &[Info {
        name: "pfedla",
        summary: "per client, a hypernetwork (embedding_dim 100 → 3×100 ReLU → per-tensor ReLU heads) gives each layer's weights over all clients; stepped by (∂θ̄/∂φ)ᵀ(θ_new − θ̄) (hn_lr 5e-3); per-layer graphs",
        reference: "Ma et al., CVPR 2022",
    }];
    type Params = PFedLaParams;
    type Client = Model;
    type Server = PFedLaServer;
    /// θ̄_i.
    type Down = Vec<f32>;
    /// The trained model.
    type Up = Vec<f32>;

    fn new(_: &'static str, params: Checked<PFedLaParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_server(&self, env: &Env) -> PFedLaServer {
        let n = env.clients();
        let layers = tensor_layers(env).len();
        let seed = crate::init_seed(env.init);
        let nets = (0..n)
            .map(|i| {
                let shape = Shape {
                    rows: 1,
                    embed: self.params.embedding_dim,
                    hidden: vec![self.params.hidden_dim; 3],
                    relu_last: true,
                    out: layers * n,
                };
                let mut rng = rng_stream(seed, 0, i as u64, Purpose::Algorithm);
                let mut net = HyperNet::new(shape, &mut rng);
                let (w, b) = net.head_mut();
                for x in w.iter_mut() {
                    *x = rng.random::<f32>();
                }
                b.fill(0.0);
                net
            })
            .collect();
        PFedLaServer {
            nets,
            models: vec![None; n],
            built: vec![None; n],
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
        server: &mut PFedLaServer,
        _: usize,
        uploads: &[(usize, Vec<f32>)],
    ) -> RoundOutcome<Vec<f32>> {
        let n = env.clients();
        let participants = ids_of(uploads);
        let mut trained: Vec<Option<&[f32]>> = vec![None; n];
        for (&i, t) in participants.iter().zip(models_of(uploads)) {
            trained[i] = Some(t);
        }
        let PFedLaServer {
            nets,
            models,
            built,
        } = server;
        // Each uploader's network steps along the θ̄ it trained from, built
        // from the models the server held then: its latest models, unless
        // another client uploaded in between (partial participation).
        {
            let mixed: Vec<&[f32]> = models
                .iter()
                .map(|m| m.as_deref().unwrap_or(env.init))
                .collect();
            nets.par_iter_mut()
                .zip(built.par_iter_mut())
                .enumerate()
                .for_each(|(i, (net, sent))| {
                    if let (Some(t), Some(b)) = (trained[i], sent.as_deref()) {
                        self.step(env, net, &mixed, b, t);
                    }
                });
        }
        for (i, t) in trained.iter().enumerate() {
            if let Some(t) = t {
                models[i] = Some(t.to_vec());
            }
        }
        let mixed: Vec<&[f32]> = models
            .iter()
            .map(|m| m.as_deref().unwrap_or(env.init))
            .collect();
        let made: Vec<(Vec<f32>, Vec<Vec<f64>>)> = participants
            .par_iter()
            .map(|&i| build(env, &nets[i], i, &mixed))
            .collect();
        let layers = tensor_layers(env);
        let mut layer_rows = vec![Vec::with_capacity(participants.len()); layers.len()];
        let mut downloads = Vec::with_capacity(participants.len());
        for (&i, (model, weights)) in participants.iter().zip(made) {
            for (r, w) in weights.into_iter().enumerate() {
                layer_rows[r].push(w);
            }
            built[i] = Some(model.clone());
            downloads.push((i, model));
        }
        let all: Vec<usize> = (0..n).collect();
        layered_outcome(n, &participants, &all, &layers, &layer_rows, downloads)
    }

    fn receive(&self, _: &Env, model: &mut Model, theta: Vec<f32>) {
        model.params = theta;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Tiny;

    #[test]
    fn layer_weights_are_on_the_simplex_with_a_self_fallback() {
        let w = layer_weights(&[1.0, -2.0, 3.0, -1.0, -1.0, 0.0], 3, 1);
        assert_eq!(w[0], vec![0.25, 0.0, 0.75]);
        assert_eq!(w[1], vec![0.0, 1.0, 0.0]);
        // S = 0: no gradient.
        assert_eq!(raw_grad(&[-1.0, 0.0], &[1.0, 2.0]), vec![0.0, 0.0]);
        // By hand: z = (1, 3, −1), d = (2, 4, 9): mean = (2 + 12)/4 = 3.5,
        // ∂/∂z = ((2 − 3.5)/4, (4 − 3.5)/4, 0).
        assert_eq!(
            raw_grad(&[1.0, 3.0, -1.0], &[2.0, 4.0, 9.0]),
            vec![-0.375, 0.125, 0.0]
        );
    }

    /// The closed-form gradient of ⟨θ̄(φ), g⟩ (weights per layer, then the
    /// network) against finite differences, on Tiny's MLP with three
    /// different client models; every layer's weights sum to 1.
    #[test]
    fn hypernetwork_gradient_matches_finite_differences() {
        let tiny = Tiny::new();
        let env = tiny.env();
        let params = PFedLaParams {
            embedding_dim: 4,
            hidden_dim: 6,
            ..Default::default()
        };
        let algo = PFedLa::new("pfedla", params.check(env.clients()).unwrap(), &env).unwrap();
        let server = algo.init_server(&env);
        let net = &server.nets[1];
        let models: Vec<Vec<f32>> = (0..3)
            .map(|c| {
                let mut m = env.initial_model();
                tiny.cx(c, 1).train_plain(&env, &mut m, &[]);
                m.params
            })
            .collect();
        let mixed: Vec<&[f32]> = models.iter().map(|m| m.as_slice()).collect();
        let (bar, weights) = build(&env, net, 1, &mixed);
        assert_eq!(weights.len(), 6, "one row per parameter tensor");
        for w in &weights {
            assert!((w.iter().sum::<f64>() - 1.0).abs() < 1e-9);
            assert!(w.iter().all(|x| *x >= 0.0));
        }
        let g: Vec<f32> = (0..bar.len())
            .map(|k| ((k * 37) % 11) as f32 / 11.0 - 0.5)
            .collect();
        let pass = net.pass(0);
        let v = output_grad(&env, &net.output(&pass), &mixed, &g);
        let grad = net.backward(0, &pass, &v);
        let f = |n: &HyperNet| dot(&build(&env, n, 1, &mixed).0, &g);
        let h = 1e-3f32;
        let len = net.params.len();
        // Embedding, first layer, and the head's weights and biases.
        let probe: Vec<usize> = (0..4).chain(10..14).chain(len - 60..len).collect();
        let mut nonzero = 0;
        for p in probe {
            let (mut hi, mut lo) = (net.clone(), net.clone());
            hi.params[p] += h;
            lo.params[p] -= h;
            let fd = (f(&hi) - f(&lo)) / (2.0 * h as f64);
            assert!(
                (fd - grad[p] as f64).abs() < 2e-2 * fd.abs().max(0.05),
                "φ[{p}]: finite difference {fd} vs {}",
                grad[p]
            );
            nonzero += usize::from(grad[p] != 0.0);
        }
        assert!(nonzero > 20, "{nonzero}");
    }

    /// Two rounds of `aggregate`: round 1 has no step (clients trained the
    /// round-0 model), builds θ̄ for every participant; round 2 steps only
    /// the uploaders' networks; absent clients keep identity rows.
    #[test]
    fn aggregate_steps_uploaders_and_logs_per_tensor_graphs() {
        let tiny = Tiny::new();
        let env = tiny.env();
        let algo = PFedLa::new(
            "pfedla",
            PFedLaParams::default().check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let mut server = algo.init_server(&env);
        let ups: Vec<(usize, Vec<f32>)> = (0..3)
            .map(|c| {
                let mut m = env.initial_model();
                tiny.cx(c, 1).train_plain(&env, &mut m, &[]);
                (c, m.params)
            })
            .collect();
        let nets0 = server.nets.clone();
        let out = algo.aggregate(&env, &mut server, 1, &ups);
        assert_eq!(server.nets, nets0, "no step before a client trained a θ̄");
        assert_eq!(out.layers.len(), 6);
        assert_eq!(out.layers[0].0, "fc1.weight");
        for (_, g) in &out.layers {
            assert!(g.max_row_sum_error() < 1e-9);
        }
        let out = algo.aggregate(&env, &mut server, 2, &ups[..2]);
        assert_ne!(server.nets[0], nets0[0]);
        assert_ne!(server.nets[1], nets0[1]);
        assert_eq!(server.nets[2], nets0[2]);
        assert!((out.graph.get(2, 2) - 1.0).abs() < 1e-12);
        assert_eq!(out.downloads.len(), 2);
    }
}
