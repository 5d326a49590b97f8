//! FedALA (Zhang et al., AAAI 2023, "FedALA: Adaptive Local Aggregation for
//! Personalized Federated Learning"), as PFLlib's `utils/ALA.py` runs it.
//!
//! Before local training, client i initialises its model from the global
//! model θ_g and its own previous model θ by adaptive local aggregation:
//! - the lower layers (all parameter tensors but the top `layer_idx`) take
//!   the global model's values;
//! - the top `layer_idx` tensors (default 2: the classifier's weight and
//!   bias) become θ̂ = θ + (θ_g − θ)⊙W, with W element-wise in [0, 1]
//!   (all ones at first, kept by the client across rounds);
//! - W is learned on a random contiguous slice of `rand_percent` = 80 % of
//!   the client's training samples, walked in order in batches of the
//!   `[train]` batch size: per batch, W ← clip(W − η·∇_θ̂L ⊙ (θ_g − θ), 0, 1)
//!   with η = `eta` = 1, then θ̂ is recomputed. The gradient is that of the
//!   plain task loss; batch-norm statistics of these passes are discarded.
//! - The first time ALA runs, it repeats passes over the slice until the
//!   population standard deviation of the last `num_pre_loss` = 10 pass
//!   losses (each the loss of a pass's last batch, as in ALA.py) is below
//!   `threshold` = 0.1, after more than `num_pre_loss` passes; ALA.py has no
//!   bound, fedweave stops after `max_start_epochs` = 100 passes. Later
//!   rounds make one pass.
//! - ALA is skipped while there is no global model yet or it equals the
//!   client's model (ALA.py's first-round check), and the learned W is left
//!   as it is when the slice would be empty.
//!
//! The client then trains the aggregated model on plain cross-entropy and
//! uploads it. Graph rule: FedAvg's (every row of W = p); the average goes
//! to every client, which keeps it for its next round's ALA. Evaluation: the
//! locally trained model (PFLlib scores the model right after ALA, before
//! training).

use crate::Checked;
use crate::contract::holds_model;
use crate::fedavg::average_to_all;
use crate::params::params;
use crate::params::{Validate, non_negative};
use crate::{AlgoError, Algorithm, ClientCx, Env, Info, Model, ParamError, RoundOutcome, Trained};
use fedweave_core::vecmath::std_dev;
use fedweave_nn::LocalTrainer;
use rand::Rng;
use serde::{Deserialize, Serialize};

params! {
    /// FedALA's parameters.
    pub struct FedAlaParams {
        /// Number of parameter tensors, counted from the top of the model, that
        /// are aggregated adaptively (PFLlib's `layer_idx`).
        pub layer_idx: usize = 2,
        /// Percentage of the local training samples W is learned on.
        pub rand_percent: usize = 80,
        /// η, the step size of W.
        pub eta: f64 = 1.0,
        /// First ALA: stop when the std of the last `num_pre_loss` pass losses
        /// falls below this.
        pub threshold: f64 = 0.1,
        /// First ALA: how many recent pass losses the stopping rule looks at.
        pub num_pre_loss: usize = 10,
        /// First ALA: at most this many passes (ALA.py loops without a bound).
        pub max_start_epochs: usize = 100,
    }
}

impl Validate for FedAlaParams {
    fn validate(&self) -> Result<(), ParamError> {
        if self.layer_idx == 0 {
            return Err(ParamError::new("layer_idx", "must be ≥ 1"));
        }
        if !(1..=100).contains(&self.rand_percent) {
            return Err(ParamError::new(
                "rand_percent",
                format!("must be in 1..=100, got {}", self.rand_percent),
            ));
        }
        non_negative("eta", self.eta)?;
        non_negative("threshold", self.threshold)?;
        if self.num_pre_loss == 0 {
            return Err(ParamError::new("num_pre_loss", "must be ≥ 1"));
        }
        if self.max_start_epochs == 0 {
            return Err(ParamError::new("max_start_epochs", "must be ≥ 1"));
        }
        Ok(())
    }
}

