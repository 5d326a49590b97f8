//! FedPHP (Li, Zhan, Shao, Li, Lu: "FedPHP: Federated Personalization with
//! Inherited Private Models", ECML-PKDD 2021): FedAvg, plus a private model
//! per client inherited over rounds by a moving average and distilled into
//! each round's local training.
//!
//! Client, in each round it takes part in (the paper's Alg. 1 and the
//! authors' FedRepo `fedphp.py`):
//! 1. the local model starts from the global model;
//! 2. it trains on (1 − λ)·CE + λ·MMD²(f(x), f_hpm(x)) — the maximum mean
//!    discrepancy between its features and those of the inherited private
//!    model `hpm` (frozen; its features on every training sample are computed
//!    before training with [`fedweave_nn::predict`] and looked up per batch,
//!    [`fedweave_nn::InheritedMmd`], with the authors' multi-bandwidth
//!    Gaussian kernel);
//! 3. hpm ← μ_t·hpm + (1 − μ_t)·local (parameters and batch-norm statistics),
//!    μ_t = μ·min(t/T, 1) with t the client's number of earlier
//!    participations (0 the first time: hpm becomes the local model) and T =
//!    `mu_rounds`;
//! 4. it uploads the local model; hpm never leaves the client.
//!
//! Server: FedAvg of the local models, sent to every client. Graph: every
//! row is the data-size vector p over the participants, as FedAvg logs it:
//! every client's next local model is the global one, absent clients
//! included (their scored model, hpm, changes only when they next train).
//!
//! Scored model: hpm, after the round's local training and update.
//!
//! Defaults and their sources:
//! - `mu` = 0.9: the ceiling of the schedule in the authors' `generate_mu`
//!   (μ = 0.9·cnt/mean_sam, clipped to [0, 0.9]).
//! - `mu_rounds` T = 100: the authors' mean_sam = c_ratio·max_round
//!   (0.1·1000 in their runs) — the participations over which μ ramps up. Set
//!   it to rounds × participation to reach `mu` at the end of a run.
//! - `lambda` = 0.1: the authors' MMD runs (`reg_lamb` ∈ {0.1, 0.05}; 0.05
//!   with KD).
//!
//! Deviations from the reference code, and why:
//! - PFLlib's `clientphp.py` implements a different rule: on receipt, the
//!   scored model becomes (1 − μ_t)·global + μ_t·(itself), `model_s` is a copy
//!   of the *global* model, the scored model itself trains with the MMD to
//!   `model_s`'s features and is what is uploaded; its defaults (`mu` = 0,
//!   `lamda` = 1) leave no cross-entropy at all. fedweave follows the paper
//!   and the authors, where the inherited model is the client's own private
//!   model and the upload is a fine-tuned global model.
//! - The inherited features come from hpm in evaluation mode (its running
//!   batch-norm statistics), computed once per round; the authors run hpm in
//!   training mode on each batch. Without batch norm (MLP, CNN, GRU) the two
//!   are identical, since hpm is frozen during the round.
//! - No gradient-norm clipping (the authors clip at `max_grad_norm`); no
//!   fedweave method clips.

use crate::Checked;
use crate::contract::holds_model;
use crate::fedavg::average_to_all;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{AlgoError, Algorithm, ClientCx, Env, Info, Model, ParamError, RoundOutcome, Trained};
use fedweave_nn::{InheritedMmd, predict};
use serde::{Deserialize, Serialize};

params! {
    /// FedPHP's parameters.
    pub struct FedPhpParams {
        /// μ: the ceiling of the moving-average coefficient.
        pub mu: f64 = 0.9,
        /// T: participations over which μ_t grows linearly from 0 to μ.
        pub mu_rounds: usize = 100,
        /// λ: weight of the MMD term ((1 − λ) weighs the cross-entropy).
        pub lambda: f64 = 0.1,
    }
}

impl Validate for FedPhpParams {
    fn validate(&self) -> Result<(), ParamError> {
        for (key, v) in [("mu", self.mu), ("lambda", self.lambda)] {
            non_negative(key, v)?;
            if v > 1.0 {
                return Err(ParamError::new(key, format!("must be at most 1, got {v}")));
            }
        }
        if self.mu_rounds == 0 {
            return Err(ParamError::new("mu_rounds", "must be at least 1"));
        }
        Ok(())
    }
}

/// The FedPHP algorithm.
pub struct FedPhp {
    params: FedPhpParams,
}

/// What a FedPHP client keeps.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct PhpClient {
    /// The local model: the global model once received, then trained.
    pub model: Model,
    /// The inherited private model (what is scored).
    pub hpm: Model,
    /// Rounds this client has trained in.
    pub joined: usize,
}

impl FedPhp {
    /// μ_t for a client that has trained in `joined` earlier rounds.
    pub fn mu_at(&self, joined: usize) -> f64 {
        self.params.mu * (joined as f64 / self.params.mu_rounds as f64).min(1.0)
    }
}

/// `into ← μ·into + (1 − μ)·from`, element-wise, in f64.
pub fn moving_average(into: &mut [f32], from: &[f32], mu: f64) {
    for (a, b) in into.iter_mut().zip(from) {
        *a = (mu * *a as f64 + (1.0 - mu) * *b as f64) as f32;
    }
}

