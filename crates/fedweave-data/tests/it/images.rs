//! `image-folder` and `cinic10`: folder fixtures of real PNG and JPEG
//! files, labels, preprocessing by hand, and bad files.

use std::path::{Path, PathBuf};

use fedweave_data::{DataConfig, ImageSize, image_prep, load_dataset, load_federation};
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder};

/// A `w`×`h` PNG whose pixel `(x, y)` is `rgb + [x, y, 0]`.
fn png(w: u32, h: u32, rgb: [u8; 3]) -> Vec<u8> {
    let pixels: Vec<u8> = (0..h)
        .flat_map(|y| (0..w).flat_map(move |x| [rgb[0] + x as u8, rgb[1] + y as u8, rgb[2]]))
        .collect();
    let mut out = Vec::new();
    PngEncoder::new(&mut out)
        .write_image(&pixels, w, h, ExtendedColorType::Rgb8)
        .unwrap();
    out
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// Client 0: train cat ×2, dog ×1; test dog. Client 1: train ant, dog;
/// test cat. Classes: ant 0, cat 1, dog 2.
fn folders(root: &Path) {
    let c0 = root.join("c0");
    write(&c0.join("train/cat/b.png"), &png(4, 3, [10, 20, 30]));
    write(&c0.join("train/cat/a.png"), &png(4, 3, [40, 50, 60]));
    write(&c0.join("train/dog/x.png"), &png(4, 3, [70, 80, 90]));
    write(&c0.join("train/dog/notes.txt"), b"skipped");
    write(&c0.join("test/dog/t.png"), &png(4, 3, [1, 2, 3]));
    let c1 = root.join("c1");
    write(&c1.join("train/ant/a.png"), &png(4, 3, [100, 110, 120]));
    let mut jpeg = Vec::new();
    JpegEncoder::new_with_quality(&mut jpeg, 100)
        .write_image(&[128; 4 * 3], 4, 3, ExtendedColorType::L8)
        .unwrap();
    write(&c1.join("train/dog/g.JPG"), &jpeg);
    write(&c1.join("test/cat/t.png"), &png(4, 3, [5, 6, 7]));
}

fn folder_cfg(root: &Path) -> DataConfig {
    DataConfig {
        dataset: "image-folder".into(),
        path: Some(root.join("c{id}")),
        ..DataConfig::default()
    }
}

#[test]
fn image_folders_give_shared_labels_and_exact_pixels() {
    let dir = tempfile::tempdir().unwrap();
    folders(dir.path());
    let ds = load_federation(&folder_cfg(dir.path()), 0, 2, None).unwrap();
    assert_eq!(ds.num_classes, 3);
    assert_eq!(ds.feature_shape, [3, 3, 4]);
    // Client 0: cat/a, cat/b, dog/x; client 1: ant/a, dog/g.
    assert_eq!(ds.train.labels, [1, 1, 2, 0, 2]);
    assert_eq!(ds.test.labels, [2, 1]);
    let nat = ds.natural_clients.as_ref().unwrap();
    assert_eq!(
        (nat[0].train.clone(), nat[0].test.clone()),
        (vec![0, 1, 2], vec![0])
    );
    assert_eq!(
        (nat[1].train.clone(), nat[1].test.clone()),
        (vec![3, 4], vec![1])
    );
    // cat/a.png, red plane row 1 = 40 + x; green plane (1, 2) = 50 + 1.
    let a = ds.train.row(0, 36);
    assert_eq!(
        &a[4..8],
        &[40.0 / 255.0, 41.0 / 255.0, 42.0 / 255.0, 43.0 / 255.0]
    );
    assert_eq!(a[12 + 4 + 2], 51.0 / 255.0);
    // The grayscale JPEG becomes three equal planes.
    assert!(
        ds.train
            .row(4, 36)
            .iter()
            .all(|&v| (v - 128.0 / 255.0).abs() < 2e-2)
    );
}

#[test]
fn channels_resize_and_normalisation_apply() {
    let dir = tempfile::tempdir().unwrap();
    folders(dir.path());
    let mut cfg = folder_cfg(dir.path());
    cfg.channels = Some(1);
    cfg.image_size = Some(ImageSize::HeightWidth([2, 5]));
    cfg.mean = Some(vec![0.5]);
    cfg.std = Some(vec![0.25]);
    let ds = load_federation(&cfg, 0, 2, None).unwrap();
    assert_eq!(ds.feature_shape, [1, 2, 5]);
    assert_eq!(ds.train.features.len(), 5 * 10);
    // The gray JPEG (128) stays flat through resizing.
    for v in ds.train.row(4, 10) {
        assert!((v - (128.0 / 255.0 - 0.5) / 0.25).abs() < 0.1, "{v}");
    }
    let prep = image_prep(&cfg).unwrap();
    assert_eq!((prep.channels, prep.resize), (1, Some([2, 5])));
    let mut one = Vec::new();
    let hw = prep
        .features(&png(4, 3, [40, 50, 60]), Path::new("x.png"), &mut one)
        .unwrap();
    assert_eq!((hw, &one[..]), ([2, 5], ds.train.row(0, 10)));
    cfg.mean = Some(vec![0.5, 0.5, 0.5]);
    let e = load_federation(&cfg, 0, 2, None).unwrap_err().to_string();
    assert!(
        e.contains("data.mean") && e.contains("one value per channel"),
        "{e}"
    );
    cfg.mean = None;
    let e = load_federation(&cfg, 0, 2, None).unwrap_err().to_string();
    assert!(e.contains("data.mean"), "{e}");
    cfg.std = None;
    cfg.channels = Some(2);
    let e = load_federation(&cfg, 0, 2, None).unwrap_err().to_string();
    assert!(e.contains("data.channels"), "{e}");
}

#[test]
fn bad_folders_and_images_are_errors_that_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    folders(dir.path());
    let cfg = folder_cfg(dir.path());
    let err = |cfg: &DataConfig| load_federation(cfg, 0, 2, None).unwrap_err().to_string();
    let e = err(&DataConfig {
        path: Some(dir.path().join("c0")),
        ..cfg.clone()
    });
    assert!(e.contains("{id}") && e.contains("data.path"), "{e}");
    let e = load_federation(&cfg, 0, 3, None).unwrap_err().to_string();
    assert!(e.contains("c2") && e.contains("client 2"), "{e}");
    let odd = dir.path().join("c1/train/ant/b.png");
    write(&odd, &png(5, 3, [0, 0, 0]));
    let e = err(&cfg);
    assert!(
        e.contains("b.png") && e.contains("5×3") && e.contains("data.image_size"),
        "{e}"
    );
    let mut resized = cfg.clone();
    resized.image_size = Some(ImageSize::Square(8));
    assert_eq!(
        load_federation(&resized, 0, 2, None).unwrap().feature_shape,
        [3, 8, 8]
    );
    write(&odd, b"\x89PNG\r\n\x1a\n truncated");
    let e = err(&resized);
    assert!(e.contains("b.png") && e.contains("not a readable"), "{e}");
    std::fs::remove_dir_all(dir.path().join("c1/test")).unwrap();
    let e = err(&cfg);
    assert!(e.contains("c1") && e.contains("test"), "{e}");
    let e = load_dataset(&cfg, 0).unwrap_err().to_string();
    assert!(e.contains("load_federation"), "{e}");
}

