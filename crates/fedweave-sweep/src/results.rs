//! Reading finished runs, grouping them by setting (seeds together), and
//! the tables: `results.csv`, `table.md`, `table.tex`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{SweepError, io};
use crate::exec::SUMMARY_FILE;
use crate::grid::{Plan, short_labels, value_text};

/// One finished run.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// Name (the directory's name).
    pub name: String,
    /// The run directory.
    pub dir: PathBuf,
    /// Value of each of the collection's keys (`None`: not set by this run).
    pub values: Vec<Option<String>>,
    /// Seed.
    pub seed: u64,
    /// `summary.json`.
    pub summary: Value,
    /// `rounds.jsonl`'s per-round headline metric: `(round, value)`.
    pub curve: Vec<(u64, Option<f64>)>,
}

/// Finished runs and the keys that tell their settings apart.
#[derive(Clone, Debug)]
pub struct Collection {
    /// Keys that vary (grid keys, or config differences).
    pub keys: Vec<String>,
    /// The table's row key, if chosen.
    pub rows: Option<String>,
    /// The runs, in setting order, seeds ascending within a setting.
    pub runs: Vec<RunResult>,
}

/// The runs of one setting (all seeds).
#[derive(Clone, Debug)]
pub struct Group<'a> {
    /// Values of the collection's keys.
    pub values: &'a [Option<String>],
    /// The runs, seeds ascending.
    pub runs: Vec<&'a RunResult>,
}

/// Which headline metric the tables use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// `mean_test_acc` (fraction; shown in %, higher is better).
    Accuracy,
    /// `mean_test_mae` (forecasting; lower is better).
    Mae,
}

impl Metric {
    /// The summary key.
    pub fn key(self) -> &'static str {
        match self {
            Metric::Accuracy => "mean_test_acc",
            Metric::Mae => "mean_test_mae",
        }
    }
    /// The per-round key in `rounds.jsonl`.
    pub fn round_key(self) -> &'static str {
        self.key()
    }
    /// How values are shown.
    pub fn show(self, v: f64) -> String {
        match self {
            Metric::Accuracy => format!("{:.2}", 100.0 * v),
            Metric::Mae => format!("{v:.4}"),
        }
    }
    /// Whether `a` is better than `b`.
    pub fn better(self, a: f64, b: f64) -> bool {
        match self {
            Metric::Accuracy => a > b,
            Metric::Mae => a < b,
        }
    }
    /// A caption.
    pub fn caption(self) -> &'static str {
        match self {
            Metric::Accuracy => "mean test accuracy (%, best-validation protocol)",
            Metric::Mae => "mean test MAE (best-validation protocol; lower is better)",
        }
    }
}

/// A finite number at `key` of a JSON object.
pub(crate) fn num(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64).filter(|x| x.is_finite())
}

/// Mean and sample standard deviation (n − 1; `None` for a single value).
pub fn mean_std(xs: &[f64]) -> Option<(f64, Option<f64>)> {
    if xs.is_empty() {
        return None;
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let std = (xs.len() > 1)
        .then(|| (xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0)).sqrt());
    Some((mean, std))
}

/// Reads one finished run directory (its `summary.json` must exist).
pub fn load_run(dir: &Path) -> Result<RunResult, SweepError> {
    let sp = dir.join(SUMMARY_FILE);
    let text = std::fs::read_to_string(&sp).map_err(|e| SweepError::Input {
        path: dir.to_path_buf(),
        message: format!("not a finished run (cannot read {SUMMARY_FILE}: {e})"),
    })?;
    let summary: Value = serde_json::from_str(&text).map_err(|e| SweepError::Input {
        path: sp.clone(),
        message: format!("invalid JSON: {e}"),
    })?;
    if !summary.is_object() {
        return Err(SweepError::Input {
            path: sp,
            message: "expected a JSON object".into(),
        });
    }
    let metric =
        if num(&summary, "mean_test_acc").is_none() && num(&summary, "mean_test_mae").is_some() {
            Metric::Mae
        } else {
            Metric::Accuracy
        };
    let mut curve = Vec::new();
    if let Ok(t) = std::fs::read_to_string(dir.join("rounds.jsonl")) {
        for line in t.lines().filter(|l| !l.trim().is_empty()) {
            if let Ok(v) = serde_json::from_str::<Value>(line)
                && let Some(r) = v.get("round").and_then(Value::as_u64)
            {
                curve.push((r, num(&v, metric.round_key())));
            }
        }
    }
    Ok(RunResult {
        name: dir
            .file_name()
            .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into()),
        dir: dir.to_path_buf(),
        values: Vec::new(),
        seed: summary.get("seed").and_then(Value::as_u64).unwrap_or(0),
        summary,
        curve,
    })
}

