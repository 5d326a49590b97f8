//! `pfllib`: a federated dataset as PFLlib's `dataset/generate_*.py`
//! scripts write it (TsingZ0/PFLlib, `dataset/utils/dataset_utils.py`
//! `save_file`). `data.path` is the folder holding
//!
//! ```text
//! config.json     {"num_clients": N, "num_classes": C,
//!                  "Size of samples for labels in clients": [[[label, count], …], …], …}
//! train/{id}.npz  for id in 0..N
//! test/{id}.npz
//! ```
//!
//! Each `.npz` is `np.savez_compressed(f, data={'x': X, 'y': y})`: one
//! member `data.npy`, a 0-d object array whose pickle (protocol 3) holds
//! the dict of two numpy arrays. The pickle is decoded with `serde-pickle`;
//! each array is its state tuple `(version, shape, dtype, fortran_order,
//! raw_bytes)`. `serde-pickle` keeps a dtype's type string only where the
//! pickle refers back to an earlier dtype, so the element type is read from
//! the type string when present, else from the element size (the raw
//! bytes per element) and the array's role: `x` must be floating point
//! (`float32` or `float64`; PFLlib's image sets store normalised
//! `float32` `[n, C, H, W]`), `y` integer (`int64`, `int32` or 8-bit).
//! Integer `x` (PFLlib's text sets, token ids) is refused. Archives with
//! plain `x.npy` and `y.npy` members (the same arrays saved directly) are
//! read too.
//!
//! - **Clients**: PFLlib's own (`num_clients`; the experiment's `clients`
//!   must equal it), each with exactly PFLlib's train/test split;
//!   `partition.kind = "natural"`, validation carved off each client's
//!   training samples by `partition.val_fraction` as for every dataset.
//! - **Checks**: every label below `num_classes`, `x` and `y` of equal
//!   length, one sample shape for all files, finite features, and each
//!   client's label counts (train + test) equal to `config.json`'s
//!   statistics when it has them.
//! - Features are taken as stored (PFLlib normalised them already);
//!   `data.normalize` has no effect.

use std::io::Cursor;
use std::path::Path;

use serde_pickle::{DeOptions, HashableValue, Value};

use crate::dataset::{Dataset, NaturalClient, Split};
use crate::files::{Npz, need_path, not_found, read, refuse_subsample};
use crate::{DataConfig, DataError};

/// One client file's samples.
#[derive(Debug, PartialEq)]
pub(crate) struct Samples {
    /// Shape of one sample.
    pub shape: Vec<usize>,
    /// `n × prod(shape)` features.
    pub x: Vec<f32>,
    /// `n` labels.
    pub y: Vec<i64>,
}

