//! `mlff profile MODEL STRUCTURE --steps N`: an MD trajectory under the profiler — per-step
//! latency distribution, memory over time, the split into phases, hotspots and the profiler's
//! own overhead; markdown, JSON, PNG plots and an optional Chrome trace.

use super::md::pick_frame;
use super::ModelArgs;
use crate::fsutil::write_atomic;
use crate::graph::Graphs;
use crate::md::{Ensemble, ForceProvider, ListSite, MdSettings, PainnForces, Simulation};
use crate::plot::{histogram_png, lines_png, Line};
use crate::profiler::{ProfiledForces, Profiler};
use crate::{PainnCalculator, Structure};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args)]
pub struct ProfileArgs {
    /// Checkpoint (.safetensors).
    model: PathBuf,
    /// Starting structure (extended XYZ, first frame).
    structure: PathBuf,
    /// Profiled MD steps (NVE, 0.5 fs, from 300 K).
    #[arg(long, default_value_t = 1000)]
    steps: u64,
    /// Unprofiled steps first (device warm-up, kernels loaded), not reported.
    #[arg(long, default_value_t = 20)]
    warmup: u64,
    /// Sample memory every N steps.
    #[arg(long, default_value_t = 10)]
    memory_every: usize,
    /// Memory growth over the run that counts as a leak, MiB.
    #[arg(long, default_value_t = 8.0)]
    leak_tolerance_mib: f64,
    /// Skip the end-to-end comparison (the same trajectory run without the profiler before
    /// and after the profiled run).
    #[arg(long)]
    no_overhead: bool,
    /// Folder for report.md, profile.json, latency_histogram.png, memory.png.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Chrome trace of every step's phases (open in chrome://tracing or ui.perfetto.dev).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Replace reports that exist already (by default they are refused).
    #[arg(long)]
    overwrite: bool,
    /// auto: the force calls replayed as CUDA graphs where possible (CUDA, --backend fused)
    /// and worth it (up to the tuning's graph_auto_max_edges, not one-kernel molecules); on:
    /// always, an error where impossible; off: never. (The profiler times phases, so the
    /// integrator runs op by op here, unlike in `mlff md`.)
    #[arg(long, default_value = "auto")]
    graphs: Graphs,
    /// Where the neighbour list is built: auto (the device where the cell allows), host or
    /// device (as `mlff md`).
    #[arg(long, default_value = "auto")]
    neighbor_list: ListSite,
    #[command(flatten)]
    run: ModelArgs,
}

fn settings(steps: u64) -> MdSettings {
    MdSettings {
        steps,
        ensemble: Ensemble::Nve,
        log_every: steps.max(1),
        traj_every: 0,
        stop_when_unstable: false,
        ..Default::default()
    }
}

/// Runs `steps` MD steps with `forces`; returns the wall time and the simulation.
fn timed<F: ForceProvider>(forces: F, s: &Structure, steps: u64) -> Result<(f64, Simulation<F>)> {
    let t = Instant::now();
    let mut sim = Simulation::new(forces, s, settings(steps), serde_json::Value::Null)?;
    sim.run(&mut |_| {})?;
    Ok((t.elapsed().as_secs_f64(), sim))
}

fn provider<'a>(
    calc: &'a PainnCalculator,
    s: &Structure,
    skin: f64,
    (graphs, site): (Graphs, ListSite),
) -> Result<PainnForces<'a>> {
    Ok(PainnForces::new(calc, s, skin)?
        .with_list_site(site)?
        .with_graphs(graphs)?)
}

pub fn run(a: ProfileArgs) -> Result<()> {
    let mut io = crate::fsutil::OutputSet::new();
    io.input("MODEL", &a.model).input("STRUCTURE", &a.structure);
    if let Some(dir) = &a.out {
        super::report_files(
            &mut io,
            "--out",
            dir,
            &["report.md", "profile.json"],
            a.overwrite,
        )?;
    }
    if let Some(t) = &a.trace {
        io.output(
            "--trace",
            t,
            crate::fsutil::Mode::for_existing(a.overwrite, false),
        );
    }
    let _claim = super::claim(&io)?;
    let calc: PainnCalculator = a.run.calculator(&a.model)?;
    let s = pick_frame(&a.structure, 0)?;
    let dev = calc.device().clone();
    let skin = settings(0).skin;
    let graphs = (a.graphs, a.neighbor_list);
    if a.warmup > 0 {
        timed(provider(&calc, &s, skin, graphs)?, &s, a.warmup)?;
    }
    let plain = |calc: &PainnCalculator| -> Result<Option<f64>> {
        if a.no_overhead {
            return Ok(None);
        }
        Ok(Some(
            timed(provider(calc, &s, skin, graphs)?, &s, a.steps)?.0,
        ))
    };
    let before = plain(&calc)?;
    let profiler = Profiler::new(&dev, a.memory_every)?;
    let forces = ProfiledForces::new(provider(&calc, &s, skin, graphs)?, profiler, s.len());
    let (profiled_s, sim) = timed(forces, &s, a.steps)?;
    let label = format!(
        "{} on {} ({} MD steps)",
        a.model.display(),
        a.structure.display(),
        a.steps
    );
    let mut report = sim
        .forces()
        .profiler()
        .report(&label, a.leak_tolerance_mib * 1048576.0);
    report.tuning = serde_json::to_value(calc.tuning())?;
    if calc.model().backend() == crate::model::Backend::Fused {
        let (inputs, _) = calc.prepare(&crate::Batch::new(vec![s.clone()])?)?;
        report.plan = calc.fused()?.plan(&inputs)?.to_json();
    }
    let mut md = report.markdown();
    if let (Some(before), Some(after)) = (before, plain(&calc)?) {
        md.push_str(&format!(
            "\nEnd to end, the same {} steps took {before:.3} s and {after:.3} s unprofiled (before \
             and after) and {profiled_s:.3} s profiled: the run-to-run spread ({:.1}%) is larger \
             than the profiler's own share above, which is its overhead.\n",
            a.steps,
            100.0 * (before - after).abs() / before.min(after),
        ));
    }
    print!("{md}");
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir)?;
        write_atomic(&dir.join("report.md"), md.as_bytes())?;
        report.save(&dir.join("profile.json"))?;
        let latencies: Vec<f64> = (report.records.iter().skip(1))
            .map(|r| r.segment.total_us / 1e3)
            .collect();
        histogram_png(
            &dir.join("latency_histogram.png"),
            &format!("MD step latency ({})", report.device),
            "step (ms)",
            &latencies,
            50,
        )?;
        let series = |name: &str, get: fn(&crate::profiler::MemorySample) -> Option<u64>| Line {
            label: name.into(),
            points: (report.memory.iter())
                .filter_map(|m| get(m).map(|b| (m.call as f64, b as f64 / 1048576.0)))
                .collect(),
        };
        let lines: Vec<Line> = [
            series("process RSS", |m| m.rss_bytes),
            series("CUDA pool in use", |m| m.pool_used_bytes),
        ]
        .into_iter()
        .filter(|l| !l.points.is_empty())
        .collect();
        lines_png(
            &dir.join("memory.png"),
            "memory over the run",
            "MD step",
            "MiB",
            &lines,
        )?;
        eprintln!(
            "wrote {}/report.md, profile.json, latency_histogram.png, memory.png",
            dir.display()
        );
    }
    if let Some(path) = &a.trace {
        report.write_trace(path)?;
        eprintln!("wrote the Chrome trace {}", path.display());
    }
    Ok(())
}