impl Collection {
    /// The finished runs of a sweep plan under `out` (unfinished ones are
    /// left out).
    pub fn from_plan(plan: &Plan, out: &Path) -> Result<Collection, SweepError> {
        let mut runs = Vec::new();
        for r in &plan.runs {
            let dir = out.join(&r.name);
            if !dir.join(SUMMARY_FILE).is_file() {
                continue;
            }
            let mut rr = load_run(&dir)?;
            rr.values = plan
                .keys
                .iter()
                .map(|k| {
                    r.setting
                        .iter()
                        .find(|(sk, _)| sk == k)
                        .map(|(_, v)| value_text(v))
                })
                .collect();
            rr.seed = r.seed;
            runs.push(rr);
        }
        Ok(Collection {
            keys: plan.keys.clone(),
            rows: plan.rows.clone(),
            runs,
        })
    }

    /// Existing run directories, told apart by the differences of their
    /// `config.toml` (seed and threads ignored; algorithm parameters that
    /// only follow from the algorithm's name are ignored too).
    pub fn from_dirs(dirs: &[PathBuf]) -> Result<Collection, SweepError> {
        if dirs.is_empty() {
            return Err(SweepError::Input {
                path: PathBuf::from("."),
                message: "no run directories given".into(),
            });
        }
        let mut runs = Vec::new();
        let mut configs: Vec<BTreeMap<String, String>> = Vec::new();
        for d in dirs {
            let rr = load_run(d)?;
            let cp = d.join("config.toml");
            let text = std::fs::read_to_string(&cp).map_err(io(&cp))?;
            let table: toml::Table = text.parse().map_err(|e| SweepError::Input {
                path: cp.clone(),
                message: format!("invalid TOML: {e}"),
            })?;
            let mut flat = Vec::new();
            flatten_cfg("", &table, &mut flat);
            configs.push(
                flat.into_iter()
                    .filter(|(k, _)| k != "seed" && k != "threads")
                    .collect(),
            );
            runs.push(rr);
        }
        let all: std::collections::BTreeSet<&String> =
            configs.iter().flat_map(|c| c.keys()).collect();
        let mut keys: Vec<String> = all
            .into_iter()
            .filter(|k| {
                let first = configs[0].get(*k);
                configs.iter().any(|c| c.get(*k) != first)
            })
            .cloned()
            .collect();
        keys.sort_by_key(|k| k != "algorithm.name");
        if keys.iter().any(|k| k == "algorithm.name") {
            // Drop algorithm parameters fixed by the algorithm's name
            // (the engine writes every algorithm's resolved defaults).
            keys.retain(|k| {
                if k == "algorithm.name" || !k.starts_with("algorithm.") {
                    return true;
                }
                let mut by_algo: BTreeMap<Option<&String>, Option<&String>> = BTreeMap::new();
                for c in &configs {
                    let prev = by_algo.entry(c.get("algorithm.name")).or_insert(c.get(k));
                    if *prev != c.get(k) {
                        return true;
                    }
                }
                false
            });
        }
        for (rr, c) in runs.iter_mut().zip(&configs) {
            rr.values = keys.iter().map(|k| c.get(k).cloned()).collect();
        }
        // Settings in sorted order (numbers by value), seeds ascending.
        runs.sort_by(|a, b| {
            for (x, y) in a.values.iter().zip(&b.values) {
                let o = cmp_values(x.as_deref(), y.as_deref());
                if o != std::cmp::Ordering::Equal {
                    return o;
                }
            }
            a.seed.cmp(&b.seed)
        });
        Ok(Collection {
            keys,
            rows: None,
            runs,
        })
    }

    /// The headline metric: accuracy unless every run is forecasting.
    pub fn metric(&self) -> Metric {
        if !self.runs.is_empty()
            && self.runs.iter().all(|r| {
                num(&r.summary, "mean_test_acc").is_none()
                    && num(&r.summary, "mean_test_mae").is_some()
            })
        {
            Metric::Mae
        } else {
            Metric::Accuracy
        }
    }

