//! MovieLens-100K: a `u.data` fixture in GroupLens' tab-separated layout,
//! the chronological per-user split, the rating scale, natural clients and
//! bad lines.

use std::fmt::Write as _;
use std::path::Path;

use fedweave_data::{
    DataConfig, InputKind, PartitionConfig, PartitionKind, Task, load_dataset, partition,
};

/// (user, item, rating, timestamp) rows, deliberately not in time order.
fn rows() -> Vec<(u32, u32, u32, u64)> {
    let mut v = Vec::new();
    // User 1: 10 ratings, times 100..1000 descending in file order.
    for k in 0..10u32 {
        v.push((1, 20 - k, 1 + k % 5, 1000 - 100 * u64::from(k)));
    }
    // User 3: 5 ratings.
    for k in 0..5u32 {
        v.push((3, 7 + k, 5 - k % 5, 500 + u64::from(k)));
    }
    // User 2: 4 ratings with a tie on time (broken by item id).
    v.extend([(2, 9, 4, 50), (2, 3, 2, 50), (2, 1, 3, 10), (2, 30, 5, 90)]);
    v
}

fn u_data(rows: &[(u32, u32, u32, u64)]) -> String {
    let mut s = String::new();
    for (u, i, r, t) in rows {
        writeln!(s, "{u}\t{i}\t{r}\t{t}").unwrap();
    }
    s
}

fn fixture(root: &Path) {
    let dir = root.join("ml-100k");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("u.data"), u_data(&rows())).unwrap();
}

fn cfg(path: &Path, normalize: bool) -> DataConfig {
    DataConfig {
        dataset: "movielens-100k".into(),
        path: Some(path.to_path_buf()),
        normalize,
        ..DataConfig::default()
    }
}

#[test]
fn ratings_split_per_user_by_time() {
    let root = tempfile::tempdir().unwrap();
    fixture(root.path());
    let ds = load_dataset(&cfg(root.path(), false), 0).unwrap();
    assert_eq!(
        ds,
        load_dataset(&cfg(&root.path().join("ml-100k"), false), 0).unwrap()
    );
    assert_eq!(ds.task, Task::Regression { targets: 1 });
    assert_eq!(ds.feature_shape, vec![2]);
    assert_eq!(
        ds.input,
        InputKind::Categorical {
            cardinalities: vec![3, 30]
        }
    );
    assert_eq!(ds.num_classes, 0);
    let clients = ds.natural_clients.clone().unwrap();
    assert_eq!(clients.len(), 3);
    // User 1: n = 10 → 7 train, 1 val, 2 test; oldest first (k = 9, 8, ...).
    assert_eq!(clients[0].train, (0..7).collect::<Vec<_>>());
    assert_eq!(clients[0].val, vec![7]);
    assert_eq!(clients[0].test, vec![0, 1]);
    assert_eq!(ds.train.row(0, 2), &[0.0, 10.0]); // k = 9: item 11
    assert_eq!(ds.train.targets[0], 5.0); // 1 + 9 % 5
    assert_eq!(ds.test.row(1, 2), &[0.0, 19.0]); // newest: k = 0, item 20
    assert_eq!(ds.test.targets[1], 1.0);
    // User 2 (4 ratings: 2 train, 1 val, 1 test), time tie broken by item.
    assert_eq!(clients[1].train, vec![8, 9]);
    assert_eq!(clients[1].val, vec![10]);
    assert_eq!(ds.train.row(9, 2), &[1.0, 2.0]);
    assert_eq!(ds.train.row(10, 2), &[1.0, 8.0]);
    assert_eq!(ds.test.row(clients[1].test[0], 2), &[1.0, 29.0]);
    // User 3: 5 ratings → 3 train, 1 val, 1 test.
    assert_eq!(clients[2].train.len(), 3);
    assert_eq!(ds.train.len(), 7 + 1 + 2 + 1 + 3 + 1);
    assert_eq!(ds.test.len(), 2 + 1 + 1);
    let scales = ds.target_scales.clone().unwrap();
    assert_eq!(scales.len(), 3);
    assert_eq!((scales[0].mean, scales[0].std), (0.0, 1.0));
    // partition.kind = natural takes the clients with their validation block.
    let p = partition(
        &ds,
        &PartitionConfig {
            kind: PartitionKind::Natural,
            ..PartitionConfig::default()
        },
        3,
        0,
    )
    .unwrap();
    assert_eq!(p.clients[0].val, vec![7]);
    assert_eq!(p.clients[2].test, vec![3]);
}

#[test]
fn normalised_ratings_use_the_training_statistics() {
    let root = tempfile::tempdir().unwrap();
    fixture(root.path());
    let raw = load_dataset(&cfg(root.path(), false), 0).unwrap();
    let ds = load_dataset(&cfg(root.path(), true), 0).unwrap();
    let clients = raw.natural_clients.unwrap();
    let fit: Vec<f64> = clients
        .iter()
        .flat_map(|c| c.train.iter().map(|&i| f64::from(raw.train.targets[i])))
        .collect();
    let mean = fit.iter().sum::<f64>() / fit.len() as f64;
    let std = (fit.iter().map(|t| (t - mean).powi(2)).sum::<f64>() / fit.len() as f64).sqrt();
    let s = ds.target_scales.unwrap()[1];
    assert!((f64::from(s.mean) - mean).abs() < 1e-5 && (f64::from(s.std) - std).abs() < 1e-5);
    for (z, x) in ds.test.targets.iter().zip(&raw.test.targets) {
        assert!((z * s.std + s.mean - x).abs() < 1e-5);
    }
}

#[test]
fn data_users_and_subsampling() {
    let root = tempfile::tempdir().unwrap();
    fixture(root.path());
    let mut c = cfg(root.path(), true);
    c.users = Some(2);
    let ds = load_dataset(&c, 0).unwrap();
    assert_eq!(ds.natural_clients.unwrap().len(), 2);
    assert_eq!(ds.train.len(), 8 + 3);
    c.users = Some(4);
    let e = load_dataset(&c, 0).unwrap_err().to_string();
    assert!(e.contains("data.users") && e.contains("3 users"), "{e}");
    c.dataset = "cifar10".into();
    let e = load_dataset(&c, 0).unwrap_err().to_string();
    assert!(e.contains("data.users") && e.contains("cifar10"), "{e}");
    c.dataset = "movielens-100k".into();
    c.users = None;
    c.max_train_samples = Some(5);
    let e = load_dataset(&c, 0).unwrap_err().to_string();
    assert!(e.contains("data.max_train_samples"), "{e}");
}

#[test]
fn bad_files_are_named() {
    let check = |content: &str, expect: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("u.data"), content).unwrap();
        let e = load_dataset(&cfg(dir.path(), true), 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("u.data"), "{e}");
        for s in expect {
            assert!(e.contains(s), "{s:?} missing: {e}");
        }
    };
    let good = u_data(&rows());
    check(&good[..good.len() - 5], &["line 19"]);
    check(
        &good.replacen("1\t20\t1", "1\t20", 1),
        &["line 1", "4 tab-separated"],
    );
    check(&good.replacen("1\t20\t1", "1\t20\t9", 1), &["rating \"9\""]);
    check(
        &good.replacen("1\t20\t1", "0\t20\t1", 1),
        &["user id \"0\""],
    );
    check("", &["no rating"]);
    check("1\t2\t3\t4\n1\t3\t3\t5\n", &["user 1", "at least 3"]);
    let dir = tempfile::tempdir().unwrap();
    let e = load_dataset(&cfg(dir.path(), true), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("u.data"), "{e}");
}
