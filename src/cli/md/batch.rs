//! `mlff md --replicas N` / `--all-frames`: many systems in one run ([`BatchSimulation`]), and
//! the resumption of such a run from its restart file.

use super::EXIT_UNSTABLE;
use super::{caller, claim, describe, pick_frame, plan, progress_bar, recorded_model};
use super::{recorded_run, resumed_steps, MdArgs};
use crate::fsutil::{read_json, write_json, Mode, OutputSet};
use crate::interrupt::StopFlag;
use crate::io::read_extxyz;
use crate::md::{BatchProgress, BatchRestart, BatchSimulation, BatchSummary, PainnForces};
use crate::md::{ListSite, MdSettings, StopReason, BATCH_RESTART_FORMAT, DEVICE_LIST_BATCH_NPT};
use crate::Structure;
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::ExitCode;

/// Whether `path` is a batch run's restart file (read only for its `format`).
pub(super) fn is_batch_restart(path: &Path) -> Result<bool> {
    let v: serde_json::Value = read_json(path, "an mlff md restart file")?;
    Ok(v.get("format").and_then(|f| f.as_str()) == Some(BATCH_RESTART_FORMAT))
}

pub(super) fn run(a: &MdArgs, stop: StopFlag) -> Result<ExitCode> {
    let summary = match &a.resume {
        Some(path) => resume(a, path, stop)?,
        None => fresh(a, stop)?,
    };
    print_summary(&summary);
    if let Some(p) = &a.summary_json {
        write_json(p, &summary)?;
    }
    Ok(match summary.stop {
        StopReason::Interrupted { signal, .. } => ExitCode::from(128 + signal as u8),
        _ if summary.stable_systems == summary.systems.len() => ExitCode::SUCCESS,
        _ => ExitCode::from(EXIT_UNSTABLE),
    })
}

/// The systems of a fresh batch run: --frame (or every frame), each --replicas times.
fn systems(a: &MdArgs, structure: &Path) -> Result<Vec<Structure>> {
    let frames = match a.all_frames {
        true => read_extxyz(structure)?,
        false => vec![pick_frame(structure, a.frame)?],
    };
    if frames.is_empty() {
        bail!("{}: has no frames", structure.display());
    }
    let n = frames.len() * a.replicas as usize;
    let mut out = Vec::with_capacity(n);
    for f in frames {
        out.extend(std::iter::repeat_n(f, a.replicas as usize));
    }
    Ok(out)
}

/// Whether --traj names a folder of one trajectory per system.
fn traj_is_folder(a: &MdArgs) -> bool {
    a.traj.as_ref().is_some_and(|t| {
        t.is_dir()
            || t.as_os_str()
                .to_string_lossy()
                .ends_with(std::path::MAIN_SEPARATOR)
    })
}

/// A batch at constant pressure cannot keep the device list: refused before anything runs.
fn refuse_device_list_npt(a: &MdArgs, settings: &MdSettings) -> Result<()> {
    if settings.barostat.is_some() && a.dynamics.neighbor_list == ListSite::Device {
        bail!("--neighbor-list device: {DEVICE_LIST_BATCH_NPT}");
    }
    Ok(())
}

fn fresh(a: &MdArgs, stop: StopFlag) -> Result<BatchSummary> {
    let (Some(model), Some(structure)) = (&a.model, &a.structure) else {
        bail!("--model and --structure are required unless --resume is given");
    };
    let systems = systems(a, structure)?;
    let split = traj_is_folder(a).then_some(systems.len());
    let (settings, io) = plan(a, split)?;
    refuse_device_list_npt(a, &settings)?;
    if let (Some(folder), Some(_)) = (&a.traj, split) {
        std::fs::create_dir_all(folder)
            .with_context(|| format!("--traj {}: creating the folder", folder.display()))?;
    }
    let _claim = claim(&io)?;
    let calc = a.run.calculator(model)?;
    let caller = caller(a, model, &calc)?;
    let forces = PainnForces::batch(&calc, &systems, settings.skin)?
        .with_list_site(a.dynamics.neighbor_list)?
        .with_graphs(settings.graphs(a.graphs)?)?;
    let atoms: usize = systems.iter().map(Structure::len).sum();
    eprintln!(
        "md: {} systems ({atoms} atoms), {} steps of {} fs, {}, on {:?}",
        systems.len(),
        settings.steps,
        settings.dt_fs,
        describe(&settings),
        calc.device()
    );
    let sim = BatchSimulation::new(forces, &systems, settings, caller)
        .with_context(|| format!("{}", structure.display()))?;
    run_with_progress(&mut sim.with_stop(stop))
}

