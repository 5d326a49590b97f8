//! IDX files (the MNIST / Fashion-MNIST format), raw or gzip-compressed.
//!
//! A directory must hold `train-images-idx3-ubyte`, `train-labels-idx1-ubyte`,
//! `t10k-images-idx3-ubyte` and `t10k-labels-idx1-ubyte`, each either raw or
//! with a `.gz` suffix (gzip is detected by its magic bytes `1f 8b`, not by
//! the name). Images: big-endian magic 2051, count, rows, cols, then
//! `count·rows·cols` unsigned bytes. Labels: magic 2049, count, then `count`
//! bytes, each below 10.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::{DataError, Dataset, Split};

const IMAGES_MAGIC: u32 = 2051;
const LABELS_MAGIC: u32 = 2049;
const CLASSES: usize = 10;

/// Loads `train-*` and `t10k-*` from `dir`; pixels become
/// `(p / 255 − mean) / std`.
pub(crate) fn load_idx_dataset(
    name: &str,
    dir: &Path,
    mean: f32,
    std: f32,
) -> Result<Dataset, DataError> {
    if !dir.is_dir() {
        return Err(DataError::io(
            dir,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "data directory for {name} does not exist or is not a directory (data.path)"
                ),
            ),
        ));
    }
    let mut lut = [0f32; 256];
    for (p, v) in lut.iter_mut().enumerate() {
        *v = (p as f32 / 255.0 - mean) / std;
    }
    let (train, shape) = load_pair(dir, "train", &lut)?;
    let (test, test_shape) = load_pair(dir, "t10k", &lut)?;
    if shape != test_shape {
        return Err(DataError::format(
            find(dir, "t10k-images-idx3-ubyte")?,
            format!(
                "images are {}×{} but the training images are {}×{}",
                test_shape.0, test_shape.1, shape.0, shape.1
            ),
        ));
    }
    Ok(Dataset {
        name: name.to_string(),
        num_classes: CLASSES,
        feature_shape: vec![1, shape.0, shape.1],
        train,
        test,
        natural_clients: None,
        task: crate::Task::Classification,
        relation_graph: None,
        target_scales: None,
        input: crate::InputKind::Dense,
    })
}

/// Loads `{prefix}-images-idx3-ubyte` and `{prefix}-labels-idx1-ubyte`.
fn load_pair(
    dir: &Path,
    prefix: &str,
    lut: &[f32; 256],
) -> Result<(Split, (usize, usize)), DataError> {
    let img_path = find(dir, &format!("{prefix}-images-idx3-ubyte"))?;
    let lbl_path = find(dir, &format!("{prefix}-labels-idx1-ubyte"))?;
    let labels = read_labels(&lbl_path, 0, CLASSES)?;
    let img = read_bytes(&img_path)?;
    let (count, rows, cols, pixels) = parse_images(&img, &img_path)?;
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
    let features: Vec<f32> = pixels.iter().map(|&p| lut[p as usize]).collect();
    Ok((
        Split {
            features,
            labels,
            ..Split::default()
        },
        (rows, cols),
    ))
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
    Err(DataError::io(
        raw,
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("neither {name} nor {name}.gz exists in {}", dir.display()),
        ),
    ))
}

/// The file's bytes, decompressed when it starts with the gzip magic.
pub(crate) fn read_bytes(path: &Path) -> Result<Vec<u8>, DataError> {
    let bytes = std::fs::read(path).map_err(|e| DataError::io(path, e))?;
    decode(bytes, path)
}

