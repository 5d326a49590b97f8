//! FedProto (Tan et al., "FedProto: Federated Prototype Learning across
//! Heterogeneous Clients", AAAI 2022): clients share class prototypes, never
//! models.
//!
//! Client: trains its own model (never shared; every client starts from the
//! common initial model) on CE + λ·‖f(x) − P_y‖² (the mean squared error over
//! the batch's feature elements, `nn.MSELoss`, through
//! [`fedweave_nn::PrototypePull`]), where P_y is the global prototype of the
//! sample's class; classes without a global prototype (round 1, or a class no
//! participant holds) get no pull. After training it uploads, for every class
//! it holds, the mean of its training samples' features under the trained
//! model in evaluation mode (its running batch-norm statistics), with the
//! class's sample count.
//!
//! Server: the global prototype of class c is the count-weighted mean
//! P_c = Σ_j n_jc·P_jc / Σ_j n_jc over the participants holding c (paper
//! Eq. 6: each local prototype weighted by |D_{j,c}| / N_c);
//! `weighting = "clients"` takes the plain mean over those clients instead,
//! as PFLlib's `proto_aggregation` and the authors' `agg_func` do. The global
//! prototypes go to every client (PFLlib's `send_protos`).
//!
//! Graph: the weights the prototypes imply. Client i's pull target for a
//! sample of class c is P_c = Σ_j ω_jc·P_jc (ω_jc = n_jc/N_c, or 1/m_c for
//! `clients`), so over i's training samples client j weighs
//! W_ij = Σ_c (n_ic/n_i)·ω_jc — the sample-averaged share of j in the
//! prototypes i is pulled to. Rows sum to 1 (every class i holds has a
//! prototype it contributed to). This weighs each of i's classes by how much
//! of i's loss it carries; "j's share of all samples in i's classes" would
//! instead weigh classes by their federation-wide size, which i's objective
//! does not. Absent clients keep their prototypes and an identity row: the
//! global prototypes go to the round's participants only.
//!
//! Bytes: up = (classes held) × feature_len floats; down = (classes with a
//! global prototype) × feature_len floats per client. Class ids and counts are
//! scalars and not counted.
//!
//! Defaults: λ = 1 (PFLlib's `-lam` default; the authors' `--ld` default).
//!
//! Deviations from the reference code, and why:
//! - Prototypes are computed after training, in evaluation mode, over every
//!   training sample. PFLlib and the authors collect training-mode features
//!   batch by batch *during* training (an average over several versions of
//!   the model); the paper's Eq. 5 defines the prototype as the mean
//!   embedding of the class under the client's model, which is what is sent.
//! - The personalised model is scored by its own output layer. PFLlib (and
//!   the authors' "w/ protos" numbers) classify by the nearest global
//!   prototype; the model's head is the paper's inference path and what every
//!   other fedweave method is scored with.

use crate::Checked;
use crate::class_mean::{Normalise, weighted_class_means};
use crate::contract::holds_model;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{
    AlgoError, Algorithm, ClientCx, Env, Info, Message, Model, ParamError, RoundOutcome, Trained,
    embed_rows, ids_of,
};
use fedweave_nn::{PrototypePull, predict};
use serde::{Deserialize, Serialize};

/// How the server averages the clients' prototypes of one class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProtoWeighting {
    /// Weighted by the clients' sample counts of the class (paper Eq. 6).
    #[default]
    Samples,
    /// Plain mean over the clients holding the class (PFLlib, authors' code).
    Clients,
}

params! {
    /// FedProto's parameters.
    pub struct FedProtoParams {
        /// λ: weight of the prototype pull.
        pub lambda: f64 = 1.0,
        /// How prototypes of a class are averaged.
        pub weighting: ProtoWeighting = ProtoWeighting::Samples,
    }
}

impl Validate for FedProtoParams {
    fn validate(&self) -> Result<(), ParamError> {
        non_negative("lambda", self.lambda)
    }
}

/// The FedProto algorithm.
pub struct FedProto {
    params: FedProtoParams,
    classes: usize,
    dim: usize,
}

impl FedProto {
    /// Prototypes of ascending class ids below the class count, one
    /// finite row of the feature width each.
    fn check_prototypes(&self, classes: &[u32], values: &[f32]) -> Result<(), String> {
        if classes.windows(2).any(|w| w[0] >= w[1])
            || classes.iter().any(|&c| c as usize >= self.classes)
        {
            return Err(format!(
                "class ids must be ascending and below {}",
                self.classes
            ));
        }
        crate::contract::check_parts(&[("prototypes", values, classes.len() * self.dim)])
    }
}

