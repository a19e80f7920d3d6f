//! Constant-pressure MD on CUDA against the CPU: the moving cell, its list (the device list
//! on CUDA, renewed for each new cell; the host list on the CPU) and the strained force call.

use crate::common::*;
use crate::{cuda, shipped_calculator};
use candle_core::{DType, Device};
use mlff_distiller::md::{
    Barostat, BarostatMode, Ensemble, LogRecord, MdSettings, PainnForces, Simulation, StopReason,
};
use mlff_distiller::model::Backend;
use mlff_distiller::PainnCalculator;

fn npt(steps: u64, mode: BarostatMode) -> MdSettings {
    MdSettings {
        dt_fs: 0.5,
        steps,
        ensemble: Ensemble::Nvt {
            temperature: 300.0,
            friction: 10.0,
        },
        skin: 0.3,
        seed: 5,
        log_every: 5,
        traj_every: 0,
        stop_when_unstable: false,
        barostat: Some(stiff_barostat(mode)),
        ..Default::default()
    }
}

fn run(calc: &PainnCalculator, s: &mlff_distiller::Structure, st: MdSettings) -> Vec<LogRecord> {
    let f = PainnForces::new(calc, s, st.skin).unwrap();
    let mut sim = Simulation::new(f, s, st, serde_json::Value::Null).unwrap();
    let summary = sim.run(&mut |_| {}).unwrap();
    assert_eq!(summary.stop, StopReason::Completed);
    sim.records().to_vec()
}

/// f64: the CUDA trajectory (volume, energies, pressure, effective energy) is the CPU's.
#[test]
fn cuda_npt_matches_cpu_npt() {
    let s = random_box(96, 0.15, 11);
    for mode in [BarostatMode::Iso, BarostatMode::Aniso] {
        let st = npt(200, mode);
        let cpu = run(&calculator(DType::F64, &Device::Cpu), &s, st.clone());
        let gpu = run(&calculator(DType::F64, &cuda()), &s, st);
        let (v0, v1) = (cpu[0].volume.unwrap(), cpu.last().unwrap().volume.unwrap());
        assert!((v1 / v0 - 1.0).abs() > 0.02, "the cell hardly moved");
        for (a, b) in cpu.iter().zip(&gpu) {
            for (what, x, y) in [
                ("e_pot", a.e_pot, b.e_pot),
                ("volume", a.volume.unwrap(), b.volume.unwrap()),
                ("pressure", a.pressure_bar.unwrap(), b.pressure_bar.unwrap()),
                ("e_eff", a.e_eff.unwrap(), b.e_eff.unwrap()),
            ] {
                assert!(
                    (x - y).abs() <= 1e-7 * x.abs().max(1.0),
                    "{mode:?} step {}: CUDA {what} {y} vs CPU {x}",
                    a.step
                );
            }
        }
    }
}

/// The shipped student in f32 on a 64-water box at 1 bar: finite and within reach of the
/// f64 CPU run over a short stretch.
#[test]
fn shipped_student_npt_water_box_on_cuda() {
    let s = mlff_distiller::systems::water_box(64, 5);
    let st = MdSettings {
        barostat: Some(Barostat {
            pressure_bar: 1.0,
            mode: BarostatMode::Iso,
            time_fs: 1000.0,
            compressibility_per_bar: 4.5e-5,
        }),
        ..npt(40, BarostatMode::Iso)
    };
    let gpu = run(
        &shipped_calculator(&cuda(), DType::F32, Backend::Fused),
        &s,
        st.clone(),
    );
    let cpu = run(
        &shipped_calculator(&Device::Cpu, DType::F64, Backend::Fused),
        &s,
        st,
    );
    let (a, b) = (cpu.last().unwrap(), gpu.last().unwrap());
    assert!(
        (a.volume.unwrap() / b.volume.unwrap() - 1.0).abs() < 1e-5,
        "{a:?}\n{b:?}"
    );
    assert!(
        (a.e_pot - b.e_pot).abs() < 1e-3 * a.e_pot.abs(),
        "{a:?}\n{b:?}"
    );
}
