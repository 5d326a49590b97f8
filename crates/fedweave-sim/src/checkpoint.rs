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
use crate::models::{sync_dir, write_atomic_with};
use crate::packed::{Unpacked, pack_to_file};
use crate::round::RunState;
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
pub struct Identity<'a> {
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

/// Writes `state` as the run's checkpoint, atomically, with the run's wall
/// time so far (`wall_seconds` in the metadata, so that a resumed run's
/// summary counts every session).
pub(crate) fn save<S: Serialize, C: Serialize>(
    dir: &Path,
    id: &Identity,
    state: &RunState<S, C>,
    wall_seconds: f64,
) -> Result<(), RunError> {
    let target = path(dir);
    let folder = target.parent().unwrap_or(dir);
    std::fs::create_dir_all(folder).map_err(|e| fail(folder, e.to_string()))?;
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
        ("wall_seconds".to_string(), wall_seconds.to_string()),
    ]);
    write_atomic_with(&target, |tmp| {
        pack_to_file(state, metadata, tmp).map_err(std::io::Error::other)
    })
    .map_err(|e| fail(&target, e.to_string()))?;
    // The rename itself is durable once the folder is synced.
    sync_dir(folder).map_err(|e| fail(folder, e.to_string()))
}

/// A checkpoint's state and the run's wall-clock seconds when it was written.
pub(crate) type Restored<S, C> = (RunState<S, C>, f64);

/// Reads the run's checkpoint and the wall-clock seconds the run had taken
/// when it was written (0 for a checkpoint that does not say); `Ok(None)`
/// when there is none (the run stopped before its first checkpoint). A file
/// that is corrupt, of another version, or of another run is an error that
/// says which.
pub(crate) fn load<S: DeserializeOwned, C: DeserializeOwned>(
    dir: &Path,
    id: &Identity,
) -> Result<Option<Restored<S, C>>, RunError> {
    let p = path(dir);
    let buffer = match std::fs::read(&p) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fail(&p, e.to_string())),
    };
    let wall = safetensors::SafeTensors::read_metadata(&buffer)
        .ok()
        .and_then(|(_, h)| {
            h.metadata()
                .as_ref()?
                .get("wall_seconds")?
                .parse::<f64>()
                .ok()
        })
        .filter(|w| w.is_finite() && *w >= 0.0)
        .unwrap_or(0.0);
    parse(&buffer, id)
        .map(|s| Some((s, wall)))
        .map_err(|m| fail(&p, m))
}

/// Checks a checkpoint buffer against the run's identity and decodes it;
/// the error says what is wrong (the fuzz target feeds it arbitrary bytes).
pub fn parse<S: DeserializeOwned, C: DeserializeOwned>(
    buffer: &[u8],
    id: &Identity,
) -> Result<RunState<S, C>, String> {
    let corrupt = |e: &dyn std::fmt::Display| format!("not a valid checkpoint: {e}");
    let unpacked = Unpacked::parse(buffer).map_err(|e| corrupt(&e))?;
    let get = |k: &str| unpacked.get(k);
    if get("format") != FORMAT {
        return Err("not a fedweave checkpoint".into());
    }
    if get("version") != VERSION {
        return Err(format!(
            "checkpoint format version {} (written by fedweave {}), this fedweave reads version {VERSION}",
            get("version"),
            get("fedweave")
        ));
    }
    if get("algorithm") != id.algorithm {
        return Err(format!(
            "checkpoint of algorithm `{}`, the run's config says `{}`",
            get("algorithm"),
            id.algorithm
        ));
    }
    if get("config") != id.config {
        let first = get("config")
            .lines()
            .zip(id.config.lines())
            .find(|(a, b)| a != b)
            .map(|(a, b)| format!(": checkpoint has `{a}`, config has `{b}`"))
            .unwrap_or_default();
        return Err(format!(
            "the checkpoint belongs to another configuration{first}"
        ));
    }
    let round = get("round").to_string();
    let state: RunState<S, C> = unpacked.value().map_err(|e| corrupt(&e))?;
    if round != state.round.to_string() {
        return Err(corrupt(&"round in the metadata and in the state differ"));
    }
    Ok(state)
}
