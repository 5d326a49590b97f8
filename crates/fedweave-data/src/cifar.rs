//! CIFAR-10 and CIFAR-100 in the two layouts their authors distribute.
//!
//! - **Binary version.** CIFAR-10 (`cifar-10-batches-bin/`):
//!   `data_batch_1.bin` … `data_batch_5.bin` and `test_batch.bin`, each a
//!   sequence of 3,073-byte records: 1 label byte (0–9), then 3,072 pixel
//!   bytes. CIFAR-100 (`cifar-100-binary/`): `train.bin` and `test.bin` with
//!   3,074-byte records: coarse label (0–19), fine label (0–99), pixels.
//! - **Python version.** CIFAR-10 (`cifar-10-batches-py/`): `data_batch_1` …
//!   `data_batch_5`, `test_batch`; CIFAR-100 (`cifar-100-python/`): `train`,
//!   `test`. Each is a Python 2 pickle (protocol 2) of a dict whose keys are
//!   byte strings: `data` is a numpy `uint8` array of shape (N, 3072) (pickled
//!   through `numpy.core.multiarray._reconstruct`), `labels` (CIFAR-10) or
//!   `fine_labels` / `coarse_labels` (CIFAR-100) lists of ints. The pickle is
//!   decoded with `serde-pickle`; the array is read from the state tuple
//!   `(version, shape, dtype, fortran_order, raw_bytes)` numpy stores.
//!
//! The 3,072 pixel bytes are the red, green and blue 32×32 planes, each row
//! major: exactly the `[3, 32, 32]` channel-first layout of the features.
//! `data.path` may be the extracted folder or its parent; the binary version
//! is used when both are present.
//!
//! Pixels become `p / 255` in [0, 1]; with `data.normalize` (default) each
//! channel is then standardised, `(x − mean_c) / std_c`, with the training
//! set's per-channel statistics, as the reference training code does:
//! CIFAR-10 mean (0.4914, 0.4822, 0.4465), std (0.2470, 0.2435, 0.2616);
//! CIFAR-100 mean (0.5071, 0.4865, 0.4409), std (0.2673, 0.2564, 0.2762).

use std::path::{Path, PathBuf};

use serde_pickle::{DeOptions, HashableValue, Value};

use crate::files::{locate, need_path, not_found, read};
use crate::{DataConfig, DataError, Dataset, Split};

const PIXELS: usize = 3 * 32 * 32;
const CIFAR10_MEAN: [f32; 3] = [0.4914, 0.4822, 0.4465];
const CIFAR10_STD: [f32; 3] = [0.2470, 0.2435, 0.2616];
const CIFAR100_MEAN: [f32; 3] = [0.5071, 0.4865, 0.4409];
const CIFAR100_STD: [f32; 3] = [0.2673, 0.2564, 0.2762];

/// The two distributed layouts of one dataset.
struct Layout {
    bin_dir: &'static str,
    bin_train: &'static [&'static str],
    bin_test: &'static str,
    py_dir: &'static str,
    py_train: &'static [&'static str],
    py_test: &'static str,
}

const CIFAR10: Layout = Layout {
    bin_dir: "cifar-10-batches-bin",
    bin_train: &[
        "data_batch_1.bin",
        "data_batch_2.bin",
        "data_batch_3.bin",
        "data_batch_4.bin",
        "data_batch_5.bin",
    ],
    bin_test: "test_batch.bin",
    py_dir: "cifar-10-batches-py",
    py_train: &[
        "data_batch_1",
        "data_batch_2",
        "data_batch_3",
        "data_batch_4",
        "data_batch_5",
    ],
    py_test: "test_batch",
};

const CIFAR100: Layout = Layout {
    bin_dir: "cifar-100-binary",
    bin_train: &["train.bin"],
    bin_test: "test.bin",
    py_dir: "cifar-100-python",
    py_train: &["train"],
    py_test: "test",
};

/// Which label a CIFAR file provides.
#[derive(Clone, Copy)]
enum Labels {
    /// CIFAR-10: one label byte / `labels`, below 10.
    Cifar10,
    /// CIFAR-100 fine labels (below 100).
    Fine,
    /// CIFAR-100 coarse labels (below 20).
    Coarse,
}

impl Labels {
    fn classes(self) -> usize {
        match self {
            Labels::Cifar10 => 10,
            Labels::Fine => 100,
            Labels::Coarse => 20,
        }
    }
}

