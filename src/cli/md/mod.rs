//! `mlff md`: molecular dynamics with a student model, with restarts and a stability summary.

mod batch;

use super::{claim, parse_dtype, DynamicsArgs, ModelArgs};
use crate::fsutil::{sha256_file, write_json, Claim, Mode, OutputSet};
use crate::graph::Graphs;
use crate::interrupt::StopFlag;
use crate::io::read_extxyz;
use crate::md::{
    Barostat, Ensemble, MdOutputs, MdSettings, MdSummary, PainnForces, Progress, Restart,
    Simulation, StopReason,
};
use crate::model::Backend;
use crate::Structure;
use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit status of a run that went unstable or non-finite (settings errors exit with 1).
pub const EXIT_UNSTABLE: u8 = 4;

#[derive(Clone, Copy, ValueEnum)]
enum EnsembleArg {
    /// Velocity Verlet, constant energy.
    Nve,
    /// BAOAB Langevin thermostat at --temperature.
    Nvt,
    /// Langevin thermostat and stochastic cell rescaling barostat at --pressure (a cell
    /// periodic along all three axes).
    Npt,
}

#[derive(Args)]
pub struct MdArgs {
    /// Checkpoint (.safetensors). With --resume: only needed if the model file moved (its
    /// SHA-256 must match the one the restart recorded).
    #[arg(long, required_unless_present = "resume")]
    model: Option<PathBuf>,
    /// Starting structure (extended XYZ).
    #[arg(long, required_unless_present = "resume")]
    structure: Option<PathBuf>,
    /// Frame of --structure to start from (negative counts from the end).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    frame: i64,
    /// Every frame of --structure is a system of its own (molecules and sizes may differ),
    /// all run at once: one force call per step for every system.
    #[arg(long, conflicts_with = "frame")]
    all_frames: bool,
    /// Runs N copies of each system at once, copy k with seed --seed + k (its own starting
    /// velocities and Langevin noise). With more than one system, --traj is one file with a
    /// `system` key per frame, or a folder of one trajectory per system where it ends in `/`
    /// or is a folder; the log has a `system` field per row.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    replicas: u64,
    /// Total number of steps (with --resume: continue to this step; default: the original
    /// run's total).
    #[arg(long)]
    steps: Option<u64>,
    #[arg(long, value_enum, default_value = "nve")]
    ensemble: EnsembleArg,
    #[command(flatten)]
    dynamics: DynamicsArgs,
    /// Maxwell-Boltzmann starting temperature in K (default: --temperature).
    #[arg(long)]
    init_temperature: Option<f64>,
    /// Start from the structure's `momenta` column (as ASE writes it) instead of random
    /// velocities.
    #[arg(long)]
    keep_momenta: bool,
    /// Trajectory (extended XYZ with energy, forces, momenta), flushed frame by frame; an
    /// existing file is refused unless --overwrite or --append.
    #[arg(long)]
    traj: Option<PathBuf>,
    /// Steps between trajectory frames (at least 1).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    traj_every: u64,
    /// JSON-lines log: step, time_fs, e_pot, e_kin, e_tot (eV), temperature (K),
    /// bond_deviation (Å).
    #[arg(long)]
    log: Option<PathBuf>,
    /// Steps between log lines (at least 1).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    log_every: u64,
    /// Write a restart file every K steps and at the end (0: only when the run is stopped by
    /// SIGINT or SIGTERM, and only where no restart file exists).
    #[arg(long, default_value_t = 0)]
    restart_every: u64,
    /// Restart file path (default: <traj>.restart.json, restart.json in a --traj folder, or
    /// mlff-md.restart.json).
    #[arg(long)]
    restart_file: Option<PathBuf>,
    /// Continue the run a restart file describes (same settings, same outputs).
    #[arg(long, conflicts_with_all = [
        "structure", "frame", "dt", "ensemble", "temperature", "init_temperature", "friction",
        "seed", "skin", "keep_momenta", "traj", "traj_every", "log", "log_every",
        "restart_every", "restart_file", "dtype", "backend", "keep_going", "bond_limit", "append",
        "all_frames", "replicas", "log_pressure", "pressure", "barostat_mode", "barostat_time",
        "compressibility",
    ])]
    resume: Option<PathBuf>,
    /// auto: run each step as one CUDA graph replay where possible (a CUDA device, --backend
    /// fused) and worth it (neighbour lists of up to the tuning's graph_auto_max_edges; larger
    /// systems measured slower with graphs; molecules whose call is one kernel with its edge
    /// geometry in shared memory run faster as one launch per step, integrator included, as
    /// the tuning's one_launch_steps says; BENCHMARKS.md, "Tuning defaults"); on: always, an
    /// error where impossible; off: launch every kernel.
    #[arg(long, default_value = "auto")]
    graphs: Graphs,
    /// Keep running after a bond has stretched past --bond-limit (the run still counts as
    /// unstable).
    #[arg(long)]
    keep_going: bool,
    /// A bond this much (Å) off its starting length makes the run unstable: Fu et al.'s 0.5 Å
    /// by default, meant for molecules (a hot crystal's bonds stretch nearly that much intact).
    #[arg(long, default_value_t = crate::md::BOND_DEVIATION_LIMIT)]
    bond_limit: f64,
    /// Log each system's pressure (bar) in a batch of cells periodic along all three axes
    /// (--replicas, --all-frames): an extra force call with the stress per log step. A single
    /// run of such a cell always logs it, from its logging steps' own force calls.
    #[arg(long)]
    log_pressure: bool,
    /// NPT target pressure in bar.
    #[arg(long, default_value_t = 1.0, allow_hyphen_values = true)]
    pressure: f64,
    /// NPT cell moves: iso (the cell scales as a whole; liquids) or aniso (x, y and z
    /// lengths move independently; crystals).
    #[arg(long, default_value = "iso")]
    barostat_mode: crate::md::BarostatMode,
    /// NPT relaxation time of the volume, fs.
    #[arg(long, default_value_t = 1000.0)]
    barostat_time: f64,
    /// NPT isothermal compressibility the coupling assumes, 1/bar (water's by default; with
    /// --barostat-time it sets how fast the volume relaxes, not where to).
    #[arg(long, default_value_t = 4.5e-5)]
    compressibility: f64,
    /// Also write the closing summary as JSON here.
    #[arg(long)]
    summary_json: Option<PathBuf>,
    /// Replace outputs that exist already (by default they are refused).
    #[arg(long, conflicts_with = "append")]
    overwrite: bool,
    /// Add to an existing --traj and --log instead of refusing them.
    #[arg(long)]
    append: bool,
    /// With --resume: continue the restart's state in new files in this folder (its
    /// trajectory and log, cut to the restart's step, are copied there first), e.g. from an
    /// older restart file, leaving the original run as it is.
    #[arg(long, requires = "resume")]
    branch: Option<PathBuf>,
    #[command(flatten)]
    run: ModelArgs,
}

