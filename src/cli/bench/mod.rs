//! `mlff bench`: energy+forces timings on built-in systems, per edge-op implementation, and
//! the student's speed against its teacher.

mod teacher;

use super::{parse_dtype, DeviceArgs};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use clap::Args;
use mlff_distiller::calculator::DeviceOutput;
use mlff_distiller::device::{device_name, synchronize};
use mlff_distiller::model::{init_varmap, Painn, PainnConfig, PainnInputs};
use mlff_distiller::ops::EdgeOps;
use mlff_distiller::systems::{aspirin, water_box};
use mlff_distiller::{checkpoint, Batch, PainnCalculator, Structure};
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct BenchArgs {
    /// Checkpoint to time; default: a randomly initialised default-size model (timings do not
    /// depend on the weights).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Comma-separated systems: aspirin, aspirin-xB (a batch of B copies), water-N (N atoms);
    /// `none` times only the --teacher-data comparison.
    #[arg(long, default_value = "aspirin,water-1000,water-10000")]
    systems: String,
    /// Comma-separated edge-op implementations to compare: custom, stock.
    #[arg(long, default_value = "custom,stock")]
    ops: String,
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    #[arg(long, default_value_t = 20)]
    repeats: usize,
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: DType,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Labelled frames whose `teacher_time_s` the student is compared with, per molecule (the
    /// student timed on whole calls: neighbour list, transfers and energy+forces).
    #[arg(long, num_args = 1..)]
    teacher_data: Vec<PathBuf>,
    /// Write each system's model inputs and our energies/forces (first ops listed) as
    /// DIR/SYSTEM.safetensors, for the PyTorch reference (benches/reference/painn_torch.py).
    #[arg(long)]
    export: Option<PathBuf>,
    #[command(flatten)]
    device: DeviceArgs,
}

#[derive(Serialize)]
struct Case {
    system: String,
    atoms: usize,
    structures: usize,
    edges: usize,
    ops: &'static str,
    /// Neighbour list on the host plus upload, ms.
    prepare_ms: f64,
    /// Forward + backward on the device, ms per call (median, min, mean).
    step_median_ms: f64,
    step_min_ms: f64,
    step_mean_ms: f64,
    /// Largest |ΔE| (eV) and |ΔF| (eV/Å) against the first ops listed.
    max_de: f64,
    max_df: f64,
}

fn system(name: &str) -> Result<Vec<Structure>> {
    if name == "aspirin" {
        return Ok(vec![aspirin()]);
    }
    if let Some(b) = name.strip_prefix("aspirin-x") {
        let b: usize = b
            .parse()
            .with_context(|| format!("batch size in `{name}`"))?;
        return Ok(vec![aspirin(); b]);
    }
    if let Some(n) = name.strip_prefix("water-") {
        let n: usize = n
            .parse()
            .with_context(|| format!("atom count in `{name}`"))?;
        return Ok(vec![water_box((n / 3).max(1), 0)]);
    }
    bail!("unknown system `{name}` (aspirin, aspirin-xB, water-N)")
}

fn load_model(a: &BenchArgs, dev: &Device) -> Result<Painn> {
    Ok(match &a.model {
        Some(p) => checkpoint::load(p)?.model(dev, a.dtype)?,
        None => {
            let cfg = PainnConfig::default();
            let vm = init_varmap(&cfg, 0, a.dtype, dev)?;
            let map = vm
                .data()
                .lock()
                .expect("varmap lock")
                .iter()
                .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
                .collect();
            Painn::new(&cfg, candle_nn::VarBuilder::from_tensors(map, a.dtype, dev))?
        }
    })
}

pub fn run(a: BenchArgs) -> Result<()> {
    anyhow::ensure!(a.repeats > 0, "--repeats must be at least 1");
    let dev = a.device.open()?;
    if let Some(dir) = &a.export {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let ops: Vec<EdgeOps> = a
        .ops
        .split(',')
        .map(|s| s.trim().parse().map_err(anyhow::Error::msg))
        .collect::<Result<_>>()?;
    let mut cases = Vec::new();
    let systems = a.systems.split(',').map(str::trim).filter(|s| *s != "none");
    for name in systems {
        let batch = Batch::new(system(name)?)?;
        let mut reference: Option<(Vec<f32>, Vec<f32>)> = None;
        for &op in &ops {
            let calc =
                PainnCalculator::new(load_model(&a, &dev)?.with_ops(op), dev.clone(), a.dtype);
            let t = Instant::now();
            let (inputs, positions) = calc.prepare(&batch)?;
            synchronize(&dev)?;
            let prepare_ms = t.elapsed().as_secs_f64() * 1e3;
            let mut times = Vec::with_capacity(a.repeats);
            let mut last = None;
            for k in 0..a.warmup + a.repeats {
                let t = Instant::now();
                let out = calc.compute_device(&inputs, &positions)?;
                synchronize(&dev)?;
                if k >= a.warmup {
                    times.push(t.elapsed().as_secs_f64() * 1e3);
                }
                last = Some(out);
            }
            let out = last.expect("at least one call");
            let e = out.energies.to_dtype(DType::F32)?.to_vec1::<f32>()?;
            let f = out
                .forces
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            let (max_de, max_df) = match &reference {
                None => {
                    if let Some(dir) = &a.export {
                        export(&dir.join(format!("{name}.safetensors")), &inputs, &out)?;
                    }
                    (0.0, 0.0)
                }
                Some((re, rf)) => (max_diff(re, &e), max_diff(rf, &f)),
            };
            reference.get_or_insert((e, f));
            times.sort_by(f64::total_cmp);
            let case = Case {
                system: name.to_string(),
                atoms: batch.n_atoms(),
                structures: batch.n_structures(),
                edges: inputs.centers.dim(0)?,
                ops: op.name(),
                prepare_ms,
                step_median_ms: times[times.len() / 2],
                step_min_ms: times[0],
                step_mean_ms: times.iter().sum::<f64>() / times.len() as f64,
                max_de,
                max_df,
            };
            eprintln!(
                "{} {}: {:.3} ms",
                case.system, case.ops, case.step_median_ms
            );
            cases.push(case);
        }
    }
    println!(
        "device: {}, dtype {:?}, {} timed calls after {} warm-up",
        device_name(&dev),
        a.dtype,
        a.repeats,
        a.warmup
    );
    if !cases.is_empty() {
        println!("| system | atoms | edges | ops | energy+forces median ms | min ms | neighbour list + upload ms | max dE eV | max dF eV/Å |");
        println!("|---|---:|---:|---|---:|---:|---:|---:|---:|");
    }
    for c in &cases {
        println!(
            "| {} | {} | {} | {} | {:.3} | {:.3} | {:.2} | {:.1e} | {:.1e} |",
            c.system,
            c.atoms,
            c.edges,
            c.ops,
            c.step_median_ms,
            c.step_min_ms,
            c.prepare_ms,
            c.max_de,
            c.max_df
        );
    }
    let teacher_cases = if a.teacher_data.is_empty() {
        Vec::new()
    } else {
        let calc = PainnCalculator::new(load_model(&a, &dev)?, dev.clone(), a.dtype);
        let cases = teacher::compare(&calc, &a.teacher_data, a.warmup, a.repeats)?;
        teacher::print(&cases);
        cases
    };
    if let Some(path) = &a.json {
        let v = serde_json::json!({"device": device_name(&dev), "dtype": format!("{:?}", a.dtype), "cases": cases, "teacher": teacher_cases});
        mlff_distiller::fsutil::write_atomic(path, serde_json::to_string_pretty(&v)?.as_bytes())?;
    }
    Ok(())
}

/// Inputs and outputs of one system, on the CPU, for an external reference to reproduce.
fn export(path: &std::path::Path, x: &PainnInputs, out: &DeviceOutput) -> Result<()> {
    let cpu = |t: &candle_core::Tensor| t.to_device(&Device::Cpu);
    let tensors = [
        ("species", cpu(&x.species)?),
        ("positions", cpu(&x.positions)?),
        ("centers", cpu(&x.centers)?),
        ("neighbors", cpu(&x.neighbors)?),
        ("offsets", cpu(&x.offsets)?),
        ("atom_structure", cpu(&x.atom_structure)?),
        ("energies", cpu(&out.energies)?),
        ("forces", cpu(&out.forces)?),
    ];
    let meta =
        std::collections::HashMap::from([("n_structures".to_string(), x.n_structures.to_string())]);
    let bytes = safetensors::serialize(tensors, Some(meta))?;
    mlff_distiller::fsutil::write_atomic(path, &bytes)?;
    Ok(())
}

fn max_diff(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max)
}
