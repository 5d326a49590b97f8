//! Splitting a dataset's training pool across clients.
//!
//! Random streams (all keyed by the experiment seed):
//! - `rng_stream(seed, 0, u64::MAX, Purpose::Partition)`: the partition itself;
//! - `rng_stream(seed, 0, i, Purpose::ValidationSplit)`: client `i`'s
//!   train/validation split;
//! - `rng_stream(seed, 1, u64::MAX, Purpose::Partition)`: the order in which
//!   each class's test samples are handed out.
//!
//! **Validation.** A client's share (train + val) is shuffled; the last
//! `round(val_fraction · n)` samples, clamped to `1..=n−1` when
//! `val_fraction > 0`, are its validation set.
//!
//! **Test.** Except for `natural` (which keeps the dataset's own per-client
//! test sets), each client's test set follows its own label distribution: the
//! shuffled test samples of class `c` are cut into consecutive slices whose
//! boundaries are `round(L_c · Σ_{j≤i} n_jc / Σ_j n_jc)`, where `n_ic` is
//! client `i`'s train+val count of class `c` and `L_c` the number of test
//! samples of class `c`. Client `i` thus gets `round(share_ic · L_c)` samples
//! of class `c` up to ±1, the slices are disjoint, never exceed the pool, and
//! a client with no training sample of a class gets no test sample of it.
//!
//! **Merged pools.** With `partition.split = "merged"` every kind but
//! `natural` splits the union of the train and test splits instead (pool
//! index `p` is training sample `p`, then test sample `p − |train|`), with
//! the same draws as above; each client's share
//! is cut into train / validation / test by [`crate::prepare`] (which
//! rebuilds the dataset so that test indices still index `dataset.test`);
//! [`partition`] itself rejects that setting.
//!
//! # The papers' kinds
//!
//! All draw from the partition stream above; `C` is the number of classes,
//! `N` the number of clients, "pool" the samples being split.
//!
//! - **`feddwa_groups`** (FedDWA's practical setting 1 as the paper states
//!   it; its code, `groups`, gives 2.5 dominant classes per group on
//!   average and unequal sizes). `groups` = G must divide N; client `i` is
//!   in group `⌊i / (N/G)⌋`. Group `g`'s dominant classes are the
//!   `dominant_classes` = d consecutive labels (cyclic) starting at
//!   `⌊g·C/G⌋` (10 classes, G = 4, d = 3: {0,1,2}, {2,3,4}, {5,6,7},
//!   {7,8,9}; 100 classes, d = 20: 0–19, 25–44, 50–69, 75–94). Every client
//!   gets the same number `n` of samples (`samples_per_client`, default the
//!   largest `n` the pool allows): `n_dom = round(dominant_fraction·n)` from
//!   its dominant classes, cut into d near-equal parts (the j-th dominant
//!   class gets `⌊(j+1)·n_dom/d⌋ − ⌊j·n_dom/d⌋`), and `n − n_dom` from all C
//!   classes, cut the same way over the labels 0..C (as FedDWA's code and
//!   `groups` spread the remaining 20 % over all classes). All clients of a
//!   group thus have identical class counts. Each class's samples are
//!   shuffled and dealt in client order; samples no client needs stay
//!   unassigned. `group_of` is each client's group.
//! - **`dpfl_patho`** (DPFL's Patho(k), its
//!   `complex_dirichlet_client_data_split`): every client draws
//!   `classes_per_client` = k distinct classes uniformly. Each class's
//!   shuffled samples are cut among its holders (in client order) by
//!   Dirichlet(`within_class_beta`) proportions (`⌊cum·len⌋` boundaries, the
//!   last holder takes the rest), the proportions redrawn (up to
//!   `1000 · max_retries` times; DPFL loops without limit, and with 100
//!   clients on 10 classes about 1 draw in 1000 succeeds) until every holder
//!   has at least `min_samples` of the class. A class nobody drew is
//!   left unassigned (DPFL's code would fail there). DPFL's balance cap is
//!   per class and never binds, so it is omitted.
//! - **`pfllib_pat`** (PFLlib's `separate_data(partition = "pat")`): every
//!   client has `classes_per_client` class slots. Classes are taken in label
//!   order; class `c` goes to the first `⌈(N/C)·k⌉` (computed in f64 as
//!   PFLlib) clients, in client order, that still have a slot; it stops at
//!   the first class no client can take. The class's samples, in pool order
//!   (PFLlib does not shuffle here), are cut into consecutive runs: with
//!   `balance`, `⌊n_c/m⌋` for each of its `m` clients but the last, which
//!   takes the rest; without, each but the last gets a uniform integer in
//!   `[⌊max(n_c/m/10, least_samples/C)⌋, ⌊n_c/m⌋)` (numpy's `randint` with
//!   float bounds). When `k` divides `C` and `N·k/C` is an integer
//!   (e.g. 20 clients, 10 classes, k = 2: blocks of 4 clients share 2
//!   classes), every client gets exactly `k` classes and every class is
//!   used; otherwise PFLlib's greedy order can leave the last clients fewer
//!   classes (10 clients, 10 classes, k = 3: client 9 gets class
//!   9 only) and classes unassigned, which is reproduced.
//! - **`pfllib_dir`** (PFLlib's `dir`): `dirichlet` with PFLlib's
//!   `least_samples` as the minimum client size: per class, shuffled samples
//!   cut by Dirichlet(`beta`) proportions, a client already holding `pool/N`
//!   samples gets proportion 0 (balance trick); redrawn until every client
//!   has `least_samples` (at most `max_retries` times; PFLlib loops
//!   forever). `least_samples` defaults to PFLlib's
//!   `⌊min(10 / test_fraction, pool / N / 2)⌋`; FedAGHN's older PFLlib used 1.
//! - **`pfllib_exdir`** (PFLlib's `exdir`): every client draws
//!   `classes_per_client` = k distinct classes uniformly, redrawn until every
//!   class has at least `max(⌊k·N/C/2⌋, 1)` holders; then per class, a
//!   Dirichlet(`beta`) over all clients, zeroed for non-holders and for
//!   clients holding `pool/N` samples already, cut with `⌊cum·len⌋`
//!   boundaries, the last holder taking the remainder; the whole second
//!   level is redrawn until every client has `least_samples` (default 10, as
//!   PFLlib). If every holder of a class is full (PFLlib divides by zero),
//!   the cap is dropped for that class.

