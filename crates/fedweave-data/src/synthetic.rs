//! FedProx's Synthetic(α, β) data (Li et al., "Federated Optimization in
//! Heterogeneous Networks", MLSys 2020), generated per natural client.
//!
//! For client `k` (stream `rng_stream(seed, 0, k, Purpose::Dataset)`):
//! - sample count `n_k = m₀ + LogNormal(ln(mean − m₀) − ½, 1)`, rounded and
//!   clipped to `10·mean`, with `m₀ = max(4, mean / 4)` (so the expected size
//!   is about `samples_per_client_mean`; 50 minimum for the default 200);
//! - `u_k ~ N(0, α²)`, `B_k ~ N(0, β²)` (α, β are standard deviations, as in
//!   FedProx's generator);
//! - `W_k ~ N(u_k, 1)` (`classes × dim`), `b_k ~ N(u_k, 1)`, `v_k ~ N(B_k, 1)`
//!   per feature;
//! - `x ~ N(v_k, Σ)`, `Σ` diagonal with `Σ_jj = j^(−1.2)` (j = 1..dim);
//! - `y = argmax softmax(W_k x + b_k)`.
//!
//! The IID variant shares one `W ~ N(0, 1)`, `b ~ N(0, 1)` drawn from
//! `rng_stream(seed, 0, u64::MAX, Purpose::Dataset)` and uses `v_k = 0`.
//! Each client's first `n_k − max(1, ⌊n_k/4⌋)` samples go to train, the rest
//! to test; `natural_clients[k]` indexes them.

use fedweave_core::{Purpose, RngStream, rng_stream};
use rand::Rng;
use rand_distr::{LogNormal, StandardNormal};

use crate::{DataError, Dataset, NaturalClient, Split, SyntheticConfig};

fn normal(rng: &mut RngStream, mean: f64, std: f64) -> f64 {
    let z: f64 = rng.sample(StandardNormal);
    mean + std * z
}

fn check(cfg: &SyntheticConfig) -> Result<(), DataError> {
    let bad = |key: &str, msg: String| Err(DataError::config(format!("data.synthetic.{key}"), msg));
    if !(cfg.alpha.is_finite() && cfg.alpha >= 0.0) {
        return bad(
            "alpha",
            format!("must be a finite number ≥ 0, got {}", cfg.alpha),
        );
    }
    if !(cfg.beta.is_finite() && cfg.beta >= 0.0) {
        return bad(
            "beta",
            format!("must be a finite number ≥ 0, got {}", cfg.beta),
        );
    }
    if cfg.samples_per_client_mean < 4 {
        return bad(
            "samples_per_client_mean",
            format!("must be at least 4, got {}", cfg.samples_per_client_mean),
        );
    }
    if cfg.samples_per_client_mean > 1_000_000 {
        return bad(
            "samples_per_client_mean",
            format!(
                "must be at most 1000000, got {}",
                cfg.samples_per_client_mean
            ),
        );
    }
    if cfg.dim == 0 || cfg.dim > 100_000 {
        return bad("dim", format!("must be in 1..=100000, got {}", cfg.dim));
    }
    if cfg.classes < 2 || cfg.classes > 100_000 {
        return bad(
            "classes",
            format!("must be in 2..=100000, got {}", cfg.classes),
        );
    }
    if cfg.clients == 0 || cfg.clients > 100_000 {
        return bad(
            "clients",
            format!("must be in 1..=100000, got {}", cfg.clients),
        );
    }
    let values = (cfg.clients as u128) * (cfg.samples_per_client_mean as u128) * (cfg.dim as u128);
    if values > 1 << 29 {
        return bad(
            "clients",
            format!(
                "{} clients × {} samples × {} features is about {} million values (over 2 GiB); \
                 lower data.synthetic.clients, samples_per_client_mean or dim",
                cfg.clients,
                cfg.samples_per_client_mean,
                cfg.dim,
                values / 1_000_000
            ),
        );
    }
    Ok(())
}