pub fn run(a: MdArgs) -> Result<ExitCode> {
    let stop = StopFlag::on_signals().context("installing the SIGINT/SIGTERM handlers")?;
    let resumes_batch = match &a.resume {
        Some(path) => batch::is_batch_restart(path)?,
        None => false,
    };
    if a.all_frames || a.replicas > 1 || resumes_batch {
        return batch::run(&a, stop);
    }
    let (summary, _claim) = match &a.resume {
        Some(path) => resume(&a, path, stop)?,
        None => fresh(&a, stop)?,
    };
    print_summary(&summary);
    if let Some(p) = &a.summary_json {
        write_json(p, &summary)?;
    }
    Ok(match summary.stop {
        StopReason::Interrupted { signal, .. } => ExitCode::from(128 + signal as u8),
        _ if summary.stable && summary.finite => ExitCode::SUCCESS,
        _ => ExitCode::from(EXIT_UNSTABLE),
    })
}

/// Number flags checked by name before anything is read or opened.
fn check_flags(a: &MdArgs) -> Result<()> {
    let d = &a.dynamics;
    let positive = [("--dt", d.dt, "fs")];
    let non_negative = [
        ("--temperature", d.temperature, "K"),
        ("--skin", d.skin, "Å"),
        ("--init-temperature", a.init_temperature.unwrap_or(0.0), "K"),
    ];
    for (flag, v, unit) in positive {
        anyhow::ensure!(
            v.is_finite() && v > 0.0,
            "{flag} {v}: must be finite and > 0 {unit}"
        );
    }
    for (flag, v, unit) in non_negative {
        anyhow::ensure!(
            v.is_finite() && v >= 0.0,
            "{flag} {v}: must be finite and >= 0 {unit}"
        );
    }
    if matches!(a.ensemble, EnsembleArg::Npt) {
        anyhow::ensure!(
            a.pressure.is_finite(),
            "--pressure {}: must be finite (bar)",
            a.pressure
        );
        for (flag, v, unit) in [
            ("--barostat-time", a.barostat_time, "fs"),
            ("--compressibility", a.compressibility, "1/bar"),
        ] {
            anyhow::ensure!(
                v.is_finite() && v > 0.0,
                "{flag} {v}: must be finite and > 0 {unit}"
            );
        }
    }
    if matches!(a.ensemble, EnsembleArg::Nvt | EnsembleArg::Npt) {
        let f = d.friction;
        anyhow::ensure!(
            f.is_finite() && f > 0.0,
            "--friction {f}: must be finite and > 0 (1/ps)"
        );
    }
    Ok(())
}

