//! `mlff distill`: the active-learning loop from a teacher to a validated student
//! ([`crate::distill`]), each phase saved as it ends so that a stopped run continues with
//! `--resume`.

mod phases;
mod refine;
mod training;

use crate::distill::{DistillConfig, Phase, RunState};
use crate::fsutil::{write_atomic, write_json, OutputLock};
use crate::interrupt::StopFlag;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args)]
pub struct DistillArgs {
    /// Settings (JSON): teacher, seeds, temperatures, committee, training, sampling,
    /// selection, stop; docs/distill.md lists every field.
    #[arg(long, required_unless_present = "resume")]
    config: Option<PathBuf>,
    /// The run's folder: distill.json, state.json, report.md/json, iter-NNN/, data/,
    /// student.safetensors at the end.
    #[arg(short, long)]
    out: PathBuf,
    /// Continue the run in --out (its distill.json; the stop flags below may change it).
    #[arg(long, conflicts_with = "config")]
    resume: bool,
    /// Iterations after the first (overrides stop.max_iterations).
    #[arg(long)]
    max_iterations: Option<usize>,
    /// Committee disagreement on fresh student-MD frames (eV/Å) below which the loop ends.
    #[arg(long)]
    disagreement: Option<f64>,
    /// Labelled frames in all.
    #[arg(long)]
    max_frames: Option<usize>,
    /// Teacher time in all, hours.
    #[arg(long)]
    max_teacher_hours: Option<f64>,
    /// Training time in all, minutes.
    #[arg(long)]
    max_train_minutes: Option<f64>,
    /// End before the first phase of this name not yet done (teacher-md, sample, select,
    /// label, train, evaluate): `label` to have the teacher run elsewhere (`--resume
    /// --stop-before train` on a machine with the teacher, then `--resume` back here).
    #[arg(long, value_name = "PHASE", value_parser = parse_phase)]
    stop_before: Option<Phase>,
    #[command(flatten)]
    device: super::DeviceArgs,
    /// Also passed on to every `mlff train` and `mlff md` of the run.
    #[command(flatten)]
    tuning: super::TuningArgs,
}

/// The run's folder and settings, shared by the phases.
pub(super) struct Run {
    pub out: PathBuf,
    pub cfg: DistillConfig,
    /// `--device` as given, passed on to `mlff train` and `mlff md`.
    pub device: String,
    pub dev: candle_core::Device,
    /// `--tuning` as given (passed on with `--device`), and the tuning it makes.
    pub tuning_file: Option<PathBuf>,
    pub tuning: crate::Tuning,
    /// `--stop-before`.
    pub stop_before: Option<Phase>,
}

impl Run {
    pub fn iter_dir(&self, i: usize) -> PathBuf {
        self.out.join(format!("iter-{i:03}"))
    }
    pub fn student(&self, i: usize, k: usize) -> PathBuf {
        self.iter_dir(i)
            .join(format!("student-{k}"))
            .join("best.safetensors")
    }
    pub fn data(&self, name: &str) -> PathBuf {
        self.out.join("data").join(name)
    }
    /// `--device` and `--tuning` as this run was given them, for its `train` and `md`.
    pub fn device_flags(&self) -> Vec<String> {
        let mut flags = vec!["--device".to_string(), self.device.clone()];
        if let Some(t) = &self.tuning_file {
            flags.extend(["--tuning".into(), t.display().to_string()]);
        }
        flags
    }
}

