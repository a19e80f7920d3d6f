//! Where a training step's time goes: `mlff train`'s optimiser step on batches of labelled
//! frames, its phases timed with CUDA events on the GPU (the host clock on the CPU): the batch
//! and its displaced copies assembled on the host, uploads, the fused pass at x, the errors
//! read back, the forward over the copies (autograd's graph, or the fused forward), its
//! backward, and the optimiser (flattening, clipping, AdamW, the EMA); a step replayed as a
//! CUDA graph shows as upload, forward (the replay) and download (the loss). GRADIENT is a
//! `--force-gradient` (default fused), GRAPHS a `--graphs` (default auto). GPUS > 1 trains
//! data-parallel on GPUs 0..GPUS (`--devices`, a build with the `nccl` feature): BATCH is the
//! whole batch, split between them (no phases are marked: the ranks work on threads of their own).
//! FRAMES `host` uploads every batch instead of holding the frames on the device.
//!
//!     cargo bench --features cuda --bench train_step_times -- \
//!         MODEL TRAIN.extxyz [BATCH [STEPS [GRADIENT [GRAPHS [GPUS [FRAMES]]]]]]

use anyhow::{Context, Result};
use candle_core::DType;
use mlff_distiller::checkpoint;
use mlff_distiller::device::{select, DeviceSpec};
use mlff_distiller::graph::Graphs;
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
    let gradient: ForceGradient = match args.get(4) {
        Some(s) => s.parse().map_err(anyhow::Error::msg)?,
        None => ForceGradient::Fused,
    };
    let graphs: Graphs = match args.get(5) {
        Some(s) => s.parse().map_err(anyhow::Error::msg)?,
        None => Graphs::Auto,
    };
    let gpus: usize = args.get(6).map_or(Ok(1), |s| s.parse())?;
    let frames_on_device = match args.get(7).map(String::as_str) {
        None | Some("device") => true,
        Some("host") => false,
        Some(other) => anyhow::bail!("FRAMES is `device` or `host`, not `{other}`"),
    };
    let dev = select(DeviceSpec::Auto)?.device;
    let others = (1..gpus)
        .map(|k| Ok(select(DeviceSpec::Cuda(k))?.device))
        .collect::<Result<Vec<_>>>()?;
    let init = checkpoint::load(&model)?;
    let ds = Dataset::load(&data)?;
    let cfg = TrainConfig {
        batch_size: batch,
        force_gradient: gradient,
        ..TrainConfig::default()
    };
    let mut t = Trainer::new(&init.config, &cfg, &ds, &ds, &dev, DType::F32, Some(&init))?
        .with_graphs(graphs)
        .with_frames_on_device(frames_on_device)
        .with_replicas(others)?;
    let n = t.n_train();
    // Frames spread over the file (a stride prime to its length, as a shuffle would), so that
    // a file of several molecules gives batches of several sizes.
    let stride = (7919..).find(|s| gcd(*s, n) == 1).unwrap_or(1);
    let idx =
        |k: usize| -> Vec<usize> { (0..batch).map(|j| ((k * batch + j) * stride) % n).collect() };
    for k in 0..5 {
        t.optimizer_step(&idx(k), &mut mlff_distiller::phase::NoClock)?;
    }
    mlff_distiller::profiler::reset_peak(&dev);
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
    // Device memory at most during the timed steps (the pool and the replayed graphs).
    let peak = mlff_distiller::profiler::sample(&dev, 0).peak_bytes();
    let peak_mb = peak.map_or_else(|| "?".into(), |b| format!("{:.0}", b as f64 / 1e6));
    println!(
        "{} on {:?} ({gpus} GPUs), {}, graphs {graphs:?}, frames on the device {frames_on_device}, \
         batch {batch}, {steps} steps: {:.0} µs/step marked, {:.0} µs/step wall, {:.0} structures/s, \
         peak {peak_mb} MB",
        model.display(),
        dev,
        gradient.name(),
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
    parts(&init, &ds, batch, &dev)?;
    Ok(())
}

fn gcd(a: usize, b: usize) -> usize {
    match b {
        0 => a,
        _ => gcd(b, a % b),
    }
}

/// The fused step's device work one piece at a time (synchronised, 20 repetitions each): the
/// fused form of the weights (as training makes it, for one step), the pass at x, and the
/// weight gradients over 2B copies.
fn parts(
    init: &checkpoint::Checkpoint,
    ds: &Dataset,
    batch: usize,
    dev: &candle_core::Device,
) -> Result<()> {
    use mlff_distiller::device::synchronize;
    use mlff_distiller::model::FusedPainn;
    use mlff_distiller::{Batch, PainnCalculator, Tuning};
    let calc = PainnCalculator::new(init.model(dev, DType::F32)?, dev.clone(), DType::F32);
    let frames: Vec<_> = ds.frames.iter().take(batch).cloned().collect();
    let x = Batch::new(frames.clone())?;
    let copies = Batch::new([frames.clone(), frames].concat())?;
    let (inputs, _) = calc.prepare(&x)?;
    let (all, _) = calc.prepare(&copies)?;
    let seed = candle_core::Tensor::ones(copies.n_atoms(), DType::F32, dev)?;
    let time = |what: &str, f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
        f()?;
        synchronize(dev)?;
        let t = std::time::Instant::now();
        for _ in 0..20 {
            f()?;
        }
        synchronize(dev)?;
        println!("| {what} | {:.0} |", t.elapsed().as_secs_f64() / 20.0 * 1e6);
        Ok(())
    };
    println!("| part (batch {batch}) | µs |\n|---|---:|");
    let tuning = Tuning::default();
    let new = || FusedPainn::new(calc.model(), &tuning).map(|f| f.used_once(true));
    time("FusedPainn::new", &mut || {
        new()?;
        Ok(())
    })?;
    time("new + energies and forces at x", &mut || {
        new()?.energies_and_forces(&inputs)?;
        Ok(())
    })?;
    time("new + weight gradients, 2B copies", &mut || {
        new()?.weight_gradients(&all, &seed)?;
        Ok(())
    })?;
    Ok(())
}
