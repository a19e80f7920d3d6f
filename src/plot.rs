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
