//! Tiny-ImageNet (`tiny-imagenet-200.zip` from Stanford CS231n) in its
//! folder layout: `wnids.txt` (one WordNet id per class),
//! `train/<wnid>/images/*.JPEG` (500 per class), and `val/images/*.JPEG`
//! labelled by `val/val_annotations.txt` (`file \t wnid \t x0 \t y0 \t x1 \t
//! y1`). The official test images carry no labels, so the validation set
//! is the test split. `data.path` is the `tiny-imagenet-200` folder or its
//! parent.
//!
//! - **Classes**: the ids of `wnids.txt` sorted by name (the order of
//!   PyTorch's `ImageFolder`, which the reference code uses); 200 in the
//!   distributed file.
//! - **Images**: decoded with the `image` crate, converted to RGB
//!   (a few images are grayscale), each must be 64×64; features `[3, 64,
//!   64]` channel first, `p / 255` in [0, 1]. With `data.normalize` (default)
//!   each channel is standardised with the ImageNet statistics mean (0.485,
//!   0.456, 0.406), std (0.229, 0.224, 0.225).
//! - Training images are read class by class, each class's files sorted by
//!   name; validation images in the order of `val_annotations.txt`.

use std::path::{Path, PathBuf};

use crate::files::{locate, need_path, not_found, read, sorted_entries};
use crate::images::{ImagePrep, decode_all};
use crate::{DataConfig, DataError, Dataset};

const SIDE: usize = 64;
const MEAN: [f32; 3] = [0.485, 0.456, 0.406];
const STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Loads `tiny-imagenet` from `cfg.path`.
pub(crate) fn load(cfg: &DataConfig) -> Result<Dataset, DataError> {
    let root = need_path(
        cfg,
        "the tiny-imagenet-200 folder holding wnids.txt, train/ and val/, or its parent",
    )?;
    let dir = locate(root, &["tiny-imagenet-200"], |d| {
        d.join("wnids.txt").is_file()
    })
    .ok_or_else(|| {
        not_found(
            root.join("wnids.txt"),
            format!(
                "no wnids.txt in {} or {}",
                root.display(),
                root.join("tiny-imagenet-200").display()
            ),
        )
    })?;
    let wnids = read_wnids(&dir.join("wnids.txt"))?;

    let mut train_files = Vec::new();
    for (class, wnid) in wnids.iter().enumerate() {
        let images = dir.join("train").join(wnid).join("images");
        if !images.is_dir() {
            return Err(not_found(
                &images,
                format!("the training images of class {wnid} are missing"),
            ));
        }
        let before = train_files.len();
        for p in sorted_entries(&images)? {
            if is_jpeg(&p) {
                train_files.push((p, class as u32));
            }
        }
        if train_files.len() == before {
            return Err(not_found(
                &images,
                format!("no .JPEG image for class {wnid}"),
            ));
        }
    }
    let val_files = read_val_annotations(&dir, &wnids)?;

    let prep = prep(cfg)?;
    let fix = "Tiny-ImageNet images are 64×64";
    Ok(Dataset::classification(
        "tiny-imagenet",
        wnids.len(),
        vec![3, SIDE, SIDE],
        (
            decode_all(&train_files, &prep, [SIDE, SIDE], fix)?,
            decode_all(&val_files, &prep, [SIDE, SIDE], fix)?,
        ),
        None,
    ))
}

/// RGB, ImageNet's statistics with `data.normalize`.
pub(crate) fn prep(cfg: &DataConfig) -> Result<ImagePrep, DataError> {
    Ok(ImagePrep::rgb(cfg.normalize, MEAN, STD))
}

fn is_jpeg(p: &Path) -> bool {
    p.is_file()
        && p.extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("jpeg") || e.eq_ignore_ascii_case("jpg"))
}

/// The class ids, sorted; an error for an empty file or a repeated id.
fn read_wnids(path: &Path) -> Result<Vec<String>, DataError> {
    let bytes = read(path)?;
    let text = String::from_utf8(bytes)
        .map_err(|e| DataError::format(path, format!("not a text file: {e}")))?;
    let mut wnids: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    if wnids.is_empty() {
        return Err(DataError::format(path, "lists no class id"));
    }
    wnids.sort();
    if let Some(w) = wnids.windows(2).find(|w| w[0] == w[1]) {
        return Err(DataError::format(
            path,
            format!("class id {} is listed twice", w[0]),
        ));
    }
    Ok(wnids)
}

/// `val/images/<file>` and its class, in the order of the annotations.
fn read_val_annotations(dir: &Path, wnids: &[String]) -> Result<Vec<(PathBuf, u32)>, DataError> {
    let path = dir.join("val").join("val_annotations.txt");
    let bytes = read(&path)?;
    let text = String::from_utf8(bytes)
        .map_err(|e| DataError::format(&path, format!("not a text file: {e}")))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut fields = line.split('\t');
        let (Some(file), Some(wnid)) = (fields.next(), fields.next()) else {
            return Err(DataError::format(
                &path,
                format!(
                    "line {}: expected tab-separated file name and class id, got {line:?}",
                    i + 1
                ),
            ));
        };
        let Ok(class) = wnids.binary_search_by(|w| w.as_str().cmp(wnid.trim())) else {
            return Err(DataError::format(
                &path,
                format!("line {}: class id {wnid:?} is not in wnids.txt", i + 1),
            ));
        };
        out.push((
            dir.join("val").join("images").join(file.trim()),
            class as u32,
        ));
    }
    if out.is_empty() {
        return Err(DataError::format(&path, "lists no image"));
    }
    Ok(out)
}