pub fn run(a: DistillArgs) -> Result<ExitCode> {
    // Before anything is written: a bad --tuning must not leave a run half-started.
    let tuning = a.tuning.load()?;
    let cfg = match (&a.config, a.resume) {
        (Some(path), false) => fresh(path, &a.out)?,
        (None, true) => {
            let path = a.out.join("distill.json");
            if !path.exists() {
                bail!(
                    "{}: no distillation run to resume (no distill.json); start one with \
                     --config",
                    a.out.display()
                );
            }
            DistillConfig::from_file(&path)?
        }
        _ => bail!("give --config for a new run or --resume for the run in --out"),
    };
    let cfg = with_stop_flags(cfg, &a)?;
    let _lock = OutputLock::acquire("--out", &a.out.join("state.json"), "mlff distill")?;
    write_json(&a.out.join("distill.json"), &cfg)?;
    let run = Run {
        dev: a.device.open()?,
        device: a.device.device.to_string(),
        tuning_file: a.tuning.tuning.clone(),
        tuning,
        stop_before: a.stop_before,
        out: a.out.clone(),
        cfg,
    };
    let state_path = run.out.join("state.json");
    let mut state = RunState::load_or_new(&state_path)?;
    if a.resume {
        // A finished run may go on when the flags allow more.
        state.finished = None;
        eprintln!(
            "resuming {} after {} iteration(s)",
            run.out.display(),
            state.iterations.len()
        );
    }
    // Ctrl-C between or inside phases of our own ends the loop after the phase; the sub-commands
    // (train, md) answer it themselves and exit with 128 + the signal, which ends it too.
    let stop = StopFlag::on_signals().context("installing the SIGINT/SIGTERM handlers")?;
    let mut status = drive(&run, &mut state, &state_path, &stop);
    if matches!(status, Ok(c) if c == ExitCode::SUCCESS) && state.finished.is_some() {
        status = match stop.raised() {
            Some(signal) => Ok(interrupted(signal, &state_path)),
            None => refine::refine(&run, &mut state),
        };
        state.save(&state_path)?;
    }
    report(&run, &state)?;
    let code = status?;
    if state.finished.is_some() {
        finish(&run, &state)?;
    }
    Ok(code)
}

/// A run stopped by `signal`, said so; its exit status.
fn interrupted(signal: i32, state_path: &Path) -> ExitCode {
    eprintln!(
        "stopped by signal {signal}: {} holds every phase done; --resume continues",
        state_path.display()
    );
    ExitCode::from(128 + signal as u8)
}

/// The loop: iteration 0 (teacher MD), then student-sampled iterations until a stop holds.
fn drive(run: &Run, state: &mut RunState, state_path: &Path, stop: &StopFlag) -> Result<ExitCode> {
    let interrupted = |signal: i32| interrupted(signal, state_path);
    let mut i = 0;
    loop {
        let started = state
            .iterations
            .get(i)
            .is_some_and(|it| !it.done.is_empty());
        if i > 0 && !started {
            if let Some(why) = budget_spent(run, state, i) {
                state.finished = Some(why);
                state.save(state_path)?;
                return Ok(ExitCode::SUCCESS);
            }
        }
        let phases: &[Phase] = match i {
            0 => &[Phase::TeacherMd, Phase::Train, Phase::Evaluate],
            _ => &[
                Phase::Sample,
                Phase::Select,
                Phase::Label,
                Phase::Train,
                Phase::Evaluate,
            ],
        };
        for &phase in phases {
            if !state.iteration(i).is_done(phase) {
                if let Some(signal) = stop.raised() {
                    return Ok(interrupted(signal));
                }
                if run.stop_before == Some(phase) {
                    eprintln!(
                        "stopped before iteration {i}'s {phase:?} (--stop-before): {} holds \
                         every phase done; --resume continues",
                        state_path.display()
                    );
                    return Ok(ExitCode::SUCCESS);
                }
                eprintln!("== iteration {i}: {phase:?}");
                // A signal also reaches the teacher's processes, whose failure it explains.
                let code = match phases::run_phase(run, state, i, phase) {
                    Err(_) if stop.raised().is_some() => {
                        return Ok(interrupted(stop.raised().unwrap_or(2)));
                    }
                    other => other?,
                };
                if code != ExitCode::SUCCESS {
                    state.save(state_path)?;
                    return Ok(code);
                }
                state.iteration(i).done.push(phase);
                state.save(state_path)?;
                report(run, state)?;
            }
            // Checked on a resumed run too: a converged run stays converged unless
            // --disagreement is lowered.
            if phase == Phase::Select {
                if let Some(why) = converged(run, state, i) {
                    state.finished = Some(why);
                    state.save(state_path)?;
                    return Ok(ExitCode::SUCCESS);
                }
            }
        }
        i += 1;
    }
}

