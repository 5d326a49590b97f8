//! Byte-level entry points to the file parsers, for the `cargo fuzz`
//! targets under `fuzz/` (feature `fuzzing`). The loaders read files by
//! path; these run the same parsing and checks on an in-memory input so a
//! fuzzer can drive them millions of times. Not a stable API: it exists so
//! that malformed files are proven to give a [`DataError`], never a panic,
//! a hang or an unbounded allocation.

use std::path::Path;

use crate::{DataError, Dataset, Split};

/// The file name errors show for a fuzz input.
pub(crate) const INPUT: &str = "fuzz-input";

/// An IDX file, gzip-compressed or raw: parsed as an images file, and as a
/// labels file with labels `0..10`.
pub fn idx(bytes: &[u8]) -> Result<usize, DataError> {
    let path = Path::new(INPUT);
    let raw = crate::idx::decode(bytes.to_vec(), path)?;
    let images = crate::idx::parse_images(&raw, path).map(|(n, ..)| n);
    let labels = crate::idx::parse_labels(&raw, path, 0, 10).map(|l| l.len());
    images.or(labels)
}

/// A CIFAR binary-version file (`pickle = false`) or python-version pickle;
/// `variant` picks the labels (0: CIFAR-10, 1: CIFAR-100 fine, else coarse).
pub fn cifar(bytes: &[u8], pickle: bool, variant: u8) -> Result<Split, DataError> {
    crate::cifar::check_file(bytes, pickle, variant)
}

/// A LEAF JSON file: FEMNIST images (`femnist`) or Shakespeare text.
pub fn leaf(bytes: &[u8], femnist: bool) -> Result<Split, DataError> {
    crate::leaf::check_file(bytes, femnist)
}

/// An `.npz` archive read as the `us-weather` dataset (`.npy` members,
/// CSR station graph, windowing).
pub fn npz(bytes: &[u8]) -> Result<Dataset, DataError> {
    crate::forecast::check_npz(bytes)
}

/// A PFLlib client file (`.npz` holding the pickled dict `{'x', 'y'}` in
/// an object array, or plain `x.npy` and `y.npy` members).
pub fn pfllib(bytes: &[u8]) -> Result<usize, DataError> {
    crate::pfllib::parse_npz(bytes, Path::new(INPUT)).map(|s| s.y.len())
}

/// An image file (PNG, JPEG) preprocessed as `image-folder` does: RGB or
/// grayscale (`gray`), resized to 8×8 (`resize`) or at its own size.
pub fn image(bytes: &[u8], gray: bool, resize: bool) -> Result<[usize; 2], DataError> {
    let channels = if gray { 1 } else { 3 };
    let prep = crate::ImagePrep {
        channels,
        resize: resize.then_some([8, 8]),
        mean: vec![0.5; channels],
        std: vec![0.25; channels],
    };
    prep.features(bytes, Path::new(INPUT), &mut Vec::new())
}
