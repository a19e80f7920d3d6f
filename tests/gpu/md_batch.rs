//! Many systems in one MD run on CUDA: the batch follows the CPU batch (f64), and each of its
//! systems follows its own single run on CUDA to f32 rounding (the shipped model, the fused
//! path, the device list limited to each system's atoms, graphs where the tuning takes them).

use crate::common::*;
use crate::{cuda, shipped_calculator};
use candle_core::{DType, Device};
use mlff_distiller::md::{
    host_positions, system_seed, BatchSimulation, Ensemble, ForceProvider, MdSettings, PainnForces,
    Simulation, StopReason,
};
use mlff_distiller::model::Backend;
use mlff_distiller::systems::{aspirin, start_geometry};
use mlff_distiller::Structure;

fn settings(ensemble: Ensemble) -> MdSettings {
    MdSettings {
        steps: 100,
        ensemble,
        skin: 0.2,
        traj_every: 0,
        log_every: 20,
        stop_when_unstable: false,
        seed: 5,
        ..Default::default()
    }
}

const ENSEMBLES: [Ensemble; 2] = [
    Ensemble::Nve,
    Ensemble::Nvt {
        temperature: 300.0,
        friction: 10.0,
    },
];

fn batch_positions(
    calc: &mlff_distiller::PainnCalculator,
    systems: &[Structure],
    st: &MdSettings,
) -> (Vec<Vec<[f64; 3]>>, usize) {
    let f = PainnForces::batch(calc, systems, st.skin).unwrap();
    let on_device = f.list_on_device();
    let mut b = BatchSimulation::new(f, systems, st.clone(), serde_json::Value::Null).unwrap();
    let summary = b.run(&mut |_| {}).unwrap();
    assert_eq!(summary.stop, StopReason::Completed);
    assert!(
        summary.neighbor_list_builds > 1,
        "the lists were never rebuilt"
    );
    if calc.device().is_cuda() {
        assert!(
            on_device,
            "a batch of molecules builds its list on the device"
        );
    }
    let x = (0..systems.len())
        .map(|k| b.system_state(k).unwrap().positions)
        .collect();
    (x, summary.neighbor_list_builds)
}

#[test]
fn cuda_batch_md_matches_cpu_batch_md() {
    let systems = vec![aspirin(), random_molecule(12, 4), aspirin()];
    for ensemble in ENSEMBLES {
        let st = settings(ensemble);
        let (cpu, _) = batch_positions(&calculator(DType::F64, &Device::Cpu), &systems, &st);
        let (gpu, builds) = batch_positions(&calculator(DType::F64, &cuda()), &systems, &st);
        for (k, (a, b)) in cpu.iter().zip(&gpu).enumerate() {
            let dx = max_force_diff(a, b);
            println!(
                "{} system {k}: {dx:.2e} Å ({builds} builds)",
                ensemble.name()
            );
            assert!(
                dx < 1e-8,
                "{} system {k}: {dx} Å after 100 steps",
                ensemble.name()
            );
        }
    }
}

#[test]
fn cuda_batch_md_systems_follow_their_single_runs() {
    let gpu = cuda();
    let calc = shipped_calculator(&gpu, DType::F32, Backend::Fused);
    let mut systems: Vec<Structure> = ["ethanol", "benzene", "aspirin", "trialanine"]
        .iter()
        .map(|n| start_geometry(n).unwrap())
        .collect();
    systems.extend(vec![aspirin(); 4]);
    for ensemble in ENSEMBLES {
        let st = settings(ensemble);
        let (batch, _) = batch_positions(&calc, &systems, &st);
        for (k, s) in systems.iter().enumerate() {
            let single = MdSettings {
                seed: system_seed(st.seed, k),
                ..st.clone()
            };
            let f = PainnForces::new(&calc, s, st.skin).unwrap();
            let mut sim = Simulation::new(f, s, single, serde_json::Value::Null).unwrap();
            sim.run(&mut |_| {}).unwrap();
            let x = host_positions(&sim.state().positions).unwrap();
            let dx = max_force_diff(&batch[k], &x);
            println!(
                "{} system {k} ({} atoms): {dx:.2e} Å",
                ensemble.name(),
                s.len()
            );
            assert!(
                dx < 1e-3,
                "{} system {k}: {dx} Å after 100 steps",
                ensemble.name()
            );
        }
    }
}

/// The device list of a batch on CUDA equals the CPU twin's: each atom paired only within its
/// own system, in the host lists' order.
#[test]
fn cuda_batch_device_list_matches_host_lists() {
    let systems = [
        aspirin(),
        random_molecule(30, 8),
        aspirin(),
        random_molecule(12, 9),
    ];
    let edges = crate::common::device_list::check_systems_against_host(&systems, 5.0, &cuda());
    assert!(edges > 0);
}

