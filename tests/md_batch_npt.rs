//! Constant pressure for a batch of systems (issue 49): each system of one force provider
//! follows a cell of its own.

mod common;

use candle_core::{DType, Device, Tensor};
use mlff_distiller::md::{ForceProvider, ListSite, PainnForces};
use mlff_distiller::structure::Lattice;
use mlff_distiller::Structure;

/// `cell` scaled along its axes by `s` (rows are the cell vectors).
fn scaled(cell: &Lattice, s: [f64; 3]) -> Lattice {
    std::array::from_fn(|i| std::array::from_fn(|j| cell[i][j] * s[i]))
}

/// `s`'s positions moved with its cell going from `from` to `to` (fractional coordinates
/// kept), f64 rows.
fn moved_with(s: &Structure, from: &Lattice, to: &Lattice) -> Vec<[f64; 3]> {
    let inv = mlff_distiller::structure::inverse(from).unwrap();
    s.positions
        .iter()
        .map(|p| {
            let frac: [f64; 3] = std::array::from_fn(|j| (0..3).map(|k| p[k] * inv[k][j]).sum());
            std::array::from_fn(|j| (0..3).map(|k| frac[k] * to[k][j]).sum())
        })
        .collect()
}

fn rows(x: &[[f64; 3]]) -> Tensor {
    let flat: Vec<f64> = x.iter().flatten().copied().collect();
    Tensor::from_vec(flat, (x.len(), 3), &Device::Cpu).unwrap()
}

/// Energy, forces and stress of one provider call, on the host.
type Call = (Vec<f64>, Vec<[f64; 3]>, Vec<Lattice>);

fn call(f: &mut impl ForceProvider, x: &[[f64; 3]]) -> Call {
    let mut x = rows(x);
    let (e, stresses) = f.evaluate_with_stress(&mut x).unwrap();
    let energy = e.energy.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    let forces = e.forces.to_vec2::<f64>().unwrap();
    let forces = forces.into_iter().map(|r| [r[0], r[1], r[2]]).collect();
    (
        energy,
        forces,
        stresses.into_iter().map(|s| s.unwrap()).collect(),
    )
}

fn close(a: f64, b: f64, scale: f64) -> bool {
    (a - b).abs() <= 1e-10 * scale.max(1.0)
}

