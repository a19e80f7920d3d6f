//! `mlff train`: fit a PaiNN student to labelled frames.

use super::{parse_dtype, DeviceArgs};
use crate::checkpoint;
use crate::device::{device_name, DeviceSpec};
use crate::fsutil::{Mode, OutputSet};
use crate::graph::Graphs;
use crate::interrupt::StopFlag;
use crate::model::PainnConfig;
use crate::profiler::{reset_peak, sample};
use crate::train::{
    split_by_trajectory, Dataset, ForceGradient, Metrics, Schedule, TrainConfig, Trainer,
};
use anyhow::{bail, Context, Result};
use candle_core::DType;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

#[derive(Args)]
pub struct TrainArgs {
    /// Training frames (extended XYZ with energy and forces); several files (e.g. one per
    /// molecule) are read as one set.
    #[arg(long, num_args = 1.., required = true)]
    train: Vec<PathBuf>,
    /// Validation frames (one or more files). Without them, --val-fraction of the training
    /// trajectories (info key `trajectory`) are held out, chosen with --seed; frames are never
    /// split individually.
    #[arg(long, num_args = 1..)]
    val: Vec<PathBuf>,
    #[arg(long, default_value_t = 0.1)]
    val_fraction: f64,
    /// Model config JSON (default: 128 features, 3 blocks, 20 Gaussians, 5 Å, H C N O).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Start from this checkpoint's weights and statistics (fine-tuning).
    #[arg(long)]
    init: Option<PathBuf>,
    /// Output folder: best.safetensors, last.safetensors, state.safetensors, log.jsonl.
    #[arg(short, long)]
    out: PathBuf,
    /// Continue the run in --out from its state.safetensors (same data and settings).
    #[arg(long)]
    resume: bool,
    /// Start a new run in an --out that holds one, replacing its files.
    #[arg(long, conflicts_with = "resume")]
    overwrite: bool,
    /// Training settings as JSON (the fields of the flags below); flags given override it.
    #[arg(long)]
    train_config: Option<PathBuf>,
    #[arg(long)]
    epochs: Option<usize>,
    #[arg(long)]
    batch_size: Option<usize>,
    #[arg(long)]
    lr: Option<f64>,
    #[arg(long)]
    lr_min: Option<f64>,
    #[arg(long)]
    warmup_steps: Option<u64>,
    /// cosine, or plateau (factor 0.5 after 10 validations without improvement).
    #[arg(long)]
    schedule: Option<String>,
    #[arg(long)]
    weight_decay: Option<f64>,
    #[arg(long)]
    energy_weight: Option<f64>,
    #[arg(long)]
    force_weight: Option<f64>,
    /// Weight of the mean squared stress error ((eV/Å³)²) over frames with `stress` labels
    /// (as `teachers/label.py` writes for periodic cells); with a force weight the fused or
    /// directional gradient takes it (copies displaced along the force error are also strained
    /// along the stress error; not in CUDA graphs or on several devices), else double-backward
    /// (exact, slower, about 1 MB of memory per edge); BENCHMARKS.md, "Training throughput".
    #[arg(long)]
    stress_weight: Option<f64>,
    /// Weight of the mean squared Hessian-vector-product error ((eV/Å²)²) over frames with
    /// `hvp` labels (`teachers/label.py --hessian-vectors`); needs --force-gradient
    /// double-backward, which auto then picks.
    #[arg(long)]
    hessian_weight: Option<f64>,
    #[arg(long)]
    clip_grad_norm: Option<f64>,
    #[arg(long)]
    ema_decay: Option<f64>,
    #[arg(long)]
    seed: Option<u64>,
    /// Stop after this many epochs in a row without a better validation loss (0: never).
    #[arg(long)]
    patience: Option<usize>,
    /// Validate (and save the checkpoints, the state and a log line) every K epochs; the last
    /// epoch always is.
    #[arg(long)]
    val_every: Option<usize>,
    /// How the force loss is differentiated: fused (the energy gradient's central difference
    /// along the force error, the weight gradients from the fused kernels' adjoint: the most
    /// structures/s, BENCHMARKS.md, "Training throughput"), directional (the same through
    /// candle's autograd), double-backward (exact, autograd), or auto (default: fused; with an
    /// H·v term, or stress without a force weight, double-backward).
    #[arg(long)]
    force_gradient: Option<ForceGradient>,
    /// Stop after the epoch during which this many minutes of training have passed (the
    /// checkpoints and state are saved; --resume continues).
    #[arg(long, allow_negative_numbers = true, value_parser = parse_minutes)]
    max_minutes: Option<f64>,
    /// auto: replay each training step as one CUDA graph where possible (a CUDA device and
    /// --force-gradient fused; one capture per batch shape, up to 8); on: an error where
    /// impossible; off: launch every kernel.
    #[arg(long, default_value = "auto")]
    graphs: Graphs,
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    dtype: DType,
    /// The ops of the autograd graph that training differentiates (the same maths): autograd
    /// (our gather/scatter ops), fused (the differentiable fused message op) or stock.
    #[arg(long, alias = "ops", default_value = "autograd")]
    backend: crate::model::Backend,
    #[command(flatten)]
    tuning: super::TuningArgs,
    #[command(flatten)]
    device: DeviceArgs,
    /// Train data-parallel on several GPUs: cuda:0,cuda:1,... or `all` (every visible one).
    /// Each batch is split between them, with the one-GPU results of that batch (up to the
    /// order of f32 sums); --batch-size is the whole batch. Needs a build with the `nccl`
    /// feature and --force-gradient fused.
    #[arg(long, value_delimiter = ',', conflicts_with = "device")]
    devices: Vec<String>,
}

