//! `mlff eval MODEL DATA`: accuracy against labelled frames.

use super::{BatchGraphArgs, ModelArgs};
use crate::eval::{evaluate, stress_errors, Errors};
use crate::fsutil::{Mode, OutputSet};
use crate::train::Dataset;
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct EvalArgs {
    /// Checkpoint (.safetensors).
    model: PathBuf,
    /// Labelled frames (extended XYZ with energy and forces), one or more files.
    #[arg(required = true, num_args = 1..)]
    data: Vec<PathBuf>,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write a force parity plot (PNG) here.
    #[arg(long)]
    plot: Option<PathBuf>,
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Replace outputs that exist already (by default they are refused).
    #[arg(long)]
    overwrite: bool,
    #[command(flatten)]
    run: ModelArgs,
    #[command(flatten)]
    graphs: BatchGraphArgs,
}

fn row(name: &str, e: &Errors) -> String {
    format!(
        "| {name} | {} | {} | {:.2} | {:.2} | {:.3} | {:.3} | {:.2} | {:.2} | {:.4} |",
        e.frames,
        e.atoms,
        e.energy_mae * 1e3,
        e.energy_rmse * 1e3,
        e.energy_per_atom_mae * 1e3,
        e.energy_per_atom_rmse * 1e3,
        e.force_mae * 1e3,
        e.force_rmse * 1e3,
        e.force_cosine
    )
}

pub fn run(a: EvalArgs) -> Result<()> {
    anyhow::ensure!(a.batch_size > 0, "--batch-size must be at least 1");
    let mut io = OutputSet::new();
    io.input("MODEL", &a.model);
    for d in &a.data {
        io.input("DATA", d);
    }
    let mode = Mode::for_existing(a.overwrite, false);
    for (flag, p) in [("--json", &a.json), ("--plot", &a.plot)] {
        if let Some(p) = p {
            io.output(flag, p, mode);
        }
    }
    let _claim = super::claim(&io)?;
    let model = a.run.calculator(&a.model)?;
    let ds = Dataset::load_all(&a.data)?;
    ds.check_elements(model.model().config())?;
    let calc = a.graphs.wrap(&model)?;
    let (mut report, parity) = evaluate(&calc, &ds.frames, a.batch_size)
        .map_err(|e| super::at_frame(e, |k| ds.origin_of(k)))?;
    let name = |k: usize| {
        let (file, frame) = ds.origin_of(k);
        format!("{}: frame {frame}", file.display())
    };
    report.stress = stress_errors(&model, &ds.frames, a.batch_size, &name)?;
    BatchGraphArgs::report(&calc);
    println!(
        "{} on {} ({} frames)",
        a.model.display(),
        ds.describe(),
        ds.frames.len()
    );
    println!("| group | frames | atoms | E MAE meV | E RMSE meV | E MAE meV/atom | E RMSE meV/atom | F MAE meV/Å | F RMSE meV/Å | F cos |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!("{}", row("all", &report.overall));
    if report.per_molecule.len() > 1 {
        for (name, e) in &report.per_molecule {
            println!("{}", row(name, e));
        }
    }
    println!("\nforces per element:\n| element | atoms | F MAE meV/Å | F RMSE meV/Å | F cos |\n|---|---:|---:|---:|---:|");
    for (el, e) in &report.per_element {
        println!(
            "| {el} | {} | {:.2} | {:.2} | {:.4} |",
            e.atoms,
            e.force_mae * 1e3,
            e.force_rmse * 1e3,
            e.force_cosine
        );
    }
    if let Some(st) = &report.stress {
        // 1 eV/Å³ = 160.21766 GPa.
        println!(
            "\nstress ({} frames with labels): MAE {:.4} GPa, RMSE {:.4} GPa ({:.3e} / {:.3e} eV/Å³)",
            st.frames,
            st.mae * 160.217_66,
            st.rmse * 160.217_66,
            st.mae,
            st.rmse
        );
    }
    if let Some(path) = &a.json {
        let v = serde_json::json!({
            "model": a.model, "data": ds.sources,
            "units": {"energy": "eV", "forces": "eV/Å", "stress": "eV/Å³"}, "report": report,
        });
        crate::fsutil::write_json(path, &v)?;
    }
    if let Some(path) = &a.plot {
        let title = format!(
            "Forces: MAE {:.1} meV/Å, {} frames",
            report.overall.force_mae * 1e3,
            ds.frames.len()
        );
        crate::plot::parity_png(path, &parity.reference, &parity.predicted, &title, "eV/Å")?;
    }
    Ok(())
}
