//! `mlff validate-md`: NVE and NVT stability runs of the shipped systems with one or more
//! models and code paths, reported as markdown, JSON and E_tot(t) plots.

use super::{parse_dtype, DeviceArgs, DynamicsArgs};
use crate::device::with_own_stream;
use crate::fsutil::{sha256_file, write_atomic, write_json};
use crate::graph::Graphs;
use crate::io::read_extxyz;
use crate::md::validate::{markdown, plot_energies, run_suite, run_suite_batched, SuiteSettings};
use crate::model::Backend;
use crate::systems::start_geometry;
use crate::{PainnCalculator, Structure};
use anyhow::{Context, Result};
use candle_core::DType;
use clap::Args;
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct ValidateMdArgs {
    /// Model(s) to validate; repeat the flag to compare two in one report.
    #[arg(long = "model", default_value = "models/painn-gfn2.safetensors")]
    models: Vec<PathBuf>,
    /// Backends to compare, comma separated: fused, autograd, stock.
    #[arg(long, alias = "ops", value_delimiter = ',', default_value = "fused")]
    backend: Vec<Backend>,
    #[command(flatten)]
    tuning: super::TuningArgs,
    /// Shipped starting geometries by name (water8, ethanol, benzene, aspirin,
    /// alanine_dipeptide, trialanine) or extended-XYZ files (first frame), comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "water8,ethanol,benzene,alanine_dipeptide,trialanine"
    )]
    systems: Vec<String>,
    /// NVE windows in steps: the longest is run, each is judged from its start.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    nve_steps: Vec<u64>,
    /// Length of the NVT run (0: none).
    #[arg(long, default_value_t = 10_000)]
    nvt_steps: u64,
    #[command(flatten)]
    dynamics: DynamicsArgs,
    #[arg(long, default_value_t = 10)]
    log_every: u64,
    /// Trajectory frame every k steps (0: no trajectories).
    #[arg(long, default_value_t = 100)]
    traj_every: u64,
    /// Systems run at once, each on its own CPU thread (or CUDA stream). On one GPU, several
    /// streams in one process were measured slower in total than one
    /// (docs/bench-log/06-bench-suite-baseline.md): there, run one process per GPU instead
    /// (benches/gpu/validate.sh).
    #[arg(long, default_value_t = 1, conflicts_with = "batched")]
    jobs: usize,
    /// Run every system at once, one batch per variant and ensemble (as `mlff md
    /// --all-frames`; each system with --seed, as its own run): the same runs and report,
    /// the speed column the batch's.
    #[arg(long)]
    batched: bool,
    /// Folder for report.md, report.json, etot_<system>.png and runs/.
    #[arg(long)]
    out: PathBuf,
    /// Replace reports that exist already (by default they are refused).
    #[arg(long)]
    overwrite: bool,
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: DType,
    /// auto: the fused path's steps replayed as CUDA graphs on a CUDA device where `mlff md`
    /// would (lists of up to 32,768 edges, not one-kernel molecules; such runs are labelled
    /// `fused+graph`); on: for any size, an error where impossible; off: never.
    #[arg(long, default_value = "auto")]
    graphs: Graphs,
    #[command(flatten)]
    device: DeviceArgs,
}

/// A shipped geometry by name, else the first frame of a file.
fn load_system(spec: &str) -> Result<(String, Structure)> {
    if let Ok(s) = start_geometry(spec) {
        return Ok((spec.to_string(), s));
    }
    let path = Path::new(spec);
    anyhow::ensure!(
        path.exists(),
        "`{spec}` is neither a shipped system nor a file ({})",
        start_geometry(spec)
            .err()
            .map_or(String::new(), |e| e.to_string())
    );
    let frame = read_extxyz(path)?
        .into_iter()
        .next()
        .with_context(|| format!("{spec}: no frames"))?;
    let name = path
        .file_stem()
        .map_or(spec.into(), |s| s.to_string_lossy().into_owned());
    Ok((name, frame))
}

