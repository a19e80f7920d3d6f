//! Physical properties of the PaiNN student: invariance, equivariance, forces = -dE/dx,
//! batching, periodic images.

mod common;

use candle_core::{DType, Device};
use common::*;
use mlff_distiller::{Batch, Calculator, Structure};

fn predict(calc: &impl Calculator, s: &Structure) -> (f64, Vec<[f64; 3]>) {
    let p = calc.compute(&Batch::from_one(s.clone()).unwrap()).unwrap();
    (p.energies[0], p.forces[0].clone())
}

/// E(Rx + t) = E(x) and F(Rx + t) = R F(x), for molecules and (rotating the cell too) boxes.
fn check_rotation_translation(dtype: DType, e_tol: f64, f_tol: f64) {
    let calc = calculator(dtype, &Device::Cpu);
    for seed in 0..3 {
        let mut structures = vec![random_molecule(12, seed)];
        structures.push(random_box(24, 0.3, seed));
        for s in structures {
            let (e0, f0) = predict(&calc, &s);
            let r = random_rotation(100 + seed);
            let t = [1.3, -2.1, 0.7];
            let mut moved = s.clone();
            for p in &mut moved.positions {
                let q = rotate(&r, p);
                *p = [q[0] + t[0], q[1] + t[1], q[2] + t[2]];
            }
            if let Some(c) = &mut moved.cell {
                *c = c.map(|row| rotate(&r, &row));
            }
            let (e1, f1) = predict(&calc, &moved);
            assert!(
                (e0 - e1).abs() <= e_tol * e0.abs().max(1.0),
                "{dtype:?} seed {seed}: E {e0} vs rotated {e1}"
            );
            let f0r: Vec<[f64; 3]> = f0.iter().map(|f| rotate(&r, f)).collect();
            let diff = max_force_diff(&f0r, &f1);
            assert!(
                diff <= f_tol * max_abs(&f0).max(1.0),
                "{dtype:?} seed {seed}: rotated forces differ by {diff}"
            );
        }
    }
}

#[test]
fn energy_invariant_forces_equivariant_f64() {
    // f64: only round-off remains.
    check_rotation_translation(DType::F64, 1e-10, 1e-9);
}

#[test]
fn energy_invariant_forces_equivariant_f32() {
    // f32: ~1e-7 relative round-off amplified through 2 blocks.
    check_rotation_translation(DType::F32, 1e-5, 1e-4);
}

#[test]
fn permutation_invariant() {
    let calc = calculator(DType::F64, &Device::Cpu);
    let s = random_molecule(15, 3);
    let (e0, f0) = predict(&calc, &s);
    let perm: Vec<usize> = (0..s.len()).map(|i| (i * 7 + 3) % s.len()).collect();
    let mut p = s.clone();
    p.numbers = perm.iter().map(|&i| s.numbers[i]).collect();
    p.positions = perm.iter().map(|&i| s.positions[i]).collect();
    let (e1, f1) = predict(&calc, &p);
    assert!((e0 - e1).abs() < 1e-10 * e0.abs().max(1.0), "{e0} vs {e1}");
    let f0p: Vec<[f64; 3]> = perm.iter().map(|&i| f0[i]).collect();
    assert!(max_force_diff(&f0p, &f1) < 1e-10);
}

/// Central finite differences of the energy in f64 match the backprop forces to 1e-6 relative.
#[test]
fn forces_are_minus_energy_gradient() {
    let calc = calculator(DType::F64, &Device::Cpu);
    let h = 1e-5;
    for s in [random_molecule(9, 11), random_box(16, 0.25, 12)] {
        let (_, f) = predict(&calc, &s);
        let scale = max_abs(&f);
        assert!(scale > 1e-3, "forces are too small to test: {scale}");
        for (atom, f_atom) in f.iter().enumerate() {
            for (d, &f_ad) in f_atom.iter().enumerate() {
                let mut plus = s.clone();
                plus.positions[atom][d] += h;
                let mut minus = s.clone();
                minus.positions[atom][d] -= h;
                let fd = -(predict(&calc, &plus).0 - predict(&calc, &minus).0) / (2.0 * h);
                let err = (fd - f_ad).abs() / scale;
                assert!(
                    err < 1e-6,
                    "atom {atom} dir {d}: finite difference {fd} vs force {f_ad} (rel {err:e})"
                );
            }
        }
    }
}

