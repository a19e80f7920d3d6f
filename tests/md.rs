//! Molecular dynamics: integrator accuracy (dt² energy error), Langevin temperature, exact
//! restarts, device-resident forces = host forces, clean failures on bad input.

mod common;

use candle_core::{DType, Device};
use mlff_distiller::md::potentials::{HarmonicBonds, LennardJones};
use mlff_distiller::md::{
    kinetic_energy, masses, maxwell_boltzmann, read_log, temperature, Bonds, CalculatorForces,
    Ensemble, ForceProvider, ListSite, LogRecord, MdOutputs, MdSettings, PainnForces, Restart,
    Simulation, StopReason,
};
use mlff_distiller::neighbors::wrap_positions;
use mlff_distiller::{Batch, Calculator, Prediction, Structure};
use rand::SeedableRng;
use std::path::Path;

fn quiet() -> impl FnMut(&mlff_distiller::md::Progress) {
    |_| {}
}

/// 13 argon atoms: a centred cuboctahedron at the Lennard-Jones pair minimum.
fn argon_cluster() -> Structure {
    let r = 2f64.powf(1.0 / 6.0) * 3.4 / 2f64.sqrt();
    let mut pos = vec![[0.0; 3]];
    for (a, b) in [(0, 1), (0, 2), (1, 2)] {
        for (sa, sb) in [(1.0, 1.0), (1.0, -1.0), (-1.0, 1.0), (-1.0, -1.0)] {
            let mut p = [0.0; 3];
            p[a] = sa * r;
            p[b] = sb * r;
            pos.push(p);
        }
    }
    Structure::molecule(vec![18; 13], pos)
}

fn argon() -> LennardJones {
    LennardJones {
        epsilon: 0.0104,
        sigma: 3.4,
        cutoff: 8.5,
    }
}

/// Every step logged, no frames; the small random models are not physical, so their bonds may
/// stretch: only tests of the stability check stop on it.
fn settings(dt_fs: f64, steps: u64, ensemble: Ensemble) -> MdSettings {
    MdSettings {
        dt_fs,
        steps,
        ensemble,
        log_every: 1,
        traj_every: 0,
        stop_when_unstable: false,
        ..Default::default()
    }
}

fn run<F: ForceProvider>(forces: F, s: &Structure, settings: MdSettings) -> Vec<LogRecord> {
    let mut sim = Simulation::new(forces, s, settings, serde_json::Value::Null).unwrap();
    let summary = sim.run(&mut quiet()).unwrap();
    assert_eq!(summary.stop, StopReason::Completed);
    sim.records().to_vec()
}

fn host<C: Calculator>(c: C, s: &Structure) -> CalculatorForces<C> {
    CalculatorForces::new(c, s, Device::Cpu)
}

#[test]
fn nve_energy_error_scales_as_dt_squared() {
    let s = argon_cluster();
    let rms_error = |dt: f64| {
        let mut st = settings(dt, (2000.0 / dt) as u64, Ensemble::Nve);
        st.init_temperature = 30.0;
        let rec = run(host(argon(), &s), &s, st);
        let e0 = rec[0].e_tot;
        let sq: f64 = rec.iter().map(|r| (r.e_tot - e0).powi(2)).sum();
        (sq / rec.len() as f64).sqrt()
    };
    let (coarse, fine) = (rms_error(10.0), rms_error(5.0));
    let ratio = coarse / fine;
    assert!(coarse > 1e-7, "energy error {coarse} eV: nothing moved?");
    assert!(
        (3.3..4.7).contains(&ratio),
        "halving dt changed the energy error by {ratio:.2}x ({coarse:.3e} -> {fine:.3e} eV), \
         expected 4x"
    );
}

/// 32 O₂-like harmonic dimers, far apart.
fn dimers() -> (Structure, HarmonicBonds) {
    let mut pos = Vec::new();
    let mut bonds = Vec::new();
    for k in 0..32 {
        let c = [
            (k % 4) as f64 * 5.0,
            ((k / 4) % 4) as f64 * 5.0,
            (k / 16) as f64 * 5.0,
        ];
        pos.push(c);
        pos.push([c[0] + 1.2, c[1], c[2]]);
        bonds.push((2 * k, 2 * k + 1, 1.2));
    }
    let calc = HarmonicBonds { bonds, k: 20.0 };
    (Structure::molecule(vec![8; 64], pos), calc)
}

