//! Tiny-ImageNet: a folder fixture in the distributed layout with real
//! JPEG files (RGB and grayscale), class order, and bad files.

use std::path::Path;

use fedweave_data::{DataConfig, load_dataset};
use image::codecs::jpeg::JpegEncoder;
use image::{ExtendedColorType, ImageEncoder};

const WNIDS: [&str; 3] = ["n09193705", "n01443537", "n04067472"];

fn jpeg(side: u32, rgb: [u8; 3]) -> Vec<u8> {
    let pixels: Vec<u8> = (0..side * side).flat_map(|_| rgb).collect();
    let mut out = Vec::new();
    JpegEncoder::new_with_quality(&mut out, 100)
        .write_image(&pixels, side, side, ExtendedColorType::Rgb8)
        .unwrap();
    out
}

fn gray_jpeg(v: u8) -> Vec<u8> {
    let mut out = Vec::new();
    JpegEncoder::new_with_quality(&mut out, 100)
        .write_image(&[v; 64 * 64], 64, 64, ExtendedColorType::L8)
        .unwrap();
    out
}

/// The colour of training image `k` of the class listed at `w` in WNIDS.
fn colour(w: usize, k: usize) -> [u8; 3] {
    [(40 * w + 20) as u8, (100 + 50 * k) as u8, 200]
}

fn fixture(root: &Path) -> std::path::PathBuf {
    let dir = root.join("tiny-imagenet-200");
    // wnids.txt is not sorted; class ids follow the sorted order.
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("wnids.txt"), WNIDS.join("\n") + "\n").unwrap();
    for (w, wnid) in WNIDS.iter().enumerate() {
        let images = dir.join("train").join(wnid).join("images");
        std::fs::create_dir_all(&images).unwrap();
        std::fs::write(
            dir.join("train")
                .join(wnid)
                .join(format!("{wnid}_boxes.txt")),
            format!("{wnid}_0.JPEG\t0\t0\t63\t63\n"),
        )
        .unwrap();
        for k in 0..2 {
            std::fs::write(
                images.join(format!("{wnid}_{k}.JPEG")),
                jpeg(64, colour(w, k)),
            )
            .unwrap();
        }
    }
    let val = dir.join("val").join("images");
    std::fs::create_dir_all(&val).unwrap();
    std::fs::write(val.join("val_0.JPEG"), jpeg(64, [10, 20, 30])).unwrap();
    std::fs::write(val.join("val_1.JPEG"), gray_jpeg(128)).unwrap();
    std::fs::write(
        dir.join("val").join("val_annotations.txt"),
        "val_0.JPEG\tn04067472\t0\t32\t44\t62\nval_1.JPEG\tn01443537\t52\t55\t57\t59\n",
    )
    .unwrap();
    dir
}

fn cfg(path: &Path, normalize: bool) -> DataConfig {
    DataConfig {
        dataset: "tiny-imagenet".into(),
        path: Some(path.to_path_buf()),
        normalize,
        ..DataConfig::default()
    }
}

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() <= 3.0 / 255.0
}

#[test]
fn folders_and_jpegs_load() {
    let root = tempfile::tempdir().unwrap();
    let dir = fixture(root.path());
    let ds = load_dataset(&cfg(root.path(), false), 0).unwrap();
    assert_eq!(ds, load_dataset(&cfg(&dir, false), 0).unwrap());
    assert_eq!(ds.num_classes, 3);
    assert_eq!(ds.feature_shape, vec![3, 64, 64]);
    // Sorted: n01443537 (0), n04067472 (1), n09193705 (2).
    assert_eq!(ds.train.labels, vec![0, 0, 1, 1, 2, 2]);
    assert_eq!(ds.test.labels, vec![1, 0]);
    let fl = 3 * 64 * 64;
    // Training sample 4 is n09193705 (listed first), image 0.
    let want = colour(0, 0);
    let row = ds.train.row(4, fl);
    for (c, &v) in want.iter().enumerate() {
        for j in [0, 2000, 4095] {
            assert!(close(row[c * 4096 + j], f32::from(v) / 255.0), "{c} {j}");
        }
    }
    let row = ds.train.row(1, fl); // n01443537 = WNIDS[1], image 1
    assert!(close(row[4096 + 7], f32::from(colour(1, 1)[1]) / 255.0));
    // The grayscale validation image becomes three equal channels.
    let row = ds.test.row(1, fl);
    for c in 0..3 {
        assert!(close(row[c * 4096 + 100], 128.0 / 255.0));
    }
    let norm = load_dataset(&cfg(root.path(), true), 0).unwrap();
    let (x, z) = (ds.test.row(0, fl)[4096 * 2], norm.test.row(0, fl)[4096 * 2]);
    assert!((z - (x - 0.406) / 0.225).abs() < 1e-5);
}

fn err(dir: &Path) -> String {
    load_dataset(&cfg(dir, true), 0).unwrap_err().to_string()
}

#[test]
fn bad_files_are_named() {
    let root = tempfile::tempdir().unwrap();
    let dir = fixture(root.path());
    let img = dir.join("train/n04067472/images/n04067472_1.JPEG");
    std::fs::write(&img, jpeg(32, [1, 2, 3])).unwrap();
    let e = err(&dir);
    assert!(e.contains("n04067472_1.JPEG") && e.contains("32×32"), "{e}");
    let good = jpeg(64, [1, 2, 3]);
    std::fs::write(&img, &good[..good.len() / 3]).unwrap();
    let e = err(&dir);
    assert!(e.contains("n04067472_1.JPEG") && e.contains("JPEG"), "{e}");
    std::fs::write(&img, &good).unwrap();

    let ann = dir.join("val/val_annotations.txt");
    std::fs::write(&ann, "val_0.JPEG\tn00000000\t0\t0\t1\t1\n").unwrap();
    let e = err(&dir);
    assert!(
        e.contains("val_annotations.txt") && e.contains("n00000000"),
        "{e}"
    );
    std::fs::write(&ann, "val_9.JPEG\tn04067472\t0\t0\t1\t1\n").unwrap();
    let e = err(&dir);
    assert!(e.contains("val_9.JPEG") && e.contains("missing"), "{e}");
    std::fs::write(&ann, "val_0.JPEG\n").unwrap();
    let e = err(&dir);
    assert!(
        e.contains("val_annotations.txt") && e.contains("line 1"),
        "{e}"
    );
    std::fs::remove_file(&ann).unwrap();
    let e = err(&dir);
    assert!(e.contains("val_annotations.txt"), "{e}");

    std::fs::remove_dir_all(dir.join("train/n01443537")).unwrap();
    let e = err(&dir);
    assert!(e.contains("n01443537"), "{e}");
    std::fs::write(dir.join("wnids.txt"), "n01\nn01\n").unwrap();
    let e = err(&dir);
    assert!(e.contains("wnids.txt") && e.contains("twice"), "{e}");
    let e = err(&root.path().join("elsewhere"));
    assert!(e.contains("elsewhere") && e.contains("wnids.txt"), "{e}");
}
