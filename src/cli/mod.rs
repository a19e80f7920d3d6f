//! Subcommands of `mlff`.

mod bench;
mod check;
mod distill;
mod eval;
mod info;
mod init_model;
mod md;
mod predict;
mod profile;
mod train;
mod validate_md;

use crate::device::{self, DeviceSpec};
use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "mlff",
    version,
    about = "Distilled PaiNN force fields: predict, inspect, benchmark"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Report the build, CPU and GPUs (name, compute capability, memory, CUDA versions).
    Check(check::CheckArgs),
    /// Show a checkpoint's config, elements, parameter count, units and provenance.
    Info(info::InfoArgs),
    /// Energies and forces for every frame of an extended-XYZ file.
    Predict(predict::PredictArgs),
    /// Write a randomly initialised (untrained) checkpoint from a config.
    InitModel(init_model::InitModelArgs),
    /// Time energy+forces on generated systems, comparing edge-op implementations.
    Bench(bench::BenchArgs),
    /// Accuracy against labelled frames: tables, JSON, force parity plot.
    Eval(eval::EvalArgs),
    /// Train a student on labelled frames (energies and forces).
    Train(Box<train::TrainArgs>),
    /// Molecular dynamics (NVE or Langevin NVT) with a drift and stability summary; exits
    /// with status 4 when the run went unstable or non-finite.
    Md(Box<md::MdArgs>),
    /// Distil a teacher into a validated student: teacher MD, then iterations of student
    /// sampling, committee selection, parallel teacher labelling and warm-started training
    /// until the committee agrees or a budget runs out; resumable; markdown + JSON report.
    Distill(Box<distill::DistillArgs>),
    /// Profile an MD trajectory: step latency distribution, phases, memory, hotspots,
    /// the profiler's overhead; markdown, JSON, PNG and a Chrome trace.
    Profile(Box<profile::ProfileArgs>),
    /// MD stability validation of the shipped systems (NVE and NVT), comparing models or code
    /// paths: markdown + JSON report and E_tot(t) plots.
    ValidateMd(Box<validate_md::ValidateMdArgs>),
}

/// `--device` shared by every command that computes.
#[derive(Args, Clone)]
pub struct DeviceArgs {
    /// cpu, cuda, cuda:N or auto (CUDA when available, else CPU with a note).
    #[arg(long, default_value = "auto")]
    pub device: DeviceSpec,
}

impl DeviceArgs {
    /// Opens the device, printing the fallback note (if any) on stderr.
    pub fn open(&self) -> Result<candle_core::Device> {
        let sel = device::select(self.device)?;
        if let Some(note) = sel.fallback_note {
            eprintln!("note: {note}");
        }
        Ok(sel.device)
    }
}

/// Integration settings shared by `mlff md` and `mlff validate-md`.
#[derive(Args, Clone)]
pub struct DynamicsArgs {
    /// Time step in fs.
    #[arg(long, default_value_t = 0.5)]
    pub dt: f64,
    /// Thermostat target in K (NVT), and the Maxwell-Boltzmann starting temperature.
    #[arg(long, default_value_t = 300.0)]
    pub temperature: f64,
    /// Langevin friction in 1/ps.
    #[arg(long, default_value_t = 10.0)]
    pub friction: f64,
    /// Seeds the starting velocities and the Langevin noise.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Verlet skin in Å: the neighbour list is rebuilt once an atom has moved half of it.
    #[arg(long, default_value_t = 1.0)]
    pub skin: f64,
    /// Where the Verlet neighbour list is built. auto: on a CUDA device wherever the cell
    /// allows (molecules; periodic widths above twice the cutoff + skin), so positions stay on
    /// the GPU; host: the host cell list (any cell); device: the device list, an error where
    /// the cell does not allow it. Both list the same edges.
    #[arg(long, default_value = "auto")]
    pub neighbor_list: crate::md::ListSite,
}

/// `--tuning` shared by every command that computes.
#[derive(Args, Clone, Default)]
pub struct TuningArgs {
    #[arg(long, value_name = "FILE", help = crate::tuning::HELP)]
    pub tuning: Option<std::path::PathBuf>,
}

