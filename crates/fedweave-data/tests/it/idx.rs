//! IDX loading: tiny fixtures (raw and gzip), corrupt files, and the real
//! Fashion-MNIST when installed.

use std::io::Write;
use std::path::Path;

use fedweave_data::{DataConfig, load_dataset};

fn images(count: u32, rows: u32, cols: u32, seed: u8) -> Vec<u8> {
    let mut b = Vec::new();
    for v in [2051u32, count, rows, cols] {
        b.extend_from_slice(&v.to_be_bytes());
    }
    b.extend((0..count * rows * cols).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)));
    b
}

fn labels(ys: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    for v in [2049u32, ys.len() as u32] {
        b.extend_from_slice(&v.to_be_bytes());
    }
    b.extend_from_slice(ys);
    b
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// Writes a 6-train / 3-test 4×3 fixture; gzip for the files in `gzipped`.
fn fixture(dir: &Path, gzipped: bool) {
    let files: [(&str, Vec<u8>); 4] = [
        ("train-images-idx3-ubyte", images(6, 4, 3, 0)),
        ("train-labels-idx1-ubyte", labels(&[0, 1, 2, 9, 9, 5])),
        ("t10k-images-idx3-ubyte", images(3, 4, 3, 1)),
        ("t10k-labels-idx1-ubyte", labels(&[3, 4, 0])),
    ];
    for (name, bytes) in files {
        if gzipped {
            std::fs::write(dir.join(format!("{name}.gz")), gz(&bytes)).unwrap();
        } else {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
}

fn cfg(dataset: &str, dir: &Path, normalize: bool) -> DataConfig {
    DataConfig {
        dataset: dataset.into(),
        path: Some(dir.to_path_buf()),
        normalize,
        ..DataConfig::default()
    }
}

#[test]
fn raw_and_gzip_fixtures_load_identically() {
    let raw = tempfile::tempdir().unwrap();
    let zipped = tempfile::tempdir().unwrap();
    fixture(raw.path(), false);
    fixture(zipped.path(), true);
    let a = load_dataset(&cfg("mnist", raw.path(), false), 0).unwrap();
    let b = load_dataset(&cfg("mnist", zipped.path(), false), 0).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.feature_shape, vec![1, 4, 3]);
    assert_eq!(a.feature_len(), 12);
    assert_eq!(a.num_classes, 10);
    assert_eq!(a.train.labels, vec![0, 1, 2, 9, 9, 5]);
    assert_eq!(a.test.labels, vec![3, 4, 0]);
    assert_eq!(a.train.features.len(), 72);
    // Pixel j of the training file is (7j mod 256) / 255.
    assert_eq!(a.train.row(1, 12)[0], (7.0 * 12.0) / 255.0);
    assert_eq!(a.test.row(0, 12)[1], 8.0 / 255.0);
    assert!(a.natural_clients.is_none());
}

#[test]
fn normalisation_uses_the_dataset_constants() {
    let dir = tempfile::tempdir().unwrap();
    fixture(dir.path(), true);
    let m = load_dataset(&cfg("mnist", dir.path(), true), 0).unwrap();
    let f = load_dataset(&cfg("fashion-mnist", dir.path(), true), 0).unwrap();
    let raw = load_dataset(&cfg("mnist", dir.path(), false), 0).unwrap();
    for i in 0..raw.train.features.len() {
        let x = raw.train.features[i];
        assert!((m.train.features[i] - (x - 0.1307) / 0.3081).abs() < 1e-5);
        assert!((f.train.features[i] - (x - 0.2860) / 0.3530).abs() < 1e-5);
    }
    assert_eq!(f.name, "fashion-mnist");
}

#[test]
fn missing_directory_and_missing_file_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("no-such-dir");
    let e = load_dataset(&cfg("mnist", &gone, true), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no-such-dir"), "{e}");
    fixture(dir.path(), false);
    std::fs::remove_file(dir.path().join("t10k-labels-idx1-ubyte")).unwrap();
    let e = load_dataset(&cfg("mnist", dir.path(), true), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("t10k-labels-idx1-ubyte"), "{e}");
}

fn corrupt(name: &str, bytes: Vec<u8>, expect: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    fixture(dir.path(), false);
    std::fs::write(dir.path().join(name), bytes).unwrap();
    let e = load_dataset(&cfg("mnist", dir.path(), true), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains(name), "error does not name {name}: {e}");
    for s in expect {
        assert!(e.contains(s), "error lacks {s:?}: {e}");
    }
}

#[test]
fn bad_magic_is_rejected() {
    let mut b = images(6, 4, 3, 0);
    b[3] = 0x01; // 2049: a labels magic in an images file
    corrupt("train-images-idx3-ubyte", b, &["magic", "2049", "2051"]);
    let mut b = labels(&[3, 4, 0]);
    b[2] = 0xff;
    corrupt("t10k-labels-idx1-ubyte", b, &["magic"]);
}

#[test]
fn truncated_files_are_rejected() {
    let b = images(6, 4, 3, 0);
    corrupt(
        "train-images-idx3-ubyte",
        b[..b.len() - 5].to_vec(),
        &["truncated"],
    );
    corrupt("train-images-idx3-ubyte", b[..10].to_vec(), &["truncated"]);
    let l = labels(&[0, 1, 2, 9, 9, 5]);
    corrupt(
        "train-labels-idx1-ubyte",
        l[..l.len() - 1].to_vec(),
        &["truncated"],
    );
    // A truncated gzip stream.
    let z = gz(&images(3, 4, 3, 1));
    let dir = tempfile::tempdir().unwrap();
    fixture(dir.path(), true);
    let p = dir.path().join("t10k-images-idx3-ubyte.gz");
    std::fs::write(&p, &z[..z.len() / 2]).unwrap();
    let e = load_dataset(&cfg("mnist", dir.path(), true), 0)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("t10k-images-idx3-ubyte.gz") && e.contains("gzip"),
        "{e}"
    );
}

#[test]
fn mismatched_counts_and_bad_labels_are_rejected() {
    corrupt(
        "train-labels-idx1-ubyte",
        labels(&[0, 1, 2, 9, 9]),
        &["6 images", "5 labels"],
    );
    corrupt("t10k-labels-idx1-ubyte", labels(&[3, 10, 0]), &["label 10"]);
    corrupt(
        "t10k-images-idx3-ubyte",
        images(3, 3, 4, 1),
        &["3×4", "4×3"],
    );
}

#[test]
fn installed_fashion_mnist_loads() {
    let dir = Path::new(fedweave_data::FASHION_MNIST_DEFAULT_DIR);
    if !dir.is_dir() {
        eprintln!(
            "SKIPPED installed_fashion_mnist_loads: {} is missing \
             (apt-get install dataset-fashion-mnist)",
            dir.display()
        );
        return;
    }
    let t = std::time::Instant::now();
    let ds = load_dataset(
        &DataConfig {
            dataset: "fashion-mnist".into(),
            ..DataConfig::default()
        },
        0,
    )
    .unwrap();
    eprintln!("fashion-mnist loaded in {:?}", t.elapsed());
    assert_eq!(ds.train.len(), 60_000);
    assert_eq!(ds.test.len(), 10_000);
    assert_eq!(ds.feature_shape, vec![1, 28, 28]);
    assert_eq!(ds.train.features.len(), 60_000 * 784);
    let mut counts = [0usize; 10];
    for &y in &ds.train.labels {
        counts[y as usize] += 1;
    }
    assert_eq!(counts, [6000; 10]);
    let mut counts = [0usize; 10];
    for &y in &ds.test.labels {
        counts[y as usize] += 1;
    }
    assert_eq!(counts, [1000; 10]);
    // Normalised with (0.2860, 0.3530): the training mean is near 0.
    let mean = ds.train.features.iter().map(|&v| f64::from(v)).sum::<f64>()
        / ds.train.features.len() as f64;
    assert!(mean.abs() < 0.01, "mean {mean}");
}