/// Loads the PFLlib dataset in `cfg.path`; `clients` must be its
/// `num_clients`.
pub(crate) fn load(
    cfg: &DataConfig,
    clients: usize,
    _hosted: Option<&[usize]>,
) -> Result<Dataset, DataError> {
    let root = need_path(
        cfg,
        "PFLlib's dataset folder holding config.json, train/ and test/",
    )?;
    refuse_subsample(cfg)?;
    let config_path = root.join("config.json");
    let (num_clients, num_classes, stats) = read_config(&config_path)?;
    if clients != num_clients {
        return Err(DataError::config(
            "clients",
            format!(
                "the PFLlib dataset in {} has num_clients = {num_clients} (config.json) but clients = {clients}: set clients = {num_clients}",
                root.display()
            ),
        ));
    }
    let mut train = Split::default();
    let mut test = Split::default();
    let mut shape: Option<(Vec<usize>, std::path::PathBuf)> = None;
    let mut natural = Vec::with_capacity(num_clients);
    for id in 0..num_clients {
        let start = (train.labels.len(), test.labels.len());
        let mut counts = vec![0usize; num_classes];
        for (folder, split) in [("train", &mut train), ("test", &mut test)] {
            let path = root.join(folder).join(format!("{id}.npz"));
            if !path.is_file() {
                return Err(not_found(
                    &path,
                    format!(
                        "client {id}'s {folder} file is missing (config.json has num_clients = {num_clients})"
                    ),
                ));
            }
            let s = parse_npz(&read(&path)?, &path)?;
            match &shape {
                Some((first, at)) if *first != s.shape => {
                    return Err(DataError::format(
                        &path,
                        format!(
                            "samples of shape {:?}, but {} has {first:?}",
                            s.shape,
                            at.display()
                        ),
                    ));
                }
                Some(_) => {}
                None => shape = Some((s.shape.clone(), path.clone())),
            }
            for (i, &y) in s.y.iter().enumerate() {
                let Some(c) = usize::try_from(y).ok().filter(|&c| c < num_classes) else {
                    return Err(DataError::format(
                        &path,
                        format!("label {y} of sample {i} is not below num_classes = {num_classes}"),
                    ));
                };
                counts[c] += 1;
                split.labels.push(c as u32);
            }
            split.features.extend_from_slice(&s.x);
        }
        if let Some(stats) = &stats {
            check_counts(&config_path, id, &counts, &stats[id])?;
        }
        natural.push(NaturalClient {
            train: (start.0..train.labels.len()).collect(),
            val: Vec::new(),
            test: (start.1..test.labels.len()).collect(),
            remote: false,
        });
    }
    Ok(Dataset::classification(
        "pfllib",
        num_classes,
        shape.map(|(s, _)| s).unwrap_or_default(),
        (train, test),
        Some(natural),
    ))
}

/// Per client, `(label, count)` pairs.
type Stats = Vec<Vec<(usize, usize)>>;

/// `num_clients`, `num_classes` and (when present) the per-client label
/// counts of `config.json`.
fn read_config(path: &Path) -> Result<(usize, usize, Option<Stats>), DataError> {
    let bad = |m: &str| DataError::format(path, m.to_string());
    let v: serde_json::Value = serde_json::from_slice(&read(path)?)
        .map_err(|e| DataError::format(path, format!("not valid JSON: {e}")))?;
    let count = |key: &str| {
        v.get(key)
            .and_then(serde_json::Value::as_u64)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0)
            .ok_or_else(|| bad(&format!("needs \"{key}\", a positive integer")))
    };
    let clients = count("num_clients")?;
    let classes = count("num_classes")?;
    let Some(stats) = v.get("Size of samples for labels in clients") else {
        return Ok((clients, classes, None));
    };
    let stats_err = "\"Size of samples for labels in clients\" must be one list of [label, count] pairs per client";
    let clients_stats = stats.as_array().ok_or_else(|| bad(stats_err))?;
    if clients_stats.len() != clients {
        return Err(bad(&format!(
            "\"Size of samples for labels in clients\" lists {} clients, num_clients = {clients}",
            clients_stats.len()
        )));
    }
    let pair = |p: &serde_json::Value| -> Option<(usize, usize)> {
        let p = p.as_array().filter(|p| p.len() == 2)?;
        let n = |v: &serde_json::Value| v.as_u64().and_then(|n| usize::try_from(n).ok());
        Some((n(&p[0])?, n(&p[1])?))
    };
    let stats = clients_stats
        .iter()
        .map(|c| c.as_array()?.iter().map(pair).collect::<Option<Vec<_>>>())
        .collect::<Option<Stats>>()
        .ok_or_else(|| bad(stats_err))?;
    Ok((clients, classes, Some(stats)))
}

/// Client `id`'s label counts (train + test) against config.json's.
fn check_counts(
    path: &Path,
    id: usize,
    counts: &[usize],
    stats: &[(usize, usize)],
) -> Result<(), DataError> {
    let mut want = vec![0usize; counts.len()];
    for &(label, n) in stats {
        match want.get_mut(label) {
            Some(w) => *w += n,
            None => {
                return Err(DataError::format(
                    path,
                    format!("client {id}: label {label} is not below num_classes"),
                ));
            }
        }
    }
    if want != counts {
        return Err(DataError::format(
            path,
            format!(
                "client {id}'s files hold label counts {counts:?} (train + test) but config.json says {want:?}: files of another generation?"
            ),
        ));
    }
    Ok(())
}