use fedweave_core::{Purpose, RngStream, rng_stream};
use rand::Rng;
use rand::seq::SliceRandom;
use rand_distr::{Distribution, Gamma};
use serde::Serialize;

use crate::{DataError, Dataset, PartitionConfig, PartitionKind, SplitKind};

mod merge;
mod paper;

pub use merge::prepare;

/// One client's data: indices into the dataset's splits.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ClientSplit {
    /// Training samples (indices into `dataset.train`), ascending.
    pub train: Vec<usize>,
    /// Validation samples (indices into `dataset.train`, disjoint from
    /// `train`), ascending.
    pub val: Vec<usize>,
    /// Test samples (indices into `dataset.test`), ascending.
    pub test: Vec<usize>,
}

/// The result of [`partition`]: one [`ClientSplit`] per client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Partition {
    /// One entry per client, in client order.
    pub clients: Vec<ClientSplit>,
    /// The dataset's number of classes.
    pub num_classes: usize,
    /// `groups`: the group of each client; `pathological`: the label group
    /// of each client; `None` for the other kinds.
    pub group_of: Option<Vec<usize>>,
}

/// Per-client label counts of a partition (written to `partition.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PartitionReport {
    /// Number of classes (the length of every count vector).
    pub num_classes: usize,
    /// One entry per client.
    pub clients: Vec<ClientLabelCounts>,
}

/// How many samples of each class one client holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ClientLabelCounts {
    /// Training samples per class.
    pub train: Vec<usize>,
    /// Validation samples per class.
    pub val: Vec<usize>,
    /// Test samples per class.
    pub test: Vec<usize>,
    /// Samples in train, validation and test (also for forecasting data,
    /// whose per-class counts are empty).
    pub samples: [usize; 3],
}

