//! `index.html`: one self-contained comparison page (inline SVG, no
//! scripts, works offline).

use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};

use fedweave_report::fmt::{escape_html as esc, human_bytes, human_seconds};
use serde_json::Value;

use crate::error::SweepError;
use crate::results::{Collection, Group, Metric, Table, mean_std, num};

const PALETTE: [&str; 10] = [
    "#2563eb", "#ea580c", "#059669", "#7c3aed", "#dc2626", "#0891b2", "#ca8a04", "#db2777",
    "#4b5563", "#65a30d",
];

fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// Up to two decimals, no trailing zeros.
fn c(v: f64) -> String {
    let s = format!("{v:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.into() }
}

/// About five round tick values covering `[lo, hi]`.
/// Longest row label drawn in full beside a row chart.
const ROW_LABEL_CHARS: usize = 36;

fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(1e-12);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 6.0)
        .unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 {
        out.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    out
}

fn tick_text(v: f64, step: f64) -> String {
    let d = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    format!("{v:.d$}")
}

/// A plot area inside an SVG of `w × h`.
struct Frame {
    w: f64,
    h: f64,
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
    x: (f64, f64),
    y: (f64, f64),
    log_x: bool,
}

impl Frame {
    fn px(&self, x: f64) -> f64 {
        let (lo, hi, x) = if self.log_x {
            (self.x.0.log10(), self.x.1.log10(), x.max(1e-300).log10())
        } else {
            (self.x.0, self.x.1, x)
        };
        self.left + (x - lo) / (hi - lo).max(1e-12) * (self.w - self.left - self.right)
    }
    fn py(&self, y: f64) -> f64 {
        self.h
            - self.bottom
            - (y - self.y.0) / (self.y.1 - self.y.0).max(1e-12) * (self.h - self.top - self.bottom)
    }
    fn open(&self, s: &mut String, label: &str) {
        let _ = write!(
            s,
            r#"<svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{l}" font-size="13">"#,
            w = c(self.w),
            h = c(self.h),
            l = esc(label)
        );
    }
    /// Grid lines, tick labels and axis titles.
    fn axes(&self, s: &mut String, x_title: &str, y_title: &str, x_fmt: &dyn Fn(f64) -> String) {
        let yt = ticks(self.y.0, self.y.1);
        let ystep = if yt.len() > 1 { yt[1] - yt[0] } else { 1.0 };
        for v in &yt {
            let y = self.py(*v);
            let _ = write!(
                s,
                r##"<line x1="{}" x2="{}" y1="{y}" y2="{y}" stroke="#e5e7eb"/><text x="{}" y="{y}" text-anchor="end" dominant-baseline="central" fill="#374151">{}</text>"##,
                c(self.left),
                c(self.w - self.right),
                c(self.left - 6.0),
                tick_text(*v, ystep),
                y = c(y)
            );
        }
        let xt: Vec<f64> = if self.log_x {
            let (a, b) = (
                self.x.0.log10().floor() as i32,
                self.x.1.log10().ceil() as i32,
            );
            (a..=b)
                .map(|e| 10f64.powi(e))
                .filter(|v| *v >= self.x.0 * 0.999 && *v <= self.x.1 * 1.001)
                .collect()
        } else {
            ticks(self.x.0, self.x.1)
        };
        let yb = self.h - self.bottom;
        for v in &xt {
            // An empty label drops the tick (e.g. round 1.5).
            let label = x_fmt(*v);
            if label.is_empty() {
                continue;
            }
            let x = self.px(*v);
            let _ = write!(
                s,
                r##"<line x1="{x}" x2="{x}" y1="{}" y2="{}" stroke="#f3f4f6"/><text x="{x}" y="{}" text-anchor="middle" fill="#374151">{}</text>"##,
                c(self.top),
                c(yb),
                c(yb + 18.0),
                esc(&label),
                x = c(x)
            );
        }
        let _ = write!(
            s,
            r##"<line x1="{l}" x2="{r}" y1="{yb}" y2="{yb}" stroke="#9ca3af"/><line x1="{l}" x2="{l}" y1="{t}" y2="{yb}" stroke="#9ca3af"/><text x="{cx}" y="{}" text-anchor="middle" fill="#374151">{}</text><text transform="translate(16 {cy}) rotate(-90)" text-anchor="middle" fill="#374151">{}</text>"##,
            c(self.h - 6.0),
            esc(x_title),
            esc(y_title),
            l = c(self.left),
            r = c(self.w - self.right),
            t = c(self.top),
            yb = c(yb),
            cx = c((self.left + self.w - self.right) / 2.0),
            cy = c((self.top + yb) / 2.0),
        );
    }
}

