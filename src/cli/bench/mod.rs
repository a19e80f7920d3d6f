//! `mlff bench`: energy+forces timings on built-in systems, per edge-op implementation, and
//! the student's speed against its teacher.

mod teacher;

use super::{parse_dtype, DeviceArgs};
use crate::bench::{BenchCase, BenchReport};
use crate::calculator::{edge_offsets, DeviceOutput};
use crate::device::{device_name, synchronize};
use crate::graph::{ForceGraph, GraphEdges, Graphs, HostEdges};
use crate::model::Backend;
use crate::model::{init_varmap, Painn, PainnConfig, PainnInputs};
use crate::neighbors::batch_neighbor_list;
use crate::profiler::{reset_peak, sample, Stats};
use crate::stress::{strain_derivative, stress_volume};
use crate::systems::{aspirin, start_geometry, water_box};
use crate::{checkpoint, Batch, PainnCalculator, Structure};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Args)]
pub struct BenchArgs {
    /// Checkpoint to time; default: a randomly initialised default-size model (timings do not
    /// depend on the weights).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Comma-separated systems: a shipped molecule (ethanol, benzene, aspirin, alanine_dipeptide,
    /// trialanine, water8), NAME-xB (a batch of B copies), water-N (a periodic box of about N
    /// atoms); `none` times only the --teacher-data comparison.
    #[arg(
        long,
        default_value = "ethanol,benzene,aspirin,alanine_dipeptide,trialanine,water-300,\
                         water-1000,water-3000,water-10000,aspirin-x4,aspirin-x16,aspirin-x64"
    )]
    systems: String,
    /// Comma-separated backends to compare (the first is the accuracy reference): autograd
    /// (candle's backprop through our edge ops), stock (candle's index_select/index_add), fused
    /// (fused kernels and an explicit force pass).
    #[arg(long, alias = "ops", default_value = "autograd,fused,stock")]
    backend: String,
    /// auto: on a CUDA device, also time the fused path replayed as a CUDA graph (path
    /// `fused+graph`); on: the same, an error where graphs cannot be used; off: never.
    #[arg(long, default_value = "auto")]
    graphs: Graphs,
    /// Also time energy, forces and stress in one call (the strain's autograd pass that
    /// `mlff predict --stress` and NPT MD run) for systems periodic along all three axes.
    #[arg(long)]
    stress: bool,
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Timed calls per case (fewer when --max-seconds runs out, at least 3).
    #[arg(long, default_value_t = 20)]
    repeats: usize,
    /// Time budget per case in seconds, warm-up excluded.
    #[arg(long, default_value_t = 10.0)]
    max_seconds: f64,
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: DType,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Replace --json and --out's reports if they exist (by default they are refused).
    #[arg(long)]
    overwrite: bool,
    /// Write report.md, report.json and the plots (latency vs atoms, throughput vs batch,
    /// memory vs atoms) into this folder.
    #[arg(long)]
    out: Option<PathBuf>,
    /// A previous report.json: every case more than --tolerance slower is listed.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Slowdown that counts as a regression (0.05: 5%).
    #[arg(long, default_value_t = 0.05)]
    tolerance: f64,
    /// Exit with status 3 when a case regressed against --baseline.
    #[arg(long, requires = "baseline")]
    fail_on_regression: bool,
    /// Labelled frames whose `teacher_time_s` the student is compared with, per molecule (the
    /// student timed on whole calls: neighbour list, transfers and energy+forces).
    #[arg(long, num_args = 1..)]
    teacher_data: Vec<PathBuf>,
    /// Write each system's model inputs and our energies/forces (first path listed) as
    /// DIR/SYSTEM.safetensors, for the PyTorch reference (benches/reference/painn_torch.py),
    /// with each structure's cell, periodicity and the atoms' masses (for
    /// benches/reference/md_torch.py).
    #[arg(long)]
    export: Option<PathBuf>,
    #[command(flatten)]
    tuning: super::TuningArgs,
    #[command(flatten)]
    device: DeviceArgs,
}

/// Exit status when --fail-on-regression finds a regression.
pub const EXIT_REGRESSION: u8 = 3;

