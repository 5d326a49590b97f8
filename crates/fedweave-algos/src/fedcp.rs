//! FedCP (Zhang et al., KDD 2023): separating feature information for
//! personalized FL via a conditional policy. Architecture and defaults
//! follow PFLlib's `clientcp.py`/`servercp.py` (the authors' maintained
//! code).
//!
//! **Model.** Each client holds the model (body = feature extractor, and its
//! own *personal head*), a frozen *global head*, a conditional policy network
//! (CPN: Linear d → 2d, LayerNorm, ReLU; [`fedweave_nn::conditional`]) and a
//! conditional vector v_i. For a sample with features h, the CPN reads
//! h ⊙ v_i/‖v_i‖ and gives per-feature policies p (personal) and
//! s = 1 − p (global) by a Gumbel-softmax over pairs of its outputs (τ = 1,
//! soft); the prediction is head_p(h ⊙ p) + head_g(h ⊙ s).
//!
//! **Local objective.** CE of that prediction + λ·MMD²(f(x), f_g(x)) with
//! f_g the frozen global body (the body as received), RBF kernel with
//! bandwidths {10, 15, 20, 50}; λ = 5 (the authors' `run_me.sh`, `-lam 5`).
//! The body, the personal head and the CPN train jointly (the CPN through
//! [`fedweave_nn::LocalTrainer::loss_and_grad_aux`], updated here with the
//! same momentum-SGD rule as the model); the global head and f_g are frozen.
//!
//! **Graph rule.** The server averages with data-size weights p over the
//! round's participants: the body (sent to every client), the global heads
//! the clients upload — each uploads ½(head_p + head_g) (`generate_upload_head`)
//! — and the CPNs (both sent to the participants only, as `global_head`
//! and `global_cs` do). A participant that receives them sets
//! v_i = Σ_c W_p[·, c], the sum of its personal head's weight over the
//! classes (`set_head_g`). The personal head never leaves the client.
//! Logged layers: `body` (every row p), `global_head` and `cpn` (rows p for
//! participants, identity for absent clients), `personal_head` (identity);
//! `graph` is their mean.
//!
//! **Evaluation.** The policy's prediction after the round's downloads
//! (PFLlib evaluates before the next round's training).
//!
//! **Deviations from the reference code.**
//! - Evaluation uses the noise-free policy (softmax without Gumbel noise):
//!   PFLlib samples Gumbel noise at test time too, which makes its scores
//!   random; training draws the noise from the client's seeded stream.
//! - The optimiser is `train`'s momentum SGD for every trainable part (PFLlib:
//!   plain SGD at the same rate).
//! - f_g's features are computed once per round in evaluation mode
//!   (running batch-norm statistics); PFLlib runs the frozen copy in
//!   training mode. Identical for models without batch norm.
//! - The initial conditional vector (U(0, 1) per client) and the common CPN
//!   initialisation are drawn from a stream keyed by the round-0 model, so
//!   every run is reproducible.

use crate::Checked;
use crate::contract::check_parts;
use crate::contract::holds_model;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{
    AlgoError, Algorithm, ClientCx, Env, EvalPoint, Info, Message, Model, ParamError, RoundOutcome,
    Trained, embed_rows, ids_of,
};
use fedweave_core::vecmath::weighted_sum;
use fedweave_core::{CollaborationGraph, Purpose, rng_stream};
use fedweave_nn::conditional::{cpn_len, evaluate_policy, init_cpn};
use fedweave_nn::{ConditionalPolicy, EvalStats, LocalData, PolicyObjective};
use rand::Rng;
use serde::{Deserialize, Serialize};

params! {
    /// FedCP's parameters.
    pub struct FedCpParams {
        /// λ of the MMD term (the authors' `-lam 5`).
        pub lambda: f64 = 5.0,
        /// Gumbel-softmax temperature τ (PFLlib's `tau = 1`).
        pub tau: f64 = 1.0,
    }
}

