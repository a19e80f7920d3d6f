//! Constant pressure for a batch of systems (issue 49): each system of one force provider
//! follows a cell of its own.

mod common;

use candle_core::{DType, Device, Tensor};
use mlff_distiller::md::{ForceProvider, PainnForces};
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
}
