//! FedAGHN (Song et al.): attentive graph hypernetworks.
//!
//! The server keeps, per client i and per layer group r (a module's weight
//! and bias), a self weight p_i^r ≥ 0 and a temperature q_i^r. Client i's
//! personalised initial model is built layer by layer from the latest models
//! θ_j of the round's participants:
//!
//! α_ij^r = softmax_{j≠i}(q_i^r · cos(Δ_i^r, Δ_j^r)) / (1 + p_i^r),
//! α_ii^r = p_i^r / (1 + p_i^r),  θ̄_i^r = Σ_j α_ij^r θ_j^r,
//!
//! where Δ_j = θ̄_j − θ_j is client j's last update (all-ones before its
//! first one, so the first attention is uniform). After client i trains from
//! θ̄_i to θ_new, (p, q) take one step of −η·⟨∂θ̄_i/∂(p, q), θ_new − θ̄_i⟩ with
//! the closed-form derivatives of METHODS.md §5.2, p clamped at 0. That sign
//! is the paper's and its code's (it shrinks self weights over rounds, as
//! the paper's Table 4 reports); `hn_sign = "pfedhn"` takes pFedHN's
//! opposite sign.
//!
//! Mapping onto fedweave's round (train, then aggregate): `aggregate` at
//! round t receives models trained from the θ̄_i sent at round t − 1 (from
//! the common init for a client's first participation, which has no
//! hypernetwork step). It (1) steps each participant's (p, q) with the
//! derivatives saved when its θ̄_i was built, (2) stores θ_i ← θ_new and
//! Δ_i ← θ̄_i − θ_new, and (3) builds the next θ̄_i of every participant from
//! the new Δ's and (p, q). Attention runs over the round's participants;
//! absent clients keep their model (the last θ̄_i they received, untrained:
//! a stale mix, not the server's stored θ_i) and get identity rows, and
//! their (p, q) and saved derivatives wait for their next upload (so the
//! hypernetwork step then uses the derivatives of the θ̄_i they actually
//! trained from). Every element of
//! the flat vector is trainable (batch-norm running statistics live in
//! `ClientState::buffers` and stay with the client), so all of it is mixed.
//!
//! Evaluation: the model after local training (the paper's "after"
//! accuracies, METHODS.md §5.2 step 3).

use crate::Checked;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{
    AlgoError, Algorithm, ClientCx, Env, Info, Model, ParamError, RoundOutcome, Trained, ids_of,
    models_of,
};
use fedweave_core::LayerGroup;
use fedweave_core::pairwise::{Kernels, View};
use fedweave_core::vecmath::dot;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

/// Direction of the hypernetwork step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HnSign {
    /// (p, q) ← (p, q) − η·⟨∂θ̄/∂(p, q), θ_new − θ̄⟩: the paper's Alg. 1 and
    /// its code (inherited from pFedLA).
    Fedaghn,
    /// The opposite sign, pFedHN's descent on ½‖θ̄ − θ_new‖².
    Pfedhn,
}

params! {
    /// FedAGHN's parameters.
    pub struct FedAghnParams {
        /// Initial self weight p (the paper's example script: 0.03).
        pub p_init: f64 = 0.03,
        /// Initial temperature q on the cosine similarities (script: 0.5).
        pub q_init: f64 = 0.5,
        /// Hypernetwork learning rate η_hn.
        pub hn_lr: f64 = 0.005,
        /// Sign of the hypernetwork step.
        pub hn_sign: HnSign = HnSign::Fedaghn,
    }
}

impl Validate for FedAghnParams {
    fn validate(&self) -> Result<(), ParamError> {
        non_negative("p_init", self.p_init)?;
        if !self.q_init.is_finite() {
            return Err(ParamError::new(
                "q_init",
                format!("must be finite, got {}", self.q_init),
            ));
        }
        non_negative("hn_lr", self.hn_lr)
    }
}

/// Attention weights α of recipient `me` over the participants, given its
/// cosines `cos` to each of them (`cos[me]` is ignored): a softmax of q·c
/// over the others scaled by 1/(1+p), and p/(1+p) for itself. A lone client
/// keeps its own model.
pub fn attention(cos: &[f64], me: usize, p: f64, q: f64) -> Vec<f64> {
    attention_of(softmax_others(cos, me, q), me, p)
}