/// One call on a batch of different molecules (and a periodic box) equals one call each.
#[test]
fn batch_equals_one_by_one() {
    for (dtype, tol) in [(DType::F64, 1e-10), (DType::F32, 2e-5)] {
        let calc = calculator(dtype, &Device::Cpu);
        let structures = vec![
            random_molecule(5, 21),
            random_molecule(17, 22),
            random_box(20, 0.2, 23),
            random_molecule(1, 24),
            random_molecule(11, 25),
        ];
        let batched = calc
            .compute(&Batch::new(structures.clone()).unwrap())
            .unwrap();
        for (k, s) in structures.iter().enumerate() {
            let (e, f) = predict(&calc, s);
            let de = (batched.energies[k] - e).abs();
            assert!(
                de <= tol * e.abs().max(1.0),
                "{dtype:?} structure {k}: ΔE = {de}"
            );
            let df = max_force_diff(&batched.forces[k], &f);
            assert!(df <= tol * 10.0, "{dtype:?} structure {k}: ΔF = {df}");
        }
    }
}

/// A periodic box equals the same atoms replicated 2x1x1 with the cell doubled (per atom).
#[test]
fn periodic_supercell_is_extensive() {
    let calc = calculator(DType::F64, &Device::Cpu);
    let s = random_box(12, 0.2, 31);
    let cell = s.cell.unwrap();
    let mut big = s.clone();
    for p in &s.positions {
        big.positions
            .push([p[0] + cell[0][0], p[1] + cell[0][1], p[2] + cell[0][2]]);
    }
    big.numbers.extend_from_slice(&s.numbers);
    big.cell = Some([cell[0].map(|x| 2.0 * x), cell[1], cell[2]]);
    let (e1, f1) = predict(&calc, &s);
    let (e2, f2) = predict(&calc, &big);
    assert!((2.0 * e1 - e2).abs() < 1e-9 * e2.abs(), "{e1} x2 vs {e2}");
    assert!(max_force_diff(&f1, &f2[..s.len()]) < 1e-9);
    assert!(max_force_diff(&f1, &f2[s.len()..]) < 1e-9);
}

/// Sum of forces on an isolated molecule vanishes (translation invariance).
#[test]
fn net_force_vanishes() {
    let calc = calculator(DType::F64, &Device::Cpu);
    let (_, f) = predict(&calc, &random_molecule(14, 41));
    for d in 0..3 {
        let total: f64 = f.iter().map(|x| x[d]).sum();
        assert!(total.abs() < 1e-10, "net force {total} along {d}");
    }
}

#[test]
fn unknown_element_names_the_atom() {
    let calc = calculator(DType::F32, &Device::Cpu);
    let mut s = random_molecule(4, 1);
    s.numbers[2] = 26;
    let err = calc
        .compute(&Batch::new(vec![random_molecule(3, 2), s]).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Z=26") && err.contains("structure 1") && err.contains("atom 2"),
        "{err}"
    );
}

/// The model through candle's stock index_select/index_add equals the model through our ops.
#[test]
fn stock_ops_equal_custom_ops() {
    use mlff_distiller::model::Backend;
    let batch = Batch::new(vec![random_molecule(10, 51), random_box(20, 0.3, 52)]).unwrap();
    let ours = calculator(DType::F64, &Device::Cpu)
        .compute(&batch)
        .unwrap();
    let stock = calculator(DType::F64, &Device::Cpu)
        .with_backend(Backend::Stock)
        .compute(&batch)
        .unwrap();
    for (a, b) in ours.energies.iter().zip(&stock.energies) {
        assert!((a - b).abs() < 1e-10 * a.abs().max(1.0), "{a} vs {b}");
    }
    assert!(max_force_diff(&ours.forces.concat(), &stock.forces.concat()) < 1e-10);
}
