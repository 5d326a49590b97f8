//! The papers' label partitions: FedDWA's practical setting 1, DPFL's
//! Patho(k), and PFLlib's `pat` / `exdir` (PFLlib's `dir` is
//! [`crate::partition`]'s Dirichlet with PFLlib's `least_samples`).
//!
//! Each function splits a pool given as per-class index lists (ascending)
//! and returns per-client index lists; the exact definitions are in the
//! documentation of [`crate::partition`].

use rand::Rng;
use rand::seq::SliceRandom;
use rand::seq::index::sample;
use rand_distr::{Distribution, Gamma};

use crate::partition::{Shares, bound};
use crate::{DataError, PartitionConfig};
use fedweave_core::RngStream;

/// Size of part `p` when `n` items are cut into `parts` near-equal parts
/// (the later parts get the extra items).
fn part(p: usize, n: usize, parts: usize) -> usize {
    bound(p + 1, n, parts) - bound(p, n, parts)
}

/// `dpfl_patho` redraws one class's proportions up to this many times per
/// unit of `max_retries`.
pub(crate) const PATHO_DRAWS_PER_RETRY: usize = 1000;

fn too_many_classes(k: usize, c: usize) -> DataError {
    DataError::config(
        "partition.classes_per_client",
        format!("{k} classes per client exceed the dataset's {c} classes"),
    )
}

/// The dominant classes of group `g` of `groups` among `c` classes:
/// `d` consecutive labels (cyclic) starting at `⌊g·c/groups⌋`.
pub(crate) fn dominant_classes(g: usize, groups: usize, c: usize, d: usize) -> Vec<usize> {
    (0..d).map(|j| (g * c / groups + j) % c).collect()
}

/// FedDWA practical 1 (paper): per-group class counts of one client of
/// size `n`: `round(f·n)` samples over the `d` dominant classes, the rest
/// over all classes, each cut into near-equal parts.
fn feddwa_quota(n: usize, f: f64, dominant: &[usize], c: usize) -> Vec<usize> {
    let n_dom = ((f * n as f64).round() as usize).min(n);
    let n_rest = n - n_dom;
    let mut q: Vec<usize> = (0..c).map(|k| part(k, n_rest, c)).collect();
    for (j, &k) in dominant.iter().enumerate() {
        q[k] += part(j, n_dom, dominant.len());
    }
    q
}

pub(crate) fn feddwa_groups(
    by_class: &[Vec<usize>],
    cfg: &PartitionConfig,
    clients: usize,
    rng: &mut RngStream,
) -> Result<(Shares, Vec<usize>), DataError> {
    let c = by_class.len();
    let g_count = cfg.groups;
    let d = cfg.dominant_classes;
    if d > c {
        return Err(DataError::config(
            "partition.dominant_classes",
            format!("{d} dominant classes per group exceed the dataset's {c} classes"),
        ));
    }
    let per_group = clients / g_count;
    let group_of: Vec<usize> = (0..clients).map(|i| i / per_group).collect();
    let dominant: Vec<Vec<usize>> = (0..g_count)
        .map(|g| dominant_classes(g, g_count, c, d))
        .collect();
    let quotas = |n: usize| -> Vec<Vec<usize>> {
        dominant
            .iter()
            .map(|dom| feddwa_quota(n, cfg.dominant_fraction, dom, c))
            .collect()
    };
    // The first class whose demand at size n exceeds its samples.
    let short = |q: &[Vec<usize>]| {
        (0..c).find_map(|k| {
            let demand: usize = q.iter().map(|qg| qg[k] * per_group).sum();
            (demand > by_class[k].len()).then_some((k, demand))
        })
    };
    let total: usize = by_class.iter().map(Vec::len).sum();
    let n = match cfg.samples_per_client {
        Some(n) => {
            if let Some((k, demand)) = short(&quotas(n)) {
                return Err(DataError::config(
                    "partition.samples_per_client",
                    format!(
                        "samples_per_client = {n} for {clients} clients needs {demand} samples of \
                         class {k}, which has {}; lower partition.samples_per_client (or unset it \
                         for the largest feasible size)",
                        by_class[k].len()
                    ),
                ));
            }
            n
        }
        // Demand is not monotone in n (rounding of the parts), so scan down.
        None => (1..=total / clients)
            .rev()
            .find(|&n| short(&quotas(n)).is_none())
            .ok_or_else(|| {
                DataError::config(
                    "clients",
                    format!(
                        "feddwa_groups cannot give each of {clients} clients even one sample \
                         (pool of {total}); use fewer clients"
                    ),
                )
            })?,
    };
    let q = quotas(n);
    let mut shares = vec![Vec::with_capacity(n); clients];
    for (k, class) in by_class.iter().enumerate() {
        let mut idx = class.clone();
        idx.shuffle(rng);
        let mut start = 0;
        for (i, share) in shares.iter_mut().enumerate() {
            let take = q[group_of[i]][k];
            share.extend_from_slice(&idx[start..start + take]);
            start += take;
        }
    }
    Ok((shares, group_of))
}

