//! CIFAR-10 / CIFAR-100: fixtures in the distributed binary layout and in
//! the python layout (Python 2 cPickle, protocol 2, numpy array), and the
//! errors for missing, truncated and inconsistent files.

use std::path::Path;

use fedweave_data::{DataConfig, DataError, load_dataset};

const PIXELS: usize = 3072;

/// Pixel `j` of image `i` of a fixture.
fn px(i: usize, j: usize, seed: u8) -> u8 {
    ((i * 31 + j * 7) as u8).wrapping_add(seed)
}

fn images(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (0..PIXELS).map(move |j| px(i, j, seed)))
        .collect()
}

/// Binary version: `head` label bytes per record, then 3072 pixel bytes.
fn binary(labels: &[&[u8]], seed: u8) -> Vec<u8> {
    let img = images(labels.len(), seed);
    let mut out = Vec::new();
    for (i, head) in labels.iter().enumerate() {
        out.extend_from_slice(head);
        out.extend_from_slice(&img[i * PIXELS..(i + 1) * PIXELS]);
    }
    out
}

/// The opcodes Python 2's cPickle writes with protocol 2 (how the CIFAR
/// python batches were made): strings are byte strings (`U`/`T`), every
/// object is memoised with BINPUT, the numpy array goes through
/// `numpy.core.multiarray._reconstruct` + BUILD with its state tuple.
struct Py2Pickle {
    out: Vec<u8>,
    memo: u32,
}

impl Py2Pickle {
    fn new() -> Self {
        Py2Pickle {
            out: vec![0x80, 2],
            memo: 1,
        }
    }
    fn put(&mut self) {
        if self.memo < 256 {
            self.out.extend_from_slice(&[b'q', self.memo as u8]);
        } else {
            self.out.push(b'r');
            self.out.extend_from_slice(&self.memo.to_le_bytes());
        }
        self.memo += 1;
    }
    fn int(&mut self, v: i64) {
        if v > i64::from(i32::MAX) {
            // LONG1: 8 little-endian bytes.
            self.out.extend_from_slice(&[0x8a, 8]);
            self.out.extend_from_slice(&v.to_le_bytes());
        } else if (0..256).contains(&v) {
            self.out.extend_from_slice(&[b'K', v as u8]);
        } else if (0..65536).contains(&v) {
            self.out.push(b'M');
            self.out.extend_from_slice(&(v as u16).to_le_bytes());
        } else {
            self.out.push(b'J');
            self.out.extend_from_slice(&(v as i32).to_le_bytes());
        }
    }
    fn string(&mut self, s: &[u8]) {
        if s.len() < 256 {
            self.out.extend_from_slice(&[b'U', s.len() as u8]);
        } else {
            self.out.push(b'T');
            self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        }
        self.out.extend_from_slice(s);
        self.put();
    }
    fn global(&mut self, module: &str, name: &str) {
        self.out.push(b'c');
        self.out
            .extend_from_slice(format!("{module}\n{name}\n").as_bytes());
        self.put();
    }
    fn int_list(&mut self, v: &[i64]) {
        self.out.push(b']');
        self.put();
        for batch in v.chunks(1000) {
            if batch.len() == 1 {
                self.int(batch[0]);
                self.out.push(b'a');
            } else {
                self.out.push(b'(');
                for &x in batch {
                    self.int(x);
                }
                self.out.push(b'e');
            }
        }
    }
    /// A numpy uint8 array of shape (rows, cols), as numpy 1.x reduces it.
    fn ndarray_u8(&mut self, rows: usize, cols: usize, raw: &[u8]) {
        self.global("numpy.core.multiarray", "_reconstruct");
        self.global("numpy", "ndarray");
        self.int(0);
        self.out.push(0x85); // TUPLE1
        self.put();
        self.string(b"b");
        self.out.push(0x87); // TUPLE3
        self.put();
        self.out.push(b'R');
        self.put();
        // state: (1, (rows, cols), dtype('uint8'), False, raw)
        self.out.push(b'(');
        self.int(1);
        self.int(rows as i64);
        self.int(cols as i64);
        self.out.push(0x86); // TUPLE2
        self.put();
        self.global("numpy", "dtype");
        self.string(b"u1");
        self.int(0);
        self.int(1);
        self.out.push(0x87);
        self.put();
        self.out.push(b'R');
        self.put();
        self.out.push(b'(');
        self.int(3);
        self.string(b"|");
        self.out.extend_from_slice(b"NNN");
        self.out
            .extend_from_slice(b"J\xff\xff\xff\xffJ\xff\xff\xff\xff");
        self.int(0);
        self.out.push(b't');
        self.put();
        self.out.push(b'b'); // BUILD the dtype
        self.out.push(0x89); // False
        self.string(raw);
        self.out.push(b't');
        self.put();
        self.out.push(b'b'); // BUILD the array
    }
}

