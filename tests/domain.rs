//! `compute_domain`: a box cut into domains, each with ghosts out to the receptive field,
//! gives the whole box's energy, forces and virial (what the LAMMPS plugin relies on).

mod common;

use candle_core::{DType, Device};
use common::{calculator, dist, random_box, random_molecule};
use mlff_distiller::domain::{
    receptive_field, shells_for, skin_for, DomainPrediction, DomainSession, LayeredDomain,
    LayeredSession,
};
use mlff_distiller::model::{Backend, PainnConfig};
use mlff_distiller::stress::stress_volume;
use mlff_distiller::structure::{inverse, Matrix3};
use mlff_distiller::Tuning;
use mlff_distiller::{Batch, Calculator, PainnCalculator, Structure};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One domain: its atoms (locals first) and the box atom each stands for.
struct Domain {
    numbers: Vec<u8>,
    positions: Vec<[f64; 3]>,
    owner: Vec<usize>,
    n_local: usize,
}

/// `s` cut into `parts` slabs along the fractional a axis, each with ghosts out to `reach`:
/// every periodic image (other than its own atoms) within `reach` of one of its atoms, or with
/// `along_a` only the images shifted along a that lie within `reach` of the slab (the cell then
/// gives the images along b and c).
fn decompose(s: &Structure, parts: usize, reach: f64, along_a: bool) -> Vec<Domain> {
    let cell = s.cell.unwrap();
    let inv = inverse(&cell).unwrap();
    let unwrapped_a = |x: &[f64; 3]| (0..3).map(|k| x[k] * inv[k][0]).sum::<f64>();
    // The reach in fractions of a: over the width between the b-c planes.
    let width = reach * (0..3).map(|k| inv[k][0].powi(2)).sum::<f64>().sqrt();
    let m = 4; // images per axis either side: the box is smaller than the reach
    let shifts =
        (-m..=m).flat_map(|a| (-m..=m).flat_map(move |b| (-m..=m).map(move |c| [a, b, c])));
    let shifts: Vec<[i32; 3]> = shifts.filter(|s| !along_a || s[1..] == [0, 0]).collect();
    (0..parts)
        .map(|p| {
            let lo = p as f64 / parts as f64;
            let hi = (p + 1) as f64 / parts as f64;
            let locals: Vec<usize> = (0..s.len())
                .filter(|&i| (lo..hi).contains(&unwrapped_a(&s.positions[i]).rem_euclid(1.0)))
                .collect();
            let mut d = Domain {
                numbers: locals.iter().map(|&i| s.numbers[i]).collect(),
                positions: locals.iter().map(|&i| s.positions[i]).collect(),
                owner: locals.clone(),
                n_local: locals.len(),
            };
            for i in 0..s.len() {
                for shift in &shifts {
                    if *shift == [0; 3] && locals.contains(&i) {
                        continue;
                    }
                    let x: [f64; 3] = std::array::from_fn(|k| {
                        let by = (0..3).map(|r| f64::from(shift[r]) * cell[r][k]);
                        s.positions[i][k] + by.sum::<f64>()
                    });
                    let near = match along_a {
                        true => (lo - width..hi + width).contains(&unwrapped_a(&x)),
                        false => locals.iter().any(|&l| dist(&x, &s.positions[l]) < reach),
                    };
                    if near {
                        d.numbers.push(s.numbers[i]);
                        d.positions.push(x);
                        d.owner.push(i);
                    }
                }
            }
            d
        })
        .collect()
}

/// The test model on the CPU in f64, with `backend`.
fn calc(backend: Backend) -> PainnCalculator {
    calculator(DType::F64, &Device::Cpu).with_backend(backend)
}