pub fn run(a: ValidateMdArgs) -> Result<()> {
    anyhow::ensure!(
        !a.nve_steps.is_empty(),
        "--nve-steps needs at least one window"
    );
    let dev = a.device.open()?;
    let systems = a
        .systems
        .iter()
        .map(|s| load_system(s))
        .collect::<Result<Vec<_>>>()?;
    let mut io = crate::fsutil::OutputSet::new();
    for m in &a.models {
        io.input("--model", m);
    }
    super::report_files(
        &mut io,
        "--out",
        &a.out,
        &["report.md", "report.json"],
        a.overwrite,
    )?;
    let _claim = super::claim(&io)?;
    let mut models = Vec::new();
    for m in &a.models {
        models.push(json!({"path": m, "sha256": sha256_file(m)?}));
    }
    let tuning = a.tuning.load()?;
    let make_variants = |dev: &candle_core::Device| {
        let mut out = Vec::new();
        for m in &a.models {
            let stem = m
                .file_stem()
                .map_or("model".into(), |s| s.to_string_lossy());
            for &op in &a.backend {
                let calc = PainnCalculator::from_checkpoint(m, dev, a.dtype)?
                    .with_backend(op)
                    .with_tuning(tuning.clone());
                calc.check_ops()
                    .map_err(|e| crate::Error::Config(format!("{}: {e}", m.display())))?;
                out.push((format!("{stem}/{}", op.name()), calc));
            }
        }
        Ok(out)
    };
    // Fail on a bad model before starting any worker.
    make_variants(&dev)?;
    let devices = (0..a.jobs.max(1))
        .map(|_| with_own_stream(&dev))
        .collect::<crate::Result<Vec<_>>>()?;
    let settings = SuiteSettings {
        nve_windows: a.nve_steps.clone(),
        nvt_steps: a.nvt_steps,
        dt_fs: a.dynamics.dt,
        temperature: a.dynamics.temperature,
        friction: a.dynamics.friction,
        seed: a.dynamics.seed,
        skin: a.dynamics.skin,
        neighbor_list: a.dynamics.neighbor_list,
        log_every: a.log_every,
        traj_every: a.traj_every,
        graphs: a.graphs,
    };
    std::fs::create_dir_all(&a.out).with_context(|| format!("{}", a.out.display()))?;
    let suite = match a.batched {
        true => run_suite_batched,
        false => run_suite,
    };
    let reports = suite(
        &devices,
        &make_variants,
        &systems,
        &settings,
        &a.out,
        &|r| {
            eprintln!(
                "{} {} {}: {} steps, {}, {:.1} steps/s",
                r.system,
                r.variant,
                r.ensemble,
                r.summary.last_step,
                if r.summary.stable {
                    "stable"
                } else {
                    "UNSTABLE"
                },
                r.summary.steps_per_s
            );
        },
    )?;
    let gpu = crate::device::gpu_infos()
        .ok()
        .and_then(|g| g.into_iter().next())
        .filter(|_| dev.is_cuda())
        .map_or(String::new(), |g| {
            format!(" ({}, driver CUDA {})", g.name, g.driver_cuda_version)
        });
    let header = format!(
        "Models: {}. Device: {}{gpu}, dtype {:?}, mlff {}.",
        a.models
            .iter()
            .map(|m| format!("`{}`", m.display()))
            .collect::<Vec<_>>()
            .join(", "),
        crate::device::device_name(&dev),
        a.dtype,
        env!("CARGO_PKG_VERSION")
    );
    let md = markdown(&reports, &settings, &header);
    write_atomic(&a.out.join("report.md"), md.as_bytes())?;
    let report = json!({
        "models": models,
        "device": crate::device::device_name(&dev),
        "dtype": format!("{:?}", a.dtype),
        "settings": settings,
        "runs": reports,
    });
    write_json(&a.out.join("report.json"), &report)?;
    let plots = plot_energies(&reports, &a.out)?;
    print!("{md}");
    eprintln!(
        "wrote {}/report.md, report.json and {} plots",
        a.out.display(),
        plots.len()
    );
    Ok(())
}
