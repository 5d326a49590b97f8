//! Line and bar charts drawn with `plotters` into SVG strings.

use plotters::chart::MeshStyle;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, Ranged};
use plotters::prelude::*;

use crate::ReportError;

const TEXT: RGBColor = RGBColor(55, 65, 81);
const GRID: RGBColor = RGBColor(229, 231, 235);
const AXIS: RGBColor = RGBColor(156, 163, 175);
const FONT: &str = "sans-serif";

/// Series colours.
pub(crate) const BLUE: RGBColor = RGBColor(37, 99, 235);
pub(crate) const ORANGE: RGBColor = RGBColor(234, 88, 12);
pub(crate) const PURPLE: RGBColor = RGBColor(124, 58, 237);
pub(crate) const GREEN: RGBColor = RGBColor(5, 150, 105);
const BAR: RGBColor = RGBColor(66, 146, 198);
const MALICIOUS_FILL: RGBColor = RGBColor(229, 231, 235);
const MALICIOUS_HATCH: RGBColor = RGBColor(156, 163, 175);

fn chart_err<E: std::fmt::Display>(chart: &'static str) -> impl Fn(E) -> ReportError {
    move |e| ReportError::Chart {
        chart,
        message: e.to_string(),
    }
}

/// The frame both charts share: margins and label areas around an
/// `x` × `y` plot on `root`.
#[allow(clippy::type_complexity)]
fn frame<'a, 'b, X: AsRangedCoord, Y: AsRangedCoord>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    x: X,
    y: Y,
) -> Result<
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<X::CoordDescType, Y::CoordDescType>>,
    DrawingAreaErrorKind<std::io::Error>,
> {
    ChartBuilder::on(root)
        .margin(14)
        .margin_right(28)
        .x_label_area_size(46)
        .y_label_area_size(64)
        .build_cartesian_2d(x, y)
}

/// The grid, axis and label styles both charts share, with seven y labels.
fn style_mesh<'m, 'a, 'b, X: Ranged, Y: Ranged, DB: DrawingBackend>(
    mesh: &'m mut MeshStyle<'a, 'b, X, Y, DB>,
) -> &'m mut MeshStyle<'a, 'b, X, Y, DB> {
    mesh.y_labels(7)
        .light_line_style(TRANSPARENT)
        .bold_line_style(GRID.stroke_width(1))
        .axis_style(AXIS)
        .label_style((FONT, 14).into_font().color(&TEXT))
        .axis_desc_style((FONT, 15).into_font().color(&TEXT))
}

/// One line of a line chart: `(x, y)` points; `None` leaves a gap.
pub(crate) struct Series {
    pub name: String,
    pub color: RGBColor,
    pub points: Vec<(i32, Option<f64>)>,
}

/// How y values are labelled.
#[derive(Clone, Copy)]
pub(crate) enum YFormat {
    Percent,
    Plain,
}

fn fmt_y(v: f64, span: f64, f: YFormat) -> String {
    let decimals = if span >= 20.0 {
        0
    } else if span >= 2.0 {
        1
    } else if span >= 0.2 {
        2
    } else {
        3
    };
    match f {
        YFormat::Percent => format!("{v:.decimals$}%"),
        YFormat::Plain => format!("{v:.decimals$}"),
    }
}

/// A y range covering the data with a little headroom; for percentages,
/// snapped to multiples of 5 within [0, 100].
pub(crate) fn y_range(values: impl Iterator<Item = f64>, f: YFormat) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return match f {
            YFormat::Percent => (0.0, 100.0),
            YFormat::Plain => (0.0, 1.0),
        };
    }
    match f {
        YFormat::Percent => {
            let lo = ((lo - 2.0) / 5.0).floor() * 5.0;
            let hi = ((hi + 2.0) / 5.0).ceil() * 5.0;
            (lo.max(0.0), hi.min(100.0).max(lo.max(0.0) + 5.0))
        }
        YFormat::Plain => {
            let lo = if lo >= 0.0 { 0.0 } else { lo * 1.1 };
            let hi = if hi > 0.0 {
                hi * 1.1
            } else {
                lo.abs().max(1.0) * 0.1
            };
            if hi - lo < 1e-12 {
                (lo, lo + 1.0)
            } else {
                (lo, hi)
            }
        }
    }
}

