//! Stress of periodic cells: the strain derivative of the energy against central finite
//! differences (orthorhombic, triclinic, a cell smaller than the cutoff), every backend the
//! same, a batch the same as its structures one by one, the forces those of a plain call.

mod common;

use candle_core::{DType, Device};
use common::{calculator, random_box, random_molecule};
use mlff_distiller::model::Backend;
use mlff_distiller::stress::{stress_volume, voigt, Matrix3};
use mlff_distiller::{Batch, Calculator, PainnCalculator, Structure};

fn calc(backend: Backend) -> PainnCalculator {
    calculator(DType::F64, &Device::Cpu).with_backend(backend)
}

/// `s` under the strain r → r (1 + ε), positions and cell alike.
fn strained(s: &Structure, eps: &Matrix3) -> Structure {
    let apply = |r: &[f64; 3]| -> [f64; 3] {
        std::array::from_fn(|d| r[d] + (0..3).map(|c| r[c] * eps[c][d]).sum::<f64>())
    };
    Structure {
        positions: s.positions.iter().map(apply).collect(),
        cell: s.cell.map(|c| c.map(|row| apply(&row))),
        ..s.clone()
    }
}

fn energy(c: &PainnCalculator, s: &Structure) -> f64 {
    c.compute(&Batch::from_one(s.clone()).unwrap())
        .unwrap()
        .energies[0]
}

#[test]
fn stress_is_the_strain_derivative_of_the_energy() {
    let c = calc(Backend::Autograd);
    let small = random_box(6, 0.2, 9); // about 3.9 Å wide: many images within the 4 Å cutoff
    for (what, s) in [
        ("orthorhombic", random_box(24, 0.0, 1)),
        ("triclinic", random_box(24, 0.3, 2)),
        ("smaller than the cutoff", small),
    ] {
        let got = c
            .compute_with_stress(&Batch::from_one(s.clone()).unwrap())
            .unwrap();
        let sigma = got.stresses[0].expect("a periodic cell has a stress");
        let v = stress_volume(&s).unwrap();
        let h = 1e-5;
        for a in 0..3 {
            for b in a..3 {
                let mut eps = [[0.0; 3]; 3];
                eps[a][b] += 0.5 * h;
                eps[b][a] += 0.5 * h;
                let minus = eps.map(|r| r.map(|x| -x));
                let fd = (energy(&c, &strained(&s, &eps)) - energy(&c, &strained(&s, &minus)))
                    / (2.0 * h);
                let ours = v * sigma[a][b];
                let scale = (0..3).map(|k| (v * sigma[k][k]).abs()).fold(1e-3, f64::max);
                assert!(
                    (ours - fd).abs() < 1e-6 * scale,
                    "{what} [{a}][{b}]: V σ = {ours}, finite differences {fd}"
                );
                assert_eq!(sigma[a][b], sigma[b][a], "{what}: not symmetric");
            }
        }
    }
}

#[test]
fn backends_agree_and_a_batch_equals_its_structures() {
    let boxes = [random_box(16, 0.0, 3), random_box(20, 0.25, 4)];
    let molecule = random_molecule(7, 5);
    let all = vec![boxes[0].clone(), molecule.clone(), boxes[1].clone()];
    let batch = Batch::new(all.clone()).unwrap();
    let reference = calc(Backend::Autograd).compute_with_stress(&batch).unwrap();
    assert!(reference.stresses[1].is_none(), "a molecule has no stress");
    let plain = calc(Backend::Autograd).compute(&batch).unwrap();
    let df = common::max_force_diff(
        &reference.prediction.forces.concat(),
        &plain.forces.concat(),
    );
    assert!(df < 1e-12, "forces of the strained call differ by {df}");
    for backend in [Backend::Stock, Backend::Fused] {
        let got = calc(backend).compute_with_stress(&batch).unwrap();
        for (k, (a, b)) in got.stresses.iter().zip(&reference.stresses).enumerate() {
            let (Some(a), Some(b)) = (a, b) else {
                assert_eq!(a.is_none(), b.is_none());
                continue;
            };
            for (x, y) in voigt(a).iter().zip(voigt(b)) {
                assert!(
                    (x - y).abs() < 1e-10 * y.abs().max(1e-3),
                    "{backend:?} structure {k}"
                );
            }
        }
    }
    for (k, s) in all.iter().enumerate() {
        let one = calc(Backend::Autograd)
            .compute_with_stress(&Batch::from_one(s.clone()).unwrap())
            .unwrap();
        match (one.stresses[0], reference.stresses[k]) {
            (Some(a), Some(b)) => {
                for (x, y) in voigt(&a).iter().zip(voigt(&b)) {
                    assert!((x - y).abs() < 1e-12 * y.abs().max(1e-3), "structure {k}");
                }
            }
            (a, b) => assert_eq!(a, b),
        }
    }
}

