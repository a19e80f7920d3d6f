//! Constant-pressure MD (stochastic cell rescaling on the Langevin thermostat): the ensemble
//! against an analytic potential (NVT at V gives P, NPT at P gives V back), the effective
//! energy's conservation, the PaiNN provider's moving cell against the host calculator, exact
//! restarts, and the CLI.

mod common;

use candle_core::{DType, Device};
use mlff_distiller::md::potentials::LennardJones;
use mlff_distiller::md::{
    Barostat, BarostatMode, CalculatorForces, Ensemble, ListSite, LogRecord, MdOutputs, MdSettings,
    PainnForces, Restart, Simulation, StopReason,
};
use mlff_distiller::structure::Lattice;
use mlff_distiller::units::{BAR_PER_EV_A3, KB};
use mlff_distiller::Structure;
use std::path::Path;

fn argon() -> LennardJones {
    LennardJones {
        epsilon: 0.0104,
        sigma: 3.4,
        cutoff: 8.5,
    }
}

/// An fcc argon crystal of 4 n³ atoms with lattice constant `a` Å.
fn argon_crystal(n: usize, a: f64) -> Structure {
    let basis = [
        [0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0],
        [0.5, 0.0, 0.5],
        [0.0, 0.5, 0.5],
    ];
    let mut pos = Vec::new();
    for i in 0..n {
        for j in 0..n {
            for k in 0..n {
                for b in basis {
                    pos.push([
                        (i as f64 + b[0]) * a,
                        (j as f64 + b[1]) * a,
                        (k as f64 + b[2]) * a,
                    ]);
                }
            }
        }
    }
    let side = n as f64 * a;
    Structure {
        cell: Some([[side, 0.0, 0.0], [0.0, side, 0.0], [0.0, 0.0, side]]),
        pbc: [true; 3],
        ..Structure::molecule(vec![18; pos.len()], pos)
    }
}

fn nvt(temperature: f64) -> Ensemble {
    Ensemble::Nvt {
        temperature,
        friction: 5.0,
    }
}

fn run(s: &Structure, st: MdSettings) -> Vec<LogRecord> {
    run_to_cell(s, st).0
}

/// The log and the last cell.
fn run_to_cell(s: &Structure, st: MdSettings) -> (Vec<LogRecord>, Lattice) {
    let forces = CalculatorForces::new(argon(), s, Device::Cpu);
    let mut sim = Simulation::new(forces, s, st, serde_json::Value::Null).unwrap();
    let summary = sim.run(&mut |_| {}).unwrap();
    assert_eq!(summary.stop, StopReason::Completed);
    (sim.records().to_vec(), sim.cell().unwrap())
}

/// Mean and standard error of `x` from 10 blocks.
fn block_mean(x: &[f64]) -> (f64, f64) {
    let blocks: Vec<f64> = x
        .chunks(x.len() / 10)
        .take(10)
        .map(|b| b.iter().sum::<f64>() / b.len() as f64)
        .collect();
    let mean = blocks.iter().sum::<f64>() / 10.0;
    let var = blocks.iter().map(|b| (b - mean).powi(2)).sum::<f64>() / 9.0;
    (mean, (var / 10.0).sqrt())
}

fn barostat(pressure_bar: f64, mode: BarostatMode) -> Barostat {
    Barostat {
        pressure_bar,
        mode,
        time_fs: 500.0,
        compressibility_per_bar: 3e-5,
    }
}

/// 40 K argon crystal runs of `ps` picoseconds at 5 fs, logged every 50 fs.
fn crystal_run(s: &Structure, ps: f64, seed: u64, barostat: Option<Barostat>) -> Vec<LogRecord> {
    let st = MdSettings {
        dt_fs: 5.0,
        steps: (ps * 200.0) as u64,
        ensemble: nvt(40.0),
        init_temperature: 40.0,
        seed,
        log_every: 10,
        traj_every: 0,
        stop_when_unstable: false,
        log_pressure: barostat.is_none(),
        barostat,
        ..Default::default()
    };
    run(s, st)
}

/// The NVT pressure (bar) of the crystal with lattice constant `a`: mean, standard error.
fn nvt_pressure(a: f64) -> (f64, f64) {
    let rec = crystal_run(&argon_crystal(3, a), 40.0, 1, None);
    // 5 ps to equilibrate, then blocks of 3.5 ps (the pressure decorrelates in < 1 ps).
    let p: Vec<f64> = rec[100..].iter().map(|r| r.pressure_bar.unwrap()).collect();
    block_mean(&p)
}