/// A python-version batch: {'batch_label', 'labels' or fine/coarse, 'data',
/// 'filenames'} as the originals hold them.
fn pickled(label_lists: &[(&str, Vec<i64>)], seed: u8) -> Vec<u8> {
    let n = label_lists[0].1.len();
    let mut p = Py2Pickle::new();
    p.out.push(b'}');
    p.put();
    p.out.push(b'(');
    p.string(b"data");
    p.ndarray_u8(n, PIXELS, &images(n, seed));
    for (key, list) in label_lists {
        p.string(key.as_bytes());
        p.int_list(list);
    }
    p.string(b"batch_label");
    p.string(b"training batch 1 of 5");
    p.string(b"filenames");
    p.out.push(b']');
    p.put();
    p.out.push(b'(');
    for i in 0..n {
        p.string(format!("img_{i}.png").as_bytes());
    }
    p.out.push(b'e');
    p.out.extend_from_slice(b"u.");
    p.out
}

fn cfg(dataset: &str, dir: &Path, normalize: bool) -> DataConfig {
    DataConfig {
        dataset: dataset.into(),
        path: Some(dir.to_path_buf()),
        normalize,
        ..DataConfig::default()
    }
}

const TRAIN10: [[u8; 2]; 5] = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]];

/// CIFAR-10 binary: five training batches of 2 images, a test batch of 3.
fn cifar10_bin(root: &Path) -> std::path::PathBuf {
    let dir = root.join("cifar-10-batches-bin");
    std::fs::create_dir_all(&dir).unwrap();
    for (b, ys) in TRAIN10.iter().enumerate() {
        let heads: Vec<&[u8]> = ys.iter().map(std::slice::from_ref).collect();
        std::fs::write(
            dir.join(format!("data_batch_{}.bin", b + 1)),
            binary(&heads, b as u8 * 2),
        )
        .unwrap();
    }
    std::fs::write(dir.join("test_batch.bin"), binary(&[&[3], &[1], &[4]], 50)).unwrap();
    dir
}

fn cifar10_py(root: &Path) -> std::path::PathBuf {
    let dir = root.join("cifar-10-batches-py");
    std::fs::create_dir_all(&dir).unwrap();
    for (b, ys) in TRAIN10.iter().enumerate() {
        let ys: Vec<i64> = ys.iter().map(|&y| i64::from(y)).collect();
        std::fs::write(
            dir.join(format!("data_batch_{}", b + 1)),
            pickled(&[("labels", ys)], b as u8 * 2),
        )
        .unwrap();
    }
    std::fs::write(
        dir.join("test_batch"),
        pickled(&[("labels", vec![3, 1, 4])], 50),
    )
    .unwrap();
    dir
}

#[test]
fn cifar10_binary_and_python_versions_load_identically() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let bin_dir = cifar10_bin(a.path());
    let py_dir = cifar10_py(b.path());
    // data.path: the parent folder or the extracted folder itself.
    let from_bin = load_dataset(&cfg("cifar10", a.path(), false), 0).unwrap();
    let from_bin_dir = load_dataset(&cfg("cifar10", &bin_dir, false), 0).unwrap();
    let from_py = load_dataset(&cfg("cifar10", b.path(), false), 0).unwrap();
    let from_py_dir = load_dataset(&cfg("cifar10", &py_dir, false), 0).unwrap();
    assert_eq!(from_bin, from_bin_dir);
    assert_eq!(from_bin, from_py);
    assert_eq!(from_py, from_py_dir);
    let ds = from_bin;
    assert_eq!(ds.name, "cifar10");
    assert_eq!(ds.num_classes, 10);
    assert_eq!(ds.feature_shape, vec![3, 32, 32]);
    assert_eq!(ds.train.labels, (0..10).collect::<Vec<u32>>());
    assert_eq!(ds.test.labels, vec![3, 1, 4]);
    assert_eq!(ds.train.features.len(), 10 * PIXELS);
    // Sample 3 is image 1 of batch 2 (seed 2); pixels / 255, CHW order.
    let row = ds.train.row(3, PIXELS);
    for j in [0, 1023, 1024, 2048, 3071] {
        assert_eq!(row[j], f32::from(px(1, j, 2)) / 255.0);
    }
    assert_eq!(ds.test.row(2, PIXELS)[5], f32::from(px(2, 5, 50)) / 255.0);
}

