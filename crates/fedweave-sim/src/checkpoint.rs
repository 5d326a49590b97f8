//! Checkpoints: `DIR/checkpoint/state.safetensors`, one file holding every
//! model-sized vector of the run state (the algorithm's server and client
//! states) as an F32 tensor, and the rest of the state as JSON in the
//! file's metadata, where vectors appear as `{"$vector": k}` (see
//! `fedweave_core::stash`). Python reads it with `safetensors.safe_open`.
//!
//! Written atomically: a temporary file in the same folder is written,
//! synced and renamed over the previous checkpoint, so a crash at any
//! moment leaves either the old or the new checkpoint, never a torn one.
//! Keyed random streams carry no state, so nothing else is needed to resume
//! bit-identically.

use crate::engine::RunError;
use crate::round::RunState;
use fedweave_core::stash::Stash;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What the file says it is.
const FORMAT: &str = "fedweave-checkpoint";
/// Bumped whenever the layout of the state changes incompatibly.
const VERSION: &str = "1";

/// The checkpoint file of a run directory.
pub(crate) fn path(dir: &Path) -> PathBuf {
    dir.join("checkpoint").join("state.safetensors")
}

/// Identity of the run a checkpoint belongs to: a checkpoint is only
/// resumed by the same algorithm on the same configuration.
pub(crate) struct Identity<'a> {
    /// The algorithm's name.
    pub algorithm: &'a str,
    /// The resolved configuration, less what may change on resume
    /// (`rounds`, `threads`, `checkpoint_every`).
    pub config: &'a str,
}

fn fail(p: &Path, message: impl Into<String>) -> RunError {
    RunError::Checkpoint {
        path: p.display().to_string(),
        message: message.into(),
    }
}

/// Writes `state` as the run's checkpoint, atomically.
pub(crate) fn save<S: Serialize, C: Serialize>(
    dir: &Path,
    id: &Identity,
    state: &RunState<S, C>,
) -> Result<(), RunError> {
    let target = path(dir);
    let folder = target.parent().unwrap_or(dir);
    std::fs::create_dir_all(folder).map_err(|e| fail(folder, e.to_string()))?;
    let (json, vectors) = Stash::collect(|| serde_json::to_string(state));
    let json = json.map_err(|e| fail(&target, format!("cannot serialize the state: {e}")))?;
    let bytes: Vec<Vec<u8>> = vectors
        .iter()
        .map(|v| v.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let mut views = Vec::with_capacity(bytes.len());
    for (k, (v, b)) in vectors.iter().zip(&bytes).enumerate() {
        let view = TensorView::new(Dtype::F32, vec![v.len()], b)
            .map_err(|e| fail(&target, e.to_string()))?;
        views.push((format!("v{k:07}"), view));
    }
    let metadata = HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("version".to_string(), VERSION.to_string()),
        (
            "fedweave".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
        ("algorithm".to_string(), id.algorithm.to_string()),
        ("config".to_string(), id.config.to_string()),
        ("round".to_string(), state.round.to_string()),
        ("state".to_string(), json),
    ]);
    let tmp = folder.join("state.safetensors.tmp");
    safetensors::tensor::serialize_to_file(views, Some(metadata), &tmp)
        .map_err(|e| fail(&tmp, e.to_string()))?;
    let sync = |p: &Path| std::fs::File::open(p).and_then(|f| f.sync_all());
    sync(&tmp).map_err(|e| fail(&tmp, e.to_string()))?;
    std::fs::rename(&tmp, &target).map_err(|e| fail(&target, e.to_string()))?;
    // The rename itself is durable once the folder is synced.
    sync(folder).map_err(|e| fail(folder, e.to_string()))?;
    Ok(())
}

/// Reads the run's checkpoint; `Ok(None)` when there is none (the run
/// stopped before its first checkpoint). A file that is corrupt, of another
/// version, or of another run is an error that says which.
pub(crate) fn load<S: DeserializeOwned, C: DeserializeOwned>(
    dir: &Path,
    id: &Identity,
) -> Result<Option<RunState<S, C>>, RunError> {
    let p = path(dir);
    let buffer = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fail(&p, e.to_string())),
    };
    let corrupt = |e: &dyn std::fmt::Display| fail(&p, format!("not a valid checkpoint: {e}"));
    let tensors = SafeTensors::deserialize(&buffer).map_err(|e| corrupt(&e))?;
    let (_, header) = SafeTensors::read_metadata(&buffer).map_err(|e| corrupt(&e))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let get = |k: &str| meta.get(k).map(String::as_str).unwrap_or("");
    if get("format") != FORMAT {
        return Err(fail(&p, "not a fedweave checkpoint"));
    }
    if get("version") != VERSION {
        return Err(fail(
            &p,
            format!(
                "checkpoint format version {} (written by fedweave {}), this fedweave reads version {VERSION}",
                get("version"),
                get("fedweave")
            ),
        ));
    }
    if get("algorithm") != id.algorithm {
        return Err(fail(
            &p,
            format!(
                "checkpoint of algorithm `{}`, the run's config says `{}`",
                get("algorithm"),
                id.algorithm
            ),
        ));
    }
    if get("config") != id.config {
        let first = get("config")
            .lines()
            .zip(id.config.lines())
            .find(|(a, b)| a != b)
            .map(|(a, b)| format!(": checkpoint has `{a}`, config has `{b}`"))
            .unwrap_or_default();
        return Err(fail(
            &p,
            format!("the checkpoint belongs to another configuration{first}"),
        ));
    }
    let mut names = tensors.names();
    names.sort_unstable();
    let mut vectors = Vec::with_capacity(names.len());
    for name in names {
        let t = tensors.tensor(name).map_err(|e| corrupt(&e))?;
        if t.dtype() != Dtype::F32 || t.shape().len() != 1 {
            return Err(corrupt(&format!("tensor {name} is not a 1-D f32 vector")));
        }
        vectors.push(
            t.data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        );
    }
    let state: RunState<S, C> =
        Stash::provide(vectors, || serde_json::from_str(get("state"))).map_err(|e| corrupt(&e))?;
    if get("round") != state.round.to_string() {
        return Err(corrupt(&"round in the metadata and in the state differ"));
    }
    Ok(Some(state))
}