/// A fresh run: the config checked, the folder claimed, file seeds copied into it.
fn fresh(config: &Path, out: &Path) -> Result<DistillConfig> {
    let mut cfg = DistillConfig::from_file(config)?;
    for name in ["distill.json", "state.json"] {
        if out.join(name).exists() {
            bail!(
                "{} already holds a distillation run ({name}): pass --resume to continue it, \
                 or choose another --out",
                out.display()
            );
        }
    }
    let base = config.parent().unwrap_or(Path::new("."));
    // The student's config first: file seeds are checked against its elements.
    let (student, model_bytes) = match &cfg.model {
        Some(model) => {
            let src = if model.is_absolute() {
                model.clone()
            } else {
                base.join(model)
            };
            let bytes = std::fs::read(&src).with_context(|| {
                format!("{}: model: reading {}", config.display(), src.display())
            })?;
            let student = crate::model::PainnConfig::from_json(&String::from_utf8_lossy(&bytes))
                .with_context(|| format!("{}: model {}", config.display(), src.display()))?;
            (student, Some(bytes))
        }
        None => (crate::model::PainnConfig::default(), None),
    };
    let seeds = out.join("seeds");
    std::fs::create_dir_all(&seeds).with_context(|| format!("creating {}", seeds.display()))?;
    for s in &mut cfg.seeds {
        let Some(file) = &s.file else { continue };
        // Relative paths are the config file's; the run keeps its own copy.
        let src = if file.is_absolute() {
            file.clone()
        } else {
            base.join(file)
        };
        let bytes = std::fs::read(&src).with_context(|| {
            format!(
                "{}: seed `{}`: reading {}",
                config.display(),
                s.name,
                src.display()
            )
        })?;
        check_seed_elements(config, &s.name, &bytes, &student)?;
        let ext = src.extension().and_then(|e| e.to_str()).unwrap_or("xyz");
        let copy = PathBuf::from("seeds").join(format!("{}.{ext}", s.name));
        write_atomic(&out.join(&copy), &bytes)?;
        s.file = Some(copy);
    }
    if let Some(bytes) = model_bytes {
        write_atomic(&out.join("model.json"), &bytes)?;
        cfg.model = Some(PathBuf::from("model.json"));
    }
    Ok(cfg)
}

/// A file seed's elements the student cannot hold, found before the teacher runs for
/// nothing. A file this reader cannot parse is left to the teacher's reader.
fn check_seed_elements(
    config: &Path,
    seed: &str,
    bytes: &[u8],
    student: &crate::model::PainnConfig,
) -> Result<()> {
    let Ok(frames) = crate::io::parse_extxyz_bytes(bytes, Path::new(seed)) else {
        return Ok(());
    };
    let Some(first) = frames.first() else {
        return Ok(());
    };
    if let Err((_, z)) = student.species_of(&first.numbers) {
        bail!(
            "{}: seed `{seed}` holds {} (Z={z}), not among the student's elements {:?}: give \
             `model` a config whose `elements` include it",
            config.display(),
            crate::io::extxyz::symbol(z).unwrap_or("?"),
            student.elements
        );
    }
    Ok(())
}

fn parse_phase(s: &str) -> std::result::Result<Phase, String> {
    serde_json::from_value(serde_json::Value::String(s.into())).map_err(|_| {
        format!("unknown phase `{s}` (teacher-md, sample, select, label, train or evaluate)")
    })
}

