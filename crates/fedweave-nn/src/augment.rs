//! CIFAR-style training augmentation: a random 32×32 crop of the image
//! padded by 4 pixels on every side, then a horizontal flip with
//! probability ½ — torchvision's `RandomCrop(32, padding=4)` and
//! `RandomHorizontalFlip()`, which pFedGraph's code applies (SFL's pads by
//! reflection). Applied to training mini-batches only, never to validation
//! or test data. The draws of a batch come from a stream keyed by the
//! client's batch stream (seed, round, client) and the batch's index, so
//! they do not depend on the thread count.

use rand::Rng;
use serde::{Deserialize, Serialize};

/// Pixels of padding on every side before the crop.
pub const CROP_PADDING: usize = 4;

/// Which augmentation training batches get (`[train] augment`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Augment {
    /// The samples as they are.
    #[default]
    None,
    /// Crop of the zero-padded image, then a random horizontal flip. Features
    /// are already normalised, so the border is the channel's mean colour
    /// (torchvision pads black pixels before normalising).
    CropFlip,
    /// Crop of the reflection-padded image (SFL's code), then a random
    /// horizontal flip. Needs images of at least 5×5.
    CropFlipReflect,
}

impl Augment {
    /// Whether an image of `shape` (`[C, H, W]`) can be augmented this way;
    /// `Err` says why not.
    pub fn check(self, shape: &[usize]) -> Result<(), String> {
        if self == Augment::None {
            return Ok(());
        }
        let &[_, h, w] = shape else {
            return Err(format!(
                "crops and flips need C×H×W images, the input is {shape:?}"
            ));
        };
        if self == Augment::CropFlipReflect && (h <= CROP_PADDING || w <= CROP_PADDING) {
            return Err(format!(
                "reflection padding by {CROP_PADDING} needs images larger than {CROP_PADDING}×{CROP_PADDING}, got {h}×{w}"
            ));
        }
        Ok(())
    }

    /// Augments every `[C, H, W]` image of the row-major batch `x` in place,
    /// drawing per image the crop's top-left corner in the padded image
    /// (row, then column, each uniform in 0..=8) and then the flip.
    pub(crate) fn apply(self, shape: [usize; 3], x: &mut [f32], rng: &mut impl Rng) {
        if self == Augment::None {
            return;
        }
        let len: usize = shape.iter().product();
        let mut src = vec![0.0; len];
        for image in x.chunks_exact_mut(len) {
            let dy = rng.random_range(0..=2 * CROP_PADDING);
            let dx = rng.random_range(0..=2 * CROP_PADDING);
            let flip = rng.random_bool(0.5);
            src.copy_from_slice(image);
            self.crop_flip(&src, image, shape, (dy, dx), flip);
        }
    }

