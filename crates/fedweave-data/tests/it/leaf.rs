//! LEAF FEMNIST and Shakespeare: JSON fixtures as LEAF's preprocessing
//! writes them (`json.dump` of users / num_samples / user_data), natural
//! clients, `data.users`, and bad files.

use std::path::Path;

use fedweave_data::{
    DataConfig, InputKind, PartitionConfig, PartitionKind, SHAKESPEARE_ALPHABET, load_dataset,
    partition,
};

/// A FEMNIST image: pixel j of sample (u, s) is ((u + s + j) mod 256) / 255.
fn image(u: usize, s: usize) -> Vec<f64> {
    (0..784)
        .map(|j| ((u + s + j) % 256) as f64 / 255.0)
        .collect()
}

fn floats(v: &[f64]) -> String {
    let parts: Vec<String> = v.iter().map(|x| format!("{x:?}")).collect();
    format!("[{}]", parts.join(", "))
}

/// One LEAF JSON file: users with (x, y) given as JSON snippets.
fn leaf_json(users: &[(&str, Vec<(String, String)>)]) -> String {
    let names: Vec<String> = users.iter().map(|(u, _)| format!("\"{u}\"")).collect();
    let counts: Vec<String> = users.iter().map(|(_, s)| s.len().to_string()).collect();
    let data: Vec<String> = users
        .iter()
        .map(|(u, samples)| {
            let xs: Vec<&str> = samples.iter().map(|(x, _)| x.as_str()).collect();
            let ys: Vec<&str> = samples.iter().map(|(_, y)| y.as_str()).collect();
            format!(
                "\"{u}\": {{\"x\": [{}], \"y\": [{}]}}",
                xs.join(", "),
                ys.join(", ")
            )
        })
        .collect();
    format!(
        "{{\"users\": [{}], \"num_samples\": [{}], \"user_data\": {{{}}}}}",
        names.join(", "),
        counts.join(", "),
        data.join(", ")
    )
}

fn femnist_user(u: usize, labels: &[u32]) -> Vec<(String, String)> {
    labels
        .iter()
        .enumerate()
        .map(|(s, y)| (floats(&image(u, s)), y.to_string()))
        .collect()
}

/// LEAF layout: data/femnist/data/{train,test}/*.json; users f0..f2 in
/// two train files (sorted by name), one test file.
fn femnist(root: &Path) -> std::path::PathBuf {
    let dir = root.join("femnist/data");
    std::fs::create_dir_all(dir.join("train")).unwrap();
    std::fs::create_dir_all(dir.join("test")).unwrap();
    let write = |p: &str, s: String| std::fs::write(dir.join(p), s).unwrap();
    write(
        "train/all_data_1_niid_0_keep_0_train_9.json",
        leaf_json(&[("f2", femnist_user(2, &[61, 0, 7]))]),
    );
    write(
        "train/all_data_0_niid_0_keep_0_train_9.json",
        leaf_json(&[
            ("f0", femnist_user(0, &[1, 2, 3])),
            ("f1", femnist_user(1, &[4, 5])),
        ]),
    );
    write(
        "test/all_data_0_niid_0_keep_0_test_9.json",
        leaf_json(&[
            ("f1", femnist_user(11, &[9])),
            ("f2", femnist_user(12, &[8, 6])),
            ("f0", femnist_user(10, &[10])),
        ]),
    );
    dir
}

fn cfg(dataset: &str, path: &Path) -> DataConfig {
    DataConfig {
        dataset: dataset.into(),
        path: Some(path.to_path_buf()),
        ..DataConfig::default()
    }
}

#[test]
fn femnist_users_become_natural_clients() {
    let root = tempfile::tempdir().unwrap();
    let dir = femnist(root.path());
    let ds = load_dataset(&cfg("femnist", &dir), 0).unwrap();
    // data.path may also be a parent of the train/ test/ folder.
    assert_eq!(ds, load_dataset(&cfg("femnist", root.path()), 0).unwrap());
    assert_eq!(ds.num_classes, 62);
    assert_eq!(ds.feature_shape, vec![1, 28, 28]);
    assert_eq!(ds.input, InputKind::Dense);
    // Files sorted by name: f0, f1 (file 0), then f2 (file 1).
    assert_eq!(ds.train.labels, vec![1, 2, 3, 4, 5, 61, 0, 7]);
    assert_eq!(ds.test.labels, vec![9, 8, 6, 10]);
    assert_eq!(ds.train.row(4, 784)[3], ((1 + 1 + 3) as f32) / 255.0);
    assert_eq!(ds.test.row(0, 784)[0], ((11) as f32) / 255.0);
    let clients = ds.natural_clients.clone().unwrap();
    assert_eq!(clients.len(), 3);
    assert_eq!(clients[0].train, vec![0, 1, 2]);
    assert_eq!(clients[1].train, vec![3, 4]);
    assert_eq!(clients[2].train, vec![5, 6, 7]);
    assert_eq!(clients[0].test, vec![3]);
    assert_eq!(clients[1].test, vec![0]);
    assert_eq!(clients[2].test, vec![1, 2]);
    // partition.kind = natural uses them as they are.
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
    assert_eq!(p.clients[2].test, vec![1, 2]);
    assert_eq!(p.clients[1].train.len() + p.clients[1].val.len(), 2);
}

