//! The bundled UCI 8×8 handwritten digits (see `data/README.md`).
//!
//! **Fixed split.** The split is the same for every experiment seed: the
//! samples of each class `c = 0..9` (in file order) are shuffled, class after
//! class, by one stream `rng_stream(DIGITS_SPLIT_SEED, 0, u64::MAX,
//! Purpose::Dataset)`; the last `⌊n_c / 4⌋` shuffled samples of each class go
//! to test, the rest to train. Both splits then keep file order. For the
//! bundled file that is 1,352 train and 445 test samples.
//!
//! **Scaling.** Pixels 0..=16 are divided by 16; with `normalize` they are
//! then standardised with [`DIGITS_MEAN`] and [`DIGITS_STD`], the pixel mean
//! and standard deviation of all 1,797 images after the division.

use std::io::Read;
use std::path::{Path, PathBuf};

use fedweave_core::{Purpose, rng_stream};
use rand::seq::SliceRandom;

use crate::{DataError, Dataset, Split};

/// The bundled file, gzip-compressed CSV.
static DIGITS_CSV_GZ: &[u8] = include_bytes!("../../../data/digits.csv.gz");

/// Seed of the fixed digits train/test split.
pub const DIGITS_SPLIT_SEED: u64 = 0xD161_7500;
/// Mean pixel value (after /16) over all 1,797 digits images.
pub const DIGITS_MEAN: f32 = 0.3053;
/// Pixel standard deviation (after /16) over all 1,797 digits images.
pub const DIGITS_STD: f32 = 0.3760;

const PIXELS: usize = 64;
const CLASSES: usize = 10;

/// Loads the digits, from `path` (CSV, optionally gzip) or the bundled copy.
pub(crate) fn load(path: Option<&Path>, normalize: bool) -> Result<Dataset, DataError> {
    let (name, bytes): (PathBuf, std::borrow::Cow<'_, [u8]>) = match path {
        None => (
            PathBuf::from("digits.csv.gz (bundled)"),
            std::borrow::Cow::Borrowed(DIGITS_CSV_GZ),
        ),
        Some(p) => (
            p.to_path_buf(),
            std::borrow::Cow::Owned(std::fs::read(p).map_err(|e| DataError::io(p, e))?),
        ),
    };
    let text = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::with_capacity(bytes.len() * 5);
        flate2::read::MultiGzDecoder::new(&bytes[..])
            .read_to_end(&mut out)
            .map_err(|e| DataError::format(&name, format!("corrupt gzip stream: {e}")))?;
        out
    } else {
        bytes.into_owned()
    };
    let (pixels, labels) = parse_csv(&text, &name)?;
    if labels.is_empty() {
        return Err(DataError::format(&name, "no samples"));
    }
    Ok(split(&pixels, &labels, normalize))
}

/// Parses `64 pixels, label` lines; returns raw pixels and labels.
fn parse_csv(text: &[u8], name: &Path) -> Result<(Vec<u8>, Vec<u32>), DataError> {
    let text = std::str::from_utf8(text)
        .map_err(|e| DataError::format(name, format!("not UTF-8 text: {e}")))?;
    let mut pixels = Vec::with_capacity(text.len() / 2);
    let mut labels = Vec::new();
    for (lineno, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let mut fields = 0usize;
        for (j, field) in line.split(',').enumerate() {
            fields += 1;
            let v: f64 = field.trim().parse().map_err(|_| {
                DataError::format(
                    name,
                    format!(
                        "line {}: field {} ({field:?}) is not a number",
                        lineno + 1,
                        j + 1
                    ),
                )
            })?;
            if j < PIXELS {
                if !(0.0..=16.0).contains(&v) || v.fract() != 0.0 {
                    return Err(DataError::format(
                        name,
                        format!(
                            "line {}: pixel {} = {v} is not an integer in 0..=16",
                            lineno + 1,
                            j + 1
                        ),
                    ));
                }
                pixels.push(v as u8);
            } else if j == PIXELS {
                if !(0.0..CLASSES as f64).contains(&v) || v.fract() != 0.0 {
                    return Err(DataError::format(
                        name,
                        format!("line {}: label {v} is not an integer in 0..=9", lineno + 1),
                    ));
                }
                labels.push(v as u32);
            }
        }
        if fields != PIXELS + 1 {
            return Err(DataError::format(
                name,
                format!(
                    "line {}: expected {} comma-separated values (64 pixels then the label), found {fields}",
                    lineno + 1,
                    PIXELS + 1
                ),
            ));
        }
    }
    Ok((pixels, labels))
}

