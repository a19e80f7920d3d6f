//! Benchmark reports (`mlff bench`): cases, regression checks against a baseline, markdown and
//! plots (latency vs atoms, throughput vs batch size, peak memory vs atoms).

use crate::error::Result;
use crate::fsutil::{read_json, write_json};
use crate::plot::{lines_png, Line};
use crate::profiler::Stats;
use serde::{Deserialize, Serialize};
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// One system timed with one code path.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchCase {
    pub system: String,
    /// Copies of the molecule in the batch (1 for single structures and boxes).
    pub batch: usize,
    pub atoms: usize,
    pub edges: usize,
    /// Backend: autograd, stock, fused, or fused+graph (the fused backend replayed as a CUDA
    /// graph).
    pub path: String,
    /// Energy+forces on the device (forward and backward, inputs resident), ms.
    pub latency_ms: Stats,
    pub structures_per_s: f64,
    pub atom_steps_per_s: f64,
    /// Host neighbour list and upload, once, ms.
    pub prepare_ms: f64,
    /// Peak of the CUDA allocator pool during the timed calls (GPU), or the RSS after them.
    pub peak_memory_bytes: Option<u64>,
    /// Largest |ΔE| (eV) and |ΔF| (eV/Å) against the reference path (the first listed).
    pub max_de: f64,
    pub max_df: f64,
    /// The fused backend's plan for the call (`crate::plan`; null for the others).
    #[serde(default)]
    pub plan: serde_json::Value,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    pub device: String,
    pub dtype: String,
    /// The tuning in force (`crate::tuning`), every key.
    #[serde(default)]
    pub tuning: serde_json::Value,
    pub cases: Vec<BenchCase>,
    /// The student-vs-teacher comparison, when asked for.
    #[serde(default)]
    pub teacher: serde_json::Value,
}

/// A case slower than its baseline beyond the tolerance.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Regression {
    pub system: String,
    pub path: String,
    pub baseline_ms: f64,
    pub current_ms: f64,
    /// current / baseline median latency.
    pub ratio: f64,
}

impl BenchReport {
    pub fn save(&self, path: &Path) -> Result<()> {
        write_json(path, self)
    }

    pub fn load(path: &Path) -> Result<Self> {
        read_json(path, "a bench report")
    }

    /// Cases whose median latency is more than `tolerance` (0.05: 5%) above the baseline case
    /// of the same system and path. Cases missing from either side are not compared.
    pub fn regressions(&self, baseline: &BenchReport, tolerance: f64) -> Vec<Regression> {
        self.cases
            .iter()
            .filter_map(|c| {
                // (Reports before the backends had a name call autograd "custom".)
                let same = |p: &str| p == c.path || (p == "custom" && c.path == "autograd");
                let b = baseline
                    .cases
                    .iter()
                    .find(|b| b.system == c.system && same(&b.path))?;
                let ratio = c.latency_ms.median / b.latency_ms.median;
                (ratio > 1.0 + tolerance).then(|| Regression {
                    system: c.system.clone(),
                    path: c.path.clone(),
                    baseline_ms: b.latency_ms.median,
                    current_ms: c.latency_ms.median,
                    ratio,
                })
            })
            .collect()
    }

    /// The table for people.
    pub fn markdown(&self) -> String {
        let mut md = format!("device: {}, dtype {}\n\n", self.device, self.dtype);
        md.push_str(
            "| system | batch | atoms | edges | path | median ms | mean ms | std ms | min ms | \
             P95 ms | P99 ms | structures/s | atom-steps/s | peak MiB | prepare ms | max dE eV | \
             max dF eV/Å |\n|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\
             ---:|---:|---:|\n",
        );
        for c in &self.cases {
            let s = &c.latency_ms;
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.1} \
                 | {:.3e} | {} | {:.2} | {:.1e} | {:.1e} |",
                c.system,
                c.batch,
                c.atoms,
                c.edges,
                c.path,
                s.median,
                s.mean,
                s.std,
                s.min,
                s.p95,
                s.p99,
                c.structures_per_s,
                c.atom_steps_per_s,
                c.peak_memory_bytes
                    .map_or("–".into(), |b| format!("{:.1}", b as f64 / 1048576.0)),
                c.prepare_ms,
                c.max_de,
                c.max_df
            );
        }
        md
    }

    /// latency_vs_atoms.png and memory_vs_atoms.png (single structures), throughput_vs_batch.png
    /// (batched copies), one line per code path.
    pub fn plots(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        let mut paths: Vec<&str> = self.cases.iter().map(|c| c.path.as_str()).collect();
        paths.sort();
        paths.dedup();
        let lines = |keep: &dyn Fn(&BenchCase) -> bool,
                     point: &dyn Fn(&BenchCase) -> Option<(f64, f64)>| {
            paths
                .iter()
                .map(|p| {
                    let mut pts: Vec<(f64, f64)> = (self.cases.iter())
                        .filter(|c| c.path == *p && keep(c))
                        .filter_map(point)
                        .collect();
                    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                    Line {
                        label: p.to_string(),
                        points: pts,
                    }
                })
                .filter(|l| !l.points.is_empty())
                .collect::<Vec<Line>>()
        };
        let single = |c: &BenchCase| c.batch == 1;
        // Batches NAME-xB and the single NAME they are copies of.
        let base = |c: &BenchCase| {
            c.system
                .rsplit_once("-x")
                .map_or(c.system.clone(), |b| b.0.into())
        };
        let batched_bases: Vec<String> = (self.cases.iter())
            .filter(|c| c.system.contains("-x"))
            .map(base)
            .collect();
        let batched = |c: &BenchCase| batched_bases.contains(&base(c));
        let plots: [(&str, &str, &str, Vec<Line>); 3] = [
            (
                "latency_vs_atoms.png",
                "atoms",
                "energy+forces median (ms)",
                lines(&single, &|c| Some((c.atoms as f64, c.latency_ms.median))),
            ),
            (
                "throughput_vs_batch.png",
                "structures per batch",
                "structures/s",
                lines(&batched, &|c| Some((c.batch as f64, c.structures_per_s))),
            ),
            (
                "memory_vs_atoms.png",
                "atoms",
                "peak memory (MiB)",
                lines(&single, &|c| {
                    c.peak_memory_bytes
                        .map(|b| (c.atoms as f64, b as f64 / 1048576.0))
                }),
            ),
        ];
        let mut written = Vec::new();
        for (file, x, y, l) in plots {
            if l.is_empty() {
                continue;
            }
            let path = dir.join(file);
            let title = format!("{} ({})", file.trim_end_matches(".png"), self.device);
            lines_png(&path, &title, x, y, &l)?;
            written.push(path);
        }
        Ok(written)
    }
}
