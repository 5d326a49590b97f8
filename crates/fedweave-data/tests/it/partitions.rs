//! Partition invariants on the bundled digits.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use fedweave_data::{
    DataConfig, Dataset, Partition, PartitionConfig, PartitionKind, load_dataset, partition,
};
use proptest::prelude::*;

static DIGITS: LazyLock<Dataset> =
    LazyLock::new(|| load_dataset(&DataConfig::default(), 0).expect("bundled digits load"));

fn cfg(kind: PartitionKind) -> PartitionConfig {
    PartitionConfig {
        kind,
        ..PartitionConfig::default()
    }
}

/// Disjointness of train/val/test and, when `exact`, full coverage of train.
fn check_indices(ds: &Dataset, p: &Partition, exact: bool) {
    let mut seen_train = vec![false; ds.train.len()];
    let mut seen_test = vec![false; ds.test.len()];
    for (i, c) in p.clients.iter().enumerate() {
        assert!(!c.train.is_empty(), "client {i} has no train");
        assert!(!c.val.is_empty(), "client {i} has no val");
        let t: BTreeSet<_> = c.train.iter().collect();
        assert!(
            c.val.iter().all(|v| !t.contains(v)),
            "client {i}: val ∩ train"
        );
        for &j in c.train.iter().chain(&c.val) {
            assert!(!seen_train[j], "train sample {j} given twice (client {i})");
            seen_train[j] = true;
        }
        for &j in &c.test {
            assert!(!seen_test[j], "test sample {j} given twice (client {i})");
            seen_test[j] = true;
        }
    }
    if exact {
        let missing = seen_train.iter().filter(|&&s| !s).count();
        assert_eq!(missing, 0, "{missing} training samples unassigned");
    }
}