/// A fresh run's settings and outputs, checked before anything is read. `split` is the number
/// of systems of a batch run whose `--traj` is a folder of one trajectory per system.
fn plan(a: &MdArgs, split: Option<usize>) -> Result<(MdSettings, OutputSet)> {
    let (Some(model), Some(structure)) = (&a.model, &a.structure) else {
        bail!("--model and --structure are required unless --resume is given");
    };
    check_flags(a)?;
    let ensemble = match a.ensemble {
        EnsembleArg::Nve => Ensemble::Nve,
        EnsembleArg::Nvt | EnsembleArg::Npt => Ensemble::Nvt {
            temperature: a.dynamics.temperature,
            friction: a.dynamics.friction,
        },
    };
    let barostat = matches!(a.ensemble, EnsembleArg::Npt).then_some(Barostat {
        pressure_bar: a.pressure,
        mode: a.barostat_mode,
        time_fs: a.barostat_time,
        compressibility_per_bar: a.compressibility,
    });
    // Without --restart-every, a restart file is written only if the run is interrupted, and
    // only where none exists.
    let restart = a.restart_file.clone().unwrap_or_else(|| match &a.traj {
        Some(folder) if split.is_some() => folder.join("restart.json"),
        Some(t) => PathBuf::from(format!("{}.restart.json", t.display())),
        None => PathBuf::from("mlff-md.restart.json"),
    });
    let restart =
        (a.restart_every > 0 || a.restart_file.is_some() || !restart.exists()).then_some(restart);
    let mut io = OutputSet::new();
    io.input("--model", model).input("--structure", structure);
    if let Some(t) = &a.run.tuning.tuning {
        io.input("--tuning", t);
    }
    let keep = Mode::for_existing(a.overwrite, a.append);
    const HINT: &str = "pass --overwrite to replace it or --append to add to it";
    let traj = a.traj.as_ref().filter(|_| split.is_none());
    for (flag, path) in [("--traj", traj), ("--log", a.log.as_ref())] {
        if let Some(p) = path {
            io.output_with_hint(flag, p, keep, HINT);
        }
    }
    if let (Some(folder), Some(n)) = (&a.traj, split) {
        for k in 0..n {
            io.output_with_hint("--traj", &crate::md::system_traj(folder, k), keep, HINT);
        }
    }
    let replace = Mode::for_existing(a.overwrite, false);
    if let Some(r) = &restart {
        io.output("--restart-file", r, replace);
    }
    if let Some(p) = &a.summary_json {
        io.output("--summary-json", p, replace);
    }
    // Absolute paths here; restart files store them relative to their own folder.
    let absolute = |p: &PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());
    let settings = MdSettings {
        dt_fs: a.dynamics.dt,
        steps: a.steps.unwrap_or(1000),
        ensemble,
        init_temperature: a.init_temperature.unwrap_or(a.dynamics.temperature),
        keep_momenta: a.keep_momenta,
        seed: a.dynamics.seed,
        skin: a.dynamics.skin,
        log_every: a.log_every,
        traj_every: a.traj_every,
        restart_every: a.restart_every,
        stop_when_unstable: !a.keep_going,
        bond_limit: a.bond_limit,
        log_pressure: a.log_pressure,
        barostat,
        outputs: MdOutputs {
            traj: a.traj.as_ref().map(absolute),
            log: a.log.as_ref().map(absolute),
            restart: restart.as_ref().map(absolute),
            append: a.append,
            traj_split: split.is_some(),
        },
    };
    settings.validate()?;
    Ok((settings, io))
}

