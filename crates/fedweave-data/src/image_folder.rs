//! `image-folder`: every client's own images, in the folder layout of
//! torchvision's `ImageFolder`. `data.path` names one directory per client
//! with `{id}` in it (e.g. `clients/{id}`, `{id}` = 0 … clients − 1);
//! each holds
//!
//! ```text
//! train/<class>/*.png|*.jpg|*.jpeg
//! test/<class>/*.png|*.jpg|*.jpeg
//! ```
//!
//! Both `train/` and `test/` are required (a client without a test split
//! must be split beforehand); files with other extensions are skipped.
//!
//! - **Classes**: the union of every client's class folder names (train
//!   and test), sorted by name as `ImageFolder` sorts them, so that a label
//!   means the same class on every client even when a client lacks some
//!   classes. Each client is a natural client (`partition.kind =
//!   "natural"`); validation is carved off its training images by
//!   `partition.val_fraction` as for every dataset. Every machine of a
//!   networked run reads every client's folder (the class list needs them).
//! - **Images**: decoded with the `image` crate (PNG, JPEG), converted to
//!   RGB (`data.channels = 3`, the default) or grayscale (`1`), resized to
//!   `data.image_size` when set (bilinear; an int for a square or
//!   `[height, width]`), else taken at their size, which must then be the
//!   same for all. Features `[channels, height, width]`, `p / 255` in
//!   [0, 1], then `(x − mean_c) / std_c` when `data.mean` and `data.std`
//!   (one value per channel) are set.
//! - Order: client by client; within a split class by class, each class's
//!   files sorted by name.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::dataset::{Dataset, NaturalClient};
use crate::files::{client_dir, id_template, not_found, refuse_subsample, sorted_entries};
use crate::images::{ImagePrep, decode_all, is_image};
use crate::{DataConfig, DataError};

/// The two folders of a client.
const SPLITS: [&str; 2] = ["train", "test"];

/// One client's image files: `(class name, file)` for train and test.
type ClientFiles = [Vec<(String, PathBuf)>; 2];

/// Loads the `clients` clients' folders.
pub(crate) fn load(
    cfg: &DataConfig,
    clients: usize,
    _hosted: Option<&[usize]>,
) -> Result<Dataset, DataError> {
    let template = id_template(cfg)?;
    refuse_subsample(cfg)?;
    let prep = prep(cfg)?;
    let mut classes = BTreeSet::new();
    let mut files: Vec<ClientFiles> = Vec::with_capacity(clients);
    for id in 0..clients {
        let dir = client_dir(template, id);
        if !dir.is_dir() {
            return Err(not_found(
                &dir,
                format!("client {id}'s folder is missing (data.path = {template:?})"),
            ));
        }
        let mut client = ClientFiles::default();
        for (split, out) in SPLITS.iter().zip(client.iter_mut()) {
            list_split(&dir.join(split), id, &mut classes, out)?;
        }
        if client[0].is_empty() {
            return Err(not_found(
                dir.join("train"),
                format!("client {id} has no training image (.png, .jpg, .jpeg)"),
            ));
        }
        files.push(client);
    }
    let classes: Vec<String> = classes.into_iter().collect();
    let hw = match prep.resize {
        Some(hw) => hw,
        // Every client has a training image: the first one sets the size.
        None => prep.read(&files[0][0][0].1, &mut Vec::new())?,
    };
    let mut labelled: [Vec<(PathBuf, u32)>; 2] = Default::default();
    let mut natural = Vec::with_capacity(clients);
    for client in files {
        let start = [labelled[0].len(), labelled[1].len()];
        for (all, split) in labelled.iter_mut().zip(client) {
            for (class, file) in split {
                let y = classes.binary_search(&class).unwrap_or_default();
                all.push((file, y as u32));
            }
        }
        natural.push(NaturalClient {
            train: (start[0]..labelled[0].len()).collect(),
            val: Vec::new(),
            test: (start[1]..labelled[1].len()).collect(),
            remote: false,
        });
    }
    let fix = "set data.image_size to resize every image to one size";
    Ok(Dataset::classification(
        "image-folder",
        classes.len(),
        vec![prep.channels, hw[0], hw[1]],
        (
            decode_all(&labelled[0], &prep, hw, fix)?,
            decode_all(&labelled[1], &prep, hw, fix)?,
        ),
        Some(natural),
    ))
}

/// Appends the images of the class folders of `dir` to `out`, their class
/// names to `classes`.
fn list_split(
    dir: &Path,
    id: usize,
    classes: &mut BTreeSet<String>,
    out: &mut Vec<(String, PathBuf)>,
) -> Result<(), DataError> {
    if !dir.is_dir() {
        return Err(not_found(
            dir,
            format!("client {id} has no such folder of class folders (<class>/*.png|jpg)"),
        ));
    }
    for class_dir in sorted_entries(dir)?.into_iter().filter(|p| p.is_dir()) {
        let Some(class) = class_dir.file_name().and_then(|n| n.to_str()) else {
            return Err(DataError::format(
                &class_dir,
                "a class folder name must be UTF-8",
            ));
        };
        classes.insert(class.to_string());
        for file in sorted_entries(&class_dir)? {
            if is_image(&file) {
                out.push((class.to_string(), file));
            }
        }
    }
    Ok(())
}

/// The preprocessing `data.channels`, `data.image_size`, `data.mean` and
/// `data.std` ask for.
pub(crate) fn prep(cfg: &DataConfig) -> Result<ImagePrep, DataError> {
    let channels = cfg.channels.unwrap_or(3);
    if channels != 1 && channels != 3 {
        return Err(DataError::config(
            "data.channels",
            format!("must be 3 (RGB) or 1 (grayscale), got {channels}"),
        ));
    }
    let resize = cfg.image_size.map(|s| s.height_width());
    if resize.is_some_and(|hw| hw.contains(&0)) {
        return Err(DataError::config(
            "data.image_size",
            "height and width must be at least 1",
        ));
    }
    let (mean, std) = match (&cfg.mean, &cfg.std) {
        (None, None) => (vec![0.0; channels], vec![1.0; channels]),
        (Some(m), Some(s)) => (m.clone(), s.clone()),
        (Some(_), None) => return Err(DataError::config("data.std", "data.mean needs data.std")),
        (None, Some(_)) => {
            return Err(DataError::config("data.mean", "data.std needs data.mean"));
        }
    };
    for (key, v) in [("data.mean", &mean), ("data.std", &std)] {
        if v.len() != channels {
            return Err(DataError::config(
                key,
                format!("needs one value per channel ({channels}), got {}", v.len()),
            ));
        }
    }
    if !mean.iter().all(|m| m.is_finite()) || !std.iter().all(|s| s.is_finite() && *s > 0.0) {
        return Err(DataError::config(
            "data.std",
            "means must be finite and standard deviations finite and > 0",
        ));
    }
    Ok(ImagePrep {
        channels,
        resize,
        mean,
        std,
    })
}
