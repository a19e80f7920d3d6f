//! MD of many systems at once: a batch equals its systems run one by one (CPU, f64, to within
//! the rounding of candle's CPU matrix products, whose blocking depends on the row count: a
//! batched call differs from a single one in the last bits), frozen systems leave the others
//! untouched, kill and resume equals an uninterrupted run to the bit, and the Langevin
//! thermostat holds every replica at its temperature.

mod common;

use common::Poisoned;

use candle_core::{DType, Device, Tensor};
use mlff_distiller::md::{
    read_log_as, system_seed, BatchLogRecord, BatchProgress, BatchRestart, BatchSimulation,
    Ensemble, ForceProvider, HostState, ListSite, LogRecord, MdOutputs, MdSettings, PainnForces,
    Simulation, StopReason,
};
use mlff_distiller::{PainnCalculator, Structure};
use std::path::Path;

fn quiet() -> impl FnMut(&BatchProgress) {
    |_| {}
}

fn calc() -> PainnCalculator {
    common::calculator(DType::F64, &Device::Cpu)
}

fn nvt() -> Ensemble {
    Ensemble::Nvt {
        temperature: 300.0,
        friction: 20.0,
    }
}

/// A small skin, so that lists are rebuilt every few steps.
fn settings(steps: u64, ensemble: Ensemble) -> MdSettings {
    MdSettings {
        dt_fs: 0.5,
        steps,
        ensemble,
        seed: 11,
        skin: 0.2,
        init_temperature: 250.0,
        log_every: 5,
        traj_every: 0,
        stop_when_unstable: false,
        ..Default::default()
    }
}

/// A single run of `s` with the seed system `k` of a batch gets; its log and final state.
fn single<F: ForceProvider>(
    forces: F,
    s: &Structure,
    st: &MdSettings,
    k: usize,
) -> (Vec<LogRecord>, HostState, StopReason) {
    // (No outputs: they are the batch's.)
    let st = MdSettings {
        seed: system_seed(st.seed, k),
        restart_every: 0,
        outputs: MdOutputs::default(),
        ..st.clone()
    };
    let mut sim = Simulation::new(forces, s, st, serde_json::Value::Null).unwrap();
    let summary = sim.run(&mut |_| {}).unwrap();
    let state = sim.state();
    let host = |t: &Tensor| mlff_distiller::md::host_positions(t).unwrap();
    let end = HostState {
        step: state.step,
        positions: host(&state.positions),
        velocities: host(&state.velocities),
        forces: host(&state.forces),
        energy: state.energy.to_scalar::<f64>().unwrap(),
    };
    (sim.records().to_vec(), end, summary.stop)
}

/// Largest difference between two sets of rows.
fn diff(a: &[[f64; 3]], b: &[[f64; 3]]) -> f64 {
    assert_eq!(a.len(), b.len());
    common::max_force_diff(a, b)
}

/// The batch's system and a single run agree to f64 rounding grown over the run.
const CLOSE: f64 = 1e-9;

fn assert_records_close(a: &[LogRecord], b: &[LogRecord], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: log lengths");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.step, y.step, "{what}");
        for (p, q) in [
            (x.e_pot, y.e_pot),
            (x.e_kin, y.e_kin),
            (x.temperature, y.temperature),
        ] {
            assert!(
                (p - q).abs() <= CLOSE * q.abs().max(1.0),
                "{what} step {}: {p} vs {q}",
                x.step
            );
        }
    }
}

fn assert_batch_equals_singles(systems: &[Structure], st: MdSettings) {
    let calc = calc();
    let forces = PainnForces::batch(&calc, systems, st.skin).unwrap();
    let mut batch =
        BatchSimulation::new(forces, systems, st.clone(), serde_json::Value::Null).unwrap();
    let summary = batch.run(&mut quiet()).unwrap();
    assert_eq!(summary.stop, StopReason::Completed);
    assert!(summary.neighbor_list_builds > 2, "no list rebuilds");
    for (k, s) in systems.iter().enumerate() {
        let f = PainnForces::new(&calc, s, st.skin).unwrap();
        let (records, end, _) = single(f, s, &st, k);
        let got = batch.system_state(k).unwrap();
        assert_eq!(got.step, end.step);
        assert!(
            diff(&got.positions, &end.positions) < CLOSE,
            "system {k}: positions"
        );
        assert!(
            diff(&got.velocities, &end.velocities) < CLOSE,
            "system {k}: velocities"
        );
        assert!(diff(&got.forces, &end.forces) < CLOSE, "system {k}: forces");
        assert_records_close(batch.records(k), &records, &format!("system {k}"));
    }
}