/// [`attention`] from its softmax `s` ([`softmax_others`]), reused.
fn attention_of(s: Vec<f64>, me: usize, p: f64) -> Vec<f64> {
    let p = p.max(0.0);
    let mut alpha = s;
    if alpha.len() == 1 {
        return vec![1.0];
    }
    for a in alpha.iter_mut() {
        *a /= 1.0 + p;
    }
    alpha[me] = p / (1.0 + p);
    alpha
}

/// s_j = softmax over j ≠ `me` of q·c_j, with s_me = 0 (max-shifted, so a
/// large q cannot overflow).
fn softmax_others(cos: &[f64], me: usize, q: f64) -> Vec<f64> {
    let max = cos
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != me)
        .map(|(_, c)| q * c)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut s: Vec<f64> = cos
        .iter()
        .enumerate()
        .map(|(j, c)| if j == me { 0.0 } else { (q * c - max).exp() })
        .collect();
    let total: f64 = s.iter().sum();
    if total > 0.0 {
        s.iter_mut().for_each(|x| *x /= total);
    }
    s
}

/// Coefficients β with ∂θ̄/∂q = Σ_j β_j θ_j: β_j = s_j (c_j − c̄)/(1+p) for
/// j ≠ `me` with c̄ = Σ_k s_k c_k, and β_me = 0 (the self weight does not
/// depend on q).
pub fn dq_coefficients(cos: &[f64], me: usize, p: f64, q: f64) -> Vec<f64> {
    dq_of(&softmax_others(cos, me, q), cos, p)
}

/// [`dq_coefficients`] from its softmax `s` ([`softmax_others`]).
fn dq_of(s: &[f64], cos: &[f64], p: f64) -> Vec<f64> {
    let p = p.max(0.0);
    let mean: f64 = s.iter().zip(cos).map(|(s, c)| s * c).sum();
    s.iter()
        .zip(cos)
        .map(|(s, c)| s * (c - mean) / (1.0 + p))
        .collect()
}

/// ⟨∂θ̄/∂p, Δθ⟩ on one layer, with ∂θ̄/∂p = (θ_i − θ̄)/(1+p): θ_i is the
/// client's own model that went into θ̄.
pub fn dp_dot(own: &[f32], personal: &[f32], update: &[f32], p: f64) -> f64 {
    let mut acc = 0.0;
    for ((o, b), u) in own.iter().zip(personal).zip(update) {
        acc += (*o as f64 - *b as f64) * *u as f64;
    }
    acc / (1.0 + p.max(0.0))
}

/// One hypernetwork step on one layer given ⟨∂θ̄/∂p, Δθ⟩ and ⟨∂θ̄/∂q, Δθ⟩;
/// p is clamped at 0 so the self weight stays a weight.
pub fn hn_step(p: f64, q: f64, dot_p: f64, dot_q: f64, lr: f64, sign: HnSign) -> (f64, f64) {
    let s = match sign {
        HnSign::Fedaghn => 1.0,
        HnSign::Pfedhn => -1.0,
    };
    ((p - s * lr * dot_p).max(0.0), q - s * lr * dot_q)
}

/// What the server sent client i, kept for its next hypernetwork step.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Sent {
    /// θ̄_i.
    #[serde(with = "fedweave_core::stash::vector")]
    model: Vec<f32>,
    /// ∂θ̄_i/∂q, layer by layer, from the models θ̄_i was built from (they
    /// may change before i trains again, so the derivative is kept, not
    /// recomputed).
    #[serde(with = "fedweave_core::stash::vector")]
    grad_q: Vec<f32>,
}

/// The FedAGHN algorithm.
pub struct FedAghn {
    params: FedAghnParams,
}

/// The server's hypernetwork state and its memory of the clients.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct FedAghnServer {
    /// p_i^r, per client then layer.
    pub p: Vec<Vec<f64>>,
    /// q_i^r.
    pub q: Vec<Vec<f64>>,
    /// θ_j, the latest model of each client (`None`: the common init).
    #[serde(with = "fedweave_core::stash::opt_vectors")]
    models: Vec<Option<Vec<f32>>>,
    /// Δ_j = θ̄_j − θ_j (`None`: all ones, before the first update).
    #[serde(with = "fedweave_core::stash::opt_vectors")]
    deltas: Vec<Option<Vec<f32>>>,
    /// θ̄_i and its q-derivative (`None`: i has only ever had the init).
    sent: Vec<Option<Sent>>,
}

