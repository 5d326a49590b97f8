//! Image files as features: decoding (PNG, JPEG) with the `image` crate,
//! colour conversion, resizing and per-channel scaling, shared by the
//! folder datasets (`image-folder`, `cinic10`, `tiny-imagenet`) and by
//! `fedweave predict`, so that an image is preprocessed the same way at
//! training and at prediction time.

use std::path::{Path, PathBuf};

use image::imageops::FilterType;

use crate::files::{not_found, read};
use crate::{DataConfig, DataError, Split};

/// How an image file becomes a sample: `[channels, height, width]`,
/// channel first, `(p / 255 − mean_c) / std_c`.
#[derive(Clone, Debug, PartialEq)]
pub struct ImagePrep {
    /// 3 (RGB) or 1 (grayscale, ITU-R 601-2 luma as the `image` crate
    /// computes it).
    pub channels: usize,
    /// `[height, width]` every image is resized to (bilinear, the `image`
    /// crate's `Triangle` filter); `None`: images are taken at their own
    /// size, which must then be the same for all.
    pub resize: Option<[usize; 2]>,
    /// Per-channel mean subtracted from `p / 255`.
    pub mean: Vec<f32>,
    /// Per-channel standard deviation divided by.
    pub std: Vec<f32>,
}

impl ImagePrep {
    /// RGB at the images' own size, with `mean` / `std` when `normalize`,
    /// else values in [0, 1].
    pub(crate) fn rgb(normalize: bool, mean: [f32; 3], std: [f32; 3]) -> Self {
        let (mean, std) = if normalize {
            (mean, std)
        } else {
            ([0.0; 3], [1.0; 3])
        };
        ImagePrep {
            channels: 3,
            resize: None,
            mean: mean.to_vec(),
            std: std.to_vec(),
        }
    }

    /// The features of one encoded image (`path` names it in errors),
    /// appended to `out`; returns its `[height, width]` after resizing.
    pub fn features(
        &self,
        bytes: &[u8],
        path: &Path,
        out: &mut Vec<f32>,
    ) -> Result<[usize; 2], DataError> {
        let img = image::load_from_memory(bytes).map_err(|e| {
            DataError::format(path, format!("not a readable PNG or JPEG image: {e}"))
        })?;
        let img = match self.resize {
            Some([h, w]) if (img.height() as usize, img.width() as usize) != (h, w) => {
                img.resize_exact(w as u32, h as u32, FilterType::Triangle)
            }
            _ => img,
        };
        let raw = if self.channels == 1 {
            img.to_luma8().into_raw()
        } else {
            img.to_rgb8().into_raw()
        };
        for c in 0..self.channels {
            let lut = crate::files::pixel_lut(self.mean[c], self.std[c]);
            out.extend(
                raw.iter()
                    .skip(c)
                    .step_by(self.channels)
                    .map(|&p| lut[p as usize]),
            );
        }
        Ok([img.height() as usize, img.width() as usize])
    }

    /// [`Self::features`] of the file `path`.
    pub fn read(&self, path: &Path, out: &mut Vec<f32>) -> Result<[usize; 2], DataError> {
        if !path.is_file() {
            return Err(not_found(path, "image listed but missing"));
        }
        self.features(&read(path)?, path, out)
    }
}

/// The preprocessing of `cfg.dataset`'s images, for datasets of image
/// files (`image-folder`, `cinic10`, `tiny-imagenet`); a `data.dataset`
/// error for the others.
pub fn image_prep(cfg: &DataConfig) -> Result<ImagePrep, DataError> {
    match crate::dataset(&cfg.dataset).and_then(|d| d.image) {
        Some(prep) => prep(cfg),
        None => Err(DataError::config(
            "data.dataset",
            format!("dataset {:?} is not read from image files", cfg.dataset),
        )),
    }
}

/// Whether `p` is a file with an image extension (`.png`, `.jpg`,
/// `.jpeg`, any case).
pub(crate) fn is_image(p: &Path) -> bool {
    p.is_file()
        && p.extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| ["png", "jpg", "jpeg"].contains(&e.to_ascii_lowercase().as_str()))
}

/// Decodes every image (on all cores) into a split with its label; every
/// image must come out `[height, width]` = `hw` (`fix` tells how to fix
/// one that does not).
pub(crate) fn decode_all(
    files: &[(PathBuf, u32)],
    prep: &ImagePrep,
    hw: [usize; 2],
    fix: &str,
) -> Result<Split, DataError> {
    let len = prep.channels * hw[0] * hw[1];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = files.len().div_ceil(threads).max(1);
    let parts: Vec<Result<Vec<f32>, DataError>> = std::thread::scope(|s| {
        let handles: Vec<_> = files
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    let mut out = Vec::with_capacity(part.len() * len);
                    for (p, _) in part {
                        let got = prep.read(p, &mut out)?;
                        if got != hw {
                            return Err(DataError::format(
                                p,
                                format!(
                                    "image is {}×{} (width×height), expected {}×{}: {fix}",
                                    got[1], got[0], hw[1], hw[0]
                                ),
                            ));
                        }
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("image decoding thread panicked"))
            .collect()
    });
    let mut features = Vec::with_capacity(files.len() * len);
    for part in parts {
        features.extend(part?);
    }
    Ok(Split {
        features,
        labels: files.iter().map(|(_, y)| *y).collect(),
        ..Split::default()
    })
}
