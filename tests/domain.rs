//! `compute_domain`: a box cut into domains, each with ghosts out to the receptive field,
//! gives the whole box's energy, forces and virial (what the LAMMPS plugin relies on).

mod common;

use candle_core::{DType, Device};
use common::{calculator, dist, random_box, random_molecule};
use mlff_distiller::domain::receptive_field;
use mlff_distiller::model::Backend;
use mlff_distiller::stress::stress_volume;
use mlff_distiller::structure::Matrix3;
use mlff_distiller::{Batch, Calculator, PainnCalculator, Structure};

/// One domain: its atoms (locals first) and the box atom each stands for.
struct Domain {
    numbers: Vec<u8>,
    positions: Vec<[f64; 3]>,
    owner: Vec<usize>,
    n_local: usize,
}

/// `s` cut into `parts` slabs along the fractional a axis, each with every periodic image
/// (other than its own atoms) within `reach` of one of its atoms as a ghost.
fn decompose(s: &Structure, parts: usize, reach: f64) -> Vec<Domain> {
    let cell = s.cell.unwrap();
    let inv = inverse(&cell);
    let frac_a = |x: &[f64; 3]| {
        (0..3)
            .map(|k| x[k] * inv[k][0])
            .sum::<f64>()
            .rem_euclid(1.0)
    };
    let m = 4; // images per axis either side: the box is smaller than the reach
    (0..parts)
        .map(|p| {
            let lo = p as f64 / parts as f64;
            let hi = (p + 1) as f64 / parts as f64;
            let locals: Vec<usize> = (0..s.len())
                .filter(|&i| (lo..hi).contains(&frac_a(&s.positions[i])))
                .collect();
            let mut d = Domain {
                numbers: locals.iter().map(|&i| s.numbers[i]).collect(),
                positions: locals.iter().map(|&i| s.positions[i]).collect(),
                owner: locals.clone(),
                n_local: locals.len(),
            };
            for i in 0..s.len() {
                for a in -m..=m {
                    for b in -m..=m {
                        for c in -m..=m {
                            if [a, b, c] == [0; 3] && locals.contains(&i) {
                                continue;
                            }
                            let shift = [a as f64, b as f64, c as f64];
                            let x: [f64; 3] = std::array::from_fn(|k| {
                                s.positions[i][k]
                                    + (0..3).map(|r| shift[r] * cell[r][k]).sum::<f64>()
                            });
                            let near = locals.iter().any(|&l| dist(&x, &s.positions[l]) < reach);
                            if near {
                                d.numbers.push(s.numbers[i]);
                                d.positions.push(x);
                                d.owner.push(i);
                            }
                        }
                    }
                }
            }
            d
        })
        .collect()
}

fn inverse(m: &[[f64; 3]; 3]) -> [[f64; 3]; 3] {
    let det = m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
        - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]);
    std::array::from_fn(|i| {
        std::array::from_fn(|j| {
            let (r0, r1) = ((j + 1) % 3, (j + 2) % 3);
            let (c0, c1) = ((i + 1) % 3, (i + 2) % 3);
            (m[r0][c0] * m[r1][c1] - m[r0][c1] * m[r1][c0]) / det
        })
    })
}

/// The test model on the CPU in f64, with `backend`.
fn calc(backend: Backend) -> PainnCalculator {
    calculator(DType::F64, &Device::Cpu).with_backend(backend)
}

#[test]
fn domains_with_ghosts_to_the_receptive_field_add_up_to_the_box() {
    for backend in [Backend::Autograd, Backend::Fused] {
        domains_add_up(&calc(backend));
    }
}