/// Part sizes when `len` items are cut by the cumulative proportions `p`
/// (`⌊cum·len⌋` boundaries, the last part taking the rest).
fn cut_sizes(len: usize, p: &[f64]) -> Vec<usize> {
    let sum: f64 = p.iter().sum();
    let mut start = 0;
    let mut cum = 0.0;
    p.iter()
        .enumerate()
        .map(|(j, pj)| {
            cum += pj / sum;
            let end = if j + 1 == p.len() {
                len
            } else {
                ((cum * len as f64) as usize).clamp(start, len)
            };
            let n = end - start;
            start = end;
            n
        })
        .collect()
}

/// Cuts `idx` (already shuffled) into consecutive parts of [`cut_sizes`].
fn cut(idx: &[usize], p: &[f64]) -> Vec<Vec<usize>> {
    let mut start = 0;
    cut_sizes(idx.len(), p)
        .into_iter()
        .map(|n| {
            start += n;
            idx[start - n..start].to_vec()
        })
        .collect()
}

/// Dirichlet draw of `m` proportions; when every draw underflows (tiny
/// concentration) the whole mass goes to one uniformly chosen entry.
fn dirichlet_draw(gamma: &Gamma<f64>, m: usize, rng: &mut RngStream) -> Vec<f64> {
    let mut p: Vec<f64> = (0..m).map(|_| gamma.sample(rng)).collect();
    let sum: f64 = p.iter().sum();
    if !(sum > 0.0 && sum.is_finite()) {
        p.iter_mut().for_each(|v| *v = 0.0);
        p[rng.random_range(0..m)] = 1.0;
    }
    p
}

/// Each client's classes: `k` distinct uniformly random classes. Returns
/// the holders of each class, ascending.
fn random_class_sets(c: usize, k: usize, clients: usize, rng: &mut RngStream) -> Vec<Vec<usize>> {
    let mut holders = vec![Vec::new(); c];
    for i in 0..clients {
        for cls in sample(rng, c, k) {
            holders[cls].push(i);
        }
    }
    holders
}

