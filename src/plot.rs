//! PNG plots (plotters, with an embedded DejaVu Sans so they render on machines without fonts).

use crate::error::{Error, Result};
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
        source: std::io::Error::other(format!("drawing the plot: {e}")),
    }
}

/// Scatter of predicted against reference values with the y = x line.
pub fn parity_png(
    path: &Path,
    reference: &[f64],
    predicted: &[f64],
    title: &str,
    unit: &str,
) -> Result<()> {
    register_font();
    let finite = reference.iter().chain(predicted).filter(|x| x.is_finite());
    let (lo, hi) = finite.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
        (a.min(x), b.max(x))
    });
    let (lo, hi) = if lo < hi { (lo, hi) } else { (-1.0, 1.0) };
    let pad = 0.05 * (hi - lo);
    let (lo, hi) = (lo - pad, hi + pad);
    let root = BitMapBackend::new(path, (800, 800)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(lo..hi, lo..hi)
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc(format!("reference ({unit})"))
        .y_desc(format!("predicted ({unit})"))
        .draw()
        .map_err(|e| plot_err(path, e))?;
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
    register_font();
    let finite = |f: fn(&(f64, f64)) -> f64| {
        lines
            .iter()
            .flat_map(|l| l.points.iter().map(f))
            .filter(|v| v.is_finite())
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                (a.min(v), b.max(v))
            })
    };
    let padded = |(lo, hi): (f64, f64)| {
        if lo < hi {
            let pad = 0.05 * (hi - lo);
            (lo - pad, hi + pad)
        } else if lo.is_finite() {
            (lo - 1.0, lo + 1.0)
        } else {
            (0.0, 1.0)
        }
    };
    let (x0, x1) = padded(finite(|p| p.0));
    let (y0, y1) = padded(finite(|p| p.1));
    let root = BitMapBackend::new(path, (1000, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(90)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| plot_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(|e| plot_err(path, e))?;
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