impl Partition {
    /// Counts each client's labels in train, validation and test.
    ///
    /// # Panics
    /// If the partition was not made from `ds` (an index out of range).
    pub fn label_counts(&self, ds: &Dataset) -> PartitionReport {
        // Forecasting splits have no labels: every count list is empty.
        let count = |idx: &[usize], labels: &[u32]| {
            let mut c = vec![0usize; self.num_classes];
            for &i in idx.iter().filter(|&&i| i < labels.len()) {
                c[labels[i] as usize] += 1;
            }
            c
        };
        PartitionReport {
            num_classes: self.num_classes,
            clients: self
                .clients
                .iter()
                .map(|cl| ClientLabelCounts {
                    train: count(&cl.train, &ds.train.labels),
                    val: count(&cl.val, &ds.train.labels),
                    test: count(&cl.test, &ds.test.labels),
                    samples: [cl.train.len(), cl.val.len(), cl.test.len()],
                })
                .collect(),
        }
    }

    /// Each client's share `n_i` of the training pool (train + validation),
    /// the weight used for aggregation.
    pub fn train_sizes(&self) -> Vec<usize> {
        self.clients
            .iter()
            .map(|c| c.train.len() + c.val.len())
            .collect()
    }
}

/// The partition kinds [`partition`] knows, with a one-line description each.
pub fn partition_kinds() -> &'static [(&'static str, &'static str)] {
    &[
        ("iid", "random permutation cut into near-equal parts"),
        (
            "dirichlet",
            "per-class Dirichlet(beta) proportions with the balance trick; at least min_samples per client",
        ),
        (
            "pathological",
            "pFedGraph label skew: labels in groups of classes_per_client, client i gets group i mod G",
        ),
        (
            "shards",
            "sort by label, cut clients*shards_per_client shards, shards_per_client random shards each",
        ),
        (
            "groups",
            "FedDWA practical 1 as its code runs: client groups; dominant_fraction of each class \
             goes to its owning group (see feddwa_groups for the paper's setting)",
        ),
        (
            "natural",
            "the dataset's own clients (synthetic: one per generated device)",
        ),
        (
            "feddwa_groups",
            "FedDWA practical 1 as the paper states it: equal groups, dominant_classes per group, \
             dominant_fraction of every client from them, the same size for every client",
        ),
        (
            "dpfl_patho",
            "DPFL Patho(k): classes_per_client random classes per client, each class spread over \
             its holders by Dirichlet(within_class_beta), at least min_samples each",
        ),
        (
            "pfllib_pat",
            "PFLlib pat: classes in order to the clients with class slots left, balance or random \
             counts",
        ),
        (
            "pfllib_dir",
            "PFLlib dir: Dirichlet(beta) with the balance trick, redrawn until least_samples each",
        ),
        (
            "pfllib_exdir",
            "PFLlib exdir: classes_per_client random classes per client, Dirichlet(beta) over \
             each class's holders",
        ),
    ]
}

