//! Hand-written SVG heatmaps: cell (i, j) is drawn at row i (top to bottom),
//! column j (left to right), coloured by [`crate::color::scale`] with a
//! colour bar.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::color::{needs_light_text, scale};
use crate::fmt::escape_html;
use crate::input::Matrix;

/// Matrices with more cells than this are drawn as one path per colour
/// (run-length encoded along rows) instead of one `<rect>` per cell.
const PER_CELL_LIMIT: usize = 2500;
const MISSING_FILL: &str = "#e5e7eb";
const MARK: &str = "#dc2626";
const LEFT: f64 = 54.0;
const TOP: f64 = 10.0;
const BOTTOM: f64 = 46.0;
const COLORBAR_SPACE: f64 = 84.0;

/// What to draw, and how.
pub(crate) struct Heatmap<'a> {
    pub matrix: &'a Matrix,
    /// Value mapped to the darkest colour (0 maps to white).
    pub vmax: f64,
    /// Cell size in pixels.
    pub cell_w: f64,
    pub cell_h: f64,
    /// Axis titles: columns (x, below) and rows (y, left).
    pub x_title: &'a str,
    pub y_title: &'a str,
    /// Nouns for tooltips, e.g. "recipient" / "source".
    pub row_name: &'a str,
    pub col_name: &'a str,
    /// Rows / columns to mark in red (e.g. malicious clients).
    pub mark_rows: &'a [usize],
    pub mark_cols: &'a [usize],
    /// Print values as integers rather than with two decimals.
    pub integer_values: bool,
    /// Print values inside cells (only if the cells are big enough).
    pub show_values: bool,
    pub colorbar: bool,
    /// Accessible description of the figure.
    pub label: &'a str,
}

/// Up to two decimals, no trailing zeros: SVG coordinates stay short.
fn c(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

/// Which indices get a tick label, given the cell size along that axis.
pub(crate) fn tick_indices(n: usize, cell: f64) -> Vec<usize> {
    if n <= 30 && cell >= 11.0 {
        return (0..n).collect();
    }
    const STEPS: [usize; 12] = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000];
    let step = STEPS
        .iter()
        .copied()
        .find(|&s| s as f64 * cell >= 26.0)
        .unwrap_or(n.max(1));
    (0..n).step_by(step).collect()
}

/// Normalised position of `v` on the scale: `v / vmax` clamped to [0, 1].
pub(crate) fn normalise(v: f64, vmax: f64) -> f64 {
    let vmax = if vmax.is_finite() && vmax > 0.0 {
        vmax
    } else {
        1.0
    };
    (v / vmax).clamp(0.0, 1.0)
}

fn value_text(v: f64, integer: bool) -> String {
    if integer {
        format!("{}", v.round())
    } else {
        format!("{v:.2}")
    }
}

fn bar_label(v: f64, integer: bool, vmax: f64) -> String {
    if integer {
        format!("{}", v.round())
    } else if vmax < 0.1 {
        format!("{v:.3}")
    } else {
        format!("{v:.2}")
    }
}

impl<'a> Heatmap<'a> {
    /// A collaboration graph W with square cells of `cell` pixels: row i is
    /// recipient i, column j source j, clients in `marked` (the malicious
    /// ones) flagged on both axes, values printed when `show_values`.
    pub fn collaboration_graph(
        matrix: &'a Matrix,
        vmax: f64,
        cell: f64,
        marked: &'a [usize],
        show_values: bool,
        label: &'a str,
    ) -> Self {
        Heatmap {
            matrix,
            vmax,
            cell_w: cell,
            cell_h: cell,
            x_title: "client j (source)",
            y_title: "client i (recipient)",
            row_name: "recipient",
            col_name: "source",
            mark_rows: marked,
            mark_cols: marked,
            integer_values: false,
            show_values,
            colorbar: true,
            label,
        }
    }