/// Two boxes in one provider, each strained its own way (a small strain that keeps the list,
/// then one that rebuilds it), give each box's energy, forces and stress from a provider of
/// its own under the same strains; and after the first box leaves the batch, the second
/// still does.
#[test]
fn batch_systems_follow_cells_of_their_own() {
    let calc = common::calculator(DType::F64, &Device::Cpu);
    let boxes = [
        common::random_box(10, 0.2, 31),
        common::random_box(13, 0.0, 32),
    ];
    let strains = [
        [[1.004, 0.997, 1.0], [0.996, 1.0, 1.003]],
        [[1.3, 0.78, 1.0], [0.75, 1.25, 1.1]],
    ];
    let cell = |k: usize, step: usize| match step {
        0 => boxes[k].cell.unwrap(),
        _ => scaled(&boxes[k].cell.unwrap(), strains[step - 1][k]),
    };
    let positions = |k: usize, step: usize| moved_with(&boxes[k], &cell(k, 0), &cell(k, step));
    let skin = 1.0;
    let mut batch = PainnForces::batch(&calc, &boxes, skin).unwrap();
    let mut singles: Vec<PainnForces> = (0..2)
        .map(|k| PainnForces::new(&calc, &boxes[k], skin).unwrap())
        .collect();
    let mut builds = Vec::new();
    for step in 0..3 {
        if step > 0 {
            batch.set_cells(&[cell(0, step), cell(1, step)]).unwrap();
        }
        let x: Vec<[f64; 3]> = (0..2).flat_map(|k| positions(k, step)).collect();
        let (e, f, sigma) = call(&mut batch, &x);
        builds.push(batch.list_builds());
        let mut first = 0;
        for (k, single) in singles.iter_mut().enumerate() {
            if step > 0 {
                single.set_cells(&[cell(k, step)]).unwrap();
            }
            let (e_k, f_k, sigma_k) = call(single, &positions(k, step));
            assert!(
                close(e[k], e_k[0], e_k[0].abs()),
                "step {step} box {k}: {e:?} vs {e_k:?}"
            );
            for (i, (a, b)) in f[first..first + f_k.len()].iter().zip(&f_k).enumerate() {
                for d in 0..3 {
                    assert!(
                        close(a[d], b[d], 1.0),
                        "step {step} box {k} atom {i}: {a:?} vs {b:?}"
                    );
                }
            }
            for (a, b) in sigma[k].iter().flatten().zip(sigma_k[0].iter().flatten()) {
                assert!(
                    close(*a, *b, 1e-3),
                    "step {step} box {k}: σ {sigma:?} vs {sigma_k:?}"
                );
            }
            first += f_k.len();
        }
        assert_eq!(batch.list_cells().map(|c| c.len()), (step > 0).then_some(2));
    }
    // The small strain keeps the list; the large one rebuilds it.
    assert_eq!(builds[1], builds[0], "{builds:?}");
    assert!(builds[2] > builds[1], "{builds:?}");
    // The second box alone, in the batch's provider, after one more move.
    batch.retain_systems(&[false, true]).unwrap();
    let last = scaled(&cell(1, 2), [1.002, 1.0, 0.999]);
    batch.set_cells(&[last]).unwrap();
    let x = moved_with(&boxes[1], &cell(1, 0), &last);
    let (e, _, sigma) = call(&mut batch, &x);
    singles[1].set_cells(&[last]).unwrap();
    let (e_1, _, sigma_1) = call(&mut singles[1], &x);
    assert!(close(e[0], e_1[0], e_1[0].abs()), "{e:?} vs {e_1:?}");
    for (a, b) in sigma[0].iter().flatten().zip(sigma_1[0].iter().flatten()) {
        assert!(close(*a, *b, 1e-3), "σ {sigma:?} vs {sigma_1:?}");
    }
    // A cell for each system, every one periodic.
    assert!(batch.set_cells(&[last, last]).is_err());
    let molecule = common::random_molecule(5, 3);
    let mut mixed = PainnForces::batch(&calc, &[boxes[0].clone(), molecule], skin).unwrap();
    let err = mixed.set_cells(&[cell(0, 1), cell(0, 1)]).unwrap_err();
    assert!(err.to_string().contains("system 1"), "{err}");
    // Replicas of one box may share the device list until their cells move apart.
    // (a box wider than twice the list cutoff, 5 Å)
    let wide = common::random_box(130, 0.0, 33);
    let replicas = [wide.clone(), wide.clone()];
    let mut shared = (PainnForces::batch(&calc, &replicas, skin).unwrap())
        .with_list_site(ListSite::Device)
        .unwrap();
    let moved = scaled(&wide.cell.unwrap(), [1.01, 1.0, 1.0]);
    let err = (shared.set_cells(&[moved, wide.cell.unwrap()])).unwrap_err();
    assert!(err.to_string().contains("serves one cell"), "{err}");
}

/// Batched NPT: replicas of one triclinic box and two other boxes, each with its own cell and
/// barostat, against single NPT runs with the seeds the batch gives them.
mod steps {
    use super::common;
    use candle_core::{DType, Device, Tensor};
    use mlff_distiller::md::{
        system_seed, BarostatMode, BatchSimulation, Ensemble, LogRecord, MdOutputs, MdSettings,
        PainnForces, Simulation, StopReason,
    };
    use mlff_distiller::structure::Lattice;
    use mlff_distiller::Structure;

    /// tests/npt.rs's PaiNN NPT settings with a stronger thermostat (friction 20/ps): the
    /// cell pushed hard, so that it moves past what the skin allows within the run.
    fn npt(steps: u64) -> MdSettings {
        MdSettings {
            dt_fs: 0.5,
            steps,
            ensemble: Ensemble::Nvt {
                temperature: 300.0,
                friction: 20.0,
            },
            init_temperature: 300.0,
            skin: 0.3,
            seed: 5,
            log_every: 5,
            stop_when_unstable: false,
            barostat: Some(common::stiff_barostat(BarostatMode::Aniso)),
            ..Default::default()
        }
    }