/// A batch at constant pressure on CUDA (f64: op by op, host lists, every system its own cell
/// and barostat) follows the CPU batch: energies, volumes and final cells.
#[test]
fn cuda_npt_batch_matches_cpu_npt_batch() {
    use mlff_distiller::md::BarostatMode;
    let systems = vec![
        random_box(30, 0.15, 11),
        random_box(24, 0.0, 12),
        random_box(30, 0.15, 11),
    ];
    let st = MdSettings {
        steps: 60,
        dt_fs: 0.5,
        skin: 0.3,
        log_every: 10,
        barostat: Some(stiff_barostat(BarostatMode::Aniso)),
        ..settings(ENSEMBLES[1])
    };
    let run = |dev: &Device| {
        let calc = calculator(DType::F64, dev);
        let f = PainnForces::batch(&calc, &systems, st.skin).unwrap();
        let mut b = BatchSimulation::new(f, &systems, st.clone(), serde_json::Value::Null).unwrap();
        assert_eq!(b.run(&mut |_| {}).unwrap().stop, StopReason::Completed);
        (0..systems.len())
            .map(|k| (b.records(k).to_vec(), b.cell(k).unwrap()))
            .collect::<Vec<_>>()
    };
    let (cpu, gpu) = (run(&Device::Cpu), run(&cuda()));
    for (k, ((rc, cc), (rg, cg))) in cpu.iter().zip(&gpu).enumerate() {
        for (a, b) in rc.iter().zip(rg) {
            for (what, p, q) in [
                ("e_pot", a.e_pot, b.e_pot),
                ("volume", a.volume.unwrap(), b.volume.unwrap()),
                ("e_eff", a.e_eff.unwrap(), b.e_eff.unwrap()),
            ] {
                assert!(
                    (p - q).abs() <= 1e-8 * p.abs().max(1.0),
                    "system {k} step {}: {what} {p} vs {q}",
                    a.step
                );
            }
        }
        let dc = (cc.iter().flatten().zip(cg.iter().flatten()))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        let start = systems[k].cell.unwrap();
        let moved = (start.iter().flatten().zip(cg.iter().flatten()))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        println!("npt system {k}: cells {dc:.2e} Å apart after 60 steps, moved {moved:.2e} Å");
        assert!(dc < 1e-8, "system {k}: cells {dc} apart");
        assert!(
            moved > 1e-4,
            "system {k}: the cell did not move ({moved} Å)"
        );
    }
}

/// A batch whose steps run as CUDA graph replays, each step's successor queued before its
/// check is read, follows the same batch run op by op (f64): with a skin that holds for many
/// steps (queued steps used) and one that holds for a few (queued steps thrown away when
/// the list is due).
#[test]
fn cuda_batch_graph_replays_follow_eager_steps() {
    use mlff_distiller::device::{select, DeviceSpec};
    use mlff_distiller::graph::Graphs;
    // A stream of its own, without per-buffer events: graphs can be captured on it.
    let gpu = select(DeviceSpec::Cuda(0)).unwrap().device;
    let calc = crate::shipped_calculator(&gpu, DType::F64, Backend::Fused);
    let systems = vec![aspirin(), start_geometry("ethanol").unwrap(), aspirin()];
    let (mut used, mut thrown) = (0, 0);
    for (skin, ensemble) in [
        (0.3, ENSEMBLES[0]),
        (0.05, ENSEMBLES[1]),
        (0.3, ENSEMBLES[1]),
    ] {
        let st = MdSettings {
            steps: 300,
            skin,
            ..settings(ensemble)
        };
        let run = |graphs: Graphs| {
            let f = (PainnForces::batch(&calc, &systems, skin).unwrap())
                .with_graphs(graphs)
                .unwrap();
            let mut b =
                BatchSimulation::new(f, &systems, st.clone(), serde_json::Value::Null).unwrap();
            assert_eq!(b.run(&mut |_| {}).unwrap().stop, StopReason::Completed);
            let f = b.forces();
            let counts = (f.replayed_steps(), f.queued_steps(), f.list_builds());
            let x: Vec<_> = (0..systems.len())
                .map(|k| b.system_state(k).unwrap().positions)
                .collect();
            (x, counts)
        };
        let (eager, (replayed0, _, builds0)) = run(Graphs::Off);
        let (graphs, (replayed, (u, t), builds)) = run(Graphs::On);
        let what = format!("skin {skin}, {}", ensemble.name());
        println!(
            "{what}: {replayed} of 300 steps replayed, queued {u} used and {t} thrown, \
             {builds} builds"
        );
        assert_eq!(replayed0, 0, "{what}: graphs off replayed steps");
        assert_eq!(builds, builds0, "{what}: list builds differ");
        assert!(replayed > 100, "{what}: only {replayed} steps replayed");
        for (k, (a, b)) in eager.iter().zip(&graphs).enumerate() {
            let dx = max_force_diff(a, b);
            assert!(dx < 1e-6, "{what} system {k}: {dx} Å after 300 steps");
        }
        (used, thrown) = (used + u, thrown + t);
    }
    assert!(used > 100, "only {used} queued steps used");
    assert!(thrown > 0, "no queued step was thrown away");
}