fn with_stop_flags(mut cfg: DistillConfig, a: &DistillArgs) -> Result<DistillConfig> {
    let s = &mut cfg.stop;
    if let Some(v) = a.max_iterations {
        s.max_iterations = v;
    }
    if let Some(v) = a.disagreement {
        s.disagreement = v;
    }
    if a.max_frames.is_some() {
        s.max_frames = a.max_frames;
    }
    if a.max_teacher_hours.is_some() {
        s.max_teacher_hours = a.max_teacher_hours;
    }
    if a.max_train_minutes.is_some() {
        s.max_train_minutes = a.max_train_minutes;
    }
    cfg.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(cfg)
}

/// Why no further iteration may start, if a budget says so.
fn budget_spent(run: &Run, state: &RunState, i: usize) -> Option<String> {
    let s = &run.cfg.stop;
    let (frames, teacher_s, train_s) = state.totals();
    if i > s.max_iterations {
        return Some(format!("max_iterations ({}) reached", s.max_iterations));
    }
    if let Some(m) = s.max_frames.filter(|&m| frames >= m) {
        return Some(format!("max_frames: {frames} labelled frames >= {m}"));
    }
    if let Some(h) = s.max_teacher_hours.filter(|&h| teacher_s / 3600.0 >= h) {
        return Some(format!(
            "max_teacher_hours: {:.3} teacher hours >= {h}",
            teacher_s / 3600.0
        ));
    }
    if let Some(m) = s.max_train_minutes.filter(|&m| train_s / 60.0 >= m) {
        return Some(format!(
            "max_train_minutes: {:.1} training minutes >= {m}",
            train_s / 60.0
        ));
    }
    None
}

/// Whether the committee agrees on the fresh student-MD frames of iteration `i`, of every
/// molecule (the one it disputes most decides; runs recorded before the per-molecule means
/// read the mean over all).
fn converged(run: &Run, state: &RunState, i: usize) -> Option<String> {
    let it = state.iterations.get(i)?;
    let (what, d) = match &it.disagreement_md_worst {
        Some((molecule, d)) => (format!("{molecule}'s, the most disputed,"), *d),
        None => ("the".to_string(), it.disagreement_md_mean?),
    };
    (d < run.cfg.stop.disagreement).then(|| {
        format!(
            "converged: committee disagreement {:.2} meV/Å on {what} student-MD frames of \
             iteration {i} < stop.disagreement {:.2} meV/Å (the student is iteration {}'s)",
            d * 1e3,
            run.cfg.stop.disagreement * 1e3,
            i - 1
        )
    })
}

/// report.md, report.json and the error-against-budget plot.
fn report(run: &Run, state: &RunState) -> Result<()> {
    let md = crate::distill::markdown(state, &run.cfg.teacher.name);
    write_atomic(&run.out.join("report.md"), md.as_bytes())?;
    let json = serde_json::json!({"config": run.cfg, "state": state});
    write_json(&run.out.join("report.json"), &json)?;
    crate::distill::budget_plot(state, &run.out.join("error_vs_teacher_time.png"))?;
    Ok(())
}

/// The shipped student, copied to student.safetensors: the second stage's where it is asked
/// for (none until it is done), else student 0 of the last trained iteration.
fn finish(run: &Run, state: &RunState) -> Result<()> {
    let Some(last) = refine::last_trained(state) else {
        return Ok(());
    };
    let (src, which) = match (&run.cfg.refine, refine::done(run, state)) {
        (None, _) => (run.student(last, 0), format!("iteration {last}")),
        (Some(_), true) => (
            refine::dir(run).join("best.safetensors"),
            format!("second stage from iteration {last}"),
        ),
        (Some(_), false) => {
            eprintln!(
                "{}: the second stage is not done; --resume runs it",
                run.out.display()
            );
            return Ok(());
        }
    };
    let bytes = std::fs::read(&src).with_context(|| format!("reading {}", src.display()))?;
    let dst = run.out.join("student.safetensors");
    write_atomic(&dst, &bytes)?;
    eprintln!(
        "{}: {}; student {} ({which}), report {}",
        run.out.display(),
        state.finished.as_deref().unwrap_or("finished"),
        dst.display(),
        run.out.join("report.md").display()
    );
    Ok(())
}