/// The fixed stratified split and the scaling.
fn split(pixels: &[u8], labels: &[u32], normalize: bool) -> Dataset {
    let mut rng = rng_stream(DIGITS_SPLIT_SEED, 0, u64::MAX, Purpose::Dataset);
    let mut is_test = vec![false; labels.len()];
    for c in 0..CLASSES as u32 {
        let mut idx: Vec<usize> = (0..labels.len()).filter(|&i| labels[i] == c).collect();
        idx.shuffle(&mut rng);
        let n_test = idx.len() / 4;
        for &i in &idx[idx.len() - n_test..] {
            is_test[i] = true;
        }
    }
    let (mean, std) = if normalize {
        (DIGITS_MEAN, DIGITS_STD)
    } else {
        (0.0, 1.0)
    };
    let lut: Vec<f32> = (0..=16u8)
        .map(|v| (f32::from(v) / 16.0 - mean) / std)
        .collect();
    let mut train = Split::default();
    let mut test = Split::default();
    for (i, &y) in labels.iter().enumerate() {
        let dst = if is_test[i] { &mut test } else { &mut train };
        dst.features.extend(
            pixels[i * PIXELS..(i + 1) * PIXELS]
                .iter()
                .map(|&p| lut[p as usize]),
        );
        dst.labels.push(y);
    }
    Dataset {
        name: "digits".to_string(),
        num_classes: CLASSES,
        feature_shape: vec![1, 8, 8],
        train,
        test,
        natural_clients: None,
        task: crate::Task::Classification,
        relation_graph: None,
        target_scales: None,
        input: crate::InputKind::Dense,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(labels: &[u32]) -> Vec<usize> {
        let mut c = vec![0; CLASSES];
        for &y in labels {
            c[y as usize] += 1;
        }
        c
    }

    #[test]
    fn bundled_digits_load_with_fixed_stratified_split() {
        let ds = load(None, false).unwrap();
        assert_eq!(ds.train.len() + ds.test.len(), 1797);
        assert_eq!(ds.num_classes, 10);
        assert_eq!(ds.feature_shape, vec![1, 8, 8]);
        assert_eq!(ds.feature_len(), 64);
        assert_eq!(ds.train.features.len(), ds.train.len() * 64);
        assert_eq!(ds.test.features.len(), ds.test.len() * 64);
        let full = [178, 182, 177, 183, 181, 182, 181, 179, 174, 180];
        let test = counts(&ds.test.labels);
        let train = counts(&ds.train.labels);
        for c in 0..10 {
            assert_eq!(test[c], full[c] / 4, "class {c}");
            assert_eq!(train[c] + test[c], full[c], "class {c}");
        }
        assert_eq!(ds.test.len(), 445);
        assert_eq!(ds.train.len(), 1352);
        let all = ds.train.features.iter().chain(&ds.test.features);
        let (mut lo, mut hi) = (f32::MAX, f32::MIN);
        for &v in all {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        assert_eq!((lo, hi), (0.0, 1.0));
        // First file row is a 0 whose second pixel row starts 0,0,13,15.
        let first_is_train = ds.train.labels[0] == 0 && ds.train.row(0, 64)[10] == 13.0 / 16.0;
        let first_is_test = ds.test.labels[0] == 0 && ds.test.row(0, 64)[10] == 13.0 / 16.0;
        assert!(first_is_train || first_is_test);
    }

    #[test]
    fn split_is_fixed_and_normalisation_standardises() {
        let a = load(None, true).unwrap();
        let b = load(None, true).unwrap();
        assert_eq!(a, b);
        let raw = load(None, false).unwrap();
        assert_eq!(a.train.labels, raw.train.labels);
        let all: Vec<f32> = a
            .train
            .features
            .iter()
            .chain(&a.test.features)
            .copied()
            .collect();
        let n = all.len() as f64;
        let mean = all.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = all
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!(mean.abs() < 1e-3, "mean {mean}");
        assert!((var.sqrt() - 1.0).abs() < 1e-3, "std {}", var.sqrt());
    }

    #[test]
    fn bad_csv_names_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("my_digits.csv");
        let mut line: Vec<String> = (0..64).map(|_| "3".to_string()).collect();
        line.push("7".into());
        let good = line.join(",");
        std::fs::write(&p, format!("{good}\n{}\n", &good[2..])).unwrap();
        let e = load(Some(&p), true).unwrap_err().to_string();
        assert!(e.contains("my_digits.csv") && e.contains("line 2"), "{e}");
        std::fs::write(&p, format!("{good}\n{}\n", good.replace(",7", ",12"))).unwrap();
        let e = load(Some(&p), true).unwrap_err().to_string();
        assert!(e.contains("my_digits.csv") && e.contains("label 12"), "{e}");
        std::fs::write(&p, format!("{good}\n{good}\n")).unwrap();
        let ds = load(Some(&p), false).unwrap();
        assert_eq!(ds.train.len() + ds.test.len(), 2);
        let missing = dir.path().join("nope.csv");
        let e = load(Some(&missing), true).unwrap_err().to_string();
        assert!(e.contains("nope.csv"), "{e}");
    }
}