/// Rotating cell and atoms together rotates the stress: σ' = R σ Rᵀ (rows as vectors: r' = r Rᵀ).
#[test]
fn stress_rotates_with_the_system() {
    let c = calc(Backend::Autograd);
    let s = random_box(18, 0.2, 6);
    let r = common::random_rotation(11);
    let rotate = |v: &[f64; 3]| common::rotate(&r, v);
    let turned = Structure {
        positions: s.positions.iter().map(rotate).collect(),
        cell: s.cell.map(|c| c.map(|row| rotate(&row))),
        ..s.clone()
    };
    let sigma = |s: &Structure| {
        c.compute_with_stress(&Batch::from_one(s.clone()).unwrap())
            .unwrap()
            .stresses[0]
            .unwrap()
    };
    let (a, b) = (sigma(&s), sigma(&turned));
    for i in 0..3 {
        for j in 0..3 {
            let want: f64 = (0..3)
                .flat_map(|k| (0..3).map(move |l| (k, l)))
                .map(|(k, l)| r[i][k] * a[k][l] * r[j][l])
                .sum();
            assert!(
                (b[i][j] - want).abs() < 1e-9,
                "[{i}][{j}]: {} vs {want}",
                b[i][j]
            );
        }
    }
}

/// `mlff predict MODEL INPUT -o OUTPUT --stress EXTRA` with the shipped model on the CPU: the
/// frames written.
fn predict(input: &std::path::Path, output: &std::path::Path, extra: &[&str]) -> Vec<Structure> {
    let model = common::root().join("models/painn-gfn2.safetensors");
    let mut args = vec![
        "predict",
        common::s(&model),
        common::s(input),
        "-o",
        common::s(output),
    ];
    args.extend(["--stress", "--device", "cpu"]);
    args.extend_from_slice(extra);
    let o = common::mlff(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    mlff_distiller::io::read_extxyz(output).unwrap()
}

/// `mlff predict --stress` writes what the library computes, as a 3x3 `stress` that ASE reads
/// back with `atoms.get_stress()` (Voigt, its sign); an input `stress` becomes `ref_stress`.
#[test]
fn predict_writes_the_stress_ase_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::root().join("models/painn-gfn2.safetensors");
    let mut water = mlff_distiller::systems::water_box(8, 3);
    water
        .info
        .push(("stress".into(), "1 0 0 0 1 0 0 0 1".into()));
    let frames = [water.clone(), random_molecule(5, 2)];
    let input = dir.path().join("in.extxyz");
    mlff_distiller::io::write_extxyz(&input, &frames).unwrap();
    let output = dir.path().join("out.extxyz");
    let back = predict(&input, &output, &[]);
    assert_eq!(back[0].info_value("ref_stress"), Some("1 0 0 0 1 0 0 0 1"));
    assert!(
        back[1].info_value("stress").is_none(),
        "a molecule has no stress"
    );
    let written: Vec<f64> = (back[0].info_value("stress").unwrap().split_whitespace())
        .map(|x| x.parse().unwrap())
        .collect();
    // `mlff predict` runs the fused backend by default.
    let c = PainnCalculator::from_checkpoint(&model, &Device::Cpu, DType::F32)
        .unwrap()
        .with_backend(Backend::Fused);
    let want = c
        .compute_with_stress(&Batch::from_one(water).unwrap())
        .unwrap();
    let want: Vec<f64> = want.stresses[0]
        .unwrap()
        .iter()
        .flatten()
        .copied()
        .collect();
    for (x, y) in written.iter().zip(&want) {
        assert!(
            // f32 sums in another order (the file's batch holds a molecule too).
            (x - y).abs() < 1e-5 * y.abs().max(1e-4),
            "{written:?} vs {want:?}"
        );
    }
    if common::ase_available() {
        let script = "import sys, json; from ase.io import read\n\
            print(json.dumps(list(read(sys.argv[1], 0).get_stress())))";
        let out = std::process::Command::new("python3")
            .args(["-c", script, output.to_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ase: Vec<f64> = serde_json::from_slice(&out.stdout).unwrap();
        let m: Matrix3 = std::array::from_fn(|a| std::array::from_fn(|b| written[3 * a + b]));
        for (x, y) in ase.iter().zip(voigt(&m)) {
            assert!((x - y).abs() < 1e-12, "ASE reads {ase:?}, we wrote {m:?}");
        }
    }
}

#[test]
fn stress_errors_compare_labels_in_either_layout() {
    use mlff_distiller::eval::stress_errors;
    let c = calc(Backend::Autograd);
    let boxes = [random_box(16, 0.0, 7), random_box(16, 0.2, 8)];
    let own = c
        .compute_with_stress(&Batch::new(boxes.to_vec()).unwrap())
        .unwrap()
        .stresses;
    let mut frames = boxes.to_vec();
    // Frame 0: the 3x3 rows with xx off by 1e-3; frame 1: the exact Voigt six.
    let mut off = own[0].unwrap();
    off[0][0] += 1e-3;
    let rows: Vec<String> = off.iter().flatten().map(|x| format!("{x:?}")).collect();
    frames[0].info.push(("stress".into(), rows.join(" ")));
    let six: Vec<String> = voigt(&own[1].unwrap())
        .iter()
        .map(|x| format!("{x:?}"))
        .collect();
    frames[1].info.push(("stress".into(), six.join(" ")));
    frames.push(random_molecule(5, 1)); // no label: not counted
    let name = |k: usize| format!("frame {k}");
    let e = stress_errors(&c, &frames, 2, &name).unwrap().unwrap();
    assert_eq!(e.frames, 2);
    assert!((e.mae - 1e-3 / 12.0).abs() < 1e-12, "{e:?}");
    assert!((e.rmse - (1e-6f64 / 12.0).sqrt()).abs() < 1e-12, "{e:?}");

    let mut bad = frames.clone();
    bad[2].info.push(("stress".into(), "1 2 3".into()));
    let err = stress_errors(&c, &bad, 2, &name).unwrap_err().to_string();
    assert!(err.contains("frame 2") && err.contains("3 values"), "{err}");
    let mut molecule = random_molecule(5, 1);
    molecule.info.push(("stress".into(), six.join(" ")));
    let err = stress_errors(&c, &[molecule], 2, &name)
        .unwrap_err()
        .to_string();
    assert!(err.contains("frame 0") && err.contains("periodic"), "{err}");
}

#[test]
fn eval_reports_stress_errors_where_frames_have_labels() {
    let dir = tempfile::tempdir().unwrap();
    let model = common::root().join("models/painn-gfn2.safetensors");
    let input = dir.path().join("in.extxyz");
    let frames = [
        mlff_distiller::systems::water_box(8, 1),
        mlff_distiller::systems::water_box(8, 2),
    ];
    mlff_distiller::io::write_extxyz(&input, &frames).unwrap();
    let labelled = dir.path().join("labelled.extxyz");
    let (m, i, l) = (
        model.to_str().unwrap(),
        input.to_str().unwrap(),
        labelled.to_str().unwrap(),
    );
    let o = common::mlff(&["predict", m, i, "-o", l, "--stress", "--device", "cpu"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = common::mlff(&["eval", m, l, "--device", "cpu"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("stress (2 frames with labels): MAE 0.0000 GPa"),
        "{out}"
    );
}

/// 20 steps from 200 K, logged every 10 with the pressure.
fn pressure_settings() -> mlff_distiller::md::MdSettings {
    mlff_distiller::md::MdSettings {
        steps: 20,
        log_every: 10,
        traj_every: 0,
        init_temperature: 200.0,
        stop_when_unstable: false,
        log_pressure: true,
        ..Default::default()
    }
}

/// A single run of a periodic cell puts 2 E_kin / 3V - tr(σ) / 3 in every log row (bar),
/// without being asked, the stress from its logging steps' own force calls.
#[test]
fn md_logs_the_pressure_of_a_periodic_cell() {
    use mlff_distiller::md::{host_positions, PainnForces, Simulation};
    let c = calc(Backend::Autograd);
    let s = random_box(16, 0.1, 12);
    let st = mlff_distiller::md::MdSettings {
        log_pressure: false,
        ..pressure_settings()
    };
    let f = PainnForces::new(&c, &s, st.skin).unwrap();
    let mut sim = Simulation::new(f, &s, st.clone(), serde_json::Value::Null).unwrap();
    let summary = sim.run(&mut |_| {}).unwrap();
    assert!(sim.records().iter().all(|r| r.pressure_bar.is_some()));
    let after: Vec<f64> = sim.records()[1..]
        .iter()
        .filter_map(|r| r.pressure_bar)
        .collect();
    let mean = after.iter().sum::<f64>() / after.len() as f64;
    assert!((summary.pressure_mean_bar.unwrap() - mean).abs() < 1e-9 * mean.abs().max(1.0));
    let last = *sim.records().last().unwrap();
    let at = Structure {
        positions: host_positions(&sim.state().positions).unwrap(),
        ..s.clone()
    };
    let sigma = c
        .compute_with_stress(&Batch::from_one(at).unwrap())
        .unwrap()
        .stresses[0]
        .unwrap();
    let v = stress_volume(&s).unwrap();
    let trace = sigma[0][0] + sigma[1][1] + sigma[2][2];
    let want = (2.0 * last.e_kin / (3.0 * v) - trace / 3.0) * 1.602_176_620_8e6;
    let got = last.pressure_bar.unwrap();
    assert!(
        (got - want).abs() < 1e-9 * want.abs().max(1.0),
        "{got} vs {want} bar"
    );

    let m = random_molecule(5, 1);
    let f = PainnForces::new(&c, &m, 1.0).unwrap();
    let err = Simulation::new(f, &m, pressure_settings(), serde_json::Value::Null)
        .err()
        .unwrap();
    assert!(err.to_string().contains("periodic"), "{err}");
}

/// A batch logs each system's pressure, that of its own single run.
#[test]
fn a_batch_logs_each_systems_pressure() {
    use mlff_distiller::md::{system_seed, BatchSimulation, MdSettings, PainnForces, Simulation};
    let c = calc(Backend::Autograd);
    let boxes = vec![random_box(16, 0.0, 13), random_box(12, 0.2, 14)];
    let st = pressure_settings();
    let f = PainnForces::batch(&c, &boxes, st.skin).unwrap();
    let mut batch = BatchSimulation::new(f, &boxes, st.clone(), serde_json::Value::Null).unwrap();
    let summary = batch.run(&mut |_| {}).unwrap();
    for (k, s) in boxes.iter().enumerate() {
        let one = MdSettings {
            seed: system_seed(st.seed, k),
            ..st.clone()
        };
        let f = PainnForces::new(&c, s, st.skin).unwrap();
        let mut sim = Simulation::new(f, s, one, serde_json::Value::Null).unwrap();
        let single = sim.run(&mut |_| {}).unwrap();
        for (a, b) in batch.records(k).iter().zip(sim.records()) {
            let (p, q) = (a.pressure_bar.unwrap(), b.pressure_bar.unwrap());
            assert!(
                (p - q).abs() < 1e-6 * q.abs().max(1.0),
                "system {k} step {}: {p} vs {q}",
                a.step
            );
        }
        let (p, q) = (
            summary.systems[k].pressure_mean_bar,
            single.pressure_mean_bar,
        );
        assert!((p.unwrap() - q.unwrap()).abs() < 1e-6 * q.unwrap().abs().max(1.0));
    }
    let mixed = vec![boxes[0].clone(), random_molecule(5, 1)];
    let f = PainnForces::batch(&c, &mixed, st.skin).unwrap();
    let err = BatchSimulation::new(f, &mixed, st, serde_json::Value::Null)
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("system 1: pressure needs"),
        "{err}"
    );
}

/// Per-atom virials (the fused force kernel's W_i = Σ r_ij ⊗ F_ij over atom i's edges) add
/// up to each structure's −V σ (symmetrized), the stress of autograd; other backends refuse;
/// `mlff predict --stress --virials` writes them as a 9-column `virials` array.
#[test]
fn atom_virials_add_up_to_the_stress() {
    let boxes = [random_box(20, 0.0, 21), random_box(16, 0.3, 22)];
    let batch = Batch::new(boxes.to_vec()).unwrap();
    let reference = calc(Backend::Autograd).compute_with_stress(&batch).unwrap();
    let (got, virials) = calc(Backend::Fused).compute_with_virials(&batch).unwrap();
    for (k, s) in boxes.iter().enumerate() {
        assert_eq!(virials[k].len(), s.len());
        let v = stress_volume(s).unwrap();
        let sigma = reference.stresses[k].unwrap();
        assert!(got.stresses[k].is_some());
        for a in 0..3 {
            for b in 0..3 {
                let sum: f64 = virials[k].iter().map(|w| 0.5 * (w[a][b] + w[b][a])).sum();
                let want = -v * sigma[a][b];
                assert!(
                    (sum - want).abs() < 1e-9 * want.abs().max(1e-3),
                    "box {k} [{a}][{b}]: Σ W {sum} vs −V σ {want}"
                );
            }
        }
    }
    let err = calc(Backend::Autograd)
        .compute_with_virials(&batch)
        .unwrap_err()
        .to_string();
    assert!(err.contains("fused backend"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.extxyz");
    let water = mlff_distiller::systems::water_box(8, 4);
    mlff_distiller::io::write_extxyz(&input, std::slice::from_ref(&water)).unwrap();
    let output = dir.path().join("out.extxyz");
    let back = &predict(&input, &output, &["--virials", "--dtype", "f64"])[0];
    let column = back.arrays.iter().find(|x| x.name == "virials").unwrap();
    assert_eq!((column.ncols, column.values.len()), (9, 9 * water.len()));
    let sigma: Vec<f64> = (back.info_value("stress").unwrap().split_whitespace())
        .map(|x| x.parse().unwrap())
        .collect();
    let w: Vec<f64> = column.values.iter().map(|x| x.parse().unwrap()).collect();
    let v = stress_volume(&water).unwrap();
    for q in [0, 4, 8] {
        let sum: f64 = w.chunks(9).map(|row| row[q]).sum();
        assert!(
            (sum + v * sigma[q]).abs() < 1e-8 * (v * sigma[q]).abs().max(1e-3),
            "component {q}: Σ W {sum} vs −V σ {}",
            -v * sigma[q]
        );
    }
}