pub(crate) fn dpfl_patho(
    by_class: &[Vec<usize>],
    cfg: &PartitionConfig,
    clients: usize,
    rng: &mut RngStream,
) -> Result<Shares, DataError> {
    let c = by_class.len();
    let k = cfg.classes_per_client;
    if k > c {
        return Err(too_many_classes(k, c));
    }
    let gamma = Gamma::new(cfg.within_class_beta, 1.0).map_err(|e| {
        DataError::config(
            "partition.within_class_beta",
            format!(
                "{} is not a valid concentration: {e}",
                cfg.within_class_beta
            ),
        )
    })?;
    let holders = random_class_sets(c, k, clients, rng);
    let mut shares = vec![Vec::new(); clients];
    for (cls, (class, h)) in by_class.iter().zip(&holders).enumerate() {
        if h.is_empty() {
            continue;
        }
        if h.len().saturating_mul(cfg.min_samples) > class.len() {
            return Err(DataError::config(
                "partition.min_samples",
                format!(
                    "class {cls} has {} samples and {} holders, fewer than min_samples = {} each; \
                     lower partition.min_samples or partition.classes_per_client, or use fewer \
                     clients",
                    class.len(),
                    h.len(),
                    cfg.min_samples
                ),
            ));
        }
        // Only the part sizes decide acceptance, so redraw just the
        // proportions (cheap) and shuffle once; DPFL reshuffles and redraws
        // without limit, which gives the same distribution.
        let len = class.len();
        let budget = cfg.max_retries.saturating_mul(PATHO_DRAWS_PER_RETRY);
        let accepted = (0..budget)
            .map(|_| dirichlet_draw(&gamma, h.len(), rng))
            .find(|p| cut_sizes(len, p).iter().all(|&n| n >= cfg.min_samples));
        let Some(p) = accepted else {
            return Err(DataError::config(
                "partition.min_samples",
                format!(
                    "after {budget} Dirichlet draws (within_class_beta = {}) some holder of class \
                     {cls} still had fewer than min_samples = {} of its {len} samples; lower \
                     partition.min_samples, raise partition.within_class_beta or \
                     partition.max_retries",
                    cfg.within_class_beta, cfg.min_samples,
                ),
            ));
        };
        let mut idx = class.clone();
        idx.shuffle(rng);
        let parts = cut(&idx, &p);
        for (&j, p) in h.iter().zip(parts) {
            shares[j].extend(p);
        }
    }
    Ok(shares)
}

pub(crate) fn pfllib_pat(
    by_class: &[Vec<usize>],
    cfg: &PartitionConfig,
    clients: usize,
    least_samples: usize,
    rng: &mut RngStream,
) -> Result<Shares, DataError> {
    let c = by_class.len();
    let k = cfg.classes_per_client;
    if k > c {
        return Err(too_many_classes(k, c));
    }
    // int(np.ceil((num_clients / num_classes) * class_per_client)), in f64 as PFLlib.
    let per_class = ((clients as f64 / c as f64) * k as f64).ceil() as usize;
    let mut slots = vec![k; clients];
    let mut shares = vec![Vec::new(); clients];
    for (cls, idx) in by_class.iter().enumerate() {
        let selected: Vec<usize> = (0..clients)
            .filter(|&j| slots[j] > 0)
            .take(per_class)
            .collect();
        if selected.is_empty() {
            break;
        }
        let n = idx.len();
        let m = selected.len();
        let num_per = n as f64 / m as f64;
        let mut counts: Vec<usize> = if cfg.balance {
            vec![num_per as usize; m - 1]
        } else if m > 1 {
            // np.random.randint(low, high) with float bounds: [⌊low⌋, ⌊high⌋).
            let low = (num_per / 10.0).max(least_samples as f64 / c as f64) as usize;
            let high = num_per as usize;
            if low >= high {
                return Err(DataError::config(
                    "partition.balance",
                    format!(
                        "pfllib_pat (unbalanced) draws class {cls}'s per-client counts from \
                         [{low}, {high}), which is empty ({n} samples over {m} clients); set \
                         partition.balance = true, lower partition.least_samples or use fewer \
                         clients"
                    ),
                ));
            }
            (0..m - 1).map(|_| rng.random_range(low..high)).collect()
        } else {
            Vec::new()
        };
        let used: usize = counts.iter().sum();
        counts.push(n - used);
        let mut start = 0;
        for (&j, &cnt) in selected.iter().zip(&counts) {
            shares[j].extend_from_slice(&idx[start..start + cnt]);
            start += cnt;
            slots[j] -= 1;
        }
    }
    Ok(shares)
}