/// Loads `cifar10` or `cifar100` from `cfg.path`.
pub(crate) fn load(name: &str, cfg: &DataConfig) -> Result<Dataset, DataError> {
    let (layout, labels, mean, std) = if name == "cifar10" {
        (&CIFAR10, Labels::Cifar10, CIFAR10_MEAN, CIFAR10_STD)
    } else {
        let l = if cfg.coarse_labels {
            Labels::Coarse
        } else {
            Labels::Fine
        };
        (&CIFAR100, l, CIFAR100_MEAN, CIFAR100_STD)
    };
    if cfg.coarse_labels && name == "cifar10" {
        return Err(DataError::config(
            "data.coarse_labels",
            "only cifar100 has coarse labels",
        ));
    }
    let root = need_path(
        cfg,
        &format!(
            "the extracted {} or {} folder, or its parent",
            layout.bin_dir, layout.py_dir
        ),
    )?;
    let has_any = |d: &Path, train: &[&str], test: &str| {
        train.iter().chain([&test]).any(|f| d.join(f).is_file())
    };
    let (train, test) = if let Some(dir) = locate(root, &[layout.bin_dir], |d| {
        has_any(d, layout.bin_train, layout.bin_test)
    }) {
        let train = load_files(&dir, layout.bin_train, |p| read_binary(p, labels))?;
        let test = load_files(&dir, &[layout.bin_test], |p| read_binary(p, labels))?;
        (train, test)
    } else if let Some(dir) = locate(root, &[layout.py_dir], |d| {
        has_any(d, layout.py_train, layout.py_test)
    }) {
        let train = load_files(&dir, layout.py_train, |p| read_pickle(p, labels))?;
        let test = load_files(&dir, &[layout.py_test], |p| read_pickle(p, labels))?;
        (train, test)
    } else {
        return Err(not_found(
            root,
            format!(
                "no {name} files here: expected {} (binary version) or {} (python version), \
                 directly or in a {} / {} subfolder",
                layout.bin_test, layout.py_test, layout.bin_dir, layout.py_dir
            ),
        ));
    };
    let (mean, std) = if cfg.normalize {
        (mean, std)
    } else {
        ([0.0; 3], [1.0; 3])
    };
    Ok(Dataset::classification(
        name,
        labels.classes(),
        vec![3, 32, 32],
        (to_split(train, mean, std), to_split(test, mean, std)),
        None,
    ))
}

/// Raw pixel bytes (`N × 3072`) and labels.
type Batch = (Vec<u8>, Vec<u32>);

fn load_files(
    dir: &Path,
    names: &[&str],
    read_one: impl Fn(&Path) -> Result<Batch, DataError>,
) -> Result<Batch, DataError> {
    let mut pixels = Vec::new();
    let mut labels = Vec::new();
    for name in names {
        let path: PathBuf = dir.join(name);
        if !path.is_file() {
            return Err(not_found(
                &path,
                format!("{name} is missing from {}", dir.display()),
            ));
        }
        let (p, l) = read_one(&path)?;
        pixels.extend_from_slice(&p);
        labels.extend_from_slice(&l);
    }
    Ok((pixels, labels))
}

fn to_split((pixels, labels): Batch, mean: [f32; 3], std: [f32; 3]) -> Split {
    let luts: Vec<[f32; 256]> = (0..3)
        .map(|c| crate::files::pixel_lut(mean[c], std[c]))
        .collect();
    let features = pixels
        .iter()
        .enumerate()
        .map(|(i, &p)| luts[(i % PIXELS) / 1024][p as usize])
        .collect();
    Split {
        features,
        labels,
        ..Split::default()
    }
}

fn check_label(path: &Path, labels: Labels, sample: usize, y: i64) -> Result<u32, DataError> {
    if (0..labels.classes() as i64).contains(&y) {
        Ok(y as u32)
    } else {
        Err(DataError::format(
            path,
            format!(
                "label {y} of sample {sample} is not below {}",
                labels.classes()
            ),
        ))
    }
}

/// One binary-version file.
fn read_binary(path: &Path, labels: Labels) -> Result<Batch, DataError> {
    parse_binary(&read(path)?, path, labels)
}

/// The records of a binary-version file; `path` names it in errors.
fn parse_binary(bytes: &[u8], path: &Path, labels: Labels) -> Result<Batch, DataError> {
    let head = if matches!(labels, Labels::Cifar10) {
        1
    } else {
        2
    };
    let record = head + PIXELS;
    if bytes.is_empty() || !bytes.len().is_multiple_of(record) {
        return Err(DataError::format(
            path,
            format!(
                "{} bytes is not a whole number of {record}-byte records ({head} label byte(s) + \
                 {PIXELS} pixels): truncated or corrupt",
                bytes.len()
            ),
        ));
    }
    let n = bytes.len() / record;
    let mut pixels = Vec::with_capacity(n * PIXELS);
    let mut ys = Vec::with_capacity(n);
    for (i, r) in bytes.chunks_exact(record).enumerate() {
        let y = match labels {
            Labels::Cifar10 | Labels::Coarse => r[0],
            Labels::Fine => r[1],
        };
        ys.push(check_label(path, labels, i, i64::from(y))?);
        pixels.extend_from_slice(&r[head..]);
    }
    Ok((pixels, ys))
}