    /// The whole figure as an inline `<svg>` element.
    pub fn to_svg(&self) -> String {
        let m = self.matrix;
        let (cw, ch) = (self.cell_w, self.cell_h);
        let pw = cw * m.cols as f64;
        let ph = ch * m.rows as f64;
        let (x0, y0) = (LEFT, TOP);
        let width = LEFT + pw + if self.colorbar { COLORBAR_SPACE } else { 16.0 };
        let height = TOP + ph + BOTTOM;
        let mut s = String::with_capacity(4096);
        let _ = write!(
            s,
            r#"<svg class="heatmap" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{label}" font-size="11">"#,
            w = c(width),
            h = c(height),
            label = escape_html(self.label),
        );
        // White (= value 0) background; cells of value 0 need no drawing
        // in the compact mode.
        let _ = write!(
            s,
            r#"<rect x="{}" y="{}" width="{}" height="{}" fill="{}"/>"#,
            c(x0),
            c(y0),
            c(pw),
            c(ph),
            scale(0.0).hex()
        );
        if m.rows * m.cols <= PER_CELL_LIMIT {
            self.cells_per_rect(&mut s, x0, y0);
        } else {
            self.cells_compact(&mut s, x0, y0);
        }
        // Frame.
        let _ = write!(
            s,
            r##"<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#9ca3af" stroke-width="1"/>"##,
            c(x0),
            c(y0),
            c(pw),
            c(ph)
        );
        self.marks(&mut s, x0, y0, pw, ph);
        self.axes(&mut s, x0, y0, pw, ph);
        if self.colorbar {
            self.colour_bar(&mut s, x0 + pw + 18.0, y0, ph);
        }
        s.push_str("</svg>");
        s
    }

    fn cells_per_rect(&self, s: &mut String, x0: f64, y0: f64) {
        let m = self.matrix;
        let (cw, ch) = (self.cell_w, self.cell_h);
        let gap = if cw >= 10.0 && ch >= 10.0 {
            r##" stroke="#ffffff" stroke-width="1""##
        } else {
            ""
        };
        let show = self.show_values && cw >= 28.0 && ch >= 16.0;
        let fs = (cw * 0.3).min(ch * 0.55).min(13.0);
        for i in 0..m.rows {
            for j in 0..m.cols {
                let v = m.get(i, j);
                let (fill, shown) = if v.is_finite() {
                    (
                        scale(normalise(v, self.vmax)).hex(),
                        value_text(v, self.integer_values),
                    )
                } else {
                    (MISSING_FILL.to_string(), "n/a".to_string())
                };
                let x = x0 + j as f64 * cw;
                let y = y0 + i as f64 * ch;
                let _ = write!(
                    s,
                    r#"<rect data-r="{i}" data-c="{j}" x="{}" y="{}" width="{}" height="{}" fill="{fill}"{gap}><title>{} {i}, {} {j}: {shown}</title></rect>"#,
                    c(x),
                    c(y),
                    c(cw),
                    c(ch),
                    escape_html(self.row_name),
                    escape_html(self.col_name),
                );
                if show && v.is_finite() {
                    let colour = if needs_light_text(normalise(v, self.vmax)) {
                        "#ffffff"
                    } else {
                        "#111827"
                    };
                    let _ = write!(
                        s,
                        r#"<text x="{}" y="{}" text-anchor="middle" dominant-baseline="central" font-size="{}" fill="{colour}" pointer-events="none">{shown}</text>"#,
                        c(x + cw / 2.0),
                        c(y + ch / 2.0),
                        c(fs),
                    );
                }
            }
        }
    }

