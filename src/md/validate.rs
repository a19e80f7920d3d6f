//! The MD stability validation (`mlff validate-md`): every system × model/code-path variant gets
//! an NVE run (judged over several windows, e.g. its first 1,000 and 10,000 steps) and an NVT
//! run, with logs, trajectories, a markdown + JSON report and an E_tot(t) plot per system.
//! [`window`] (re-exported here) lives in `md::window`, below the driver that also uses it.

use super::analysis::BOND_DEVIATION_LIMIT;
use super::batch::{system_traj, BatchSimulation};
use super::forces::{ListSite, PainnForces};
use super::integrator::Ensemble;
use super::output::{write_log, AppendFile, LogRecord};
use super::run::Simulation;
use super::settings::{MdOutputs, MdSettings};
use super::summary::{MdSummary, StopReason};
pub use super::window::{window, Window};
use crate::calculator::PainnCalculator;
use crate::error::{Error, Result};
use crate::model::Backend;
use crate::plot::{lines_png, Line};
use crate::structure::Structure;
use candle_core::Device;
use serde::Serialize;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// What the validation runs.
#[derive(Clone, Debug, Serialize)]
pub struct SuiteSettings {
    /// NVE windows in steps; the longest is run once and every window judged from its log.
    pub nve_windows: Vec<u64>,
    /// NVT run length (0: none).
    pub nvt_steps: u64,
    pub dt_fs: f64,
    pub temperature: f64,
    /// Langevin friction, 1/ps.
    pub friction: f64,
    pub seed: u64,
    pub skin: f64,
    /// Where each run builds its neighbour list.
    pub neighbor_list: ListSite,
    pub log_every: u64,
    pub traj_every: u64,
    /// CUDA graphs for the force calls where wanted (a run that replayed them is labelled
    /// `+graph`; one that `auto` left op by op is not).
    pub graphs: crate::graph::Graphs,
}

/// Builds the variants under test (label, calculator) on a worker's device.
pub type VariantFactory<'a> = dyn Fn(&Device) -> Result<Vec<(String, PainnCalculator)>> + Sync + 'a;

/// One run of the suite.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    pub system: String,
    pub variant: String,
    pub ensemble: String,
    pub atoms: usize,
    pub summary: MdSummary,
    pub windows: Vec<Window>,
    pub log: PathBuf,
    #[serde(skip)]
    pub records: Vec<LogRecord>,
}

/// Runs every system with every variant; logs and trajectories go under `out/runs/`. One
/// worker thread per device (e.g. several CUDA streams of one GPU: feature splits are
/// launch-bound, so they share a GPU well), each taking the next system. `progress` hears each
/// finished run. Reports come back in system, variant, ensemble order whatever the timing.
pub fn run_suite(
    devices: &[Device],
    make_variants: &VariantFactory,
    systems: &[(String, Structure)],
    s: &SuiteSettings,
    out: &Path,
    progress: &(dyn Fn(&RunReport) + Sync),
) -> Result<Vec<RunReport>> {
    let runs_dir = out.join("runs");
    std::fs::create_dir_all(&runs_dir).map_err(|source| Error::Io {
        path: runs_dir.clone(),
        cause: source,
    })?;
    let next = AtomicUsize::new(0);
    let done = Mutex::new(Vec::new());
    let worker = |dev: &Device| -> Result<()> {
        let variants = make_variants(dev)?;
        loop {
            let k = next.fetch_add(1, Ordering::SeqCst);
            let Some((name, structure)) = systems.get(k) else {
                return Ok(());
            };
            for (v, (label, calc)) in variants.iter().enumerate() {
                for (e, report) in run_one(name, structure, label, calc, s, &runs_dir)?
                    .into_iter()
                    .enumerate()
                {
                    progress(&report);
                    done.lock()
                        .map_err(|_| Error::Md("a validation worker panicked".into()))?
                        .push(((k, v, e), report));
                }
            }
        }
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = devices.iter().map(|d| scope.spawn(|| worker(d))).collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Md("a validation worker panicked".into())))
            })
            .collect::<Result<Vec<()>>>()
    })?;
    let mut done = done
        .into_inner()
        .map_err(|_| Error::Md("a validation worker panicked".into()))?;
    done.sort_by_key(|(key, _)| *key);
    Ok(done.into_iter().map(|(_, r)| r).collect())
}