fn label_set(ds: &Dataset, idx: &[usize], test: bool) -> BTreeSet<u32> {
    let labels = if test {
        &ds.test.labels
    } else {
        &ds.train.labels
    };
    idx.iter().map(|&i| labels[i]).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, .. ProptestConfig::default() })]

    #[test]
    fn every_kind_assigns_each_sample_at_most_once(seed in any::<u64>(), clients in 1usize..=24) {
        let ds = &*DIGITS;
        for kind in [PartitionKind::Iid, PartitionKind::Dirichlet, PartitionKind::Pathological,
                     PartitionKind::Shards, PartitionKind::Groups] {
            let mut c = cfg(kind);
            c.groups = c.groups.min(clients);
            c.min_samples = 5;
            let p = partition(ds, &c, clients, seed).unwrap();
            prop_assert_eq!(p.clients.len(), clients);
            // Pathological with fewer clients than label groups leaves labels out.
            let exact = kind != PartitionKind::Pathological || clients >= 5;
            check_indices(ds, &p, exact);
            let sizes = p.train_sizes();
            for (s, c) in sizes.iter().zip(&p.clients) {
                prop_assert_eq!(*s, c.train.len() + c.val.len());
                // Validation is 20 % of the share, rounded, at least 1.
                let want = ((0.2 * *s as f64).round() as usize).clamp(1, s - 1);
                prop_assert_eq!(c.val.len(), want);
            }
            // Same seed, same partition.
            prop_assert_eq!(&p, &partition(ds, &c, clients, seed).unwrap());
        }
    }

    #[test]
    fn iid_parts_are_near_equal(seed in any::<u64>(), clients in 1usize..=40) {
        let p = partition(&DIGITS, &cfg(PartitionKind::Iid), clients, seed).unwrap();
        let sizes = p.train_sizes();
        let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        prop_assert!(hi - lo <= 1, "sizes {:?}", sizes);
        prop_assert_eq!(sizes.iter().sum::<usize>(), DIGITS.train.len());
    }

    #[test]
    fn pathological_ten_clients_pair_up(seed in any::<u64>()) {
        let ds = &*DIGITS;
        let p = partition(ds, &cfg(PartitionKind::Pathological), 10, seed).unwrap();
        prop_assert_eq!(p.group_of.as_ref().unwrap(), &(0..10).map(|i| i % 5).collect::<Vec<_>>());
        for i in 0..10 {
            let want: BTreeSet<u32> = [2 * (i % 5) as u32, 2 * (i % 5) as u32 + 1].into();
            let c = &p.clients[i];
            let share: Vec<usize> = c.train.iter().chain(&c.val).copied().collect();
            prop_assert_eq!(&label_set(ds, &share, false), &want, "client {} train", i);
            prop_assert_eq!(&label_set(ds, &c.train, false), &want, "client {} train", i);
            prop_assert_eq!(&label_set(ds, &c.test, true), &want, "client {} test", i);
        }
        for i in 0..5 {
            let a: BTreeSet<usize> = p.clients[i].train.iter().chain(&p.clients[i].val).copied().collect();
            let b: BTreeSet<usize> = p.clients[i + 5].train.iter().chain(&p.clients[i + 5].val).copied().collect();
            prop_assert!(a.is_disjoint(&b));
            // Disjoint halves of each label: sizes differ by at most one per label.
            let (na, nb) = (a.len() as i64, b.len() as i64);
            prop_assert!((na - nb).abs() <= 2, "{} vs {}", na, nb);
            prop_assert_eq!(a.len() + b.len(),
                ds.train.labels.iter().filter(|&&y| y / 2 == i as u32).count());
        }
        check_indices(ds, &p, true);
    }

    #[test]
    fn test_sets_follow_train_distribution(seed in any::<u64>(), clients in 2usize..=12) {
        let ds = &*DIGITS;
        for kind in [PartitionKind::Pathological, PartitionKind::Dirichlet, PartitionKind::Groups] {
            let mut c = cfg(kind);
            c.groups = c.groups.min(clients);
            c.beta = 0.5;
            let p = partition(ds, &c, clients, seed).unwrap();
            let r = p.label_counts(ds);
            for (i, cc) in r.clients.iter().enumerate() {
                let n_test: usize = cc.test.iter().sum();
                let n_share: usize = cc.train.iter().zip(&cc.val).map(|(a, b)| a + b).sum();
                if n_test < 30 {
                    continue;
                }
                let tv: f64 = (0..10)
                    .map(|k| {
                        let q = (cc.train[k] + cc.val[k]) as f64 / n_share as f64;
                        let t = cc.test[k] as f64 / n_test as f64;
                        (q - t).abs()
                    })
                    .sum::<f64>()
                    / 2.0;
                prop_assert!(tv < 0.15, "{:?} client {}: TV {}", kind, i, tv);
                // No test sample of a class the client never trained on.
                for k in 0..10 {
                    if cc.train[k] + cc.val[k] == 0 {
                        prop_assert_eq!(cc.test[k], 0);
                    }
                }
            }
        }
    }

    #[test]
    fn groups_hold_their_dominant_classes(seed in any::<u64>(), clients in prop::sample::select(vec![4usize, 8, 10, 12, 16, 20])) {
        let ds = &*DIGITS;
        let c = cfg(PartitionKind::Groups);
        let p = partition(ds, &c, clients, seed).unwrap();
        let groups = p.group_of.as_ref().unwrap();
        let r = p.label_counts(ds);
        for (i, cc) in r.clients.iter().enumerate() {
            let g = groups[i];
            prop_assert_eq!(g, i * 4 / clients);
            let dom = |k: usize| k * 4 / 10 == g;
            let total: usize = (0..10).map(|k| cc.train[k] + cc.val[k]).sum();
            let inside: usize = (0..10).filter(|&k| dom(k)).map(|k| cc.train[k] + cc.val[k]).sum();
            let frac = inside as f64 / total as f64;
            prop_assert!(frac >= c.dominant_fraction - 0.05, "client {} (group {}): {}", i, g, frac);
        }
        check_indices(ds, &p, true);
    }

    #[test]
    fn shards_give_few_labels(seed in any::<u64>(), clients in 5usize..=30) {
        let ds = &*DIGITS;
        let p = partition(ds, &cfg(PartitionKind::Shards), clients, seed).unwrap();
        let n = ds.train.len();
        for c in &p.clients {
            let share: Vec<usize> = c.train.iter().chain(&c.val).copied().collect();
            // Two shards of near-equal size, each spanning at most 2 labels
            // while shards are smaller than a class.
            let s = share.len();
            let shard = n / (2 * clients);
            prop_assert!(s >= 2 * shard && s <= 2 * (shard + 1), "size {}", s);
            if shard < 130 {
                prop_assert!(label_set(ds, &share, false).len() <= 4);
            }
        }
        check_indices(ds, &p, true);
    }
}

#[test]
fn dirichlet_impossible_min_samples_is_an_error() {
    let mut c = cfg(PartitionKind::Dirichlet);
    c.min_samples = 1000;
    let e = partition(&DIGITS, &c, 10, 1).unwrap_err().to_string();
    assert!(e.contains("min_samples"), "{e}");
    assert!(e.contains("partition.min_samples"), "{e}");
    // Feasible in total but unreachable by Dirichlet draws at this beta.
    c.min_samples = 130;
    c.beta = 0.01;
    c.max_retries = 20;
    let e = partition(&DIGITS, &c, 10, 1).unwrap_err().to_string();
    assert!(
        e.contains("min_samples") && e.contains("20 Dirichlet draws"),
        "{e}"
    );
}

#[test]
fn dirichlet_is_skewed_and_respects_min_samples() {
    let mut c = cfg(PartitionKind::Dirichlet);
    c.min_samples = 20;
    let p = partition(&DIGITS, &c, 10, 7).unwrap();
    let sizes = p.train_sizes();
    assert!(sizes.iter().all(|&s| s >= 20), "{sizes:?}");
    assert_eq!(sizes.iter().sum::<usize>(), DIGITS.train.len());
    // beta = 0.1: most clients are dominated by few classes.
    let r = p.label_counts(&DIGITS);
    let skewed = r
        .clients
        .iter()
        .filter(|cc| {
            let tot: usize = cc.train.iter().sum();
            let max = *cc.train.iter().max().unwrap();
            max as f64 > 0.4 * tot as f64
        })
        .count();
    assert!(skewed >= 6, "only {skewed} skewed clients");
}