/// What restart files record to rebuild the force provider.
fn caller(a: &MdArgs, model: &Path, calc: &crate::PainnCalculator) -> Result<serde_json::Value> {
    let absolute = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    Ok(json!({
        "model": absolute(model),
        "model_sha256": sha256_file(model)?,
        "dtype": format!("{:?}", a.run.dtype).to_lowercase(),
        "backend": a.run.backend.name(),
        "tuning": calc.tuning().changes(),
        "structure": a.structure,
        "frame": a.frame,
    }))
}

fn fresh(a: &MdArgs, stop: StopFlag) -> Result<(MdSummary, Claim)> {
    let (settings, io) = plan(a, None)?;
    let (Some(model), Some(structure)) = (&a.model, &a.structure) else {
        bail!("--model and --structure are required unless --resume is given");
    };
    let start = pick_frame(structure, a.frame)?;
    let claim = claim(&io)?;
    for (flag, path) in [("--traj", &a.traj), ("--log", &a.log)] {
        if let Some(p) = path.as_ref().filter(|p| a.append && p.exists()) {
            eprintln!("{flag} {}: appending to the existing file", p.display());
        }
    }
    let calc = a.run.calculator(model)?;
    let caller = caller(a, model, &calc)?;
    let forces = PainnForces::new(&calc, &start, settings.skin)?
        .with_list_site(a.dynamics.neighbor_list)?
        .with_graphs(settings.graphs(a.graphs)?)?;
    eprintln!(
        "md: {} atoms, {} steps of {} fs, {}, on {:?}",
        start.len(),
        settings.steps,
        settings.dt_fs,
        describe(&settings),
        calc.device()
    );
    let sim = Simulation::new(forces, &start, settings, caller)
        .with_context(|| format!("{}: frame {}", structure.display(), a.frame))?;
    let summary = run_with_progress(&mut sim.with_stop(stop))?;
    Ok((summary, claim))
}

