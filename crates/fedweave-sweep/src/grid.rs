//! The grid file and its expansion into planned runs.
//!
//! ```toml
//! base = "quickstart.toml"          # relative to the grid file; or a [base] table
//! seeds = [1, 2, 3]
//! rows = "algorithm.name"           # optional: the table's row axis
//!
//! [grid]                            # Cartesian product of these lists
//! "algorithm.name" = ["fedavg", "pfedgraph"]
//! partition.beta = [0.1, 0.5]       # dotted keys, quoted or as nested tables
//!
//! [set]                             # fixed overrides for every run
//! rounds = 5
//!
//! [[case]]                          # explicit extra combinations
//! "algorithm.name" = "dpfl"
//! "train.local_epochs" = 2
//! ```

use std::collections::BTreeSet;
use std::path::Path;

use fedweave_sim::ExperimentConfig;

use crate::error::{SweepError, io};

/// One `key = value` setting (the key dotted, the value a TOML value).
pub type Assignment = (String, toml::Value);

/// A parsed grid file.
#[derive(Clone, Debug)]
pub struct Grid {
    /// Where it came from (for messages).
    pub origin: String,
    /// The base configuration as TOML text.
    pub base_text: String,
    /// Seeds (`None`: the base config's seed only).
    pub seeds: Option<Vec<u64>>,
    /// Fixed overrides, applied to every run before the grid's values.
    pub set: Vec<Assignment>,
    /// Grid axes: key and its values, in the order of the file's keys
    /// (sorted, `algorithm.name` first).
    pub axes: Vec<(String, Vec<toml::Value>)>,
    /// Explicit combinations.
    pub cases: Vec<Vec<Assignment>>,
    /// The key whose values are the table's rows.
    pub rows: Option<String>,
}

/// One run to do.
#[derive(Clone, Debug)]
pub struct PlannedRun {
    /// Directory name (unique within the sweep, filesystem-safe, stable).
    pub name: String,
    /// The setting's grid/case values (without the seed).
    pub setting: Vec<Assignment>,
    /// Seed.
    pub seed: u64,
    /// The resolved configuration (validated).
    pub config: ExperimentConfig,
    /// Fingerprint of the resolved configuration (threads excluded).
    pub fingerprint: String,
}

/// Every run of a grid, checked.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Keys that vary between settings, in display order.
    pub keys: Vec<String>,
    /// The table's row key (one of `keys`), if any.
    pub rows: Option<String>,
    /// The runs, settings in grid order, seeds innermost.
    pub runs: Vec<PlannedRun>,
}

const TOP_KEYS: [&str; 6] = ["base", "seeds", "grid", "set", "case", "rows"];

fn grid_err(file: &str, message: impl Into<String>) -> SweepError {
    SweepError::Grid {
        file: file.to_string(),
        message: message.into(),
    }
}

/// Flattens nested tables into dotted leaf keys.
fn flatten(prefix: &str, table: &toml::Table, out: &mut Vec<Assignment>) {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) => flatten(&key, t, out),
            other => out.push((key, other.clone())),
        }
    }
}

fn type_name(v: &toml::Value) -> &'static str {
    match v {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a datetime",
        toml::Value::Array(_) => "a list",
        toml::Value::Table(_) => "a table",
    }
}

/// `algorithm.name` first, the rest in their (sorted) order.
fn algorithm_first(keys: &mut [String]) {
    keys.sort_by_key(|k| k != "algorithm.name");
}

impl Grid {
    /// Reads a grid file; `base = "..."` is resolved relative to it.
    ///
    /// # Errors
    /// An unreadable file, invalid TOML, or any malformed entry (see
    /// [`Grid::parse`]).
    pub fn read(path: &Path) -> Result<Grid, SweepError> {
        let text = std::fs::read_to_string(path).map_err(io(path))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        Grid::parse(&text, dir, &path.display().to_string())
    }