/// What a FedProto client keeps: its own model and the last global
/// prototypes it received.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ProtoClient {
    /// The local model (never shared).
    pub model: Model,
    /// Global prototypes, `classes × feature_len` (zeros where unknown).
    #[serde(with = "fedweave_core::stash::vector")]
    pub global: Vec<f32>,
    /// Whether each class has a global prototype.
    pub known: Vec<bool>,
}

/// A client's upload: its prototypes of the classes it holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LocalPrototypes {
    /// The classes held, ascending.
    pub classes: Vec<u32>,
    /// Training samples of each class.
    pub counts: Vec<u64>,
    /// One prototype per class, `classes.len() × feature_len`.
    pub values: Vec<f32>,
}

impl Message for LocalPrototypes {
    fn vectors(&self) -> Vec<&[f32]> {
        vec![&self.values]
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.values]
    }
}

/// The server's answer: the global prototypes of the classes any participant
/// holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GlobalPrototypes {
    /// Classes with a prototype, ascending.
    pub classes: Vec<u32>,
    /// `classes.len() × feature_len`.
    pub values: Vec<f32>,
}

impl Message for GlobalPrototypes {
    fn vectors(&self) -> Vec<&[f32]> {
        vec![&self.values]
    }
    fn vectors_mut(&mut self) -> Vec<&mut [f32]> {
        vec![&mut self.values]
    }
}

/// Per-class mean of `features` (`labels.len() × dim`) over the classes
/// present, ascending, with their counts.
pub fn class_means(
    features: &[f32],
    labels: &[u32],
    dim: usize,
    classes: usize,
) -> LocalPrototypes {
    let mut sums = vec![0.0f64; classes * dim];
    let mut counts = vec![0u64; classes];
    for (k, &y) in labels.iter().enumerate() {
        let c = y as usize;
        if c >= classes {
            continue;
        }
        counts[c] += 1;
        for (s, &f) in sums[c * dim..(c + 1) * dim]
            .iter_mut()
            .zip(&features[k * dim..(k + 1) * dim])
        {
            *s += f as f64;
        }
    }
    let mut out = LocalPrototypes {
        classes: Vec::new(),
        counts: Vec::new(),
        values: Vec::new(),
    };
    for c in (0..classes).filter(|&c| counts[c] > 0) {
        out.classes.push(c as u32);
        out.counts.push(counts[c]);
        let n = counts[c] as f64;
        out.values
            .extend(sums[c * dim..(c + 1) * dim].iter().map(|s| (s / n) as f32));
    }
    out
}

/// The server rule: global prototypes and each participant's graph row
/// (entries over the participants, in upload order).
pub fn aggregate_prototypes(
    uploads: &[&LocalPrototypes],
    dim: usize,
    classes: usize,
    weighting: ProtoWeighting,
) -> (GlobalPrototypes, Vec<Vec<f64>>) {
    // ω_jc before normalisation, and the normaliser per class.
    let raw = |n: u64| match weighting {
        ProtoWeighting::Samples => n as f64,
        ProtoWeighting::Clients => 1.0,
    };
    let rows: Vec<(usize, f64, &[f32])> = uploads
        .iter()
        .flat_map(|u| {
            u.classes
                .iter()
                .zip(&u.counts)
                .zip(
                    u.values
                        .chunks(dim.max(1))
                        .chain(std::iter::repeat(&[][..])),
                )
                .map(|((&c, &n), v)| (c as usize, raw(n), v))
        })
        .collect();
    let (means, total) = weighted_class_means(&rows, classes, dim, Normalise::EachTerm);
    let mut global = GlobalPrototypes {
        classes: Vec::new(),
        values: Vec::new(),
    };
    for c in (0..classes).filter(|&c| total[c] > 0.0) {
        global.classes.push(c as u32);
        global
            .values
            .extend(means[c * dim..(c + 1) * dim].iter().map(|&s| s as f32));
    }
    // W_ij = Σ_c (n_ic / n_i)·ω_jc over the classes i holds.
    let rows = uploads
        .iter()
        .map(|ui| {
            let n_i: u64 = ui.counts.iter().sum();
            uploads
                .iter()
                .map(|uj| {
                    ui.classes
                        .iter()
                        .zip(&ui.counts)
                        .map(|(c, &n_ic)| {
                            let share = uj
                                .classes
                                .iter()
                                .position(|cj| cj == c)
                                .map_or(0.0, |k| raw(uj.counts[k]) / total[*c as usize]);
                            n_ic as f64 / n_i.max(1) as f64 * share
                        })
                        .sum()
                })
                .collect()
        })
        .collect();
    (global, rows)
}