/// The samples of one PFLlib `.npz` file; `path` names it in errors.
pub(crate) fn parse_npz(bytes: &[u8], path: &Path) -> Result<Samples, DataError> {
    let name = path.display().to_string();
    let mut npz = Npz::new(Cursor::new(bytes), &name)?;
    let (x, y) = if npz.has("data") {
        let npy = npz.npy("data")?;
        if !npy.uses_pickled_array() || !npy.shape().is_empty() {
            return Err(npz.error(
                "data",
                "expected PFLlib's 0-d object array holding the dict {'x': X, 'y': y}",
            ));
        }
        // The pickle is what follows the header the reader consumed.
        let rest = npy.into_inner();
        let start = usize::try_from(rest.position()).unwrap_or(usize::MAX);
        let pickle = rest.into_inner();
        let dict = unpickle_dict(pickle.get(start..).unwrap_or_default())
            .map_err(|m| npz.error("data", m))?;
        let get = |k: &str| {
            dict.iter()
                .find(|(key, _)| matches!(key, HashableValue::String(s) if s == k))
                .map(|(_, v)| v)
                .ok_or_else(|| format!("the dict has no key '{k}' (PFLlib writes 'x' and 'y')"))
        };
        let x = get("x")
            .and_then(|v| floats(v, "x"))
            .map_err(|m| npz.error("data", m))?;
        let y = get("y")
            .and_then(|v| ints(v, "y"))
            .map_err(|m| npz.error("data", m))?;
        (x, y)
    } else if npz.has("x") && npz.has("y") {
        (plain_x(&mut npz)?, plain_y(&mut npz)?)
    } else {
        return Err(DataError::format(
            path,
            "neither a member data.npy (PFLlib's pickled dict) nor members x.npy and y.npy",
        ));
    };
    let (x, x_shape) = x;
    let (y, y_shape) = y;
    let n = y.len();
    if y_shape.len() != 1 {
        return Err(DataError::format(
            path,
            format!("y has shape {y_shape:?}, expected one label per sample [n]"),
        ));
    }
    if x_shape.first() != Some(&n) {
        return Err(DataError::format(
            path,
            format!("x has shape {x_shape:?} but y holds {n} labels: x and y differ in length"),
        ));
    }
    let shape = x_shape[1..].to_vec();
    if shape.contains(&0) || (shape.is_empty() && n > 0) {
        return Err(DataError::format(
            path,
            format!("x has shape {x_shape:?}: samples hold no feature"),
        ));
    }
    if let Some(i) = x.iter().position(|v| !v.is_finite()) {
        return Err(DataError::format(
            path,
            format!("x holds a non-finite value at flat index {i}"),
        ));
    }
    Ok(Samples { shape, x, y })
}

/// The dict PFLlib pickled in the 0-d object array.
fn unpickle_dict(bytes: &[u8]) -> Result<Vec<(HashableValue, Value)>, String> {
    let value = serde_pickle::value_from_slice(
        bytes,
        DeOptions::new()
            .keep_restore_state()
            .replace_unresolved_globals(),
    )
    .map_err(|e| format!("not a readable pickle (truncated or corrupt?): {e}"))?;
    // The object array's state: (version, (), dtype, fortran, [object]).
    let objects = match state(&value) {
        Some([_, _, _, Value::List(objects)]) => objects,
        _ => return Err("the pickle is not a numpy object array".into()),
    };
    match objects.as_slice() {
        [Value::Dict(d)] => Ok(d.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        _ => Err("the object array does not hold one dict".into()),
    }
}

/// The four items `(shape, dtype, fortran_order, data)` of a pickled
/// numpy array's state (numpy writes a leading version; very old ones
/// omit it).
fn state(v: &Value) -> Option<&[Value; 4]> {
    let Value::Tuple(t) = v else { return None };
    let items = match t.len() {
        5 => &t[1..],
        4 => &t[..],
        _ => return None,
    };
    items.try_into().ok()
}

/// A pickled array's shape, element size in bytes, type string (when the
/// pickle kept it) and raw little-endian bytes.
struct RawArray<'a> {
    shape: Vec<usize>,
    elem: usize,
    type_str: Option<&'a str>,
    raw: &'a [u8],
}