pub(crate) fn pfllib_exdir(
    by_class: &[Vec<usize>],
    cfg: &PartitionConfig,
    clients: usize,
    min_size: usize,
    rng: &mut RngStream,
) -> Result<Shares, DataError> {
    let c = by_class.len();
    let k = cfg.classes_per_client;
    if k > c {
        return Err(too_many_classes(k, c));
    }
    if k * clients < c {
        return Err(DataError::config(
            "partition.classes_per_client",
            format!(
                "{clients} clients × {k} classes cannot hold all {c} classes, which pfllib_exdir \
                 requires; raise partition.classes_per_client or use more clients"
            ),
        ));
    }
    // First level: class sets, redrawn until every class has enough holders.
    let min_holders = (k * clients / c / 2).max(1);
    let mut holders = Vec::new();
    let mut ok = false;
    for _ in 0..cfg.max_retries {
        holders = random_class_sets(c, k, clients, rng);
        if holders.iter().all(|h| h.len() >= min_holders) {
            ok = true;
            break;
        }
    }
    if !ok {
        return Err(DataError::config(
            "partition.max_retries",
            format!(
                "after {} draws of {k} classes per client some class still had fewer than \
                 {min_holders} holders; raise partition.max_retries or change \
                 partition.classes_per_client",
                cfg.max_retries
            ),
        ));
    }
    let total: usize = by_class.iter().map(Vec::len).sum();
    if min_size.saturating_mul(clients) > total {
        return Err(DataError::config(
            "partition.least_samples",
            format!(
                "least_samples = {min_size} for each of {clients} clients needs more than the \
                 pool's {total} samples; lower partition.least_samples or use fewer clients"
            ),
        ));
    }
    let gamma = Gamma::new(cfg.beta, 1.0).map_err(|e| {
        DataError::config(
            "partition.beta",
            format!("{} is not a valid concentration: {e}", cfg.beta),
        )
    })?;
    let cap = total as f64 / clients as f64;
    let mut smallest = 0;
    // Second level: Dirichlet over each class's holders, redrawn until every
    // client has min_size samples.
    for _ in 0..cfg.max_retries {
        let mut shares: Shares = vec![Vec::new(); clients];
        for (class, h) in by_class.iter().zip(&holders) {
            let mut idx = class.clone();
            idx.shuffle(rng);
            let raw: Vec<f64> = (0..clients).map(|_| gamma.sample(rng)).collect();
            let mut p: Vec<f64> = h
                .iter()
                .map(|&j| {
                    if (shares[j].len() as f64) < cap {
                        raw[j]
                    } else {
                        0.0
                    }
                })
                .collect();
            let sum: f64 = p.iter().sum();
            if !(sum > 0.0 && sum.is_finite()) {
                // Every holder is full (PFLlib divides by zero here): drop the
                // balance cap for this class.
                p = h.iter().map(|&j| raw[j]).collect();
                let sum: f64 = p.iter().sum();
                if !(sum > 0.0 && sum.is_finite()) {
                    p.iter_mut().for_each(|v| *v = 0.0);
                    p[rng.random_range(0..h.len())] = 1.0;
                }
            }
            // Holders in client order; the last holder takes the remainder.
            for (&j, part) in h.iter().zip(cut(&idx, &p)) {
                shares[j].extend(part);
            }
        }
        smallest = shares.iter().map(Vec::len).min().unwrap_or(0);
        if smallest >= min_size {
            return Ok(shares);
        }
    }
    Err(DataError::config(
        "partition.least_samples",
        format!(
            "after {} draws (beta = {}) some client still had fewer than least_samples = \
             {min_size} samples (smallest in the last draw: {smallest}); lower \
             partition.least_samples, raise partition.beta or partition.max_retries",
            cfg.max_retries, cfg.beta
        ),
    ))
}
