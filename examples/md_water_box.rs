//! Langevin (NVT, 300 K) dynamics of a periodic box of 64 waters with the shipped student:
//! 200 steps of 0.5 fs, periodic wrapping and a Verlet neighbour list with a 1 Å skin. On a few
//! CPU cores even this 192-atom box runs slowly with the fused path: build with
//! `--features cuda` for longer runs (a larger box on a GPU: BENCHMARKS.md, "MD throughput").
//!
//!     cargo run --release --example md_water_box [-- OUT_DIR [N_WATERS [STEPS [nve|nvt|npt [GRAPHS [LIST]]]]]]
//!
//! npt adds the stochastic cell rescaling barostat at 1 bar (iso, 1 ps) to the thermostat.
//! GRAPHS is auto (default: whole steps replayed as CUDA graphs on a CUDA device), on or off;
//! LIST is where the neighbour list is built: auto (default: the device on CUDA), host or device.
//!
//! Writes OUT_DIR/traj.extxyz, OUT_DIR/log.jsonl and OUT_DIR/summary.json; OUT_DIR defaults
//! to examples-out/md_water_box. The box starts from a lattice of rigid waters, not an
//! equilibrated liquid: the first picoseconds are its equilibration.

use mlff_distiller::device::{select, DeviceSpec};
use mlff_distiller::graph::Graphs;
use mlff_distiller::md::{
    Barostat, Ensemble, ListSite, MdOutputs, MdSettings, PainnForces, Simulation,
};
use mlff_distiller::model::Backend;
use mlff_distiller::systems::water_box;
use mlff_distiller::PainnCalculator;
use std::path::{Path, PathBuf};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let out = args
        .next()
        .map_or_else(|| PathBuf::from("examples-out/md_water_box"), PathBuf::from);
    let n_waters: usize = args.next().map_or(Ok(64), |s| s.parse())?;
    let steps: u64 = args.next().map_or(Ok(200), |s| s.parse())?;
    let langevin = Ensemble::Nvt {
        temperature: 300.0,
        friction: 10.0,
    };
    let (ensemble, barostat) = match args.next().as_deref() {
        None | Some("nvt") => (langevin, None),
        Some("npt") => (langevin, Some(Barostat::default())),
        Some("nve") => (Ensemble::Nve, None),
        Some(other) => anyhow::bail!("ensemble `{other}`: expected nve, nvt or npt"),
    };
    let graphs: Graphs = args
        .next()
        .map_or(Ok(Graphs::Auto), |s| s.parse())
        .map_err(anyhow::Error::msg)?;
    let site: ListSite = args
        .next()
        .map_or(Ok(ListSite::Auto), |s| s.parse())
        .map_err(anyhow::Error::msg)?;
    std::fs::create_dir_all(&out)?;
    let device = select(DeviceSpec::Auto)?.device;
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/painn-gfn2.safetensors");
    // The fused kernels, as `mlff md` runs by default.
    let calc = PainnCalculator::from_checkpoint(&model, &device, candle_core::DType::F32)?
        .with_backend(Backend::Fused);
    let water = water_box(n_waters, 0);
    let settings = MdSettings {
        dt_fs: 0.5,
        steps,
        ensemble,
        barostat,
        log_every: 10,
        traj_every: 50,
        outputs: MdOutputs {
            traj: Some(out.join("traj.extxyz")),
            log: Some(out.join("log.jsonl")),
            restart: None,
            ..Default::default()
        },
        ..Default::default()
    };
    let forces = PainnForces::new(&calc, &water, settings.skin)?
        .with_list_site(site)?
        .with_graphs(settings.graphs(graphs)?)?;
    let on_device = forces.list_on_device();
    let mut sim = Simulation::new(forces, &water, settings, serde_json::Value::Null)?;
    let summary = sim.run(&mut |p| {
        if p.step % 200 == 0 {
            eprintln!(
                "step {:>5}: T {:.0} K, {:.1} steps/s",
                p.step, p.record.temperature, p.steps_per_s
            );
        }
    })?;
    std::fs::write(
        out.join("summary.json"),
        serde_json::to_vec_pretty(&summary)?,
    )?;
    if let (Some(v), Some(rho)) = (summary.volume_mean_a3, summary.density_mean_g_cm3) {
        println!(
            "volume {v:.1} Å³, density {rho:.4} g/cm³, pressure {:.0} bar, effective-energy \
             drift {:.4} meV/atom/ps",
            summary.pressure_mean_bar.unwrap_or(f64::NAN),
            summary.energy_drift_mev_per_atom_ps.unwrap_or(f64::NAN)
        );
    }
    println!(
        "{} atoms, {} steps on {:?}: {:.1} steps/s ({:.3} ns/day), T {:.0} ± {:.0} K, \
         {} neighbour-list builds ({}), stable: {}; outputs in {}",
        summary.atoms,
        summary.last_step,
        device,
        summary.steps_per_s,
        summary.ns_per_day,
        summary.temperature_mean.unwrap_or(f64::NAN),
        summary.temperature_std.unwrap_or(f64::NAN),
        summary.neighbor_list_builds,
        if on_device { "device" } else { "host" },
        summary.stable,
        out.display()
    );
    Ok(())
}