    /// Parses grid text; `dir` is where a relative `base` path starts.
    ///
    /// # Errors
    /// Invalid TOML, an unknown top-level key, a missing or unreadable base,
    /// a grid value that is not a non-empty list, bad seeds, a `seed` key in
    /// the grid or a case (use `seeds`), or an empty case.
    pub fn parse(text: &str, dir: &Path, origin: &str) -> Result<Grid, SweepError> {
        let err = |m: String| grid_err(origin, m);
        let doc: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| err(format!("not valid TOML: {e}")))?;
        for k in doc.keys() {
            if !TOP_KEYS.contains(&k.as_str()) {
                return Err(err(
                    match fedweave_sim::suggest::did_you_mean(k, TOP_KEYS) {
                        Some(s) => format!("unknown key `{k}`; did you mean `{s}`?"),
                        None => format!("unknown key `{k}` (expected {})", TOP_KEYS.join(", ")),
                    },
                ));
            }
        }
        let base_text = match doc.get("base") {
            None => {
                return Err(err(
                    "missing base: write `base = \"config.toml\"` (relative to the grid file) or a [base] table".into(),
                ));
            }
            Some(toml::Value::String(p)) => {
                let path = dir.join(p);
                std::fs::read_to_string(&path).map_err(|e| {
                    err(format!(
                        "base config `{p}` ({}) cannot be read: {e}",
                        path.display()
                    ))
                })?
            }
            Some(toml::Value::Table(t)) => {
                toml::to_string(t).map_err(|e| err(format!("cannot re-serialise [base]: {e}")))?
            }
            Some(v) => {
                return Err(err(format!(
                    "`base` must be a file name or a table, got {}",
                    type_name(v)
                )));
            }
        };
        let seeds = match doc.get("seeds") {
            None => None,
            Some(toml::Value::Array(a)) if a.is_empty() => {
                return Err(err("`seeds` is an empty list".into()));
            }
            Some(toml::Value::Array(a)) => {
                let mut seeds = Vec::with_capacity(a.len());
                for v in a {
                    match v.as_integer().and_then(|i| u64::try_from(i).ok()) {
                        Some(s) => seeds.push(s),
                        None => {
                            return Err(err(format!(
                                "`seeds` must hold non-negative integers, found {v}"
                            )));
                        }
                    }
                }
                let unique: BTreeSet<u64> = seeds.iter().copied().collect();
                if unique.len() != seeds.len() {
                    return Err(err("`seeds` lists a seed twice".into()));
                }
                Some(seeds)
            }
            Some(v) => {
                return Err(err(format!(
                    "`seeds` must be a list of integers, got {}",
                    type_name(v)
                )));
            }
        };
        let table_at = |k: &str| -> Result<Option<&toml::Table>, SweepError> {
            match doc.get(k) {
                None => Ok(None),
                Some(toml::Value::Table(t)) => Ok(Some(t)),
                Some(v) => Err(err(format!("`{k}` must be a table, got {}", type_name(v)))),
            }
        };
        let mut set = Vec::new();
        if let Some(t) = table_at("set")? {
            flatten("", t, &mut set);
        }
        let mut axes = Vec::new();
        if let Some(t) = table_at("grid")? {
            let mut leaves = Vec::new();
            flatten("", t, &mut leaves);
            for (k, v) in leaves {
                if k == "seed" {
                    return Err(err("grid key `seed`: list seeds in `seeds = [...]`".into()));
                }
                match v {
                    toml::Value::Array(a) if a.is_empty() => {
                        return Err(err(format!("grid key `{k}` has an empty list of values")));
                    }
                    toml::Value::Array(a) => {
                        for (i, x) in a.iter().enumerate() {
                            if a[..i].contains(x) {
                                return Err(err(format!("grid key `{k}` lists {x} twice")));
                            }
                        }
                        axes.push((k, a));
                    }
                    other => {
                        return Err(err(format!(
                            "grid key `{k}` must be a list of values, got {} ({other}); write `{k} = [{other}]` for a single value or put it under [set]",
                            type_name(&other)
                        )));
                    }
                }
            }
        }
        let mut keys: Vec<String> = axes.iter().map(|(k, _)| k.clone()).collect();
        algorithm_first(&mut keys);
        axes.sort_by_key(|(k, _)| keys.iter().position(|x| x == k));
        let mut cases = Vec::new();
        match doc.get("case") {
            None => {}
            Some(toml::Value::Array(a)) => {
                for (i, c) in a.iter().enumerate() {
                    let toml::Value::Table(t) = c else {
                        return Err(err(format!("case {} is not a table", i + 1)));
                    };
                    let mut leaves = Vec::new();
                    flatten("", t, &mut leaves);
                    if leaves.is_empty() {
                        return Err(err(format!("case {} sets nothing", i + 1)));
                    }
                    if leaves.iter().any(|(k, _)| k == "seed") {
                        return Err(err(format!(
                            "case {}: list seeds in `seeds = [...]`, not in a case",
                            i + 1
                        )));
                    }
                    cases.push(leaves);
                }
            }
            Some(v) => {
                return Err(err(format!(
                    "`case` must be written [[case]] (a list of tables), got {}",
                    type_name(v)
                )));
            }
        }
        let rows = match doc.get("rows") {
            None => None,
            Some(toml::Value::String(s)) => Some(s.clone()),
            Some(v) => {
                return Err(err(format!(
                    "`rows` must be a grid key, got {}",
                    type_name(v)
                )));
            }
        };
        Ok(Grid {
            origin: origin.to_string(),
            base_text,
            seeds,
            set,
            axes,
            cases,
            rows,
        })
    }

    /// Applies command-line `key=value` overrides on top of `[set]` (a key
    /// already there is replaced), e.g. the full-scale rounds of a grid
    /// written at reduced scale. Values read as TOML, else as strings.
    ///
    /// # Errors
    /// An assignment without `=`, or a key that a grid axis or a case
    /// varies (the override would silently flatten the grid).
    pub fn override_set(&mut self, assignments: &[String]) -> Result<(), SweepError> {
        for a in assignments {
            let err = |m: String| SweepError::Grid {
                file: self.origin.clone(),
                message: format!("--set {a}: {m}"),
            };
            let (key, raw) = a
                .split_once('=')
                .ok_or_else(|| err("an override must look like key=value".into()))?;
            let (key, raw) = (key.trim(), raw.trim());
            let varied = self.axes.iter().any(|(k, _)| k == key)
                || self.cases.iter().flatten().any(|(k, _)| k == key);
            if varied {
                return Err(err(format!("`{key}` is varied by the grid or a case")));
            }
            let value = format!("v = {raw}")
                .parse::<toml::Table>()
                .ok()
                .and_then(|mut t| t.remove("v"))
                .unwrap_or_else(|| toml::Value::String(raw.to_string()));
            self.set.retain(|(k, _)| k != key);
            self.set.push((key.to_string(), value));
        }
        Ok(())
    }

    /// The settings: the Cartesian product of the axes (last axis fastest),
    /// then the cases. With neither, one empty setting.
    pub fn settings(&self) -> Vec<Vec<Assignment>> {
        let mut out = Vec::new();
        if !self.axes.is_empty() {
            let mut idx = vec![0usize; self.axes.len()];
            'outer: loop {
                out.push(
                    self.axes
                        .iter()
                        .zip(&idx)
                        .map(|((k, vs), &i)| (k.clone(), vs[i].clone()))
                        .collect(),
                );
                for d in (0..idx.len()).rev() {
                    idx[d] += 1;
                    if idx[d] < self.axes[d].1.len() {
                        continue 'outer;
                    }
                    idx[d] = 0;
                }
                break;
            }
        }
        out.extend(self.cases.iter().cloned());
        if out.is_empty() {
            out.push(Vec::new());
        }
        out
    }

    /// Expands and checks every run: all configurations are parsed and
    /// validated here, before anything runs.
    ///
    /// # Errors
    /// A configuration that fails (naming the run and the key), two cases
    /// (or a case and a grid point) with the same setting, or a `rows` key
    /// that is not varied.
    pub fn plan(&self) -> Result<Plan, SweepError> {
        let settings = self.settings();
        let mut keys: Vec<String> = self.axes.iter().map(|(k, _)| k.clone()).collect();
        for c in &self.cases {
            for (k, _) in c {
                if !keys.contains(k) {
                    keys.push(k.clone());
                }
            }
        }
        let mut seen = BTreeSet::new();
        for s in &settings {
            let mut canon: Vec<String> = s.iter().map(|(k, v)| format!("{k}={v}")).collect();
            canon.sort();
            if !seen.insert(canon.join("\n")) {
                return Err(grid_err(
                    &self.origin,
                    format!(
                        "the setting {} appears twice (a case repeats a grid point or another case)",
                        setting_label(s)
                    ),
                ));
            }
        }
        if let Some(r) = &self.rows
            && !keys.contains(r)
        {
            return Err(grid_err(
                &self.origin,
                format!("`rows = \"{r}\"` is not a key of [grid] or of a case"),
            ));
        }
        let set: Vec<String> = self.set.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let seeds = match &self.seeds {
            Some(s) => s.clone(),
            None => {
                let cfg =
                    ExperimentConfig::from_toml_str(&self.base_text, &set).map_err(|source| {
                        SweepError::Config {
                            run: "(base with [set])".into(),
                            source,
                        }
                    })?;
                vec![cfg.seed]
            }
        };
        let labels = short_labels(&keys);
        let mut runs = Vec::with_capacity(settings.len() * seeds.len());
        for s in &settings {
            for &seed in &seeds {
                let name = run_name(s, seed, &keys, &labels);
                let mut overrides = set.clone();
                overrides.extend(s.iter().map(|(k, v)| format!("{k}={v}")));
                overrides.push(format!("seed={seed}"));
                let config = ExperimentConfig::from_toml_str(&self.base_text, &overrides).map_err(
                    |source| SweepError::Config {
                        run: name.clone(),
                        source,
                    },
                )?;
                let fingerprint = fingerprint(&config);
                runs.push(PlannedRun {
                    name,
                    setting: s.clone(),
                    seed,
                    config,
                    fingerprint,
                });
            }
        }
        make_unique(&mut runs);
        Ok(Plan {
            rows: self.rows.clone(),
            keys,
            runs,
        })
    }
}