impl TuningArgs {
    /// The tuning in force: defaults, the file, then the environment's pairs.
    pub fn load(&self) -> Result<crate::Tuning> {
        Ok(crate::Tuning::load(self.tuning.as_deref())?)
    }
}

/// How a checkpoint is run: `--dtype`, `--backend`, `--tuning`, `--device`.
#[derive(Args, Clone)]
pub struct ModelArgs {
    #[arg(long, default_value = "f32", value_parser = parse_dtype)]
    pub dtype: candle_core::DType,
    /// fused (fused kernels and an explicit force pass: the fastest), autograd (candle's
    /// backprop through our edge ops) or stock (candle's backprop and index_select/index_add).
    #[arg(long, alias = "ops", default_value = "fused")]
    pub backend: crate::model::Backend,
    #[command(flatten)]
    pub tuning: TuningArgs,
    #[command(flatten)]
    pub device: DeviceArgs,
}

impl ModelArgs {
    /// Opens the device and loads `model` onto it.
    pub fn calculator(&self, model: &std::path::Path) -> Result<crate::PainnCalculator> {
        let tuning = self.tuning.load()?;
        let dev = self.device.open()?;
        let calc = crate::PainnCalculator::from_checkpoint(model, &dev, self.dtype)?
            .with_backend(self.backend)
            .with_tuning(tuning);
        calc.check_ops()
            .map_err(|e| anyhow::anyhow!("{}: {e}", model.display()))?;
        Ok(calc)
    }
}

/// `--graphs` for commands that call the model on batch after batch (`predict`, `eval`).
#[derive(Args, Clone)]
pub struct BatchGraphArgs {
    /// auto: on a CUDA device with --backend fused, a batch shape (atoms, structures) seen a second
    /// time is captured as a CUDA graph and replayed from then on (up to 8 graphs kept;
    /// molecules whose eager call is one kernel, and lists of more than 32,768 edges, stay op
    /// by op); on: every batch, an error where graphs cannot run; off: never. The same
    /// energies and forces either way, to f32 rounding (atomic sums may add in another order).
    #[arg(long, default_value = "auto")]
    pub graphs: crate::graph::Graphs,
}

impl BatchGraphArgs {
    /// `calc` with graphs as asked.
    pub fn wrap<'a>(
        &self,
        calc: &'a crate::PainnCalculator,
    ) -> Result<crate::graph::GraphCalculator<'a>> {
        Ok(crate::graph::GraphCalculator::new(calc, self.graphs)?)
    }

    /// One line on stderr about the graphs used, if any were tried.
    pub fn report(calc: &crate::graph::GraphCalculator) {
        let s = calc.stats();
        if s.captures > 0 {
            eprintln!(
                "CUDA graphs: {} captured, {} batches replayed, {} run op by op, {} evicted",
                s.captures, s.replays, s.eager, s.evictions
            );
        }
        if let Some(why) = calc.failure() {
            eprintln!("note: CUDA graphs were given up, the batches ran op by op: {why}");
        }
    }
}

/// Prints clap's message (help, version, or a bad flag) as clap would and returns its status.
fn report_clap(e: clap::Error) -> ExitCode {
    let _ = e.print();
    ExitCode::from(e.exit_code() as u8)
}

/// Claims a command's outputs ([`OutputSet::claim`]) for this command line, with a note per
/// temporary file of a killed run removed on the way.
pub fn claim(io: &crate::fsutil::OutputSet) -> Result<crate::fsutil::Claim> {
    let holder = std::env::args().collect::<Vec<_>>().join(" ");
    let claim = io.claim(&holder)?;
    for p in &claim.removed_temps {
        eprintln!(
            "note: removed {}, left by a run that was killed",
            p.display()
        );
    }
    Ok(claim)
}

/// An error about structure `k` of a batch, told as frame `locate(k)` of its file.
pub fn at_frame(
    e: crate::Error,
    locate: impl Fn(usize) -> (std::path::PathBuf, usize),
) -> anyhow::Error {
    match batch_member(&e) {
        Some((k, what)) => {
            let (file, frame) = locate(k);
            anyhow::anyhow!("{}: frame {frame}: {what}", file.display())
        }
        None => e.into(),
    }
}