fn resume(a: &MdArgs, path: &Path, stop: StopFlag) -> Result<BatchSummary> {
    if a.branch.is_some() {
        bail!("--branch continues single runs only; copy the batch run's folder instead");
    }
    let mut restart = BatchRestart::load(path)?;
    let model = recorded_model(a, &restart.caller, path)?;
    let mut io = OutputSet::new();
    io.input("--model", &model);
    let outs = &restart.settings.outputs;
    if let Some(log) = &outs.log {
        io.output("--log", log, Mode::Continue);
    }
    match (&outs.traj, outs.traj_split) {
        (Some(folder), true) => {
            for k in 0..restart.systems.len() {
                io.output("--traj", &crate::md::system_traj(folder, k), Mode::Continue);
            }
        }
        (Some(t), false) => {
            io.output("--traj", t, Mode::Continue);
        }
        (None, _) => {}
    }
    if let Some(r) = &outs.restart {
        io.output("--restart-file", r, Mode::Overwrite);
    }
    if let Some(p) = &a.summary_json {
        io.output("--summary-json", p, Mode::for_existing(a.overwrite, false));
    }
    let _claim = claim(&io)?;
    restart.check_current(path)?;
    let run = recorded_run(a, &restart.caller, &model, path)?;
    restart.settings.steps = resumed_steps(a, restart.step, restart.settings.steps)?;
    refuse_device_list_npt(a, &restart.settings)?;
    let calc = run.calculator(&model)?;
    let graphs = restart.settings.graphs(a.graphs)?;
    let forces = PainnForces::batch(&calc, &restart.active_systems(), restart.settings.skin)?
        .with_list_site(a.dynamics.neighbor_list)?
        .with_graphs(graphs)?;
    eprintln!(
        "md: resuming {} ({} systems) at step {} of {}",
        path.display(),
        restart.systems.len(),
        restart.step,
        restart.settings.steps
    );
    let sim = BatchSimulation::resume(forces, restart)?;
    run_with_progress(&mut sim.with_stop(stop))
}

fn run_with_progress(sim: &mut BatchSimulation<PainnForces>) -> Result<BatchSummary> {
    let s = sim.settings();
    let bar = progress_bar(s.steps, sim.step());
    let summary = sim.run(&mut |p: &BatchProgress| {
        bar.set_position(p.step);
        bar.set_message(format!(
            "{:.3e} atom-steps/s, {}/{} systems running, mean T {:.0} K",
            p.atom_steps_per_s, p.active, p.systems, p.temperature
        ));
    })?;
    bar.finish_and_clear();
    if let Some(why) = sim.forces().graph_failure() {
        eprintln!("note: CUDA graphs were given up, the run went on without them: {why}");
    }
    Ok(summary)
}

/// The closing summary for people: totals, the spread over systems, and every system that
/// did not finish stable (all rows are in --summary-json).
fn print_summary(s: &BatchSummary) {
    println!(
        "steps {}..{} of {} systems ({} atoms), {}",
        s.first_step,
        s.last_step,
        s.systems.len(),
        s.atoms,
        s.ensemble
    );
    println!(
        "speed: {:.3e} atom-steps/s, {:.1} steps/s, {:.3} ns/day per system ({:.1} s wall, {} \
         neighbour-list builds)",
        s.atom_steps_per_s, s.steps_per_s, s.ns_per_day, s.wall_s, s.neighbor_list_builds
    );
    let spread = |v: Vec<f64>| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (!v.is_empty()).then_some((lo, hi))
    };
    let drifts = s
        .systems
        .iter()
        .filter_map(|r| r.energy_drift_mev_per_atom_ps);
    if let Some((lo, hi)) = spread(drifts.collect()) {
        println!("energy drift over systems: {lo:+.4} .. {hi:+.4} meV/atom/ps");
    }
    let temps = s.systems.iter().filter_map(|r| r.temperature_mean);
    if let Some((lo, hi)) = spread(temps.collect()) {
        println!("mean temperature over systems: {lo:.1} .. {hi:.1} K");
    }
    println!(
        "stability (Fu et al. 2023, bonds within {} Å): {} of {} systems stable",
        s.bond_limit,
        s.stable_systems,
        s.systems.len()
    );
    for r in s.systems.iter().filter(|r| !r.stable) {
        let why = match &r.stop {
            StopReason::Unstable {
                step,
                atoms,
                deviation,
            } => format!(
                "unstable at step {step}: bond {}-{} deviated {deviation:.3} Å (frozen)",
                atoms.0, atoms.1
            ),
            StopReason::NonFinite { step, what } => format!("NaN at step {step}: {what} (frozen)"),
            _ => format!("a bond deviated {:.3} Å (kept going)", r.max_bond_deviation),
        };
        println!("  system {}: {why}", r.system);
    }
    if let StopReason::Interrupted { step, signal } = s.stop {
        println!(
            "INTERRUPTED by signal {signal} at step {step} (the restart file holds that step)"
        );
    }
}
