//! PNG plots (plotters, with an embedded DejaVu Sans so they render on machines without fonts).

use crate::error::{Error, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The font is embedded and valid; a failure here would be a build defect.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

fn plot_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Io {
        path: path.into(),
        cause: std::io::Error::other(format!("drawing the plot: {e}")),
    }
}

type Chart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Smallest and largest finite value, padded by 5% (a unit interval around a single value).
fn padded_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if lo < hi {
        let pad = 0.05 * (hi - lo);
        (lo - pad, hi + pad)
    } else if lo.is_finite() {
        (lo - 0.5, lo + 0.5)
    } else {
        (0.0, 1.0)
    }
}

/// A white canvas of `size` pixels drawing into `path`.
fn canvas(path: &Path, size: (u32, u32)) -> Result<DrawingArea<BitMapBackend<'_>, Shift>> {
    register_font();
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    Ok(root)
}

/// Titled axes over `x` × `y` with labelled ticks and a grid.
fn axes<'a, 'b>(
    root: &'a DrawingArea<BitMapBackend<'b>, Shift>,
    path: &Path,
    title: &str,
    (x, y): ((f64, f64), (f64, f64)),
    (x_desc, y_desc): (&str, &str),
) -> Result<Chart<'a, 'b>> {
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(90)
        .build_cartesian_2d(x.0..x.1, y.0..y.1)
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(|e| plot_err(path, e))?;
    Ok(chart)
}

/// Scatter of predicted against reference values with the y = x line.
pub fn parity_png(
    path: &Path,
    reference: &[f64],
    predicted: &[f64],
    title: &str,
    unit: &str,
) -> Result<()> {
    let (lo, hi) = padded_range(reference.iter().chain(predicted).copied());
    let root = canvas(path, (800, 800))?;
    let (xd, yd) = (format!("reference ({unit})"), format!("predicted ({unit})"));
    let mut chart = axes(&root, path, title, ((lo, hi), (lo, hi)), (&xd, &yd))?;
    chart
        .draw_series(LineSeries::new([(lo, lo), (hi, hi)], BLACK.stroke_width(1)))
        .map_err(|e| plot_err(path, e))?;
    chart
        .draw_series(
            reference
                .iter()
                .zip(predicted)
                .map(|(&x, &y)| Circle::new((x, y), 2, BLUE.mix(0.35).filled())),
        )
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))?;
    Ok(())
}

/// One named line of a line plot.
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Lines of y against x with a legend (e.g. E_tot(t) of several runs).
pub fn lines_png(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    lines: &[Line],
) -> Result<()> {
    let all = || lines.iter().flat_map(|l| l.points.iter());
    let x = padded_range(all().map(|p| p.0));
    let y = padded_range(all().map(|p| p.1));
    let root = canvas(path, (1000, 600))?;
    let mut chart = axes(&root, path, title, (x, y), (x_desc, y_desc))?;
    for (k, line) in lines.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        chart
            .draw_series(LineSeries::new(
                line.points
                    .iter()
                    .copied()
                    .filter(|p| p.0.is_finite() && p.1.is_finite()),
                color.stroke_width(2),
            ))
            .map_err(|e| plot_err(path, e))?
            .label(line.label.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))?;
    Ok(())
}

/// A histogram of `values` in `bins` equal bins.
pub fn histogram_png(
    path: &Path,
    title: &str,
    x_desc: &str,
    values: &[f64],
    bins: usize,
) -> Result<()> {
    let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    let (lo, hi) = padded_range(v.iter().copied());
    let bins = bins.max(1);
    let width = (hi - lo) / bins as f64;
    let mut counts = vec![0usize; bins];
    for x in &v {
        counts[(((x - lo) / width) as usize).min(bins - 1)] += 1;
    }
    let top = counts.iter().copied().max().unwrap_or(1).max(1) as f64 * 1.05;
    let root = canvas(path, (1000, 600))?;
    let mut chart = axes(
        &root,
        path,
        title,
        ((lo, hi), (0.0, top)),
        (x_desc, "count"),
    )?;
    chart
        .draw_series(counts.iter().enumerate().map(|(k, &c)| {
            let x0 = lo + k as f64 * width;
            Rectangle::new([(x0, 0.0), (x0 + width, c as f64)], BLUE.mix(0.6).filled())
        }))
        .map_err(|e| plot_err(path, e))?;
    root.present().map_err(|e| plot_err(path, e))?;
    Ok(())
}
