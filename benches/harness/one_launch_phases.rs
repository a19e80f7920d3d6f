//! Where a one-kernel energy+forces call spends its time: the median length of each phase of
//! the feature-split kernel (`ops::feature_split`, between its barriers) and of the atom-split
//! kernel (`ops::atom_split`, between its marks), by the GPU's global timer as their first
//! thread block saw them, and each whole call timed back to back, for the shipped model on
//! molecules.
//!
//!     cargo bench --features profiling --bench one_launch_phases -- [SYSTEMS [BLOCKS]]
//!
//! SYSTEMS: a comma list of names `systems::start_geometry` knows, or NAME-xB for a batch of B
//! copies (default `ethanol,aspirin,trialanine`); the feature split is left out where it does
//! not take the system (more than its atoms or edges). f32 on CUDA device 0. BLOCKS: a comma
//! list of thread-block counts of the feature split to compare (default 16); every split must
//! give the same forces, which it prints. The `profiling` feature builds the readers of the
//! kernels' phase stamps.

use anyhow::{Context, Result};
use candle_core::{DType, Device, Tensor};
use mlff_distiller::model::Backend;
use mlff_distiller::ops::{
    atom_split, atom_split_phase_times, feature_split, feature_split_phase_times, AtomSplitPlan,
    FeatureSplitPlan,
};
use mlff_distiller::systems::start_geometry;
use mlff_distiller::{Batch, PainnCalculator};
use std::time::Instant;

const CALLS: usize = 50;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One table column: a heading, the whole call's µs and each phase's median µs.
type Column = (String, f64, Vec<(String, f64)>);

/// The column of a kernel `call` (energies, forces) and its `phases` (one stamped call).
fn measure(
    dev: &Device,
    heading: String,
    call: impl Fn() -> candle_core::Result<(Tensor, Tensor)>,
    phases: impl Fn() -> candle_core::Result<Vec<(String, f64)>>,
) -> Result<Column> {
    for _ in 0..20 {
        call()?;
    }
    dev.synchronize()?;
    let t = Instant::now();
    for _ in 0..CALLS {
        call()?;
    }
    dev.synchronize()?;
    let whole = t.elapsed().as_secs_f64() * 1e6 / CALLS as f64;
    let runs = (0..CALLS)
        .map(|_| phases())
        .collect::<candle_core::Result<Vec<_>>>()?;
    let medians = (0..runs[0].len())
        .map(|k| {
            let name = runs[0][k].0.clone();
            (name, median(runs.iter().map(|r| r[k].1).collect()))
        })
        .collect();
    Ok((heading, whole, medians))
}

/// Prints columns of the same kernel (the same phases) as one markdown table.
fn print_table(title: &str, columns: &[Column]) {
    let Some(first) = columns.first() else {
        return;
    };
    println!("\n{title}\n");
    let header: Vec<&str> = columns.iter().map(|c| c.0.as_str()).collect();
    println!("| phase | {} |", header.join(" | "));
    println!("|---|{}", "---:|".repeat(columns.len()));
    for (k, (phase, _)) in first.2.iter().enumerate() {
        let cells: Vec<String> = columns.iter().map(|c| format!("{:.1}", c.2[k].1)).collect();
        println!("| {phase} | {} |", cells.join(" | "));
    }
    let sums: Vec<String> = (columns.iter())
        .map(|c| format!("{:.1}", c.2.iter().map(|p| p.1).sum::<f64>()))
        .collect();
    println!("| sum of phases | {} |", sums.join(" | "));
    let whole: Vec<String> = columns.iter().map(|c| format!("{:.1}", c.1)).collect();
    println!("| whole call, back to back (µs) | {} |", whole.join(" | "));
}

fn main() -> Result<()> {
    let names = std::env::args().nth(1);
    let names = names.as_deref().unwrap_or("ethanol,aspirin,trialanine");
    let dev = Device::new_cuda(0)?;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let calc = PainnCalculator::from_checkpoint(
        &root.join("models/painn-gfn2.safetensors"),
        &dev,
        DType::F32,
    )?
    .with_backend(Backend::Fused);
    let fused = calc.fused()?;
    let (w, w_out) = (fused.packed_weights()?, fused.packed_weights_out_major()?);
    let model = fused.shape()?;
    // Thread blocks per call to compare (a comma list; default 16).
    let groups = std::env::args().nth(2).unwrap_or_else(|| "16".into());
    let groups: Vec<usize> = (groups.split(','))
        .map(|g| g.trim().parse().context("BLOCKS: a comma list of counts"))
        .collect::<Result<_>>()?;
    let (mut feature_split_columns, mut atom_split_columns) = (Vec::new(), Vec::new());
    for name in names.split(',') {
        let (base, copies) = match name.rsplit_once("-x") {
            Some((base, b)) => (base, b.parse::<usize>().context("batch size")?),
            None => (name, 1),
        };
        let batch = Batch::new(vec![start_geometry(base)?; copies])?;
        let (x, _) = calc.prepare(&batch)?;
        let (n, e) = (x.positions.dim(0)?, x.centers.dim(0)?);
        let pos = x.positions.detach();
        let index = [&x.species, &x.centers, &x.neighbors];
        let mut reference: Option<Tensor> = None;
        for &g in &groups {
            let plan = FeatureSplitPlan::new(model, n, e)
                .and_then(|p| p.with_groups(g))
                .and_then(|p| p.fit(&dev, DType::F32));
            let plan = match plan {
                Ok(plan) => plan,
                Err(why) => {
                    eprintln!("{name}: no feature split ({why})");
                    continue;
                }
            };
            let call = || feature_split(&plan, w, &pos, &x.offsets, index[0], index[1], index[2]);
            // Every split must give the same forces (to f32 rounding: atomic adds).
            let forces = call()?.1.to_device(&Device::Cpu)?;
            let reference = reference.get_or_insert_with(|| forces.clone());
            let df = (&forces - &*reference)?
                .abs()?
                .max_all()?
                .to_scalar::<f32>()?;
            eprintln!("{name}, {g} blocks: max |F - F(first split)| = {df:.2e} eV/Å");
            let heading = format!("{name} ({n} atoms, {e} edges, {g} blocks)");
            let phases = || feature_split_phase_times(&plan, w, [&pos, &x.offsets], index);
            feature_split_columns.push(measure(&dev, heading, call, phases)?);
        }
        let plan = AtomSplitPlan::fit(model, n, e, &dev, DType::F32)
            .map_err(anyhow::Error::msg)
            .context(format!("{name}: atom split"))?;
        let call = || {
            atom_split(
                &plan, w, w_out, &pos, &x.offsets, index[0], index[1], index[2],
            )
        };
        let heading = format!(
            "{name} ({n} atoms, {e} edges, {} blocks of {})",
            plan.blocks(),
            plan.atoms_per_block(),
        );
        let phases = || atom_split_phase_times(&plan, [w, w_out], [&pos, &x.offsets], index);
        atom_split_columns.push(measure(&dev, heading, call, phases)?);
    }
    print_table(
        "Feature split (`ops::feature_split`), µs",
        &feature_split_columns,
    );
    print_table("Atom split (`ops::atom_split`), µs", &atom_split_columns);
    Ok(())
}