    /// A single run's log, final positions and velocities, and cell.
    type Single = (Vec<LogRecord>, Vec<[f64; 3]>, Vec<[f64; 3]>, Lattice);

    fn single(s: &Structure, st: &MdSettings, k: usize) -> Single {
        let calc = common::calculator(DType::F64, &Device::Cpu);
        let st = MdSettings {
            seed: system_seed(st.seed, k),
            outputs: MdOutputs::default(),
            ..st.clone()
        };
        let f = PainnForces::new(&calc, s, st.skin).unwrap();
        let mut sim = Simulation::new(f, s, st, serde_json::Value::Null).unwrap();
        sim.run(&mut |_| {}).unwrap();
        let host = |t: &Tensor| mlff_distiller::md::host_positions(t).unwrap();
        let state = sim.state();
        let (x, v) = (host(&state.positions), host(&state.velocities));
        (sim.records().to_vec(), x, v, sim.cell().unwrap())
    }

    /// Largest difference of two sets of positions in `cell`, whole cell vectors apart
    /// counting as none (each run wraps its atoms at its own list builds).
    fn periodic_diff(a: &[[f64; 3]], b: &[[f64; 3]], cell: &Lattice) -> f64 {
        let inv = mlff_distiller::structure::inverse(cell).unwrap();
        let mut worst: f64 = 0.0;
        for (p, q) in a.iter().zip(b) {
            let d: [f64; 3] = std::array::from_fn(|j| p[j] - q[j]);
            let frac: [f64; 3] = std::array::from_fn(|j| (0..3).map(|k| d[k] * inv[k][j]).sum());
            let frac = frac.map(|f| f - f.round());
            let back: [f64; 3] =
                std::array::from_fn(|j| (0..3).map(|k| frac[k] * cell[k][j]).sum());
            worst = back.iter().fold(worst, |w, x| w.max(x.abs()));
        }
        worst
    }

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs().max(1.0)
    }

    /// Every system of the batch follows its single run (f64, CPU; the batched products
    /// round differently in the last bits, which 200 steps grow to ~1e-9), its cell moving
    /// more than the skin allows, the replicas' volumes apart.
    #[test]
    fn npt_replicas_and_boxes_equal_single_npt_runs() {
        let s = common::random_box(40, 0.15, 11);
        let systems = vec![s.clone(), s.clone(), common::random_box(30, 0.0, 12), s];
        let st = npt(200);
        let calc = common::calculator(DType::F64, &Device::Cpu);
        let forces = PainnForces::batch(&calc, &systems, st.skin).unwrap();
        let mut batch =
            BatchSimulation::new(forces, &systems, st.clone(), serde_json::Value::Null).unwrap();
        let summary = batch.run(&mut |_| {}).unwrap();
        assert_eq!(summary.stop, StopReason::Completed);
        assert_eq!(summary.ensemble, "npt");
        assert!(summary.neighbor_list_builds > 2, "{summary:?}");
        let mut last_volumes = Vec::new();
        for (k, s) in systems.iter().enumerate() {
            let (records, x, v, cell) = single(s, &st, k);
            let got = batch.records(k);
            assert_eq!(got.len(), records.len());
            for (a, b) in got.iter().zip(&records) {
                let pairs = [
                    ("e_pot", a.e_pot, b.e_pot),
                    ("e_kin", a.e_kin, b.e_kin),
                    ("volume", a.volume.unwrap(), b.volume.unwrap()),
                    ("pressure", a.pressure_bar.unwrap(), b.pressure_bar.unwrap()),
                    ("e_eff", a.e_eff.unwrap(), b.e_eff.unwrap()),
                ];
                for (what, p, q) in pairs {
                    assert!(
                        close(p, q, 1e-8),
                        "system {k} step {}: {what} {p} vs {q}",
                        a.step
                    );
                }
            }
            let state = batch.system_state(k).unwrap();
            let d = |a: &[[f64; 3]], b: &[[f64; 3]]| common::max_force_diff(a, b);
            let got_cell = batch.cell(k).unwrap();
            let cells = got_cell.iter().flatten().zip(cell.iter().flatten());
            assert!(
                cells.clone().all(|(a, b)| close(*a, *b, 1e-9)),
                "system {k}: cell"
            );
            let dx = periodic_diff(&state.positions, &x, &cell);
            assert!(dx < 1e-8, "system {k}: positions {dx}");
            assert!(d(&state.velocities, &v) < 1e-8, "system {k}: velocities");
            let (v0, v1) = (
                records[0].volume.unwrap(),
                records.last().unwrap().volume.unwrap(),
            );
            assert!(
                (v1 / v0 - 1.0).abs() > 0.01,
                "system {k}: the cell hardly moved ({v0:.2} -> {v1:.2} Å³)"
            );
            last_volumes.push(v1);
            let row = &summary.systems[k];
            assert!(row.volume_mean_a3.is_some() && row.energy_drift_mev_per_atom_ps.is_some());
        }
        assert!(
            (last_volumes[0] - last_volumes[1]).abs() > 1e-3,
            "{last_volumes:?}"
        );
    }

    /// A batch at constant pressure refuses a system without a cell periodic along all three
    /// axes, naming it, before anything is written.
    #[test]
    fn an_npt_batch_refuses_open_systems() {
        let calc = common::calculator(DType::F64, &Device::Cpu);
        let dir = tempfile::tempdir().unwrap();
        let open = [
            common::random_box(20, 0.0, 1),
            common::random_molecule(6, 3),
        ];
        let mut st = npt(10);
        st.outputs.log = Some(dir.path().join("log.jsonl"));
        let forces = PainnForces::batch(&calc, &open, st.skin).unwrap();
        let err = BatchSimulation::new(forces, &open, st, serde_json::Value::Null).err();
        let msg = err.unwrap().to_string();
        assert!(
            msg.contains("system 1") && msg.contains("constant pressure"),
            "{msg}"
        );
        assert!(!dir.path().join("log.jsonl").exists());
    }

    /// Killed at step 50 and resumed from its restart file of step 20, a batch at constant
    /// pressure (its cells past what the skin allows, one system frozen on the way) writes
    /// the log, trajectories and restart file of the uninterrupted run, byte for byte.
    #[test]
    fn killed_and_resumed_npt_batch_equals_an_uninterrupted_one() {
        use mlff_distiller::md::BatchRestart;
        let calc = common::calculator(DType::F64, &Device::Cpu);
        let systems = vec![
            common::random_box(20, 0.15, 41),
            common::random_box(16, 0.0, 42),
            common::random_box(20, 0.15, 41),
        ];
        let in_dir = |dir: &std::path::Path, steps: u64| MdSettings {
            steps,
            traj_every: 10,
            restart_every: 20,
            outputs: common::batch_outputs(dir),
            ..npt(60)
        };
        let new = |dir: &std::path::Path, steps: u64| {
            let inner = PainnForces::batch(&calc, &systems, 0.3).unwrap();
            // System 1 turns non-finite at step 33: a frozen system in the later files.
            let forces = common::Poisoned::new(inner, 20..36, 33);
            BatchSimulation::new(
                forces,
                &systems,
                in_dir(dir, steps),
                serde_json::Value::Null,
            )
            .unwrap()
        };
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let whole = new(a.path(), 60).run(&mut |_| {}).unwrap();
        assert_eq!(whole.frozen_systems, 1);
        assert!(whole.neighbor_list_builds > 2, "{whole:?}");
        let kept = common::restart_kept_at(b.path(), 20, |progress| {
            new(b.path(), 50).run(progress).unwrap();
        });
        let mut restart = BatchRestart::load(&kept).unwrap();
        assert!(restart.systems.iter().all(|s| s.barostat.is_some()));
        restart.settings.steps = 60;
        // (The resumed provider is poisoned at the same step: its first call is step 21's.)
        let inner = PainnForces::batch(&calc, &restart.active_systems(), 0.3).unwrap();
        let forces = common::Poisoned::new(inner, 20..36, 12);
        let mut resumed = BatchSimulation::resume(forces, restart).unwrap();
        resumed.run(&mut |_| {}).unwrap();
        let read = |p: std::path::PathBuf| std::fs::read(p).unwrap();
        let (la, lb) = (
            read(a.path().join("log.jsonl")),
            read(b.path().join("log.jsonl")),
        );
        let (ta, tb) = (String::from_utf8_lossy(&la), String::from_utf8_lossy(&lb));
        let first = ta.lines().zip(tb.lines()).find(|(x, y)| x != y);
        assert!(la == lb, "logs: first difference {first:?}");
        for k in 0..3 {
            let traj = |d: &std::path::Path| mlff_distiller::md::system_traj(&d.join("traj"), k);
            assert!(
                read(traj(a.path())) == read(traj(b.path())),
                "system {k}'s trajectory"
            );
        }
        let (ra, rb) = (
            BatchRestart::load(&a.path().join("restart.json")).unwrap(),
            BatchRestart::load(&b.path().join("restart.json")).unwrap(),
        );
        for (x, y) in ra.systems.iter().zip(&rb.systems) {
            assert_eq!(format!("{:?}", x.state), format!("{:?}", y.state));
            assert_eq!(x.barostat, y.barostat);
            assert_eq!(x.rng_word_pos, y.rng_word_pos);
        }
        assert!(
            rb.systems[1].frozen.is_some() && rb.systems[0].barostat.unwrap().list_cell.is_some()
        );
    }

    /// A replica whose forces turn NaN is frozen at the step its single run stops at, with
    /// the same reason and log; the others go on as their single runs.
    #[test]
    fn an_npt_replica_gone_non_finite_is_frozen_and_the_others_go_on() {
        let calc = common::calculator(DType::F64, &Device::Cpu);
        let s = common::random_box(20, 0.1, 21);
        let systems = vec![s.clone(); 3];
        let st = npt(40);
        let inner = PainnForces::batch(&calc, &systems, st.skin).unwrap();
        let forces = common::Poisoned::new(inner, 20..40, 13);
        let mut batch =
            BatchSimulation::new(forces, &systems, st.clone(), serde_json::Value::Null).unwrap();
        let summary = batch.run(&mut |_| {}).unwrap();
        assert_eq!(summary.stop, StopReason::Completed);
        assert_eq!(batch.active(), &[0, 2]);
        let alone = common::Poisoned::new(PainnForces::new(&calc, &s, st.skin).unwrap(), 0..20, 13);
        let single_st = MdSettings {
            seed: system_seed(st.seed, 1),
            ..st.clone()
        };
        let mut sim = Simulation::new(alone, &s, single_st, serde_json::Value::Null).unwrap();
        let stop = sim.run(&mut |_| {}).unwrap().stop;
        assert!(
            matches!(stop, StopReason::NonFinite { step: 14, .. }),
            "{stop:?}"
        );
        assert_eq!(batch.frozen(1), Some(&stop));
        assert_eq!(batch.system_state(1).unwrap().step, 13);
        assert_eq!(batch.records(1).len(), sim.records().len());
        for k in [0, 2] {
            let (records, _, v, _) = single(&s, &st, k);
            let got = batch.records(k);
            assert_eq!(got.len(), records.len());
            for (a, b) in got.iter().zip(&records) {
                assert!(
                    close(a.e_pot, b.e_pot, 1e-8)
                        && close(a.volume.unwrap(), b.volume.unwrap(), 1e-8)
                );
            }
            let d = common::max_force_diff(&batch.system_state(k).unwrap().velocities, &v);
            assert!(d < 1e-8, "system {k}: velocities {d}");
        }
    }
}
