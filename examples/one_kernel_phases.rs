//! Where a one-kernel energy+forces call (`ops::small_system`) spends its time: the median
//! length of each phase between the kernel's barriers (GPU global timer, as its first thread
//! block saw them) and the whole call timed back to back, for the shipped model on molecules.
//!
//!     cargo run --release --features cuda --example one_kernel_phases -- [SYSTEMS]
//!
//! SYSTEMS: a comma list of names `systems::start_geometry` knows (default
//! `ethanol,aspirin,trialanine`). f32 on CUDA device 0. MLFF_ONE_KERNEL_GROUPS: a comma list of
//! thread-block counts to compare (default 16); every split must give the same forces, which it
//! prints.

use anyhow::{Context, Result};
use candle_core::{DType, Device};
use mlff_distiller::ops::{small_system, small_system_phase_times, EdgeOps, SmallSystemPlan};
use mlff_distiller::systems::start_geometry;
use mlff_distiller::{Batch, PainnCalculator};
use std::time::Instant;

const CALLS: usize = 50;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
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
    .with_ops(EdgeOps::Fused);
    let fused = calc.model().fused()?;
    let mut columns = Vec::new();
    // Thread blocks per call to compare (MLFF_ONE_KERNEL_GROUPS, a comma list; default 16).
    let groups = std::env::var("MLFF_ONE_KERNEL_GROUPS").unwrap_or_else(|_| "16".into());
    let groups: Vec<usize> = (groups.split(','))
        .map(|g| g.trim().parse().context("MLFF_ONE_KERNEL_GROUPS"))
        .collect::<Result<_>>()?;
    for name in names.split(',') {
        let mut reference: Option<candle_core::Tensor> = None;
        for &g in &groups {
            let batch = Batch::new(vec![start_geometry(name)?])?;
            let (x, _) = calc.prepare(&batch)?;
            let (n, e) = (x.positions.dim(0)?, x.centers.dim(0)?);
            let plan = SmallSystemPlan::new(fused.small_system_model()?, n, e)
                .and_then(|p| p.with_groups(g))
                .and_then(|p| p.fit(&dev, DType::F32))
                .map_err(anyhow::Error::msg)
                .context(name.to_string())?;
            let w = fused.packed_weights()?;
            let pos = x.positions.detach();
            let index = [&x.species, &x.centers, &x.neighbors];
            let call = || small_system(&plan, w, &pos, &x.offsets, index[0], index[1], index[2]);
            // Every split must give the same forces (to f32 rounding: atomic adds).
            let forces = call()?.1.to_device(&Device::Cpu)?;
            let reference = reference.get_or_insert_with(|| forces.clone());
            let df = (&forces - &*reference)?
                .abs()?
                .max_all()?
                .to_scalar::<f32>()?;
            eprintln!("{name}, {g} blocks: max |F - F(first split)| = {df:.2e} eV/Å");
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
            let mut runs = Vec::new();
            for _ in 0..CALLS {
                runs.push(small_system_phase_times(
                    &plan,
                    w,
                    [&pos, &x.offsets],
                    index,
                )?);
            }
            let phases: Vec<(String, f64)> = (0..runs[0].len())
                .map(|k| {
                    let name = runs[0][k].0.clone();
                    (name, median(runs.iter().map(|r| r[k].1).collect()))
                })
                .collect();
            columns.push((
                format!("{name} ({n} atoms, {e} edges, {g} blocks)"),
                whole,
                phases,
            ));
        }
    }
    let header: Vec<&str> = columns.iter().map(|c| c.0.as_str()).collect();
    println!("| phase | {} |", header.join(" | "));
    println!("|---|{}", "---:|".repeat(columns.len()));
    for k in 0..columns[0].2.len() {
        let cells: Vec<String> = columns.iter().map(|c| format!("{:.1}", c.2[k].1)).collect();
        println!("| {} | {} |", columns[0].2[k].0, cells.join(" | "));
    }
    let sums: Vec<String> = columns
        .iter()
        .map(|c| format!("{:.1}", c.2.iter().map(|p| p.1).sum::<f64>()))
        .collect();
    println!("| sum of phases | {} |", sums.join(" | "));
    let whole: Vec<String> = columns.iter().map(|c| format!("{:.1}", c.1)).collect();
    println!("| whole call, back to back (µs) | {} |", whole.join(" | "));
    Ok(())
}