#[test]
fn cifar_normalisation_is_per_channel() {
    let dir = tempfile::tempdir().unwrap();
    cifar10_bin(dir.path());
    let raw = load_dataset(&cfg("cifar10", dir.path(), false), 0).unwrap();
    let norm = load_dataset(&cfg("cifar10", dir.path(), true), 0).unwrap();
    let (mean, std) = ([0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]);
    for (j, c) in [(10, 0), (1500, 1), (3000, 2)] {
        let x = raw.train.row(4, PIXELS)[j];
        let z = norm.train.row(4, PIXELS)[j];
        assert!((z - (x - mean[c]) / std[c]).abs() < 1e-5, "{j}");
    }
}

fn cifar100_files(root: &Path) {
    let bin = root.join("cifar-100-binary");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(
        bin.join("train.bin"),
        binary(&[&[0, 99], &[19, 5], &[7, 42], &[3, 3]], 9),
    )
    .unwrap();
    std::fs::write(bin.join("test.bin"), binary(&[&[1, 10], &[2, 20]], 8)).unwrap();
    let py = root.join("cifar-100-python");
    std::fs::create_dir_all(&py).unwrap();
    std::fs::write(
        py.join("train"),
        pickled(
            &[
                ("fine_labels", vec![99, 5, 42, 3]),
                ("coarse_labels", vec![0, 19, 7, 3]),
            ],
            9,
        ),
    )
    .unwrap();
    std::fs::write(
        py.join("test"),
        pickled(
            &[("fine_labels", vec![10, 20]), ("coarse_labels", vec![1, 2])],
            8,
        ),
    )
    .unwrap();
}

#[test]
fn cifar100_fine_and_coarse_labels_in_both_versions() {
    let dir = tempfile::tempdir().unwrap();
    cifar100_files(dir.path());
    let mut c = cfg("cifar100", &dir.path().join("cifar-100-binary"), false);
    let bin = load_dataset(&c, 0).unwrap();
    c.path = Some(dir.path().join("cifar-100-python"));
    let py = load_dataset(&c, 0).unwrap();
    assert_eq!(bin, py);
    assert_eq!(bin.num_classes, 100);
    assert_eq!(bin.train.labels, vec![99, 5, 42, 3]);
    assert_eq!(bin.test.labels, vec![10, 20]);
    assert_eq!(bin.train.row(2, PIXELS)[7], f32::from(px(2, 7, 9)) / 255.0);
    c.coarse_labels = true;
    let coarse_py = load_dataset(&c, 0).unwrap();
    c.path = Some(dir.path().to_path_buf()); // parent: binary preferred
    let coarse_bin = load_dataset(&c, 0).unwrap();
    assert_eq!(coarse_bin, coarse_py);
    assert_eq!(coarse_bin.num_classes, 20);
    assert_eq!(coarse_bin.train.labels, vec![0, 19, 7, 3]);
    assert_eq!(coarse_bin.test.labels, vec![1, 2]);
    let e = load_dataset(&cfg("cifar10", dir.path(), false), 0).unwrap_err();
    assert!(matches!(e, DataError::Io { .. }), "{e}");
    let mut c10 = cfg("cifar10", dir.path(), false);
    c10.coarse_labels = true;
    let e = load_dataset(&c10, 0).unwrap_err().to_string();
    assert!(e.contains("data.coarse_labels"), "{e}");
}

fn err(dataset: &str, dir: &Path) -> String {
    load_dataset(&cfg(dataset, dir, true), 0)
        .unwrap_err()
        .to_string()
}