/// The devices of --devices, opened, or --device's alone.
fn open_devices(a: &TrainArgs) -> Result<Vec<candle_core::Device>> {
    if a.devices.is_empty() {
        return Ok(vec![a.device.open()?]);
    }
    let specs: Vec<DeviceSpec> = match a.devices.as_slice() {
        [all] if all == "all" => {
            let n = crate::device::cuda_device_count();
            if n == 0 {
                bail!("--devices all: this machine (or build) shows no CUDA device");
            }
            (0..n).map(DeviceSpec::Cuda).collect()
        }
        list => list
            .iter()
            .map(|s| match s.parse::<DeviceSpec>() {
                Ok(spec @ DeviceSpec::Cuda(_)) => Ok(spec),
                Ok(_) => bail!("--devices takes CUDA devices (cuda:N) or `all`, not `{s}`"),
                Err(e) => bail!("--devices: {e}"),
            })
            .collect::<Result<_>>()?,
    };
    let mut seen = std::collections::BTreeSet::new();
    for spec in &specs {
        if !seen.insert(spec.to_string()) {
            bail!("--devices names {spec} twice");
        }
    }
    specs
        .into_iter()
        .map(|spec| Ok(crate::device::select(spec)?.device))
        .collect()
}

fn train_config(a: &TrainArgs) -> Result<TrainConfig> {
    let mut c = match &a.train_config {
        Some(p) => serde_json::from_str(
            &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        )
        .with_context(|| format!("{}: invalid training config", p.display()))?,
        None => TrainConfig::default(),
    };
    macro_rules! over {
        ($($f:ident),*) => { $( if let Some(v) = a.$f { c.$f = v; } )* };
    }
    over!(
        epochs,
        batch_size,
        lr,
        lr_min,
        warmup_steps,
        weight_decay,
        energy_weight,
        force_weight,
        stress_weight,
        hessian_weight,
        clip_grad_norm,
        ema_decay,
        seed,
        force_gradient,
        patience,
        val_every
    );
    if let Some(s) = &a.schedule {
        c.schedule = match s.as_str() {
            "cosine" => Schedule::Cosine,
            "plateau" => Schedule::Plateau {
                factor: 0.5,
                patience: 10,
            },
            _ => bail!("unknown schedule `{s}` (cosine or plateau)"),
        };
    }
    c.validate()?;
    Ok(c)
}