/// FedALA.
pub struct FedAla {
    params: FedAlaParams,
}

/// A FedALA client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FedAlaClient {
    /// Its model: aggregated by ALA, then trained (what is scored).
    pub model: Model,
    /// The last global model received (`None` before the first).
    #[serde(with = "fedweave_core::stash::opt_vector")]
    pub global: Option<Vec<f32>>,
    /// W over the top tensors (empty until ALA first runs).
    #[serde(with = "fedweave_core::stash::vector")]
    pub weights: Vec<f32>,
    /// Whether ALA has not run yet (its first run trains W to convergence).
    pub start_phase: bool,
}

/// W ← clip(W − η·g ⊙ (θ_g − θ), 0, 1), element-wise: one ALA step, with g
/// the loss gradient at θ̂ and `diff` = θ_g − θ on the top tensors.
pub fn weight_step(weights: &mut [f32], grad: &[f32], diff: &[f32], eta: f32) {
    for ((w, g), d) in weights.iter_mut().zip(grad).zip(diff) {
        *w = (*w - eta * (g * d)).clamp(0.0, 1.0);
    }
}

/// θ̂ = θ + (θ_g − θ) ⊙ W on the top tensors.
fn aggregate_top(theta: &[f32], diff: &[f32], weights: &[f32], out: &mut [f32]) {
    for (((o, t), d), w) in out.iter_mut().zip(theta).zip(diff).zip(weights) {
        *o = t + d * w;
    }
}

impl FedAla {
    /// Adaptive local aggregation of `state.model` with `state.global`;
    /// `cx` supplies the training data and the slice's random start.
    /// Returns the passes over the slice made to learn W (`None` when ALA
    /// was skipped).
    fn local_aggregation(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut FedAlaClient,
    ) -> Option<usize> {
        let global = state.global.as_deref()?;
        let model = &mut state.model;
        if global == model.params.as_slice() {
            return None;
        }
        let tensors = env.spec.layout().tensors();
        let k = self.params.layer_idx.min(tensors.len());
        let top = tensors[tensors.len() - k].offset;
        // The lower layers take the global model.
        model.params[..top].copy_from_slice(&global[..top]);
        let theta = model.params[top..].to_vec();
        let diff: Vec<f32> = global[top..]
            .iter()
            .zip(&theta)
            .map(|(g, t)| g - t)
            .collect();
        if state.weights.len() != theta.len() {
            state.weights = vec![1.0; theta.len()];
        }
        let weights = &mut state.weights;
        let n = cx.data.train.len();
        let take = n * self.params.rand_percent / 100;
        let mut passes = 0;
        if take > 0 {
            let start = cx.rng.random_range(0..=n - take);
            let positions: Vec<usize> = (start..start + take).collect();
            let mut hat = model.params.clone();
            aggregate_top(&theta, &diff, weights, &mut hat[top..]);
            let mut trainer = LocalTrainer::new(
                env.spec,
                env.spec.device(),
                &hat,
                &model.buffers,
                env.train.sgd(),
                None,
            );
            let mut grad = vec![0.0f32; hat.len()];
            let eta = self.params.eta as f32;
            let mut losses = Vec::new();
            loop {
                let mut last = 0.0;
                for batch in positions.chunks(env.train.batch_size.max(1)) {
                    last = trainer.loss_and_grad(&cx.data.train, batch, &[]);
                    trainer.read_grad(&mut grad);
                    weight_step(weights, &grad[top..], &diff, eta);
                    aggregate_top(&theta, &diff, weights, &mut hat[top..]);
                    trainer.load_params(&hat);
                }
                losses.push(last);
                if !state.start_phase
                    || losses.len() >= self.params.max_start_epochs
                    || (losses.len() > self.params.num_pre_loss
                        && std_dev(&losses[losses.len() - self.params.num_pre_loss..])
                            < self.params.threshold)
                {
                    break;
                }
            }
            passes = losses.len();
            state.start_phase = false;
        }
        aggregate_top(&theta, &diff, weights, &mut model.params[top..]);
        Some(passes)
    }
}

