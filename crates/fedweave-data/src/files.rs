//! Small file helpers shared by the loaders of distributed dataset formats.

use std::io::{Cursor, Error, ErrorKind, Read, Seek};
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

/// The placeholder of the client id in `data.path` of the datasets with
/// one directory per client (`csv`, `image-folder`).
pub(crate) const ID: &str = "{id}";

/// `data.path` as a per-client template (with [`ID`] in it).
pub(crate) fn id_template(cfg: &DataConfig) -> Result<&str, DataError> {
    let template = cfg.path.as_deref().ok_or_else(|| {
        DataError::config(
            "data.path",
            format!(
                "dataset {} needs data.path: a directory per client with {ID} in it, e.g. \"clients/{ID}\"",
                cfg.dataset
            ),
        )
    })?;
    template.to_str().filter(|t| t.contains(ID)).ok_or_else(|| {
        DataError::config(
            "data.path",
            format!(
                "dataset {}: {} has no {ID} placeholder for the client id",
                cfg.dataset,
                template.display()
            ),
        )
    })
}

/// The per-client datasets take each client's files as they are:
/// `data.max_train_samples` is refused.
pub(crate) fn refuse_subsample(cfg: &DataConfig) -> Result<(), DataError> {
    match cfg.max_train_samples {
        Some(_) => Err(DataError::config(
            "data.max_train_samples",
            format!(
                "dataset {} takes each client's files as they are; subsample them beforehand",
                cfg.dataset
            ),
        )),
        None => Ok(()),
    }
}

/// Client `id`'s directory of a per-client `template`.
pub(crate) fn client_dir(template: &str, id: usize) -> PathBuf {
    PathBuf::from(template.replace(ID, &id.to_string()))
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

/// Reads arrays from an `.npz` (a zip of `.npy` members).
pub(crate) struct Npz<R: Read + Seek> {
    zip: zip::ZipArchive<R>,
    path: String,
}

impl<R: Read + Seek> Npz<R> {
    /// Opens the archive; `path` names it in errors.
    pub(crate) fn new(reader: R, path: &str) -> Result<Self, DataError> {
        let zip = zip::ZipArchive::new(reader).map_err(|e| {
            DataError::format(path, format!("not a readable .npz (zip) archive: {e}"))
        })?;
        Ok(Self {
            zip,
            path: path.to_string(),
        })
    }

    /// An error naming the archive and its member `name`.
    pub(crate) fn error(&self, name: &str, message: impl std::fmt::Display) -> DataError {
        DataError::format(self.path.as_str(), format!("member {name}.npy: {message}"))
    }

    /// Whether the archive has the member `name` (without `.npy`).
    pub(crate) fn has(&self, name: &str) -> bool {
        self.zip.index_for_name(&format!("{name}.npy")).is_some()
    }

    /// The `.npy` file of member `name` (without `.npy`), header read.
    pub(crate) fn npy(&mut self, name: &str) -> Result<npyz::NpyFile<Cursor<Vec<u8>>>, DataError> {
        let mut bytes = Vec::new();
        let read = match self.zip.by_name(&format!("{name}.npy")) {
            Ok(mut f) => f.read_to_end(&mut bytes).map_err(|e| e.to_string()),
            Err(zip::result::ZipError::FileNotFound) => Err("missing".to_string()),
            Err(e) => Err(e.to_string()),
        };
        read.map_err(|e| self.error(name, e))?;
        npyz::NpyFile::new(Cursor::new(bytes)).map_err(|e| self.error(name, e))
    }

    /// The member `name` (without `.npy`) as a flat vector and its shape.
    pub(crate) fn array<T: npyz::Deserialize>(
        &mut self,
        name: &str,
    ) -> Result<(Vec<T>, Vec<usize>), DataError> {
        let npy = self.npy(name)?;
        let shape: Vec<usize> = npy.shape().iter().map(|&d| d as usize).collect();
        let data = npy.into_vec::<T>().map_err(|e| self.error(name, e))?;
        Ok((data, shape))
    }
}