/// The ensemble: at the pressure an NVT run measures at volume V₀, NPT (iso and aniso) comes
/// back to V₀ on average, with the volume fluctuations the compressibility implies
/// (⟨δV²⟩ = kT κ V, κ from the NVT pressures of two neighbouring volumes). A barostat that
/// missed the kinetic pressure would sit ~22 Å³ off (≈ 5 standard errors); one with its noise
/// off by 2x would fluctuate 2x too much or too little.
#[test]
fn npt_at_the_nvt_pressure_gives_back_the_nvt_volume() {
    let a: f64 = 5.30;
    let v0 = (3.0 * a).powi(3);
    let (p0, p0_err) = nvt_pressure(a);
    let (p_small, _) = nvt_pressure(a * 0.995);
    let (p_large, _) = nvt_pressure(a * 1.005);
    let dv = (3.0 * a * 1.005).powi(3) - (3.0 * a * 0.995).powi(3);
    // κ = −(1/V) dV/dP, in Å³/eV.
    let kappa = -dv / v0 / ((p_large - p_small) / BAR_PER_EV_A3);
    assert!(
        kappa > 0.0,
        "the crystal's pressure does not fall as it grows"
    );
    let s = argon_crystal(3, a);
    for (mode, seed) in [(BarostatMode::Iso, 2), (BarostatMode::Aniso, 3)] {
        let rec = crystal_run(&s, 80.0, seed, Some(barostat(p0, mode)));
        let v: Vec<f64> = rec[100..].iter().map(|r| r.volume.unwrap()).collect();
        let (mean, err) = block_mean(&v);
        // The NVT pressure's own error, as a volume.
        let from_p = kappa * v0 * p0_err / BAR_PER_EV_A3;
        let sigma = (err * err + from_p * from_p).sqrt();
        assert!(
            (mean - v0).abs() < 4.0 * sigma,
            "{mode:?}: ⟨V⟩ {mean:.2} Å³ at {p0:.1} bar, NVT volume {v0:.2} Å³ (error {sigma:.2})"
        );
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
        let expected = KB * 40.0 * kappa * v0;
        assert!(
            (0.7..1.4).contains(&(var / expected)),
            "{mode:?}: ⟨δV²⟩ {var:.1} Å⁶, kT κ V = {expected:.1} Å⁶"
        );
    }
}

/// With no noise (0 K) a compressed crystal expands to zero pressure and the barostat's
/// friction takes its energy: the effective energy keeps it all, up to the Euler–Maruyama
/// step's first-order error (halving dt halves it). Aniso mode relaxes a crystal compressed 4%
/// along x back towards a cube (within 0.5% in 10 ps).
#[test]
fn the_effective_energy_is_conserved_in_the_deterministic_limit() {
    let cube = argon_crystal(3, 5.15);
    let mut squeezed = argon_crystal(3, 5.25);
    for p in &mut squeezed.positions {
        p[0] *= 0.96;
    }
    if let Some(c) = &mut squeezed.cell {
        c[0][0] *= 0.96;
    }
    for (s, mode) in [(&cube, BarostatMode::Iso), (&squeezed, BarostatMode::Aniso)] {
        let error = |dt: f64| {
            let st = MdSettings {
                dt_fs: dt,
                steps: (10_000.0 / dt) as u64,
                ensemble: nvt(0.0),
                init_temperature: 0.0,
                log_every: (50.0 / dt) as u64,
                traj_every: 0,
                stop_when_unstable: false,
                barostat: Some(barostat(0.0, mode)),
                ..Default::default()
            };
            let (rec, cell) = run_to_cell(s, st);
            let (first, last) = (rec[0], rec[rec.len() - 1]);
            let e0 = first.e_eff.unwrap();
            let worst = rec.iter().map(|r| (r.e_eff.unwrap() - e0).abs());
            (
                last.e_tot - first.e_tot,
                worst.fold(0.0, f64::max),
                last,
                cell,
            )
        };
        let (released, coarse, last, cell) = error(5.0);
        let (_, fine, _, _) = error(2.5);
        assert!(
            released < -0.1,
            "{mode:?}: the crystal released {released} eV expanding"
        );
        assert!(
            coarse < 0.01 * released.abs(),
            "{mode:?}: effective energy moved {coarse:.3e} eV of {released:.3} eV released"
        );
        assert!(
            (1.7..2.3).contains(&(coarse / fine)),
            "{mode:?}: halving dt took the effective-energy error from {coarse:.3e} to \
             {fine:.3e} eV"
        );
        assert!(
            last.pressure_bar.unwrap().abs() < 50.0,
            "{mode:?}: {last:?}"
        );
        let lengths = cell.map(|r| r[0].hypot(r[1]).hypot(r[2]));
        assert!(
            (lengths[0] / lengths[1] - 1.0).abs() < 5e-3
                && (lengths[2] / lengths[1] - 1.0).abs() < 5e-3,
            "{mode:?}: cell lengths {lengths:?} Å, expected a cube"
        );
    }
}

/// An NPT run of a small random PaiNN model on a triclinic box, its cell pushed hard (a
/// short barostat time) so that it moves past what the skin allows within the run (the
/// random model pulls the box in: some 5% of the volume in 100 fs).
fn painn_npt(steps: u64) -> MdSettings {
    MdSettings {
        dt_fs: 0.5,
        steps,
        ensemble: nvt(300.0),
        init_temperature: 300.0,
        skin: 0.3,
        seed: 5,
        log_every: 5,
        traj_every: 10,
        restart_every: 50,
        stop_when_unstable: false,
        barostat: Some(common::stiff_barostat(BarostatMode::Aniso)),
        ..Default::default()
    }
}

