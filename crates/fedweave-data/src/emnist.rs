//! EMNIST from the IDX files NIST distributes (`gzip.zip`, extracting to
//! `gzip/`): `emnist-<split>-{train,test}-images-idx3-ubyte` and
//! `emnist-<split>-{train,test}-labels-idx1-ubyte`, each raw or `.gz`.
//! `data.path` may be the folder holding them or its parent (with `gzip/`).
//!
//! The split is `data.emnist_split`:
//!
//! | split      | classes | labels in the files |
//! |------------|---------|---------------------|
//! | `byclass`  | 62      | 0–61                |
//! | `bymerge`  | 47      | 0–46                |
//! | `balanced` | 47      | 0–46                |
//! | `letters`  | 26      | 1–26 (become 0–25)  |
//! | `digits`   | 10      | 0–9                 |
//! | `mnist`    | 10      | 0–9                 |
//!
//! EMNIST stores every image transposed relative to MNIST (column-major):
//! pixel (r, c) of the upright image is byte `c·rows + r` of the record.
//! The loader transposes, so the features are upright like MNIST's.
//!
//! Pixels become `p / 255`; with `data.normalize` (default) they are then
//! standardised with the mean and standard deviation of all training pixels
//! of the split, computed at load time.

use std::path::{Path, PathBuf};

use crate::files::{need_path, not_found};
use crate::idx::{parse_images, read_bytes, read_labels};
use crate::{DataConfig, DataError, Dataset, InputKind, Split, Task};

/// The EMNIST splits, their class counts and their smallest label.
const SPLITS: [(&str, usize, u8); 6] = [
    ("byclass", 62, 0),
    ("bymerge", 47, 0),
    ("balanced", 47, 0),
    ("letters", 26, 1),
    ("digits", 10, 0),
    ("mnist", 10, 0),
];

/// Loads `emnist` (split `cfg.emnist_split`) from `cfg.path`.
pub(crate) fn load(cfg: &DataConfig) -> Result<Dataset, DataError> {
    let split = cfg.emnist_split.as_str();
    let Some(&(_, classes, first)) = SPLITS.iter().find(|(s, _, _)| *s == split) else {
        let names: Vec<&str> = SPLITS.iter().map(|(s, _, _)| *s).collect();
        return Err(DataError::config(
            "data.emnist_split",
            format!(
                "unknown EMNIST split {split:?}; known: {}",
                names.join(", ")
            ),
        ));
    };
    let root = need_path(
        cfg,
        "the folder holding emnist-<split>-train-images-idx3-ubyte(.gz) and the other IDX \
         files (the extracted gzip/ folder) or its parent",
    )?;
    let probe = format!("emnist-{split}-train-images-idx3-ubyte");
    let dir = crate::files::locate(root, &["gzip"], |d| {
        d.join(&probe).is_file() || d.join(format!("{probe}.gz")).is_file()
    })
    .unwrap_or_else(|| root.to_path_buf());
    let (train_px, train_y, shape) = load_pair(&dir, split, "train", classes, first)?;
    let (test_px, test_y, test_shape) = load_pair(&dir, split, "test", classes, first)?;
    if shape != test_shape {
        return Err(DataError::format(
            find(&dir, &format!("emnist-{split}-test-images-idx3-ubyte"))?,
            format!(
                "images are {}×{} but the training images are {}×{}",
                test_shape.0, test_shape.1, shape.0, shape.1
            ),
        ));
    }
    let (mean, std) = if cfg.normalize {
        pixel_stats(&train_px)
    } else {
        (0.0, 1.0)
    };
    let lut = crate::files::pixel_lut(mean, std);
    let split_of = |px: Vec<u8>, labels| Split {
        features: px.iter().map(|&p| lut[p as usize]).collect(),
        labels,
        ..Split::default()
    };
    Ok(Dataset {
        name: "emnist".to_string(),
        num_classes: classes,
        feature_shape: vec![1, shape.0, shape.1],
        train: split_of(train_px, train_y),
        test: split_of(test_px, test_y),
        natural_clients: None,
        task: Task::Classification,
        relation_graph: None,
        target_scales: None,
        input: InputKind::Dense,
    })
}

/// Mean and standard deviation of `p / 255` over all bytes (std at least
/// a tiny positive value so that a constant image set stays finite).
fn pixel_stats(px: &[u8]) -> (f32, f32) {
    let mut hist = [0u64; 256];
    for &p in px {
        hist[p as usize] += 1;
    }
    let n = px.len().max(1) as f64;
    let mean = hist
        .iter()
        .enumerate()
        .map(|(p, &c)| p as f64 / 255.0 * c as f64)
        .sum::<f64>()
        / n;
    let var = hist
        .iter()
        .enumerate()
        .map(|(p, &c)| (p as f64 / 255.0 - mean).powi(2) * c as f64)
        .sum::<f64>()
        / n;
    (mean as f32, (var.sqrt() as f32).max(1e-6))
}

/// `dir/name.gz` if it exists, else `dir/name`; an error naming both if neither.
fn find(dir: &Path, name: &str) -> Result<PathBuf, DataError> {
    let gz = dir.join(format!("{name}.gz"));
    if gz.is_file() {
        return Ok(gz);
    }
    let raw = dir.join(name);
    if raw.is_file() {
        return Ok(raw);
    }
    Err(not_found(
        raw,
        format!("neither {name} nor {name}.gz exists in {}", dir.display()),
    ))
}

/// Upright pixels (transposed from the file), labels from 0, and the
/// upright image size (rows, cols).
type Pair = (Vec<u8>, Vec<u32>, (usize, usize));

fn load_pair(
    dir: &Path,
    split: &str,
    part: &str,
    classes: usize,
    first: u8,
) -> Result<Pair, DataError> {
    let img_path = find(dir, &format!("emnist-{split}-{part}-images-idx3-ubyte"))?;
    let lbl_path = find(dir, &format!("emnist-{split}-{part}-labels-idx1-ubyte"))?;
    let labels = read_labels(&lbl_path, first, classes)?;
    let bytes = read_bytes(&img_path)?;
    let (count, rows, cols, stored) = parse_images(&bytes, &img_path)?;
    if count != labels.len() {
        return Err(DataError::format(
            &img_path,
            format!(
                "holds {count} images but {} holds {} labels",
                lbl_path.display(),
                labels.len()
            ),
        ));
    }
    // The record is the upright image in column-major order: upright
    // (r, c) is stored at c·rows + r with the header's rows × cols read as
    // "cols of the upright image × its rows". Upright size: cols × rows.
    let (h, w) = (cols, rows);
    let mut px = vec![0u8; stored.len()];
    for (dst, src) in px.chunks_exact_mut(h * w).zip(stored.chunks_exact(h * w)) {
        for r in 0..h {
            for c in 0..w {
                dst[r * w + c] = src[c * h + r];
            }
        }
    }
    Ok((px, labels, (h, w)))
}