/// [`run_suite`] with every system in one batch run per variant and ensemble
/// ([`BatchSimulation`], on the first device; each system with the suite's seed, as its own
/// run has): the same runs, files and reports, the speed figures the batch's.
pub fn run_suite_batched(
    devices: &[Device],
    make_variants: &VariantFactory,
    systems: &[(String, Structure)],
    s: &SuiteSettings,
    out: &Path,
    progress: &(dyn Fn(&RunReport) + Sync),
) -> Result<Vec<RunReport>> {
    let dev = devices
        .first()
        .ok_or_else(|| Error::Md("the validation needs a device".into()))?;
    let runs_dir = out.join("runs");
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |cause| Error::Io { path, cause }
    };
    std::fs::create_dir_all(&runs_dir).map_err(io(&runs_dir))?;
    let structures: Vec<Structure> = systems.iter().map(|(_, st)| st.clone()).collect();
    let seeds = vec![s.seed; systems.len()];
    let mut done = Vec::new();
    for (v, (label, calc)) in make_variants(dev)?.iter().enumerate() {
        let (graphs, plain, label) = graphs_and_label(calc, label, s)?;
        for (e, (ensemble, steps)) in plan(s).into_iter().enumerate() {
            // The batch writes its log and trajectories here, then each system's go to the
            // names its own run would give them.
            let scratch = runs_dir.join(format!(".batch-{}-{}", slug(&label), ensemble.name()));
            std::fs::create_dir_all(&scratch).map_err(io(&scratch))?;
            let traj = (s.traj_every > 0).then(|| scratch.clone());
            let log = Some(scratch.join("log.jsonl"));
            let settings = run_settings(s, ensemble, steps, log, traj, true);
            let forces = PainnForces::batch(calc, &structures, s.skin)?
                .with_list_site(s.neighbor_list)?
                .with_graphs(graphs)?;
            let mut sim = BatchSimulation::with_seeds(
                forces,
                &structures,
                &seeds,
                settings,
                serde_json::Value::Null,
            )
            .map_err(|e| Error::Md(format!("batch with {label}: {e}")))?;
            let summary = sim.run(&mut |_| {})?;
            let variant = match sim.forces().graph_captures() {
                0 => &plain,
                _ => &label,
            };
            for (k, (name, structure)) in systems.iter().enumerate() {
                let stem = format!("{}_{}_{}", name, slug(variant), ensemble.name());
                let log = runs_dir.join(format!("{stem}.jsonl"));
                let mut file = AppendFile::create(&log)?;
                for r in sim.records(k) {
                    write_log(&mut file, r)?;
                }
                let traj = system_traj(&scratch, k);
                if traj.exists() {
                    let to = runs_dir.join(format!("{stem}.extxyz"));
                    std::fs::rename(&traj, &to).map_err(io(&to))?;
                }
                let run_summary = summary
                    .run_summary(k)
                    .ok_or_else(|| Error::Md(format!("the batch summary has no system {k}")))?;
                let records = sim.records(k).to_vec();
                let run = (ensemble, steps);
                let r = report(name, structure, variant, run, run_summary, records, log, s);
                progress(&r);
                done.push(((k, v, e), r));
            }
            drop(sim); // closes the batch's files
            std::fs::remove_dir_all(&scratch).map_err(io(&scratch))?;
        }
    }
    done.sort_by_key(|(key, _)| *key);
    Ok(done.into_iter().map(|(_, r)| r).collect())
}

