//! Where an MD step's time goes on the GPU: NVE steps of the shipped student with the
//! integrator folded into the force kernel (single launch) and op by op around it, with the
//! neighbour-list checks deferred and nothing read back, timed two ways: the host's time to
//! queue the steps, and the time until the GPU has run them. Where the two are close the host
//! holds a step; where the second is larger the GPU does. Then the same for the plain
//! one-kernel call and the single-launch step called alone in a loop (long loops fill the
//! launch queue, which then holds the host back too).
//!
//!     cargo bench --features cuda --bench md_step_times [-- ethanol,aspirin [STEPS]]

use anyhow::{Context, Result};
use candle_core::{DType, Tensor};
use mlff_distiller::device::{select, DeviceSpec};
use mlff_distiller::elements::atomic_mass;
use mlff_distiller::md::{
    device_positions, Ensemble, ForceProvider, Integrator, PainnForces, State,
};
use mlff_distiller::model::Backend;
use mlff_distiller::systems::start_geometry;
use mlff_distiller::PainnCalculator;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use std::time::Instant;

/// Host and GPU time per call of the plain one-kernel call and of the single-launch step
/// alone, without the MD loop around them.
fn host_parts(
    calc: &PainnCalculator,
    s: &mlff_distiller::Structure,
    integrator: &Integrator,
    steps: usize,
) -> Result<()> {
    use mlff_distiller::ops::{feature_split, feature_split_step, MdStepInputs};
    let dev = calc.device();
    let (x, _) = calc.prepare(&mlff_distiller::Batch::new(vec![s.clone()])?)?;
    let fused = calc.fused()?;
    let (n, e) = (x.positions.dim(0)?, x.centers.dim(0)?);
    let time = |what: &str, f: &mut dyn FnMut() -> Result<()>| -> Result<()> {
        f()?;
        let t0 = Instant::now();
        for _ in 0..steps {
            f()?;
        }
        let queued = t0.elapsed().as_secs_f64();
        dev.synchronize()?;
        let done = t0.elapsed().as_secs_f64();
        let per = |t: f64| t / steps as f64 * 1e6;
        println!(
            "  {what}: host {:.1} µs/call, done {:.1}",
            per(queued),
            per(done)
        );
        Ok(())
    };
    let plan = fused
        .feature_split_plan(n, e, dev, DType::F32)?
        .context("plan")?;
    let w = fused.packed_weights()?;
    let pos64 = x.positions.to_dtype(DType::F64)?;
    let zeros = pos64.zeros_like()?;
    time("plain call", &mut || {
        feature_split(
            &plan,
            w,
            &x.positions,
            &x.offsets,
            &x.species,
            &x.centers,
            &x.neighbors,
        )?;
        Ok(())
    })?;
    time("step call", &mut || {
        let md = MdStepInputs {
            positions: &pos64,
            velocities: &zeros,
            forces: &zeros,
            half_kick: integrator.half_kick(),
            dt: integrator.dt(),
            noise: None,
            reference: &pos64,
        };
        feature_split_step(
            &plan,
            w,
            &x.offsets,
            [&x.species, &x.centers, &x.neighbors],
            &md,
        )?;
        Ok(())
    })?;
    Ok(())
}

fn main() -> Result<()> {
    let names = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "ethanol,aspirin".into());
    let steps: usize = std::env::args().nth(2).map_or(Ok(2000), |s| s.parse())?;
    // As `mlff md` opens it: its own stream, a caching pool, no per-buffer events.
    let dev = select(DeviceSpec::Cuda(0))?.device;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let calc = PainnCalculator::from_checkpoint(
        &root.join("models/painn-gfn2.safetensors"),
        &dev,
        DType::F32,
    )?
    .with_backend(Backend::Fused);
    println!("| system | path | host queues µs/step | GPU done µs/step |\n|---|---|---:|---:|");
    for name in names.split(',') {
        let s = start_geometry(name)?;
        let masses = (s.numbers.iter())
            .map(|&z| atomic_mass(z).context("mass"))
            .collect::<Result<Vec<f64>>>()?;
        let integrator = Integrator::new(Ensemble::Nve, 0.5, &masses, &dev)?;
        for single in [true, false] {
            let mut forces = PainnForces::new(&calc, &s, 1.0)?.with_one_launch_steps(single);
            let mut x = device_positions(&s.positions, &dev)?;
            let first = forces.evaluate(&mut x)?;
            let mut state = State {
                velocities: Tensor::zeros_like(&x)?,
                positions: x,
                forces: first.forces,
                energy: first.energy,
                step: 0,
            };
            let mut rng = ChaCha20Rng::seed_from_u64(1);
            let mut run = |k: usize, state: &mut State| -> Result<(f64, f64)> {
                forces.defer_list_checks();
                let t0 = Instant::now();
                for _ in 0..k {
                    integrator.step(state, &mut forces, &mut rng)?;
                }
                let queued = t0.elapsed().as_secs_f64();
                state.energy.to_scalar::<f64>()?;
                let done = t0.elapsed().as_secs_f64();
                forces.take_deferred_checks()?;
                Ok((queued, done))
            };
            run(100, &mut state)?;
            let (queued, done) = run(steps, &mut state)?;
            let per = |t: f64| t / steps as f64 * 1e6;
            let path = if single { "single launch" } else { "op by op" };
            println!(
                "| {name} | {path} | {:.1} | {:.1} |",
                per(queued),
                per(done)
            );
        }
        host_parts(&calc, &s, &integrator, steps)?;
    }
    Ok(())
}