fn calc_autograd() -> PainnCalculator {
    calc(Backend::Autograd)
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
    let volume = stress_volume(&s).unwrap();
    let want = Sums {
        energy: whole.prediction.energies[0],
        atom_energies: vec![],
        forces: whole.prediction.forces[0].clone(),
        virial: whole.stresses[0].unwrap().map(|r| r.map(|x| -volume * x)),
    };
    let fused = calc.model().backend() == Backend::Fused;
    let cell = s.cell.unwrap();
    // The whole cell as one domain, images from the cell rather than ghosts (fused only).
    let whole_cell = fused.then(|| {
        let all = Some((&cell, [true; 3]));
        let got = calc.compute_domain(&s.numbers, &s.positions, s.len(), all);
        let sums = add_up(&s, &[(got.unwrap(), (0..s.len()).collect())]);
        sums.assert_matches(&want, "the cell as one domain");
        sums.atom_energies
    });
    for parts in [1, 2, 3] {
        let ghosts = decompose(&s, parts, reach, false).into_iter().map(|d| {
            let got = calc.compute_domain(&d.numbers, &d.positions, d.n_local, None);
            (got.unwrap(), d.owner)
        });
        let sums = add_up(&s, &ghosts.collect::<Vec<_>>());
        sums.assert_matches(&want, &format!("{parts} domains with ghosts"));
        if let Some(e) = &whole_cell {
            assert_same_atom_energies(&sums.atom_energies, e, &format!("{parts} domains"));
        }
        if !fused {
            continue;
        }
        // Slabs along a with ghosts only along a, the cell periodic along b and c.
        let slabs = decompose(&s, parts, reach, true).into_iter().map(|d| {
            let bc = Some((&cell, [false, true, true]));
            let got = calc.compute_domain(&d.numbers, &d.positions, d.n_local, bc);
            (got.unwrap(), d.owner)
        });
        let sums = add_up(&s, &slabs.collect::<Vec<_>>());
        sums.assert_matches(&want, &format!("{parts} slabs periodic along b and c"));
        let e = whole_cell.as_ref().unwrap();
        assert_same_atom_energies(&sums.atom_energies, e, &format!("{parts} slabs"));
    }
}

/// Energies, forces on owners and virial summed over domains.
struct Sums {
    energy: f64,
    atom_energies: Vec<f64>,
    forces: Vec<[f64; 3]>,
    virial: Matrix3,
}

/// Sums domain results, each with the owner (box atom) of each of its atoms.
fn add_up(s: &Structure, domains: &[(DomainPrediction, Vec<usize>)]) -> Sums {
    let mut out = Sums {
        energy: 0.0,
        atom_energies: vec![f64::NAN; s.len()],
        forces: vec![[0.0; 3]; s.len()],
        virial: [[0.0; 3]; 3],
    };
    let mut owned = 0;
    for (got, owner) in domains {
        assert_eq!(got.forces.len(), owner.len());
        let sum: f64 = got.atom_energies.iter().sum();
        assert!((sum - got.energy).abs() < 1e-12 * sum.abs());
        out.energy += got.energy;
        owned += got.atom_energies.len();
        for (e, &i) in got.atom_energies.iter().zip(owner) {
            out.atom_energies[i] = *e;
        }
        for (f, &i) in got.forces.iter().zip(owner) {
            (0..3).for_each(|k| out.forces[i][k] += f[k]);
        }
        (0..3).for_each(|a| (0..3).for_each(|b| out.virial[a][b] += got.virial[a][b]));
    }
    assert_eq!(owned, s.len());
    // Each share need not be symmetric; their sum is, to rounding.
    let w = out.virial;
    out.virial = std::array::from_fn(|a| std::array::from_fn(|b| 0.5 * (w[a][b] + w[b][a])));
    out
}

impl Sums {
    fn assert_matches(&self, want: &Sums, what: &str) {
        let e = want.energy;
        let got = self.energy;
        assert!(
            (got - e).abs() < 1e-10 * e.abs(),
            "{what}: energy {got} vs {e}"
        );
        let sum: f64 = self.atom_energies.iter().sum();
        assert!(
            (sum - e).abs() < 1e-10 * e.abs(),
            "{what}: Σ atom energies {sum}"
        );
        let df = common::max_force_diff(&self.forces, &want.forces);
        let scale = common::max_abs(&want.forces);
        assert!(df < 1e-10 * scale, "{what}: forces off by {df}");
        assert_same_virial(&self.virial, &want.virial, what);
    }
}

/// Energy, atom energies, forces and virial of two domain predictions equal to 1e-10.
fn assert_same_prediction(got: &DomainPrediction, want: &DomainPrediction, what: &str) {
    assert!(
        (got.energy - want.energy).abs() < 1e-10 * want.energy.abs(),
        "{what}"
    );
    assert_same_atom_energies(&got.atom_energies, &want.atom_energies, what);
    let df = common::max_force_diff(&got.forces, &want.forces);
    assert!(df < 1e-10 * common::max_abs(&want.forces), "{what}: {df}");
    assert_same_virial(&got.virial, &want.virial, what);
}