/// The NVE and NVT runs of one system with one variant.
fn run_one(
    name: &str,
    structure: &Structure,
    label: &str,
    calc: &PainnCalculator,
    s: &SuiteSettings,
    runs_dir: &Path,
) -> Result<Vec<RunReport>> {
    let (graphs, plain, label) = graphs_and_label(calc, label, s)?;
    let label = &label;
    let mut reports = Vec::new();
    for (ensemble, steps) in plan(s) {
        let stem = format!("{}_{}_{}", name, slug(label), ensemble.name());
        let log = runs_dir.join(format!("{stem}.jsonl"));
        let traj = (s.traj_every > 0).then(|| runs_dir.join(format!("{stem}.extxyz")));
        let settings = run_settings(s, ensemble, steps, Some(log.clone()), traj, false);
        let forces = PainnForces::new(calc, structure, s.skin)?
            .with_list_site(s.neighbor_list)?
            .with_graphs(graphs)?;
        let mut sim = Simulation::new(forces, structure, settings, serde_json::Value::Null)
            .map_err(|e| Error::Md(format!("{name} with {label}: {e}")))?;
        let summary = sim.run(&mut |_| {})?;
        let records = sim.records().to_vec();
        let captures = sim.forces().graph_captures();
        drop(sim); // closes the run's files
                   // `auto` captures nothing where replays do not pay (one-kernel molecules, large
                   // lists): such a run is reported, and its files named, as the plain path it was.
        let (variant, log) = match captures {
            0 if plain != *label => {
                let plain_stem = format!("{}_{}_{}", name, slug(&plain), ensemble.name());
                (
                    plain.as_str(),
                    rename_run_files(runs_dir, &stem, &plain_stem)?,
                )
            }
            _ => (label.as_str(), log),
        };
        let run = (ensemble, steps);
        reports.push(report(
            name, structure, variant, run, summary, records, log, s,
        ));
    }
    Ok(reports)
}

/// The graphs a variant runs with, and its label without and with them (`+graph`).
fn graphs_and_label(
    calc: &PainnCalculator,
    label: &str,
    s: &SuiteSettings,
) -> Result<(crate::graph::Graphs, String, String)> {
    // Graphs are a way to run the fused path; the other paths run as they are.
    let graphs = match calc.model().backend() == Backend::Fused && s.graphs.wanted(calc)? {
        true => s.graphs,
        false => crate::graph::Graphs::Off,
    };
    let with = match graphs != crate::graph::Graphs::Off {
        true => format!("{label}+graph"),
        false => label.to_string(),
    };
    Ok((graphs, label.to_string(), with))
}

/// The runs of each system and variant: NVE over the longest window, then NVT.
fn plan(s: &SuiteSettings) -> Vec<(Ensemble, u64)> {
    let nve_steps = s.nve_windows.iter().copied().max().unwrap_or(0);
    let nvt = Ensemble::Nvt {
        temperature: s.temperature,
        friction: s.friction,
    };
    [(Ensemble::Nve, nve_steps), (nvt, s.nvt_steps)]
        .into_iter()
        .filter(|p| p.1 > 0)
        .collect()
}

fn run_settings(
    s: &SuiteSettings,
    ensemble: Ensemble,
    steps: u64,
    log: Option<PathBuf>,
    traj: Option<PathBuf>,
    traj_split: bool,
) -> MdSettings {
    MdSettings {
        dt_fs: s.dt_fs,
        steps,
        ensemble,
        init_temperature: s.temperature,
        seed: s.seed,
        skin: s.skin,
        log_every: s.log_every,
        traj_every: s.traj_every,
        stop_when_unstable: true,
        outputs: MdOutputs {
            traj,
            log,
            restart: None,
            append: false,
            traj_split,
        },
        ..Default::default()
    }
}

/// One run's report, its windows judged from its log.
#[allow(clippy::too_many_arguments)]
fn report(
    name: &str,
    structure: &Structure,
    variant: &str,
    (ensemble, steps): (Ensemble, u64),
    summary: MdSummary,
    records: Vec<LogRecord>,
    log: PathBuf,
    s: &SuiteSettings,
) -> RunReport {
    let nonfinite_at = match &summary.stop {
        StopReason::NonFinite { step, .. } => Some(*step),
        _ => None,
    };
    let conserved = ensemble == Ensemble::Nve;
    let lengths = if conserved {
        s.nve_windows.clone()
    } else {
        vec![steps]
    };
    let windows = lengths
        .iter()
        .map(|&w| window(&records, structure.len(), w, conserved, nonfinite_at))
        .collect();
    RunReport {
        system: name.to_string(),
        variant: variant.to_string(),
        ensemble: ensemble.name().into(),
        atoms: structure.len(),
        summary,
        windows,
        log,
        records,
    }
}

/// Renames a run's log (`.jsonl`) and trajectory (`.extxyz`, if written) in `dir` from stem
/// `from` to stem `to`; returns the log's new path.
fn rename_run_files(dir: &Path, from: &str, to: &str) -> Result<std::path::PathBuf> {
    for ext in ["jsonl", "extxyz"] {
        let src = dir.join(format!("{from}.{ext}"));
        if src.exists() {
            let dst = dir.join(format!("{to}.{ext}"));
            std::fs::rename(&src, &dst).map_err(|source| Error::Io {
                path: dst,
                cause: source,
            })?;
        }
    }
    Ok(dir.join(format!("{to}.jsonl")))
}