/// One python-version file (a pickled dict).
fn read_pickle(path: &Path, labels: Labels) -> Result<Batch, DataError> {
    parse_pickle(&read(path)?, path, labels)
}

/// The images and labels of a pickled python-version batch; `path` names
/// it in errors.
fn parse_pickle(bytes: &[u8], path: &Path, labels: Labels) -> Result<Batch, DataError> {
    let bad = |m: String| DataError::format(path, m);
    let value = serde_pickle::value_from_slice(
        bytes,
        DeOptions::new()
            .keep_restore_state()
            .replace_unresolved_globals(),
    )
    .map_err(|e| {
        bad(format!(
            "not a readable pickle (truncated or corrupt?): {e}"
        ))
    })?;
    let Value::Dict(dict) = value else {
        return Err(bad("the pickled object is not a dict".into()));
    };
    // Python 2 wrote the keys as byte strings; accept text keys too.
    let get = |key: &str| {
        dict.get(&HashableValue::Bytes(key.as_bytes().to_vec()))
            .or_else(|| dict.get(&HashableValue::String(key.to_string())))
    };
    let data = get("data").ok_or_else(|| bad("the dict has no key 'data'".into()))?;
    let (shape, raw) = numpy_u8(data).map_err(|m| bad(format!("'data': {m}")))?;
    let n = match shape[..] {
        [n, PIXELS] => n,
        _ => {
            return Err(bad(format!(
                "'data' has shape {shape:?}, expected (N, {PIXELS})"
            )));
        }
    };
    // A corrupt shape can claim more images than memory holds: compare
    // without overflowing.
    if n.checked_mul(PIXELS) != Some(raw.len()) {
        return Err(bad(format!(
            "'data' holds {} bytes but its shape ({n}, {PIXELS}) needs {} (truncated or not uint8)",
            raw.len(),
            n.checked_mul(PIXELS)
                .map_or_else(|| "more than memory holds".to_string(), |b| b.to_string())
        )));
    }
    let key = match labels {
        Labels::Cifar10 => "labels",
        Labels::Fine => "fine_labels",
        Labels::Coarse => "coarse_labels",
    };
    let Some(Value::List(list)) = get(key) else {
        return Err(bad(format!("the dict has no list '{key}'")));
    };
    if list.len() != n {
        return Err(bad(format!(
            "'data' holds {n} images but '{key}' holds {} labels",
            list.len()
        )));
    }
    let ys = list
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::I64(y) => check_label(path, labels, i, *y),
            other => Err(bad(format!(
                "'{key}'[{i}] is {other:?}, expected an integer"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((raw.clone(), ys))
}

/// The shape and raw bytes of a pickled numpy array, as serde-pickle keeps
/// it: the state tuple `(version, shape, dtype, fortran_order, raw)`.
fn numpy_u8(v: &Value) -> Result<(Vec<usize>, &Vec<u8>), String> {
    let Value::Tuple(state) = v else {
        return Err("not a pickled numpy array".into());
    };
    // numpy writes (version, shape, dtype, is_fortran, raw); very old ones
    // omit the version.
    let items = match state.len() {
        5 => &state[1..],
        4 => &state[..],
        _ => return Err("not a pickled numpy array (unexpected state)".into()),
    };
    let Value::Tuple(dims) = &items[0] else {
        return Err("not a pickled numpy array (no shape)".into());
    };
    let shape = dims
        .iter()
        .map(|d| match d {
            Value::I64(x) if *x >= 0 => Ok(*x as usize),
            _ => Err("not a pickled numpy array (bad shape)".to_string()),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if matches!(items[2], Value::Bool(true)) {
        return Err("Fortran-ordered arrays are not supported".into());
    }
    match &items[3] {
        Value::Bytes(raw) => Ok((shape, raw)),
        _ => Err("not a pickled numpy array (no raw data)".into()),
    }
}

/// The binary-version (`pickle = false`) or python-version parser on raw
/// bytes, for the fuzz targets; `variant` picks the labels (0: CIFAR-10,
/// 1: CIFAR-100 fine, else coarse).
#[cfg(feature = "fuzzing")]
pub(crate) fn check_file(bytes: &[u8], pickle: bool, variant: u8) -> Result<Split, DataError> {
    let labels = match variant {
        0 => Labels::Cifar10,
        1 => Labels::Fine,
        _ => Labels::Coarse,
    };
    let path = Path::new(crate::fuzzing::INPUT);
    let batch = if pickle {
        parse_pickle(bytes, path, labels)?
    } else {
        parse_binary(bytes, path, labels)?
    };
    Ok(to_split(batch, CIFAR10_MEAN, CIFAR10_STD))
}
