//! Reading a run directory, and typed views of the JSON it holds.

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use fedweave_records::{RoundRecord, Summary};
use serde_json::Value;

use crate::ReportError;

/// File names inside a run directory (see the output-directory contract).
pub(crate) const CONFIG_FILE: &str = "config.toml";
pub(crate) const SUMMARY_FILE: &str = "summary.json";
pub(crate) const ROUNDS_FILE: &str = "rounds.jsonl";
pub(crate) const PARTITION_FILE: &str = "partition.json";

/// The contents of a run directory, as the engine wrote them: the summary
/// and round records through their shared schema (`fedweave-records`).
#[derive(Debug, Clone, PartialEq)]
pub struct RunFiles {
    /// `config.toml`, verbatim.
    pub config_toml: String,
    /// `summary.json`.
    pub summary: Summary,
    /// `rounds.jsonl`, one record per non-empty line, in file order.
    pub rounds: Vec<RoundRecord>,
    /// `partition.json`, when the run wrote one.
    pub partition: Option<Value>,
    /// `Some(rounds done)` for a run without `summary.json` (interrupted or
    /// still running): [`RunFiles::summary`] is then drawn up from
    /// `config.toml` and `rounds.jsonl` (what ran, the last and best
    /// rounds, the last graph, bytes and time so far), without the
    /// best-validation results only a finished run has.
    pub unfinished: Option<usize>,
}

impl RunFiles {
    /// Reads `summary.json`, `config.toml`, `rounds.jsonl` and (if present)
    /// `partition.json` from `run_dir`. A run without `summary.json` (one
    /// interrupted or still running) reads as [`RunFiles::unfinished`].
    ///
    /// # Errors
    /// A missing or unreadable required file, or JSON that is invalid or of
    /// the wrong shape (with the line number for `rounds.jsonl`) — each
    /// naming the file.
    pub fn read(run_dir: &Path) -> Result<Self, ReportError> {
        let summary_path = run_dir.join(SUMMARY_FILE);
        let summary: Option<Summary> = match fs::read_to_string(&summary_path) {
            Ok(text) => Some(
                serde_json::from_str(&text).map_err(|source| ReportError::Json {
                    path: summary_path.clone(),
                    source,
                })?,
            ),
            Err(e) if e.kind() == ErrorKind::NotFound && run_dir.join(ROUNDS_FILE).is_file() => {
                None
            }
            Err(source) => {
                return Err(ReportError::Io {
                    path: summary_path,
                    source,
                });
            }
        };

        let config_toml = read_text(&run_dir.join(CONFIG_FILE))?;

        let rounds_path = run_dir.join(ROUNDS_FILE);
        let text = read_text(&rounds_path)?;
        let mut rounds = Vec::new();
        for (idx, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let r: RoundRecord =
                serde_json::from_str(line).map_err(|source| ReportError::JsonLine {
                    path: rounds_path.clone(),
                    line: idx + 1,
                    source,
                })?;
            rounds.push(r);
        }

        let partition_path = run_dir.join(PARTITION_FILE);
        let partition = match fs::read_to_string(&partition_path) {
            Ok(t) => Some(
                serde_json::from_str(&t).map_err(|source| ReportError::Json {
                    path: partition_path.clone(),
                    source,
                })?,
            ),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(source) => {
                return Err(ReportError::Io {
                    path: partition_path,
                    source,
                });
            }
        };

        let unfinished = summary.is_none().then_some(rounds.len());
        let summary = summary.unwrap_or_else(|| partial_summary(&config_toml, &rounds));
        Ok(RunFiles {
            config_toml,
            summary,
            rounds,
            partition,
            unfinished,
        })
    }
}