/// Splits `ds.train` across `clients` clients as `cfg` says, then gives each
/// a validation split and a test set (see the module documentation).
///
/// Errors name the configuration key when the settings are invalid or
/// impossible for this dataset. `partition.split = "merged"` is rejected
/// here (its test indices cannot index `ds.test`): use [`crate::prepare`],
/// which handles both splits.
pub fn partition(
    ds: &Dataset,
    cfg: &PartitionConfig,
    clients: usize,
    seed: u64,
) -> Result<Partition, DataError> {
    cfg.validate(clients)?;
    if cfg.split == SplitKind::Merged {
        return Err(DataError::config(
            "partition.split",
            "split = \"merged\" rebuilds the dataset (its test indices point into the merged \
             pool): call fedweave_data::prepare(dataset, &cfg, clients, seed) instead of \
             partition()",
        ));
    }
    if ds.task != crate::Task::Classification {
        return forecasting_partition(ds, cfg, clients);
    }
    // A process that hosts none of the per-client files (a server) holds
    // no sample at all; it partitions the clients' (remote) shares anyway.
    let all_remote = ds
        .natural_clients
        .as_ref()
        .is_some_and(|nat| nat.iter().all(|c| c.remote));
    if ds.train.is_empty() && !all_remote {
        return Err(DataError::config(
            "data.dataset",
            format!("the training split of {} is empty", ds.name),
        ));
    }
    if let Some(&y) = ds
        .train
        .labels
        .iter()
        .chain(&ds.test.labels)
        .find(|&&y| y as usize >= ds.num_classes)
    {
        return Err(DataError::config(
            "data.dataset",
            format!("{} has label {y} but {} classes", ds.name, ds.num_classes),
        ));
    }
    let mut rng = rng_stream(seed, 0, u64::MAX, Purpose::Partition);
    let mut group_of = None;
    let mut natural_test = None;
    let shares = if cfg.kind == PartitionKind::Natural {
        let (train, test) = natural(ds, clients)?;
        natural_test = Some(test);
        train
    } else {
        let (s, g) = label_shares(&ds.train.labels, ds.num_classes, cfg, clients, &mut rng)?;
        group_of = g;
        s
    };

    let need = if cfg.val_fraction > 0.0 { 2 } else { 1 };
    let remote = |i: usize| {
        ds.natural_clients
            .as_ref()
            .is_some_and(|nat| nat.get(i).is_some_and(|c| c.remote))
    };
    if let Some((i, s)) = shares
        .iter()
        .enumerate()
        .find(|&(i, s)| s.len() < need && !remote(i))
    {
        return Err(DataError::config(
            "clients",
            format!(
                "partition.kind = {} with {clients} clients leaves client {i} with {} training \
                 sample(s) of {} (need at least {need}); use fewer clients or another partition",
                cfg.kind,
                s.len(),
                ds.train.len()
            ),
        ));
    }

    let tests = match natural_test {
        Some(t) => t,
        None => test_split(ds, &shares, seed),
    };
    let clients_out = shares
        .into_iter()
        .zip(tests)
        .enumerate()
        .map(|(i, (mut share, mut test))| {
            let mut r = rng_stream(seed, 0, i as u64, Purpose::ValidationSplit);
            share.shuffle(&mut r);
            let n = share.len();
            let n_val = if cfg.val_fraction > 0.0 && n > 0 {
                ((cfg.val_fraction * n as f64).round() as usize).clamp(1, n - 1)
            } else {
                0
            };
            let mut val = share.split_off(n - n_val);
            share.sort_unstable();
            val.sort_unstable();
            test.sort_unstable();
            ClientSplit {
                train: share,
                val,
                test,
            }
        })
        .collect();
    Ok(Partition {
        clients: clients_out,
        num_classes: ds.num_classes,
        group_of,
    })
}

/// Per-client shares of a labelled pool (indices into `labels`) and, for
/// the grouped kinds, each client's group. Every kind but `natural`.
pub(crate) fn label_shares(
    labels: &[u32],
    num_classes: usize,
    cfg: &PartitionConfig,
    clients: usize,
    rng: &mut RngStream,
) -> Result<(Shares, Option<Vec<usize>>), DataError> {
    let (mut shares, groups) = uncapped_shares(labels, num_classes, cfg, clients, rng)?;
    if let Some(cap) = cfg.samples_per_client
        && cfg.kind != PartitionKind::FeddwaGroups
    {
        for share in shares.iter_mut().filter(|s| s.len() > cap) {
            share.shuffle(rng);
            share.truncate(cap);
            share.sort_unstable();
        }
    }
    Ok((shares, groups))
}

/// [`label_shares`] before `samples_per_client` caps them.
fn uncapped_shares(
    labels: &[u32],
    num_classes: usize,
    cfg: &PartitionConfig,
    clients: usize,
    rng: &mut RngStream,
) -> Result<(Shares, Option<Vec<usize>>), DataError> {
    let by_class = by_class(labels, num_classes);
    let n = labels.len();
    // PFLlib's least_samples: int(min(batch_size / (1 - train_ratio), N / clients / 2)).
    let pfllib_least = || {
        cfg.least_samples.unwrap_or_else(|| {
            (10.0 / cfg.test_fraction).min(n as f64 / clients as f64 / 2.0) as usize
        })
    };
    Ok(match cfg.kind {
        PartitionKind::Iid => (iid(n, clients, rng)?, None),
        PartitionKind::Dirichlet => (
            dirichlet(
                &by_class,
                cfg,
                cfg.min_samples,
                "partition.min_samples",
                clients,
                rng,
            )?,
            None,
        ),
        PartitionKind::PfllibDir => (
            dirichlet(
                &by_class,
                cfg,
                pfllib_least(),
                "partition.least_samples",
                clients,
                rng,
            )?,
            None,
        ),
        PartitionKind::Pathological => {
            let (s, g) = pathological(&by_class, cfg.classes_per_client, clients, rng)?;
            (s, Some(g))
        }
        PartitionKind::Shards => (
            shards(&by_class, cfg.shards_per_client, clients, rng)?,
            None,
        ),
        PartitionKind::Groups => {
            let (s, g) = groups(&by_class, cfg, clients, rng)?;
            (s, Some(g))
        }
        PartitionKind::FeddwaGroups => {
            let (s, g) = paper::feddwa_groups(&by_class, cfg, clients, rng)?;
            (s, Some(g))
        }
        PartitionKind::DpflPatho => (paper::dpfl_patho(&by_class, cfg, clients, rng)?, None),
        PartitionKind::PfllibPat => (
            paper::pfllib_pat(&by_class, cfg, clients, pfllib_least(), rng)?,
            None,
        ),
        PartitionKind::PfllibExdir => (
            paper::pfllib_exdir(
                &by_class,
                cfg,
                clients,
                cfg.least_samples.unwrap_or(10),
                rng,
            )?,
            None,
        ),
        PartitionKind::Natural => {
            return Err(DataError::config(
                "partition.kind",
                "natural clients come with the dataset, not from its labels",
            ));
        }
    })
}

