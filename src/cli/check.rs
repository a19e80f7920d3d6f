//! `mlff check`: what this build and machine can run.

use super::DeviceArgs;
use crate::device::{self, system_report};
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct CheckArgs {
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Replace --json if it exists (by default it is refused).
    #[arg(long)]
    overwrite: bool,
    #[command(flatten)]
    device: DeviceArgs,
}

pub fn run(a: CheckArgs) -> Result<()> {
    let mut io = crate::fsutil::OutputSet::new();
    if let Some(p) = &a.json {
        io.output(
            "--json",
            p,
            crate::fsutil::Mode::for_existing(a.overwrite, false),
        );
    }
    let _claim = super::claim(&io)?;
    let report = system_report();
    println!(
        "mlff {} (cuda feature: {})",
        report.version, report.cuda_feature
    );
    println!("cpu threads: {}", report.cpu_threads);
    for g in &report.gpus {
        println!(
            "gpu {}: {} (compute {}), memory {:.1} GiB total / {:.1} GiB free, driver CUDA {}, built for CUDA {}",
            g.ordinal,
            g.name,
            g.compute_capability,
            g.memory_total_bytes as f64 / (1u64 << 30) as f64,
            g.memory_free_bytes as f64 / (1u64 << 30) as f64,
            g.driver_cuda_version,
            g.runtime_cuda_version
        );
    }
    if let Some(e) = &report.gpu_error {
        println!("gpu: none ({e})");
    }
    let dev = a.device.open()?;
    println!("selected device: {}", device::device_name(&dev));
    let warm_up = device::warm_up(&dev)?;
    let again = device::warm_up(&dev)?;
    println!(
        "warm-up: {:.1} ms the first time (kernel loading, first allocations), {:.2} ms after",
        warm_up.as_secs_f64() * 1e3,
        again.as_secs_f64() * 1e3
    );
    if let Some(path) = a.json {
        let mut report = serde_json::to_value(&report)?;
        report["selected_device"] = device::device_name(&dev).into();
        report["warm_up_ms"] = (warm_up.as_secs_f64() * 1e3).into();
        report["warm_up_again_ms"] = (again.as_secs_f64() * 1e3).into();
        crate::fsutil::write_json(&path, &report)?;
    }
    Ok(())
}