fn assert_same_atom_energies(got: &[f64], want: &[f64], what: &str) {
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() < 1e-10 * b.abs(),
            "{what}: atom {i}: {a} vs {b}"
        );
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
        .compute_domain(&s.numbers, &s.positions, n_local, None)
        .unwrap();
    let h = 1e-5;
    for atom in [2, 9] {
        for k in 0..3 {
            let energy_at = |dx: f64| {
                let mut x = s.positions.clone();
                x[atom][k] += dx;
                calc.compute_domain(&s.numbers, &x, n_local, None)
                    .unwrap()
                    .energy
            };
            let fd = -(energy_at(h) - energy_at(-h)) / (2.0 * h);
            let f = got.forces[atom][k];
            assert!((fd - f).abs() < 1e-6, "atom {atom}, axis {k}: {f} vs {fd}");
        }
    }
    // All local: the molecule's own energy and forces.
    let all = calc
        .compute_domain(&s.numbers, &s.positions, s.len(), None)
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
        .compute_domain(&s.numbers, &s.positions, 7, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("7 local atoms") && err.contains("6 atoms"),
        "{err}"
    );
    let mut numbers = s.numbers.clone();
    numbers[4] = 26;
    let err = calc
        .compute_domain(&numbers, &s.positions, 6, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("Z=26") && err.contains("atom 4"), "{err}");
    let cell = [[9.0, 0.0, 0.0], [0.0, 9.0, 0.0], [0.0, 0.0, 9.0]];
    let err = calc_autograd()
        .compute_domain(&s.numbers, &s.positions, 6, Some((&cell, [true; 3])))
        .unwrap_err()
        .to_string();
    assert!(err.contains("needs the fused backend"), "{err}");
    let mut x = s.positions.clone();
    x[3][1] = f64::NAN;
    let err = calc
        .compute_domain(&s.numbers, &x, 6, None)
        .unwrap_err()
        .to_string();
    assert!(err.contains("atom 3"), "{err}");
}

#[test]
fn a_session_reuses_its_list_between_builds_and_matches_fresh_calls() {
    for backend in [Backend::Autograd, Backend::Fused] {
        let calc = calc(backend);
        let s = random_box(40, 0.15, 3);
        let cell = s.cell.unwrap();
        let d = decompose(&s, 2, calc.receptive_field(), backend == Backend::Fused).swap_remove(0);
        let bc = (backend == Backend::Fused).then_some((&cell, [false, true, true]));
        let mut session = DomainSession::new(&calc, 1.0);
        let mut x = d.positions.clone();
        let mut numbers = d.numbers.clone();
        let mut n_local = d.n_local;
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for step in 0..8 {
            // Steps 0-4 move every atom by < 0.1 Å each (under half the skin in all); step 5
            // moves them far enough to rebuild; 6 changes an element, 7 the local count.
            let kick = if step == 5 { 0.6 } else { 0.02 };
            for xi in x.iter_mut() {
                xi.iter_mut()
                    .for_each(|c| *c += rng.random_range(-kick..kick));
            }
            if step == 6 {
                numbers[3] = if numbers[3] == 1 { 8 } else { 1 };
            }
            if step == 7 {
                n_local -= 2;
            }
            let got = session.compute(&calc, &numbers, &x, n_local, bc).unwrap();
            let want = calc.compute_domain(&numbers, &x, n_local, bc).unwrap();
            let what = format!("{backend:?}, step {step}");
            assert_same_prediction(&got, &want, &what);
            // A new local count reorders a fused domain's ghosts by depth (its shells): a
            // new list.
            let shells = backend == Backend::Fused && step == 7;
            let builds = if step < 5 { 1 } else { 2 + usize::from(shells) };
            assert_eq!(session.builds(), builds, "{what}");
        }
    }
}

