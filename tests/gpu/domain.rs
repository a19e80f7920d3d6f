//! Domains on CUDA against the CPU (what LAMMPS's pair style computes): the shipped student on
//! a water box cut into a slab with ghosts, the fused backend with the ghost mask and the edge
//! virial, with and without cell axes, a session keeping its list on the device, and a layered
//! domain (`exchange features`) block by block.

use crate::{cuda, shipped_calculator};
use candle_core::{DType, Device};
use mlff_distiller::domain::{DomainPrediction, DomainSession, LayeredDomain};
use mlff_distiller::model::Backend;
use mlff_distiller::systems::water_box;
use mlff_distiller::Structure;

/// The box's atoms with x below half its side as local, then every atom shifted by ±a (and
/// the box's own others) as ghosts: a slab whose cell gives the images along b and c.
fn slab() -> (Structure, Vec<u8>, Vec<[f64; 3]>, usize) {
    let s = water_box(300, 0);
    let cell = s.cell.unwrap();
    let half = 0.5 * cell[0][0];
    let (mut numbers, mut x) = (vec![], vec![]);
    let local = |p: &[f64; 3]| p[0] < half;
    for (z, p) in s.numbers.iter().zip(&s.positions).filter(|(_, p)| local(p)) {
        numbers.push(*z);
        x.push(*p);
    }
    let n_local = numbers.len();
    for shift in [-1.0, 0.0, 1.0] {
        for (z, p) in s.numbers.iter().zip(&s.positions) {
            if shift == 0.0 && local(p) {
                continue;
            }
            numbers.push(*z);
            x.push([p[0] + shift * cell[0][0], p[1], p[2]]);
        }
    }
    (s, numbers, x, n_local)
}

fn assert_close(cpu: &DomainPrediction, gpu: &DomainPrediction, tol: f64, what: &str) {
    let e = cpu.energy.abs();
    assert!((cpu.energy - gpu.energy).abs() < tol * e, "{what}: energy");
    let emax = largest(cpu.atom_energies.iter());
    for (a, b) in cpu.atom_energies.iter().zip(&gpu.atom_energies) {
        assert!((a - b).abs() < tol * emax, "{what}: atom energy {b} vs {a}");
    }
    let fmax = largest(cpu.forces.iter().flatten());
    for (a, b) in cpu.forces.iter().flatten().zip(gpu.forces.iter().flatten()) {
        assert!((a - b).abs() < tol * fmax, "{what}: force {b} vs {a}");
    }
    let wmax = largest(cpu.virial.iter().flatten());
    for (a, b) in cpu.virial.iter().flatten().zip(gpu.virial.iter().flatten()) {
        assert!((a - b).abs() < tol * wmax, "{what}: virial {b} vs {a}");
    }
}

fn largest<'a>(values: impl Iterator<Item = &'a f64>) -> f64 {
    values.fold(0.0f64, |m, x| m.max(x.abs()))
}

#[test]
fn cuda_domains_match_cpu() {
    let (s, numbers, x, n_local) = slab();
    let cell = s.cell.unwrap();
    for (dtype, tol) in [(DType::F64, 1e-9), (DType::F32, 2e-4)] {
        let run = |dev: &Device, bc: Option<(&[[f64; 3]; 3], [bool; 3])>| {
            let calc = shipped_calculator(dev, dtype, Backend::Fused);
            calc.compute_domain(&numbers, &x, n_local, bc).unwrap()
        };
        for bc in [None, Some((&cell, [false, true, true]))] {
            let what = format!("{dtype:?}, cell axes {:?}", bc.map(|c| c.1));
            assert_close(&run(&Device::Cpu, bc), &run(&cuda(), bc), tol, &what);
        }
    }
}

/// The domain's device list binned (the tuning's threshold at 0 atoms) gives the CPU's
/// results: the slab's ghosts along a non-periodic axis (bins over their range), with and
/// without cell axes, and a session over moving atoms.
#[test]
fn cuda_domains_with_binned_lists_match_cpu() {
    let (s, numbers, mut x, n_local) = slab();
    let cell = s.cell.unwrap();
    let tuning = mlff_distiller::Tuning {
        device_list_bins_from_atoms: 0,
        ..Default::default()
    };
    let calc = |dev: &Device| {
        shipped_calculator(dev, DType::F64, Backend::Fused).with_tuning(tuning.clone())
    };
    let (cpu, gpu) = (calc(&Device::Cpu), calc(&cuda()));
    for bc in [None, Some((&cell, [false, true, true]))] {
        let want = cpu.compute_domain(&numbers, &x, n_local, bc).unwrap();
        let got = gpu.compute_domain(&numbers, &x, n_local, bc).unwrap();
        assert_close(
            &want,
            &got,
            1e-9,
            &format!("binned, cell axes {:?}", bc.map(|c| c.1)),
        );
    }
    let bc = Some((&cell, [false, true, true]));
    let mut session = DomainSession::new(&gpu, 1.0);
    for step in 0..3 {
        for (i, xi) in x.iter_mut().enumerate() {
            xi[i % 3] += 0.2 * ((i * 7 + step) % 5) as f64 - 0.4;
        }
        let kept = session.compute(&gpu, &numbers, &x, n_local, bc).unwrap();
        let want = cpu.compute_domain(&numbers, &x, n_local, bc).unwrap();
        assert_close(&want, &kept, 1e-9, &format!("session step {step}"));
    }
    // Moves of up to 0.4 Å a step against a 1 Å skin: rebuilt lists among the kept ones.
    assert!(session.builds() >= 2, "{} builds", session.builds());
}

