//! FedAvg, FedAvg-FT, FedProx and FedProx-FT: one global model.
//!
//! Graph rule: every row of W is the data-size vector p over the round's
//! participants. Local objective: cross-entropy from the global model, plus
//! μ/2‖θ − θ_g‖² for FedProx. The `-ft` variants evaluate the model each
//! client holds after a round of local training from the global model, i.e.
//! the global model fine-tuned on local data (the baseline of pFedGraph and
//! DPFL); the plain variants evaluate the global model itself.

use crate::params::Validate;
use crate::{
    Aggregation, Algorithm, ClientData, ClientState, Download, Env, EvalPoint, Upload, models_of,
    train_plain,
};
use fedweave_core::vecmath::weighted_sum;
use fedweave_core::{CollaborationGraph, RngStream};
use fedweave_nn::Proximal;
use serde::{Deserialize, Serialize};

/// Parameters of the FedAvg family.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FedAvgParams {
    /// Proximal coefficient μ (FedProx only; pFedGraph's and FedAGHN's 0.01).
    pub mu: f64,
}

impl Default for FedAvgParams {
    fn default() -> Self {
        Self { mu: 0.01 }
    }
}

impl Validate for FedAvgParams {
    fn validate(&self) -> Result<(), String> {
        if !(self.mu >= 0.0 && self.mu.is_finite()) {
            return Err(format!(
                "algorithm.mu must be a finite number ≥ 0, got {}",
                self.mu
            ));
        }
        Ok(())
    }
}

/// The FedAvg family.
pub struct FedAvg {
    name: &'static str,
    mu: f32,
    fine_tuned: bool,
}

impl FedAvg {
    /// `name` is one of fedavg, fedavg-ft, fedprox, fedprox-ft.
    pub fn new(name: &str, p: FedAvgParams) -> Self {
        let (name, prox, fine_tuned) = match name {
            "fedavg-ft" => ("fedavg-ft", false, true),
            "fedprox" => ("fedprox", true, false),
            "fedprox-ft" => ("fedprox-ft", true, true),
            _ => ("fedavg", false, false),
        };
        Self {
            name,
            mu: if prox { p.mu as f32 } else { 0.0 },
            fine_tuned,
        }
    }
}

impl Algorithm for FedAvg {
    fn name(&self) -> &'static str {
        self.name
    }

    fn local_round(
        &self,
        env: &Env,
        _: usize,
        _: usize,
        data: &ClientData,
        state: &mut ClientState,
        rng: &mut RngStream,
    ) -> Upload {
        let train_loss = if self.mu > 0.0 {
            let global = state.model.clone();
            let prox = Proximal {
                mu: self.mu,
                anchor: &global,
            };
            train_plain(env, data, state, &[&prox], rng)
        } else {
            train_plain(env, data, state, &[], rng)
        };
        Upload::model(state.model.clone(), train_loss)
    }

    fn aggregate(
        &mut self,
        env: &Env,
        _: usize,
        participants: &[usize],
        uploads: &[&Upload],
    ) -> Aggregation {
        let uploads = &models_of(uploads)[..];
        let p = env.size_weights(participants);
        let mut global = vec![0.0f32; uploads.first().map_or(0, |u| u.len())];
        weighted_sum(&p, uploads, &mut global);
        // The global model goes to every client, absent ones included, so
        // every row of W is p over this round's participants.
        let mut row = vec![0.0; env.clients()];
        for (w, &j) in p.iter().zip(participants) {
            row[j] = *w;
        }
        let download = Download {
            model: global,
            aux: None,
        };
        Aggregation::new(
            CollaborationGraph::broadcast_row(&row),
            vec![Some(download); env.clients()],
        )
    }

    fn eval_point(&self) -> EvalPoint {
        if self.fine_tuned {
            EvalPoint::AfterTraining
        } else {
            EvalPoint::AfterMixing
        }
    }
}
