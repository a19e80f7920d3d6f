//! Where a training step's time goes: `mlff train`'s optimiser step (the directional force
//! gradient on CUDA) on batches of labelled frames, its phases timed with CUDA events on the
//! GPU (the host clock on the CPU): the batch and its displaced copies assembled on the host,
//! uploads, the fused pass at x, the errors read back, the autograd forward over the copies,
//! its backward, and the optimiser (flattening, clipping, AdamW, the EMA).
//!
//!     cargo bench --features cuda --bench train_step_times -- MODEL TRAIN.extxyz [BATCH [STEPS]]

use anyhow::{Context, Result};
use candle_core::DType;
use mlff_distiller::checkpoint;
use mlff_distiller::device::{select, DeviceSpec};
use mlff_distiller::phase::Phase;
use mlff_distiller::profiler::DeviceClock;
use mlff_distiller::train::{Dataset, ForceGradient, TrainConfig, Trainer};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let model = PathBuf::from(args.first().context("MODEL TRAIN.extxyz [BATCH [STEPS]]")?);
    let data = PathBuf::from(args.get(1).context("MODEL TRAIN.extxyz [BATCH [STEPS]]")?);
    let batch: usize = args.get(2).map_or(Ok(8), |s| s.parse())?;
    let steps: usize = args.get(3).map_or(Ok(50), |s| s.parse())?;
    let dev = select(DeviceSpec::Auto)?.device;
    let init = checkpoint::load(&model)?;
    let ds = Dataset::load(&data)?;
    // The directional force gradient, as `mlff train` runs on CUDA (on the CPU too here).
    let cfg = TrainConfig {
        batch_size: batch,
        force_gradient: ForceGradient::Directional,
        ..TrainConfig::default()
    };
    let mut t = Trainer::new(&init.config, &cfg, &ds, &ds, &dev, DType::F32, Some(&init))?;
    let n = t.n_train();
    let idx = |k: usize| -> Vec<usize> { (0..batch).map(|j| (k * batch + j) % n).collect() };
    for k in 0..5 {
        t.optimizer_step(&idx(k), &mut mlff_distiller::phase::NoClock)?;
    }
    let mut clock = DeviceClock::new(&dev)?;
    let mut sums: BTreeMap<Phase, f64> = BTreeMap::new();
    let mut total = 0.0;
    let started = std::time::Instant::now();
    for k in 0..steps {
        t.optimizer_step(&idx(5 + k), &mut clock)?;
        clock.finish()?;
        let seg = clock.cut(None)?;
        total += seg.total_us;
        for (p, us) in seg.phases {
            *sums.entry(p).or_default() += us;
        }
    }
    let wall = started.elapsed().as_secs_f64();
    println!(
        "{} on {:?}, batch {batch}, {steps} steps: {:.0} µs/step marked, {:.0} µs/step wall, \
         {:.0} structures/s",
        model.display(),
        dev,
        total / steps as f64,
        wall / steps as f64 * 1e6,
        (steps * batch) as f64 / wall
    );
    println!("| phase | µs/step | share |\n|---|---:|---:|");
    for (p, us) in &sums {
        println!(
            "| {} | {:.0} | {:.0}% |",
            p.name(),
            us / steps as f64,
            100.0 * us / total
        );
    }
    Ok(())
}