/// Training indices of each class, ascending.
pub(crate) fn by_class(labels: &[u32], classes: usize) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(); classes];
    for (i, &y) in labels.iter().enumerate() {
        out[y as usize].push(i);
    }
    out
}

/// Start of part `p` when `n` items are cut into `parts` near-equal parts.
pub(crate) fn bound(p: usize, n: usize, parts: usize) -> usize {
    (p as u128 * n as u128 / parts as u128) as usize
}

fn iid(n: usize, clients: usize, rng: &mut RngStream) -> Result<Vec<Vec<usize>>, DataError> {
    if clients > n {
        return Err(DataError::config(
            "clients",
            format!("{clients} clients exceed the {n} training samples"),
        ));
    }
    let mut perm: Vec<usize> = (0..n).collect();
    perm.shuffle(rng);
    Ok((0..clients)
        .map(|i| perm[bound(i, n, clients)..bound(i + 1, n, clients)].to_vec())
        .collect())
}

fn dirichlet(
    by_class: &[Vec<usize>],
    cfg: &PartitionConfig,
    min_samples: usize,
    key: &str,
    clients: usize,
    rng: &mut RngStream,
) -> Result<Vec<Vec<usize>>, DataError> {
    let total: usize = by_class.iter().map(Vec::len).sum();
    let name = key.trim_start_matches("partition.");
    match min_samples.checked_mul(clients) {
        Some(need) if need <= total => {}
        _ => {
            return Err(DataError::config(
                key,
                format!(
                    "{name} = {min_samples} for each of {clients} clients needs {} samples but the \
                     pool has {total}; lower {key} (at most {}) or use fewer clients",
                    min_samples.saturating_mul(clients),
                    total / clients
                ),
            ));
        }
    }
    let gamma = Gamma::new(cfg.beta, 1.0).map_err(|e| {
        DataError::config(
            "partition.beta",
            format!("{} is not a valid concentration: {e}", cfg.beta),
        )
    })?;
    let cap = total as f64 / clients as f64;
    let mut smallest = 0;
    for _ in 0..cfg.max_retries {
        let mut shares: Vec<Vec<usize>> = vec![Vec::new(); clients];
        for class in by_class {
            let mut idx = class.clone();
            idx.shuffle(rng);
            let mut p: Vec<f64> = (0..clients).map(|_| gamma.sample(rng)).collect();
            // Balance trick: clients already holding their fair share get no more.
            for (pj, s) in p.iter_mut().zip(&shares) {
                if s.len() as f64 >= cap {
                    *pj = 0.0;
                }
            }
            let sum: f64 = p.iter().sum();
            if !(sum > 0.0 && sum.is_finite()) {
                // All draws underflowed (tiny beta): the limit puts the whole
                // class on one client, chosen uniformly among the open ones.
                let open: Vec<usize> = (0..clients)
                    .filter(|&j| (shares[j].len() as f64) < cap)
                    .collect();
                let pick = if open.is_empty() {
                    rng.random_range(0..clients)
                } else {
                    open[rng.random_range(0..open.len())]
                };
                p.iter_mut().for_each(|v| *v = 0.0);
                p[pick] = 1.0;
            }
            let sum: f64 = p.iter().sum();
            let len = idx.len();
            let mut start = 0;
            let mut cum = 0.0;
            for (j, pj) in p.iter().enumerate() {
                cum += pj / sum;
                let end = if j + 1 == clients {
                    len
                } else {
                    ((cum * len as f64) as usize).clamp(start, len)
                };
                shares[j].extend_from_slice(&idx[start..end]);
                start = end;
            }
        }
        smallest = shares.iter().map(Vec::len).min().unwrap_or(0);
        if smallest >= min_samples {
            return Ok(shares);
        }
    }
    Err(DataError::config(
        key,
        format!(
            "after {} Dirichlet draws (beta = {}) some client still had fewer than {name} = \
             {min_samples} samples (smallest in the last draw: {smallest}); lower {key}, \
             raise partition.beta or partition.max_retries, or use fewer clients",
            cfg.max_retries, cfg.beta
        ),
    ))
}