const CINIC: [&str; 10] = [
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

/// One 32×32 PNG per class and split, red = 10·class + split.
fn cinic(root: &Path) -> PathBuf {
    for (s, split) in ["train", "valid", "test"].iter().enumerate() {
        for (c, class) in CINIC.iter().enumerate() {
            let f = root
                .join(split)
                .join(class)
                .join(format!("{split}_{c}.png"));
            write(&f, &png(32, 32, [(10 * c + s) as u8, 100, 200]));
        }
    }
    root.to_path_buf()
}

#[test]
fn cinic10_loads_train_and_valid_with_its_normalisation() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = DataConfig {
        dataset: "cinic10".into(),
        path: Some(cinic(dir.path())),
        ..DataConfig::default()
    };
    let ds = load_dataset(&cfg, 0).unwrap();
    assert_eq!(
        (ds.num_classes, ds.feature_shape.clone()),
        (10, vec![3, 32, 32])
    );
    let labels: Vec<u32> = (0..10).chain(0..10).collect();
    assert_eq!(ds.train.labels, labels);
    assert_eq!(ds.test.labels, (0..10).collect::<Vec<_>>());
    // valid/ship (class 8, split 1): red at (x = 3, y = 0) is 81 + 3.
    let row = ds.train.row(18, 3 * 1024);
    assert_eq!(row[3], (84.0 / 255.0 - 0.478_895_22) / 0.242_057_76);
    // green at (0, 2) is 100 + 2; blue is 200.
    assert_eq!(
        row[1024 + 64],
        (102.0 / 255.0 - 0.472_278_42) / 0.238_280_46
    );
    assert_eq!(row[2048], (200.0 / 255.0 - 0.430_474_04) / 0.258_748_35);
    let raw = load_dataset(
        &DataConfig {
            normalize: false,
            ..cfg.clone()
        },
        0,
    )
    .unwrap();
    assert_eq!(raw.test.row(2, 3 * 1024)[0], 22.0 / 255.0);
    write(
        &dir.path().join("test/cat/big.png"),
        &png(33, 32, [0, 0, 0]),
    );
    let e = load_dataset(&cfg, 0).unwrap_err().to_string();
    assert!(e.contains("big.png") && e.contains("32×32"), "{e}");
    std::fs::remove_dir_all(dir.path().join("valid/frog")).unwrap();
    let e = load_dataset(&cfg, 0).unwrap_err().to_string();
    assert!(e.contains("frog"), "{e}");
}

#[test]
fn image_keys_are_refused_for_other_datasets() {
    let cfg = DataConfig {
        image_size: Some(ImageSize::Square(16)),
        ..DataConfig::default()
    };
    let e = load_dataset(&cfg, 0).unwrap_err().to_string();
    assert!(
        e.contains("data.image_size") && e.contains("image-folder") && e.contains("digits"),
        "{e}"
    );
}