#[test]
fn different_seeds_give_different_partitions() {
    for kind in [
        PartitionKind::Iid,
        PartitionKind::Dirichlet,
        PartitionKind::Pathological,
        PartitionKind::Shards,
        PartitionKind::Groups,
    ] {
        let a = partition(&DIGITS, &cfg(kind), 10, 1).unwrap();
        let b = partition(&DIGITS, &cfg(kind), 10, 2).unwrap();
        assert_ne!(a, b, "{kind}");
    }
}

#[test]
fn impossible_settings_name_their_key() {
    let ds = &*DIGITS;
    let cases: Vec<(PartitionConfig, usize, &str)> = vec![
        (
            PartitionConfig {
                kind: PartitionKind::Pathological,
                classes_per_client: 3,
                ..Default::default()
            },
            10,
            "partition.classes_per_client",
        ),
        (
            PartitionConfig {
                kind: PartitionKind::Pathological,
                classes_per_client: 0,
                ..Default::default()
            },
            10,
            "partition.classes_per_client",
        ),
        (
            PartitionConfig {
                kind: PartitionKind::Groups,
                groups: 11,
                ..Default::default()
            },
            10,
            "partition.groups",
        ),
        (
            PartitionConfig {
                kind: PartitionKind::Groups,
                groups: 11,
                ..Default::default()
            },
            20,
            "partition.groups",
        ),
        (
            PartitionConfig {
                kind: PartitionKind::Groups,
                dominant_fraction: 1.5,
                ..Default::default()
            },
            10,
            "partition.dominant_fraction",
        ),
        (
            PartitionConfig {
                kind: PartitionKind::Shards,
                shards_per_client: 200,
                ..Default::default()
            },
            10,
            "partition.shards_per_client",
        ),
        (
            PartitionConfig {
                kind: PartitionKind::Dirichlet,
                beta: 0.0,
                ..Default::default()
            },
            10,
            "partition.beta",
        ),
        (
            PartitionConfig {
                val_fraction: 1.0,
                ..Default::default()
            },
            10,
            "partition.val_fraction",
        ),
        (PartitionConfig::default(), 0, "clients"),
        (PartitionConfig::default(), 1000, "clients"),
        (
            PartitionConfig {
                kind: PartitionKind::Natural,
                ..Default::default()
            },
            10,
            "partition.kind",
        ),
    ];
    for (c, n, key) in cases {
        let e = partition(ds, &c, n, 0).unwrap_err().to_string();
        assert!(e.contains(key), "{:?} with {n} clients: {e}", c.kind);
    }
}

#[test]
fn natural_partition_uses_the_synthetic_clients() {
    let dc = DataConfig {
        dataset: "synthetic".into(),
        ..DataConfig::default()
    };
    let ds = load_dataset(&dc, 4).unwrap();
    let nat = ds.natural_clients.clone().unwrap();
    let p = partition(&ds, &cfg(PartitionKind::Natural), 10, 4).unwrap();
    check_indices(&ds, &p, true);
    for (c, n) in p.clients.iter().zip(&nat) {
        let mut share: Vec<usize> = c.train.iter().chain(&c.val).copied().collect();
        share.sort_unstable();
        assert_eq!(share, n.train);
        assert_eq!(c.test, n.test);
    }
    let e = partition(&ds, &cfg(PartitionKind::Natural), 12, 4)
        .unwrap_err()
        .to_string();
    assert!(e.contains("data.synthetic.clients = 12"), "{e}");
}

#[test]
fn pathological_with_fewer_clients_than_groups_and_report_json() {
    let ds = &*DIGITS;
    let p = partition(ds, &cfg(PartitionKind::Pathological), 3, 5).unwrap();
    check_indices(ds, &p, false);
    let r = p.label_counts(ds);
    for (i, cc) in r.clients.iter().enumerate() {
        // N = 3 < G = 5: client i owns all of labels 2i and 2i + 1.
        for k in 0..10 {
            let all = ds.train.labels.iter().filter(|&&y| y == k as u32).count();
            let want = if k / 2 == i { all } else { 0 };
            assert_eq!(cc.train[k] + cc.val[k], want, "client {i} class {k}");
            let all_test = ds.test.labels.iter().filter(|&&y| y == k as u32).count();
            assert_eq!(cc.test[k], if k / 2 == i { all_test } else { 0 });
        }
    }
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["num_classes"], 10);
    assert_eq!(json["clients"].as_array().unwrap().len(), 3);
    assert_eq!(json["clients"][0]["train"].as_array().unwrap().len(), 10);
    assert!(json["clients"][0]["val"].is_array() && json["clients"][0]["test"].is_array());
}

#[test]
fn zero_val_fraction_keeps_everything_for_training() {
    let c = PartitionConfig {
        val_fraction: 0.0,
        ..Default::default()
    };
    let p = partition(&DIGITS, &c, 10, 3).unwrap();
    assert!(p.clients.iter().all(|c| c.val.is_empty()));
    assert_eq!(
        p.clients.iter().map(|c| c.train.len()).sum::<usize>(),
        DIGITS.train.len()
    );
}