    /// One `<path>` per 8-bit colour level, in cell units; runs of equal
    /// level along a row become one rectangle; level 0 (white) is skipped.
    fn cells_compact(&self, s: &mut String, x0: f64, y0: f64) {
        let m = self.matrix;
        const MISSING: u16 = 256;
        let mut paths: BTreeMap<u16, String> = BTreeMap::new();
        let level = |v: f64| -> u16 {
            if v.is_finite() {
                (normalise(v, self.vmax) * 255.0).round() as u16
            } else {
                MISSING
            }
        };
        for i in 0..m.rows {
            let mut j = 0;
            while j < m.cols {
                let l = level(m.get(i, j));
                let mut end = j + 1;
                while end < m.cols && level(m.get(i, end)) == l {
                    end += 1;
                }
                if l != 0 {
                    let len = end - j;
                    let _ = write!(paths.entry(l).or_default(), "M{j} {i}h{len}v1h-{len}z");
                }
                j = end;
            }
        }
        let _ = write!(
            s,
            r#"<g transform="translate({} {}) scale({} {})" shape-rendering="crispEdges">"#,
            c(x0),
            c(y0),
            self.cell_w,
            self.cell_h
        );
        for (l, d) in paths {
            let fill = if l == MISSING {
                MISSING_FILL.to_string()
            } else {
                scale(f64::from(l) / 255.0).hex()
            };
            let _ = write!(s, r#"<path fill="{fill}" d="{d}"/>"#);
        }
        s.push_str("</g>");
    }

    fn marks(&self, s: &mut String, x0: f64, y0: f64, pw: f64, ph: f64) {
        let m = self.matrix;
        let (cw, ch) = (self.cell_w, self.cell_h);
        let outline = m.rows <= 30 && m.cols <= 30;
        for &i in self.mark_rows.iter().filter(|&&i| i < m.rows) {
            let y = y0 + i as f64 * ch;
            let _ = write!(
                s,
                r#"<rect class="mark" x="{}" y="{}" width="3" height="{}" fill="{MARK}"/>"#,
                c(x0 - 5.0),
                c(y),
                c(ch.max(1.0)),
            );
            if outline {
                let _ = write!(
                    s,
                    r#"<rect class="mark" x="{}" y="{}" width="{}" height="{}" fill="none" stroke="{MARK}" stroke-width="2"/>"#,
                    c(x0),
                    c(y),
                    c(pw),
                    c(ch)
                );
            }
        }
        for &j in self.mark_cols.iter().filter(|&&j| j < m.cols) {
            let x = x0 + j as f64 * cw;
            let _ = write!(
                s,
                r#"<rect class="mark" x="{}" y="{}" width="{}" height="3" fill="{MARK}"/>"#,
                c(x),
                c(y0 + ph + 2.0),
                c(cw.max(1.0)),
            );
            if outline {
                let _ = write!(
                    s,
                    r#"<rect class="mark" x="{}" y="{}" width="{}" height="{}" fill="none" stroke="{MARK}" stroke-width="2" stroke-dasharray="4 3"/>"#,
                    c(x),
                    c(y0),
                    c(cw),
                    c(ph)
                );
            }
        }
    }

    fn axes(&self, s: &mut String, x0: f64, y0: f64, pw: f64, ph: f64) {
        let m = self.matrix;
        let (cw, ch) = (self.cell_w, self.cell_h);
        let label_attrs = |marked: bool| {
            if marked {
                format!(r#" class="tick malicious" fill="{MARK}" font-weight="bold""#)
            } else {
                r##" class="tick" fill="#4b5563""##.to_string()
            }
        };
        for j in tick_indices(m.cols, cw) {
            let _ = write!(
                s,
                r#"<text x="{}" y="{}" text-anchor="middle"{}>{j}</text>"#,
                c(x0 + (j as f64 + 0.5) * cw),
                c(y0 + ph + 16.0),
                label_attrs(self.mark_cols.contains(&j)),
            );
        }
        for i in tick_indices(m.rows, ch) {
            let _ = write!(
                s,
                r#"<text x="{}" y="{}" text-anchor="end" dominant-baseline="central"{}>{i}</text>"#,
                c(x0 - 8.0),
                c(y0 + (i as f64 + 0.5) * ch),
                label_attrs(self.mark_rows.contains(&i)),
            );
        }
        let _ = write!(
            s,
            r##"<text x="{}" y="{}" text-anchor="middle" font-size="12" fill="#374151">{}</text>"##,
            c(x0 + pw / 2.0),
            c(y0 + ph + 38.0),
            escape_html(self.x_title)
        );
        let _ = write!(
            s,
            r##"<text transform="translate(14 {}) rotate(-90)" text-anchor="middle" font-size="12" fill="#374151">{}</text>"##,
            c(y0 + ph / 2.0),
            escape_html(self.y_title)
        );
    }

    fn colour_bar(&self, s: &mut String, x: f64, y0: f64, ph: f64) {
        const STEPS: usize = 48;
        let h = ph / STEPS as f64;
        let _ = write!(s, r#"<g class="colorbar" shape-rendering="crispEdges">"#);
        for k in 0..STEPS {
            // Top of the bar is the maximum.
            let t = 1.0 - (k as f64 + 0.5) / STEPS as f64;
            let _ = write!(
                s,
                r#"<rect x="{}" y="{}" width="14" height="{}" fill="{}"/>"#,
                c(x),
                c(y0 + k as f64 * h),
                c(h + 0.5),
                scale(t).hex()
            );
        }
        s.push_str("</g>");
        let _ = write!(
            s,
            r##"<rect x="{}" y="{}" width="14" height="{}" fill="none" stroke="#9ca3af"/>"##,
            c(x),
            c(y0),
            c(ph)
        );
        let vmax = if self.vmax.is_finite() && self.vmax > 0.0 {
            self.vmax
        } else {
            1.0
        };
        for (frac, v) in [(0.0, vmax), (0.5, vmax / 2.0), (1.0, 0.0)] {
            let y = y0 + frac * ph;
            let _ = write!(
                s,
                r##"<line x1="{}" x2="{}" y1="{y}" y2="{y}" stroke="#6b7280"/><text x="{}" y="{y}" dominant-baseline="central" fill="#4b5563">{}</text>"##,
                c(x + 14.0),
                c(x + 18.0),
                c(x + 21.0),
                bar_label(v, self.integer_values, vmax),
                y = c(y),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(tag: &str, name: &str) -> String {
        let key = format!(" {name}=\"");
        let start = tag.find(&key).unwrap() + key.len();
        let end = start + tag[start..].find('"').unwrap();
        tag[start..end].to_string()
    }

    fn spec(m: &Matrix) -> Heatmap<'_> {
        Heatmap {
            matrix: m,
            vmax: 1.0,
            cell_w: 40.0,
            cell_h: 30.0,
            x_title: "client j (source)",
            y_title: "client i (recipient)",
            row_name: "recipient",
            col_name: "source",
            mark_rows: &[1],
            mark_cols: &[1],
            integer_values: false,
            show_values: true,
            colorbar: true,
            label: "test",
        }
    }

    #[test]
    fn cell_ij_is_at_row_i_column_j_with_its_colour() {
        // Non-symmetric, so a transposition would be caught.
        let m = Matrix {
            rows: 2,
            cols: 3,
            data: vec![0.0, 0.25, 1.0, 0.5, 0.75, 0.1],
        };
        let svg = spec(&m).to_svg();
        let mut seen = 0;
        for tag in svg.split('<').filter(|t| t.starts_with("rect data-r")) {
            let i: usize = attr(tag, "data-r").parse().unwrap();
            let j: usize = attr(tag, "data-c").parse().unwrap();
            let x: f64 = attr(tag, "x").parse().unwrap();
            let y: f64 = attr(tag, "y").parse().unwrap();
            assert_eq!(x, LEFT + j as f64 * 40.0, "column of ({i},{j})");
            assert_eq!(y, TOP + i as f64 * 30.0, "row of ({i},{j})");
            assert_eq!(
                attr(tag, "fill"),
                scale(m.get(i, j)).hex(),
                "fill of ({i},{j})"
            );
            seen += 1;
        }
        assert_eq!(seen, 6);
        // Values printed in cells, malicious ticks marked.
        assert!(svg.contains(">0.75</text>"));
        assert!(svg.contains(r#"class="tick malicious""#));
        assert!(svg.contains("client i (recipient)"));
    }

    #[test]
    fn vmax_rescales_colours() {
        let m = Matrix {
            rows: 1,
            cols: 2,
            data: vec![0.5, 0.25],
        };
        let mut h = spec(&m);
        h.vmax = 0.5;
        let svg = h.to_svg();
        assert!(svg.contains(&format!(r#"fill="{}""#, scale(1.0).hex())));
        assert!(svg.contains(&format!(r#"fill="{}""#, scale(0.5).hex())));
    }

    #[test]
    fn large_matrices_are_compact_and_correct() {
        let n = 120;
        let mut data = vec![0.0; n * n];
        for i in 0..n {
            data[i * n + i] = 1.0; // identity: one dark run per row
        }
        data[5 * n + 7] = f64::NAN;
        let m = Matrix {
            rows: n,
            cols: n,
            data,
        };
        let mut h = spec(&m);
        h.cell_w = 4.0;
        h.cell_h = 4.0;
        let svg = h.to_svg();
        assert!(!svg.contains("data-r="));
        assert!(svg.len() < 40_000, "svg is {} bytes", svg.len());
        let dark = format!(r#"<path fill="{}" d=""#, scale(1.0).hex());
        let start = svg.find(&dark).unwrap() + dark.len();
        let d = &svg[start..start + svg[start..].find('"').unwrap()];
        // Cell (i, i) → "M{col} {row}…", for every i.
        for i in 0..n {
            assert!(d.contains(&format!("M{i} {i}h1v1h-1z")));
        }
        assert_eq!(d.matches('M').count(), n);
        assert!(svg.contains(&format!(
            r#"<path fill="{MISSING_FILL}" d="M7 5h1v1h-1z"/>"#
        )));
        // Sparse ticks only.
        assert!(svg.matches(r#"class="tick"#).count() < 30);
    }

    #[test]
    fn ticks() {
        assert_eq!(tick_indices(4, 100.0), vec![0, 1, 2, 3]);
        let t = tick_indices(200, 2.5);
        assert_eq!(t[1], 20);
        assert!(t.len() <= 10);
    }
}
