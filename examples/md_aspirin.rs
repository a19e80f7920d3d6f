//! NVE molecular dynamics of aspirin with the shipped student: 2,000 steps of 0.5 fs from
//! 300 K Maxwell-Boltzmann velocities, on CUDA when this build and machine have it.
//!
//!     cargo run --release --example md_aspirin [-- OUT_DIR]
//!
//! Writes OUT_DIR/traj.extxyz (every 20 steps, ASE-readable, with momenta), OUT_DIR/log.jsonl
//! and OUT_DIR/summary.json; OUT_DIR defaults to examples-out/md_aspirin.

use mlff_distiller::device::{select, DeviceSpec};
use mlff_distiller::graph::Graphs;
use mlff_distiller::md::{Ensemble, MdOutputs, MdSettings, PainnForces, Simulation};
use mlff_distiller::model::Backend;
use mlff_distiller::systems::start_geometry;
use mlff_distiller::PainnCalculator;
use std::path::{Path, PathBuf};

fn main() -> anyhow::Result<()> {
    let out = std::env::args()
        .nth(1)
        .map_or_else(|| PathBuf::from("examples-out/md_aspirin"), PathBuf::from);
    std::fs::create_dir_all(&out)?;
    let device = select(DeviceSpec::Auto)?.device;
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/painn-gfn2.safetensors");
    // The fused kernels, as `mlff md` runs by default.
    let calc = PainnCalculator::from_checkpoint(&model, &device, candle_core::DType::F32)?
        .with_backend(Backend::Fused);
    let aspirin = start_geometry("aspirin")?;
    let settings = MdSettings {
        dt_fs: 0.5,
        steps: 2000,
        ensemble: Ensemble::Nve,
        init_temperature: 300.0,
        log_every: 10,
        traj_every: 20,
        outputs: MdOutputs {
            traj: Some(out.join("traj.extxyz")),
            log: Some(out.join("log.jsonl")),
            restart: None,
            ..Default::default()
        },
        ..Default::default()
    };
    // Whole steps replayed as CUDA graphs on a CUDA device.
    let forces = PainnForces::new(&calc, &aspirin, settings.skin)?.with_graphs(Graphs::Auto)?;
    let mut sim = Simulation::new(forces, &aspirin, settings, serde_json::Value::Null)?;
    let summary = sim.run(&mut |p| {
        if p.step % 500 == 0 {
            eprintln!(
                "step {:>5}: E_tot {:.5} eV, T {:.0} K, {:.0} steps/s",
                p.step, p.record.e_tot, p.record.temperature, p.steps_per_s
            );
        }
    })?;
    std::fs::write(
        out.join("summary.json"),
        serde_json::to_vec_pretty(&summary)?,
    )?;
    println!(
        "{} steps on {:?}: {:.0} steps/s, drift {:+.4} meV/atom/ps, stable: {}; outputs in {}",
        summary.last_step,
        device,
        summary.steps_per_s,
        summary.energy_drift_mev_per_atom_ps.unwrap_or(f64::NAN),
        summary.stable,
        out.display()
    );
    Ok(())
}