#[test]
fn missing_files_and_paths_are_named() {
    let e = load_dataset(
        &DataConfig {
            dataset: "cifar10".into(),
            ..DataConfig::default()
        },
        0,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("data.path"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let e = err("cifar10", dir.path());
    assert!(
        e.contains("cifar-10-batches-bin") && e.contains("test_batch"),
        "{e}"
    );
    let bin = cifar10_bin(dir.path());
    std::fs::remove_file(bin.join("data_batch_4.bin")).unwrap();
    let e = err("cifar10", dir.path());
    assert!(e.contains("data_batch_4.bin"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let py = cifar10_py(dir.path());
    std::fs::remove_file(py.join("test_batch")).unwrap();
    let e = err("cifar10", dir.path());
    assert!(e.contains("test_batch") && e.contains("missing"), "{e}");
}

#[test]
fn truncated_and_corrupt_binary_files_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let bin = cifar10_bin(dir.path());
    let p = bin.join("data_batch_2.bin");
    let b = std::fs::read(&p).unwrap();
    std::fs::write(&p, &b[..b.len() - 100]).unwrap();
    let e = err("cifar10", dir.path());
    assert!(
        e.contains("data_batch_2.bin") && e.contains("truncated"),
        "{e}"
    );
    std::fs::write(&p, binary(&[&[10]], 0)).unwrap();
    let e = err("cifar10", dir.path());
    assert!(
        e.contains("data_batch_2.bin") && e.contains("label 10"),
        "{e}"
    );
    // A CIFAR-10 record size in a CIFAR-100 file.
    let dir = tempfile::tempdir().unwrap();
    cifar100_files(dir.path());
    std::fs::write(
        dir.path().join("cifar-100-binary/test.bin"),
        binary(&[&[1], &[2]], 0),
    )
    .unwrap();
    let e = err("cifar100", dir.path());
    assert!(e.contains("test.bin") && e.contains("3074"), "{e}");
}

#[test]
fn truncated_and_inconsistent_pickles_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let py = cifar10_py(dir.path());
    let p = py.join("data_batch_3");
    let good = std::fs::read(&p).unwrap();
    std::fs::write(&p, &good[..good.len() / 2]).unwrap();
    let e = err("cifar10", dir.path());
    assert!(e.contains("data_batch_3") && e.contains("pickle"), "{e}");
    std::fs::write(&p, b"not a pickle at all").unwrap();
    let e = err("cifar10", dir.path());
    assert!(e.contains("data_batch_3"), "{e}");
    // Two images, three labels.
    std::fs::write(&p, {
        let mut b = pickled(&[("labels", vec![1, 2])], 0);
        let mut c = pickled(&[("labels", vec![1, 2, 3])], 0);
        // Same array, longer label list: splice the label part of `c`.
        let cut_b = b.windows(8).position(|w| w == b"U\x06labels").unwrap();
        let cut_c = c.windows(8).position(|w| w == b"U\x06labels").unwrap();
        b.truncate(cut_b);
        b.extend(c.drain(cut_c..));
        b
    })
    .unwrap();
    let e = err("cifar10", dir.path());
    assert!(
        e.contains("data_batch_3") && e.contains("2 images") && e.contains("3 labels"),
        "{e}"
    );
    std::fs::write(&p, pickled(&[("labels", vec![1, 12])], 0)).unwrap();
    let e = err("cifar10", dir.path());
    assert!(e.contains("label 12"), "{e}");
    // CIFAR-100 python without fine labels.
    let dir = tempfile::tempdir().unwrap();
    cifar100_files(dir.path());
    std::fs::remove_dir_all(dir.path().join("cifar-100-binary")).unwrap();
    std::fs::write(
        dir.path().join("cifar-100-python/test"),
        pickled(&[("coarse_labels", vec![1, 2])], 0),
    )
    .unwrap();
    let e = err("cifar100", dir.path());
    assert!(e.contains("fine_labels") && e.contains("test"), "{e}");
}

#[test]
fn long_label_lists_in_cpickle_batches_load() {
    // cPickle writes lists in APPENDS batches of 1000 items.
    let dir = tempfile::tempdir().unwrap();
    let py = cifar10_py(dir.path());
    let ys: Vec<i64> = (0..1001).map(|i| (i * 7) % 10).collect();
    std::fs::write(
        py.join("data_batch_5"),
        pickled(&[("labels", ys.clone())], 4),
    )
    .unwrap();
    let ds = load_dataset(&cfg("cifar10", dir.path(), false), 0).unwrap();
    assert_eq!(ds.train.len(), 8 + 1001);
    let got: Vec<i64> = ds.train.labels[8..].iter().map(|&y| i64::from(y)).collect();
    assert_eq!(got, ys);
    assert_eq!(
        ds.train.row(1008, PIXELS)[9],
        f32::from(px(1000, 9, 4)) / 255.0
    );
}

/// Found while writing the `cifar_pickle` fuzz target: a shape whose image
/// count times 3,072 overflows must be an error, not an arithmetic panic.
#[test]
fn a_pickle_claiming_more_images_than_memory_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let py = cifar10_py(dir.path());
    let mut p = Py2Pickle::new();
    p.out.push(b'}');
    p.put();
    p.out.push(b'(');
    p.string(b"data");
    p.ndarray_u8(1 << 62, PIXELS, &images(1, 0));
    p.string(b"labels");
    p.int_list(&[1]);
    p.out.extend_from_slice(b"u.");
    std::fs::write(py.join("data_batch_2"), p.out).unwrap();
    let e = err("cifar10", dir.path());
    assert!(
        e.contains("data_batch_2") && e.contains("more than memory holds"),
        "{e}"
    );
}
