//! fedweave-report: turns a run directory into one self-contained HTML page.
//!
//! The page (`report.html`) needs no network: styles are inline, charts are
//! inline SVG (line and bar charts drawn with `plotters`, heatmaps written
//! by hand), and a few lines of inline JavaScript drive the round slider of
//! the collaboration-graph heatmap.
//!
//! ```no_run
//! let page = fedweave_report::write_report(std::path::Path::new("runs/demo"))?;
//! println!("open {}", page.display());
//! # Ok::<(), fedweave_report::ReportError>(())
//! ```
#![warn(missing_docs)]

mod charts;
pub mod color;
mod error;
pub mod fmt;
mod heatmap;
mod input;
mod page;

use std::fs;
use std::path::{Path, PathBuf};

pub use error::ReportError;
pub use input::RunFiles;

/// Name of the page written into the run directory.
pub const REPORT_FILE: &str = "report.html";

/// Renders the report page for an already-read run directory.
///
/// # Errors
/// Content of the wrong shape (e.g. a graph that is not a square matrix),
/// naming the file it came from; or a chart the plotting library failed to
/// draw.
pub fn render_report(inputs: &RunFiles) -> Result<String, ReportError> {
    page::render(inputs)
}

/// A collaboration graph (a square JSON matrix, e.g. `summary.json`'s
/// `final_graph`) as a standalone inline `<svg>` heatmap about `width`
/// pixels wide, in the report's colour scale. Rows are recipients, columns
/// sources; `marked` clients (e.g. malicious ones) are outlined in red.
///
/// # Errors
/// A value that is not a non-empty square matrix of numbers (or `null`).
pub fn graph_heatmap_svg(
    graph: &serde_json::Value,
    marked: &[usize],
    width: f64,
    label: &str,
) -> Result<String, ReportError> {
    let m = input::Matrix::parse_square(graph).map_err(|e| ReportError::invalid("graph", e))?;
    let vmax = m.max_finite().unwrap_or(1.0);
    let cell = (width / m.rows as f64).clamp(2.0, 36.0);
    Ok(heatmap::Heatmap::collaboration_graph(&m, vmax, cell, marked, m.rows <= 8, label).to_svg())
}

/// Reads `run_dir` and writes `run_dir/report.html`; returns its path.
///
/// # Errors
/// See [`RunFiles::read`] and [`render_report`]; also failure to write the
/// page.
pub fn write_report(run_dir: &Path) -> Result<PathBuf, ReportError> {
    let files = RunFiles::read(run_dir)?;
    let html = render_report(&files)?;
    let path = run_dir.join(REPORT_FILE);
    let tmp = run_dir.join(format!(".{REPORT_FILE}.tmp"));
    fs::write(&tmp, html).map_err(|source| ReportError::Io {
        path: tmp.clone(),
        source,
    })?;
    fs::rename(&tmp, &path).map_err(|source| ReportError::Io {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}
