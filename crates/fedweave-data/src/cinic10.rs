//! CINIC-10 (Darlow et al. 2018) as distributed (`CINIC-10.tar.gz`):
//! `train/`, `valid/` and `test/`, each with the ten class folders
//! `airplane automobile bird cat deer dog frog horse ship truck` of 32×32
//! PNGs (9,000 per class and split). `data.path` is the extracted folder.
//!
//! - **Split**: `train/` and `valid/` together are the training pool
//!   (180,000 images, the authors' "train + valid" setting; fedweave carves
//!   each client's validation off its share by `partition.val_fraction`),
//!   `test/` is the test pool (90,000). Partition it like `cifar10`
//!   (`iid`, `dirichlet`, `pathological`, …).
//! - **Classes**: the ten names above in that (alphabetical) order, labels
//!   0–9, as torchvision's `ImageFolder` numbers them.
//! - **Images**: decoded with the `image` crate and converted to RGB (some
//!   CINIC-10 images, from ImageNet, are grayscale); each must be 32×32.
//!   Features `[3, 32, 32]`, `p / 255`; with `data.normalize` (default)
//!   standardised per channel with CINIC-10's published statistics, mean
//!   (0.47889522, 0.47227842, 0.43047404), std (0.24205776, 0.23828046,
//!   0.25874835).
//! - Order: `train/` then `valid/`, class by class, files sorted by name.

use std::path::{Path, PathBuf};

use crate::files::{need_path, not_found, sorted_entries};
use crate::images::{ImagePrep, decode_all, is_image};
use crate::{DataConfig, DataError, Dataset, Split};

/// The class folders, in label order.
pub(crate) const CLASSES: [&str; 10] = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
];
const MEAN: [f32; 3] = [0.478_895_22, 0.472_278_42, 0.430_474_04];
const STD: [f32; 3] = [0.242_057_76, 0.238_280_46, 0.258_748_35];
const SIDE: usize = 32;

/// Loads `cinic10` from `cfg.path`.
pub(crate) fn load(cfg: &DataConfig) -> Result<Dataset, DataError> {
    let root = need_path(cfg, "the CINIC-10 folder holding train/, valid/ and test/")?;
    let prep = prep(cfg)?;
    let read = |splits: &[&str]| -> Result<Split, DataError> {
        let mut files = Vec::new();
        for split in splits {
            list(&root.join(split), &mut files)?;
        }
        decode_all(&files, &prep, [SIDE, SIDE], "CINIC-10 images are 32×32")
    };
    Ok(Dataset::classification(
        "cinic10",
        CLASSES.len(),
        vec![3, SIDE, SIDE],
        (read(&["train", "valid"])?, read(&["test"])?),
        None,
    ))
}

/// RGB, CINIC-10's statistics with `data.normalize`.
pub(crate) fn prep(cfg: &DataConfig) -> Result<ImagePrep, DataError> {
    Ok(ImagePrep::rgb(cfg.normalize, MEAN, STD))
}

/// Appends the images of the ten class folders of `dir` with their labels.
fn list(dir: &Path, out: &mut Vec<(PathBuf, u32)>) -> Result<(), DataError> {
    for (y, class) in CLASSES.iter().enumerate() {
        let folder = dir.join(class);
        if !folder.is_dir() {
            return Err(not_found(
                &folder,
                format!(
                    "CINIC-10 has a {class} folder in each of train/, valid/ and test/ (data.path = the extracted folder)"
                ),
            ));
        }
        let before = out.len();
        out.extend(
            sorted_entries(&folder)?
                .into_iter()
                .filter(|p| is_image(p))
                .map(|p| (p, y as u32)),
        );
        if out.len() == before {
            return Err(not_found(&folder, format!("no PNG image of class {class}")));
        }
    }
    Ok(())
}