/// (structure, the rest of the message) of an error about one structure of a batch.
fn batch_member(e: &crate::Error) -> Option<(usize, String)> {
    use crate::Error;
    match e {
        Error::NonFiniteResult { structure, what } => {
            Some((*structure, format!("{what} (not finite)")))
        }
        Error::UnknownElement {
            z,
            structure,
            atom,
            known,
        } => Some((
            *structure,
            format!("atom {atom}: element Z={z} is not in the model's elements {known:?}"),
        )),
        Error::Structure(m) | Error::NeighborList(m) => {
            let rest = m.strip_prefix("structure ")?;
            let (k, what) = rest.split_once(": ")?;
            Some((k.parse().ok()?, what.to_string()))
        }
        _ => None,
    }
}

/// Adds the report `files` a command writes into the folder `dir` (created here if missing)
/// to `io` as outputs of `flag`.
pub fn report_files(
    io: &mut crate::fsutil::OutputSet,
    flag: &str,
    dir: &std::path::Path,
    files: &[&str],
    overwrite: bool,
) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("{flag} {}: cannot create the folder: {e}", dir.display()))?;
    for f in files {
        io.output(
            flag,
            &dir.join(f),
            crate::fsutil::Mode::for_existing(overwrite, false),
        );
    }
    Ok(())
}

/// `--dtype f32|f64`.
pub fn parse_dtype(s: &str) -> std::result::Result<candle_core::DType, String> {
    match s {
        "f32" => Ok(candle_core::DType::F32),
        "f64" => Ok(candle_core::DType::F64),
        _ => Err(format!("unknown dtype `{s}` (expected f32 or f64)")),
    }
}

/// Runs `mlff` with `args` (the first is the program name). `--help`, `--version` and bad
/// flags come back as a [`clap::Error`] inside the error, for the caller to print and exit
/// with its status ([`clap::Error::exit_code`]).
pub fn run<I, T>(args: I) -> Result<ExitCode>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => return Ok(report_clap(e)),
    };
    let done = |r: Result<()>| r.map(|()| ExitCode::SUCCESS);
    match cli.command {
        Command::Check(a) => done(check::run(a)),
        Command::Info(a) => done(info::run(a)),
        Command::Predict(a) => done(predict::run(a)),
        Command::InitModel(a) => done(init_model::run(a)),
        Command::Bench(a) => bench::run(a),
        Command::Train(a) => train::run(*a),
        Command::Eval(a) => done(eval::run(a)),
        Command::Md(a) => md::run(*a),
        Command::Distill(a) => distill::run(*a),
        Command::ValidateMd(a) => done(validate_md::run(*a)),
        Command::Profile(a) => done(profile::run(*a)),
    }
    .map_err(out_of_memory_said)
}

/// A GPU out of memory, said as such: the driver's words alone name neither the cause nor
/// what to change.
fn out_of_memory_said(e: anyhow::Error) -> anyhow::Error {
    let oom = e
        .chain()
        .any(|c| c.to_string().contains("CUDA_ERROR_OUT_OF_MEMORY"));
    match oom {
        true => e.context(
            "the GPU ran out of memory: the system (its atoms and their neighbours) or the \
             batch is too large for it; run fewer atoms or a smaller batch, or split a large \
             system over several GPUs with LAMMPS (pair_style mlff, lammps/README.md)",
        ),
        false => e,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_gpu_out_of_memory_is_said_with_what_to_change() {
        let driver = anyhow::anyhow!("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")");
        let said = format!("{:#}", super::out_of_memory_said(driver.context("md")));
        assert!(said.starts_with("the GPU ran out of memory"), "{said}");
        assert!(
            said.ends_with("CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")"),
            "{said}"
        );
        let other = super::out_of_memory_said(anyhow::anyhow!("no such file"));
        assert_eq!(format!("{other:#}"), "no such file");
    }
}
