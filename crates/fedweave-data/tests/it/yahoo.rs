//! Yahoo! Answers: CSV fixtures in the distributed layout (every field
//! quoted, `""` escapes, literal `\n` sequences), the vocabulary, the token
//! rows, and bad files.

use std::path::Path;

use fedweave_data::{DataConfig, InputKind, load_dataset};

/// As in yahoo_answers_csv/train.csv: quoted fields, doubled quotes, `\n`
/// written as a backslash and an `n`, a field spanning no line break.
const TRAIN: &str = concat!(
    "\"5\",\"Why is the sky blue?\",\"I always wondered \"\"why\"\".\\nAny idea?\",\"Rayleigh scattering: the sky scatters blue light.\"\n",
    "\"1\",\"Sky, sky, SKY!\",\"\",\"Blue\\nblue.\"\n",
    "\"10\",\"Is it raining?\",\"\",\"The sky is grey; rain is likely\"\n",
    "\"3\",\"\",\"\",\"\"\n",
);

const TEST: &str = concat!(
    "\"2\",\"Blue whales\",\"Are whales blue?\",\"\"\n",
    "\"10\",\"the the the the the the the the the the\",\"\",\"\"\n",
);

fn fixture(root: &Path) -> std::path::PathBuf {
    let dir = root.join("yahoo_answers_csv");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("train.csv"), TRAIN).unwrap();
    std::fs::write(dir.join("test.csv"), TEST).unwrap();
    dir
}

fn cfg(path: &Path, vocab_size: usize, seq_len: usize) -> DataConfig {
    DataConfig {
        dataset: "yahoo-answers".into(),
        path: Some(path.to_path_buf()),
        vocab_size,
        seq_len,
        ..DataConfig::default()
    }
}

fn ids(row: &[f32]) -> Vec<u32> {
    row.iter().map(|&v| v as u32).collect()
}

#[test]
fn tokens_vocabulary_and_rows() {
    let root = tempfile::tempdir().unwrap();
    let dir = fixture(root.path());
    let ds = load_dataset(&cfg(root.path(), 6, 8), 0).unwrap();
    assert_eq!(ds, load_dataset(&cfg(&dir, 6, 8), 0).unwrap());
    assert_eq!(ds.num_classes, 10);
    assert_eq!(ds.feature_shape, vec![8]);
    assert_eq!(
        ds.input,
        InputKind::Tokens {
            vocab_size: 6,
            padded: true
        }
    );
    assert_eq!(ds.train.labels, vec![4, 0, 9, 2]);
    assert_eq!(ds.test.labels, vec![1, 9]);
    // Training counts: sky 6, blue 4, is 3, the 3 → ids 2..=5 (ties by
    // token: "is" < "the"); everything else is <unk> = 1.
    let (sky, blue, is, the, unk, pad) = (2, 3, 4, 5, 1, 0);
    // "why is the sky blue i always wondered" (first 8 tokens).
    assert_eq!(
        ids(ds.train.row(0, 8)),
        [unk, is, the, sky, blue, unk, unk, unk]
    );
    // "sky sky sky blue blue" + padding: `\n` splits "Blue\nblue".
    assert_eq!(
        ids(ds.train.row(1, 8)),
        [sky, sky, sky, blue, blue, pad, pad, pad]
    );
    assert_eq!(ids(ds.train.row(3, 8)), [pad; 8]);
    // Test texts use the training vocabulary.
    assert_eq!(
        ids(ds.test.row(0, 8)),
        [blue, unk, unk, unk, blue, pad, pad, pad]
    );
    assert_eq!(ids(ds.test.row(1, 8)), [the; 8]);
    // A large cap keeps every training token.
    let big = load_dataset(&cfg(root.path(), 1000, 256), 0).unwrap();
    let InputKind::Tokens { vocab_size, .. } = big.input else {
        panic!("{:?}", big.input)
    };
    // Distinct training tokens.
    let distinct = [
        "why",
        "is",
        "the",
        "sky",
        "blue",
        "i",
        "always",
        "wondered",
        "any",
        "idea",
        "rayleigh",
        "scattering",
        "scatters",
        "light",
        "it",
        "raining",
        "grey",
        "rain",
        "likely",
    ];
    assert_eq!(vocab_size, distinct.len() + 2);
    assert_eq!(big.train.features.len(), 4 * 256);
    assert!(
        big.train
            .features
            .iter()
            .all(|&v| (v as usize) < vocab_size)
    );
}

#[test]
fn settings_and_bad_files_are_named() {
    let root = tempfile::tempdir().unwrap();
    let dir = fixture(root.path());
    let e = load_dataset(&cfg(root.path(), 2, 8), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("data.vocab_size"), "{e}");
    let e = load_dataset(&cfg(root.path(), 100, 0), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("data.seq_len"), "{e}");
    let check = |file: &str, content: &str, expect: &[&str]| {
        std::fs::write(dir.join(file), content).unwrap();
        let e = load_dataset(&cfg(root.path(), 100, 8), 0)
            .unwrap_err()
            .to_string();
        std::fs::write(dir.join("train.csv"), TRAIN).unwrap();
        std::fs::write(dir.join("test.csv"), TEST).unwrap();
        assert!(e.contains(file), "{e}");
        for s in expect {
            assert!(e.contains(s), "{s:?} missing: {e}");
        }
    };
    check(
        "test.csv",
        "\"11\",\"a\",\"b\",\"c\"\n",
        &["record 1", "class \"11\""],
    );
    check(
        "train.csv",
        &TRAIN.replacen("\"1\",", "", 1),
        &["record 2", "3 fields"],
    );
    check("test.csv", "\"2\",\"a\",\"b\"\n", &["3 fields"]);
    check("test.csv", "", &["no record"]);
    check(
        "train.csv",
        &TRAIN[..TRAIN.len() - 40],
        &["record 3", "truncated"],
    );
    std::fs::remove_file(dir.join("test.csv")).unwrap();
    let e = load_dataset(&cfg(root.path(), 100, 8), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("test.csv"), "{e}");
    let e = load_dataset(&cfg(&root.path().join("nope"), 100, 8), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope") && e.contains("train.csv"), "{e}");
}