/// Generates the dataset; see the module documentation.
pub(crate) fn generate(cfg: &SyntheticConfig, seed: u64) -> Result<Dataset, DataError> {
    check(cfg)?;
    let (dim, classes) = (cfg.dim, cfg.classes);
    let mean_n = cfg.samples_per_client_mean;
    let min_n = (mean_n / 4).max(4);
    let extra = (mean_n - min_n) as f64;
    let size_dist = if extra > 0.0 {
        LogNormal::new(extra.ln() - 0.5, 1.0).ok()
    } else {
        None
    };
    let std_x: Vec<f64> = (1..=dim).map(|j| (j as f64).powf(-0.6)).collect();
    let shared = cfg.iid.then(|| {
        let mut rng = rng_stream(seed, 0, u64::MAX, Purpose::Dataset);
        let w: Vec<f64> = (0..classes * dim)
            .map(|_| normal(&mut rng, 0.0, 1.0))
            .collect();
        let b: Vec<f64> = (0..classes).map(|_| normal(&mut rng, 0.0, 1.0)).collect();
        (w, b)
    });

    let mut train = Split::default();
    let mut test = Split::default();
    let mut natural = Vec::with_capacity(cfg.clients);
    let mut x = vec![0f64; dim];
    for k in 0..cfg.clients {
        let mut rng = rng_stream(seed, 0, k as u64, Purpose::Dataset);
        let n = match &size_dist {
            Some(d) => {
                let e: f64 = rng.sample(d);
                (min_n + e.round().min((10 * mean_n) as f64) as usize).min(10 * mean_n)
            }
            None => min_n,
        };
        let u = normal(&mut rng, 0.0, cfg.alpha);
        let big_b = normal(&mut rng, 0.0, cfg.beta);
        let (w, b, v) = match &shared {
            Some((w, b)) => (w.clone(), b.clone(), vec![0.0; dim]),
            None => (
                (0..classes * dim)
                    .map(|_| normal(&mut rng, u, 1.0))
                    .collect(),
                (0..classes).map(|_| normal(&mut rng, u, 1.0)).collect(),
                (0..dim)
                    .map(|_| normal(&mut rng, big_b, 1.0))
                    .collect::<Vec<f64>>(),
            ),
        };
        let n_test = (n / 4).max(1);
        let n_train = n - n_test;
        let mut client = NaturalClient::default();
        for s in 0..n {
            for j in 0..dim {
                x[j] = normal(&mut rng, v[j], std_x[j]);
            }
            let mut best = (f64::NEG_INFINITY, 0u32);
            for c in 0..classes {
                let row = &w[c * dim..(c + 1) * dim];
                let logit = b[c] + row.iter().zip(&x).map(|(a, z)| a * z).sum::<f64>();
                if logit > best.0 {
                    best = (logit, c as u32);
                }
            }
            let (dst, list) = if s < n_train {
                (&mut train, &mut client.train)
            } else {
                (&mut test, &mut client.test)
            };
            list.push(dst.len());
            dst.features.extend(x.iter().map(|&z| z as f32));
            dst.labels.push(best.1);
        }
        natural.push(client);
    }
    Ok(Dataset {
        name: "synthetic".to_string(),
        num_classes: classes,
        feature_shape: vec![dim],
        train,
        test,
        natural_clients: Some(natural),
        task: crate::Task::Classification,
        relation_graph: None,
        target_scales: None,
        input: crate::InputKind::Dense,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_valid_and_client_indexed() {
        let cfg = SyntheticConfig::default();
        let a = generate(&cfg, 5).unwrap();
        let b = generate(&cfg, 5).unwrap();
        assert_eq!(a, b);
        let c = generate(&cfg, 6).unwrap();
        assert_ne!(a.train, c.train);
        assert_eq!(a.feature_shape, vec![60]);
        assert_eq!(a.num_classes, 10);
        assert!(a.train.labels.iter().chain(&a.test.labels).all(|&y| y < 10));
        assert_eq!(a.train.features.len(), a.train.len() * 60);
        let clients = a.natural_clients.as_ref().unwrap();
        assert_eq!(clients.len(), 10);
        let mut next_train = 0;
        let mut next_test = 0;
        for cl in clients {
            let n = cl.train.len() + cl.test.len();
            assert!((50..=2000).contains(&n), "client size {n}");
            assert_eq!(cl.test.len(), n / 4);
            assert_eq!(
                cl.train,
                (next_train..next_train + cl.train.len()).collect::<Vec<_>>()
            );
            assert_eq!(
                cl.test,
                (next_test..next_test + cl.test.len()).collect::<Vec<_>>()
            );
            next_train += cl.train.len();
            next_test += cl.test.len();
        }
        assert_eq!(next_train, a.train.len());
        assert_eq!(next_test, a.test.len());
        // Non-IID clients have distinct label mixes: not every label the same.
        let distinct: std::collections::BTreeSet<u32> = a.train.labels.iter().copied().collect();
        assert!(distinct.len() >= 3, "labels {distinct:?}");
    }

    #[test]
    fn mean_client_size_is_near_config() {
        let cfg = SyntheticConfig {
            clients: 200,
            dim: 2,
            classes: 2,
            ..SyntheticConfig::default()
        };
        let ds = generate(&cfg, 1).unwrap();
        let mean = (ds.train.len() + ds.test.len()) as f64 / 200.0;
        assert!((150.0..260.0).contains(&mean), "mean {mean}");
    }

    #[test]
    fn iid_variant_shares_one_model() {
        let cfg = SyntheticConfig {
            iid: true,
            clients: 3,
            ..SyntheticConfig::default()
        };
        let ds = generate(&cfg, 2).unwrap();
        assert_eq!(ds.natural_clients.as_ref().unwrap().len(), 3);
        // Zero feature means: the average of feature 0 is near 0.
        let n = ds.train.len();
        let m0: f32 = (0..n).map(|i| ds.train.row(i, 60)[0]).sum::<f32>() / n as f32;
        assert!(m0.abs() < 0.2, "mean of feature 0 = {m0}");
    }

    #[test]
    fn bad_settings_name_the_key() {
        for (cfg, key) in [
            (
                SyntheticConfig {
                    classes: 1,
                    ..Default::default()
                },
                "data.synthetic.classes",
            ),
            (
                SyntheticConfig {
                    dim: 0,
                    ..Default::default()
                },
                "data.synthetic.dim",
            ),
            (
                SyntheticConfig {
                    alpha: -1.0,
                    ..Default::default()
                },
                "data.synthetic.alpha",
            ),
            (
                SyntheticConfig {
                    clients: 0,
                    ..Default::default()
                },
                "data.synthetic.clients",
            ),
            (
                SyntheticConfig {
                    samples_per_client_mean: 2,
                    ..Default::default()
                },
                "data.synthetic.samples_per_client_mean",
            ),
        ] {
            let e = generate(&cfg, 0).unwrap_err().to_string();
            assert!(e.contains(key), "{e}");
        }
    }
}