#[test]
fn langevin_mean_temperature_matches_target() {
    let (s, calc) = dimers();
    let target = 300.0;
    let ensemble = Ensemble::Nvt {
        temperature: target,
        friction: 10.0,
    };
    let mut st = settings(1.0, 24_000, ensemble);
    st.log_every = 10;
    st.init_temperature = 50.0;
    let rec = run(host(calc, &s), &s, st);
    // Drop 4 ps of equilibration, then 20 blocks of 1 ps (≫ the 0.05 ps correlation time).
    let t: Vec<f64> = rec[400..].iter().map(|r| r.temperature).collect();
    let blocks: Vec<f64> = t
        .chunks(t.len() / 20)
        .map(|b| b.iter().sum::<f64>() / b.len() as f64)
        .collect();
    let mean = blocks.iter().sum::<f64>() / blocks.len() as f64;
    let var = blocks.iter().map(|b| (b - mean).powi(2)).sum::<f64>() / (blocks.len() - 1) as f64;
    let stderr = (var / blocks.len() as f64).sqrt();
    assert!(
        stderr < 4.0,
        "standard error {stderr:.2} K too large to test anything"
    );
    assert!(
        (mean - target).abs() < 4.0 * stderr,
        "mean T {mean:.2} K vs target {target} K (standard error {stderr:.2} K)"
    );
}

