//! Profile reports: statistics per phase, throughput, memory, leak check, hotspots with advice;
//! JSON export and import, markdown, and a Chrome trace (chrome://tracing, Perfetto).

use super::memory::{leak_check, LeakCheck, MemorySample};
use super::stats::Stats;
use super::CallRecord;
use crate::error::Result;
use crate::fsutil::{read_json, write_json};
use crate::phase::Phase;
use serde::{Deserialize, Serialize};
use std::fmt::Write;
use std::path::Path;

/// Timing of one phase over all calls (µs), and its share of the total time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseStats {
    pub phase: Phase,
    pub stats: Stats,
    pub share: f64,
}

/// A phase worth attention, with what to do about it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hotspot {
    pub phase: Phase,
    pub share: f64,
    pub advice: String,
}

/// Phases taking at least this share of the time are hotspots.
pub const HOTSPOT_SHARE: f64 = 0.10;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfileReport {
    pub label: String,
    pub device: String,
    pub calls: usize,
    pub atoms_mean: f64,
    /// Whole call (or step) latency, µs.
    pub latency_us: Option<Stats>,
    pub phases: Vec<PhaseStats>,
    pub calls_per_s: f64,
    pub structures_per_s: f64,
    pub atom_steps_per_s: f64,
    pub us_per_atom: f64,
    /// Host time spent in the profiler itself per call (stamps, reading them, bookkeeping,
    /// memory samples), µs, and as a share of the mean call.
    pub profiler_us_per_call: f64,
    pub profiler_share: f64,
    pub memory: Vec<MemorySample>,
    pub leak: Option<LeakCheck>,
    pub hotspots: Vec<Hotspot>,
    pub records: Vec<CallRecord>,
    /// The tuning in force and the fused backend's plan for the profiled system, where the
    /// caller records them (`mlff profile` does).
    #[serde(default)]
    pub tuning: serde_json::Value,
    #[serde(default)]
    pub plan: serde_json::Value,
}

fn advice(phase: Phase, atoms: f64, device: &str) -> String {
    let small = atoms < 500.0;
    let cpu = device.starts_with("cpu");
    match phase {
        Phase::NeighborList => "the host neighbour list: reuse it over steps with a Verlet skin \
            (mlff md does; a larger --skin rebuilds less often)"
            .into(),
        Phase::Upload => "host-to-device copies: keep inputs on the device between calls \
            (mlff md keeps positions there)"
            .into(),
        Phase::Download => "device-to-host copies: read results back only when they are \
            needed (log less often)"
            .into(),
        Phase::Forward | Phase::Backward if small && cpu => format!(
            "the {} pass at {atoms:.0} atoms on the CPU is molecule-sized matrix products, \
             where handing them to a thread pool costs more than it shares: one thread \
             (RAYON_NUM_THREADS=1) is often faster, and independent runs side by side use the \
             cores better than one run on all of them",
            phase.name()
        ),
        Phase::Forward | Phase::Backward if small => format!(
            "the {} pass at {atoms:.0} atoms is many small kernels, each far from the GPU's \
             arithmetic and memory limits: batch several structures per call; --backend fused \
             and --graphs auto (the defaults) remove the per-kernel launch and allocation \
             work, what remains is the kernels' own latency",
            phase.name()
        ),
        Phase::Forward | Phase::Backward => format!(
            "the {} pass is arithmetic and memory traffic at {atoms:.0} atoms: f32 rather \
             than f64, a smaller cutoff or fewer features cut it",
            phase.name()
        ),
        Phase::Integrate => "the integrator, logging and output between force calls: log and \
            write frames less often"
            .into(),
        Phase::Call => "the whole call (this calculator reports no finer phases)".into(),
        Phase::Batch => "the training batch assembled on the host: prepare the next one while \
                         the device trains"
            .into(),
        Phase::Optimizer => "the optimiser: fused updates over flat parameter buffers".into(),
        Phase::Capture => "capturing a training step as a CUDA graph, once per batch shape: \
                           batches of fewer distinct sizes capture fewer"
            .into(),
    }
}