/// Ghost shells that shrink block by block (the default: block k updates the ghosts within
/// blocks − 1 − k list cutoffs of the own atoms) give what every block over every ghost gives,
/// f64 to 1e-10, on 2 and 3 slabs of a box with ghosts to the receptive field, over a few moved
/// steps of a session with a skin; each block updates fewer atoms than the one before.
#[test]
fn shrinking_shells_match_every_block_over_every_ghost() {
    let full = calc(Backend::Fused).with_tuning(Tuning {
        domain_shells: Some(false),
        ..Default::default()
    });
    let s = random_box(120, 0.1, 8);
    let cell = s.cell.unwrap();
    let bc = Some((&cell, [false, true, true]));
    // The second with the symmetric adjoint's twin at every edge count (its default threshold
    // is above this box's lists).
    let tiled = Tuning {
        tile_from_edges: Some(1),
        ..Default::default()
    };
    for (parts, shells) in [(2, Tuning::default()), (3, Tuning::default()), (2, tiled)] {
        let shells = calc(Backend::Fused).with_tuning(shells);
        let d = decompose(&s, parts, shells.receptive_field(), true).swap_remove(0);
        let mut session = DomainSession::new(&shells, 0.3);
        let mut x = d.positions.clone();
        let mut rng = ChaCha8Rng::seed_from_u64(parts as u64);
        for step in 0..3 {
            for xi in x.iter_mut() {
                xi.iter_mut()
                    .for_each(|c| *c += rng.random_range(-0.05..0.05));
            }
            let got = session
                .compute(&shells, &d.numbers, &x, d.n_local, bc)
                .unwrap();
            let want = full.compute_domain(&d.numbers, &x, d.n_local, bc).unwrap();
            let what = format!("{parts} slabs, step {step}");
            assert_same_prediction(&got, &want, &what);
            let rows = session.shell_rows().expect("shells");
            assert_eq!(rows[rows.len() - 1], d.n_local, "{what}");
            assert!(rows.windows(2).all(|w| w[0] > w[1]), "{what}: {rows:?}");
            assert!(
                rows[0] < d.numbers.len(),
                "{what}: {rows:?} of {}",
                d.numbers.len()
            );
        }
    }
}

#[test]
fn the_skin_is_chosen_by_device_unless_the_tuning_says() {
    let mut tuning = Tuning::default();
    assert_eq!(skin_for(&tuning, &Device::Cpu), 0.0);
    tuning.domain_skin = Some(0.5);
    assert_eq!(skin_for(&tuning, &Device::Cpu), 0.5);
    // The shells too: on the CPU unless the tuning turns them off.
    assert!(shells_for(&tuning, &Device::Cpu));
    tuning.domain_shells = Some(false);
    assert!(!shells_for(&tuning, &Device::Cpu));
}

/// Where each box atom is local: (domain, row).
fn homes(s: &Structure, domains: &[Domain]) -> Vec<(usize, usize)> {
    let mut home = vec![(usize::MAX, 0); s.len()];
    for (p, d) in domains.iter().enumerate() {
        for (r, &i) in d.owner[..d.n_local].iter().enumerate() {
            home[i] = (p, r);
        }
    }
    assert!(home.iter().all(|h| h.0 != usize::MAX));
    home
}

/// The layered protocol over in-process domains, the exchanges done as LAMMPS's forward and
/// reverse communication would: every ghost reads its owner's output before each block after
/// the first, and every ghost's gradient is added to its owner's before each backward block
/// after the last. Returns the box's energy and the forces summed onto owners.
fn run_layered(calc: &PainnCalculator, s: &Structure, domains: &[Domain]) -> (f64, Vec<[f64; 3]>) {
    let home = homes(s, domains);
    let mut layered: Vec<LayeredDomain> = domains
        .iter()
        .map(|d| LayeredDomain::new(calc, &d.numbers, &d.positions, d.n_local).unwrap())
        .collect();
    let (w, blocks) = (layered[0].features_per_atom(), layered[0].blocks());
    let mut outs: Vec<Vec<f64>> = layered
        .iter_mut()
        .map(|l| l.forward(calc, None).unwrap())
        .collect();
    for _ in 1..blocks {
        let ghosts: Vec<Vec<f64>> = domains
            .iter()
            .map(|d| {
                let rows = d.owner[d.n_local..].iter().map(|&i| home[i]);
                rows.flat_map(|(p, r)| outs[p][r * w..(r + 1) * w].to_vec())
                    .collect()
            })
            .collect();
        outs = layered
            .iter_mut()
            .zip(&ghosts)
            .map(|(l, g)| l.forward(calc, Some(g)).unwrap())
            .collect();
    }
    let energy = layered
        .iter()
        .map(|l| l.atom_energies().unwrap().iter().sum::<f64>())
        .sum();
    let mut back: Vec<Vec<f64>> = layered
        .iter_mut()
        .map(|l| l.backward(calc, None).unwrap())
        .collect();
    for _ in 1..blocks {
        let mut received: Vec<Vec<f64>> =
            domains.iter().map(|d| vec![0.0; d.n_local * w]).collect();
        for (d, g) in domains.iter().zip(&back) {
            assert_eq!(g.len(), (d.owner.len() - d.n_local) * w);
            for (q, &i) in d.owner[d.n_local..].iter().enumerate() {
                let (p, r) = home[i];
                for c in 0..w {
                    received[p][r * w + c] += g[q * w + c];
                }
            }
        }
        back = layered
            .iter_mut()
            .zip(&received)
            .map(|(l, r)| l.backward(calc, Some(r)).unwrap())
            .collect();
    }
    assert!(
        back.iter().all(Vec::is_empty),
        "the first block sends nothing back"
    );
    let mut forces = vec![[0.0; 3]; s.len()];
    for (l, d) in layered.iter().zip(domains) {
        for (f, &i) in l.forces().unwrap().iter().zip(&d.owner) {
            (0..3).for_each(|k| forces[i][k] += f[k]);
        }
    }
    (energy, forces)
}