    /// Writes into `dst` the crop of padded `src` whose top-left corner is
    /// `(dy, dx)` in the padded image, mirrored left-right if `flip`.
    fn crop_flip(
        self,
        src: &[f32],
        dst: &mut [f32],
        [c, h, w]: [usize; 3],
        (dy, dx): (usize, usize),
        flip: bool,
    ) {
        let reflect = self == Augment::CropFlipReflect;
        // The source index of padded coordinate `p` along a side of `n`.
        let source = |p: usize, n: usize| -> Option<usize> {
            let i = p as isize - CROP_PADDING as isize;
            let n = n as isize;
            let i = match (reflect, i) {
                (true, i) if i < 0 => -i,
                (true, i) if i >= n => 2 * (n - 1) - i,
                (_, i) => i,
            };
            (0..n).contains(&i).then_some(i as usize)
        };
        for ch in 0..c {
            for i in 0..h {
                let row = source(i + dy, h);
                for j in 0..w {
                    let jj = if flip { w - 1 - j } else { j };
                    let col = source(jj + dx, w);
                    dst[(ch * h + i) * w + j] = match (row, col) {
                        (Some(r), Some(k)) => src[(ch * h + r) * w + k],
                        _ => 0.0,
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2×6×6 image whose pixel (c, i, j) is 100·c + 10·i + j.
    fn image() -> Vec<f32> {
        (0..2 * 36)
            .map(|k| (100 * (k / 36) + 10 * ((k % 36) / 6) + k % 6) as f32)
            .collect()
    }

    fn crop(kind: Augment, d: (usize, usize), flip: bool) -> Vec<f32> {
        let src = image();
        let mut dst = vec![f32::NAN; src.len()];
        kind.crop_flip(&src, &mut dst, [2, 6, 6], d, flip);
        dst
    }

    #[test]
    fn centre_crop_is_the_identity_and_flip_mirrors_rows() {
        assert_eq!(crop(Augment::CropFlip, (4, 4), false), image());
        let flipped = crop(Augment::CropFlip, (4, 4), true);
        // Row 2 of channel 1: 120..=125 reversed.
        assert_eq!(
            &flipped[36 + 12..36 + 18],
            &[125.0, 124.0, 123.0, 122.0, 121.0, 120.0]
        );
    }

    #[test]
    fn shifted_crops_pad_with_zeros_or_reflections() {
        // Corner (5, 2): output (i, j) reads source (i + 1, j − 2).
        let z = crop(Augment::CropFlip, (5, 2), false);
        assert_eq!(&z[0..6], &[0.0, 0.0, 10.0, 11.0, 12.0, 13.0]);
        assert_eq!(&z[30..36], &[0.0; 6], "the last row comes from the padding");
        // Reflection: source row 6 → 4, column −2 → 2, −1 → 1.
        let r = crop(Augment::CropFlipReflect, (5, 2), false);
        assert_eq!(&r[0..6], &[12.0, 11.0, 10.0, 11.0, 12.0, 13.0]);
        assert_eq!(&r[30..36], &[42.0, 41.0, 40.0, 41.0, 42.0, 43.0]);
        // Crop then flip: output (0, j) = cropped (0, 5 − j).
        let zf = crop(Augment::CropFlip, (5, 2), true);
        assert_eq!(&zf[0..6], &[13.0, 12.0, 11.0, 10.0, 0.0, 0.0]);
    }

    #[test]
    fn draws_are_deterministic_and_cover_every_crop_and_flip() {
        let batch: Vec<f32> = (0..40).flat_map(|_| image()).collect();
        let run = |key| {
            let mut x = batch.clone();
            let mut rng = fedweave_core::rng_stream(key, 3, 0, fedweave_core::Purpose::Augment);
            Augment::CropFlip.apply([2, 6, 6], &mut x, &mut rng);
            x
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        // Every output image is one of the 9·9·2 crops of the original.
        let crops: Vec<Vec<f32>> = (0..=8)
            .flat_map(|dy| (0..=8).flat_map(move |dx| [(dy, dx, false), (dy, dx, true)]))
            .map(|(dy, dx, f)| crop(Augment::CropFlip, (dy, dx), f))
            .collect();
        let out = run(7);
        let mut distinct = std::collections::BTreeSet::new();
        for img in out.chunks_exact(72) {
            let k = crops.iter().position(|c| c == img).expect("a valid crop");
            distinct.insert(k);
        }
        assert!(distinct.len() > 20, "40 draws hit {} crops", distinct.len());
    }

    #[test]
    fn checks_the_input_shape() {
        assert!(Augment::None.check(&[64]).is_ok());
        assert!(
            Augment::CropFlip
                .check(&[64])
                .unwrap_err()
                .contains("C×H×W")
        );
        assert!(Augment::CropFlip.check(&[1, 4, 4]).is_ok());
        assert!(Augment::CropFlipReflect.check(&[1, 4, 4]).is_err());
        assert!(Augment::CropFlipReflect.check(&[3, 32, 32]).is_ok());
    }
}