fn painn_box() -> Structure {
    common::random_box(96, 0.15, 11)
}

/// The PaiNN provider follows the moving cell with its Verlet list (reference positions and
/// image offsets carried along with the deformation, rebuilt when the deformation eats the
/// skin), host list or the device list's CPU twin: the same trajectory as the calculator
/// called afresh at every step, which builds a new list in the current cell each time.
#[test]
fn painn_forces_follow_the_moving_cell_as_the_calculator_does() {
    let calc = common::calculator(DType::F64, &Device::Cpu);
    let s = painn_box();
    let st = MdSettings {
        restart_every: 0,
        traj_every: 0,
        ..painn_npt(200)
    };
    let reference = {
        let f = CalculatorForces::new(
            common::calculator(DType::F64, &Device::Cpu),
            &s,
            Device::Cpu,
        );
        let mut sim = Simulation::new(f, &s, st.clone(), serde_json::Value::Null).unwrap();
        sim.run(&mut |_| {}).unwrap();
        sim.records().to_vec()
    };
    let (v_first, v_last) = (
        reference[0].volume.unwrap(),
        reference.last().unwrap().volume.unwrap(),
    );
    assert!(
        (v_last / v_first - 1.0).abs() > 0.02,
        "the cell hardly moved ({v_first:.2} -> {v_last:.2} Å³): nothing tested"
    );
    for site in [ListSite::Host, ListSite::Device] {
        let f = PainnForces::new(&calc, &s, st.skin)
            .unwrap()
            .with_list_site(site)
            .unwrap();
        let mut sim = Simulation::new(f, &s, st.clone(), serde_json::Value::Null).unwrap();
        let summary = sim.run(&mut |_| {}).unwrap();
        assert!(summary.neighbor_list_builds > 2, "{site:?}: {summary:?}");
        for (a, b) in reference.iter().zip(sim.records()) {
            for (what, x, y) in [
                ("e_pot", a.e_pot, b.e_pot),
                ("e_kin", a.e_kin, b.e_kin),
                ("volume", a.volume.unwrap(), b.volume.unwrap()),
                ("pressure", a.pressure_bar.unwrap(), b.pressure_bar.unwrap()),
                ("e_eff", a.e_eff.unwrap(), b.e_eff.unwrap()),
            ] {
                assert!(
                    (x - y).abs() <= 1e-8 * x.abs().max(1.0),
                    "{site:?} step {}: {what} {y} vs the calculator's {x}",
                    a.step
                );
            }
        }
    }
}

/// A killed NPT run resumed from a restart file (cell, stress, heat, and the cell its list
/// was built in) writes the same files as the uninterrupted run, bit for bit.
#[test]
fn resumed_npt_run_equals_uninterrupted_run_bitwise() {
    let calc = common::calculator(DType::F64, &Device::Cpu);
    let s = painn_box();
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let new = |dir: &Path, steps: u64| {
        let st = MdSettings {
            outputs: MdOutputs {
                traj: Some(dir.join("traj.extxyz")),
                log: Some(dir.join("log.jsonl")),
                restart: Some(dir.join("restart.json")),
                ..Default::default()
            },
            ..painn_npt(steps)
        };
        let f = PainnForces::new(&calc, &s, st.skin).unwrap();
        Simulation::new(f, &s, st, serde_json::Value::Null).unwrap()
    };
    new(a.path(), 200).run(&mut |_| {}).unwrap();
    let kept = b.path().join("restart-100.json");
    let restart_path = b.path().join("restart.json");
    new(b.path(), 150)
        .run(&mut |p: &mlff_distiller::md::Progress| {
            if p.step == 100 {
                std::fs::copy(&restart_path, &kept).unwrap();
            }
        })
        .unwrap();
    let mut restart = Restart::load(&kept).unwrap();
    let state = restart.barostat.expect("an NPT restart holds the barostat");
    assert_eq!(restart.cell, Some(state.cell));
    restart.settings.steps = 200;
    let cell = restart.cell.unwrap();
    let template = Structure {
        cell: Some(cell),
        ..s.clone()
    };
    let f = PainnForces::new(&calc, &template, restart.settings.skin).unwrap();
    Simulation::resume(f, restart)
        .unwrap()
        .run(&mut |_| {})
        .unwrap();
    for name in ["traj.extxyz", "log.jsonl"] {
        assert!(
            std::fs::read(a.path().join(name)).unwrap()
                == std::fs::read(b.path().join(name)).unwrap(),
            "{name} differs between the resumed and the uninterrupted run"
        );
    }
    let frames = mlff_distiller::io::read_extxyz(&a.path().join("traj.extxyz")).unwrap();
    assert_ne!(
        frames[0].cell,
        frames[frames.len() - 1].cell,
        "the trajectory's frames carry the moving cell"
    );
}