fn padded(lo: f64, hi: f64, zero: bool) -> (f64, f64) {
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    let span = (hi - lo).max(hi.abs() * 0.05).max(1e-9);
    // A range narrower than `span` (equal values) widens around its middle,
    // so its ticks are far enough apart to get distinct labels.
    let widen = (span - (hi - lo)) / 2.0;
    let lo2 = if zero && lo >= 0.0 {
        0.0
    } else {
        lo - widen - 0.08 * span
    };
    (lo2, hi + widen + 0.08 * span)
}

/// The metric in its display unit (accuracy in %).
fn unit(metric: Metric, v: f64) -> f64 {
    match metric {
        Metric::Accuracy => 100.0 * v,
        Metric::Mae => v,
    }
}

fn legend(labels: &[String]) -> String {
    let mut s = String::from(r#"<div class="legend">"#);
    for (i, l) in labels.iter().enumerate() {
        let _ = write!(
            s,
            r#"<span><i style="background:{}"></i>{}</span>"#,
            color(i),
            esc(l)
        );
    }
    s.push_str("</div>");
    s
}

/// Mean ± std across seeds of each round's metric.
fn curve_band(g: &Group<'_>, metric: Metric) -> Vec<(f64, f64, f64)> {
    let max_round = g
        .runs
        .iter()
        .flat_map(|r| r.curve.iter().map(|p| p.0))
        .max()
        .unwrap_or(0);
    (1..=max_round)
        .filter_map(|round| {
            let xs: Vec<f64> = g
                .runs
                .iter()
                .filter_map(|r| r.curve.iter().find(|p| p.0 == round).and_then(|p| p.1))
                .map(|v| unit(metric, v))
                .collect();
            mean_std(&xs).map(|(m, s)| (round as f64, m, s.unwrap_or(0.0)))
        })
        .collect()
}

fn curves_svg(groups: &[Group<'_>], metric: Metric) -> String {
    let bands: Vec<Vec<(f64, f64, f64)>> = groups.iter().map(|g| curve_band(g, metric)).collect();
    let all = bands.iter().flatten();
    let (mut lo, mut hi, mut xmax) = (f64::INFINITY, f64::NEG_INFINITY, 1.0f64);
    for &(x, m, s) in all {
        lo = lo.min(m - s);
        hi = hi.max(m + s);
        xmax = xmax.max(x);
    }
    let (ylo, mut yhi) = padded(lo, hi, false);
    if metric == Metric::Accuracy {
        yhi = yhi.min(100.0);
    }
    let f = Frame {
        w: 900.0,
        h: 380.0,
        left: 64.0,
        right: 20.0,
        top: 12.0,
        bottom: 46.0,
        x: (1.0, xmax.max(2.0)),
        y: (
            ylo.max(if metric == Metric::Accuracy {
                0.0
            } else {
                f64::MIN
            }),
            yhi,
        ),
        log_x: false,
    };
    let mut s = String::new();
    f.open(&mut s, "mean test metric per round, mean ± std over seeds");
    let y_title = match metric {
        Metric::Accuracy => "mean test accuracy (%)",
        Metric::Mae => "mean test MAE",
    };
    f.axes(&mut s, "round", y_title, &|v| {
        if (v - v.round()).abs() < 1e-9 {
            format!("{v:.0}")
        } else {
            String::new()
        }
    });
    for (i, b) in bands.iter().enumerate() {
        if b.is_empty() {
            continue;
        }
        let mut pts: Vec<String> = b
            .iter()
            .map(|&(x, m, sd)| format!("{},{}", c(f.px(x)), c(f.py(m + sd))))
            .collect();
        pts.extend(
            b.iter()
                .rev()
                .map(|&(x, m, sd)| format!("{},{}", c(f.px(x)), c(f.py(m - sd)))),
        );
        let _ = write!(
            s,
            r#"<polygon points="{}" fill="{}" fill-opacity="0.14" stroke="none"/>"#,
            pts.join(" "),
            color(i)
        );
    }
    for (i, b) in bands.iter().enumerate() {
        let line: Vec<String> = b
            .iter()
            .map(|&(x, m, _)| format!("{},{}", c(f.px(x)), c(f.py(m))))
            .collect();
        let _ = write!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>"#,
            line.join(" "),
            color(i)
        );
        if b.len() <= 60 {
            for &(x, m, sd) in b {
                let _ = write!(
                    s,
                    r#"<circle cx="{}" cy="{}" r="3" fill="{}"><title>round {x}: {m:.3} ± {sd:.3}</title></circle>"#,
                    c(f.px(x)),
                    c(f.py(m)),
                    color(i)
                );
            }
        }
    }
    s.push_str("</svg>");
    s
}

/// Linear-interpolated quantile of sorted data.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let i = pos.floor() as usize;
    let f = pos - i as f64;
    if i + 1 < sorted.len() {
        sorted[i] + f * (sorted[i + 1] - sorted[i])
    } else {
        sorted[i]
    }
}