holds_model!(FedAlaClient: model);

impl Algorithm for FedAla {
    const NAMES: &'static [Info] = &[Info {
        name: "fedala",
        summary: "FedAvg (every row of W = p); before training, lower layers take the global model and the top layer_idx = 2 tensors θ + (θ_g−θ)⊙W, W ∈ [0,1] learned on rand_percent = 80 % of the local data (eta = 1; to convergence the first time, max_start_epochs = 100); evaluates the trained model",
        reference: "Zhang et al., AAAI 2023",
    }];
    type Params = FedAlaParams;
    type Client = FedAlaClient;
    type Server = ();
    /// The global model.
    type Down = Vec<f32>;
    /// The trained model.
    type Up = Vec<f32>;

    fn new(_: &'static str, params: Checked<FedAlaParams>, _: &Env) -> Result<Self, AlgoError> {
        Ok(Self {
            params: params.into_inner(),
        })
    }

    fn init_client(&self, env: &Env, _: usize) -> FedAlaClient {
        FedAlaClient {
            model: env.initial_model(),
            global: None,
            weights: Vec::new(),
            start_phase: true,
        }
    }

    fn local_round(
        &self,
        env: &Env,
        cx: &mut ClientCx,
        state: &mut FedAlaClient,
    ) -> Trained<Vec<f32>> {
        self.local_aggregation(env, cx, state);
        let train_loss = cx.train_plain(env, &mut state.model, &[]);
        Trained {
            up: state.model.params.clone(),
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

    fn receive(&self, _: &Env, state: &mut FedAlaClient, global: Vec<f32>) {
        state.global = Some(global);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_weight_step_is_clipped_to_the_unit_interval() {
        let mut w = [1.0f32, 1.0, 0.5, 0.0, 0.5];
        // g ⊙ (θ_g − θ) = (−1, 2, 0.25, 3, −0.75); η = 1.
        let g = [1.0f32, 1.0, 0.5, -3.0, 0.5];
        let diff = [-1.0f32, 2.0, 0.5, -1.0, -1.5];
        weight_step(&mut w, &g, &diff, 1.0);
        // 1 + 1 → 1 (clipped), 1 − 2 → 0 (clipped), 0.5 − 0.25, 0 − 3 → 0,
        // 0.5 + 0.75 → 1.
        assert_eq!(w, [1.0, 0.0, 0.25, 0.0, 1.0]);
        // With W the top layers interpolate between θ (W = 0) and θ_g (W = 1).
        let theta = [1.0f32, 1.0, 1.0, 1.0, 1.0];
        let mut hat = [0.0f32; 5];
        aggregate_top(&theta, &diff, &w, &mut hat);
        assert_eq!(hat, [0.0, 1.0, 1.125, 1.0, -0.5]);
    }

    /// A small MLP client on two blobs, its model trained apart from a
    /// "global" model so that ALA has something to aggregate.
    fn client_on_blobs(
        params: FedAlaParams,
        run: impl FnOnce(&FedAla, &Env, &mut ClientCx, &mut FedAlaClient),
    ) {
        use fedweave_core::{Purpose, rng_stream};
        use fedweave_nn::{LocalData, ModelKind, ModelSpec, TrainConfig};
        let spec = ModelSpec::new(ModelKind::MLP, &[4], 2).unwrap();
        let init = spec.init(&mut rng_stream(1, 0, 0, Purpose::ModelInit));
        let x: Vec<f32> = (0..160)
            .map(|k| {
                let centre = if (k / 4) % 2 == 0 { -1.0 } else { 1.0 };
                centre + ((k * 7 % 11) as f32 - 5.0) / 10.0
            })
            .collect();
        let y: Vec<u32> = (0..40).map(|k| k % 2).collect();
        let idx: Vec<usize> = (0..40).collect();
        let data = LocalData::new(&x, &y, &idx);
        let train = TrainConfig {
            lr: 0.05,
            momentum: 0.0,
            weight_decay: 0.0,
            batch_size: 8,
            iterations: 10,
            epochs: 0,
        };
        let env = Env {
            spec: &spec,
            train: &train,
            sizes: &[40],
            init: &init,
            relation: None,
            label_counts: &[],
            kernels: fedweave_core::pairwise::Kernels::cpu(),
        };
        let algo = FedAla { params };
        let mut state = algo.init_client(&env, 0);
        let mut cx = ClientCx {
            client: 0,
            round: 1,
            data: crate::ClientData {
                train: data,
                val: data,
            },
            rng: rng_stream(3, 1, 0, Purpose::Batches),
            origin: None,
            batch: None,
        };
        run(&algo, &env, &mut cx, &mut state);
    }

    #[test]
    fn lower_layers_take_the_global_model_and_the_top_ones_interpolate() {
        client_on_blobs(FedAlaParams::default(), |algo, env, cx, state| {
            // No global model yet: nothing to aggregate.
            assert_eq!(algo.local_aggregation(env, cx, state), None);
            assert_eq!(state.model.params, env.init);
            algo.local_round(env, cx, state);
            // The global model equals the client's: skipped (ALA.py's check).
            state.global = Some(state.model.params.clone());
            assert_eq!(algo.local_aggregation(env, cx, state), None);
            assert!(state.start_phase && state.weights.is_empty());

            let global: Vec<f32> = env.init.iter().map(|v| -v).collect();
            state.global = Some(global.clone());
            let before = state.model.params.clone();
            let passes = algo.local_aggregation(env, cx, state).unwrap();
            assert!(
                passes > algo.params.num_pre_loss && passes <= 100,
                "{passes}"
            );
            assert!(!state.start_phase);
            let top = env.spec.layout().tensors()[env.spec.layout().tensors().len() - 2].offset;
            assert_eq!(state.model.params[..top], global[..top]);
            let w = &state.weights;
            assert_eq!(w.len(), before.len() - top);
            assert!(w.iter().all(|x| (0.0..=1.0).contains(x)));
            assert!(w.iter().any(|&x| x < 1.0), "W was learned");
            for (k, wk) in w.iter().enumerate() {
                let (t, g) = (before[top + k], global[top + k]);
                assert_eq!(state.model.params[top + k], t + (g - t) * wk);
            }
            // Later rounds make one pass.
            state.global = Some(global);
            assert_eq!(algo.local_aggregation(env, cx, state), Some(1));
        });
    }

    #[test]
    fn the_first_aggregation_is_bounded() {
        let params = FedAlaParams {
            threshold: 0.0,
            max_start_epochs: 7,
            ..FedAlaParams::default()
        };
        client_on_blobs(params, |algo, env, cx, state| {
            algo.local_round(env, cx, state);
            state.global = Some(env.init.to_vec());
            assert_eq!(algo.local_aggregation(env, cx, state), Some(7));
        });
    }

    proptest! {
        #[test]
        fn weights_stay_in_the_unit_interval(
            start in prop::collection::vec(0.0f32..=1.0, 8),
            steps in prop::collection::vec(
                (prop::collection::vec(-1e3f32..1e3, 8), prop::collection::vec(-10.0f32..10.0, 8)),
                1..6,
            ),
            eta in 0.0f32..10.0,
        ) {
            let mut w = start;
            for (g, d) in &steps {
                weight_step(&mut w, g, d, eta);
                prop_assert!(w.iter().all(|x| (0.0..=1.0).contains(x)), "{w:?}");
            }
        }
    }
}