impl FedAghnServer {
    /// The state before any round: `n` clients with `layers` layer groups,
    /// every self weight `p_init` and temperature `q_init`, no models seen.
    pub fn new(n: usize, layers: usize, p_init: f64, q_init: f64) -> Self {
        let mut server = Self::default();
        server.add_clients(n, layers, p_init, q_init);
        server
    }

    /// Appends `more` clients in their initial state (the Flower strategy
    /// meets its clients as they join).
    pub fn add_clients(&mut self, more: usize, layers: usize, p_init: f64, q_init: f64) {
        self.p
            .extend(std::iter::repeat_n(vec![p_init; layers], more));
        self.q
            .extend(std::iter::repeat_n(vec![q_init; layers], more));
        self.models.extend(std::iter::repeat_n(None, more));
        self.deltas.extend(std::iter::repeat_n(None, more));
        self.sent.extend(std::iter::repeat_n(None, more));
    }

    /// Number of clients the state holds.
    pub fn clients(&self) -> usize {
        self.p.len()
    }

    /// Current (p, q) of client `i` on every layer.
    pub fn self_weights(&self, i: usize) -> (&[f64], &[f64]) {
        match (self.p.get(i), self.q.get(i)) {
            (Some(p), Some(q)) => (p, q),
            _ => (&[], &[]),
        }
    }
}

/// cos(Δ_a, Δ_b) on each group's range for every pair of participants
/// (`[group][a][b]`), `None` meaning the all-ones vector: one blocked Gram
/// matrix per layer ([`Kernels::cosine_matrix_sym`]).
/// What one participant's upload leaves on the server: its new (p, q) per
/// layer (none in its first round), Δ_i and θ_i.
struct Stored {
    pq: Option<Vec<(f64, f64)>>,
    delta: Vec<f32>,
    model: Vec<f32>,
}

fn layer_cosines(
    kernels: &Kernels,
    deltas: &[Option<&[f32]>],
    groups: &[LayerGroup],
    d: usize,
) -> Vec<Vec<Vec<f64>>> {
    let ones = if deltas.iter().any(Option::is_none) {
        vec![1.0f32; d]
    } else {
        Vec::new()
    };
    let rows: Vec<&[f32]> = deltas.iter().map(|x| x.unwrap_or(&ones)).collect();
    groups
        .iter()
        .map(|g| {
            kernels
                .cosine_matrix_sym(&rows, &View::ranges(std::slice::from_ref(&g.range)))
                .into_rows()
        })
        .collect()
}