/// Contiguous runs of present points.
fn segments(points: &[(i32, Option<f64>)]) -> Vec<Vec<(i32, f64)>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    for &(x, y) in points {
        match y.filter(|v| v.is_finite()) {
            Some(v) => cur.push((x, v)),
            None if !cur.is_empty() => out.push(std::mem::take(&mut cur)),
            None => {}
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// A line chart with rounds on the x axis.
pub(crate) struct LineChart<'a> {
    pub name: &'static str,
    pub series: &'a [Series],
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub y_format: YFormat,
    pub y_range: (f64, f64),
    pub size: (u32, u32),
}

impl LineChart<'_> {
    pub fn to_svg(&self) -> Result<String, ReportError> {
        let err = chart_err(self.name);
        let xs = self
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0));
        let (xmin, xmax) = xs.fold((i32::MAX, i32::MIN), |(a, b), x| (a.min(x), b.max(x)));
        let (xmin, xmax) = if xmin > xmax {
            (0, 2)
        } else if xmin == xmax {
            (xmin - 1, xmax + 1)
        } else {
            (xmin, xmax)
        };
        let n_points = self
            .series
            .iter()
            .map(|s| s.points.len())
            .max()
            .unwrap_or(0);
        let (ylo, yhi) = self.y_range;
        let span = yhi - ylo;
        let yf = self.y_format;
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, self.size).into_drawing_area();
            root.fill(&WHITE).map_err(&err)?;
            let mut chart = frame(&root, xmin..xmax, ylo..yhi).map_err(&err)?;
            style_mesh(&mut chart.configure_mesh())
                .x_desc(self.x_label)
                .y_desc(self.y_label)
                .x_labels(12)
                .y_label_formatter(&|v| fmt_y(*v, span, yf))
                .draw()
                .map_err(&err)?;
            for s in self.series {
                let color = s.color;
                for seg in segments(&s.points) {
                    chart
                        .draw_series(LineSeries::new(seg.iter().copied(), color.stroke_width(2)))
                        .map_err(&err)?;
                    if n_points <= 60 {
                        chart
                            .draw_series(seg.iter().map(|&p| Circle::new(p, 3, color.filled())))
                            .map_err(&err)?;
                    }
                }
            }
            root.present().map_err(&err)?;
        }
        Ok(svg)
    }

    /// The legend, as HTML to put above the chart (never covers data).
    pub fn legend_html(&self) -> String {
        let mut out = String::from(r#"<div class="legend">"#);
        for s in self.series {
            out.push_str(&format!(
                r#"<span><i class="line" style="background:{}"></i>{}</span>"#,
                hex(s.color),
                crate::fmt::escape_html(&s.name)
            ));
        }
        out.push_str("</div>");
        out
    }
}

/// `#rrggbb` of a plotters colour.
pub(crate) fn hex(c: RGBColor) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

/// One bar per client; `None` bars belong to malicious clients and are
/// drawn hatched grey with no value. `mean` is drawn as a dashed line.
/// Values are printed on the bars when there are few clients.
pub(crate) struct BarChart<'a> {
    pub values: &'a [Option<f64>],
    pub malicious: &'a [bool],
    pub mean: Option<f64>,
    pub y_label: &'a str,
    pub y_format: YFormat,
    pub y_range: (f64, f64),
    pub size: (u32, u32),
}