impl Validate for FedCpParams {
    fn validate(&self) -> Result<(), ParamError> {
        non_negative("lambda", self.lambda)?;
        if !(self.tau > 0.0 && self.tau.is_finite()) {
            return Err(ParamError::new(
                "tau",
                format!("must be a finite number > 0, got {}", self.tau),
            ));
        }
        Ok(())
    }
}

/// The FedCP algorithm.
pub struct FedCp {
    params: FedCpParams,
}

/// A FedCP client.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FedCpClient {
    /// Body and personal head, with the client's batch-norm statistics.
    pub model: Model,
    /// The frozen global head (the head's layout: weight then bias).
    #[serde(with = "fedweave_core::stash::vector")]
    pub global_head: Vec<f32>,
    /// The CPN's parameters ([`fedweave_nn::conditional::cpn_len`]).
    #[serde(with = "fedweave_core::stash::vector")]
    pub cpn: Vec<f32>,
    /// The conditional vector v_i (feature width; normalised when used).
    pub context: Vec<f32>,
}

/// What a client uploads: the shared parts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FedCpUp {
    /// The trained body.
    pub body: Vec<f32>,
    /// ½(personal head + global head).
    pub head: Vec<f32>,
    /// The trained CPN.
    pub cpn: Vec<f32>,
}

impl Message for FedCpUp {
    fn vectors(&self) -> Vec<&[f32]> {
        vec![&self.body, &self.head, &self.cpn]
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.body, &mut self.head, &mut self.cpn]
    }
}

/// What the server sends one client.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FedCpDown {
    /// The global body (every client).
    pub body: Vec<f32>,
    /// The global head and CPN (participants only).
    pub global: Option<(Vec<f32>, Vec<f32>)>,
}

impl Message for FedCpDown {
    fn vectors(&self) -> Vec<&[f32]> {
        let mut v = vec![self.body.as_slice()];
        if let Some((h, c)) = &self.global {
            v.push(h);
            v.push(c);
        }
        v
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        let mut v = vec![self.body.as_mut_slice()];
        if let Some((h, c)) = &mut self.global {
            v.push(h.as_mut_slice());
            v.push(c.as_mut_slice());
        }
        v
    }
}

/// One standard Gumbel draw, −ln(−ln u) with u ~ U(0, 1).
pub fn gumbel(rng: &mut impl Rng) -> f32 {
    let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    (-(-u.ln()).ln()) as f32
}

/// v = Σ_c W[·, c]: the personal head's weight (stored `[d, classes]`)
/// summed over the classes, PFLlib's `set_head_g` context.
pub fn context_of(head: &[f32], d: usize) -> Vec<f32> {
    let classes = head.len() / (d + 1).max(1);
    (0..d)
        .map(|k| {
            head[k * classes..(k + 1) * classes]
                .iter()
                .map(|&w| f64::from(w))
                .sum::<f64>() as f32
        })
        .collect()
}

/// The uploaded global head ½(head_p + head_g).
pub fn upload_head(personal: &[f32], global: &[f32]) -> Vec<f32> {
    personal
        .iter()
        .zip(global)
        .map(|(p, g)| p * 0.5 + g * 0.5)
        .collect()
}

/// Momentum SGD on a host vector with PyTorch's rule (dampening 0), as
/// [`fedweave_nn::LocalTrainer::step`] applies it to the model.
fn sgd_step(theta: &mut [f32], grad: &[f32], buf: &mut [f32], momentum: f32, wd: f32, lr: f32) {
    for ((t, g), b) in theta.iter_mut().zip(grad).zip(buf.iter_mut()) {
        let g = g + *t * wd;
        *b = *b * momentum + g;
        *t -= *b * lr;
    }
}

impl FedCp {
    fn policy<'a>(&self, state: &'a FedCpClient) -> ConditionalPolicy<'a> {
        ConditionalPolicy {
            global_head: &state.global_head,
            context: &state.context,
            tau: self.params.tau as f32,
        }
    }
}

// Scored: the body and personal head; the prediction also needs the global
// head and the CPN, see [`Algorithm::evaluate`].
holds_model!(FedCpClient: model);