/// What can be said of an unfinished run from its configuration and the
/// rounds it has done.
fn partial_summary(config_toml: &str, rounds: &[RoundRecord]) -> Summary {
    let cfg: toml::Table = config_toml.parse().unwrap_or_default();
    let text = |section: &str, key: &str| {
        cfg.get(section)
            .and_then(|s| s.get(key))
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    let int = |key: &str| cfg.get(key).and_then(toml::Value::as_integer).unwrap_or(0);
    let last = rounds.last();
    let max = rounds
        .iter()
        .filter_map(|r| r.mean_test_acc)
        .filter(|x| x.is_finite())
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
    Summary {
        algorithm: text("algorithm", "name"),
        dataset: text("data", "dataset"),
        partition: text("partition", "kind"),
        model: text("model", "kind"),
        attack: text("attack", "kind"),
        clients: usize::try_from(int("clients")).unwrap_or(0),
        rounds: usize::try_from(int("rounds")).unwrap_or(0),
        seed: u64::try_from(int("seed")).unwrap_or(0),
        last_round_mean_test_acc: last.and_then(|r| r.mean_test_acc),
        max_round_mean_test_acc: max,
        last_round_mean_test_mae: last.and_then(|r| r.mean_test_mae),
        final_graph: last.map(|r| r.graph.clone()).unwrap_or_default(),
        bytes_up: rounds.iter().map(|r| r.bytes_up).sum(),
        bytes_down: rounds.iter().map(|r| r.bytes_down).sum(),
        wall_seconds: rounds.iter().map(|r| r.seconds).sum(),
        ..Summary::default()
    }
}

fn read_text(path: &Path) -> Result<String, ReportError> {
    fs::read_to_string(path).map_err(|source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// A dense row-major matrix; `NaN` marks a missing (`null`) entry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f64>,
}

impl Matrix {
    pub fn get(&self, i: usize, j: usize) -> f64 {
        self.data[i * self.cols + j]
    }

    /// Largest finite entry, if any.
    pub fn max_finite(&self) -> Option<f64> {
        self.data
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .fold(None, |m, x| Some(m.map_or(x, |m: f64| m.max(x))))
    }

    /// Parses an array of equally long arrays of numbers (or `null`).
    pub fn parse(v: &Value) -> Result<Matrix, String> {
        let rows = v.as_array().ok_or("expected an array of rows")?;
        let cols = match rows.first() {
            Some(r) => r.as_array().ok_or("row 0 is not an array")?.len(),
            None => 0,
        };
        let mut data = Vec::with_capacity(rows.len() * cols);
        for (i, row) in rows.iter().enumerate() {
            let row = row
                .as_array()
                .ok_or_else(|| format!("row {i} is not an array"))?;
            if row.len() != cols {
                return Err(format!(
                    "row {i} has {} entries, expected {cols}",
                    row.len()
                ));
            }
            for (j, x) in row.iter().enumerate() {
                let val = match x {
                    Value::Null => f64::NAN,
                    Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
                    _ => return Err(format!("entry ({i}, {j}) is not a number")),
                };
                data.push(val);
            }
        }
        Ok(Matrix {
            rows: rows.len(),
            cols,
            data,
        })
    }

    /// A matrix from rows of a record (NaN stays NaN); ragged rows are an
    /// error.
    pub fn from_rows(rows: &[Vec<f64>]) -> Result<Matrix, String> {
        let cols = rows.first().map_or(0, Vec::len);
        let mut data = Vec::with_capacity(rows.len() * cols);
        for (i, row) in rows.iter().enumerate() {
            if row.len() != cols {
                return Err(format!(
                    "row {i} has {} entries, expected {cols}",
                    row.len()
                ));
            }
            data.extend_from_slice(row);
        }
        Ok(Matrix {
            rows: rows.len(),
            cols,
            data,
        })
    }

    /// Like [`Matrix::from_rows`], but also requires a non-empty square
    /// matrix.
    pub fn square(rows: &[Vec<f64>]) -> Result<Matrix, String> {
        Matrix::from_rows(rows)?.require_square()
    }

    /// Like [`Matrix::parse`], but also requires a non-empty square matrix.
    pub fn parse_square(v: &Value) -> Result<Matrix, String> {
        Matrix::parse(v)?.require_square()
    }

    /// `Err` unless the matrix is square and not empty.
    fn require_square(self) -> Result<Matrix, String> {
        let m = self;
        if m.rows == 0 {
            return Err("empty matrix".to_string());
        }
        if m.rows != m.cols {
            return Err(format!(
                "expected a square matrix, got {}×{}",
                m.rows, m.cols
            ));
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_matrices() {
        let m = Matrix::parse(&json!([[1, 2.5], [null, 0]])).unwrap();
        assert_eq!((m.rows, m.cols), (2, 2));
        assert_eq!(m.get(0, 1), 2.5);
        assert!(m.get(1, 0).is_nan());
        assert_eq!(m.max_finite(), Some(2.5));
        assert!(
            Matrix::parse(&json!([[1, 2], [3]]))
                .unwrap_err()
                .contains("row 1")
        );
        assert!(Matrix::parse(&json!([[1, "x"]])).is_err());
        assert!(Matrix::parse(&json!(3)).is_err());
        assert!(Matrix::parse_square(&json!([[1, 2]])).is_err());
        assert!(Matrix::parse_square(&json!([])).is_err());
    }
}