fn raw_array<'a>(v: &'a Value, key: &str) -> Result<RawArray<'a>, String> {
    let not_array = || format!("'{key}' is not a numpy array");
    let [Value::Tuple(dims), dtype, fortran, Value::Bytes(raw)] = state(v).ok_or_else(not_array)?
    else {
        return Err(not_array());
    };
    if matches!(fortran, Value::Bool(true)) {
        return Err(format!("'{key}' is Fortran-ordered; save it in C order"));
    }
    let shape = dims
        .iter()
        .map(|d| match d {
            Value::I64(x) => usize::try_from(*x).ok(),
            _ => None,
        })
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| format!("'{key}' has a malformed shape"))?;
    // A dtype is (type string, align, copy) where the pickle refers back
    // to it, else its state (3, byte order, subarray, names, fields,
    // elsize, alignment, flags).
    let (type_str, order) = match dtype {
        Value::Tuple(t) => match t.as_slice() {
            [Value::String(s), ..] => (Some(s.as_str()), None),
            [_, Value::String(order), ..] => (None, Some(order.as_str())),
            _ => (None, None),
        },
        _ => (None, None),
    };
    if order == Some(">") || type_str.is_some_and(|s| s.starts_with('>')) {
        return Err(format!("'{key}' is big-endian; save it little-endian"));
    }
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("'{key}' has shape {shape:?}, more than memory holds"))?;
    let elem = raw.len().checked_div(count).unwrap_or(0);
    if count.checked_mul(elem) != Some(raw.len()) {
        return Err(format!(
            "'{key}' holds {} bytes, not a whole number of elements for shape {shape:?}",
            raw.len()
        ));
    }
    Ok(RawArray {
        shape,
        elem,
        type_str,
        raw,
    })
}

/// Flat float features and the shape of a pickled `x`.
fn floats(v: &Value, key: &str) -> Result<(Vec<f32>, Vec<usize>), String> {
    let a = raw_array(v, key)?;
    let kind = a.type_str.map(|s| s.trim_start_matches(['<', '=', '|']));
    let x: Vec<f32> = match (kind, a.elem) {
        (Some("f4") | None, 4) => a
            .raw
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        (Some("f8") | None, 8) => a
            .raw
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) as f32)
            .collect(),
        (_, 0) => Vec::new(),
        (t, e) => {
            return Err(format!(
                "'{key}' has dtype {} ({e}-byte elements); PFLlib features must be float32 or float64",
                t.unwrap_or("?")
            ));
        }
    };
    if a.type_str.is_none() && holds_integers(a.raw, a.elem) {
        return Err(format!(
            "'{key}' holds integers (token ids?), not float features"
        ));
    }
    Ok((x, a.shape))
}

/// Whether raw elements of `elem` bytes read as floats are all zero or
/// subnormal, and not all zero: the bits of small integers (a float array
/// of real data has normal values).
fn holds_integers(raw: &[u8], elem: usize) -> bool {
    let exponent_zero = |b: &[u8]| match *b {
        [.., b2, b3] if elem == 4 => u16::from_le_bytes([b2, b3]) & 0x7f80 == 0,
        [.., b6, b7] => u16::from_le_bytes([b6, b7]) & 0x7ff0 == 0,
        _ => false,
    };
    elem >= 4 && raw.iter().any(|&b| b != 0) && raw.chunks_exact(elem).all(exponent_zero)
}