impl BarChart<'_> {
    pub fn to_svg(&self) -> Result<String, ReportError> {
        let err = chart_err("per-client");
        let n = self.values.len().max(1);
        let (ylo, yhi) = self.y_range;
        let span = yhi - ylo;
        let yf = self.y_format;
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, self.size).into_drawing_area();
            root.fill(&WHITE).map_err(&err)?;
            let mut chart = frame(&root, -0.5f64..(n as f64 - 0.5), ylo..yhi).map_err(&err)?;
            style_mesh(&mut chart.configure_mesh())
                .disable_x_mesh()
                .x_desc("client")
                .y_desc(self.y_label)
                .x_labels(n.min(25))
                .x_label_formatter(&|x| {
                    let r = x.round();
                    if (x - r).abs() < 1e-6 && r >= 0.0 {
                        format!("{r:.0}")
                    } else {
                        String::new()
                    }
                })
                .y_label_formatter(&|v| fmt_y(*v, span, yf))
                .draw()
                .map_err(&err)?;
            let half = if n > 60 { 0.5 } else { 0.38 };
            let benign = self.values.iter().enumerate().filter_map(|(i, v)| {
                let v = (*v)?;
                let x = i as f64;
                Some(Rectangle::new(
                    [(x - half, ylo), (x + half, v.clamp(ylo, yhi))],
                    BAR.filled(),
                ))
            });
            chart.draw_series(benign).map_err(&err)?;
            if n <= 20 {
                for (i, v) in self.values.iter().enumerate() {
                    let Some(v) = *v else { continue };
                    let (cx, top) = chart.backend_coord(&(i as f64, v.clamp(ylo, yhi)));
                    let (_, base) = chart.backend_coord(&(i as f64, ylo));
                    if base - top < 22 {
                        continue;
                    }
                    let label = match yf {
                        YFormat::Percent => format!("{v:.1}%"),
                        YFormat::Plain => crate::fmt::number(Some(v)),
                    };
                    let style = (FONT, 14).into_font().color(&WHITE).pos(
                        plotters::style::text_anchor::Pos::new(
                            plotters::style::text_anchor::HPos::Center,
                            plotters::style::text_anchor::VPos::Top,
                        ),
                    );
                    root.draw(&Text::new(label, (cx, top + 6), style))
                        .map_err(&err)?;
                }
            }
            for (i, _) in self.malicious.iter().enumerate().filter(|(_, m)| **m) {
                let x = i as f64;
                let (px0, py0) = chart.backend_coord(&(x - half, yhi));
                let (px1, py1) = chart.backend_coord(&(x + half, ylo));
                root.draw(&Rectangle::new(
                    [(px0, py0), (px1, py1)],
                    MALICIOUS_FILL.filled(),
                ))
                .map_err(&err)?;
                for seg in hatch((px0, py0), (px1, py1), 7) {
                    root.draw(&PathElement::new(seg, MALICIOUS_HATCH.stroke_width(1)))
                        .map_err(&err)?;
                }
                if px1 - px0 >= 14 {
                    let cx = (px0 + px1) / 2;
                    let cy = (py0 + py1) / 2;
                    let style = (FONT, 14)
                        .into_font()
                        .color(&TEXT)
                        .transform(FontTransform::Rotate270)
                        .pos(plotters::style::text_anchor::Pos::new(
                            plotters::style::text_anchor::HPos::Center,
                            plotters::style::text_anchor::VPos::Center,
                        ));
                    root.draw(&Text::new("malicious", (cx, cy), style))
                        .map_err(&err)?;
                }
            }
            if let Some(m) = self.mean.filter(|m| m.is_finite()) {
                chart
                    .draw_series(DashedLineSeries::new(
                        [(-0.5, m), (n as f64 - 0.5, m)],
                        8,
                        5,
                        ORANGE.stroke_width(2),
                    ))
                    .map_err(&err)?;
            }
            root.present().map_err(&err)?;
        }
        Ok(svg)
    }
}

/// 45° hatch lines (x + y = const, `gap` pixels apart) clipped to a box.
fn hatch(a: (i32, i32), b: (i32, i32), gap: i32) -> Vec<Vec<(i32, i32)>> {
    let (x0, x1) = (a.0.min(b.0), a.0.max(b.0));
    let (y0, y1) = (a.1.min(b.1), a.1.max(b.1));
    let mut out = Vec::new();
    let mut k = x0 + y0 + gap;
    while k < x1 + y1 {
        // Points on x + y = k inside the box.
        let xa = x0.max(k - y1);
        let xb = x1.min(k - y0);
        if xa < xb {
            out.push(vec![(xa, k - xa), (xb, k - xb)]);
        }
        k += gap;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn y_ranges() {
        assert_eq!(
            y_range([91.0, 95.5].into_iter(), YFormat::Percent),
            (85.0, 100.0)
        );
        assert_eq!(
            y_range([1.0, 3.0].into_iter(), YFormat::Percent),
            (0.0, 5.0)
        );
        assert_eq!(y_range(std::iter::empty(), YFormat::Percent), (0.0, 100.0));
        let (lo, hi) = y_range([0.5, 2.0].into_iter(), YFormat::Plain);
        assert_eq!(lo, 0.0);
        assert!(hi > 2.0);
    }

    #[test]
    fn gaps_split_lines() {
        let s = segments(&[
            (1, Some(1.0)),
            (2, None),
            (3, Some(2.0)),
            (4, Some(f64::NAN)),
        ]);
        assert_eq!(s, vec![vec![(1, 1.0)], vec![(3, 2.0)]]);
    }

    #[test]
    fn hatch_stays_inside() {
        for seg in hatch((10, 20), (30, 80), 7) {
            for (x, y) in seg {
                assert!((10..=30).contains(&x) && (20..=80).contains(&y));
            }
        }
    }
}