fn resume(a: &MdArgs, path: &Path, stop: StopFlag) -> Result<(MdSummary, Claim)> {
    let mut restart = Restart::load(path)?;
    if let Some(folder) = &a.branch {
        restart.branch(folder, a.overwrite)?;
        eprintln!(
            "md: branching {} (step {}) into {}",
            path.display(),
            restart.step,
            folder.display()
        );
    }
    let model = recorded_model(a, &restart.caller, path)?;
    let mut io = OutputSet::new();
    io.input("--model", &model);
    let outs = &restart.settings.outputs;
    for (flag, p) in [("--traj", &outs.traj), ("--log", &outs.log)] {
        if let Some(p) = p {
            io.output(flag, p, Mode::Continue);
        }
    }
    if let Some(r) = &outs.restart {
        io.output("--restart-file", r, Mode::Overwrite);
    }
    if let Some(p) = &a.summary_json {
        io.output("--summary-json", p, Mode::for_existing(a.overwrite, false));
    }
    let claim = claim(&io)?;
    if a.branch.is_none() {
        restart.check_current(path)?;
    }
    let run = recorded_run(a, &restart.caller, &model, path)?;
    restart.settings.steps = resumed_steps(a, restart.step, restart.settings.steps)?;
    let calc = run.calculator(&model)?;
    let template = Structure {
        cell: restart.cell,
        pbc: restart.pbc,
        ..Structure::molecule(restart.numbers.clone(), restart.positions.clone())
    };
    let forces = PainnForces::new(&calc, &template, restart.settings.skin)?
        .with_list_site(a.dynamics.neighbor_list)?
        .with_graphs(restart.settings.graphs(a.graphs)?)?;
    eprintln!(
        "md: resuming {} at step {} of {}",
        path.display(),
        restart.step,
        restart.settings.steps
    );
    let sim = Simulation::resume(forces, restart)?;
    let summary = run_with_progress(&mut sim.with_stop(stop))?;
    Ok((summary, claim))
}

/// The model a restart file's `caller` records (or --model, where it moved).
fn recorded_model(a: &MdArgs, caller: &serde_json::Value, path: &Path) -> Result<PathBuf> {
    match (&a.model, caller.get("model").and_then(|v| v.as_str())) {
        (Some(m), _) => Ok(m.clone()),
        (None, Some(m)) => Ok(PathBuf::from(m)),
        (None, None) => bail!("{}: records no model; pass --model", path.display()),
    }
}

/// The model settings a restart file's `caller` records, after checking that `model` is the
/// file it was written with.
fn recorded_run(
    a: &MdArgs,
    caller: &serde_json::Value,
    model: &Path,
    path: &Path,
) -> Result<ModelArgs> {
    let recorded = |k: &str| caller.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    let sha = sha256_file(model)?;
    if recorded("model_sha256").is_some_and(|s| s != sha) {
        bail!(
            "{}: SHA-256 differs from the model the restart file {} was written with",
            model.display(),
            path.display()
        );
    }
    let dtype = parse_dtype(&recorded("dtype").unwrap_or_else(|| "f32".into()))
        .map_err(anyhow::Error::msg)?;
    // (Restart files before the backends had a name record "ops".)
    let backend: Backend = recorded("backend")
        .or_else(|| recorded("ops"))
        .unwrap_or_else(|| "autograd".into())
        .parse()
        .map_err(anyhow::Error::msg)?;
    Ok(ModelArgs {
        dtype,
        backend,
        ..a.run.clone()
    })
}

/// The total steps of a resumed run: --steps where given (not before the restart's step).
fn resumed_steps(a: &MdArgs, at: u64, recorded: u64) -> Result<u64> {
    match a.steps {
        Some(steps) if steps < at => bail!("--steps {steps} is before the restart's step {at}"),
        Some(steps) => Ok(steps),
        None => Ok(recorded),
    }
}

fn progress_bar(steps: u64, at: u64) -> ProgressBar {
    let bar = ProgressBar::new(steps);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} steps {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_position(at);
    bar
}

fn run_with_progress(sim: &mut Simulation<PainnForces>) -> Result<MdSummary> {
    let s = sim.settings();
    let bar = progress_bar(s.steps, sim.step());
    let dt = s.dt_fs;
    let summary = sim.run(&mut |p: &Progress| {
        bar.set_position(p.step);
        bar.set_message(format!(
            "{:.0} steps/s, {:.2} ns/day, E_tot {:.4} eV, T {:.0} K",
            p.steps_per_s,
            p.steps_per_s * dt * 0.0864,
            p.record.e_tot,
            p.record.temperature
        ));
    })?;
    bar.finish_and_clear();
    if let Some(why) = sim.forces().graph_failure() {
        eprintln!("note: CUDA graphs were given up, the run went on without them: {why}");
    }
    Ok(summary)
}