impl ProfileReport {
    pub fn build(
        label: &str,
        device: &str,
        calls: &[CallRecord],
        memory: &[MemorySample],
        leak_tolerance_bytes: f64,
    ) -> Self {
        let totals: Vec<f64> = calls.iter().map(|c| c.segment.total_us).collect();
        let grand: f64 = totals.iter().sum();
        let mut phase_list: Vec<Phase> = calls
            .iter()
            .flat_map(|c| c.segment.phases.iter().map(|p| p.0))
            .collect();
        phase_list.sort();
        phase_list.dedup();
        let phases: Vec<PhaseStats> = phase_list
            .into_iter()
            .filter_map(|phase| {
                // Over the calls that have the phase (the first MD step has no integrator).
                let v: Vec<f64> = calls
                    .iter()
                    .filter(|c| c.segment.phases.iter().any(|p| p.0 == phase))
                    .map(|c| {
                        (c.segment.phases.iter())
                            .filter(|p| p.0 == phase)
                            .map(|p| p.1)
                            .sum()
                    })
                    .collect();
                let sum: f64 = v.iter().sum();
                Some(PhaseStats {
                    phase,
                    stats: Stats::of(&v)?,
                    share: if grand > 0.0 { sum / grand } else { 0.0 },
                })
            })
            .collect();
        let n = calls.len().max(1) as f64;
        let atoms_mean = calls.iter().map(|c| c.atoms as f64).sum::<f64>() / n;
        let structures: f64 = calls.iter().map(|c| c.structures as f64).sum();
        let atom_total: f64 = calls.iter().map(|c| c.atoms as f64).sum();
        let self_us: f64 = calls.iter().map(|c| c.profiler_us).sum();
        let seconds = grand * 1e-6;
        let per_s = |x: f64| if seconds > 0.0 { x / seconds } else { 0.0 };
        let mut hotspots: Vec<Hotspot> = phases
            .iter()
            .filter(|p| p.share >= HOTSPOT_SHARE)
            .map(|p| Hotspot {
                phase: p.phase,
                share: p.share,
                advice: advice(p.phase, atoms_mean, device),
            })
            .collect();
        hotspots.sort_by(|a, b| b.share.total_cmp(&a.share));
        Self {
            label: label.into(),
            device: device.into(),
            calls: calls.len(),
            atoms_mean,
            latency_us: Stats::of(&totals),
            phases,
            calls_per_s: per_s(calls.len() as f64),
            structures_per_s: per_s(structures),
            atom_steps_per_s: per_s(atom_total),
            us_per_atom: if atom_total > 0.0 {
                grand / atom_total
            } else {
                0.0
            },
            profiler_us_per_call: self_us / n,
            profiler_share: if grand > 0.0 { self_us / grand } else { 0.0 },
            memory: memory.to_vec(),
            leak: leak_check(memory, leak_tolerance_bytes),
            hotspots,
            records: calls.to_vec(),
            tuning: serde_json::Value::Null,
            plan: serde_json::Value::Null,
        }
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        write_json(path, self)
    }

    pub fn load(path: &Path) -> Result<Self> {
        read_json(path, "a profile report")
    }

    /// The report for people.
    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let _ = writeln!(
            md,
            "## {} ({}, {} calls, {:.0} atoms)\n",
            self.label, self.device, self.calls, self.atoms_mean
        );
        if let Some(s) = &self.latency_us {
            md.push_str(
                "| latency µs | mean | median | std | min | max | P95 | P99 | CV |\n\
                 |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
            );
            let _ = writeln!(md, "| whole call {}", stats_row(s));
            for p in &self.phases {
                let _ = writeln!(
                    md,
                    "| {} ({:.1}%) {}",
                    p.phase.name(),
                    100.0 * p.share,
                    stats_row(&p.stats)
                );
            }
        }
        let _ = writeln!(
            md,
            "\nThroughput: {:.1} calls/s, {:.1} structures/s, {:.3e} atom-steps/s, {:.3} µs/atom.",
            self.calls_per_s, self.structures_per_s, self.atom_steps_per_s, self.us_per_atom
        );
        let _ = writeln!(
            md,
            "Profiler's own host time: {:.1} µs per call ({:.2}% of a call).",
            self.profiler_us_per_call,
            100.0 * self.profiler_share
        );
        if let Some(l) = &self.leak {
            let _ = writeln!(
                md,
                "Memory: fitted growth {:.1} KiB over the run ({:.1} B/call), tolerance {:.0} KiB: {}.",
                l.fitted_growth_bytes / 1024.0,
                l.slope_bytes_per_call,
                l.tolerance_bytes / 1024.0,
                if l.leaking { "**LEAK suspected**" } else { "no leak" }
            );
        }
        if !self.hotspots.is_empty() {
            md.push_str("\nHotspots:\n");
            for h in &self.hotspots {
                let _ = writeln!(
                    md,
                    "- {} ({:.0}%): {}",
                    h.phase.name(),
                    100.0 * h.share,
                    h.advice
                );
            }
        }
        md
    }

    /// Chrome trace events: one slice per call with its phases nested inside.
    pub fn chrome_trace(&self) -> serde_json::Value {
        let mut events = Vec::new();
        for c in &self.records {
            let s = &c.segment;
            events.push(serde_json::json!({
                "name": format!("call {}", c.index), "cat": "call", "ph": "X",
                "ts": s.start_us, "dur": s.total_us, "pid": 1, "tid": 1,
                "args": {"atoms": c.atoms, "structures": c.structures},
            }));
            let mut t = s.start_us;
            for (phase, dur) in &s.phases {
                events.push(serde_json::json!({
                    "name": phase.name(), "cat": "phase", "ph": "X",
                    "ts": t, "dur": dur, "pid": 1, "tid": 1,
                }));
                t += dur;
            }
        }
        serde_json::json!({"traceEvents": events, "displayTimeUnit": "ms"})
    }

    pub fn write_trace(&self, path: &Path) -> Result<()> {
        write_json(path, &self.chrome_trace())
    }
}

fn stats_row(s: &Stats) -> String {
    format!(
        "| {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.3} |",
        s.mean, s.median, s.std, s.min, s.max, s.p95, s.p99, s.cv
    )
}