    /// Settings in order of first appearance, each with its runs (seeds
    /// ascending).
    pub fn groups(&self) -> Vec<Group<'_>> {
        let mut out: Vec<Group<'_>> = Vec::new();
        for r in &self.runs {
            match out.iter_mut().find(|g| g.values == r.values.as_slice()) {
                Some(g) => g.runs.push(r),
                None => out.push(Group {
                    values: &r.values,
                    runs: vec![r],
                }),
            }
        }
        for g in &mut out {
            g.runs.sort_by_key(|r| r.seed);
        }
        out
    }

    /// Short labels of the keys.
    pub fn labels(&self) -> Vec<String> {
        short_labels(&self.keys)
    }

    /// A group's label, e.g. `algorithm=fedavg, beta=0.1`.
    pub fn group_label(&self, g: &Group<'_>) -> String {
        let labels = self.labels();
        let parts: Vec<String> = labels
            .iter()
            .zip(g.values)
            .filter_map(|(l, v)| v.as_ref().map(|v| format!("{l}={v}")))
            .collect();
        if parts.is_empty() {
            g.runs
                .first()
                .and_then(|r| r.summary.get("algorithm"))
                .and_then(Value::as_str)
                .unwrap_or("(base)")
                .to_string()
        } else {
            parts.join(", ")
        }
    }

    /// The index of the row key in `keys`.
    pub fn row_index(&self) -> Option<usize> {
        if let Some(r) = &self.rows
            && let Some(i) = self.keys.iter().position(|k| k == r)
        {
            return Some(i);
        }
        if self.keys.is_empty() {
            None
        } else {
            Some(
                self.keys
                    .iter()
                    .position(|k| k == "algorithm.name")
                    .unwrap_or(0),
            )
        }
    }
}

fn flatten_cfg(prefix: &str, t: &toml::Table, out: &mut Vec<(String, String)>) {
    for (k, v) in t {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) => flatten_cfg(&key, t, out),
            other => out.push((key, value_text(other))),
        }
    }
}

fn cmp_values(a: Option<&str>, b: Option<&str>) -> std::cmp::Ordering {
    match (a, b) {
        (Some(a), Some(b)) => match (a.parse::<f64>(), b.parse::<f64>()) {
            (Ok(x), Ok(y)) => x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal),
            _ => a.cmp(b),
        },
        (a, b) => a.is_some().cmp(&b.is_some()),
    }
}

/// The metrics columns of `results.csv`.
/// The best and worst 5 % (SFL's columns) are empty for runs whose
/// summaries predate them.
pub const CSV_METRICS: [&str; 10] = [
    "mean_test_acc",
    "last_round_mean_test_acc",
    "max_round_mean_test_acc",
    "std_test_acc",
    "bottom10_test_acc",
    "top5pct_test_acc",
    "bottom5pct_test_acc",
    "bytes_up",
    "bytes_down",
    "wall_seconds",
];

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// A JSON number exactly as it reads back (`""` for null / missing).
fn json_num(v: &Value, key: &str) -> String {
    match v.get(key) {
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    }
}