/// Frame `k` of a file (negative counts from the end).
pub fn pick_frame(path: &Path, k: i64) -> Result<Structure> {
    let frames = read_extxyz(path)?;
    let n = frames.len() as i64;
    let idx = if k < 0 { n + k } else { k };
    if !(0..n).contains(&idx) {
        bail!("{}: has {n} frames, no frame {k}", path.display());
    }
    Ok(frames[idx as usize].clone())
}

fn describe(s: &MdSettings) -> String {
    if let (Some(b), Ensemble::Nvt { temperature, .. }) = (&s.barostat, s.ensemble) {
        return format!(
            "NPT ({temperature} K Langevin, {} bar stochastic cell rescaling, {}, {} fs)",
            b.pressure_bar,
            b.mode.name(),
            b.time_fs
        );
    }
    match &s.ensemble {
        Ensemble::Nve => "NVE (velocity Verlet)".into(),
        Ensemble::Nvt {
            temperature,
            friction,
        } => format!("NVT (BAOAB Langevin, {temperature} K, friction {friction}/ps)"),
    }
}

/// The closing summary for people.
pub fn print_summary(s: &MdSummary) {
    println!(
        "steps {}..{} ({:.3} ps simulated), {} atoms, {}",
        s.first_step, s.last_step, s.simulated_ps, s.atoms, s.ensemble
    );
    println!(
        "speed: {:.1} steps/s, {:.3} ns/day ({:.1} s wall, {} neighbour-list builds)",
        s.steps_per_s, s.ns_per_day, s.wall_s, s.neighbor_list_builds
    );
    if s.one_launch_steps > 0 {
        println!(
            "{} steps ran as one kernel launch each (integrator folded into the force kernel)",
            s.one_launch_steps
        );
    }
    if s.redone_steps > 0 {
        println!(
            "list checks deferred for {} steps; {} of them redone after the list was due",
            s.deferred_steps, s.redone_steps
        );
    }
    if let Some(d) = s.energy_drift_mev_per_atom_ps {
        let what = match s.ensemble.as_str() {
            "npt" => "effective energy",
            _ => "E_tot",
        };
        println!(
            "energy drift: {d:+.4} meV/atom/ps (fitted slope of the {what}), std {:.4} meV/atom",
            s.energy_std_mev_per_atom.unwrap_or(f64::NAN)
        );
    }
    if let (Some(m), Some(sd)) = (s.temperature_mean, s.temperature_std) {
        println!("temperature: {m:.1} ± {sd:.1} K");
    }
    if let (Some(m), Some(sd)) = (s.pressure_mean_bar, s.pressure_std_bar) {
        println!("pressure: {m:.1} ± {sd:.1} bar");
    }
    if let (Some(m), Some(sd), Some(rho)) =
        (s.volume_mean_a3, s.volume_std_a3, s.density_mean_g_cm3)
    {
        println!("volume: {m:.2} ± {sd:.2} Å³, density {rho:.4} g/cm³");
    }
    let verdict = match &s.stop {
        StopReason::Completed if s.stable => "stable".to_string(),
        StopReason::Completed => "UNSTABLE (kept going)".to_string(),
        StopReason::Unstable {
            step,
            atoms,
            deviation,
        } => format!(
            "UNSTABLE at step {step}: bond {}-{} deviated {deviation:.3} Å",
            atoms.0, atoms.1
        ),
        StopReason::NonFinite { step, what } => format!("NaN at step {step}: {what}"),
        StopReason::Interrupted { step, signal } => format!(
            "INTERRUPTED by signal {signal} at step {step} (the restart file, if the run has one, \
             holds that step)"
        ),
    };
    println!(
        "stability (Fu et al. 2023, any of {} bonds > {} Å off): {verdict}; largest bond \
         deviation {:.3} Å",
        s.bonds, s.bond_limit, s.max_bond_deviation
    );
}