holds_model!(ProtoClient: model);

impl Algorithm for FedProto {
    const NAMES: &'static [Info] = &[Info {
        name: "fedproto",
        summary: "no model shared: clients send class prototypes (mean features), the server averages them per class (count-weighted; `weighting = \"clients\"`: plain mean); W_ij = sample-averaged share of j in the prototypes i is pulled to",
        reference: "Tan et al., AAAI 2022",
    }];
    type Params = FedProtoParams;
    type Client = ProtoClient;
    type Server = ();
    type Down = GlobalPrototypes;
    type Up = LocalPrototypes;

    fn new(
        name: &'static str,
        params: Checked<FedProtoParams>,
        env: &Env,
    ) -> Result<Self, AlgoError> {
        if env.label_counts.is_empty() {
            return Err(AlgoError::Unsupported {
                algorithm: name.to_string(),
                message: "FedProto averages class prototypes; this dataset has no classes".into(),
            });
        }
        Ok(Self {
            params: params.into_inner(),
            classes: env.spec.num_classes(),
            dim: env.spec.feature_len(),
        })
    }

    fn init_client(&self, env: &Env, _: usize) -> ProtoClient {
        ProtoClient {
            model: env.initial_model(),
            global: vec![0.0; self.classes * self.dim],
            known: vec![false; self.classes],
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut ProtoClient,
    ) -> Trained<LocalPrototypes> {
        let pull = PrototypePull {
            lambda: self.params.lambda as f32,
            prototypes: state.global.clone(),
            known: state.known.clone(),
        };
        let stats = cx.train_with(
            env,
            &mut state.model,
            env.train,
            &[],
            &[],
            None,
            Some(&pull),
        );
        let train = cx.data.train;
        let pred = predict(env.spec, &state.model.params, &state.model.buffers, &train);
        Trained {
            up: class_means(
                &pred.features,
                &train.local_labels(),
                self.dim,
                self.classes,
            ),
            train_loss: stats.mean_loss,
        }
    }

    fn aggregate(
        &self,
        env: &Env,
        _: &mut (),
        _: usize,
        uploads: &[(usize, LocalPrototypes)],
    ) -> RoundOutcome<GlobalPrototypes> {
        let participants = ids_of(uploads);
        let ups: Vec<&LocalPrototypes> = uploads.iter().map(|(_, u)| u).collect();
        let (global, rows) =
            aggregate_prototypes(&ups, self.dim, self.classes, self.params.weighting);
        // The global prototypes go to the round's participants: an absent
        // client's row (its own classes' shares) is unknown this round, so it
        // keeps its prototypes and an identity row until it next uploads.
        RoundOutcome::new(
            embed_rows(env.clients(), &participants, &rows),
            participants.iter().map(|&i| (i, global.clone())).collect(),
        )
    }

    fn receive(&self, _: &Env, state: &mut ProtoClient, down: GlobalPrototypes) {
        let d = self.dim;
        for (k, &c) in down.classes.iter().enumerate() {
            let c = c as usize;
            if c < self.classes && down.values.len() >= (k + 1) * d {
                state.global[c * d..(c + 1) * d].copy_from_slice(&down.values[k * d..(k + 1) * d]);
                state.known[c] = true;
            }
        }
    }

    fn check_upload(&self, _: &Env, up: &LocalPrototypes) -> Result<(), String> {
        let k = up.classes.len();
        if k == 0 {
            return Err("no prototypes".into());
        }
        if up.counts.len() != k || up.counts.contains(&0) {
            return Err("class counts missing or zero".into());
        }
        self.check_prototypes(&up.classes, &up.values)
    }

    fn check_download(&self, _: &Env, down: &GlobalPrototypes) -> Result<(), String> {
        self.check_prototypes(&down.classes, &down.values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_means_by_hand() {
        // dim 2; samples (1,2) c0, (3,4) c2, (5,6) c0 over 3 classes.
        let p = class_means(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[0, 2, 0], 2, 3);
        assert_eq!(p.classes, vec![0, 2]);
        assert_eq!(p.counts, vec![2, 1]);
        assert_eq!(p.values, vec![3.0, 4.0, 3.0, 4.0]);
    }

    /// Client a holds class 0 (3 samples, prototype (1, 0)) and class 1
    /// (1 sample, (0, 1)); client b holds class 1 (3 samples, (0, 5)).
    fn uploads() -> (LocalPrototypes, LocalPrototypes) {
        (
            LocalPrototypes {
                classes: vec![0, 1],
                counts: vec![3, 1],
                values: vec![1.0, 0.0, 0.0, 1.0],
            },
            LocalPrototypes {
                classes: vec![1],
                counts: vec![3],
                values: vec![0.0, 5.0],
            },
        )
    }

    #[test]
    fn count_weighted_prototypes_and_implied_graph_by_hand() {
        let (a, b) = uploads();
        let (g, rows) = aggregate_prototypes(&[&a, &b], 2, 3, ProtoWeighting::Samples);
        assert_eq!(g.classes, vec![0, 1]);
        // P_0 = (1, 0); P_1 = (1·(0, 1) + 3·(0, 5)) / 4 = (0, 4).
        assert_eq!(g.values, vec![1.0, 0.0, 0.0, 4.0]);
        // a: 3/4 of its samples in class 0 (all a's), 1/4 in class 1 (a has
        // 1/4 of it): W_aa = 3/4 + 1/16, W_ab = 3/16. b: class 1 only.
        assert!((rows[0][0] - 13.0 / 16.0).abs() < 1e-12, "{rows:?}");
        assert!((rows[0][1] - 3.0 / 16.0).abs() < 1e-12, "{rows:?}");
        assert!((rows[1][0] - 0.25).abs() < 1e-12, "{rows:?}");
        assert!((rows[1][1] - 0.75).abs() < 1e-12, "{rows:?}");
    }

    #[test]
    fn client_mean_prototypes_and_graph_by_hand() {
        let (a, b) = uploads();
        let (g, rows) = aggregate_prototypes(&[&a, &b], 2, 3, ProtoWeighting::Clients);
        // P_1 = ((0, 1) + (0, 5)) / 2 = (0, 3).
        assert_eq!(g.values, vec![1.0, 0.0, 0.0, 3.0]);
        assert!((rows[0][0] - (0.75 + 0.125)).abs() < 1e-12, "{rows:?}");
        assert!((rows[0][1] - 0.125).abs() < 1e-12, "{rows:?}");
        assert!((rows[1][0] - 0.5).abs() < 1e-12, "{rows:?}");
    }

    #[test]
    fn receive_fills_known_classes_and_uploads_are_checked() {
        use fedweave_core::{Purpose, rng_stream};
        use fedweave_nn::{ModelKind, ModelSpec, TrainConfig};
        let spec = ModelSpec::new(ModelKind::MLP, &[4], 3).unwrap();
        let init = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        let train = TrainConfig {
            lr: 0.05,
            momentum: 0.0,
            weight_decay: 0.0,
            batch_size: 8,
            iterations: 1,
            epochs: 1,
        };
        let counts = vec![vec![1, 1, 1]];
        let env = Env {
            spec: &spec,
            train: &train,
            sizes: &[3],
            init: &init,
            relation: None,
            label_counts: &counts,
            kernels: fedweave_core::pairwise::Kernels::cpu(),
        };
        let algo = FedProto::new(
            "fedproto",
            FedProtoParams::default().check(env.clients()).unwrap(),
            &env,
        )
        .unwrap();
        let mut c = algo.init_client(&env, 0);
        let mut values = vec![0.5f32; 200];
        values.extend(vec![-1.0f32; 200]);
        algo.receive(
            &env,
            &mut c,
            GlobalPrototypes {
                classes: vec![0, 2],
                values: values.clone(),
            },
        );
        assert_eq!(c.known, vec![true, false, true]);
        assert_eq!(c.global[..200], values[..200]);
        assert!(c.global[200..400].iter().all(|&v| v == 0.0));
        assert_eq!(c.global[400..], values[200..]);

        let good = LocalPrototypes {
            classes: vec![0, 2],
            counts: vec![4, 1],
            values: values.clone(),
        };
        assert!(algo.check_upload(&env, &good).is_ok());
        assert_eq!(good.bytes(), 4 * 400);
        let mut nan = good.clone();
        nan.values[7] = f32::NAN;
        assert!(algo.check_upload(&env, &nan).is_err());
        let short = LocalPrototypes {
            values: vec![0.0; 399],
            ..good.clone()
        };
        assert!(algo.check_upload(&env, &short).is_err());
        let unsorted = LocalPrototypes {
            classes: vec![2, 0],
            ..good.clone()
        };
        assert!(algo.check_upload(&env, &unsorted).is_err());
        let foreign = LocalPrototypes {
            classes: vec![0, 3],
            ..good
        };
        assert!(algo.check_upload(&env, &foreign).is_err());
    }

    #[test]
    fn bad_parameters_are_rejected() {
        let bad = FedProtoParams {
            lambda: -1.0,
            ..Default::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("algorithm.lambda")
        );
    }
}