#[test]
fn layered_domains_with_one_cutoff_of_ghosts_add_up_to_the_box() {
    // 40 atoms in a 7.4 Å box: a cutoff of ghosts reaches across domains and images. Two
    // blocks exchange once each way, three twice.
    let s = random_box(40, 0.15, 3);
    for (n_blocks, cutoff) in [(2, 4.0), (3, 3.5)] {
        let cfg = PainnConfig {
            n_blocks,
            cutoff,
            ..common::small_config()
        };
        let whole = PainnCalculator::new(
            common::model(&cfg, 7, DType::F64, &Device::Cpu),
            Device::Cpu,
            DType::F64,
        )
        .with_backend(Backend::Autograd);
        let whole = whole
            .compute(&Batch::new(vec![s.clone()]).unwrap())
            .unwrap();
        let (e, f) = (whole.energies[0], &whole.forces[0]);
        // The layered blocks' first block as sums per element (the default) and per edge.
        for (parts, first_block_sums) in [(1, true), (2, true), (3, true), (2, false)] {
            let model = common::model(&cfg, 7, DType::F64, &Device::Cpu);
            let tuning = mlff_distiller::Tuning {
                first_block_sums,
                ..Default::default()
            };
            let calc = PainnCalculator::new(model, Device::Cpu, DType::F64).with_tuning(tuning);
            let what = format!("{n_blocks} blocks, {parts} domains, sums {first_block_sums}");
            let domains = decompose(&s, parts, cutoff, false);
            let (got, forces) = run_layered(&calc, &s, &domains);
            assert!(
                (got - e).abs() < 1e-10 * e.abs(),
                "{what}: energy {got} vs {e}"
            );
            let df = common::max_force_diff(&forces, f);
            assert!(
                df < 1e-10 * common::max_abs(f),
                "{what}: forces off by {df}"
            );
            // The same ghosts without the exchange (each domain alone) miss the box's energy:
            // the receptive field reaches past them.
            let alone: f64 = domains
                .iter()
                .map(|d| {
                    let got = calc.compute_domain(&d.numbers, &d.positions, d.n_local, None);
                    got.unwrap().energy
                })
                .sum();
            assert!((alone - e).abs() > 1e-4, "{what} alone: {alone} vs {e}");
        }
    }
}