/// `bytes` as they are, or gunzipped when they start with the gzip magic.
pub(crate) fn decode(bytes: Vec<u8>, path: &Path) -> Result<Vec<u8>, DataError> {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return Ok(bytes);
    }
    // ISIZE (the last 4 bytes) is the uncompressed size mod 2³²: a capacity hint.
    let hint = bytes
        .len()
        .checked_sub(4)
        .map(|s| u32::from_le_bytes([bytes[s], bytes[s + 1], bytes[s + 2], bytes[s + 3]]) as usize)
        .unwrap_or(0)
        .min(1 << 30);
    let mut out = Vec::with_capacity(hint);
    flate2::read::MultiGzDecoder::new(&bytes[..])
        .read_to_end(&mut out)
        .map_err(|e| DataError::format(path, format!("corrupt or truncated gzip stream: {e}")))?;
    Ok(out)
}

pub(crate) fn be_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// Checks an images file; returns (count, rows, cols, pixel bytes).
pub(crate) fn parse_images<'a>(
    bytes: &'a [u8],
    path: &Path,
) -> Result<(usize, usize, usize, &'a [u8]), DataError> {
    if bytes.len() < 16 {
        return Err(DataError::format(
            path,
            format!(
                "truncated IDX images file: {} bytes, the header alone needs 16",
                bytes.len()
            ),
        ));
    }
    let magic = be_u32(bytes, 0);
    if magic != IMAGES_MAGIC {
        return Err(DataError::format(
            path,
            format!("bad magic number {magic} (IDX images files start with {IMAGES_MAGIC})"),
        ));
    }
    let (count, rows, cols) = (
        be_u32(bytes, 4) as usize,
        be_u32(bytes, 8) as usize,
        be_u32(bytes, 12) as usize,
    );
    if rows == 0 || cols == 0 {
        return Err(DataError::format(
            path,
            format!("image size {rows}×{cols} is empty"),
        ));
    }
    let expected = count
        .checked_mul(rows)
        .and_then(|v| v.checked_mul(cols))
        .and_then(|v| v.checked_add(16));
    if expected != Some(bytes.len()) {
        return Err(DataError::format(
            path,
            format!(
                "header says {count} images of {rows}×{cols} ({} bytes with the header) but the \
                 file has {} bytes (truncated or corrupt)",
                expected.map_or_else(|| "too many".to_string(), |e| e.to_string()),
                bytes.len()
            ),
        ));
    }
    Ok((count, rows, cols, &bytes[16..]))
}

/// Reads and checks an IDX labels file whose labels lie in
/// `first..first + classes` (MNIST: 0..10; EMNIST letters: 1..27); returns
/// them shifted to start at 0.
pub(crate) fn read_labels(path: &Path, first: u8, classes: usize) -> Result<Vec<u32>, DataError> {
    parse_labels(&read_bytes(path)?, path, first, classes)
}

/// Checks the bytes of an IDX labels file (see [`read_labels`]); `path`
/// names it in errors.
pub(crate) fn parse_labels(
    bytes: &[u8],
    path: &Path,
    first: u8,
    classes: usize,
) -> Result<Vec<u32>, DataError> {
    if bytes.len() < 8 {
        return Err(DataError::format(
            path,
            format!(
                "truncated IDX labels file: {} bytes, the header alone needs 8",
                bytes.len()
            ),
        ));
    }
    let magic = be_u32(bytes, 0);
    if magic != LABELS_MAGIC {
        return Err(DataError::format(
            path,
            format!("bad magic number {magic} (IDX labels files start with {LABELS_MAGIC})"),
        ));
    }
    let count = be_u32(bytes, 4) as usize;
    if count.checked_add(8) != Some(bytes.len()) {
        return Err(DataError::format(
            path,
            format!(
                "header says {count} labels ({} bytes with the header) but the file has {} bytes \
                 (truncated or corrupt)",
                count.saturating_add(8),
                bytes.len()
            ),
        ));
    }
    let last = usize::from(first) + classes - 1;
    bytes[8..]
        .iter()
        .enumerate()
        .map(|(i, &y)| {
            if (usize::from(first)..=last).contains(&usize::from(y)) {
                Ok(u32::from(y - first))
            } else {
                Err(DataError::format(
                    path,
                    format!("label {y} of sample {i} is outside {first}..={last}"),
                ))
            }
        })
        .collect()
}