fn pathological(
    by_class: &[Vec<usize>],
    k: usize,
    clients: usize,
    rng: &mut RngStream,
) -> Result<(Vec<Vec<usize>>, Vec<usize>), DataError> {
    let c = by_class.len();
    if k > c || !c.is_multiple_of(k) {
        return Err(DataError::config(
            "partition.classes_per_client",
            format!(
                "the dataset's {c} classes cannot be cut into groups of {k} consecutive labels \
                 (it must divide {c})"
            ),
        ));
    }
    let g_count = c / k;
    let group_of: Vec<usize> = (0..clients).map(|i| i % g_count).collect();
    let mut shares = vec![Vec::new(); clients];
    for (label, class) in by_class.iter().enumerate() {
        let g = label / k;
        // Clients of group g are g, g + G, g + 2G, …
        let members = if g < clients {
            (clients - g).div_ceil(g_count)
        } else {
            0
        };
        if members == 0 {
            continue;
        }
        let mut idx = class.clone();
        idx.shuffle(rng);
        let n = idx.len();
        for slot in 0..members {
            shares[g + slot * g_count]
                .extend_from_slice(&idx[bound(slot, n, members)..bound(slot + 1, n, members)]);
        }
    }
    Ok((shares, group_of))
}

fn shards(
    by_class: &[Vec<usize>],
    k: usize,
    clients: usize,
    rng: &mut RngStream,
) -> Result<Vec<Vec<usize>>, DataError> {
    let n: usize = by_class.iter().map(Vec::len).sum();
    let count = k.checked_mul(clients).filter(|&s| s <= n).ok_or_else(|| {
        DataError::config(
            "partition.shards_per_client",
            format!(
                "{clients} clients × {k} shards exceed the {n} training samples; lower \
                 partition.shards_per_client or use fewer clients"
            ),
        )
    })?;
    let mut sorted = Vec::with_capacity(n);
    for class in by_class {
        let mut idx = class.clone();
        idx.shuffle(rng);
        sorted.extend(idx);
    }
    let mut ids: Vec<usize> = (0..count).collect();
    ids.shuffle(rng);
    Ok((0..clients)
        .map(|i| {
            let mut s = Vec::new();
            for &id in &ids[i * k..(i + 1) * k] {
                s.extend_from_slice(&sorted[bound(id, n, count)..bound(id + 1, n, count)]);
            }
            s
        })
        .collect())
}

fn groups(
    by_class: &[Vec<usize>],
    cfg: &PartitionConfig,
    clients: usize,
    rng: &mut RngStream,
) -> Result<(Vec<Vec<usize>>, Vec<usize>), DataError> {
    let g_count = cfg.groups;
    let c = by_class.len();
    if g_count > c {
        return Err(DataError::config(
            "partition.groups",
            format!(
                "{g_count} groups exceed the dataset's {c} classes (each group needs a dominant class)"
            ),
        ));
    }
    let group_of: Vec<usize> = (0..clients).map(|i| i * g_count / clients).collect();
    let mut members = vec![Vec::new(); g_count];
    for (i, &g) in group_of.iter().enumerate() {
        members[g].push(i);
    }
    let all: Vec<usize> = (0..clients).collect();
    let mut shares = vec![Vec::new(); clients];
    let deal = |idx: &[usize], to: &[usize], rotate: usize, shares: &mut [Vec<usize>]| {
        let n = idx.len();
        let m = to.len();
        for p in 0..m {
            shares[to[(p + rotate) % m]]
                .extend_from_slice(&idx[bound(p, n, m)..bound(p + 1, n, m)]);
        }
    };
    for (label, class) in by_class.iter().enumerate() {
        let owner = label * g_count / c;
        let mut idx = class.clone();
        idx.shuffle(rng);
        let n_dom = ((cfg.dominant_fraction * idx.len() as f64).round() as usize).min(idx.len());
        deal(&idx[..n_dom], &members[owner], label, &mut shares);
        deal(&idx[n_dom..], &all, label, &mut shares);
    }
    Ok((shares, group_of))
}

