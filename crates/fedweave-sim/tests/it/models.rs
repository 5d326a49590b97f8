//! End-to-end runs of the image, text and rating models on small fixtures
//! written in the published formats, and of training augmentation.

use crate::common;
use fedweave_sim::{ExperimentConfig, Summary};

fn strip(s: &Summary) -> serde_json::Value {
    let mut v = serde_json::to_value(s).unwrap();
    let o = v.as_object_mut().unwrap();
    for k in ["wall_seconds", "seconds_per_round_median", "threads"] {
        o.remove(k);
    }
    v
}

#[test]
fn augmentation_is_seeded_thread_independent_and_changes_training() {
    let run = |o: &[&str]| common::run_config(crate::digits::BASE, o).summary;
    let base = [
        "algorithm.name=fedavg",
        "rounds=2",
        "train.augment=crop_flip",
    ];
    let one = run(&[&base[..], &["threads=1"]].concat());
    let two = run(&[&base[..], &["threads=2"]].concat());
    assert_eq!(strip(&one), strip(&two));
    let plain = run(&["algorithm.name=fedavg", "rounds=2", "threads=2"]);
    assert_ne!(
        one.per_client_test_acc, plain.per_client_test_acc,
        "augmented batches train a different model"
    );
    let reflect = run(&[
        "algorithm.name=fedavg",
        "rounds=2",
        "train.augment=crop_flip_reflect",
    ]);
    assert_ne!(reflect.per_client_test_acc, one.per_client_test_acc);
    let cutout = run(&[
        "algorithm.name=fedavg",
        "rounds=2",
        "train.augment=crop_flip_reflect_cutout",
    ]);
    assert_ne!(cutout.per_client_test_acc, reflect.per_client_test_acc);
}

#[test]
fn augmentation_and_embeddings_are_checked_against_the_data() {
    let bad = |o: &[&str]| {
        let o: Vec<String> = o.iter().map(|s| s.to_string()).collect();
        let cfg = ExperimentConfig::from_toml_str(crate::digits::BASE, &o);
        match cfg {
            Err(e) => e.to_string(),
            Ok(cfg) => {
                fedweave_sim::run_experiment(&cfg, tempfile::tempdir().unwrap().path(), &mut |_| {})
                    .unwrap_err()
                    .to_string()
            }
        }
    };
    let e = bad(&[
        "data.dataset=synthetic",
        "train.augment=crop_flip",
        "partition.kind=natural",
    ]);
    assert!(e.contains("train.augment") && e.contains("C×H×W"), "{e}");
    let e = bad(&["model.embed_dim=64"]);
    assert!(e.contains("model.embed_dim"), "{e}");
    let e = bad(&["model.kind=textcnn"]);
    assert!(e.contains("token ids"), "{e}");
    let e = bad(&["model.kind=mf"]);
    assert!(e.contains("(user, item)"), "{e}");
    let e = bad(&["model.kind=resnet9", "train.augment=sideways"]);
    assert!(e.contains("train.augment"), "{e}");
}

/// CIFAR-10 binary files (`cifar-10-batches-bin/`) whose class is the
/// image's colour: class c has mean colour `PALETTE[c]`, plus noise.
fn cifar_fixture(per_file: usize, test: usize) -> tempfile::TempDir {
    use rand::Rng;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("cifar-10-batches-bin");
    std::fs::create_dir(&dir).unwrap();
    let mut rng = fedweave_core::rng_stream(9, 0, 0, fedweave_core::Purpose::Dataset);
    let mut file = |name: &str, n: usize| {
        let mut bytes = Vec::with_capacity(n * 3073);
        for i in 0..n {
            let class = i % 10;
            bytes.push(class as u8);
            for ch in 0..3 {
                // Each channel's level encodes one base-3 digit of the class.
                let level = [40.0, 128.0, 215.0][(class / 3usize.pow(ch)) % 3];
                for _ in 0..1024 {
                    let v: f32 = level + rng.random_range(-50.0..50.0);
                    bytes.push(v.clamp(0.0, 255.0) as u8);
                }
            }
        }
        std::fs::write(dir.join(name), bytes).unwrap();
    };
    for b in 1..=5 {
        file(&format!("data_batch_{b}.bin"), per_file);
    }
    file("test_batch.bin", test);
    root
}

#[test]
fn resnet8_learns_a_synthetic_cifar_fixture() {
    let data = cifar_fixture(40, 100);
    let text = format!(
        "seed = 2\nclients = 4\nrounds = 3\n[data]\ndataset = \"cifar10\"\npath = {:?}\n\
         [partition]\nkind = \"iid\"\n[model]\nkind = \"resnet8\"\n[train]\n\
         local_iterations = 8\nbatch_size = 16\nlr = 0.05\naugment = \"crop_flip\"\n\
         [algorithm]\nname = \"fedavg\"\n",
        data.path().display().to_string()
    );
    let run = common::run_config(&text, &[]);
    let acc = run.summary.mean_test_acc.unwrap();
    assert_eq!(run.summary.model_parameters, 78_042);
    eprintln!("resnet8 on the CIFAR fixture: mean test accuracy {acc}");
    assert!(
        acc > 0.3,
        "ResNet-8 on 10 colour classes: {acc} (chance 0.1)"
    );
}