holds_model!(PhpClient: hpm);

impl Algorithm for FedPhp {
    const NAMES: &'static [Info] = &[Info {
        name: "fedphp",
        summary: "FedAvg (participants' rows of W = p); each client's private model hpm ← μ_t·hpm + (1−μ_t)·local (μ_t → 0.9) is scored; local loss (1−λ)·CE + λ·MMD²(features, hpm's), λ = 0.1",
        reference: "Li et al., ECML-PKDD 2021",
    }];
    type Params = FedPhpParams;
    type Client = PhpClient;
    type Server = ();
    /// The global model.
    type Down = Vec<f32>;
    /// The trained local model.
    type Up = Vec<f32>;

    fn new(
        name: &'static str,
        params: Checked<FedPhpParams>,
        env: &Env,
    ) -> Result<Self, AlgoError> {
        if env.label_counts.is_empty() {
            return Err(AlgoError::Unsupported {
                algorithm: name.to_string(),
                message: "FedPHP's objective is a classification loss; this dataset has no classes"
                    .into(),
            });
        }
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_client(&self, env: &Env, _: usize) -> PhpClient {
        PhpClient {
            model: env.initial_model(),
            hpm: env.initial_model(),
            joined: 0,
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut PhpClient,
    ) -> Trained<Vec<f32>> {
        let train = cx.data.train;
        let inherited = predict(env.spec, &state.hpm.params, &state.hpm.buffers, &train);
        let objective = InheritedMmd {
            lambda: self.params.lambda as f32,
            features: inherited.features,
            feature_len: inherited.feature_len,
        };
        let stats = cx.train_with(
            env,
            &mut state.model,
            env.train,
            &[],
            &[],
            None,
            Some(&objective),
        );
        let mu = self.mu_at(state.joined);
        moving_average(&mut state.hpm.params, &state.model.params, mu);
        moving_average(&mut state.hpm.buffers, &state.model.buffers, mu);
        state.joined += 1;
        Trained {
            up: state.model.params.clone(),
            train_loss: stats.mean_loss,
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

    fn receive(&self, _: &Env, state: &mut PhpClient, global: Vec<f32>) {
        state.model.params = global;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedweave_core::{Purpose, rng_stream};
    use fedweave_nn::{ModelKind, ModelSpec, TrainConfig};

    fn algo(params: FedPhpParams) -> FedPhp {
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
        let counts = vec![vec![1, 1]; 3];
        let env = Env {
            spec: &spec,
            train: &train,
            sizes: &[1, 1, 2],
            init: &init,
            relation: None,
            label_counts: &counts,
            kernels: fedweave_core::pairwise::Kernels::cpu(),
        };
        let a = FedPhp::new("fedphp", params.check(env.clients()).unwrap(), &env).unwrap();
        // The server's graph: p over participants 0 and 2, for everyone.
        let up = |v: f32| vec![v; init.len()];
        let out = a.aggregate(&env, &mut (), 1, &[(0, up(1.0)), (2, up(4.0))]);
        assert_eq!(out.graph.row(0), &[1.0 / 3.0, 0.0, 2.0 / 3.0]);
        assert_eq!(out.graph.row(1), &[1.0 / 3.0, 0.0, 2.0 / 3.0]);
        assert_eq!(out.graph.row(2), &[1.0 / 3.0, 0.0, 2.0 / 3.0]);
        assert_eq!(out.downloads.len(), 3, "the global model goes to everyone");
        assert!(out.downloads.iter().all(|(_, g)| (g[0] - 3.0).abs() < 1e-6));
        a
    }

    #[test]
    fn schedule_and_moving_average_by_hand() {
        let a = algo(FedPhpParams {
            mu_rounds: 4,
            ..Default::default()
        });
        assert_eq!(a.mu_at(0), 0.0);
        assert!((a.mu_at(1) - 0.225).abs() < 1e-12);
        assert!((a.mu_at(4) - 0.9).abs() < 1e-12);
        assert!((a.mu_at(40) - 0.9).abs() < 1e-12, "capped at mu");
        let mut hpm = vec![1.0f32, -2.0];
        moving_average(&mut hpm, &[3.0, 2.0], 0.25);
        assert_eq!(hpm, vec![2.5, 1.0]);
        // μ = 0 replaces the private model by the local one.
        moving_average(&mut hpm, &[7.0, 8.0], 0.0);
        assert_eq!(hpm, vec![7.0, 8.0]);
    }

    #[test]
    fn bad_parameters_are_rejected() {
        for (bad, key) in [
            (
                FedPhpParams {
                    mu: 1.5,
                    ..Default::default()
                },
                "algorithm.mu",
            ),
            (
                FedPhpParams {
                    lambda: -0.1,
                    ..Default::default()
                },
                "algorithm.lambda",
            ),
            (
                FedPhpParams {
                    mu_rounds: 0,
                    ..Default::default()
                },
                "algorithm.mu_rounds",
            ),
        ] {
            assert!(
                bad.validate().unwrap_err().to_string().contains(key),
                "{key}"
            );
        }
        let _ = algo(FedPhpParams::default());
    }
}