fn domains_add_up(calc: &PainnCalculator) {
    let reach = receptive_field(calc.model().config());
    assert_eq!(reach, calc.receptive_field());
    // 40 atoms in a 7.4 Å box: the 8 Å reach spans several domains and images.
    let s = random_box(40, 0.15, 3);
    let whole = calc
        .compute_with_stress(&Batch::new(vec![s.clone()]).unwrap())
        .unwrap();
    let e_ref = whole.prediction.energies[0];
    let f_ref = &whole.prediction.forces[0];
    let volume = stress_volume(&s).unwrap();
    let w_ref = whole.stresses[0].unwrap().map(|r| r.map(|x| -volume * x));
    // The whole cell as one domain, images from the cell rather than ghosts.
    let cell = calc
        .compute_cell(&s.numbers, &s.positions, &s.cell.unwrap())
        .unwrap();
    let sum: f64 = cell.atom_energies.iter().sum();
    assert!((cell.energy - e_ref).abs() < 1e-10 * e_ref.abs());
    assert!((sum - e_ref).abs() < 1e-10 * e_ref.abs());
    assert!(common::max_force_diff(&cell.forces, f_ref) < 1e-10 * common::max_abs(f_ref));
    assert_same_virial(&cell.virial, &w_ref, "the cell");
    for parts in [1, 2, 3] {
        let mut energy = 0.0;
        let mut forces = vec![[0.0; 3]; s.len()];
        let mut virial = [[0.0; 3]; 3];
        let mut owned = 0;
        let mut atom_energies = vec![f64::NAN; s.len()];
        for d in decompose(&s, parts, reach) {
            let got = calc
                .compute_domain(&d.numbers, &d.positions, d.n_local)
                .unwrap();
            assert_eq!(got.atom_energies.len(), d.n_local);
            assert_eq!(got.forces.len(), d.numbers.len());
            let sum: f64 = got.atom_energies.iter().sum();
            assert!((sum - got.energy).abs() < 1e-12 * sum.abs());
            energy += got.energy;
            for (e, &i) in got.atom_energies.iter().zip(&d.owner) {
                atom_energies[i] = *e;
            }
            owned += d.n_local;
            for (f, &i) in got.forces.iter().zip(&d.owner) {
                (0..3).for_each(|k| forces[i][k] += f[k]);
            }
            (0..3).for_each(|a| (0..3).for_each(|b| virial[a][b] += got.virial[a][b]));
        }
        assert_eq!(owned, s.len());
        for (i, (a, b)) in atom_energies.iter().zip(&cell.atom_energies).enumerate() {
            assert!(
                (a - b).abs() < 1e-10 * b.abs(),
                "{parts} domains: atom {i}: {a} vs {b}"
            );
        }
        assert!(
            (energy - e_ref).abs() < 1e-10 * e_ref.abs(),
            "{:?}, {parts} domains: energy {energy} vs {e_ref}",
            calc.model().backend()
        );
        let scale = common::max_abs(f_ref);
        let df = common::max_force_diff(&forces, f_ref);
        assert!(df < 1e-10 * scale, "{parts} domains: forces off by {df}");
        assert_same_virial(&virial, &w_ref, &format!("{parts} domains"));
    }
}

fn assert_same_virial(got: &Matrix3, want: &Matrix3, what: &str) {
    let rows = got.iter().flatten().zip(want.iter().flatten());
    for (k, (a, b)) in rows.enumerate() {
        assert!(
            (a - b).abs() < 1e-9,
            "{what}: virial[{}][{}] {a} vs {b}",
            k / 3,
            k % 3
        );
    }
}

#[test]
fn ghost_forces_are_the_gradient_of_the_local_energy_alone() {
    for backend in [Backend::Autograd, Backend::Fused] {
        ghost_forces_of(&calc(backend));
    }
}

fn ghost_forces_of(calc: &PainnCalculator) {
    let s = random_molecule(12, 5);
    // The first 5 atoms are local, the rest ghosts: a ghost's energy must not count.
    let n_local = 5;
    let got = calc
        .compute_domain(&s.numbers, &s.positions, n_local)
        .unwrap();
    let h = 1e-5;
    for atom in [2, 9] {
        for k in 0..3 {
            let energy_at = |dx: f64| {
                let mut x = s.positions.clone();
                x[atom][k] += dx;
                calc.compute_domain(&s.numbers, &x, n_local).unwrap().energy
            };
            let fd = -(energy_at(h) - energy_at(-h)) / (2.0 * h);
            let f = got.forces[atom][k];
            assert!((fd - f).abs() < 1e-6, "atom {atom}, axis {k}: {f} vs {fd}");
        }
    }
    // All local: the molecule's own energy and forces.
    let all = calc
        .compute_domain(&s.numbers, &s.positions, s.len())
        .unwrap();
    let whole = calc.compute(&Batch::new(vec![s.clone()]).unwrap()).unwrap();
    assert!((all.energy - whole.energies[0]).abs() < 1e-10 * all.energy.abs());
    assert!(common::max_force_diff(&all.forces, &whole.forces[0]) < 1e-10);
    assert!(got.energy != all.energy);
}

#[test]
fn bad_domains_are_refused_naming_the_cause() {
    let calc = calc(Backend::Fused);
    let s = random_molecule(6, 1);
    let err = calc
        .compute_domain(&s.numbers, &s.positions, 7)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("7 local atoms") && err.contains("6 atoms"),
        "{err}"
    );
    let mut numbers = s.numbers.clone();
    numbers[4] = 26;
    let err = calc
        .compute_domain(&numbers, &s.positions, 6)
        .unwrap_err()
        .to_string();
    assert!(err.contains("Z=26") && err.contains("atom 4"), "{err}");
    let mut x = s.positions.clone();
    x[3][1] = f64::NAN;
    let err = calc
        .compute_domain(&s.numbers, &x, 6)
        .unwrap_err()
        .to_string();
    assert!(err.contains("atom 3"), "{err}");
}
