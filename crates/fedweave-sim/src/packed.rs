//! One serde value in one safetensors buffer: every stashed vector (see
//! `fedweave_core::stash`) as a 1-D F32 tensor, the rest as JSON in the
//! metadata. Checkpoints are such files; the network runtime sends such
//! buffers, so a model crosses the wire as raw little-endian floats and
//! arrives bit-identical.

use fedweave_core::stash::Stash;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

/// The metadata key that holds the value's JSON.
const BODY: &str = "state";

/// Packs `value` with the extra `meta` entries (format, version, ...).
pub fn pack<T: Serialize>(value: &T, mut meta: HashMap<String, String>) -> Result<Vec<u8>, String> {
    let vectors = split(value, &mut meta)?;
    let bytes: Vec<Cow<[u8]>> = vectors.iter().map(|v| le_bytes(v)).collect();
    safetensors::tensor::serialize(views(&vectors, &bytes)?, Some(meta)).map_err(|e| e.to_string())
}

/// [`pack`] written straight to the file `path` (streamed: no second copy
/// of the state in memory, which at hundreds of clients is gigabytes).
pub fn pack_to_file<T: Serialize>(
    value: &T,
    mut meta: HashMap<String, String>,
    path: &Path,
) -> Result<(), String> {
    let vectors = split(value, &mut meta)?;
    let bytes: Vec<Cow<[u8]>> = vectors.iter().map(|v| le_bytes(v)).collect();
    safetensors::tensor::serialize_to_file(views(&vectors, &bytes)?, Some(meta), path)
        .map_err(|e| e.to_string())
}

/// The stashed vectors of `value`; its JSON goes into `meta`.
fn split<T: Serialize>(
    value: &T,
    meta: &mut HashMap<String, String>,
) -> Result<Vec<Vec<f32>>, String> {
    let (json, vectors) = Stash::collect(|| serde_json::to_string(value));
    let json = json.map_err(|e| format!("cannot serialize: {e}"))?;
    meta.insert(BODY.to_string(), json);
    Ok(vectors)
}

/// One named 1-D F32 tensor per vector, over its little-endian bytes.
fn views<'a>(
    vectors: &[Vec<f32>],
    bytes: &'a [Cow<'a, [u8]>],
) -> Result<Vec<(String, TensorView<'a>)>, String> {
    vectors
        .iter()
        .zip(bytes)
        .enumerate()
        .map(|(k, (v, b))| {
            let view = TensorView::new(Dtype::F32, vec![v.len()], b).map_err(|e| e.to_string())?;
            Ok((format!("v{k:07}"), view))
        })
        .collect()
}

/// `v` as little-endian bytes: a view of its memory on little-endian
/// machines (no copy), converted elsewhere.
pub(crate) fn le_bytes(v: &[f32]) -> Cow<'_, [u8]> {
    if cfg!(target_endian = "little") {
        Cow::Borrowed(bytemuck::cast_slice(v))
    } else {
        Cow::Owned(v.iter().flat_map(|x| x.to_le_bytes()).collect())
    }
}

/// A packed buffer's metadata and vectors, checked to be well formed but
/// not yet turned into a value (callers check the metadata first).
pub struct Unpacked {
    /// The metadata entries.
    pub meta: HashMap<String, String>,
    vectors: Vec<Vec<f32>>,
}

impl Unpacked {
    /// Parses `buffer`; every tensor must be a 1-D F32 vector.
    pub fn parse(buffer: &[u8]) -> Result<Self, String> {
        let tensors = SafeTensors::deserialize(buffer).map_err(|e| e.to_string())?;
        let (_, header) = SafeTensors::read_metadata(buffer).map_err(|e| e.to_string())?;
        let meta = header.metadata().clone().unwrap_or_default();
        let mut names = tensors.names();
        names.sort_unstable();
        let mut vectors = Vec::with_capacity(names.len());
        for name in names {
            let t = tensors.tensor(name).map_err(|e| e.to_string())?;
            if t.dtype() != Dtype::F32 || t.shape().len() != 1 {
                return Err(format!("tensor {name} is not a 1-D f32 vector"));
            }
            vectors.push(
                t.data()
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            );
        }
        Ok(Self { meta, vectors })
    }

    /// A metadata entry, or "" when absent.
    pub fn get(&self, key: &str) -> &str {
        self.meta.get(key).map(String::as_str).unwrap_or("")
    }

    /// The packed value.
    pub fn value<T: DeserializeOwned>(self) -> Result<T, String> {
        let json = self.meta.get(BODY).cloned().unwrap_or_default();
        Stash::provide(self.vectors, || serde_json::from_str(&json)).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Msg {
        #[serde(with = "fedweave_core::stash::vector")]
        model: Vec<f32>,
        loss: f64,
    }

    #[test]
    fn values_round_trip_bit_for_bit_and_bad_buffers_are_errors() {
        let m = Msg {
            model: vec![1.5, -0.0, f32::MIN_POSITIVE, 3.0e-39],
            loss: 0.1 + 0.2,
        };
        let meta = HashMap::from([("format".to_string(), "x".to_string())]);
        let buf = pack(&m, meta).unwrap();
        let u = Unpacked::parse(&buf).unwrap();
        assert_eq!(u.get("format"), "x");
        let back: Msg = u.value().unwrap();
        assert_eq!(back.loss.to_bits(), m.loss.to_bits());
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&back.model), bits(&m.model));
        assert!(Unpacked::parse(&buf[..buf.len() - 1]).is_err());
        assert!(Unpacked::parse(b"").is_err());
        // Streamed to a file: the same tensors and metadata (the header's
        // key order follows a HashMap, so whole files are not compared).
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.safetensors");
        let meta = HashMap::from([("format".to_string(), "x".to_string())]);
        pack_to_file(&m, meta, &file).unwrap();
        let bytes = std::fs::read(&file).unwrap();
        assert_eq!(bytes.len(), buf.len());
        let u = Unpacked::parse(&bytes).unwrap();
        assert_eq!(u.get("format"), "x");
        let back: Msg = u.value().unwrap();
        assert_eq!(back.loss.to_bits(), m.loss.to_bits());
        assert_eq!(bits(&back.model), bits(&m.model));
        // The tensor data (after the header) is the same bytes.
        let data = |b: &[u8]| {
            let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
            b[8 + n..].to_vec()
        };
        assert_eq!(data(&bytes), data(&buf));
    }
}
