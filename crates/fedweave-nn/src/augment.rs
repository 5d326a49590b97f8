//! CIFAR-style training augmentation: a random 32×32 crop of the image
//! padded by 4 pixels on every side, then a horizontal flip with
//! probability ½ — torchvision's `RandomCrop(32, padding=4)` and
//! `RandomHorizontalFlip()`, which pFedGraph's code applies (SFL's pads by
//! reflection and then blanks a random 8×8 square: Cutout). Applied to training mini-batches only, never to validation
//! or test data. The draws of a batch come from a stream keyed by the
//! client's batch stream (seed, round, client) and the batch's index, so
//! they do not depend on the thread count.

use rand::Rng;
use serde::{Deserialize, Serialize};

/// Pixels of padding on every side before the crop.
pub const CROP_PADDING: usize = 4;

/// Side of Cutout's square.
pub const CUTOUT: usize = 8;

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
    /// SFL's whole training transform (`Crop`, `FlipLR`, `Cutout(8, 8)` in
    /// the authors' `data_util.py`): `CropFlipReflect`, then an 8×8 square
    /// set to 0 (the mean colour, features being normalised) whose top-left
    /// corner is uniform over the positions that keep it inside the image.
    /// Needs images of at least 8×8.
    CropFlipReflectCutout,
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
        if self.reflects() && (h <= CROP_PADDING || w <= CROP_PADDING) {
            return Err(format!(
                "reflection padding by {CROP_PADDING} needs images larger than {CROP_PADDING}×{CROP_PADDING}, got {h}×{w}"
            ));
        }
        if self == Augment::CropFlipReflectCutout && (h < CUTOUT || w < CUTOUT) {
            return Err(format!(
                "Cutout's {CUTOUT}×{CUTOUT} square needs images of at least {CUTOUT}×{CUTOUT}, got {h}×{w}"
            ));
        }
        Ok(())
    }

    /// Whether the crop pads by reflection (SFL) rather than with zeros.
    fn reflects(self) -> bool {
        matches!(
            self,
            Augment::CropFlipReflect | Augment::CropFlipReflectCutout
        )
    }

    /// Augments every `[C, H, W]` image of the row-major batch `x` in place,
    /// drawing per image the crop's top-left corner in the padded image
    /// (row, then column, each uniform in 0..=8), then the flip, then (with
    /// Cutout) the square's top-left corner (row in 0..=H−8, then column in
    /// 0..=W−8).
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
            if self == Augment::CropFlipReflectCutout {
                let y0 = rng.random_range(0..=shape[1] - CUTOUT);
                let x0 = rng.random_range(0..=shape[2] - CUTOUT);
                cut_out(image, shape, (y0, x0));
            }
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
        let reflect = self.reflects();
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

/// Sets to 0 the `CUTOUT`×`CUTOUT` square of every channel of `image`
/// whose top-left corner is `(y0, x0)`.
fn cut_out(image: &mut [f32], [c, h, w]: [usize; 3], (y0, x0): (usize, usize)) {
    for ch in 0..c {
        for i in y0..y0 + CUTOUT {
            let row = (ch * h + i) * w;
            image[row + x0..row + x0 + CUTOUT].fill(0.0);
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
        let small = Augment::CropFlipReflectCutout
            .check(&[1, 7, 9])
            .unwrap_err();
        assert!(small.contains("8×8") && small.contains("7×9"), "{small}");
        assert!(Augment::CropFlipReflectCutout.check(&[1, 8, 8]).is_ok());
    }

    /// A 1×12×12 image of ones: Cutout leaves exactly one 8×8 square of
    /// zeros, inside the image, in every image of a batch; the reflected
    /// crop of a constant image is the image itself, so nothing else moves.
    #[test]
    fn cutout_blanks_one_square_inside_the_image() {
        let n = 200;
        let mut x = vec![1.0f32; n * 144];
        let mut rng = fedweave_core::rng_stream(3, 1, 0, fedweave_core::Purpose::Augment);
        Augment::CropFlipReflectCutout.apply([1, 12, 12], &mut x, &mut rng);
        let mut corners = std::collections::BTreeSet::new();
        for img in x.chunks_exact(144) {
            let zeros: Vec<(usize, usize)> = (0..144)
                .filter(|&k| img[k] == 0.0)
                .map(|k| (k / 12, k % 12))
                .collect();
            assert_eq!(zeros.len(), 64);
            let (y0, x0) = zeros[0];
            assert!(y0 <= 4 && x0 <= 4, "corner ({y0}, {x0})");
            for (k, &(i, j)) in zeros.iter().enumerate() {
                assert_eq!((i, j), (y0 + k / 8, x0 + k % 8));
            }
            assert!(img.iter().all(|&v| v == 0.0 || v == 1.0));
            corners.insert((y0, x0));
        }
        // All 5·5 corners are drawn, the extreme ones included.
        assert_eq!(corners.len(), 25);
        // Two channels get the same square.
        let mut two = vec![1.0f32; 2 * 144];
        Augment::CropFlipReflectCutout.apply([2, 12, 12], &mut two, &mut rng);
        assert_eq!(two[..144], two[144..]);
    }
}