/// Labels and the shape of a pickled `y`.
fn ints(v: &Value, key: &str) -> Result<(Vec<i64>, Vec<usize>), String> {
    let a = raw_array(v, key)?;
    let kind = a.type_str.map(|s| s.trim_start_matches(['<', '=', '|']));
    let y: Vec<i64> = match (kind, a.elem) {
        (Some("i8") | None, 8) => a
            .raw
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect(),
        (Some("i4") | None, 4) => a
            .raw
            .chunks_exact(4)
            .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect(),
        (Some("u1") | None, 1) => a.raw.iter().map(|&b| i64::from(b)).collect(),
        (Some("i1"), 1) => a.raw.iter().map(|&b| i64::from(b as i8)).collect(),
        (_, 0) => Vec::new(),
        (t, e) => {
            return Err(format!(
                "'{key}' has dtype {} ({e}-byte elements); PFLlib labels must be integers",
                t.unwrap_or("?")
            ));
        }
    };
    Ok((y, a.shape))
}

/// `x.npy` of a plain archive: float32 or float64.
fn plain_x<R: std::io::Read + std::io::Seek>(
    npz: &mut Npz<R>,
) -> Result<(Vec<f32>, Vec<usize>), DataError> {
    let descr = npz.npy("x")?.dtype().descr();
    match descr.trim_matches('\'') {
        "<f4" => npz.array::<f32>("x"),
        "<f8" => npz
            .array::<f64>("x")
            .map(|(v, s)| (v.into_iter().map(|v| v as f32).collect(), s)),
        other => Err(npz.error(
            "x",
            format!("dtype {other}; PFLlib features must be float32 or float64"),
        )),
    }
}

