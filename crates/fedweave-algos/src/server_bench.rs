//! How long the server's step of a graph method takes at N clients and a
//! model of d parameters: what `fedweave bench --server N` and the
//! `server_round` bench report.
//!
//! Uploads are synthetic trained models θ_i = θ_init + 0.01·(u_{i mod 4} +
//! z_i) with standard-normal u, z (four client groups, so the graph methods
//! find structure, as on real data); FedDWA's guidance model is θ_i plus a
//! further 0.001·z'. Each timing is one warm-up round (FedAGHN and FedDWA keep
//! state across rounds) and then the fastest of `repeats` rounds of the whole
//! [`Algorithm::aggregate`].

use crate::fedaghn::FedAghn;
use crate::fedavg::FedAvg;
use crate::feddwa::{FedDwa, Guided};
use crate::pfedgraph::PFedGraph;
use crate::{Algorithm, Env, Message, Validate};
use fedweave_core::pairwise::Kernels;
use fedweave_core::{Purpose, rng_stream};
use fedweave_nn::{ModelSpec, TrainConfig};
use rand_distr::{Distribution, StandardNormal};
use std::hint::black_box;
use std::time::Instant;

/// The methods whose server step can be timed, FedAvg first (the baseline
/// the others are compared with).
pub const METHODS: [&str; 4] = ["fedavg", "pfedgraph", "feddwa", "fedaghn"];

const GROUPS: usize = 4;

fn normal(rng: &mut impl rand::Rng, len: usize, scale: f32) -> Vec<f32> {
    (0..len)
        .map(|_| {
            let z: f32 = StandardNormal.sample(&mut *rng);
            scale * z
        })
        .collect()
}

/// `n` synthetic trained models around `init` (four groups plus noise),
/// paired with their client ids.
pub fn trained_models(init: &[f32], n: usize) -> Vec<(usize, Vec<f32>)> {
    let mut rng = rng_stream(7, 1, 0, Purpose::Dataset);
    let dirs: Vec<Vec<f32>> = (0..GROUPS)
        .map(|_| normal(&mut rng, init.len(), 0.01))
        .collect();
    (0..n)
        .map(|i| {
            let z = normal(&mut rng, init.len(), 0.01);
            let model = init
                .iter()
                .zip(&dirs[i % GROUPS])
                .zip(&z)
                .map(|((t, u), z)| t + u + z)
                .collect();
            (i, model)
        })
        .collect()
}

/// FedDWA's uploads: each of [`trained_models`] with a guidance model nearby.
pub fn guided_models(init: &[f32], n: usize) -> Vec<(usize, Guided)> {
    let mut rng = rng_stream(7, 2, 0, Purpose::Dataset);
    trained_models(init, n)
        .into_iter()
        .map(|(i, model)| {
            let extra = normal(&mut rng, init.len(), 0.001);
            let guidance = model.iter().zip(extra).map(|(a, b)| a + b).collect();
            (i, Guided { model, guidance })
        })
        .collect()
}

/// What a server step over `n` synthetic clients of one model borrows: the
/// common initial model, 600 samples per client, one plain local epoch.
pub struct Federation {
    /// θ_init, drawn from the model's own initialisation.
    pub init: Vec<f32>,
    sizes: Vec<usize>,
    train: TrainConfig,
}

impl Federation {
    /// `n` clients of `spec`.
    pub fn new(spec: &ModelSpec, n: usize) -> Self {
        Self {
            init: spec.init(&mut rng_stream(7, 0, 0, Purpose::ModelInit)),
            sizes: vec![600; n],
            train: TrainConfig {
                lr: 0.01,
                momentum: 0.0,
                weight_decay: 0.0,
                batch_size: 64,
                iterations: 0,
                epochs: 1,
            },
        }
    }

    /// The server's view of this federation, its products on `kernels`.
    pub fn env<'a>(&'a self, spec: &'a ModelSpec, kernels: &'a Kernels) -> Env<'a> {
        Env {
            spec,
            train: &self.train,
            sizes: &self.sizes,
            init: &self.init,
            relation: None,
            label_counts: &[],
            kernels,
        }
    }
}

/// One method's server step.
#[derive(Clone, Copy, Debug)]
pub struct StepTime {
    /// Fastest whole `aggregate` call, in seconds.
    pub seconds: f64,
    /// Bytes sent down per client per round.
    pub down_bytes: f64,
    /// Bytes uploaded per client per round.
    pub up_bytes: f64,
}