fn small_painn(dtype: DType) -> mlff_distiller::PainnCalculator {
    common::calculator(dtype, &Device::Cpu)
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// Settings writing everything into `dir`.
fn outputs_in(dir: &Path, st: MdSettings) -> MdSettings {
    MdSettings {
        outputs: MdOutputs {
            traj: Some(dir.join("traj.extxyz")),
            log: Some(dir.join("log.jsonl")),
            restart: Some(dir.join("restart.json")),
            append: false,
            traj_split: false,
        },
        ..st
    }
}

#[test]
fn resumed_run_equals_uninterrupted_run_bitwise() {
    resumed_equals_uninterrupted(ListSite::Host);
}

/// The same with the list built by the device list's CPU twin: a resumed run rebuilds it from
/// the restart file's reference positions without wrapping them again.
#[test]
fn resumed_run_with_the_device_list_equals_uninterrupted_run() {
    resumed_equals_uninterrupted(ListSite::Device);
}

fn resumed_equals_uninterrupted(site: ListSite) {
    let calc = small_painn(DType::F64);
    let s = common::random_molecule(8, 3);
    let base = MdSettings {
        skin: 0.2,
        log_every: 5,
        traj_every: 10,
        restart_every: 50,
        seed: 11,
        init_temperature: 200.0,
        ..settings(
            0.5,
            200,
            Ensemble::Nvt {
                temperature: 300.0,
                friction: 20.0,
            },
        )
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let new = |dir: &Path, steps: u64| {
        let st = outputs_in(
            dir,
            MdSettings {
                steps,
                ..base.clone()
            },
        );
        let f = PainnForces::new(&calc, &s, st.skin).unwrap();
        let f = f.with_list_site(site).unwrap();
        Simulation::new(f, &s, st, serde_json::json!({"test": 1})).unwrap()
    };
    let whole = new(a.path(), 200).run(&mut quiet()).unwrap();
    assert_eq!(whole.stop, StopReason::Completed);
    assert!(
        whole.neighbor_list_builds > 1,
        "the skin never triggered a rebuild"
    );

    // A run killed at step 150: its files hold frames past its last kept restart (step 100).
    let kept = b.path().join("restart-100.json");
    let mut killed = new(b.path(), 150);
    let restart_path = b.path().join("restart.json");
    killed
        .run(&mut |p: &mlff_distiller::md::Progress| {
            if p.step == 100 {
                std::fs::copy(&restart_path, &kept).unwrap();
            }
        })
        .unwrap();
    let mut restart = Restart::load(&kept).unwrap();
    assert_eq!(restart.step, 100);
    assert_eq!(restart.caller, serde_json::json!({"test": 1}));
    restart.settings.steps = 200;
    let f = PainnForces::new(&calc, &s, base.skin).unwrap();
    let f = f.with_list_site(site).unwrap();
    let mut resumed = Simulation::resume(f, restart).unwrap();
    let summary = resumed.run(&mut quiet()).unwrap();
    assert_eq!(summary.first_step, 100);
    assert_eq!(summary.last_step, 200);

    for name in ["traj.extxyz", "log.jsonl"] {
        assert!(
            read(&a.path().join(name)) == read(&b.path().join(name)),
            "{name} differs between the resumed and the uninterrupted run"
        );
    }
    let (ra, rb) = (
        Restart::load(&a.path().join("restart.json")).unwrap(),
        Restart::load(&restart_path).unwrap(),
    );
    assert_eq!(ra.step, 200);
    assert_eq!(ra.positions, rb.positions);
    assert_eq!(ra.velocities, rb.velocities);
    assert_eq!(ra.rng_word_pos, rb.rng_word_pos);
    // The summary covers the whole run, the part before the restart included.
    assert_eq!(summary.temperature_mean, whole.temperature_mean);
    assert_eq!(
        read_log(&b.path().join("log.jsonl"), u64::MAX)
            .unwrap()
            .len(),
        41
    );
}

#[test]
fn resume_refuses_a_truncated_trajectory() {
    let calc = small_painn(DType::F64);
    let s = common::random_molecule(6, 4);
    let dir = tempfile::tempdir().unwrap();
    let st = outputs_in(
        dir.path(),
        MdSettings {
            restart_every: 20,
            traj_every: 5,
            ..settings(0.5, 20, Ensemble::Nve)
        },
    );
    let f = PainnForces::new(&calc, &s, st.skin).unwrap();
    Simulation::new(f, &s, st, serde_json::Value::Null)
        .unwrap()
        .run(&mut quiet())
        .unwrap();
    let traj = dir.path().join("traj.extxyz");
    let bytes = read(&traj);
    std::fs::write(&traj, &bytes[..bytes.len() / 2]).unwrap();
    let restart = Restart::load(&dir.path().join("restart.json")).unwrap();
    let f = PainnForces::new(&calc, &s, 1.0).unwrap();
    let err = Simulation::resume(f, restart).err().unwrap().to_string();
    assert!(
        err.contains("traj.extxyz") && err.contains("truncated"),
        "{err}"
    );
}

#[test]
fn device_resident_painn_forces_match_the_host_calculator_path() {
    let calc = small_painn(DType::F64);
    let s = common::random_molecule(10, 5);
    let st = MdSettings {
        skin: 0.3,
        ..settings(0.5, 60, Ensemble::Nve)
    };
    let verlet = run(
        PainnForces::new(&calc, &s, st.skin).unwrap(),
        &s,
        st.clone(),
    );
    let plain = run(host(small_painn(DType::F64), &s), &s, st);
    for (a, b) in verlet.iter().zip(&plain) {
        assert!(
            (a.e_pot - b.e_pot).abs() < 1e-9 && (a.e_kin - b.e_kin).abs() < 1e-9,
            "step {}: {a:?} vs {b:?}",
            a.step
        );
    }
}

/// Deferring the neighbour-list checks (read back once per run of steps, the default on CUDA)
/// changes nothing: with a skin small enough that the list is due every few steps, and logs
/// only every 25 steps, so that most rebuilds are found after the fact and their step redone,
/// the runs (NVT: the noise stream is rewound too) equal the step-by-step checks bit for bit.
#[test]
fn deferred_list_checks_give_the_same_trajectory() {
    let calc = small_painn(DType::F64);
    let molecule = common::random_molecule(10, 5);
    let nvt = Ensemble::Nvt {
        temperature: 500.0,
        friction: 20.0,
    };
    let st = MdSettings {
        skin: 0.4,
        log_every: 25,
        ..settings(0.5, 150, nvt)
    };
    let sim = |defer: bool| {
        let f = PainnForces::new(&calc, &molecule, st.skin)
            .unwrap()
            .with_deferred_checks(defer);
        let mut sim = Simulation::new(f, &molecule, st.clone(), serde_json::Value::Null).unwrap();
        let summary = sim.run(&mut quiet()).unwrap();
        let state = sim.state();
        let x = mlff_distiller::md::host_positions(&state.positions).unwrap();
        let v = mlff_distiller::md::host_positions(&state.velocities).unwrap();
        let deferred = (summary.deferred_steps, summary.redone_steps);
        (
            sim.records().to_vec(),
            summary.neighbor_list_builds,
            x,
            v,
            deferred,
        )
    };
    let (log, builds, x, v, deferred) = sim(false);
    assert!(builds > 8, "only {builds} list builds");
    assert_eq!(deferred, (0, 0));
    let (log_d, builds_d, x_d, v_d, (deferred, redone)) = sim(true);
    assert!(
        deferred > 75 && redone > 0,
        "{deferred} steps deferred, {redone} redone"
    );
    assert_eq!(builds_d, builds);
    assert_eq!((x_d, v_d), (x, v));
    assert_eq!(log_d.len(), log.len());
    for (a, b) in log_d.iter().zip(&log) {
        assert_eq!((a.step, a.e_pot, a.e_kin), (b.step, b.e_pot, b.e_kin));
    }
}

/// MD with the list from the device list (its CPU twin) follows MD with the host cell list
/// bit for bit: the same edges in the same order, built at the same steps, and the same
/// wrapped positions, for a molecule (NVT) and a periodic box (NVE).
#[test]
fn device_list_md_equals_host_list_md() {
    let calc = small_painn(DType::F64);
    let molecule = common::random_molecule(10, 5);
    let water = mlff_distiller::systems::water_box(27, 2);
    let nvt = Ensemble::Nvt {
        temperature: 500.0,
        friction: 20.0,
    };
    for (s, st) in [
        (
            &molecule,
            MdSettings {
                skin: 0.3,
                ..settings(0.5, 60, nvt)
            },
        ),
        (
            &water,
            MdSettings {
                skin: 0.1,
                init_temperature: 600.0,
                ..settings(0.5, 30, Ensemble::Nve)
            },
        ),
    ] {
        let sim = |site: ListSite, prune_from: usize| {
            let f = PainnForces::new(&calc, s, st.skin)
                .unwrap()
                .with_list_site(site)
                .unwrap()
                .with_pruning_from(prune_from);
            assert_eq!(f.list_on_device(), site == ListSite::Device);
            let mut sim = Simulation::new(f, s, st.clone(), serde_json::Value::Null).unwrap();
            let summary = sim.run(&mut quiet()).unwrap();
            let x = mlff_distiller::md::host_positions(&sim.state().positions).unwrap();
            (sim.records().to_vec(), summary.neighbor_list_builds, x)
        };
        let (host_log, host_builds, host_x) = sim(ListSite::Host, 0);
        assert!(host_builds > 1, "the skin never triggered a rebuild");
        // The device list as built, and pruned to the model's cutoff at every call (the
        // skin's pairs contribute exactly zero, so nothing changes).
        for prune_from in [usize::MAX, 0] {
            let (dev_log, dev_builds, dev_x) = sim(ListSite::Device, prune_from);
            assert_eq!(dev_builds, host_builds);
            assert_eq!(dev_x, host_x);
            for (a, b) in dev_log.iter().zip(&host_log) {
                assert_eq!((a.e_pot, a.e_kin), (b.e_pot, b.e_kin), "step {}", a.step);
            }
        }
    }
    // `auto` keeps the host list on the CPU; `device` refuses a cell the list cannot serve.
    let f = PainnForces::new(&calc, &water, 0.1).unwrap();
    assert!(!f.list_on_device());
    let small = mlff_distiller::systems::water_box(8, 1);
    let err = PainnForces::new(&calc, &small, 1.0)
        .unwrap()
        .with_list_site(ListSite::Device);
    assert!(err.err().unwrap().to_string().contains("twice the cutoff"));
}

#[test]
fn periodic_box_is_wrapped_and_bonds_survive_wrapping() {
    let water = mlff_distiller::systems::water_box(27, 1);
    let bonds = Bonds::detect(&water).unwrap();
    assert_eq!(bonds.pairs.len(), 54, "two O-H bonds per water");
    // Shift everything by most of a cell and wrap: bond lengths are unchanged.
    let side = water.cell.unwrap()[0][0];
    let mut moved: Vec<[f64; 3]> = (water.positions.iter())
        .map(|p| [p[0] + 0.9 * side, p[1] - 1.7 * side, p[2] + 0.33])
        .collect();
    wrap_positions(&mut moved, water.cell.as_ref(), water.pbc).unwrap();
    for p in &moved {
        assert!(
            p.iter().all(|&x| (0.0..side).contains(&x)),
            "{p:?} not wrapped"
        );
    }
    assert!(bonds.deviation(&water, &moved).unwrap().max < 1e-9);

    // A short NVE run of the box with the small model stays inside the cell.
    let calc = small_painn(DType::F64);
    let st = MdSettings {
        skin: 0.1,
        init_temperature: 600.0,
        ..settings(0.5, 30, Ensemble::Nve)
    };
    let mut sim = Simulation::new(
        PainnForces::new(&calc, &water, st.skin).unwrap(),
        &water,
        st,
        serde_json::Value::Null,
    )
    .unwrap();
    sim.run(&mut quiet()).unwrap();
    let x = mlff_distiller::md::host_positions(&sim.state().positions).unwrap();
    assert!(x.iter().flatten().all(|&c| (-0.2..side + 0.2).contains(&c)));
}

#[test]
fn maxwell_boltzmann_has_the_target_temperature_and_no_drift() {
    let (s, _) = dimers();
    let m = masses(&s.numbers).unwrap();
    assert_eq!(masses(&[1, 6, 8]).unwrap(), vec![1.008, 12.011, 15.999]);
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(5);
    let v = maxwell_boltzmann(&m, 450.0, &mut rng);
    let t = temperature(kinetic_energy(&v, &m), 3 * m.len() - 3);
    assert!((t - 450.0).abs() < 1e-9, "{t}");
    for d in 0..3 {
        let p: f64 = v.iter().zip(&m).map(|(v, m)| m * v[d]).sum();
        assert!(p.abs() < 1e-12, "momentum {p}");
    }
    assert!(masses(&[1, 0]).unwrap_err().to_string().contains("atom 1"));
}

/// Files in a folder.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn bad_starts_fail_before_the_first_step_and_leave_no_files() {
    let calc = small_painn(DType::F64);
    let good = common::random_molecule(6, 8);
    let start = |s: &Structure, st: MdSettings| {
        let f = PainnForces::new(&calc, &good, 1.0).unwrap();
        Simulation::new(f, s, st, serde_json::Value::Null)
            .err()
            .expect("must fail")
            .to_string()
    };
    let dir = tempfile::tempdir().unwrap();
    let st = outputs_in(
        dir.path(),
        MdSettings {
            restart_every: 1,
            ..settings(0.5, 10, Ensemble::Nve)
        },
    );

    let mut on_top = good.clone();
    on_top.positions[4] = on_top.positions[1];
    let err = start(&on_top, st.clone());
    assert!(
        err.contains("atoms 1 and 4") && err.contains("overlapping"),
        "{err}"
    );

    let mut nan = good.clone();
    nan.positions[3][1] = f64::NAN;
    let err = start(&nan, st.clone());
    assert!(
        err.contains("atom 3") && err.contains("non-finite"),
        "{err}"
    );
    assert!(listing(dir.path()).is_empty(), "{:?}", listing(dir.path()));

    let mut unwritable = st.clone();
    unwritable.outputs.traj = Some(dir.path().join("missing-folder/traj.extxyz"));
    let err = start(&good, unwritable);
    assert!(err.contains("missing-folder/traj.extxyz"), "{err}");
    assert!(listing(dir.path()).is_empty(), "{:?}", listing(dir.path()));

    let bad_dt = start(&good, settings(-0.5, 10, Ensemble::Nve));
    assert!(bad_dt.contains("time step"), "{bad_dt}");
}

/// Forces that turn into NaN at the 25th call.
struct BlowsUp(std::cell::Cell<usize>, HarmonicBonds);

impl Calculator for BlowsUp {
    fn compute(&self, batch: &Batch) -> mlff_distiller::Result<Prediction> {
        self.0.set(self.0.get() + 1);
        let mut p = self.1.compute(batch)?;
        if self.0.get() >= 25 {
            p.energies[0] = f64::NAN;
            p.forces[0][0] = [f64::NAN; 3];
        }
        Ok(p)
    }
    fn cutoff(&self) -> f64 {
        0.0
    }
}

#[test]
fn a_run_that_blows_up_stops_cleanly_and_keeps_its_frames() {
    let (s, bonds) = dimers();
    let dir = tempfile::tempdir().unwrap();
    let st = outputs_in(
        dir.path(),
        MdSettings {
            traj_every: 5,
            restart_every: 10,
            ..settings(1.0, 100, Ensemble::Nve)
        },
    );
    let calc = BlowsUp(std::cell::Cell::new(0), bonds);
    let mut sim = Simulation::new(host(calc, &s), &s, st, serde_json::Value::Null).unwrap();
    let summary = sim.run(&mut quiet()).unwrap();
    assert!(!summary.finite && !summary.stable);
    let StopReason::NonFinite { step, .. } = summary.stop else {
        panic!("{:?}", summary.stop)
    };
    assert!((24..=25).contains(&step), "stopped at {step}");
    let frames = mlff_distiller::io::read_extxyz(&dir.path().join("traj.extxyz")).unwrap();
    assert_eq!(frames.len(), 5, "frames 0, 5, .., 20");
    assert_eq!(
        Restart::load(&dir.path().join("restart.json"))
            .unwrap()
            .step,
        20
    );
}

#[test]
fn stretched_bond_is_reported_unstable() {
    // A dimer whose spring pushes it apart far beyond 0.5 Å.
    let s = Structure::molecule(vec![8, 8], vec![[0.0; 3], [1.2, 0.0, 0.0]]);
    let calc = HarmonicBonds {
        bonds: vec![(0, 1, 3.0)],
        k: 5.0,
    };
    let st = MdSettings {
        init_temperature: 0.0,
        stop_when_unstable: true,
        ..settings(0.5, 400, Ensemble::Nve)
    };
    let mut sim = Simulation::new(host(calc, &s), &s, st, serde_json::Value::Null).unwrap();
    let summary = sim.run(&mut quiet()).unwrap();
    assert!(!summary.stable);
    match summary.stop {
        StopReason::Unstable {
            atoms, deviation, ..
        } => {
            assert_eq!(atoms, (0, 1));
            assert!(deviation > 0.5);
        }
        other => panic!("{other:?}"),
    }
    assert!(summary.last_step < 400);
}

#[test]
fn a_written_frame_restarts_with_its_momenta() {
    // Run, then start a new run from the last trajectory frame with keep_momenta: same
    // positions, same kinetic energy (momenta read back exactly as ASE would).
    let calc = small_painn(DType::F64);
    let s = common::random_molecule(7, 9);
    let dir = tempfile::tempdir().unwrap();
    let st = outputs_in(
        dir.path(),
        MdSettings {
            traj_every: 10,
            log_every: 10,
            ..settings(0.5, 40, Ensemble::Nve)
        },
    );
    let f = PainnForces::new(&calc, &s, 1.0).unwrap();
    let mut sim = Simulation::new(f, &s, st, serde_json::Value::Null).unwrap();
    sim.run(&mut quiet()).unwrap();
    let last = sim.records().last().copied().unwrap();
    let frames = mlff_distiller::io::read_extxyz(&dir.path().join("traj.extxyz")).unwrap();
    let frame = frames.last().unwrap();
    assert_eq!(frame.info_value("step"), Some("40"));
    let again = MdSettings {
        keep_momenta: true,
        ..settings(0.5, 1, Ensemble::Nve)
    };
    let f = PainnForces::new(&calc, frame, 1.0).unwrap();
    let mut next = Simulation::new(f, frame, again, serde_json::Value::Null).unwrap();
    next.run(&mut quiet()).unwrap();
    let first = next.records()[0];
    assert!(
        (first.e_kin - last.e_kin).abs() < 1e-12 * last.e_kin.max(1.0),
        "{first:?} vs {last:?}"
    );
    assert!(
        (first.e_pot - last.e_pot).abs() < 1e-9,
        "{first:?} vs {last:?}"
    );

    // A frame without momenta is refused with the reason.
    let f = PainnForces::new(&calc, &s, 1.0).unwrap();
    let err = Simulation::new(
        f,
        &s,
        MdSettings {
            keep_momenta: true,
            ..settings(0.5, 1, Ensemble::Nve)
        },
        serde_json::Value::Null,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("momenta"), "{err}");
}

#[test]
fn a_corrupt_restart_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.json");
    std::fs::write(&path, b"{\"format\": \"mlff-md-restart\", \"version\": 1,").unwrap();
    let err = Restart::load(&path).unwrap_err().to_string();
    assert!(
        err.contains("broken.json") && err.contains("not an mlff md restart file"),
        "{err}"
    );
}
