//! `split = "merged"`: partitions over the union of a dataset's train and
//! test splits, and the dataset rebuilt so the engine's contract holds.

use fedweave_core::{Purpose, rng_stream};
use rand::seq::SliceRandom;

use crate::partition::label_shares;
use crate::{ClientSplit, DataError, Dataset, Partition, PartitionConfig, Split, SplitKind, Task};

/// The one call an engine makes after [`crate::load_dataset`]: the dataset
/// it trains on and its clients' splits.
///
/// - `split = "given"`: returns `ds` unchanged and
///   [`crate::partition`]`(&ds, cfg, clients, seed)`.
/// - `split = "merged"`: the pool is `ds.train` followed by `ds.test` (pool
///   index `p < ds.train.len()` is training sample `p`, the others are test
///   sample `p − ds.train.len()`). The kind's label partition splits the
///   pool (stream `rng_stream(seed, 0, u64::MAX, Purpose::Partition)`); then
///   client `i`'s share is shuffled with `rng_stream(seed, 0, i,
///   Purpose::ValidationSplit)`, its last `n − ⌊(1 − test_fraction)·n⌋`
///   samples (clamped so train keeps at least one sample, and validation
///   one when `val_fraction > 0`) are its test set; of the other `m`, the first
///   `⌊(1 − test_fraction)(1 − val_fraction)·n⌋` (clamped to `1..=m−1` when
///   `val_fraction > 0`) are train and the others validation. Train,
///   validation and test are thus each within one sample of their share of
///   `n` (e.g. FedAGHN's 70/10/20 with `test_fraction = 0.2`,
///   `val_fraction = 0.125`). The returned dataset's `train` split holds
///   exactly the samples in some client's train or
///   validation set and its `test` split exactly those in some client's test
///   set, each in pool order; pool samples no client got (only with kinds
///   that leave classes out) are dropped. Its `natural_clients` is `None`;
///   the partition's indices index these new splits, so `ClientSplit`'s
///   contract (train/val into `dataset.train`, test into `dataset.test`) is
///   unchanged. Rows are moved, not duplicated: the features are compacted
///   in place, peak memory is the dataset plus its new test split.
///
/// Errors as [`crate::partition`]; with `split = "merged"` also for
/// forecasting data and `kind = "natural"` (key `partition.split`).
pub fn prepare(
    ds: Dataset,
    cfg: &PartitionConfig,
    clients: usize,
    seed: u64,
) -> Result<(Dataset, Partition), DataError> {
    if cfg.split == SplitKind::Given {
        let p = crate::partition(&ds, cfg, clients, seed)?;
        return Ok((ds, p));
    }
    cfg.validate(clients)?;
    if ds.task != Task::Classification {
        return Err(DataError::config(
            "partition.split",
            format!(
                "split = \"merged\" needs a classification dataset; {} is for forecasting (use \
                 split = \"given\")",
                ds.name
            ),
        ));
    }
    let n_train = ds.train.len();
    let pool: Vec<u32> = ds
        .train
        .labels
        .iter()
        .chain(&ds.test.labels)
        .copied()
        .collect();
    if pool.is_empty() {
        return Err(DataError::config(
            "data.dataset",
            format!("{} has no samples", ds.name),
        ));
    }
    if let Some(&y) = pool.iter().find(|&&y| y as usize >= ds.num_classes) {
        return Err(DataError::config(
            "data.dataset",
            format!("{} has label {y} but {} classes", ds.name, ds.num_classes),
        ));
    }
    let mut rng = rng_stream(seed, 0, u64::MAX, Purpose::Partition);
    let (shares, group_of) = label_shares(&pool, ds.num_classes, cfg, clients, &mut rng)?;
    let need = if cfg.val_fraction > 0.0 { 3 } else { 2 };
    if let Some((i, s)) = shares.iter().enumerate().find(|(_, s)| s.len() < need) {
        return Err(DataError::config(
            "clients",
            format!(
                "partition.kind = {} with {clients} clients leaves client {i} with {} sample(s) \
                 of the merged pool of {} (need at least {need}: train, test{}); use fewer \
                 clients or another partition",
                cfg.kind,
                s.len(),
                pool.len(),
                if need == 3 { ", validation" } else { "" }
            ),
        ));
    }

    let pool_clients: Vec<ClientSplit> = shares
        .into_iter()
        .enumerate()
        .map(|(i, mut share)| {
            let mut r = rng_stream(seed, 0, i as u64, Purpose::ValidationSplit);
            share.shuffle(&mut r);
            let n = share.len();
            let keep = ((1.0 - cfg.test_fraction) * n as f64).floor() as usize;
            let n_test = (n - keep.min(n)).clamp(1, n + 1 - need);
            let mut test = share.split_off(n - n_test);
            let m = share.len();
            // train = ⌊(1 − test_fraction)(1 − val_fraction)·n⌋: with the
            // test count above, each part is within one sample of its share.
            let n_val = if cfg.val_fraction > 0.0 {
                let train = ((1.0 - cfg.test_fraction) * (1.0 - cfg.val_fraction) * n as f64)
                    .floor() as usize;
                m - train.clamp(1, m - 1)
            } else {
                0
            };
            let mut val = share.split_off(m - n_val);
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

    // Pool index → index in the new train / test split.
    let mut to_train = vec![usize::MAX; pool.len()];
    let mut to_test = vec![usize::MAX; pool.len()];
    for c in &pool_clients {
        for &p in c.train.iter().chain(&c.val) {
            to_train[p] = 0;
        }
        for &p in &c.test {
            to_test[p] = 0;
        }
    }
    for map in [&mut to_train, &mut to_test] {
        for (next, slot) in map.iter_mut().filter(|s| **s == 0).enumerate() {
            *slot = next;
        }
    }
    let remap = |idx: &[usize], map: &[usize]| idx.iter().map(|&p| map[p]).collect();
    let clients_out = pool_clients
        .iter()
        .map(|c| ClientSplit {
            train: remap(&c.train, &to_train),
            val: remap(&c.val, &to_train),
            test: remap(&c.test, &to_test),
        })
        .collect();

    let fl = ds.feature_len();
    let mut ds = ds;
    let train = std::mem::take(&mut ds.train);
    let test = std::mem::take(&mut ds.test);
    let in_train = |p: usize| to_train[p] != usize::MAX;
    let in_test = |p: usize| to_test[p] != usize::MAX;
    let row = |p: usize| -> (&[f32], u32) {
        if p < n_train {
            (train.row(p, fl), train.labels[p])
        } else {
            (test.row(p - n_train, fl), test.labels[p - n_train])
        }
    };
    // The new test split first (the smaller one), gathered from both.
    let mut new_test = Split::default();
    for p in (0..pool.len()).filter(|&p| in_test(p)) {
        let (x, y) = row(p);
        new_test.features.extend_from_slice(x);
        new_test.labels.push(y);
    }
    // The new train split: the old one compacted in place, then the test
    // samples that went to train or validation appended.
    let Split {
        mut features,
        mut labels,
        ..
    } = train;
    let mut w = 0;
    for p in 0..n_train {
        if in_train(p) {
            features.copy_within(p * fl..(p + 1) * fl, w * fl);
            labels[w] = labels[p];
            w += 1;
        }
    }
    features.truncate(w * fl);
    labels.truncate(w);
    for p in (n_train..pool.len()).filter(|&p| in_train(p)) {
        features.extend_from_slice(test.row(p - n_train, fl));
        labels.push(test.labels[p - n_train]);
    }
    drop(test);
    features.shrink_to_fit();
    labels.shrink_to_fit();
    let new_train = Split {
        features,
        labels,
        ..Split::default()
    };
    ds.train = new_train;
    ds.test = new_test;
    ds.natural_clients = None;
    let num_classes = ds.num_classes;
    Ok((
        ds,
        Partition {
            clients: clients_out,
            num_classes,
            group_of,
        },
    ))
}