/// Times `aggregate` of algorithm `A` (built as `name` with default
/// parameters) over `uploads`: one warm-up round, then the fastest of
/// `repeats`.
///
/// # Panics
///
/// If `A` rejects its default parameters (a bug of the algorithm).
pub fn time_aggregate<A: Algorithm>(
    name: &'static str,
    env: &Env,
    uploads: &[(usize, A::Up)],
    repeats: usize,
) -> StepTime {
    let params: A::Params = toml::Value::Table(toml::Table::new())
        .try_into()
        .expect("default parameters");
    let params = params
        .check(env.clients())
        .expect("valid default parameters");
    let algo = A::new(name, params, env).expect("builds with default parameters");
    let mut server = algo.init_server(env);
    let mut best = f64::INFINITY;
    let mut down = 0u64;
    for round in 1..=repeats.max(1) + 1 {
        let start = Instant::now();
        let out = black_box(algo.aggregate(env, &mut server, round, uploads));
        if round > 1 {
            best = best.min(start.elapsed().as_secs_f64());
        }
        down = out.downloads.iter().map(|(_, d)| d.bytes()).sum();
    }
    let n = uploads.len().max(1) as f64;
    let up: u64 = uploads.iter().map(|(_, u)| u.bytes()).sum();
    StepTime {
        seconds: best,
        down_bytes: down as f64 / n,
        up_bytes: up as f64 / n,
    }
}

/// Times the server step of `method` (one of [`METHODS`]) for `env.sizes.len()`
/// synthetic clients; `None` for a method not in [`METHODS`].
pub fn time_method(method: &str, env: &Env, repeats: usize) -> Option<StepTime> {
    let n = env.sizes.len();
    Some(match method {
        "fedavg" => time_aggregate::<FedAvg>("fedavg", env, &trained_models(env.init, n), repeats),
        "pfedgraph" => {
            time_aggregate::<PFedGraph>("pfedgraph", env, &trained_models(env.init, n), repeats)
        }
        "feddwa" => time_aggregate::<FedDwa>("feddwa", env, &guided_models(env.init, n), repeats),
        "fedaghn" => {
            time_aggregate::<FedAghn>("fedaghn", env, &trained_models(env.init, n), repeats)
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedweave_nn::ModelKind;

    #[test]
    fn the_groups_share_a_direction_and_guidance_stays_close() {
        let init = vec![0.0f32; 2000];
        let models = trained_models(&init, 8);
        let dist = |a: &[f32], b: &[f32]| -> f32 {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y) * (x - y))
                .sum::<f32>()
                .sqrt()
        };
        // Same group (0 and 4): only the two noises differ, ‖·‖ ≈ 0.01·√(2d);
        // other groups add the difference of two directions, ≈ 0.01·√(4d).
        let same = dist(&models[0].1, &models[4].1);
        let other = dist(&models[0].1, &models[1].1);
        assert!((same / (0.01 * (2.0f32 * 2000.0).sqrt()) - 1.0).abs() < 0.1);
        assert!((other / (0.01 * (4.0f32 * 2000.0).sqrt()) - 1.0).abs() < 0.1);
        let guided = guided_models(&init, 8);
        assert_eq!(guided[3].1.model, models[3].1);
        let g = dist(&guided[3].1.model, &guided[3].1.guidance);
        assert!((g / (0.001 * 2000f32.sqrt()) - 1.0).abs() < 0.1);
    }

    #[test]
    fn every_method_is_timed_and_fedavg_sends_one_model_down() {
        let spec = ModelSpec::new(ModelKind::MLP, &[8], 3).expect("mlp");
        let fed = Federation::new(&spec, 6);
        let env = fed.env(&spec, Kernels::cpu());
        let init = &fed.init;
        for method in METHODS {
            let t = time_method(method, &env, 1).expect("a known method");
            assert!(t.seconds.is_finite() && t.seconds > 0.0, "{method}");
        }
        let fedavg = time_method("fedavg", &env, 1).expect("fedavg");
        assert_eq!(fedavg.up_bytes, (4 * init.len()) as f64);
        assert!(time_method("krum", &env, 1).is_none());
    }
}