/// A file-name-safe version of a label.
fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("–".into(), |x| format!("{x:.digits$}"))
}

/// The report for people: one table row per run and window.
pub fn markdown(reports: &[RunReport], s: &SuiteSettings, header: &str) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# MD stability validation\n\n{header}\n");
    let _ = writeln!(
        md,
        "NVE from Maxwell-Boltzmann velocities at {} K (time step {} fs), judged over its first \
         {:?} steps; NVT: BAOAB Langevin at {} K, friction {}/ps, {} steps. Stable = no bond \
         (1.2 × sum of covalent radii at the start) ever {} Å off its starting length \
         (Fu et al. 2023) and no NaN; runs stop at the first violation. Drift = least-squares \
         slope of E_tot(t).\n",
        s.temperature,
        s.dt_fs,
        s.nve_windows,
        s.temperature,
        s.friction,
        s.nvt_steps,
        BOND_DEVIATION_LIMIT
    );
    md.push_str(
        "| system | atoms | variant | run | steps | stable | max bond dev Å | drift meV/atom/ps | \
         E_tot std meV/atom | T mean K | T std K | steps/s |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in reports {
        for w in &r.windows {
            let stable = match (w.stable, w.first_unstable_step) {
                (true, _) => "yes".to_string(),
                (false, Some(k)) => format!("**no** (step {k})"),
                (false, None) => "**no** (NaN)".to_string(),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {}/{} | {} | {:.3} | {} | {} | {} | {} | {:.1} |",
                r.system,
                r.atoms,
                r.variant,
                r.ensemble.to_uppercase(),
                w.reached_step,
                w.steps,
                stable,
                w.max_bond_deviation,
                opt(w.energy_drift_mev_per_atom_ps, 4),
                opt(w.energy_std_mev_per_atom, 4),
                opt(w.temperature_mean, 1),
                opt(w.temperature_std, 1),
                r.summary.steps_per_s
            );
        }
    }
    md
}

/// One PNG per system: E_tot(t) − E_tot(0) per atom of every NVE run (one line per variant).
pub fn plot_energies(reports: &[RunReport], out: &Path) -> Result<Vec<PathBuf>> {
    let mut systems: Vec<&str> = reports.iter().map(|r| r.system.as_str()).collect();
    systems.dedup();
    let mut written = Vec::new();
    for system in systems {
        let lines: Vec<Line> = reports
            .iter()
            .filter(|r| r.system == system && r.ensemble == "nve")
            .map(|r| {
                let e0 = r.records.first().map_or(0.0, |x| x.e_tot);
                Line {
                    label: r.variant.clone(),
                    points: (r.records.iter())
                        .map(|x| (x.time_fs / 1000.0, 1000.0 * (x.e_tot - e0) / r.atoms as f64))
                        .collect(),
                }
            })
            .collect();
        let path = out.join(format!("etot_{system}.png"));
        lines_png(
            &path,
            &format!("{system}: NVE total energy"),
            "time (ps)",
            "E_tot - E_tot(0) (meV/atom)",
            &lines,
        )?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_files_move_to_the_path_that_ran() {
        let dir = tempfile::tempdir().unwrap();
        let from = "ethanol_m-fused-graph_nve";
        std::fs::write(dir.path().join(format!("{from}.jsonl")), "{}\n").unwrap();
        std::fs::write(dir.path().join(format!("{from}.extxyz")), "1\n\nH 0 0 0\n").unwrap();
        let log = rename_run_files(dir.path(), from, "ethanol_m-fused_nve").unwrap();
        assert_eq!(log, dir.path().join("ethanol_m-fused_nve.jsonl"));
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "{}\n");
        assert!(dir.path().join("ethanol_m-fused_nve.extxyz").exists());
        assert!(!dir.path().join(format!("{from}.jsonl")).exists());
        // Without a trajectory only the log moves.
        std::fs::write(dir.path().join("a.jsonl"), "").unwrap();
        rename_run_files(dir.path(), "a", "b").unwrap();
        assert!(dir.path().join("b.jsonl").exists() && !dir.path().join("b.extxyz").exists());
    }
}
