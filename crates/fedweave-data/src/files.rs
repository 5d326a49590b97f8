//! Small file helpers shared by the loaders of distributed dataset formats.

use std::io::{Error, ErrorKind};
use std::path::{Path, PathBuf};

use crate::{DataConfig, DataError};

/// `cfg.path`, or a `data.path` error saying what the dataset needs there.
pub(crate) fn need_path<'a>(cfg: &'a DataConfig, what: &str) -> Result<&'a Path, DataError> {
    cfg.path.as_deref().ok_or_else(|| {
        DataError::config(
            "data.path",
            format!("dataset {} needs data.path: {what}", cfg.dataset),
        )
    })
}

/// A "not found" I/O error naming `path`, with `message` explaining what was
/// expected there.
pub(crate) fn not_found(path: impl Into<PathBuf>, message: impl Into<String>) -> DataError {
    DataError::io(path, Error::new(ErrorKind::NotFound, message.into()))
}

/// The first of `root`, `root/<sub>` (for each of `subdirs`) for which
/// `probe` holds: `data.path` may name the extracted folder or its parent.
pub(crate) fn locate(
    root: &Path,
    subdirs: &[&str],
    probe: impl Fn(&Path) -> bool,
) -> Option<PathBuf> {
    std::iter::once(root.to_path_buf())
        .chain(subdirs.iter().map(|s| root.join(s)))
        .find(|d| d.is_dir() && probe(d))
}

/// The whole file, or an I/O error naming it.
pub(crate) fn read(path: &Path) -> Result<Vec<u8>, DataError> {
    std::fs::read(path).map_err(|e| DataError::io(path, e))
}

/// The entries of directory `dir`, sorted by name.
pub(crate) fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| DataError::io(dir, e))? {
        out.push(entry.map_err(|e| DataError::io(dir, e))?.path());
    }
    out.sort();
    Ok(out)
}

/// `(p / 255 − mean) / std` for every byte value `p`.
pub(crate) fn pixel_lut(mean: f32, std: f32) -> [f32; 256] {
    let mut lut = [0f32; 256];
    for (p, v) in lut.iter_mut().enumerate() {
        *v = (p as f32 / 255.0 - mean) / std;
    }
    lut
}
