//! `pfllib` with files written by real numpy, the way PFLlib's
//! `save_file` writes them (`np.savez_compressed(f, data={'x': X, 'y':
//! y})`); skipped, with a message, where Python has no numpy. The crate's
//! unit tests cover the same format with pickles built byte by byte.

use std::process::Command;

use fedweave_data::{DataConfig, load_federation};

const SCRIPT: &str = r#"
import json, os, sys
import numpy as np
root = sys.argv[1]
sizes = [(5, 2), (3, 4)]
stats = []
for d in ("train", "test"):
    os.makedirs(os.path.join(root, d), exist_ok=True)
for i, (ntr, nte) in enumerate(sizes):
    counts = {}
    for d, n, off in (("train", ntr, 0), ("test", nte, 100)):
        x = (np.arange(n * 12, dtype=np.float32).reshape(n, 3, 2, 2) + off + 1000 * i) / 7
        y = np.arange(n, dtype=np.int64) % 3
        for c in y.tolist():
            counts[c] = counts.get(c, 0) + 1
        with open(os.path.join(root, d, f"{i}.npz"), "wb") as f:
            np.savez_compressed(f, data={"x": x, "y": y})
    stats.append([[c, n] for c, n in sorted(counts.items())])
with open(os.path.join(root, "config.json"), "w") as f:
    json.dump({"num_clients": 2, "num_classes": 3, "non_iid": False, "balance": True,
               "partition": None, "Size of samples for labels in clients": stats,
               "alpha": 0.1, "batch_size": 10}, f)
"#;

#[test]
fn files_written_by_numpy_load_with_pfllib_s_sizes() {
    // The first Python with numpy (pyenv installs may have it only under a
    // versioned name).
    let python = ["python3", "python3.13", "python3.12", "python3.11"]
        .into_iter()
        .find(|p| {
            Command::new(p)
                .args(["-c", "import numpy"])
                .output()
                .is_ok_and(|o| o.status.success())
        });
    let Some(python) = python else {
        eprintln!("skipped: no python3 with numpy installed");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(python)
        .args(["-c", SCRIPT, dir.path().to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
    let cfg = DataConfig {
        dataset: "pfllib".into(),
        path: Some(dir.path().to_path_buf()),
        ..DataConfig::default()
    };
    let ds = load_federation(&cfg, 0, 2, None).unwrap();
    assert_eq!(ds.feature_shape, [3, 2, 2]);
    let nat = ds.natural_clients.unwrap();
    let sizes: Vec<(usize, usize)> = nat.iter().map(|c| (c.train.len(), c.test.len())).collect();
    assert_eq!(sizes, [(5, 2), (3, 4)]);
    // Client 1's first test sample starts at (0 + 100 + 1000) / 7.
    assert_eq!(ds.test.row(2, 12)[0], 1100.0f32 / 7.0);
    assert_eq!(ds.train.labels, [0, 1, 2, 0, 1, 0, 1, 2]);
    // Token ids (PFLlib's text sets): int64 x, and y's int64 dtype then
    // refers back to x's in the pickle.
    let ids = "import numpy as np, sys\nwith open(sys.argv[1], 'wb') as f:\n    np.savez_compressed(f, data={'x': np.arange(8).reshape(4, 2), 'y': np.zeros(4, dtype=np.int64)})";
    let file = dir.path().join("test").join("1.npz");
    let status = Command::new(python)
        .args(["-c", ids, file.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
    let e = load_federation(&cfg, 0, 2, None).unwrap_err().to_string();
    assert!(e.contains("1.npz") && e.contains("integers"), "{e}");
}