/// FedAGHN's server step, the one implementation behind
/// [`Algorithm::aggregate`] and the Python binding (`fedweave.servers`,
/// the Flower strategy): for the `uploads` of the round's participants
/// (indices among `n` clients, ascending), the hypernetwork step of each
/// participant, then the attention per layer `groups` and every
/// participant's θ̄_i; `init` is the clients' common round-0 model.
pub fn server_step(
    params: &FedAghnParams,
    kernels: &Kernels,
    server: &mut FedAghnServer,
    init: &[f32],
    groups: &[LayerGroup],
    n: usize,
    uploads: &[(usize, Vec<f32>)],
) -> RoundOutcome<Vec<f32>> {
    let participants = &ids_of(uploads)[..];
    let models = models_of(uploads);
    let d = init.len();

    // (1) Hypernetwork step, then (2) store θ_i and Δ_i. Each
    // participant's step reads only its own state: computed in parallel,
    // stored in participant order.
    let steps: Vec<Stored> = participants
        .par_iter()
        .zip(&models)
        .map(|(&i, &new)| {
            let sent = server.sent[i].as_ref();
            let personal: &[f32] = sent.map_or(init, |s| &s.model);
            let mut update: Vec<f32> = new.iter().zip(personal).map(|(a, b)| a - b).collect();
            let pq = sent.map(|s| {
                let own = server.models[i].as_deref().unwrap_or(init);
                groups
                    .iter()
                    .enumerate()
                    .map(|(r, g)| {
                        let rg = g.range.clone();
                        let dot_q = dot(&s.grad_q[rg.clone()], &update[rg.clone()]);
                        let dot_p = dp_dot(
                            &own[rg.clone()],
                            &s.model[rg.clone()],
                            &update[rg],
                            server.p[i][r],
                        );
                        hn_step(
                            server.p[i][r],
                            server.q[i][r],
                            dot_p,
                            dot_q,
                            params.hn_lr,
                            params.hn_sign,
                        )
                    })
                    .collect()
            });
            // Δ_i = −update, negated in place (exact).
            update.iter_mut().for_each(|u| *u = -*u);
            Stored {
                pq,
                delta: update,
                model: new.to_vec(),
            }
        })
        .collect();
    for (&i, Stored { pq, delta, model }) in participants.iter().zip(steps) {
        server.sent[i] = None;
        if let Some(pq) = pq {
            for (r, (p, q)) in pq.into_iter().enumerate() {
                (server.p[i][r], server.q[i][r]) = (p, q);
            }
        }
        server.deltas[i] = Some(delta);
        server.models[i] = Some(model);
    }

    // (3) New attention and θ̄_i for every participant, layer by layer.
    let deltas: Vec<Option<&[f32]>> = participants
        .iter()
        .map(|&i| server.deltas[i].as_deref())
        .collect();
    let m = participants.len();
    let cos = layer_cosines(kernels, &deltas, groups, d);
    let (p, q) = (&server.p, &server.q);
    // Attention α and its q-derivative's coefficients β, per layer and
    // participant, then θ̄ = α·Θ and ∂θ̄/∂q = β·Θ layer by layer as
    // blocked products.
    let mut layer_rows: Vec<Vec<Vec<f64>>> = Vec::with_capacity(groups.len());
    let mut layer_betas: Vec<Vec<Vec<f64>>> = Vec::with_capacity(groups.len());
    for r in 0..groups.len() {
        // One softmax per participant serves α and β; participants in
        // parallel (m² exponentials per layer), collected in order.
        let (alpha, beta): (Vec<Vec<f64>>, Vec<Vec<f64>>) = participants
            .par_iter()
            .enumerate()
            .map(|(k, &i)| {
                let c = &cos[r][k];
                let s = softmax_others(c, k, q[i][r]);
                let beta = dq_of(&s, c, p[i][r]);
                (attention_of(s, k, p[i][r]), beta)
            })
            .unzip();
        layer_rows.push(alpha);
        layer_betas.push(beta);
    }
    // One product per layer for both: each block of Θ is read and converted
    // once; the rows θ̄ then ∂θ̄/∂q come out of one allocation.
    let weights: Vec<Vec<&[f64]>> = layer_rows
        .iter()
        .zip(&layer_betas)
        .map(|(alpha, beta)| alpha.iter().chain(beta).map(Vec::as_slice).collect())
        .collect();
    let layers: Vec<(std::ops::Range<usize>, &[&[f64]])> = groups
        .iter()
        .zip(&weights)
        .map(|(g, w)| (g.range.clone(), w.as_slice()))
        .collect();
    let mut models_bar = kernels.mix_layers(&layers, &models);
    let grads_q = models_bar.split_off(m);

    let downloads: Vec<(usize, Vec<f32>)> = participants
        .par_iter()
        .zip(&models_bar)
        .map(|(&i, model)| (i, model.clone()))
        .collect();
    for ((&i, model), grad_q) in participants.iter().zip(models_bar).zip(grads_q) {
        server.sent[i] = Some(Sent { model, grad_q });
    }
    crate::layered_outcome(
        n,
        participants,
        participants,
        groups,
        &layer_rows,
        downloads,
    )
}

/// Its messages are models: it takes a personal part ([`crate::personal`]).
impl crate::personal::Splittable for FedAghn {}

