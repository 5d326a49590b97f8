//! Golden files recorded per CPU kernel class.
//!
//! CPU results are bit-reproducible on one machine at any thread count, and
//! across machines of the same [`fedweave_nn::CpuKernelClass`]; between
//! classes the kernels order their sums differently and the last bits move.
//! So a golden folder holds the numbers of every class it was recorded on:
//! `classes.txt` lists them, the first is the canonical class whose files
//! sit in the folder itself, and another class's file sits in
//! `by-class/CLASS/` when (and only when) its numbers differ from the
//! canonical ones.
//!
//! On a recorded class a golden is compared bit for bit. On any other class
//! it is compared by value with the caller's tolerance (every string,
//! integer and structure exactly), and the test says that the class has no
//! recording. `FEDWEAVE_BLESS=1` records this machine's class;
//! `scripts/bless_goldens.sh` records every class of `classes.txt` on one
//! AVX-512 machine (`scripts/as_cpu.sh`).

use std::path::{Path, PathBuf};

/// The golden files of one folder, seen from this machine's class.
pub struct GoldenSet {
    dir: PathBuf,
    class: String,
    classes: Vec<String>,
}

/// What this machine must reproduce for one golden file.
pub struct Expected {
    /// The recorded text (this class's own, else the canonical one).
    pub text: String,
    /// Whether this class was recorded, so that the text must match bit
    /// for bit; otherwise values are compared within a tolerance.
    pub exact: bool,
}

impl GoldenSet {
    /// The goldens in `dir` for this machine's class.
    pub fn open(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        let classes = std::fs::read_to_string(dir.join("classes.txt"))
            .unwrap_or_default()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_string)
            .collect();
        Self {
            dir,
            class: fedweave_nn::CpuKernelClass::detect().id(),
            classes,
        }
    }

    /// Whether this run records (`FEDWEAVE_BLESS` set) instead of checking.
    pub fn blessing() -> bool {
        std::env::var_os("FEDWEAVE_BLESS").is_some()
    }

    /// This machine's class id.
    pub fn class(&self) -> &str {
        &self.class
    }

    fn canonical(&self) -> bool {
        self.classes.first() == Some(&self.class) || self.classes.is_empty()
    }

    fn class_file(&self, name: &str) -> PathBuf {
        self.dir.join("by-class").join(&self.class).join(name)
    }

    /// The text this machine must reproduce for `name`.
    ///
    /// # Panics
    ///
    /// When the canonical file is missing (record it with `FEDWEAVE_BLESS=1`).
    pub fn expected(&self, name: &str) -> Expected {
        let own = self.class_file(name);
        let path = if !self.canonical() && own.exists() {
            own
        } else {
            self.dir.join(name)
        };
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (record with FEDWEAVE_BLESS=1)", path.display()));
        Expected {
            text,
            exact: self.classes.contains(&self.class),
        }
    }

    /// Records `text` as this class's `name`: the canonical file on the
    /// canonical class, else a class file only where it differs from the
    /// canonical one. Adds the class to `classes.txt`.
    pub fn bless(&mut self, name: &str, text: &str) {
        if !self.classes.contains(&self.class) {
            self.classes.push(self.class.clone());
            let mut list = String::from(
                "# CPU kernel classes these goldens were recorded on (fedweave_nn::CpuKernelClass);\n\
                 # the first is canonical, the others' differing files are in by-class/CLASS/.\n",
            );
            for c in &self.classes {
                list.push_str(c);
                list.push('\n');
            }
            write(&self.dir.join("classes.txt"), &list);
        }
        let own = self.class_file(name);
        if self.canonical() {
            write(&self.dir.join(name), text);
        } else if std::fs::read_to_string(self.dir.join(name)).ok().as_deref() == Some(text) {
            let _ = std::fs::remove_file(&own);
        } else {
            write(&own, text);
        }
    }
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("golden files live in a folder")).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Whether two floats agree within `rel` relative (plus `abs` absolute for
/// values near zero).
pub fn close(a: f64, b: f64, rel: f64, abs: f64) -> bool {
    a == b || (a.is_nan() && b.is_nan()) || (a - b).abs() <= rel * a.abs().max(b.abs()) + abs
}