/// Horizontal rows, one per setting: either box plots (`boxes`) or a bar
/// with an error bar (`bars`: mean, std).
enum RowData {
    Box(Vec<f64>),
    Bar(f64, f64),
}

fn rows_svg(labels: &[String], rows: &[RowData], x_title: &str, zero: bool, aria: &str) -> String {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for r in rows {
        match r {
            RowData::Box(v) => {
                for x in v {
                    lo = lo.min(*x);
                    hi = hi.max(*x);
                }
            }
            RowData::Bar(m, s) => {
                // Whiskers are clipped at 0 when the bars start there.
                lo = lo.min(if zero { *m } else { m - s }).min(0.0);
                hi = hi.max(m + s);
            }
        }
    }
    let (xlo, xhi) = padded(lo, hi, zero);
    let clip = |v: f64| v.clamp(xlo, xhi);
    let row_h = 30.0;
    let f = Frame {
        w: 900.0,
        h: 12.0 + row_h * rows.len() as f64 + 46.0,
        left: 300.0,
        right: 24.0,
        top: 12.0,
        bottom: 46.0,
        x: (xlo, xhi),
        y: (0.0, rows.len() as f64),
        log_x: false,
    };
    let mut s = String::new();
    f.open(&mut s, aria);
    // Vertical grid via axes on x only: draw x ticks by hand.
    let xt = ticks(xlo, xhi);
    let step = if xt.len() > 1 { xt[1] - xt[0] } else { 1.0 };
    let yb = f.h - f.bottom;
    for v in &xt {
        let x = f.px(*v);
        let _ = write!(
            s,
            r##"<line x1="{x}" x2="{x}" y1="{}" y2="{}" stroke="#e5e7eb"/><text x="{x}" y="{}" text-anchor="middle" fill="#374151">{}</text>"##,
            c(f.top),
            c(yb),
            c(yb + 18.0),
            tick_text(*v, step),
            x = c(x)
        );
    }
    let _ = write!(
        s,
        r##"<line x1="{l}" x2="{r}" y1="{yb}" y2="{yb}" stroke="#9ca3af"/><text x="{cx}" y="{}" text-anchor="middle" fill="#374151">{}</text>"##,
        c(f.h - 6.0),
        esc(x_title),
        l = c(f.left),
        r = c(f.w - f.right),
        yb = c(yb),
        cx = c((f.left + f.w - f.right) / 2.0)
    );
    for (i, (label, r)) in labels.iter().zip(rows).enumerate() {
        let cy = f.top + row_h * (i as f64 + 0.5);
        let col = color(i);
        // 13 px text in the 300 px margin: about 36 characters fit (the
        // full label is the tooltip).
        let short: String = if label.chars().count() > ROW_LABEL_CHARS {
            label.chars().take(ROW_LABEL_CHARS - 1).collect::<String>() + "…"
        } else {
            label.clone()
        };
        let _ = write!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end" dominant-baseline="central" fill="#111827"><title>{}</title>{}</text>"##,
            c(f.left - 8.0),
            c(cy),
            esc(label),
            esc(&short)
        );
        match r {
            RowData::Box(v) if !v.is_empty() => {
                let mut v = v.clone();
                v.sort_by(f64::total_cmp);
                let (q1, med, q3) = (quantile(&v, 0.25), quantile(&v, 0.5), quantile(&v, 0.75));
                let (mn, mx) = (v[0], v[v.len() - 1]);
                let mean = v.iter().sum::<f64>() / v.len() as f64;
                let bh = row_h * 0.56;
                let _ = write!(
                    s,
                    r##"<g><title>{label}: n={n}, min {mn:.2}, Q1 {q1:.2}, median {med:.2}, Q3 {q3:.2}, max {mx:.2}, mean {mean:.2}</title><line x1="{}" x2="{}" y1="{cy}" y2="{cy}" stroke="{col}"/><line x1="{}" x2="{}" y1="{}" y2="{}" stroke="{col}"/><line x1="{}" x2="{}" y1="{}" y2="{}" stroke="{col}"/><rect x="{}" y="{}" width="{}" height="{}" fill="{col}" fill-opacity="0.22" stroke="{col}"/><line x1="{m}" x2="{m}" y1="{}" y2="{}" stroke="{col}" stroke-width="2.5"/><circle cx="{}" cy="{cy}" r="3.2" fill="#fff" stroke="{col}" stroke-width="1.5"/></g>"##,
                    c(f.px(mn)),
                    c(f.px(mx)),
                    c(f.px(mn)),
                    c(f.px(mn)),
                    c(cy - bh / 3.0),
                    c(cy + bh / 3.0),
                    c(f.px(mx)),
                    c(f.px(mx)),
                    c(cy - bh / 3.0),
                    c(cy + bh / 3.0),
                    c(f.px(q1)),
                    c(cy - bh / 2.0),
                    c((f.px(q3) - f.px(q1)).max(1.0)),
                    c(bh),
                    c(cy - bh / 2.0),
                    c(cy + bh / 2.0),
                    c(f.px(mean)),
                    label = esc(label),
                    n = v.len(),
                    m = c(f.px(med)),
                    cy = c(cy),
                );
            }
            RowData::Box(_) => {}
            RowData::Bar(m, sd) => {
                let bh = row_h * 0.56;
                let x0 = f.px(xlo.max(0.0).min(*m));
                let _ = write!(
                    s,
                    r##"<g><title>{}: {m:.3} ± {sd:.3}</title><rect x="{}" y="{}" width="{}" height="{}" fill="{col}" fill-opacity="0.75"/><line x1="{}" x2="{}" y1="{cy}" y2="{cy}" stroke="#111827" stroke-width="1.5"/><text x="{}" y="{cy}" dominant-baseline="central" fill="#111827" font-size="12">{m:.2}</text></g>"##,
                    esc(label),
                    c(x0),
                    c(cy - bh / 2.0),
                    c((f.px(*m) - x0).max(1.0)),
                    c(bh),
                    c(f.px(clip(m - sd))),
                    c(f.px(clip(m + sd))),
                    c(f.px(clip(m + sd)) + 6.0),
                    cy = c(cy),
                );
            }
        }
    }
    s.push_str("</svg>");
    s
}