/// `results.csv`: one row per run (keys, seed, headline metrics).
pub fn results_csv(c: &Collection) -> String {
    let with_mae = c
        .runs
        .iter()
        .any(|r| num(&r.summary, "mean_test_mae").is_some());
    let mut metrics: Vec<&str> = CSV_METRICS.to_vec();
    if with_mae {
        metrics.insert(7, "mean_test_mae");
    }
    let mut out = String::new();
    let mut head = vec!["run".to_string()];
    head.extend(c.keys.iter().cloned());
    head.push("seed".into());
    head.extend(metrics.iter().map(|m| m.to_string()));
    out.push_str(
        &head
            .iter()
            .map(|h| csv_field(h))
            .collect::<Vec<_>>()
            .join(","),
    );
    out.push('\n');
    for r in &c.runs {
        let mut row = vec![csv_field(&r.name)];
        row.extend(
            r.values
                .iter()
                .map(|v| csv_field(v.as_deref().unwrap_or(""))),
        );
        row.push(r.seed.to_string());
        row.extend(metrics.iter().map(|m| json_num(&r.summary, m)));
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

/// One table cell: mean and sample std over seeds, how many seeds.
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    /// Mean.
    pub mean: f64,
    /// Sample std (`None` for one seed).
    pub std: Option<f64>,
    /// Seeds with a value.
    pub n: usize,
}

/// The table: rows (values of the row key), columns (combinations of the
/// other keys), cells.
#[derive(Clone, Debug)]
pub struct Table {
    /// Header of the row column.
    pub row_title: String,
    /// Row labels.
    pub rows: Vec<String>,
    /// Column labels.
    pub cols: Vec<String>,
    /// `cells[row][col]`.
    pub cells: Vec<Vec<Option<Cell>>>,
    /// The metric.
    pub metric: Metric,
}

impl Table {
    /// Builds the headline table of a collection.
    pub fn build(c: &Collection) -> Table {
        let metric = c.metric();
        let labels = c.labels();
        let ri = c.row_index();
        let mut rows: Vec<String> = Vec::new();
        let mut cols: Vec<String> = Vec::new();
        let mut entries: Vec<(usize, usize, Cell)> = Vec::new();
        for g in c.groups() {
            let row = match ri {
                Some(i) => g.values[i].clone().unwrap_or_else(|| "(base)".into()),
                None => c.group_label(&g),
            };
            let col_parts: Vec<String> = labels
                .iter()
                .zip(g.values)
                .enumerate()
                .filter(|(i, _)| Some(*i) != ri)
                .filter_map(|(_, (l, v))| v.as_ref().map(|v| format!("{l}={v}")))
                .collect();
            let col = if col_parts.is_empty() {
                metric.key().to_string()
            } else {
                col_parts.join(", ")
            };
            let ri_ = index_of(&mut rows, row);
            let ci = index_of(&mut cols, col);
            let xs: Vec<f64> = g
                .runs
                .iter()
                .filter_map(|r| num(&r.summary, metric.key()))
                .collect();
            if let Some((mean, std)) = mean_std(&xs) {
                entries.push((
                    ri_,
                    ci,
                    Cell {
                        mean,
                        std,
                        n: xs.len(),
                    },
                ));
            }
        }
        // Settings that vary together (each row filled in one column only)
        // would make a diagonal of empty cells: one row per setting instead.
        let diagonal = cols.len() > 1
            && (0..rows.len()).all(|r| entries.iter().filter(|e| e.0 == r).count() <= 1);
        if diagonal {
            let title = ri.map_or_else(|| "setting".to_string(), |i| labels[i].clone());
            let rows_joined: Vec<String> = entries
                .iter()
                .map(|(r, col, _)| format!("{}, {}", rows[*r], cols[*col]))
                .collect();
            return Table {
                row_title: format!("{title}, setting"),
                rows: rows_joined,
                cols: vec![metric.key().to_string()],
                cells: entries.into_iter().map(|e| vec![Some(e.2)]).collect(),
                metric,
            };
        }
        let mut cells = vec![vec![None; cols.len()]; rows.len()];
        for (r, col, cell) in entries {
            cells[r][col] = Some(cell);
        }
        Table {
            row_title: ri.map_or_else(|| "setting".into(), |i| labels[i].clone()),
            rows,
            cols,
            cells,
            metric,
        }
    }

    /// Whether `cells[r][c]` is the best of its column.
    pub fn is_best(&self, r: usize, col: usize) -> bool {
        let Some(me) = &self.cells[r][col] else {
            return false;
        };
        !self
            .cells
            .iter()
            .filter_map(|row| row[col].as_ref())
            .any(|o| self.metric.better(o.mean, me.mean))
    }

    /// `mean ± std` (just the mean for one seed), in the metric's unit.
    pub fn cell_text(&self, cell: &Cell, pm: &str) -> String {
        match cell.std {
            Some(s) => format!("{}{pm}{}", self.metric.show(cell.mean), self.metric.show(s)),
            None => self.metric.show(cell.mean),
        }
    }

    fn seeds_note(&self) -> String {
        let ns: std::collections::BTreeSet<usize> =
            self.cells.iter().flatten().flatten().map(|c| c.n).collect();
        let ns: Vec<String> = ns.iter().map(|n| n.to_string()).collect();
        format!(
            "mean ± sample std over seeds (n = {})",
            if ns.is_empty() {
                "0".into()
            } else {
                ns.join("/")
            }
        )
    }

    /// Markdown (best per column in bold).
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{}; {}.\n",
            first_upper(self.metric.caption()),
            self.seeds_note()
        );
        let esc = |t: &str| t.replace('|', "\\|");
        let _ = write!(s, "| {} |", esc(&self.row_title));
        for c in &self.cols {
            let _ = write!(s, " {} |", esc(c));
        }
        s.push('\n');
        s.push_str("|---|");
        for _ in &self.cols {
            s.push_str("---:|");
        }
        s.push('\n');
        for (r, row) in self.rows.iter().enumerate() {
            let _ = write!(s, "| {} |", esc(row));
            for col in 0..self.cols.len() {
                match &self.cells[r][col] {
                    Some(cell) => {
                        let t = self.cell_text(cell, " ± ");
                        if self.is_best(r, col) {
                            let _ = write!(s, " **{t}** |");
                        } else {
                            let _ = write!(s, " {t} |");
                        }
                    }
                    None => s.push_str(" — |"),
                }
            }
            s.push('\n');
        }
        s
    }

    /// LaTeX with booktabs (best per column in bold).
    pub fn to_latex(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "% {}; {}. Needs \\usepackage{{booktabs}}.",
            first_upper(self.metric.caption()),
            self.seeds_note()
        );
        let _ = writeln!(s, "\\begin{{tabular}}{{l{}}}", "c".repeat(self.cols.len()));
        s.push_str("\\toprule\n");
        let _ = write!(s, "{}", tex(&self.row_title));
        for c in &self.cols {
            let _ = write!(s, " & {}", tex(c));
        }
        s.push_str(" \\\\\n\\midrule\n");
        for (r, row) in self.rows.iter().enumerate() {
            let _ = write!(s, "{}", tex(row));
            for col in 0..self.cols.len() {
                match &self.cells[r][col] {
                    Some(cell) => {
                        let t = self.cell_text(cell, " \\pm ");
                        if self.is_best(r, col) {
                            let _ = write!(s, " & $\\mathbf{{{t}}}$");
                        } else {
                            let _ = write!(s, " & ${t}$");
                        }
                    }
                    None => s.push_str(" & --"),
                }
            }
            s.push_str(" \\\\\n");
        }
        s.push_str("\\bottomrule\n\\end{tabular}\n");
        s
    }
}