#[test]
fn mf_learns_shared_item_effects_on_a_movielens_fixture() {
    use std::fmt::Write as _;
    // 6 users rate all 30 items, each in its own order (a rotation), so every
    // user's newest items were rated earlier by others. Rating = 3 ± 1.5 by
    // item parity: predicting the mean rating is off by 1.5 stars.
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ml-100k");
    std::fs::create_dir(&dir).unwrap();
    let mut text = String::new();
    for user in 1..=6u32 {
        for k in 0..30u32 {
            let item = (k + 5 * user) % 30 + 1;
            let rating = if item % 2 == 0 { 5 } else { 2 };
            writeln!(text, "{user}\t{item}\t{rating}\t{}", 1000 + k).unwrap();
        }
    }
    std::fs::write(dir.join("u.data"), text).unwrap();
    let cfg = format!(
        "seed = 1\nclients = 6\nrounds = 8\n[data]\ndataset = \"movielens-100k\"\npath = {:?}\n\
         [partition]\nkind = \"natural\"\n[model]\nkind = \"mf\"\nembed_dim = 4\n[train]\n\
         local_iterations = 10\nbatch_size = 8\nlr = 0.1\n[algorithm]\nname = \"fedavg\"\n",
        root.path().display().to_string()
    );
    let run = common::run_config(&cfg, &[]);
    let rmse = run.summary.mean_test_rmse.unwrap();
    // 6 users·(k + 1) + 30 items·(k + 1) + head (k + 2) + 1, k = 4.
    assert_eq!(run.summary.model_parameters, 6 * 5 + 30 * 5 + 6 + 1);
    eprintln!("mf on the MovieLens fixture: mean test RMSE {rmse} stars");
    assert!(
        rmse < 0.5,
        "MF test RMSE {rmse} stars (mean predictor: 1.5)"
    );
}

/// `yahoo_answers_csv/` whose topic is carried by one of two words per class
/// at a random position among shared filler words: TextCNN's max over time
/// has to find it. Fields as the published files write them (quoted, `\n`
/// inside a field as two characters).
fn yahoo_fixture(train: usize, test: usize) -> tempfile::TempDir {
    use rand::Rng;
    use std::fmt::Write as _;
    const FILLER: [&str; 12] = [
        "what", "is", "the", "best", "way", "to", "do", "it", "why", "how", "my", "a",
    ];
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("yahoo_answers_csv");
    std::fs::create_dir(&dir).unwrap();
    let mut rng = fedweave_core::rng_stream(4, 0, 0, fedweave_core::Purpose::Dataset);
    let mut file = |name: &str, n: usize| {
        let mut text = String::new();
        for i in 0..n {
            let class = i % 10;
            let mut words: Vec<String> = (0..9)
                .map(|_| FILLER[rng.random_range(0..FILLER.len())].to_string())
                .collect();
            let at = rng.random_range(0..words.len());
            words[at] = format!("Topic{class}{}", ["alpha", "beta"][rng.random_range(0..2)]);
            let (title, rest) = words.split_at(3);
            let (content, answer) = rest.split_at(3);
            writeln!(
                text,
                "\"{}\",\"{}\",\"{}\\n\",\"{}\"",
                class + 1,
                title.join(" "),
                content.join(" "),
                answer.join(" ")
            )
            .unwrap();
        }
        std::fs::write(dir.join(name), text).unwrap();
    };
    file("train.csv", train);
    file("test.csv", test);
    root
}

#[test]
fn textcnn_learns_a_yahoo_answers_fixture() {
    let data = yahoo_fixture(400, 200);
    // lr 0.5: with 8-d embeddings drawn from U(−0.1, 0.1) the first rounds'
    // gradients are tiny; at 0.1 four rounds stay at chance, at 0.5 six
    // rounds reach 0.8–0.9 (seeds 3–5 of a Python twin of this fixture).
    let text = format!(
        "seed = 3\nclients = 4\nrounds = 6\n[data]\ndataset = \"yahoo-answers\"\npath = {:?}\n\
         seq_len = 12\nvocab_size = 64\n[partition]\nkind = \"iid\"\n\
         [model]\nkind = \"textcnn\"\nembed_dim = 8\n[train]\n\
         local_iterations = 10\nbatch_size = 16\nlr = 0.5\n[algorithm]\nname = \"fedavg\"\n",
        data.path().display().to_string()
    );
    let run = common::run_config(&text, &[]);
    let acc = run.summary.mean_test_acc.unwrap();
    // 32 tokens (12 filler, 20 topic words) + <pad>, <unk>: 34 ids of 8
    // dimensions; 100 maps each of widths 3, 4, 5 over 8 dimensions; fc 300 → 10.
    assert_eq!(
        run.summary.model_parameters,
        34 * 8 + 100 * (3 + 4 + 5) * 8 + 300 + 300 * 10 + 10
    );
    eprintln!("textcnn on the Yahoo! Answers fixture: mean test accuracy {acc}");
    assert!(
        acc > 0.6,
        "TextCNN on 10 keyword topics: {acc} (chance 0.1)"
    );
}
