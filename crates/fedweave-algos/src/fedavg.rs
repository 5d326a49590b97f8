//! FedAvg, FedAvg-FT, FedProx and FedProx-FT: one global model.
//!
//! Graph rule: every row of W is the data-size vector p over the round's
//! participants. Local objective: cross-entropy from the global model, plus
//! μ/2‖θ − θ_g‖² for FedProx. The `-ft` variants evaluate the model each
//! client holds after a round of local training from the global model, i.e.
//! the global model fine-tuned on local data (the baseline of pFedGraph and
//! DPFL); the plain variants evaluate the global model itself.

use crate::Checked;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{
    AlgoError, Algorithm, ClientCx, Env, EvalPoint, Info, Model, ParamError, RoundOutcome, Trained,
    ids_of, models_of,
};
use fedweave_core::CollaborationGraph;
use fedweave_core::vecmath::weighted_sum;
use fedweave_nn::Proximal;

params! {
    /// Parameters of the FedAvg family.
    pub struct FedAvgParams {
        /// Proximal coefficient μ (FedProx only; pFedGraph's and FedAGHN's 0.01).
        pub mu: f64 = 0.01,
    }
}

impl Validate for FedAvgParams {
    fn validate(&self) -> Result<(), ParamError> {
        non_negative("mu", self.mu)
    }

    /// `mu` only for FedProx and FedProx-FT.
    fn applies(name: &str, key: &str) -> bool {
        key != "mu" || proximal(name)
    }
}

/// Whether the family member `name` adds the proximal term.
fn proximal(name: &str) -> bool {
    name.starts_with("fedprox")
}

/// The FedAvg family.
pub struct FedAvg {
    name: &'static str,
    mu: f32,
    fine_tuned: bool,
}

/// Its messages are models: it takes a personal part ([`crate::personal`]).
impl crate::personal::Splittable for FedAvg {}

impl Algorithm for FedAvg {
    const NAMES: &'static [Info] = &[
        Info {
            name: "fedavg",
            summary: "one global model; every row of W = data-size weights p; evaluates the global model",
            reference: "McMahan et al., AISTATS 2017",
        },
        Info {
            name: "fedavg-ft",
            summary: "FedAvg, evaluated after each client fine-tunes the global model for a round of local training",
            reference: "pFedGraph/DPFL baseline",
        },
        Info {
            name: "fedprox",
            summary: "FedAvg with the proximal term μ/2‖θ−θ_g‖² (mu = 0.01)",
            reference: "Li et al., MLSys 2020",
        },
        Info {
            name: "fedprox-ft",
            summary: "FedProx, evaluated after local fine-tuning",
            reference: "pFedGraph baseline",
        },
    ];
    type Params = FedAvgParams;
    /// The global model (after receiving it) or its fine-tuned copy.
    type Client = Model;
    type Server = ();
    /// The global model.
    type Down = Vec<f32>;
    /// The trained model.
    type Up = Vec<f32>;

    fn new(name: &'static str, p: Checked<FedAvgParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            name,
            mu: if proximal(name) { p.mu as f32 } else { 0.0 },
            fine_tuned: name.ends_with("-ft"),
        })
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn init_client(&self, env: &Env, _: usize) -> Model {
        env.initial_model()
    }

    fn local_round(&self, env: &Env, cx: &mut ClientCx, model: &mut Model) -> Trained<Vec<f32>> {
        let train_loss = if self.mu > 0.0 {
            let global = model.params.clone();
            let prox = Proximal {
                mu: self.mu,
                anchor: &global,
            };
            cx.train_plain(env, model, &[&prox])
        } else {
            cx.train_plain(env, model, &[])
        };
        Trained {
            up: model.params.clone(),
            train_loss,
        }
    }

    fn aggregate(
        &self,
        env: &Env,
        _: &mut (),
        _: usize,
        uploads: &[(usize, Vec<f32>)],
    ) -> RoundOutcome<Vec<f32>> {
        average_to_all(env, uploads)
    }

    fn receive(&self, _: &Env, model: &mut Model, global: Vec<f32>) {
        model.params = global;
    }

    fn eval_point(&self) -> EvalPoint {
        if self.fine_tuned {
            EvalPoint::AfterTraining
        } else {
            EvalPoint::AfterReceive
        }
    }

    fn scores_before_training(&self) -> bool {
        !self.fine_tuned
    }
}

/// FedAvg's server rule, shared by the methods that keep a FedAvg global
/// model (Ditto, APFL, FedALA): the data-size weighted mean of the uploaded
/// models goes to every client, absent ones included, so every row of W is
/// p over the round's participants.
pub(crate) fn average_to_all(env: &Env, uploads: &[(usize, Vec<f32>)]) -> RoundOutcome<Vec<f32>> {
    let participants = ids_of(uploads);
    let models = models_of(uploads);
    let p = env.size_weights(&participants);
    let mut global = vec![0.0f32; env.init.len()];
    weighted_sum(&p, &models, &mut global);
    let mut row = vec![0.0; env.clients()];
    for (w, &j) in p.iter().zip(&participants) {
        row[j] = *w;
    }
    RoundOutcome::new(
        CollaborationGraph::broadcast_row(&row),
        (0..env.clients()).map(|i| (i, global.clone())).collect(),
    )
}