impl Algorithm for FedAghn {
    const NAMES: &'static [Info] = &[Info {
        name: "fedaghn",
        summary: "per layer: W_ii = p/(1+p), W_ij = softmax_{j≠i}(q·cos(Δ_i, Δ_j))/(1+p); p, q learned by a hypernetwork step (p_init 0.03, q_init 0.5, hn_lr 0.005); option hn_sign = \"pfedhn\"",
        reference: "Song et al., FedAGHN",
    }];
    type Params = FedAghnParams;
    type Client = Model;
    type Server = FedAghnServer;
    /// θ̄_i.
    type Down = Vec<f32>;
    type Up = Vec<f32>;

    fn new(_: &'static str, params: Checked<FedAghnParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_server(&self, env: &Env) -> FedAghnServer {
        FedAghnServer::new(
            env.clients(),
            crate::layer_groups(env).len(),
            self.params.p_init,
            self.params.q_init,
        )
    }

    fn init_client(&self, env: &Env, _: usize) -> Model {
        env.initial_model()
    }

    fn local_round(&self, env: &Env, cx: &mut ClientCx, model: &mut Model) -> Trained<Vec<f32>> {
        // The client starts from θ̄_i, the init before it has received one.
        let train_loss = cx.train_plain(env, model, &[]);
        Trained {
            up: model.params.clone(),
            train_loss,
        }
    }

    fn receive(&self, _: &Env, model: &mut Model, personal: Vec<f32>) {
        model.params = personal;
    }

    fn aggregate(
        &self,
        env: &Env,
        server: &mut FedAghnServer,
        _: usize,
        uploads: &[(usize, Vec<f32>)],
    ) -> RoundOutcome<Vec<f32>> {
        let groups = crate::layer_groups(env);
        server_step(
            &self.params,
            env.kernels,
            server,
            env.init,
            &groups,
            env.clients(),
            uploads,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedweave_core::vecmath::weighted_sum;
    use fedweave_core::{Purpose, rng_stream};
    use fedweave_nn::{ModelKind, ModelSpec, TrainConfig};

    /// θ̄(p, q) = Σ_j α_j(p, q) θ_j in f64, the function the closed-form
    /// derivatives differentiate.
    fn personal(models: &[Vec<f32>], cos: &[f64], me: usize, p: f64, q: f64) -> Vec<f64> {
        let alpha = attention(cos, me, p, q);
        (0..models[0].len())
            .map(|e| alpha.iter().zip(models).map(|(a, m)| a * m[e] as f64).sum())
            .collect()
    }

    fn toy_models() -> Vec<Vec<f32>> {
        vec![
            vec![0.3, -1.2, 2.0, 0.7],
            vec![1.1, 0.4, -0.5, 0.2],
            vec![-0.8, 0.9, 0.1, 1.5],
            vec![0.0, 2.2, -1.3, -0.4],
        ]
    }

    #[test]
    fn first_round_attention_is_self_weight_and_uniform_rest() {
        let n = 20;
        let ones = vec![1.0; n];
        for me in [0, 7, 19] {
            let a = attention(&ones, me, 0.03, 0.5);
            let diag = 0.03 / 1.03;
            assert!((a[me] - diag).abs() < 1e-12);
            assert!((a[me] - 0.029126).abs() < 1e-6);
            for (j, w) in a.iter().enumerate().filter(|(j, _)| *j != me) {
                assert!((w - (1.0 - diag) / (n - 1) as f64).abs() < 1e-12, "{j}");
            }
            assert!((a.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        }
        assert_eq!(attention(&[1.0], 0, 0.03, 0.5), vec![1.0]);
    }

    #[test]
    fn closed_form_derivatives_match_finite_differences() {
        let models = toy_models();
        let cos = [0.2, 0.9, -0.4, 0.5];
        let (me, p, q) = (1, 0.07, 1.3);
        let h = 1e-6;
        let refs: Vec<&[f32]> = models.iter().map(|m| m.as_slice()).collect();
        // ∂θ̄/∂q.
        let mut dq = vec![0.0f32; 4];
        weighted_sum(&dq_coefficients(&cos, me, p, q), &refs, &mut dq);
        let (hi, lo) = (
            personal(&models, &cos, me, p, q + h),
            personal(&models, &cos, me, p, q - h),
        );
        for e in 0..4 {
            let fd = (hi[e] - lo[e]) / (2.0 * h);
            assert!(
                (fd - dq[e] as f64).abs() < 1e-5,
                "q, {e}: {fd} vs {}",
                dq[e]
            );
        }
        // ∂θ̄/∂p = (θ_i − θ̄)/(1+p), checked through dp_dot on unit updates.
        let bar = personal(&models, &cos, me, p, q);
        let bar32: Vec<f32> = bar.iter().map(|x| *x as f32).collect();
        let (hi, lo) = (
            personal(&models, &cos, me, p + h, q),
            personal(&models, &cos, me, p - h, q),
        );
        for e in 0..4 {
            let fd = (hi[e] - lo[e]) / (2.0 * h);
            let closed = (models[me][e] as f64 - bar[e]) / (1.0 + p);
            assert!((fd - closed).abs() < 1e-6, "p, {e}: {fd} vs {closed}");
            let mut unit = vec![0.0f32; 4];
            unit[e] = 1.0;
            let via = dp_dot(&models[me], &bar32, &unit, p);
            assert!((fd - via).abs() < 1e-5, "dp_dot, {e}: {fd} vs {via}");
        }
    }

    #[test]
    fn p_never_goes_negative_and_signs_are_opposite() {
        let (p, q) = hn_step(0.03, 0.5, 1e6, 2.0, 0.005, HnSign::Fedaghn);
        assert_eq!(p, 0.0);
        assert!((q - 0.49).abs() < 1e-12);
        let (p, q) = hn_step(0.03, 0.5, -1e6, 2.0, 0.005, HnSign::Pfedhn);
        assert_eq!(p, 0.0);
        assert!((q - 0.51).abs() < 1e-12);
        let (p, _) = hn_step(0.03, 0.5, 2.0, 0.0, 0.005, HnSign::Pfedhn);
        assert!((p - 0.04).abs() < 1e-12);
        // A negative p is read as 0 by the attention.
        assert_eq!(attention(&[1.0, 1.0], 0, -5.0, 0.5), vec![0.0, 1.0]);
    }

    /// Drives `aggregate` on a small MLP with trained-looking random uploads:
    /// rows are stochastic, round-1 self weights are p/(1+p), absent clients
    /// get identity rows and no download, and (p, q) stay sane with a huge
    /// hypernetwork learning rate.
    #[test]
    fn aggregate_rounds_keep_weights_valid() {
        let spec = ModelSpec::new(ModelKind::MLP, &[4], 2).unwrap();
        let init = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        let train = TrainConfig {
            lr: 0.05,
            momentum: 0.0,
            weight_decay: 0.0,
            batch_size: 8,
            iterations: 1,
            epochs: 1,
        };
        let sizes = [10usize; 5];
        let env = Env {
            spec: &spec,
            train: &train,
            sizes: &sizes,
            init: &init,
            relation: None,
            label_counts: &[],
            kernels: fedweave_core::pairwise::Kernels::cpu(),
        };
        let params = FedAghnParams {
            hn_lr: 50.0,
            ..Default::default()
        };
        let algo = FedAghn::new("fedaghn", params.check(env.clients()).unwrap(), &env).unwrap();
        let mut server = algo.init_server(&env);
        let mut held: Vec<Vec<f32>> = vec![init.clone(); 5];
        let mut rng = rng_stream(2, 0, 0, Purpose::Batches);
        for round in 1..=4 {
            let participants: Vec<usize> = if round == 3 {
                vec![0, 2, 4]
            } else {
                (0..5).collect()
            };
            let uploads: Vec<(usize, Vec<f32>)> = participants
                .iter()
                .map(|&i| {
                    let shift = (i % 2) as f32 * 0.2 - 0.1;
                    let model = held[i]
                        .iter()
                        .map(|x| x + shift + 0.01 * rand::Rng::random::<f32>(&mut rng))
                        .collect();
                    (i, model)
                })
                .collect();
            let agg = algo.aggregate(&env, &mut server, round, &uploads);
            assert_eq!(agg.layers.len(), 3);
            assert!(agg.graph.max_row_sum_error() < 1e-9);
            for (name, g) in &agg.layers {
                assert!(g.max_row_sum_error() < 1e-9, "{name}");
                if round == 1 {
                    for &i in &participants {
                        assert!((g.get(i, i) - 0.03 / 1.03).abs() < 1e-12);
                    }
                    // Clients 1 and 3 moved alike, so they attend to each
                    // other more than to the clients that moved the other way.
                    assert!(g.get(1, 3) > g.get(1, 0), "{name}: {:?}", g.row(1));
                }
            }
            for (i, model) in held.iter_mut().enumerate() {
                let present = participants.contains(&i);
                let dl = agg.downloads.iter().find(|(j, _)| *j == i);
                assert_eq!(dl.is_some(), present);
                if !present {
                    assert_eq!(agg.graph.get(i, i), 1.0);
                }
                if let Some((_, m)) = dl {
                    assert!(m.iter().all(|x| x.is_finite()));
                    *model = m.clone();
                }
                let (p, q) = server.self_weights(i);
                assert!(p.iter().all(|p| *p >= 0.0 && p.is_finite()), "{p:?}");
                assert!(q.iter().all(|q| q.is_finite()), "{q:?}");
            }
        }
    }

    #[test]
    fn bad_parameters_are_rejected() {
        let bad = FedAghnParams {
            p_init: -0.1,
            ..Default::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("algorithm.p_init")
        );
        let bad = FedAghnParams {
            hn_lr: f64::NAN,
            ..Default::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("algorithm.hn_lr")
        );
    }
}