fn first_upper(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}

fn index_of(v: &mut Vec<String>, x: String) -> usize {
    match v.iter().position(|y| *y == x) {
        Some(i) => i,
        None => {
            v.push(x);
            v.len() - 1
        }
    }
}

/// Escapes LaTeX specials in text.
pub fn tex(s: &str) -> String {
    let mut out = String::new();
    for ch in s.chars() {
        match ch {
            '\\' => out.push_str("\\textbackslash{}"),
            '&' | '%' | '$' | '#' | '_' | '{' | '}' => {
                out.push('\\');
                out.push(ch);
            }
            '~' => out.push_str("\\textasciitilde{}"),
            '^' => out.push_str("\\textasciicircum{}"),
            c => out.push(c),
        }
    }
    out
}

/// Writes `results.csv`, `table.md`, `table.tex` and `index.html` into
/// `out`; returns their paths.
pub fn write_outputs(c: &Collection, out: &Path) -> Result<Vec<PathBuf>, SweepError> {
    std::fs::create_dir_all(out).map_err(io(out))?;
    let table = Table::build(c);
    let files = [
        ("results.csv", results_csv(c)),
        ("table.md", table.to_markdown()),
        ("table.tex", table.to_latex()),
        ("index.html", crate::page::render(c, &table, out)?),
    ];
    let mut paths = Vec::new();
    for (name, text) in files {
        let p = out.join(name);
        let tmp = out.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, text).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &p).map_err(io(&p))?;
        paths.push(p);
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_std() {
        let (m, s) = mean_std(&[1.0, 2.0, 3.0, 4.0]).unwrap();
        assert_eq!(m, 2.5);
        assert!((s.unwrap() - (5.0f64 / 3.0).sqrt()).abs() < 1e-15);
        assert_eq!(mean_std(&[0.7]), Some((0.7, None)));
        assert_eq!(mean_std(&[]), None);
    }

    #[test]
    fn tex_escapes() {
        assert_eq!(tex("a_b & 50%"), "a\\_b \\& 50\\%");
    }

    #[test]
    fn csv_quotes() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("x"), "x");
    }
}