fn scatter_svg(groups: &[Group<'_>], metric: Metric) -> String {
    let pts: Vec<(usize, f64, f64, String)> = groups
        .iter()
        .enumerate()
        .flat_map(|(i, g)| {
            g.runs.iter().filter_map(move |r| {
                let b = num(&r.summary, "bytes_up")? + num(&r.summary, "bytes_down")?;
                let y = unit(metric, num(&r.summary, metric.key())?);
                Some((i, b, y, format!("{} (seed {})", r.name, r.seed)))
            })
        })
        .collect();
    let (mut bl, mut bh, mut yl, mut yh) = (f64::INFINITY, 0f64, f64::INFINITY, f64::NEG_INFINITY);
    for (_, b, y, _) in &pts {
        bl = bl.min(*b);
        bh = bh.max(*b);
        yl = yl.min(*y);
        yh = yh.max(*y);
    }
    let log_x = bl > 0.0 && bh / bl > 20.0;
    let x = if log_x {
        (bl / 1.5, bh * 1.5)
    } else {
        padded(bl, bh, false)
    };
    let (ya, yb) = padded(yl, yh, false);
    let f = Frame {
        w: 900.0,
        h: 380.0,
        left: 64.0,
        right: 20.0,
        top: 12.0,
        bottom: 46.0,
        x,
        y: (ya, yb),
        log_x,
    };
    let mut s = String::new();
    f.open(&mut s, "communication versus accuracy, one point per run");
    let y_title = match metric {
        Metric::Accuracy => "mean test accuracy (%)",
        Metric::Mae => "mean test MAE",
    };
    f.axes(
        &mut s,
        if log_x {
            "bytes up + down, whole run (log scale)"
        } else {
            "bytes up + down, whole run"
        },
        y_title,
        &human_bytes,
    );
    for (i, b, y, name) in &pts {
        let _ = write!(
            s,
            r##"<circle cx="{}" cy="{}" r="5.5" fill="{}" fill-opacity="0.85" stroke="#fff"><title>{}: {} , {y:.3}</title></circle>"##,
            c(f.px(*b)),
            c(f.py(*y)),
            color(*i),
            esc(name),
            human_bytes(*b)
        );
    }
    s.push_str("</svg>");
    s
}

/// `to` relative to `from` when they share a root, else `to` itself.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let abs = |p: &Path| {
        std::fs::canonicalize(p).unwrap_or_else(|_| {
            std::env::current_dir()
                .map(|d| d.join(p))
                .unwrap_or_else(|_| p.to_path_buf())
        })
    };
    let (a, b) = (abs(from), abs(to));
    let ac: Vec<Component> = a.components().collect();
    let bc: Vec<Component> = b.components().collect();
    let common = ac.iter().zip(&bc).take_while(|(x, y)| x == y).count();
    if common == 0 {
        return b;
    }
    let mut p = PathBuf::new();
    for _ in common..ac.len() {
        p.push("..");
    }
    for comp in &bc[common..] {
        p.push(comp.as_os_str());
    }
    p
}