#[test]
fn replicas_equal_single_runs_with_their_seeds() {
    let s = common::random_molecule(8, 3);
    assert_batch_equals_singles(&vec![s; 4], settings(80, nvt()));
}

#[test]
fn mixed_molecules_equal_single_runs() {
    let systems: Vec<Structure> = [(5, 1), (9, 2), (12, 4)]
        .iter()
        .map(|&(n, seed)| common::random_molecule(n, seed))
        .collect();
    assert_batch_equals_singles(&systems, settings(80, Ensemble::Nve));
    assert_batch_equals_singles(&systems, settings(40, nvt()));
}

/// The device list (its CPU twin here), each atom's candidates limited to its own system,
/// gives the host lists' edges in the host lists' order: the same trajectories to the bit.
#[test]
fn a_batch_on_the_device_list_equals_one_on_host_lists() {
    let calc = calc();
    let systems: Vec<Structure> = [(5, 1), (9, 2), (9, 2), (12, 4)]
        .iter()
        .map(|&(n, seed)| common::random_molecule(n, seed))
        .collect();
    let st = settings(60, nvt());
    let run = |site: ListSite| {
        let forces = PainnForces::batch(&calc, &systems, st.skin)
            .unwrap()
            .with_list_site(site)
            .unwrap();
        let mut b =
            BatchSimulation::new(forces, &systems, st.clone(), serde_json::Value::Null).unwrap();
        let summary = b.run(&mut quiet()).unwrap();
        assert!(summary.neighbor_list_builds > 2);
        (0..systems.len())
            .map(|k| b.system_state(k).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(ListSite::Device), run(ListSite::Host));
}

/// Steps with their list checks deferred (on by default only on CUDA; the CPU twin here)
/// give the trajectories and logs of steps checked one by one, the runs past a due list
/// thrown away and redone, and each system's noise stream put back with them.
#[test]
fn a_batch_with_deferred_checks_equals_one_checked_step_by_step() {
    let calc = calc();
    let systems = [
        common::random_molecule(9, 2),
        common::random_molecule(12, 4),
        common::random_molecule(9, 2),
    ];
    let st = MdSettings {
        log_every: 25,
        ..settings(150, nvt())
    };
    let run = |defer: bool| {
        let forces =
            (PainnForces::batch(&calc, &systems, st.skin).unwrap()).with_deferred_checks(defer);
        let mut b =
            BatchSimulation::new(forces, &systems, st.clone(), serde_json::Value::Null).unwrap();
        let summary = b.run(&mut quiet()).unwrap();
        let states: Vec<HostState> = (0..systems.len())
            .map(|k| b.system_state(k).unwrap())
            .collect();
        let logs: Vec<Vec<LogRecord>> = (0..systems.len()).map(|k| b.records(k).to_vec()).collect();
        let counts = (summary.deferred_steps, summary.redone_steps);
        (states, logs, summary.neighbor_list_builds, counts)
    };
    let (states, logs, builds, counts) = run(false);
    assert_eq!(counts, (0, 0));
    assert!(builds > 8, "only {builds} list builds");
    let (states_d, logs_d, builds_d, (deferred, redone)) = run(true);
    assert!(
        deferred > 75 && redone > 0,
        "{deferred} steps deferred, {redone} redone"
    );
    assert_eq!(builds_d, builds);
    assert_eq!(states_d, states);
    for (a, b) in logs_d.iter().zip(&logs) {
        let key = |r: &LogRecord| (r.step, r.e_pot, r.e_kin);
        assert_eq!(
            a.iter().map(key).collect::<Vec<_>>(),
            b.iter().map(key).collect::<Vec<_>>()
        );
    }
}

#[test]
fn a_replica_gone_non_finite_is_frozen_at_its_step_and_the_others_go_on() {
    let calc = calc();
    let s = common::random_molecule(6, 5);
    let systems = vec![s.clone(); 3];
    let dir = tempfile::tempdir().unwrap();
    let st = MdSettings {
        restart_every: 20,
        outputs: MdOutputs {
            restart: Some(dir.path().join("restart.json")),
            ..Default::default()
        },
        ..settings(40, nvt())
    };
    let forces = Poisoned::new(
        PainnForces::batch(&calc, &systems, st.skin).unwrap(),
        6..12,
        13,
    );
    let mut batch =
        BatchSimulation::new(forces, &systems, st.clone(), serde_json::Value::Null).unwrap();
    let summary = batch.run(&mut quiet()).unwrap();
    assert_eq!(summary.stop, StopReason::Completed);
    assert_eq!(summary.frozen_systems, 1);
    assert_eq!(batch.active(), &[0, 2]);
    // The same poison in a single run of system 1 stops it where the batch froze it.
    let alone = Poisoned::new(PainnForces::new(&calc, &s, st.skin).unwrap(), 0..6, 13);
    let (records, end, stop) = single(alone, &s, &st, 1);
    assert!(
        matches!(stop, StopReason::NonFinite { step: 14, .. }),
        "{stop:?}"
    );
    assert_eq!(batch.frozen(1), Some(&stop));
    assert!(!summary.systems[1].finite && !summary.systems[1].stable);
    assert_eq!(summary.systems[1].last_step, 13);
    let frozen = batch.system_state(1).unwrap();
    // (Debug text: the frozen system holds NaN, which is not equal to itself.)
    let all = batch.host_states().unwrap();
    for (k, state) in all.iter().enumerate() {
        let one = batch.system_state(k).unwrap();
        assert_eq!(format!("{state:?}"), format!("{one:?}"), "system {k}");
    }
    // The restart file holds the frozen system, NaN and all, and reads back.
    let restart = BatchRestart::load(&dir.path().join("restart.json")).unwrap();
    assert_eq!(restart.systems[1].frozen.as_ref(), Some(&stop));
    assert!(restart.systems[1].state.velocities[0][0].is_nan());
    assert_eq!(restart.systems[0].frozen, None);
    assert_eq!(frozen.step, 13);
    assert!(diff(&frozen.positions, &end.positions) < CLOSE);
    assert_records_close(batch.records(1), &records, "frozen system");
    for k in [0, 2] {
        let f = PainnForces::new(&calc, &s, st.skin).unwrap();
        let (records, end, _) = single(f, &s, &st, k);
        let got = batch.system_state(k).unwrap();
        assert_eq!(got.step, 40);
        assert!(
            diff(&got.positions, &end.positions) < CLOSE,
            "system {k} changed"
        );
        assert_records_close(batch.records(k), &records, &format!("system {k}"));
    }
}

/// `s` with momenta that stretch its bonds past 0.5 Å within a few femtoseconds.
fn kicked(s: &Structure) -> Structure {
    let momenta = (0..s.len())
        .flat_map(|i| [3.0 * (i as f64 - 10.0), 0.0, 0.0].map(|p| format!("{p:e}")))
        .collect();
    let mut out = s.clone();
    out.arrays.push(mlff_distiller::structure::ExtraArray {
        name: "momenta".into(),
        kind: 'R',
        ncols: 3,
        values: momenta,
    });
    out
}

#[test]
fn an_unstable_replica_is_frozen_at_the_log_step_that_sees_it() {
    let calc = calc();
    let s = mlff_distiller::systems::aspirin();
    let calm = {
        let mut c = kicked(&s);
        c.arrays[0].values.iter_mut().for_each(|v| *v = "0".into());
        c
    };
    let systems = vec![calm.clone(), kicked(&s), calm.clone()];
    let st = MdSettings {
        keep_momenta: true,
        stop_when_unstable: true,
        log_every: 2,
        ..settings(30, Ensemble::Nve)
    };
    let forces = PainnForces::batch(&calc, &systems, st.skin).unwrap();
    let mut batch =
        BatchSimulation::new(forces, &systems, st.clone(), serde_json::Value::Null).unwrap();
    let summary = batch.run(&mut quiet()).unwrap();
    let f = PainnForces::new(&calc, &systems[1], st.skin).unwrap();
    let (_, end, stop) = single(f, &systems[1], &st, 1);
    let StopReason::Unstable { step, .. } = stop else {
        panic!("the kicked system stayed stable: {stop:?}")
    };
    assert!(step > 0 && step < 30);
    assert_eq!(batch.frozen(1), Some(&stop));
    assert!(diff(&batch.system_state(1).unwrap().positions, &end.positions) < CLOSE);
    assert_eq!(summary.frozen_systems, 1);
    assert_eq!(summary.systems[0].stop, StopReason::Completed);
    let f = PainnForces::new(&calc, &calm, st.skin).unwrap();
    let (records, end, _) = single(f, &calm, &st, 2);
    assert!(diff(&batch.system_state(2).unwrap().positions, &end.positions) < CLOSE);
    assert_records_close(batch.records(2), &records, "system 2");
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

#[test]
fn killed_and_resumed_batch_equals_an_uninterrupted_one() {
    let calc = calc();
    let systems: Vec<Structure> = (0..16)
        .map(|k| common::random_molecule(4 + k % 3, 20 + k as u64 / 3))
        .collect();
    let base = MdSettings {
        traj_every: 10,
        restart_every: 20,
        ..settings(60, nvt())
    };
    let in_dir = |dir: &Path, steps: u64| MdSettings {
        steps,
        outputs: common::batch_outputs(dir),
        ..base.clone()
    };
    let new = |dir: &Path, steps: u64| {
        let forces = PainnForces::batch(&calc, &systems, base.skin).unwrap();
        BatchSimulation::new(
            forces,
            &systems,
            in_dir(dir, steps),
            serde_json::json!({"t": 1}),
        )
        .unwrap()
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let whole = new(a.path(), 60).run(&mut quiet()).unwrap();
    assert_eq!(whole.stop, StopReason::Completed);

    // Killed at step 50, with frames and log rows past the restart kept at step 20.
    let kept = common::restart_kept_at(b.path(), 20, |progress| {
        new(b.path(), 50).run(progress).unwrap();
    });
    let mut restart = BatchRestart::load(&kept).unwrap();
    assert_eq!((restart.step, restart.systems.len()), (20, 16));
    // The run went on past this copy: resuming it would cut its files back; refused.
    let err = restart.check_current(&kept).unwrap_err().to_string();
    assert!(
        err.contains("is stale") && err.contains("at step 50"),
        "{err}"
    );
    assert!(
        err.contains("copy the run's folder") && !err.contains("--branch"),
        "{err}"
    );
    restart.settings.steps = 60;
    let forces = PainnForces::batch(&calc, &restart.active_systems(), base.skin).unwrap();
    let mut resumed = BatchSimulation::resume(forces, restart).unwrap();
    let summary = resumed.run(&mut quiet()).unwrap();
    assert_eq!((summary.first_step, summary.last_step), (20, 60));

    let log = |d: &Path| d.join("log.jsonl");
    assert!(read(&log(a.path())) == read(&log(b.path())), "logs differ");
    for k in 0..16 {
        let traj = |d: &Path| mlff_distiller::md::system_traj(&d.join("traj"), k);
        assert!(
            read(&traj(a.path())) == read(&traj(b.path())),
            "system {k}'s trajectory"
        );
    }
    let (ra, rb) = (
        BatchRestart::load(&a.path().join("restart.json")).unwrap(),
        BatchRestart::load(&b.path().join("restart.json")).unwrap(),
    );
    for (x, y) in ra.systems.iter().zip(&rb.systems) {
        assert_eq!(x.state, y.state);
        assert_eq!(x.rng_word_pos, y.rng_word_pos);
    }
    let rows: Vec<BatchLogRecord> = read_log_as(&log(b.path()), u64::MAX).unwrap();
    assert_eq!(rows.len(), 16 * 13);
    assert_eq!(
        summary.systems[3].temperature_mean,
        whole.systems[3].temperature_mean
    );
}

#[test]
fn langevin_holds_every_replica_and_the_ensemble_at_the_target() {
    let calc = calc();
    let s = common::random_molecule(5, 8);
    let target = 300.0;
    let st = MdSettings {
        ensemble: Ensemble::Nvt {
            temperature: target,
            friction: 50.0,
        },
        init_temperature: target,
        skin: 1.0,
        log_every: 10,
        ..settings(3000, Ensemble::Nve)
    };
    let systems = vec![s; 16];
    let forces = PainnForces::batch(&calc, &systems, st.skin).unwrap();
    let mut batch = BatchSimulation::new(forces, &systems, st, serde_json::Value::Null).unwrap();
    batch.run(&mut quiet()).unwrap();
    // Skip 0.25 ps, then blocks of 0.125 ps (≫ the 0.02 ps velocity correlation time).
    let mut means = Vec::new();
    let mut variances = Vec::new();
    for k in 0..16 {
        let t: Vec<f64> = batch.records(k)[50..]
            .iter()
            .map(|r| r.temperature)
            .collect();
        let blocks: Vec<f64> = t
            .chunks(25)
            .map(|b| b.iter().sum::<f64>() / b.len() as f64)
            .collect();
        let n = blocks.len() as f64;
        let mean = blocks.iter().sum::<f64>() / n;
        let var = blocks.iter().map(|b| (b - mean).powi(2)).sum::<f64>() / (n - 1.0) / n;
        assert!(
            (mean - target).abs() < 4.5 * var.sqrt(),
            "replica {k}: {mean:.1} K, standard error {:.1} K",
            var.sqrt()
        );
        means.push(mean);
        variances.push(var);
    }
    let all = means.iter().sum::<f64>() / 16.0;
    let stderr = variances.iter().sum::<f64>().sqrt() / 16.0;
    assert!(
        stderr < 10.0,
        "standard error {stderr:.1} K too large to test anything"
    );
    assert!(
        (all - target).abs() < 4.0 * stderr,
        "ensemble {all:.1} K vs {target} K (standard error {stderr:.1} K)"
    );
    assert!(
        means.windows(2).all(|w| w[0] != w[1]),
        "replicas are not independent"
    );
}