#[test]
fn a_layered_domain_refuses_calls_out_of_order_and_wrong_sizes() {
    let calc = &calc_autograd();
    let s = random_molecule(12, 5);
    let mut l = LayeredDomain::new(calc, &s.numbers, &s.positions, 5).unwrap();
    let w = l.features_per_atom();
    let err = |r: mlff_distiller::Result<Vec<f64>>| r.unwrap_err().to_string();
    assert!(err(l.backward(calc, None)).contains("every block forward first"));
    assert!(err(l.forward(calc, Some(&[0.0; 7]))).contains("embeddings"));
    assert!(l.forces().is_err() && l.atom_energies().is_err());
    l.forward(calc, None).unwrap();
    assert!(err(l.forward(calc, None)).contains("block 1 needs its ghosts' features"));
    let short = vec![0.0; 6 * w];
    let e = err(l.forward(calc, Some(&short)));
    assert!(
        e.contains(&format!("{} ghost features for 7 atoms of {w}", 6 * w)),
        "{e}"
    );
    let mut bad = vec![0.0; 7 * w];
    bad[3 * w + 1] = f64::NAN;
    assert!(err(l.forward(calc, Some(&bad))).contains("atom 3"));
    for _ in 1..l.blocks() {
        l.forward(calc, Some(&vec![0.1; 7 * w])).unwrap();
    }
    assert!(err(l.forward(calc, Some(&vec![0.1; 7 * w]))).contains("have run forward"));
    assert!(err(l.backward(calc, Some(&vec![0.0; 5 * w]))).contains("none is received"));
    let back = l.backward(calc, None).unwrap();
    assert_eq!(back.len(), 7 * w);
    assert!(err(l.backward(calc, None)).contains("sent back"));
    assert!(l.forces().is_err());
}

#[test]
fn a_layered_domain_without_local_atoms_or_without_ghosts_runs() {
    let calc = &calc_autograd();
    let s = random_molecule(6, 2);
    for (n, n_local) in [(0, 0), (6, 0), (6, 6)] {
        let mut l = LayeredDomain::new(calc, &s.numbers[..n], &s.positions[..n], n_local).unwrap();
        let w = l.features_per_atom();
        for _ in 0..l.blocks() {
            let out = l.forward(calc, None).unwrap();
            assert_eq!(out.len(), n_local * w);
        }
        let e: f64 = l.atom_energies().unwrap().iter().sum();
        for i in 0..l.blocks() {
            // Nothing comes back from other domains.
            let received = (i > 0).then(|| vec![0.0; n_local * w]);
            let back = l.backward(calc, received.as_deref()).unwrap();
            let ghosts = if i + 1 < l.blocks() {
                (n - n_local) * w
            } else {
                0
            };
            assert_eq!(back.len(), ghosts);
        }
        let f = l.forces().unwrap();
        if n_local == n && n > 0 {
            let whole = calc.compute(&Batch::new(vec![s.clone()]).unwrap()).unwrap();
            assert!((e - whole.energies[0]).abs() < 1e-10 * e.abs());
            assert!(common::max_force_diff(&f, &whole.forces[0]) < 1e-10);
        } else {
            assert_eq!(e, 0.0);
            assert!(f.iter().flatten().all(|&x| x == 0.0));
        }
    }
}

/// A layered session keeps its list (cutoff + skin) while no atom moves more than half the
/// skin, and its domains compute what fresh ones do (the skin's pairs add exact zeros); a
/// larger move rebuilds it.
#[test]
fn a_layered_session_reuses_its_list_and_matches_fresh_domains() {
    let calc = calc(Backend::Fused);
    let s = random_box(40, 0.15, 3);
    let d = &decompose(&s, 2, calc.model().config().cutoff, false)[0];
    assert!(d.positions.len() > d.n_local, "the domain has ghosts");
    let mut session = LayeredSession::new(&calc, 1.0);
    let mut x = d.positions.clone();
    for step in 0..5 {
        match step {
            // The last step moves one atom past half the skin.
            4 => x[0][0] += 0.6,
            _ => (x.iter_mut().enumerate())
                .for_each(|(i, xi)| xi[i % 3] += 0.02 * (((i + step) % 3) as f64 - 1.0)),
        }
        let kept = session.domain(&calc, &d.numbers, &x, d.n_local).unwrap();
        let fresh = LayeredDomain::new(&calc, &d.numbers, &x, d.n_local).unwrap();
        let (kept, fresh) = (
            common::layered_records(&calc, kept),
            common::layered_records(&calc, fresh),
        );
        for (k, (a, b)) in kept.iter().zip(&fresh).enumerate() {
            assert_eq!(a.len(), b.len(), "step {step}, record {k}");
            let scale = b.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let worst = a
                .iter()
                .zip(b)
                .fold(0.0f64, |m, (p, q)| m.max((p - q).abs()));
            assert!(
                worst <= 1e-12 * scale,
                "step {step}, record {k}: {worst} of {scale}"
            );
        }
        assert_eq!(
            session.builds(),
            if step < 4 { 1 } else { 2 },
            "step {step}"
        );
    }
}