/// Per-client lists of sample indices.
pub(crate) type Shares = Vec<Vec<usize>>;

/// Forecasting data comes with its clients (one per sensor) and their
/// chronological train / validation / test windows; nothing is drawn.
fn forecasting_partition(
    ds: &Dataset,
    cfg: &PartitionConfig,
    clients: usize,
) -> Result<Partition, DataError> {
    if cfg.kind != PartitionKind::Natural {
        return Err(DataError::config(
            "partition.kind",
            format!(
                "partition.kind must be \"natural\" for the forecasting dataset {}: each sensor is a client (got {})",
                ds.name, cfg.kind
            ),
        ));
    }
    let (train, test) = natural(ds, clients)?;
    let nat = ds.natural_clients.as_deref().unwrap_or_default();
    if nat
        .iter()
        .flat_map(|c| &c.val)
        .any(|&i| i >= ds.train.len())
    {
        return Err(DataError::config(
            "data.dataset",
            format!(
                "the natural clients of {} index samples that do not exist",
                ds.name
            ),
        ));
    }
    Ok(Partition {
        clients: train
            .into_iter()
            .zip(test)
            .zip(nat)
            .map(|((train, test), c)| ClientSplit {
                train,
                val: c.val.clone(),
                test,
            })
            .collect(),
        num_classes: 0,
        group_of: None,
    })
}

fn natural(ds: &Dataset, clients: usize) -> Result<(Shares, Shares), DataError> {
    let Some(nat) = &ds.natural_clients else {
        return Err(DataError::config(
            "partition.kind",
            format!(
                "dataset {} has no natural clients; choose another partition.kind (or data.dataset = \"synthetic\")",
                ds.name
            ),
        ));
    };
    if nat.len() != clients {
        let hint = if ds.name == "synthetic" {
            format!("; set data.synthetic.clients = {clients}")
        } else {
            String::new()
        };
        return Err(DataError::config(
            "clients",
            format!(
                "partition.kind = natural but dataset {} has {} natural clients and clients = {clients}{hint}",
                ds.name,
                nat.len()
            ),
        ));
    }
    let bad_train = nat
        .iter()
        .flat_map(|c| &c.train)
        .any(|&i| i >= ds.train.len());
    let bad_test = nat
        .iter()
        .flat_map(|c| &c.test)
        .any(|&i| i >= ds.test.len());
    if bad_train || bad_test {
        return Err(DataError::config(
            "data.dataset",
            format!(
                "the natural clients of {} index samples that do not exist",
                ds.name
            ),
        ));
    }
    Ok((
        nat.iter().map(|c| c.train.clone()).collect(),
        nat.iter().map(|c| c.test.clone()).collect(),
    ))
}

/// Test sets following each client's label distribution (module docs).
fn test_split(ds: &Dataset, shares: &[Vec<usize>], seed: u64) -> Vec<Vec<usize>> {
    let classes = ds.num_classes;
    let mut counts = vec![vec![0u128; classes]; shares.len()];
    for (cnt, share) in counts.iter_mut().zip(shares) {
        for &i in share {
            cnt[ds.train.labels[i] as usize] += 1;
        }
    }
    let mut rng = rng_stream(seed, 1, u64::MAX, Purpose::Partition);
    let mut out = vec![Vec::new(); shares.len()];
    for (c, mut pool) in by_class(&ds.test.labels, classes).into_iter().enumerate() {
        pool.shuffle(&mut rng);
        let total: u128 = counts.iter().map(|cnt| cnt[c]).sum();
        if total == 0 {
            continue;
        }
        let len = pool.len() as u128;
        let round_bound = |cum: u128| ((2 * cum * len + total) / (2 * total)) as usize;
        let mut cum = 0u128;
        let mut start = 0usize;
        for (dst, cnt) in out.iter_mut().zip(&counts) {
            cum += cnt[c];
            let end = round_bound(cum);
            dst.extend_from_slice(&pool[start..end]);
            start = end;
        }
    }
    out
}