/// `k=v, k=v` for messages and legends (values as [`value_text`]).
pub fn setting_label(s: &[Assignment]) -> String {
    if s.is_empty() {
        return "(base)".into();
    }
    s.iter()
        .map(|(k, v)| format!("{k}={}", value_text(v)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A value as shown to people: strings without quotes, the rest as TOML.
pub fn value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Short labels for keys: the last segment (the table's name for `name` and
/// `kind`), or the whole key where the short forms would collide.
pub fn short_labels(keys: &[String]) -> Vec<String> {
    let short = |k: &str| -> String {
        let parts: Vec<&str> = k.split('.').collect();
        match parts.as_slice() {
            [.., parent, last] if *last == "name" || *last == "kind" => (*parent).to_string(),
            [.., last] => (*last).to_string(),
            [] => k.to_string(),
        }
    };
    let shorts: Vec<String> = keys.iter().map(|k| short(k)).collect();
    keys.iter()
        .zip(&shorts)
        .map(|(k, s)| {
            let clash = shorts.iter().filter(|x| *x == s).count() > 1
                || (keys.contains(s) && s != k)
                || s == "seed";
            if clash { k.clone() } else { s.clone() }
        })
        .collect()
}

/// Keeps `[A-Za-z0-9._+-]`, replaces anything else by `_`.
fn safe(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

const MAX_NAME: usize = 120;

fn run_name(s: &[Assignment], seed: u64, keys: &[String], labels: &[String]) -> String {
    let mut parts = Vec::new();
    for (k, label) in keys.iter().zip(labels) {
        if let Some((_, v)) = s.iter().find(|(sk, _)| sk == k) {
            parts.push(format!("{}={}", safe(label), safe(&value_text(v))));
        }
    }
    let seed_part = format!("seed={seed}");
    let mut name = parts.join("__");
    if name.len() + seed_part.len() + 2 > MAX_NAME {
        let mut cut = MAX_NAME - seed_part.len() - 2 - 18;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        let hash = fnv1a(setting_label(s).as_bytes());
        name = format!("{}~{hash:016x}", &name[..cut]);
    }
    if name.is_empty() {
        seed_part
    } else {
        format!("{name}__{seed_part}")
    }
}

/// Appends a hash of the exact setting to names that sanitising made equal.
fn make_unique(runs: &mut [PlannedRun]) {
    let names: Vec<String> = runs.iter().map(|r| r.name.clone()).collect();
    for r in runs.iter_mut() {
        if names.iter().filter(|n| **n == r.name).count() > 1 {
            let h = fnv1a(setting_label(&r.setting).as_bytes());
            r.name = format!("{}~{:08x}", r.name, h as u32);
        }
    }
}

/// 64-bit FNV-1a: stable across Rust versions and platforms.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Fingerprint of a resolved configuration; `threads` is left out (results
/// do not depend on it, and `--jobs` changes it).
pub fn fingerprint(cfg: &ExperimentConfig) -> String {
    let mut c = cfg.clone();
    c.threads = None;
    format!("{:016x}", fnv1a(c.to_toml().as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_labels_avoid_collisions() {
        let keys = vec![
            "algorithm.name".to_string(),
            "partition.beta".to_string(),
            "partition.kind".to_string(),
            "train.lr".to_string(),
            "model.lr".to_string(),
        ];
        assert_eq!(
            short_labels(&keys),
            ["algorithm", "beta", "partition", "train.lr", "model.lr"]
        );
    }

    #[test]
    fn long_names_are_shortened_with_a_hash() {
        let s: Vec<Assignment> = (0..20)
            .map(|i| (format!("algorithm.param{i}"), toml::Value::Float(0.125)))
            .collect();
        let keys: Vec<String> = s.iter().map(|(k, _)| k.clone()).collect();
        let labels = short_labels(&keys);
        let a = run_name(&s, 1, &keys, &labels);
        assert!(a.len() <= MAX_NAME, "{a}");
        assert!(a.ends_with("__seed=1"));
        let mut s2 = s.clone();
        s2[19].1 = toml::Value::Float(0.25);
        assert_ne!(a, run_name(&s2, 1, &keys, &labels));
    }
}