/// The structures of a system name, and how many copies of one molecule it batches.
fn system(name: &str) -> Result<(Vec<Structure>, usize)> {
    if let Some(n) = name.strip_prefix("water-") {
        let n: usize = n
            .parse()
            .with_context(|| format!("atom count in `{name}`"))?;
        return Ok((vec![water_box((n / 3).max(1), 0)], 1));
    }
    let (base, copies) = match name.rsplit_once("-x") {
        Some((base, b)) => (
            base,
            b.parse::<usize>()
                .with_context(|| format!("batch size in `{name}`"))?,
        ),
        None => (name, 1),
    };
    anyhow::ensure!(copies > 0, "batch size in `{name}` must be at least 1");
    // The rMD17 geometry, as in the first timing tables; other molecules are shipped starts.
    let one = if base == "aspirin" {
        aspirin()
    } else {
        start_geometry(base)
            .map_err(|e| anyhow::anyhow!("unknown system `{name}`: {e}; or NAME-xB, water-N"))?
    };
    Ok((vec![one; copies], copies))
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

/// Device energies and forces of the last timed call, as f32 on the host.
type Outputs = (Vec<f32>, Vec<f32>);

/// How a case calls the model.
#[derive(Clone, Copy, PartialEq)]
enum Call {
    Eager,
    /// Replays of a CUDA graph captured for the exact edge list.
    Graph,
    /// Energy, forces and stress by one strained backward pass.
    Stress,
}

/// Times one system with one code path.
fn time_case(
    a: &BenchArgs,
    calc: &PainnCalculator,
    name: &str,
    batch: &Batch,
    copies: usize,
    how: Call,
    reference: &mut Option<Outputs>,
) -> Result<BenchCase> {
    let dev = calc.device();
    let t = Instant::now();
    let nl = batch_neighbor_list(batch, calc.model().config().cutoff)?;
    let (inputs, positions) = calc.prepare_with(batch, &nl)?;
    let captured = match how {
        Call::Eager | Call::Stress => None,
        Call::Graph => {
            let offsets = edge_offsets(batch, &nl);
            let edges = HostEdges {
                centers: &nl.centers,
                neighbors: &nl.neighbors,
                offsets: &offsets,
            };
            let g = ForceGraph::capture(
                calc,
                &inputs.species,
                &inputs.atom_structure,
                inputs.n_structures,
                &positions,
                GraphEdges::Host(edges, nl.len()),
            )?;
            Some(g)
        }
    };
    synchronize(dev)?;
    let prepare_ms = t.elapsed().as_secs_f64() * 1e3;
    let edge_structure = inputs.atom_structure.index_select(&inputs.centers, 0)?;
    let call = || -> Result<DeviceOutput> {
        Ok(match (&captured, how) {
            (_, Call::Stress) => {
                let (energies, forces, _) =
                    strain_derivative(calc, &inputs, &positions, &edge_structure)?;
                DeviceOutput { energies, forces }
            }
            (None, _) => calc.compute_device(&inputs, &positions)?,
            (Some(g), _) => {
                let (energies, forces) = g.replay(&positions)?;
                DeviceOutput { energies, forces }
            }
        })
    };
    for _ in 0..a.warmup {
        call()?;
    }
    synchronize(dev)?;
    reset_peak(dev);
    let mut times = Vec::with_capacity(a.repeats);
    let budget = Instant::now();
    let mut last = None;
    while times.len() < a.repeats.max(1)
        && (times.len() < 3 || budget.elapsed().as_secs_f64() < a.max_seconds)
    {
        let t = Instant::now();
        let out = call()?;
        synchronize(dev)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        last = Some(out);
    }
    let mem = sample(dev, times.len());
    let out = last.context("no timed call")?;
    let e = out.energies.to_dtype(DType::F32)?.to_vec1::<f32>()?;
    let f = (out.forces.to_dtype(DType::F32)?.flatten_all()?).to_vec1::<f32>()?;
    // A NaN weight or a degenerate system: an error naming the case, structure and atom.
    if let Some(k) = e.iter().position(|x| !x.is_finite()) {
        bail!(
            "{name} ({}): the energy of structure {k} is {} (not finite)",
            calc.model().backend().name(),
            e[k]
        );
    }
    if let Some(c) = f.iter().position(|x| !x.is_finite()) {
        bail!(
            "{name} ({}): the force on atom {} of the batch is not finite ({})",
            calc.model().backend().name(),
            c / 3,
            f[c]
        );
    }
    let (max_de, max_df) = match reference.as_ref() {
        None => {
            if let Some(dir) = &a.export {
                let path = dir.join(format!("{name}.safetensors"));
                export(&path, batch, &inputs, &out)?;
            }
            (0.0, 0.0)
        }
        Some((re, rf)) => (max_diff(re, &e), max_diff(rf, &f)),
    };
    reference.get_or_insert((e, f));
    let latency_ms = Stats::of(&times).context("no finite timing")?;
    let per_s = 1e3 / latency_ms.median;
    Ok(BenchCase {
        system: name.to_string(),
        batch: copies,
        atoms: batch.n_atoms(),
        edges: inputs.centers.dim(0)?,
        path: match how {
            Call::Graph => format!("{}+graph", calc.model().backend().name()),
            Call::Stress => format!("{}+stress", calc.model().backend().name()),
            Call::Eager => calc.model().backend().name().to_string(),
        },
        latency_ms,
        structures_per_s: batch.n_structures() as f64 * per_s,
        atom_steps_per_s: batch.n_atoms() as f64 * per_s,
        prepare_ms,
        peak_memory_bytes: mem.peak_bytes(),
        max_de,
        max_df,
        plan: match calc.model().backend() {
            Backend::Fused => calc.fused()?.plan(&inputs)?.to_json(),
            _ => serde_json::Value::Null,
        },
    })
}

pub fn run(a: BenchArgs) -> Result<ExitCode> {
    anyhow::ensure!(a.repeats > 0, "--repeats must be at least 1");
    let mut io = crate::fsutil::OutputSet::new();
    for (flag, p) in [("--baseline", &a.baseline), ("--tuning", &a.tuning.tuning)] {
        if let Some(p) = p {
            io.input(flag, p);
        }
    }
    if let Some(p) = &a.json {
        io.output(
            "--json",
            p,
            crate::fsutil::Mode::for_existing(a.overwrite, false),
        );
    }
    if let Some(dir) = &a.out {
        super::report_files(
            &mut io,
            "--out",
            dir,
            &["report.json", "report.md"],
            a.overwrite,
        )?;
    }
    let _claim = super::claim(&io)?;
    let dev = a.device.open()?;
    for dir in [&a.export, &a.out].into_iter().flatten() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let baseline = a.baseline.as_deref().map(BenchReport::load).transpose()?;
    let tuning = a.tuning.load()?;
    let ops: Vec<Backend> = a
        .backend
        .split(',')
        .map(|s| s.trim().parse().map_err(anyhow::Error::msg))
        .collect::<Result<_>>()?;
    anyhow::ensure!(
        a.graphs != Graphs::On || ops.contains(&Backend::Fused),
        "--graphs on times the fused backend: add `fused` to --backend"
    );
    let mut cases = Vec::new();
    let systems = a.systems.split(',').map(str::trim).filter(|s| *s != "none");
    for name in systems {
        let (structures, copies) = system(name)?;
        let batch = Batch::new(structures)?;
        let mut reference = None;
        for &op in &ops {
            let model = load_model(&a, &dev)?.with_backend(op);
            let calc =
                PainnCalculator::new(model, dev.clone(), a.dtype).with_tuning(tuning.clone());
            let graphs = op == Backend::Fused && a.graphs.wanted(&calc)?;
            let stress = a.stress && batch.structures.iter().all(|s| stress_volume(s).is_some());
            let calls = std::iter::once(Call::Eager)
                .chain(graphs.then_some(Call::Graph))
                .chain(stress.then_some(Call::Stress));
            for how in calls {
                let case = time_case(&a, &calc, name, &batch, copies, how, &mut reference)?;
                eprintln!(
                    "{} {}: {:.3} ms",
                    case.system, case.path, case.latency_ms.median
                );
                cases.push(case);
            }
        }
    }
    let teacher = if a.teacher_data.is_empty() {
        serde_json::Value::Null
    } else {
        // The path users run (md, predict and eval default to fused) where it is compared.
        let op = match ops.contains(&Backend::Fused) {
            true => Backend::Fused,
            false => ops.first().copied().unwrap_or_default(),
        };
        let model = load_model(&a, &dev)?.with_backend(op);
        let calc = PainnCalculator::new(model, dev.clone(), a.dtype).with_tuning(tuning.clone());
        eprintln!("student against its teacher: the {} path", op.name());
        let cases = teacher::compare(&calc, &a.teacher_data, a.warmup, a.repeats)?;
        teacher::print(&cases);
        serde_json::to_value(&cases)?
    };
    let report = BenchReport {
        device: device_name(&dev),
        dtype: format!("{:?}", a.dtype),
        tuning: serde_json::to_value(&tuning)?,
        cases,
        teacher,
    };
    if !report.cases.is_empty() {
        print!("{}", report.markdown());
    }
    if let Some(path) = &a.json {
        report.save(path)?;
    }
    if let Some(dir) = &a.out {
        report.save(&dir.join("report.json"))?;
        crate::fsutil::write_atomic(&dir.join("report.md"), report.markdown().as_bytes())?;
        let plots = report.plots(dir)?;
        eprintln!(
            "wrote {}/report.md, report.json and {} plots",
            dir.display(),
            plots.len()
        );
    }
    let Some(baseline) = baseline else {
        return Ok(ExitCode::SUCCESS);
    };
    let regressions = report.regressions(&baseline, a.tolerance);
    for r in &regressions {
        println!(
            "REGRESSION {} {}: {:.3} ms vs {:.3} ms baseline ({:+.1}%)",
            r.system,
            r.path,
            r.current_ms,
            r.baseline_ms,
            100.0 * (r.ratio - 1.0)
        );
    }
    if regressions.is_empty() {
        println!(
            "no case more than {:.0}% slower than the baseline",
            100.0 * a.tolerance
        );
    }
    Ok(if a.fail_on_regression && !regressions.is_empty() {
        ExitCode::from(EXIT_REGRESSION)
    } else {
        ExitCode::SUCCESS
    })
}

/// Inputs and outputs of one system, on the CPU, for an external reference to reproduce; with
/// each structure's cell (rows, zero without one), periodicity and the atoms' masses (amu), so
/// that the reference can also run MD on it.
fn export(
    path: &std::path::Path,
    batch: &Batch,
    x: &PainnInputs,
    out: &DeviceOutput,
) -> Result<()> {
    let cpu = |t: &Tensor| t.to_device(&Device::Cpu);
    let n_structures = batch.structures.len();
    let cells: Vec<f64> = batch
        .structures
        .iter()
        .flat_map(|s| s.cell.unwrap_or_default().into_iter().flatten())
        .collect();
    let pbc: Vec<u8> = batch
        .structures
        .iter()
        .flat_map(|s| s.pbc.map(|p| u8::from(p && s.cell.is_some())))
        .collect();
    let masses = batch
        .structures
        .iter()
        .flat_map(|s| &s.numbers)
        .map(|&z| crate::elements::atomic_mass(z).context(format!("no mass for Z = {z}")))
        .collect::<Result<Vec<f64>>>()?;
    let tensors = [
        ("species", cpu(&x.species)?),
        ("positions", cpu(&x.positions)?),
        ("centers", cpu(&x.centers)?),
        ("neighbors", cpu(&x.neighbors)?),
        ("offsets", cpu(&x.offsets)?),
        ("atom_structure", cpu(&x.atom_structure)?),
        ("energies", cpu(&out.energies)?),
        ("forces", cpu(&out.forces)?),
        (
            "cells",
            Tensor::from_vec(cells, (n_structures, 3, 3), &Device::Cpu)?,
        ),
        (
            "pbc",
            Tensor::from_vec(pbc, (n_structures, 3), &Device::Cpu)?,
        ),
        (
            "masses",
            Tensor::from_vec(masses, x.species.dims1()?, &Device::Cpu)?,
        ),
    ];
    let meta =
        std::collections::HashMap::from([("n_structures".to_string(), x.n_structures.to_string())]);
    let bytes = safetensors::serialize(tensors, Some(meta))?;
    crate::fsutil::write_atomic(path, &bytes)?;
    Ok(())
}

fn max_diff(a: &[f32], b: &[f32]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max)
}