/// `mlff train` on a thread of its own. Candle reads CANDLE_GRAD_DO_NOT_DETACH once per thread,
/// at its first backward pass; a caller that trained on this thread before (`mlff distill`
/// runs `train` in its own process, committee after committee) would keep that first answer,
/// and a stress term after it would find its forces detached.
pub fn run(a: TrainArgs) -> Result<ExitCode> {
    // The main thread's stack: candle's backward walks the graph recursively.
    std::thread::Builder::new()
        .name("mlff-train".into())
        .stack_size(8 << 20)
        .spawn(move || train(a))
        .context("starting the training thread")?
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

fn train(a: TrainArgs) -> Result<ExitCode> {
    let cfg = train_config(&a)?;
    let init = a.init.as_deref().map(checkpoint::load).transpose()?;
    let model_cfg = match (&a.config, &init) {
        (Some(_), Some(_)) => {
            bail!("give --config or --init, not both (--init carries its config)")
        }
        (Some(p), None) => PainnConfig::from_file(p)?,
        (None, Some(ck)) => ck.config.clone(),
        (None, None) => PainnConfig::default(),
    };
    if let Some(note) = model_cfg.fused_note() {
        eprintln!("note: {note}");
    }
    let train_ds = Dataset::load_all(&a.train)?;
    let (train_ds, val_ds, split) = if a.val.is_empty() {
        let (t, v) = split_by_trajectory(&train_ds, a.val_fraction, cfg.seed)?;
        let split = format!(
            "{} of the trajectories of the training files held out (seed {})",
            a.val_fraction, cfg.seed
        );
        (t, v, split)
    } else {
        let v = Dataset::load_all(&a.val)?;
        let split = format!("validation files {}", v.describe());
        (train_ds, v, split)
    };
    let mut devices = open_devices(&a)?;
    let dev = devices.remove(0);
    if cfg.gradient_mode(&dev) == ForceGradient::DoubleBackward
        && cfg.force_weight + cfg.stress_weight + cfg.hessian_weight > 0.0
    {
        // The double backward needs candle to keep the graph of the first backward; it reads
        // this once per thread, so set it before any backward runs (the directional gradient
        // needs no second-order graph, and keeping one costs memory).
        std::env::set_var("CANDLE_GRAD_DO_NOT_DETACH", "1");
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let state_path = a.out.join("state.safetensors");
    let log_path = a.out.join("log.jsonl");
    if !a.resume && !a.overwrite && (state_path.exists() || log_path.exists()) {
        bail!(
            "{} already holds a training run: pass --resume to continue it, --overwrite to \
             start over, or choose another --out",
            a.out.display()
        );
    }
    let _claim = claim_outputs(&a)?;
    let stop = StopFlag::on_signals().context("installing the SIGINT/SIGTERM handlers")?;
    let mut t = Trainer::new(
        &model_cfg,
        &cfg,
        &train_ds,
        &val_ds,
        &dev,
        a.dtype,
        init.as_ref(),
    )?
    .with_backend(a.backend)
    .with_tuning(a.tuning.load()?)
    .with_graphs(a.graphs)
    .with_stop(stop);
    if a.resume {
        t.load_state(&state_path)?;
        eprintln!("resuming at epoch {} (step {})", t.epoch, t.step());
    }
    // The other ranks start from the state the trainer has now (resumed or fresh).
    // Every device's memory is watched; the log gives the largest peak.
    let watched: Vec<candle_core::Device> = std::iter::once(dev.clone())
        .chain(devices.iter().cloned())
        .collect();
    let mut t = t.with_replicas(devices)?;
    let on = match t.ranks() {
        1 => device_name(&dev),
        n => format!("{n} devices ({} first)", device_name(&dev)),
    };
    eprintln!(
        "training on {} frames, validating on {} ({split}); {} on {on}",
        t.n_train(),
        val_ds.frames.len(),
        if a.dtype == DType::F64 { "f64" } else { "f32" },
    );
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(a.resume)
        .truncate(!a.resume)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let provenance = |t: &Trainer, best: &Metrics| {
        serde_json::json!({
            "created_by": format!("mlff {} train", env!("CARGO_PKG_VERSION")),
            "git_commit": env!("MLFF_GIT_COMMIT"),
            "trained": true,
            "train_data": {"files": train_ds.sources, "frames": t.n_train()},
            "validation": {"how": split, "files": val_ds.sources, "frames": val_ds.frames.len()},
            "teachers": train_ds.info_values("teacher"),
            "train_config": cfg,
            "init": a.init,
            // Fine-tuning keeps the lineage: how the starting weights were made.
            "init_provenance": init.as_ref().map(|ck| &ck.provenance),
            "epochs": t.epoch,
            "steps": t.step(),
            "validation_metrics": best,
            "device": device_name(&dev),
            "devices": t.ranks(),
            "dtype": format!("{:?}", a.dtype),
            "backend": a.backend.name(),
            "force_gradient": cfg.gradient_mode(&dev).name(),
        })
    };
    let steps_per_epoch = t.n_train().div_ceil(cfg.batch_size) as u64;
    let run_started = Instant::now();
    let style = ProgressStyle::with_template(
        "epoch {prefix} [{bar:30}] {pos}/{len} {msg} ({per_sec}, eta {eta})",
    )
    .expect("valid template");
    let (mut speeds, mut peak) = (Vec::new(), 0.0f64);
    let mut since_best = 0usize;
    // The epoch that state.safetensors (what --resume continues from) holds.
    let mut saved_epoch = t.epoch;
    while t.epoch < cfg.epochs {
        let bar = ProgressBar::new(steps_per_epoch).with_style(style.clone());
        bar.set_prefix(format!("{}/{}", t.epoch + 1, cfg.epochs));
        watched.iter().for_each(reset_peak);
        let started = Instant::now();
        let trained = t.train_epoch(|_, loss| {
            bar.set_message(format!("loss {loss:.4e}"));
            bar.inc(1);
        });
        let train_loss = match trained {
            Err(crate::Error::Interrupted(signal)) => {
                bar.finish_and_clear();
                let last = a.out.join("last.safetensors");
                // Not validated: the metrics of a whole epoch do not describe these weights.
                let mut p = provenance(&t, &Metrics::default());
                p["validation_metrics"] = serde_json::Value::Null;
                p["interrupted"] = json!({"signal": signal, "step": t.step()});
                t.save_checkpoint(&last, &p)?;
                eprintln!(
                    "stopped by signal {signal} in epoch {} at step {}: {} holds the weights \
                     of this step; {} (what --resume continues from) the end of epoch {}",
                    t.epoch + 1,
                    t.step(),
                    last.display(),
                    state_path.display(),
                    saved_epoch
                );
                return Ok(ExitCode::from(128 + signal as u8));
            }
            other => other?,
        };
        let train_s = started.elapsed().as_secs_f64();
        speeds.push(t.n_train() as f64 / train_s);
        peak = peak.max(peak_mb(&watched));
        bar.finish_and_clear();
        let time_up = a
            .max_minutes
            .is_some_and(|limit| run_started.elapsed().as_secs_f64() > 60.0 * limit);
        if !(t.epoch.is_multiple_of(cfg.val_every) || t.epoch >= cfg.epochs || time_up) {
            continue;
        }
        let m = t.validate()?;
        t.schedule.observe(m.loss);
        let improved = m.loss < t.best_val_loss;
        if improved {
            t.best_val_loss = m.loss;
            t.save_checkpoint(&a.out.join("best.safetensors"), &provenance(&t, &m))?;
        }
        t.save_checkpoint(&a.out.join("last.safetensors"), &provenance(&t, &m))?;
        t.save_state(&state_path)?;
        let since_validation = t.epoch - saved_epoch;
        saved_epoch = t.epoch;
        let line = serde_json::json!({
            "epoch": t.epoch, "step": t.step(), "lr": t.schedule.at(t.step()),
            "train_loss": train_loss, "val_loss": m.loss, "val_energy_mae": m.energy_mae,
            "val_energy_per_atom_mae": m.energy_per_atom_mae, "val_force_mae": m.force_mae,
            "val_stress_mae": m.stress_mae, "val_hvp_mae": m.hvp_mae,
            "epoch_train_s": train_s, "structures_per_s": t.n_train() as f64 / train_s,
            "elapsed_s": run_started.elapsed().as_secs_f64(),
            "best": improved,
            // The device's allocator pool on CUDA (the largest, with --devices), the
            // process's resident set on the CPU.
            "memory_peak_mb": peak_mb(&watched),
            "devices": t.ranks(),
        });
        writeln!(log, "{line}").with_context(|| format!("writing {}", log_path.display()))?;
        // Stress MAE in GPa (1 eV/Å³ = 160.2 GPa) where the loss has a stress term.
        let stress = (m.stress_mae)
            .map(|x| format!("  σ MAE {:.3} GPa", x * crate::units::BAR_PER_EV_A3 * 1e-4))
            .unwrap_or_default();
        let hvp = (m.hvp_mae)
            .map(|x| format!("  H·v MAE {x:.3} eV/Å²"))
            .unwrap_or_default();
        eprintln!(
            "epoch {:>4}: train loss {train_loss:.4e}  val loss {:.4e}  E MAE {:.2} meV/atom  F MAE {:.1} meV/Å{stress}{hvp}  {:.1} structures/s{}",
            t.epoch,
            m.loss,
            m.energy_per_atom_mae * 1e3,
            m.force_mae * 1e3,
            t.n_train() as f64 / train_s,
            if improved { "  (best)" } else { "" }
        );
        since_best = if improved {
            0
        } else {
            since_best + since_validation
        };
        if cfg.patience > 0 && since_best >= cfg.patience && t.epoch < cfg.epochs {
            eprintln!(
                "stopping after epoch {}: {since_best} epochs without a better validation \
                 loss (patience {})",
                t.epoch, cfg.patience
            );
            break;
        }
        if time_up && t.epoch < cfg.epochs {
            eprintln!(
                "stopping after epoch {}: --max-minutes {} reached (--resume continues)",
                t.epoch,
                a.max_minutes.unwrap_or_default()
            );
            break;
        }
    }
    if !speeds.is_empty() {
        speeds.sort_by(f64::total_cmp);
        eprintln!(
            "{} epochs this run: median {:.1} structures/s, peak memory {:.0} MB ({})",
            speeds.len(),
            speeds[speeds.len() / 2],
            peak,
            if matches!(dev, candle_core::Device::Cpu) {
                "resident set"
            } else {
                "device pool"
            }
        );
    }
    eprintln!("done: {}", path_list(&a.out));
    Ok(ExitCode::SUCCESS)
}

/// Every input and the four files of --out, checked and locked before any is written.
fn claim_outputs(a: &TrainArgs) -> Result<crate::fsutil::Claim> {
    let mut io = OutputSet::new();
    for p in &a.train {
        io.input("--train", p);
    }
    for p in &a.val {
        io.input("--val", p);
    }
    for (flag, p) in [
        ("--config", &a.config),
        ("--init", &a.init),
        ("--train-config", &a.train_config),
        ("--tuning", &a.tuning.tuning),
    ] {
        if let Some(p) = p {
            io.input(flag, p);
        }
    }
    let (kept, replaced) = match (a.resume, a.overwrite) {
        (true, _) => (Mode::Continue, Mode::Overwrite),
        (false, true) => (Mode::Overwrite, Mode::Overwrite),
        (false, false) => (Mode::Create, Mode::Create),
    };
    for (name, mode) in [
        ("state.safetensors", kept),
        ("log.jsonl", kept),
        ("best.safetensors", replaced),
        ("last.safetensors", replaced),
    ] {
        io.output("--out", &a.out.join(name), mode);
    }
    super::claim(&io)
}

fn path_list(out: &Path) -> String {
    [
        "best.safetensors",
        "last.safetensors",
        "state.safetensors",
        "log.jsonl",
    ]
    .map(|f| out.join(f).display().to_string())
    .join(", ")
}

/// Peak memory since the last `reset_peak`, MB, the largest of `devs`: on CUDA a device's
/// allocator pool and its replayed graphs (high-water marks), the process's resident set on
/// the CPU.
fn peak_mb(devs: &[candle_core::Device]) -> f64 {
    devs.iter()
        .map(|dev| {
            let s = sample(dev, 0);
            s.peak_bytes().unwrap_or(0) as f64 / 1e6
        })
        .fold(0.0, f64::max)
}

/// `--max-minutes`: a finite number of minutes, zero or more.
fn parse_minutes(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(m) if m.is_finite() && m >= 0.0 => Ok(m),
        _ => Err(format!("`{s}` is not a number of minutes (0 or more)")),
    }
}