impl Algorithm for FedCp {
    const NAMES: &'static [Info] = &[Info {
        name: "fedcp",
        summary: "body, global head and CPN averaged with p; a conditional policy splits features into personal (own head) and global (frozen global head) parts; local CE + λ·MMD(f, f_global), λ = 5",
        reference: "Zhang et al., KDD 2023",
    }];
    type Params = FedCpParams;
    type Client = FedCpClient;
    type Server = ();
    type Down = FedCpDown;
    type Up = FedCpUp;

    fn new(name: &'static str, params: Checked<FedCpParams>, env: &Env) -> Result<Self, AlgoError> {
        if env.label_counts.iter().all(|c| c.is_empty()) {
            return Err(AlgoError::Unsupported {
                algorithm: name.to_string(),
                message: "FedCP needs classification data (two classifier heads)".into(),
            });
        }
        // The context is read off a linear head's weight rows: a
        // `sequential` model's head must be one linear layer with a bias.
        let (d, head) = (env.spec.feature_len(), env.spec.split().head.len());
        if head != (d + 1) * env.spec.num_classes() {
            return Err(AlgoError::Unsupported {
                algorithm: name.to_string(),
                message: format!(
                    "FedCP needs a head of one linear layer with a bias ({d} features → {} classes); this model's head has {head} parameters",
                    env.spec.num_classes()
                ),
            });
        }
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_client(&self, env: &Env, client: usize) -> FedCpClient {
        let d = env.spec.feature_len();
        let seed = crate::init_seed(env.init);
        let cpn = init_cpn(d, &mut rng_stream(seed, 0, u64::MAX, Purpose::Algorithm));
        let mut rng = rng_stream(seed, 0, client as u64, Purpose::Algorithm);
        let context = (0..d).map(|_| rng.random::<f32>()).collect();
        let model = env.initial_model();
        FedCpClient {
            global_head: model.params[env.spec.split().head].to_vec(),
            model,
            cpn,
            context,
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut FedCpClient,
    ) -> Trained<FedCpUp> {
        let spec = env.spec;
        let split = spec.split();
        let d = spec.feature_len();
        let train = cx.data.train;
        let mut train_loss = 0.0;
        if !train.is_empty() {
            // The frozen global body is the body as received.
            let reference =
                fedweave_nn::predict(spec, &state.model.params, &state.model.buffers, &train)
                    .features;
            let (mut trainer, mut sampler) = cx.session(env, &state.model);
            let steps = env.train.steps_for(train.len());
            let sgd = env.train.sgd();
            let mut grad = vec![0.0f32; state.cpn.len()];
            let mut buf = vec![0.0f32; state.cpn.len()];
            for _ in 0..steps {
                let batch = sampler.next_batch(&mut cx.rng).to_vec();
                let noise: Vec<f32> = (0..batch.len() * 2 * d)
                    .map(|_| gumbel(&mut cx.rng))
                    .collect();
                let objective = PolicyObjective {
                    policy: self.policy(state),
                    lambda: self.params.lambda as f32,
                    reference_features: &reference,
                    noise: Some(&noise),
                };
                train_loss += trainer.loss_and_grad_aux(
                    &train,
                    &batch,
                    &[],
                    &objective,
                    &state.cpn,
                    &mut grad,
                );
                trainer.step(&[], env.train.lr);
                sgd_step(
                    &mut state.cpn,
                    &grad,
                    &mut buf,
                    sgd.momentum,
                    sgd.weight_decay,
                    env.train.lr,
                );
            }
            trainer.store(&mut state.model.params, &mut state.model.buffers);
            train_loss /= steps.max(1) as f64;
        }
        // The client's global head becomes the uploaded mix, as in PFLlib.
        state.global_head =
            upload_head(&state.model.params[split.head.clone()], &state.global_head);
        Trained {
            up: FedCpUp {
                body: state.model.params[split.base].to_vec(),
                head: state.global_head.clone(),
                cpn: state.cpn.clone(),
            },
            train_loss,
        }
    }

    fn check_upload(&self, env: &Env, up: &FedCpUp) -> Result<(), String> {
        let split = env.spec.split();
        let cpn = cpn_len(env.spec.feature_len());
        let [body, head, net] = up.vectors()[..] else {
            return Err("an upload is a body, a head and a CPN".into());
        };
        check_parts(&[
            ("body", body, split.base.len()),
            ("head", head, split.head.len()),
            ("cpn", net, cpn),
        ])
    }

    fn check_download(&self, env: &Env, down: &FedCpDown) -> Result<(), String> {
        let split = env.spec.split();
        check_parts(&[("body", &down.body, split.base.len())])?;
        match &down.global {
            Some((head, cpn)) => check_parts(&[
                ("head", head, split.head.len()),
                ("cpn", cpn, cpn_len(env.spec.feature_len())),
            ]),
            None => Ok(()),
        }
    }

    fn aggregate(
        &self,
        env: &Env,
        _: &mut (),
        _: usize,
        uploads: &[(usize, FedCpUp)],
    ) -> RoundOutcome<FedCpDown> {
        let n = env.clients();
        let participants = ids_of(uploads);
        let p = env.size_weights(&participants);
        let average = |pick: &dyn Fn(&FedCpUp) -> &[f32]| {
            let parts: Vec<&[f32]> = uploads.iter().map(|(_, u)| pick(u)).collect();
            let mut out = vec![0.0f32; parts.first().map_or(0, |v| v.len())];
            weighted_sum(&p, &parts, &mut out);
            out
        };
        let body = average(&|u| &u.body);
        let head = average(&|u| &u.head);
        let cpn = average(&|u| &u.cpn);
        let mut downloads: Vec<(usize, FedCpDown)> = (0..n)
            .map(|i| {
                (
                    i,
                    FedCpDown {
                        body: body.clone(),
                        global: None,
                    },
                )
            })
            .collect();
        for &i in &participants {
            downloads[i].1.global = Some((head.clone(), cpn.clone()));
        }
        let mut row = vec![0.0; n];
        for (w, &j) in p.iter().zip(&participants) {
            row[j] = *w;
        }
        let body_graph = CollaborationGraph::broadcast_row(&row);
        let shared = embed_rows(n, &participants, &vec![p.clone(); participants.len()]);
        let personal = CollaborationGraph::identity(n);
        let layers = vec![
            ("body".to_string(), body_graph),
            ("global_head".to_string(), shared.clone()),
            ("cpn".to_string(), shared),
            ("personal_head".to_string(), personal),
        ];
        let graphs: Vec<CollaborationGraph> = layers.iter().map(|(_, g)| g.clone()).collect();
        RoundOutcome {
            graph: CollaborationGraph::mean(&graphs),
            layers,
            downloads,
        }
    }

    fn receive(&self, env: &Env, state: &mut FedCpClient, down: FedCpDown) {
        let split = env.spec.split();
        if down.body.len() == split.base.len() {
            state.model.params[split.base].copy_from_slice(&down.body);
        }
        if let Some((head, cpn)) = down.global
            && head.len() == split.head.len()
            && cpn.len() == state.cpn.len()
        {
            state.context = context_of(&state.model.params[split.head], env.spec.feature_len());
            state.global_head = head;
            state.cpn = cpn;
        }
    }

    fn scores_personalized(&self) -> bool {
        false
    }

    fn evaluate(
        &self,
        env: &Env,
        state: &FedCpClient,
        _train: &LocalData,
        sets: &[&LocalData],
    ) -> Vec<EvalStats> {
        let policy = self.policy(state);
        sets.iter()
            .map(|on| {
                evaluate_policy(
                    env.spec,
                    &state.model.params,
                    &state.model.buffers,
                    on,
                    &policy,
                    &state.cpn,
                )
            })
            .collect()
    }

    fn eval_point(&self) -> EvalPoint {
        EvalPoint::AfterReceive
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedweave_nn::{ModelKind, ModelSpec, TrainConfig};

    fn env_parts() -> (ModelSpec, Vec<f32>, TrainConfig) {
        let spec = ModelSpec::new(ModelKind::MLP, &[3], 2).unwrap();
        let init = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        let train = TrainConfig {
            lr: 0.05,
            momentum: 0.0,
            weight_decay: 0.0,
            batch_size: 4,
            iterations: 1,
            epochs: 1,
        };
        (spec, init, train)
    }

    #[test]
    fn params_are_checked() {
        assert!(FedCpParams::default().validate().is_ok());
        let bad = FedCpParams {
            tau: 0.0,
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().key, "tau");
        let bad = FedCpParams {
            lambda: f64::NAN,
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().key, "lambda");
    }

    #[test]
    fn context_sums_the_personal_heads_weight_over_classes() {
        // d = 2, classes = 3: weight [[1, 2, 3], [−1, 0, 0.5]], bias ignored.
        let head = [1.0, 2.0, 3.0, -1.0, 0.0, 0.5, 9.0, 9.0, 9.0];
        assert_eq!(context_of(&head, 2), [6.0, -0.5]);
        assert_eq!(upload_head(&[1.0, -2.0], &[3.0, 0.0]), [2.0, -1.0]);
    }

    #[test]
    fn host_sgd_follows_pytorchs_rule() {
        let mut theta = [1.0f32, -2.0];
        let mut buf = [0.0f32; 2];
        sgd_step(&mut theta, &[0.5, 1.0], &mut buf, 0.9, 0.1, 0.1);
        // g = (0.5 + 0.1, 1 − 0.2) = (0.6, 0.8); buf = g; θ −= 0.1·buf.
        assert_eq!(buf, [0.6, 0.8]);
        assert!((theta[0] - 0.94).abs() < 1e-7 && (theta[1] + 2.08).abs() < 1e-7);
        sgd_step(&mut theta, &[0.0, 0.0], &mut buf, 0.9, 0.0, 0.1);
        // buf = 0.9·buf.
        assert!((buf[0] - 0.54).abs() < 1e-7 && (buf[1] - 0.72).abs() < 1e-7);
    }

    #[test]
    fn gumbel_draws_have_the_gumbel_mean_and_variance() {
        let mut rng = rng_stream(3, 0, 0, Purpose::Algorithm);
        let xs: Vec<f64> = (0..40_000).map(|_| f64::from(gumbel(&mut rng))).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        // Euler's γ and π²/6.
        assert!((mean - 0.577_215_66).abs() < 0.02, "{mean}");
        assert!(
            (var - std::f64::consts::PI.powi(2) / 6.0).abs() < 0.05,
            "{var}"
        );
    }

    #[test]
    fn clients_share_the_cpn_init_but_not_the_context() {
        let (spec, init, train) = env_parts();
        let sizes = [5usize, 15, 30];
        let counts = vec![vec![1, 1]; 3];
        let env = Env {
            spec: &spec,
            train: &train,
            sizes: &sizes,
            init: &init,
            relation: None,
            label_counts: &counts,
            kernels: fedweave_core::pairwise::Kernels::cpu(),
        };
        let algo = FedCp::new(
            "fedcp",
            FedCpParams::default().check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let a = algo.init_client(&env, 0);
        let b = algo.init_client(&env, 1);
        assert_eq!(a.cpn, b.cpn);
        assert_eq!(a.cpn.len(), cpn_len(200));
        assert_ne!(a.context, b.context);
        assert!(a.context.iter().all(|&v| (0.0..1.0).contains(&v)));
        assert_eq!(a.global_head, init[spec.split().head]);
        assert_eq!(algo.init_client(&env, 1).context, b.context, "seeded");
        // Forecasting data (no label counts) is refused.
        let none = Env {
            label_counts: &[],
            kernels: fedweave_core::pairwise::Kernels::cpu(),
            ..env
        };
        assert!(
            FedCp::new(
                "fedcp",
                FedCpParams::default().check(none.clients()).unwrap(),
                &none
            )
            .is_err()
        );
    }

    #[test]
    fn aggregate_averages_shared_parts_and_keeps_personal_heads() {
        let (spec, init, train) = env_parts();
        let split = spec.split();
        let sizes = [10usize, 30, 60];
        let counts = vec![vec![1, 1]; 3];
        let env = Env {
            spec: &spec,
            train: &train,
            sizes: &sizes,
            init: &init,
            relation: None,
            label_counts: &counts,
            kernels: fedweave_core::pairwise::Kernels::cpu(),
        };
        let algo = FedCp::new(
            "fedcp",
            FedCpParams::default().check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let l = cpn_len(200);
        let up = |x: f32| FedCpUp {
            body: vec![x; split.base.len()],
            head: vec![2.0 * x; split.head.len()],
            cpn: vec![-x; l],
        };
        // Clients 0 and 2 take part: p = (10, 60)/70.
        let out = algo.aggregate(&env, &mut (), 1, &[(0, up(7.0)), (2, up(14.0))]);
        let want = (10.0 * 7.0 + 60.0 * 14.0) / 70.0;
        assert_eq!(out.downloads.len(), 3);
        for (i, d) in &out.downloads {
            assert!(d.body.iter().all(|&v| (v - want).abs() < 1e-4));
            match (i, &d.global) {
                (1, None) => {}
                (0 | 2, Some((h, c))) => {
                    assert!(h.iter().all(|&v| (v - 2.0 * want).abs() < 1e-4));
                    assert!(c.iter().all(|&v| (v + want).abs() < 1e-4));
                }
                other => panic!("client {} got {:?}", other.0, other.1.is_some()),
            }
        }
        let names: Vec<&str> = out.layers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["body", "global_head", "cpn", "personal_head"]);
        let (p0, p2) = (1.0 / 7.0, 6.0 / 7.0);
        assert_eq!(out.layers[0].1.row(1), [p0, 0.0, p2]);
        assert_eq!(out.layers[1].1.row(1), [0.0, 1.0, 0.0]);
        assert_eq!(out.layers[1].1.row(0), [p0, 0.0, p2]);
        assert_eq!(out.layers[3].1.row(2), [0.0, 0.0, 1.0]);
        // The mean of the four layers for client 0: (p + p + p + e_0)/4.
        let g = out.graph.row(0);
        assert!((g[0] - (3.0 * p0 + 1.0) / 4.0).abs() < 1e-12 && (g[2] - 0.75 * p2).abs() < 1e-12);
        assert!(out.graph.max_row_sum_error() < 1e-12);

        // Receiving: the body everywhere; the global parts and a new context
        // (from the personal head, which never changes) for participants.
        let mut client = algo.init_client(&env, 0);
        let mut absent = algo.init_client(&env, 1);
        let personal = client.model.params[split.head.clone()].to_vec();
        let context_before = absent.context.clone();
        let mut downs = out.downloads.into_iter();
        algo.receive(&env, &mut client, downs.next().unwrap().1);
        algo.receive(&env, &mut absent, downs.next().unwrap().1);
        assert_eq!(client.model.params[split.head.clone()], personal[..]);
        assert!(
            client
                .global_head
                .iter()
                .all(|&v| (v - 2.0 * want).abs() < 1e-4)
        );
        assert_eq!(client.context, context_of(&personal, 200));
        assert_eq!(absent.context, context_before);
        assert_eq!(absent.global_head, init[split.head.clone()]);
        assert!(
            absent.model.params[split.base.clone()]
                .iter()
                .all(|&v| (v - want).abs() < 1e-4)
        );

        // Wrong lengths and NaN are rejected.
        let mut bad = up(1.0);
        bad.cpn.pop();
        assert!(algo.check_upload(&env, &bad).unwrap_err().contains("cpn"));
        let mut bad = up(1.0);
        bad.head[0] = f32::NAN;
        assert!(algo.check_upload(&env, &bad).unwrap_err().contains("head"));
        assert!(algo.check_upload(&env, &up(1.0)).is_ok());
    }
}