/// Shrinking ghost shells on CUDA (asked for: off by default there) against every block over
/// every ghost, on the CPU and on CUDA, f64 and f32 (the tensor-core symmetric adjoint): the
/// slab's ghosts along a, with and without a skin.
#[test]
fn cuda_shrinking_shells_match_full_shells() {
    let (s, numbers, x, n_local) = slab();
    let cell = s.cell.unwrap();
    let bc = Some((&cell, [false, true, true]));
    let tuning = |shells: bool| mlff_distiller::Tuning {
        domain_shells: Some(shells),
        ..Default::default()
    };
    for (dtype, tol) in [(DType::F64, 1e-9), (DType::F32, 2e-4)] {
        let calc = |dev: &Device, shells: bool| {
            shipped_calculator(dev, dtype, Backend::Fused).with_tuning(tuning(shells))
        };
        let want = calc(&Device::Cpu, false)
            .compute_domain(&numbers, &x, n_local, bc)
            .unwrap();
        let got_full = calc(&cuda(), false)
            .compute_domain(&numbers, &x, n_local, bc)
            .unwrap();
        assert_close(
            &want,
            &got_full,
            tol,
            &format!("{dtype:?}, CUDA, full shells"),
        );
        let gpu = calc(&cuda(), true);
        for skin in [0.0, 1.0] {
            let mut session = DomainSession::new(&gpu, skin);
            let got = session.compute(&gpu, &numbers, &x, n_local, bc).unwrap();
            let what = format!("{dtype:?}, CUDA, shells, skin {skin}");
            assert_close(&want, &got, tol, &what);
            let rows = session.shell_rows().expect("shells");
            assert!(
                rows.windows(2).all(|w| w[0] > w[1]) && rows[0] < numbers.len(),
                "{rows:?}"
            );
        }
    }
}

/// The edge partition's kernels give the CPU twin's list, order and class counts exactly:
/// several tiles, classes of every size (one empty), a last tile part full.
#[test]
fn cuda_edge_partition_matches_cpu() {
    use candle_core::Tensor;
    use mlff_distiller::ops::partition_edges;
    let (n, e) = (5_000u32, 300_001usize);
    let mut state = 12345u64;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as u32
    };
    let mut centers: Vec<u32> = (0..e).map(|_| next() % n).collect();
    centers.sort_unstable();
    let neighbors: Vec<u32> = (0..e).map(|_| next() % n).collect();
    let bounds = [700, 1_900, 1_900, 4_000];
    let run = |dev: &Device| {
        let c = Tensor::new(centers.as_slice(), dev).unwrap();
        let nb = Tensor::new(neighbors.as_slice(), dev).unwrap();
        let p = partition_edges(&c, &nb, &bounds).unwrap();
        let v = |t: &Tensor| t.to_device(&Device::Cpu).unwrap().to_vec1::<u32>().unwrap();
        (v(&p.centers), v(&p.neighbors), v(&p.order), p.counts)
    };
    let (want, got) = (run(&Device::Cpu), run(&cuda()));
    assert_eq!(want.3, got.3, "class counts");
    assert_eq!(want.3.iter().sum::<usize>(), e);
    assert_eq!(want.3[2], 0, "the empty class");
    assert!(
        want.0 == got.0 && want.1 == got.1 && want.2 == got.2,
        "lists differ"
    );
}

#[test]
fn a_cuda_session_keeps_its_list_and_matches_fresh_calls() {
    let (s, numbers, mut x, n_local) = slab();
    let cell = s.cell.unwrap();
    let bc = Some((&cell, [false, true, true]));
    let calc = shipped_calculator(&cuda(), DType::F64, Backend::Fused);
    let mut session = DomainSession::new(&calc, 1.0);
    for step in 0..4 {
        for (i, xi) in x.iter_mut().enumerate() {
            xi[i % 3] += 0.01 * ((i * 7 + step) % 5) as f64 - 0.02;
        }
        let kept = session.compute(&calc, &numbers, &x, n_local, bc).unwrap();
        let fresh = calc.compute_domain(&numbers, &x, n_local, bc).unwrap();
        assert_close(&fresh, &kept, 1e-10, &format!("step {step}"));
    }
    assert_eq!(session.builds(), 1);
}

/// A layered domain (ghosts to one cutoff, each block on the fused kernels over one-sided
/// edges) on CUDA against the CPU: every block's outputs, the energies, the gradients sent
/// back and the forces, with made-up ghost features and received gradients that both share
/// (`common::layered_records`; f64 to 1e-9 of each record's largest value, f32 to 2e-4).
#[test]
fn cuda_layered_domain_matches_cpu() {
    let (_, numbers, x, n_local) = slab();
    for (dtype, tol) in [(DType::F64, 1e-9), (DType::F32, 2e-4)] {
        let run = |dev: &Device| {
            let calc = shipped_calculator(dev, dtype, Backend::Fused);
            let l = LayeredDomain::new(&calc, &numbers, &x, n_local).unwrap();
            crate::common::layered_records(&calc, l)
        };
        let (cpu, gpu) = (run(&Device::Cpu), run(&cuda()));
        for (k, (a, b)) in cpu.iter().zip(&gpu).enumerate() {
            assert_eq!(a.len(), b.len(), "{dtype:?}, record {k}");
            let scale = largest(a.iter());
            for (p, q) in a.iter().zip(b) {
                assert!(
                    (p - q).abs() <= tol * scale,
                    "{dtype:?}, record {k}: {q} vs {p}"
                );
            }
        }
    }
}
