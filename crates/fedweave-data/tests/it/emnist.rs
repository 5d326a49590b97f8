//! EMNIST: IDX fixtures stored transposed as NIST distributes them, raw and
//! gzip, every split's class count, 1-based letters, and bad files.

use std::io::Write;
use std::path::Path;

use fedweave_data::{DataConfig, load_dataset};

/// Upright pixel (r, c) of image `i`: distinct values, so a wrong
/// transposition is caught.
fn upright(i: usize, r: usize, c: usize) -> u8 {
    (i * 50 + r * 10 + c) as u8
}

/// An IDX images file holding `n` upright `h × w` images the EMNIST way:
/// each written transposed (header rows = w, cols = h).
fn images(n: usize, h: usize, w: usize) -> Vec<u8> {
    let mut b = Vec::new();
    for v in [2051u32, n as u32, w as u32, h as u32] {
        b.extend_from_slice(&v.to_be_bytes());
    }
    for i in 0..n {
        for c in 0..w {
            for r in 0..h {
                b.push(upright(i, r, c));
            }
        }
    }
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

fn write(dir: &Path, split: &str, train_y: &[u8], test_y: &[u8], gzipped: bool) {
    std::fs::create_dir_all(dir).unwrap();
    let files = [
        ("train-images-idx3-ubyte", images(train_y.len(), 3, 4)),
        ("train-labels-idx1-ubyte", labels(train_y)),
        ("test-images-idx3-ubyte", images(test_y.len(), 3, 4)),
        ("test-labels-idx1-ubyte", labels(test_y)),
    ];
    for (name, bytes) in files {
        let name = format!("emnist-{split}-{name}");
        if gzipped {
            std::fs::write(dir.join(format!("{name}.gz")), gz(&bytes)).unwrap();
        } else {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
    }
}

fn cfg(dir: &Path, split: &str, normalize: bool) -> DataConfig {
    DataConfig {
        dataset: "emnist".into(),
        path: Some(dir.to_path_buf()),
        emnist_split: split.into(),
        normalize,
        ..DataConfig::default()
    }
}

#[test]
fn images_are_transposed_upright_and_gzip_matches_raw() {
    let raw = tempfile::tempdir().unwrap();
    let zipped = tempfile::tempdir().unwrap();
    write(raw.path(), "balanced", &[0, 46, 5], &[7, 8], false);
    // As NIST ships it: the gzip/ folder inside data.path.
    write(
        &zipped.path().join("gzip"),
        "balanced",
        &[0, 46, 5],
        &[7, 8],
        true,
    );
    let a = load_dataset(&cfg(raw.path(), "balanced", false), 0).unwrap();
    let b = load_dataset(&cfg(zipped.path(), "balanced", false), 0).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.name, "emnist");
    assert_eq!(a.num_classes, 47);
    assert_eq!(a.feature_shape, vec![1, 3, 4]);
    assert_eq!(a.train.labels, vec![0, 46, 5]);
    assert_eq!(a.test.labels, vec![7, 8]);
    for i in 0..3 {
        let row = a.train.row(i, 12);
        for r in 0..3 {
            for c in 0..4 {
                assert_eq!(row[r * 4 + c], f32::from(upright(i, r, c)) / 255.0);
            }
        }
    }
}

#[test]
fn every_split_has_its_class_count_and_letters_are_one_based() {
    for (split, classes, max) in [
        ("byclass", 62, 61),
        ("bymerge", 47, 46),
        ("balanced", 47, 46),
        ("digits", 10, 9),
        ("mnist", 10, 9),
    ] {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), split, &[0, max], &[max], true);
        let ds = load_dataset(&cfg(dir.path(), split, true), 0).unwrap();
        assert_eq!(ds.num_classes, classes, "{split}");
        assert_eq!(ds.train.labels, vec![0, u32::from(max)]);
        write(dir.path(), split, &[0, max + 1], &[max], true);
        let e = load_dataset(&cfg(dir.path(), split, true), 0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("emnist-{split}-train-labels-idx1-ubyte.gz"))
                && e.contains(&format!("label {}", max + 1)),
            "{e}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "letters", &[1, 26, 13], &[2], false);
    let ds = load_dataset(&cfg(dir.path(), "letters", true), 0).unwrap();
    assert_eq!(ds.num_classes, 26);
    assert_eq!(ds.train.labels, vec![0, 25, 12]);
    assert_eq!(ds.test.labels, vec![1]);
    write(dir.path(), "letters", &[1, 0], &[2], false);
    let e = load_dataset(&cfg(dir.path(), "letters", true), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("label 0") && e.contains("1..=26"), "{e}");
}

#[test]
fn normalisation_uses_the_training_pixel_statistics() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "digits", &[1, 2, 3, 4], &[5], false);
    let ds = load_dataset(&cfg(dir.path(), "digits", true), 0).unwrap();
    let n = ds.train.features.len() as f64;
    let mean = ds.train.features.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = ds
        .train
        .features
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    assert!(
        mean.abs() < 1e-4 && (var - 1.0).abs() < 1e-3,
        "{mean} {var}"
    );
}

#[test]
fn bad_split_missing_and_corrupt_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let e = load_dataset(&cfg(dir.path(), "letter", true), 0)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("data.emnist_split") && e.contains("letters"),
        "{e}"
    );
    write(dir.path(), "byclass", &[1, 2], &[3], false);
    let e = load_dataset(&cfg(dir.path(), "balanced", true), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("emnist-balanced-train-images-idx3-ubyte"), "{e}");
    std::fs::remove_file(dir.path().join("emnist-byclass-test-images-idx3-ubyte")).unwrap();
    let e = load_dataset(&cfg(dir.path(), "byclass", true), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("emnist-byclass-test-images-idx3-ubyte"), "{e}");
    let img = images(2, 3, 4);
    let p = dir.path().join("emnist-byclass-test-images-idx3-ubyte");
    std::fs::write(&p, &img[..img.len() - 3]).unwrap();
    let e = load_dataset(&cfg(dir.path(), "byclass", true), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("truncated"), "{e}");
    std::fs::write(&p, images(2, 3, 4)).unwrap();
    let e = load_dataset(&cfg(dir.path(), "byclass", true), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("2 images") && e.contains("1 labels"), "{e}");
    let z = gz(&labels(&[1, 2]));
    std::fs::remove_file(dir.path().join("emnist-byclass-train-labels-idx1-ubyte")).unwrap();
    std::fs::write(
        dir.path().join("emnist-byclass-train-labels-idx1-ubyte.gz"),
        &z[..z.len() - 6],
    )
    .unwrap();
    let e = load_dataset(&cfg(dir.path(), "byclass", true), 0)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("train-labels-idx1-ubyte.gz") && e.contains("gzip"),
        "{e}"
    );
}