/// `y.npy` of a plain archive: an integer dtype.
fn plain_y<R: std::io::Read + std::io::Seek>(
    npz: &mut Npz<R>,
) -> Result<(Vec<i64>, Vec<usize>), DataError> {
    let descr = npz.npy("y")?.dtype().descr();
    let widen = |(v, s): (Vec<i32>, Vec<usize>)| (v.into_iter().map(i64::from).collect(), s);
    match descr.trim_matches('\'') {
        "<i8" => npz.array::<i64>("y"),
        "<i4" => npz.array::<i32>("y").map(widen),
        "|u1" => npz
            .array::<u8>("y")
            .map(|(v, s)| (v.into_iter().map(i64::from).collect(), s)),
        other => Err(npz.error(
            "y",
            format!("dtype {other}; PFLlib labels must be int64, int32 or uint8"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use proptest::prelude::*;

    use super::*;

    /// A pickle (protocol 3) written opcode by opcode the way numpy pickles
    /// a 0-d object array holding a dict of arrays (`np.save` of PFLlib's
    /// `{'x': X, 'y': y}`): `_reconstruct` globals, each dtype reduced
    /// from `(type string, False, True)` and built from its state, raw
    /// data as bytes.
    struct Pickler {
        out: Vec<u8>,
        memo: u8,
    }

    impl Pickler {
        fn put(&mut self) {
            self.out.extend([b'q', self.memo]);
            self.memo += 1;
        }
        fn text(&mut self, s: &str) {
            self.out.push(b'X');
            self.out.extend((s.len() as u32).to_le_bytes());
            self.out.extend(s.as_bytes());
            self.put();
        }
        fn int(&mut self, v: i32) {
            self.out.push(b'J');
            self.out.extend(v.to_le_bytes());
        }
        /// `_reconstruct(ndarray, (0,), b'b')` (memo 0 to 3 after the first).
        fn reconstruct(&mut self) {
            if self.memo == 0 {
                self.out
                    .extend(b"\x80\x03cnumpy.core.multiarray\n_reconstruct\n");
                self.put();
                self.out.extend(b"cnumpy\nndarray\n");
                self.put();
                self.out.extend(b"K\x00\x85");
                self.put();
                self.out.extend(b"C\x01b");
                self.put();
            } else {
                self.out.extend(b"h\x00h\x01h\x02h\x03");
            }
            self.out.extend(b"\x87R");
            self.put();
        }
        /// `dtype(type_str, False, True)` built from its state.
        fn dtype(&mut self, type_str: &str, order: &str, flags: i32) {
            self.out.extend(b"cnumpy\ndtype\n");
            self.put();
            self.text(type_str);
            self.out.extend(b"\x89\x88\x87R");
            self.put();
            self.out.extend(b"(K\x03");
            self.text(order);
            self.out.extend(b"NNN");
            self.int(-1);
            self.int(-1);
            self.int(flags);
            self.out.extend(b"tb");
        }
        fn array(&mut self, shape: &[usize], type_str: &str, raw: &[u8]) {
            self.reconstruct();
            self.out.extend(b"(K\x01(");
            for &d in shape {
                self.int(d as i32);
            }
            self.out.push(b't');
            self.dtype(type_str, "<", 0);
            self.out.extend(b"\x89B");
            self.out.extend((raw.len() as u32).to_le_bytes());
            self.out.extend(raw);
            self.out.extend(b"tb");
        }
    }

    /// `np.savez_compressed(f, data={'x': ..., 'y': ...})`, with the given
    /// keys and dtypes.
    fn pfllib_npz(members: &[(&str, &[usize], &str, Vec<u8>)]) -> Vec<u8> {
        let mut p = Pickler {
            out: Vec::new(),
            memo: 0,
        };
        p.reconstruct();
        p.out.extend(b"(K\x01)");
        p.dtype("O8", "|", 63);
        p.out.extend(b"\x89]");
        p.put();
        p.out.extend(b"}");
        p.put();
        p.out.push(b'(');
        for (key, shape, type_str, raw) in members {
            p.text(key);
            p.array(shape, type_str, raw);
        }
        p.out.extend(b"uatb.");
        let mut header = "{'descr': '|O', 'fortran_order': False, 'shape': (), }".to_string();
        while !(10 + header.len() + 1).is_multiple_of(64) {
            header.push(' ');
        }
        header.push('\n');
        let mut npy = b"\x93NUMPY\x01\x00".to_vec();
        npy.extend((header.len() as u16).to_le_bytes());
        npy.extend(header.as_bytes());
        npy.extend(&p.out);
        zip_of(&[("data.npy", npy)])
    }

    fn zip_of(members: &[(&str, Vec<u8>)]) -> Vec<u8> {
        let mut buf = Cursor::new(Vec::new());
        let mut z = zip::ZipWriter::new(&mut buf);
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (name, bytes) in members {
            z.start_file(*name, opts).unwrap();
            z.write_all(bytes).unwrap();
        }
        z.finish().unwrap();
        buf.into_inner()
    }

    /// A `.npy` file of `data`, as numpy writes it.
    fn npy<T: npyz::AutoSerialize + Copy>(data: &[T], shape: &[u64]) -> Vec<u8> {
        use npyz::WriterBuilder;
        let mut out = Vec::new();
        let mut w = npyz::WriteOptions::<T>::new()
            .default_dtype()
            .shape(shape)
            .writer(&mut out)
            .begin_nd()
            .unwrap();
        w.extend(data.iter().copied()).unwrap();
        w.finish().unwrap();
        out
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn i64_bytes(v: &[i64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Client `id`'s samples of a split: `n` images [1, 2, 2] with values
    /// `id + k/10 + j/100` and labels `(id + k) % 3`.
    fn samples(id: usize, n: usize, split: usize) -> (Vec<f32>, Vec<i64>) {
        let x = (0..n * 4)
            .map(|j| id as f32 + (j / 4) as f32 / 10.0 + (j % 4 + split) as f32 / 100.0)
            .collect();
        let y = (0..n).map(|k| ((id + k) % 3) as i64).collect();
        (x, y)
    }

    const SIZES: [(usize, usize); 3] = [(4, 2), (6, 1), (3, 3)];

    fn fixture(dir: &Path) {
        std::fs::create_dir_all(dir.join("train")).unwrap();
        std::fs::create_dir_all(dir.join("test")).unwrap();
        let mut stats = Vec::new();
        for (id, &(ntr, nte)) in SIZES.iter().enumerate() {
            let mut counts = [0usize; 3];
            for (split, (folder, n)) in [("train", ntr), ("test", nte)].into_iter().enumerate() {
                let (x, y) = samples(id, n, split);
                y.iter().for_each(|&c| counts[c as usize] += 1);
                let npz = pfllib_npz(&[
                    ("x", &[n, 1, 2, 2], "f4", f32_bytes(&x)),
                    ("y", &[n], "i8", i64_bytes(&y)),
                ]);
                std::fs::write(dir.join(folder).join(format!("{id}.npz")), npz).unwrap();
            }
            let pairs: Vec<[usize; 2]> = (0..3)
                .filter(|&c| counts[c] > 0)
                .map(|c| [c, counts[c]])
                .collect();
            stats.push(pairs);
        }
        let config = serde_json::json!({
            "num_clients": 3, "num_classes": 3, "non_iid": true, "balance": false,
            "partition": "dir", "Size of samples for labels in clients": stats,
            "alpha": 0.1, "batch_size": 10,
        });
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    }

    fn cfg(dir: &Path) -> DataConfig {
        DataConfig {
            dataset: "pfllib".into(),
            path: Some(dir.to_path_buf()),
            ..DataConfig::default()
        }
    }

    #[test]
    fn pfllib_files_load_with_its_clients_and_split() {
        let dir = tempfile::tempdir().unwrap();
        fixture(dir.path());
        let ds = crate::load_federation(&cfg(dir.path()), 0, 3, None).unwrap();
        assert_eq!(
            (ds.num_classes, ds.feature_shape.clone()),
            (3, vec![1, 2, 2])
        );
        let nat = ds.natural_clients.as_ref().unwrap();
        let sizes: Vec<(usize, usize)> =
            nat.iter().map(|c| (c.train.len(), c.test.len())).collect();
        assert_eq!(sizes, SIZES);
        assert_eq!(nat[1].train, (4..10).collect::<Vec<_>>());
        assert_eq!(nat[2].test, vec![3, 4, 5]);
        // Client 1's second training sample, value by value.
        assert_eq!(ds.train.row(5, 4), [1.1, 1.11, 1.12, 1.13]);
        assert_eq!(ds.train.labels[5], 2);
        let (x, y) = samples(2, 3, 1);
        assert_eq!(&ds.test.features[12..], &x[..]);
        let y: Vec<u32> = y.iter().map(|&c| c as u32).collect();
        assert_eq!(&ds.test.labels[3..], &y[..]);
    }

    #[test]
    fn clients_must_equal_num_clients() {
        let dir = tempfile::tempdir().unwrap();
        fixture(dir.path());
        let e = crate::load_federation(&cfg(dir.path()), 0, 5, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`clients`") && e.contains("num_clients = 3") && e.contains("clients = 5"),
            "{e}"
        );
    }

    #[test]
    fn bad_files_are_errors_that_name_them() {
        let dir = tempfile::tempdir().unwrap();
        fixture(dir.path());
        let file = dir.path().join("train").join("1.npz");
        let err = |bytes: Vec<u8>| {
            std::fs::write(&file, bytes).unwrap();
            let e = crate::load_federation(&cfg(dir.path()), 0, 3, None)
                .unwrap_err()
                .to_string();
            assert!(e.contains("1.npz"), "{e}");
            e
        };
        let x = f32_bytes(&samples(1, 6, 0).0);
        let y = i64_bytes(&samples(1, 6, 0).1);
        let e = err(pfllib_npz(&[
            ("x", &[6, 1, 2, 2], "f4", x.clone()),
            ("label", &[6], "i8", y.clone()),
        ]));
        assert!(e.contains("no key 'y'"), "{e}");
        let e = err(pfllib_npz(&[
            ("x", &[5, 1, 2, 2], "f4", x[..80].to_vec()),
            ("y", &[6], "i8", y.clone()),
        ]));
        assert!(e.contains("differ in length"), "{e}");
        // Integer features (token ids) and float labels.
        let e = err(pfllib_npz(&[
            ("x", &[6, 4], "i8", i64_bytes(&[7; 24])),
            ("y", &[6], "i8", y.clone()),
        ]));
        assert!(e.contains("integers"), "{e}");
        let e = err(pfllib_npz(&[
            ("x", &[6, 1, 2, 2], "f4", x.clone()),
            ("y", &[6], "f8", f64::to_le_bytes(1.0).repeat(6)),
        ]));
        assert!(e.contains("not below num_classes"), "{e}");
        let e = err(pfllib_npz(&[
            ("x", &[6, 4], "f4", x.clone()),
            ("y", &[6], "i8", y.clone()),
        ]));
        assert!(e.contains("[4]") && e.contains("[1, 2, 2]"), "{e}");
        let e = err(b"PK\x03\x04 not a zip".to_vec());
        assert!(e.contains("zip"), "{e}");
        let e = err(zip_of(&[("other.npy", vec![1, 2, 3])]));
        assert!(e.contains("x.npy and y.npy"), "{e}");
        // Plain members: dtypes are exact there.
        let plain =
            |x_npy: Vec<u8>| zip_of(&[("x.npy", x_npy), ("y.npy", npy(&samples(1, 6, 0).1, &[6]))]);
        let e = err(plain(npy(&[7i32; 24], &[6, 1, 2, 2])));
        assert!(e.contains("x.npy") && e.contains("<i4"), "{e}");
        std::fs::write(&file, plain(npy(&samples(1, 6, 0).0, &[6, 1, 2, 2]))).unwrap();
        let ds = crate::load_federation(&cfg(dir.path()), 0, 3, None).unwrap();
        assert_eq!(ds.train.row(5, 4), [1.1, 1.11, 1.12, 1.13]);
        std::fs::remove_file(&file).unwrap();
        let e = crate::load_federation(&cfg(dir.path()), 0, 3, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("1.npz") && e.contains("missing"), "{e}");
    }

    #[test]
    fn counts_must_match_config_json() {
        let dir = tempfile::tempdir().unwrap();
        fixture(dir.path());
        let path = dir.path().join("config.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["Size of samples for labels in clients"][0][0][1] = 99.into();
        std::fs::write(&path, v.to_string()).unwrap();
        let e = crate::load_federation(&cfg(dir.path()), 0, 3, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("client 0") && e.contains("config.json says"),
            "{e}"
        );
        std::fs::write(&path, "{\"num_classes\": 3}").unwrap();
        let e = crate::load_federation(&cfg(dir.path()), 0, 3, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("num_clients"), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

        /// A written file reads back exactly, whatever its size and values.
        #[test]
        fn written_then_read_round_trips(
            x in proptest::collection::vec(-1e6f32..1e6, 1..40),
            seed in 0i64..1000,
        ) {
            let n = x.len();
            let y: Vec<i64> = (0..n as i64).map(|k| (k * seed) % 7).collect();
            let bytes = pfllib_npz(&[
                ("x", &[n, 1], "f4", f32_bytes(&x)),
                ("y", &[n], "i8", i64_bytes(&y)),
            ]);
            let s = parse_npz(&bytes, Path::new("f.npz")).unwrap();
            prop_assert_eq!(s, Samples { shape: vec![1], x, y });
        }

        /// Random bytes, and a valid file with bytes flipped or cut, give an
        /// error or a result, never a panic.
        #[test]
        fn corrupt_files_never_panic(
            noise in proptest::collection::vec(any::<u8>(), 0..200),
            at in any::<prop::sample::Index>(),
            cut in any::<prop::sample::Index>(),
        ) {
            let _ = parse_npz(&noise, Path::new("f.npz"));
            let mut p = Pickler { out: Vec::new(), memo: 0 };
            p.array(&[2, 2], "f4", &f32_bytes(&[1.0, 2.0, 3.0, 4.0]));
            let mut pickle = p.out;
            let i = at.index(pickle.len());
            pickle[i] ^= noise.first().copied().unwrap_or(0xff);
            pickle.truncate(cut.index(pickle.len() + 1).max(1));
            let _ = unpickle_dict(&pickle);
            let bytes = pfllib_npz(&[
                ("x", &[2, 2], "f4", f32_bytes(&[1.0, 2.0, 3.0, 4.0])),
                ("y", &[2], "i8", i64_bytes(&[0, 1])),
            ]);
            let mut bad = bytes.clone();
            let i = at.index(bad.len());
            bad[i] ^= 0x5a;
            let _ = parse_npz(&bad, Path::new("f.npz"));
        }
    }
}