#[test]
fn data_users_keeps_the_first_users_or_fails() {
    let root = tempfile::tempdir().unwrap();
    let dir = femnist(root.path());
    let mut c = cfg("femnist", &dir);
    c.users = Some(2);
    let ds = load_dataset(&c, 0).unwrap();
    assert_eq!(ds.natural_clients.as_ref().unwrap().len(), 2);
    assert_eq!(ds.train.labels, vec![1, 2, 3, 4, 5]);
    assert_eq!(ds.test.labels, vec![9, 10]);
    c.users = Some(4);
    let e = load_dataset(&c, 0).unwrap_err().to_string();
    assert!(
        e.contains("data.users") && e.contains("only 3 users"),
        "{e}"
    );
    c.users = Some(0);
    let e = load_dataset(&c, 0).unwrap_err().to_string();
    assert!(e.contains("data.users"), "{e}");
}

#[test]
fn femnist_bad_files_are_named() {
    let check = |file: &str, content: String, expect: &[&str]| {
        let root = tempfile::tempdir().unwrap();
        let dir = femnist(root.path());
        std::fs::write(dir.join(file), content).unwrap();
        let e = load_dataset(&cfg("femnist", &dir), 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains(file.rsplit('/').next().unwrap()), "{e}");
        for s in expect {
            assert!(e.contains(s), "{s:?} missing: {e}");
        }
    };
    let test_file = "test/all_data_0_niid_0_keep_0_test_9.json";
    let good = leaf_json(&[("f1", femnist_user(11, &[9]))]);
    check(
        test_file,
        good[..good.len() / 2].to_string(),
        &["truncated"],
    );
    check(
        test_file,
        leaf_json(&[("f1", vec![(floats(&[0.5; 783]), "1".into())])]),
        &["\"f1\"", "783 values"],
    );
    check(
        test_file,
        leaf_json(&[("f1", femnist_user(1, &[62]))]),
        &["label 62"],
    );
    check(
        test_file,
        good.replace("\"num_samples\": [1]", "\"num_samples\": [2]"),
        &["num_samples", "2"],
    );
    check(
        test_file,
        good.replace("\"users\": [\"f1\"]", "\"users\": [\"f9\"]"),
        &["\"f9\"", "user_data"],
    );
    let root = tempfile::tempdir().unwrap();
    let dir = femnist(root.path());
    std::fs::remove_dir_all(dir.join("test")).unwrap();
    let e = load_dataset(&cfg("femnist", &dir), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("test"), "{e}");
    let e = load_dataset(&cfg("femnist", &dir.join("nowhere")), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("nowhere") && e.contains("train"), "{e}");
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

#[test]
fn shakespeare_maps_characters_through_the_leaf_alphabet() {
    assert_eq!(SHAKESPEARE_ALPHABET.chars().count(), 80);
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    std::fs::create_dir_all(dir.join("train")).unwrap();
    std::fs::create_dir_all(dir.join("test")).unwrap();
    let line = "ROMEO: But soft, what light through yonder window breaks? It is the east, and Juliet is the sun.";
    let x = &line[..80];
    assert_eq!(x.chars().count(), 80);
    let line2 =
        "\n!\"&'(),-.0123456789:;>?[]}abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ";
    std::fs::write(
        dir.join("train/all_data_niid_0_keep_0_train_9.json"),
        leaf_json(&[
            (
                "THE_TRAGEDY_OF_ROMEO_AND_JULIET_ROMEO",
                vec![
                    (json_str(x), json_str("u")),
                    (json_str(line2), json_str("\n")),
                ],
            ),
            (
                "THE_TEMPEST_PROSPERO",
                vec![(json_str(x), json_str("}")), (json_str(x), json_str("A"))],
            ),
        ]),
    )
    .unwrap();
    std::fs::write(
        dir.join("test/all_data_niid_0_keep_0_test_9.json"),
        leaf_json(&[("THE_TEMPEST_PROSPERO", vec![(json_str(x), json_str(" "))])]),
    )
    .unwrap();
    let ds = load_dataset(&cfg("shakespeare", dir), 0).unwrap();
    assert_eq!(ds.num_classes, 80);
    assert_eq!(ds.feature_shape, vec![80]);
    assert_eq!(
        ds.input,
        InputKind::Tokens {
            vocab_size: 80,
            padded: false
        }
    );
    let idx = |c: char| SHAKESPEARE_ALPHABET.chars().position(|a| a == c).unwrap() as u32;
    assert_eq!(ds.train.labels, vec![idx('u'), 0, 79, idx('A')]);
    assert_eq!(ds.test.labels, vec![1]);
    let row: Vec<u32> = ds.train.row(0, 80).iter().map(|&v| v as u32).collect();
    let want: Vec<u32> = x.chars().map(idx).collect();
    assert_eq!(row, want);
    assert_eq!(ds.train.row(1, 80)[0], 0.0); // '\n' is id 0
    assert_eq!(ds.train.row(1, 80)[26], 79.0); // '}' is the last id
    let clients = ds.natural_clients.unwrap();
    assert_eq!(clients[0].train, vec![0, 1]);
    assert!(clients[0].test.is_empty());
    assert_eq!(clients[1].test, vec![0]);

    // An unknown character, a short sequence, a two-character target.
    for (x, y, expect) in [
        (x.replacen('R', "é", 1), "a", "'é'"),
        (line[..79].to_string(), "a", "79 characters"),
        (x.to_string(), "ab", "one character"),
    ] {
        std::fs::write(
            dir.join("test/all_data_niid_0_keep_0_test_9.json"),
            leaf_json(&[("THE_TEMPEST_PROSPERO", vec![(json_str(&x), json_str(y))])]),
        )
        .unwrap();
        let e = load_dataset(&cfg("shakespeare", dir), 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("all_data_niid_0_keep_0_test_9.json") && e.contains(expect),
            "{e}"
        );
    }
}