fn malicious(s: &Value) -> Vec<usize> {
    s.get("malicious")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_u64().map(|x| x as usize))
                .collect()
        })
        .unwrap_or_default()
}

/// Renders the page (`out` is where it will live, for relative links).
pub(crate) fn render(c: &Collection, table: &Table, out: &Path) -> Result<String, SweepError> {
    let metric = table.metric;
    let groups = c.groups();
    let labels: Vec<String> = groups.iter().map(|g| c.group_label(g)).collect();
    let mut b = String::new();
    let datasets: std::collections::BTreeSet<String> = c
        .runs
        .iter()
        .filter_map(|r| {
            r.summary
                .get("dataset")
                .and_then(Value::as_str)
                .map(String::from)
        })
        .collect();
    let seeds: std::collections::BTreeSet<u64> = c.runs.iter().map(|r| r.seed).collect();
    let total_s: f64 = c
        .runs
        .iter()
        .filter_map(|r| num(&r.summary, "wall_seconds"))
        .sum();
    let _ = write!(
        b,
        r##"<header class="top"><div class="wrap"><p class="kicker">fedweave · comparison</p><h1>{} settings × {} seed(s)</h1><ul class="chips"><li><b>runs</b> {}</li><li><b>dataset</b> {}</li><li><b>varied</b> {}</li><li><b>compute</b> {}</li></ul><nav class="toc"><a href="#table">Table</a><a href="#curves">Curves</a><a href="#graphs">Graphs</a><a href="#clients">Per-client</a><a href="#fairness">Fairness</a><a href="#comm">Communication</a><a href="#runs">Runs</a></nav></div></header><main>"##,
        groups.len(),
        seeds.len(),
        c.runs.len(),
        esc(&datasets.into_iter().collect::<Vec<_>>().join(", ")),
        esc(&if c.keys.is_empty() {
            "nothing".to_string()
        } else {
            c.keys.join(", ")
        }),
        human_seconds(total_s)
    );

    // Table.
    let _ = write!(
        b,
        r#"<section class="card" id="table"><h2>Results</h2><p class="note">{}; mean ± sample std over seeds, best per column in bold. Also in <code>table.md</code>, <code>table.tex</code>, per run in <code>results.csv</code>.</p><div class="tablewrap"><table><thead><tr><th>{}</th>"#,
        esc(metric.caption()),
        esc(&table.row_title)
    );
    for col in &table.cols {
        let _ = write!(b, "<th>{}</th>", esc(col));
    }
    b.push_str("</tr></thead><tbody>");
    for (r, row) in table.rows.iter().enumerate() {
        let _ = write!(b, "<tr><td>{}</td>", esc(row));
        for col in 0..table.cols.len() {
            match &table.cells[r][col] {
                Some(cell) => {
                    let t = esc(&table.cell_text(cell, " ± "));
                    if table.is_best(r, col) {
                        let _ = write!(b, "<td><b>{t}</b></td>");
                    } else {
                        let _ = write!(b, "<td>{t}</td>");
                    }
                }
                None => b.push_str("<td>—</td>"),
            }
        }
        b.push_str("</tr>");
    }
    b.push_str("</tbody></table></div></section>");

    // Curves.
    let _ = write!(
        b,
        r#"<section class="card" id="curves"><h2>Curves</h2><p class="note">Per-round mean over benign clients of the test metric; line = mean over seeds, band = ± sample std over seeds.</p>{}<div class="figure">{}</div></section>"#,
        legend(&labels),
        curves_svg(&groups, metric)
    );

    // Final graphs, first seed of each setting.
    b.push_str(r#"<section class="card" id="graphs"><h2>Final collaboration graphs</h2><p class="note">The last round's graph of each setting's first seed (row i = recipient, column j = source; malicious clients outlined in red).</p><div class="multiples">"#);
    for (g, label) in groups.iter().zip(&labels) {
        let Some(r) = g.runs.first() else { continue };
        let Some(graph) = r
            .summary
            .get("final_graph")
            .filter(|v| v.as_array().is_some_and(|a| !a.is_empty()))
        else {
            continue;
        };
        let svg = match fedweave_report::graph_heatmap_svg(
            graph,
            &malicious(&r.summary),
            260.0,
            &format!("final graph of {label}"),
        ) {
            Ok(svg) => svg,
            Err(e) => format!(r#"<p class="note">no graph: {}</p>"#, esc(&e.to_string())),
        };
        let _ = write!(
            b,
            r#"<figure><figcaption>{} <span class="seed">(seed {})</span></figcaption><div class="figure">{svg}</div></figure>"#,
            esc(label),
            r.seed
        );
    }
    b.push_str("</div></section>");

    // Per-client distributions.
    let (pc_key, pc_title) = match metric {
        Metric::Accuracy => ("per_client_test_acc", "per-client test accuracy (%)"),
        Metric::Mae => ("per_client_test_mae", "per-client test MAE"),
    };
    let boxes: Vec<RowData> = groups
        .iter()
        .map(|g| {
            RowData::Box(
                g.runs
                    .iter()
                    .flat_map(|r| {
                        r.summary
                            .get(pc_key)
                            .and_then(Value::as_array)
                            .cloned()
                            .unwrap_or_default()
                    })
                    .filter_map(|v| v.as_f64())
                    .filter(|v| v.is_finite())
                    .map(|v| unit(metric, v))
                    .collect(),
            )
        })
        .collect();
    let _ = write!(
        b,
        r#"<section class="card" id="clients"><h2>Per-client distributions</h2><p class="note">Benign clients' best-validation test metric, pooled over seeds: box = quartiles, bar = median, circle = mean, whiskers = min and max.</p><div class="figure">{}</div></section>"#,
        rows_svg(&labels, &boxes, pc_title, false, "per-client distributions")
    );

    // Fairness.
    let fair = |key: &str| -> Vec<RowData> {
        groups
            .iter()
            .map(|g| {
                let xs: Vec<f64> = g
                    .runs
                    .iter()
                    .filter_map(|r| num(&r.summary, key))
                    .map(|v| unit(metric, v))
                    .collect();
                match mean_std(&xs) {
                    Some((m, s)) => RowData::Bar(m, s.unwrap_or(0.0)),
                    None => RowData::Box(Vec::new()),
                }
            })
            .collect()
    };
    b.push_str(r#"<section class="card" id="fairness"><h2>Fairness</h2><p class="note">Mean over seeds, whisker ± sample std.</p>"#);
    let figs: &[(&str, &str)] = match metric {
        Metric::Accuracy => &[
            (
                "std_test_acc",
                "std of per-client test accuracy (%), lower is fairer",
            ),
            (
                "bottom10_test_acc",
                "mean test accuracy of the worst 10 % of clients (%)",
            ),
            (
                "top5pct_test_acc",
                "mean test accuracy of the best ⌈5 % · N⌉ clients (%)",
            ),
            (
                "bottom5pct_test_acc",
                "mean test accuracy of the worst ⌈5 % · N⌉ clients (%)",
            ),
        ],
        Metric::Mae => &[
            (
                "worst10_test_mae",
                "mean test MAE of the worst 10 % of clients",
            ),
            ("mean_test_rmse", "mean test RMSE"),
        ],
    };
    for &(key, title) in figs {
        let _ = write!(
            b,
            r#"<h3>{}</h3><div class="figure">{}</div>"#,
            esc(title),
            rows_svg(&labels, &fair(key), title, true, title)
        );
    }
    b.push_str("</section>");

    // Communication.
    let _ = write!(
        b,
        r#"<section class="card" id="comm"><h2>Communication vs accuracy</h2><p class="note">One point per run: total bytes moved (up + down, all clients, all rounds) against the headline metric.</p>{}<div class="figure">{}</div></section>"#,
        legend(&labels),
        scatter_svg(&groups, metric)
    );

    // Runs.
    b.push_str(r#"<section class="card" id="runs"><h2>Runs</h2><div class="tablewrap"><table><thead><tr><th>run</th><th>seed</th><th>headline</th><th>bytes</th><th>time</th></tr></thead><tbody>"#);
    for r in &c.runs {
        let href = relative(out, &r.dir.join("report.html"));
        let bytes = num(&r.summary, "bytes_up").unwrap_or(0.0)
            + num(&r.summary, "bytes_down").unwrap_or(0.0);
        let _ = write!(
            b,
            r#"<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            esc(&href.to_string_lossy()),
            esc(&r.name),
            r.seed,
            num(&r.summary, metric.key()).map_or("—".into(), |v| metric.show(v)),
            human_bytes(bytes),
            human_seconds(num(&r.summary, "wall_seconds").unwrap_or(f64::NAN))
        );
    }
    b.push_str("</tbody></table></div></section>");
    let _ = write!(
        b,
        r#"<footer>Generated by fedweave-sweep {} · self-contained, works offline</footer></main>"#,
        env!("CARGO_PKG_VERSION")
    );
    Ok(format!(
        r#"<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>fedweave · comparison</title>
<style>{CSS}</style>
</head>
<body>
{b}
</body>
</html>
"#
    ))
}

const CSS: &str = r#"
:root{--fg:#111827;--muted:#6b7280;--bg:#f3f4f6;--card:#fff;--line:#e5e7eb}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:15px/1.55 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,"Noto Sans",sans-serif}
.wrap,main{max-width:1120px;margin:0 auto;padding:0 24px}
header.top{background:linear-gradient(135deg,#0f172a 0%,#1e3a8a 60%,#2563eb 100%);color:#fff;padding:28px 0 22px}
header.top .kicker{text-transform:uppercase;letter-spacing:.12em;font-size:12px;opacity:.75;margin:0}
header.top h1{margin:4px 0 12px;font-size:30px;font-weight:700}
.chips{display:flex;flex-wrap:wrap;gap:8px;margin:0;padding:0;list-style:none}
.chips li{background:rgba(255,255,255,.14);border:1px solid rgba(255,255,255,.22);border-radius:999px;padding:3px 12px;font-size:13px}
nav.toc{display:flex;flex-wrap:wrap;gap:18px;margin-top:18px;font-size:13px}
nav.toc a{color:#c7d2fe;text-decoration:none}
main{padding-top:24px;padding-bottom:40px}
section.card{background:var(--card);border:1px solid var(--line);border-radius:14px;padding:20px 22px;margin-bottom:22px;box-shadow:0 1px 2px rgba(0,0,0,.04)}
section.card h2{font-size:19px;margin:0 0 4px}
section.card h3{font-size:15px;margin:18px 0 6px}
.note{color:var(--muted);font-size:13.5px;margin:0 0 12px}
.legend{display:flex;flex-wrap:wrap;gap:6px 20px;font-size:13px;color:#374151;margin:0 8px 6px}
.legend span{display:inline-flex;align-items:center;gap:7px}
.legend i{display:inline-block;width:22px;height:4px;border-radius:2px}
.figure{overflow-x:auto}
.figure svg{display:block;margin:0 auto;max-width:100%;height:auto}
svg text{font-family:inherit}
.multiples{display:grid;grid-template-columns:repeat(auto-fill,minmax(320px,1fr));gap:12px}
.multiples figure{margin:0;border:1px solid var(--line);border-radius:10px;padding:8px}
.multiples figcaption{font-size:13px;font-weight:600;text-align:center;margin-bottom:4px}
.seed{color:var(--muted);font-weight:400}
.tablewrap{max-height:520px;overflow:auto;border:1px solid var(--line);border-radius:10px}
table{border-collapse:collapse;width:100%;font-size:13.5px;font-variant-numeric:tabular-nums}
th,td{padding:6px 12px;text-align:right;border-bottom:1px solid var(--line)}
th:first-child,td:first-child{text-align:left}
thead th{position:sticky;top:0;background:#f9fafb;font-weight:600;color:#374151}
td b{color:#1d4ed8}
a{color:#2563eb}
footer{color:var(--muted);font-size:12px;text-align:center;margin-top:8px}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(ticks(0.0, 100.0), vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        let t = ticks(0.37, 0.52);
        assert!(t.len() >= 3 && t.len() <= 7, "{t:?}");
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.5);
    }

    #[test]
    fn equal_values_get_distinct_tick_labels() {
        // Two runs that moved exactly the same bytes (FedAvg and pFedGraph).
        let (lo, hi) = padded(44_168_000.0, 44_168_000.0, false);
        assert!(lo < 44_168_000.0 && hi > 44_168_000.0);
        let labels: Vec<String> = ticks(lo, hi).into_iter().map(human_bytes).collect();
        assert!(labels.len() >= 3, "{labels:?}");
        let mut unique = labels.clone();
        unique.dedup();
        assert_eq!(unique, labels);
        // Already wide ranges keep their old padding.
        assert_eq!(padded(10.0, 20.0, false), (10.0 - 0.8, 20.0 + 0.8));
    }

    #[test]
    fn relative_paths() {
        assert_eq!(
            relative(Path::new("/a/b"), Path::new("/a/b/c/report.html")),
            PathBuf::from("c/report.html")
        );
        assert_eq!(
            relative(Path::new("/a/b"), Path::new("/a/x/report.html")),
            PathBuf::from("../x/report.html")
        );
    }
}
