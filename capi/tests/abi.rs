//! The C interface as C calls it: the shipped student through `mlff_*`, against the library.

use candle_core::{DType, Device};
use mlff_capi::*;
use mlff_distiller::model::Backend;
use mlff_distiller::{Batch, Calculator, PainnCalculator, Structure};
use std::ffi::{CStr, CString};
use std::path::PathBuf;

fn shipped() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/painn-gfn2.safetensors")
}

fn last_error() -> String {
    unsafe { CStr::from_ptr(mlff_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn load(path: &str, device: &str, bits: i32) -> (Status, *mut Model) {
    let (p, d) = (CString::new(path).unwrap(), CString::new(device).unwrap());
    let mut out = std::ptr::null_mut();
    let status = unsafe { mlff_model_load(p.as_ptr(), d.as_ptr(), bits, &mut out) };
    (status, out)
}

/// The atoms of one `mlff_compute` call: counts, flat positions, atomic numbers, and the cell
/// and pbc (each passed as given, null where None).
struct Atoms<'a> {
    n_all: i64,
    n_local: i64,
    x: &'a [f64],
    z: &'a [i32],
    cell: Option<&'a [f64]>,
    pbc: Option<[i32; 3]>,
}

/// What `mlff_compute` wrote: the energy, and with `all` the per-atom energies, forces and
/// virial (without, those are passed as null).
struct Outputs {
    energy: f64,
    atom_energies: Vec<f64>,
    forces: Vec<f64>,
    virial: [f64; 9],
}

fn compute(m: *mut Model, a: &Atoms, all: bool) -> (Status, Outputs) {
    let mut out = Outputs {
        energy: 0.0,
        atom_energies: vec![0.0; a.n_local.max(0) as usize],
        forces: vec![0.0; 3 * a.n_all.max(0) as usize],
        virial: [0.0; 9],
    };
    let cell = a.cell.map_or(std::ptr::null(), |c| c.as_ptr());
    let pbc = a.pbc.as_ref().map_or(std::ptr::null(), |p| p.as_ptr());
    let ptr = |v: &mut [f64]| match all {
        true => v.as_mut_ptr(),
        false => std::ptr::null_mut(),
    };
    let status = unsafe {
        mlff_compute(
            m,
            a.n_all,
            a.n_local,
            a.x.as_ptr(),
            a.z.as_ptr(),
            cell,
            pbc,
            &mut out.energy,
            ptr(&mut out.atom_energies),
            ptr(&mut out.forces),
            ptr(&mut out.virial),
        )
    };
    (status, out)
}

/// A water dimer and a methane: 8 atoms.
fn molecule() -> Structure {
    Structure::molecule(
        vec![8, 1, 1, 8, 1, 1, 6, 1],
        vec![
            [0.0, 0.0, 0.0],
            [0.96, 0.0, 0.0],
            [-0.24, 0.93, 0.0],
            [2.9, 0.1, 0.2],
            [3.3, 0.9, 0.4],
            [3.3, -0.6, 0.5],
            [0.5, 3.4, 0.3],
            [1.5, 3.6, 0.1],
        ],
    )
}

#[test]
fn a_model_through_the_c_interface_matches_the_library() {
    let (status, m) = load(shipped().to_str().unwrap(), "cpu", 64);
    assert_eq!(status, Status::Ok, "{}", last_error());
    assert_eq!(last_error(), "");
    unsafe {
        assert_eq!(mlff_model_cutoff(m), 5.0);
        assert_eq!(mlff_model_n_blocks(m), 3);
        assert_eq!(mlff_model_receptive_field(m), 15.0);
        let n = mlff_model_n_elements(m);
        let mut zs = vec![0i32; n as usize];
        assert_eq!(mlff_model_elements(m, zs.as_mut_ptr()), Status::Ok);
        assert_eq!(zs, [1, 6, 7, 8]);
    }
    let s = molecule();
    let lib = PainnCalculator::from_checkpoint(&shipped(), &Device::Cpu, DType::F64)
        .unwrap()
        .with_backend(Backend::Fused);
    let want = lib.compute(&Batch::new(vec![s.clone()]).unwrap()).unwrap();
    let x: Vec<f64> = s.positions.iter().flatten().copied().collect();
    let z: Vec<i32> = s.numbers.iter().map(|&z| i32::from(z)).collect();
    let n = s.len();
    // All atoms local: the molecule's energy and forces; then 5 local and 3 ghosts.
    for n_local in [n, 5] {
        let atoms = Atoms {
            n_all: n as i64,
            n_local: n_local as i64,
            x: &x,
            z: &z,
            cell: None,
            pbc: None,
        };
        let (status, out) = compute(m, &atoms, true);
        let (e, ea, f, w) = (out.energy, out.atom_energies, out.forces, out.virial);
        assert_eq!(status, Status::Ok, "{}", last_error());
        let dom = lib
            .compute_domain(&s.numbers, &s.positions, n_local, None)
            .unwrap();
        assert_eq!(e, dom.energy);
        assert_eq!(ea, dom.atom_energies);
        let rows: Vec<f64> = dom.forces.iter().flatten().copied().collect();
        assert_eq!(f, rows);
        for a in 0..3 {
            for b in 0..3 {
                let sum: f64 = (0..n).map(|i| x[3 * i + a] * f[3 * i + b]).sum();
                assert!((w[3 * a + b] - sum).abs() < 1e-12, "virial {a}{b}");
            }
        }
        if n_local == n {
            assert!((e - want.energies[0]).abs() < 1e-9 * e.abs());
            for (i, fi) in want.forces[0].iter().enumerate() {
                for k in 0..3 {
                    assert!((f[3 * i + k] - fi[k]).abs() < 1e-9, "atom {i}");
                }
            }
        }
    }
    // Only the energy asked for: the other outputs may be null.
    let atoms = Atoms {
        n_all: n as i64,
        n_local: n as i64,
        x: &x,
        z: &z,
        cell: None,
        pbc: None,
    };
    let (status, out) = compute(m, &atoms, false);
    let e = out.energy;
    assert_eq!(status, Status::Ok);
    assert!((e - want.energies[0]).abs() < 1e-9 * e.abs());
    unsafe { mlff_model_free(m) };
}

#[test]
fn bad_calls_return_a_status_and_name_the_cause() {
    let (status, m) = load("/nonexistent/student.safetensors", "cpu", 32);
    assert_eq!(status, Status::Model);
    assert!(m.is_null());
    assert!(
        last_error().contains("/nonexistent/student.safetensors"),
        "{}",
        last_error()
    );
    let path = shipped();
    let (status, _) = load(path.to_str().unwrap(), "cpu", 16);
    assert_eq!(status, Status::Argument);
    assert!(
        last_error().contains("dtype_bits is 16"),
        "{}",
        last_error()
    );
    let (status, _) = load(path.to_str().unwrap(), "tpu", 32);
    assert_eq!(status, Status::Argument);
    assert!(
        last_error().contains("unknown device `tpu`"),
        "{}",
        last_error()
    );

    let (status, m) = load(path.to_str().unwrap(), "cpu", 32);
    assert_eq!(status, Status::Ok);
    let s = molecule();
    let x: Vec<f64> = s.positions.iter().flatten().copied().collect();
    let mut z: Vec<i32> = s.numbers.iter().map(|&z| i32::from(z)).collect();
    let call = |m: *mut Model, n_all: i64, n_local: i64, z: &[i32]| {
        let (x, cell, pbc) = (&x, None, None);
        compute(
            m,
            &Atoms {
                n_all,
                n_local,
                x,
                z,
                cell,
                pbc,
            },
            false,
        )
        .0
    };
    assert_eq!(call(m, 8, 9, &z), Status::Argument);
    assert!(last_error().contains("n_local 9"), "{}", last_error());
    assert_eq!(call(std::ptr::null_mut(), 8, 8, &z), Status::Argument);
    assert!(last_error().contains("model is null"));
    z[6] = 26;
    assert_eq!(call(m, 8, 8, &z), Status::Input);
    assert!(
        last_error().contains("Z=26") && last_error().contains("atom 6"),
        "{}",
        last_error()
    );
    z[6] = 0;
    assert_eq!(call(m, 8, 8, &z), Status::Input);
    assert!(
        last_error().contains("atom 6 has atomic number 0"),
        "{}",
        last_error()
    );
    unsafe {
        let o = CString::new("O").unwrap();
        let bad = CString::new("Xx").unwrap();
        assert_eq!(mlff_atomic_number(o.as_ptr()), 8);
        assert_eq!(mlff_atomic_number(bad.as_ptr()), 0);
        assert_eq!(mlff_atomic_number(std::ptr::null()), 0);
        mlff_model_free(m);
    }
}

#[test]
fn a_periodic_cell_through_the_c_interface_matches_the_library() {
    let (status, m) = load(shipped().to_str().unwrap(), "cpu", 64);
    assert_eq!(status, Status::Ok, "{}", last_error());
    let cell = [[6.5, 0.0, 0.0], [0.8, 6.2, 0.0], [-0.4, 0.3, 6.0]];
    let mut s = molecule();
    s.cell = Some(cell);
    s.pbc = [true; 3];
    let lib = PainnCalculator::from_checkpoint(&shipped(), &Device::Cpu, DType::F64)
        .unwrap()
        .with_backend(Backend::Fused);
    let want = lib
        .compute_with_stress(&Batch::new(vec![s.clone()]).unwrap())
        .unwrap();
    let volume = mlff_distiller::stress::stress_volume(&s).unwrap();
    let x: Vec<f64> = s.positions.iter().flatten().copied().collect();
    let z: Vec<i32> = s.numbers.iter().map(|&z| i32::from(z)).collect();
    let c: Vec<f64> = cell.iter().flatten().copied().collect();
    let n = s.len();
    let atoms = Atoms {
        n_all: n as i64,
        n_local: n as i64,
        x: &x,
        z: &z,
        cell: Some(&c),
        pbc: Some([1, 1, 1]),
    };
    let (status, out) = compute(m, &atoms, true);
    let (e, ea, f, w) = (out.energy, out.atom_energies, out.forces, out.virial);
    assert_eq!(status, Status::Ok, "{}", last_error());
    let e_ref = want.prediction.energies[0];
    assert!((e - e_ref).abs() < 1e-9 * e_ref.abs());
    assert!((ea.iter().sum::<f64>() - e_ref).abs() < 1e-9 * e_ref.abs());
    for (i, fi) in want.prediction.forces[0].iter().enumerate() {
        for k in 0..3 {
            assert!((f[3 * i + k] - fi[k]).abs() < 1e-9, "atom {i}");
        }
    }
    let sigma = want.stresses[0].unwrap();
    for a in 0..3 {
        for b in 0..3 {
            let dw = (w[3 * a + b] + volume * sigma[a][b]).abs();
            assert!(dw < 1e-9, "virial {a}{b} off by {dw}");
        }
    }
    let no_cell = Atoms {
        cell: None,
        ..atoms
    };
    let (status, _) = compute(m, &no_cell, false);
    assert_eq!(status, Status::Argument);
    assert!(
        last_error().contains("give both cell and pbc"),
        "{}",
        last_error()
    );
    unsafe { mlff_model_free(m) };
}

/// One `mlff_layered_*` call of domain `m` (each domain its own handle, as each LAMMPS rank).
struct LayeredRun {
    m: *mut Model,
    /// Molecule atom of each of the domain's atoms, locals first.
    atoms: Vec<usize>,
    n_local: usize,
}

#[test]
fn layered_domains_through_the_c_interface_add_up_to_the_molecule() {
    let s = molecule();
    let lib = PainnCalculator::from_checkpoint(&shipped(), &Device::Cpu, DType::F64).unwrap();
    let want = lib.compute(&Batch::new(vec![s.clone()]).unwrap()).unwrap();
    // Atoms 0-3 local to one domain, 4-7 to the other; every other atom within the cutoff of a
    // local one is a ghost (here all: the molecule is smaller than the 5 Å cutoff).
    let runs: Vec<LayeredRun> = [0..4, 4..8]
        .into_iter()
        .map(|local| {
            let (status, m) = load(shipped().to_str().unwrap(), "cpu", 64);
            assert_eq!(status, Status::Ok, "{}", last_error());
            let ghosts = (0..s.len()).filter(|i| !local.contains(i));
            let atoms: Vec<usize> = local.clone().chain(ghosts).collect();
            let x: Vec<f64> = atoms.iter().flat_map(|&i| s.positions[i]).collect();
            let z: Vec<i32> = atoms.iter().map(|&i| i32::from(s.numbers[i])).collect();
            let (n, n_local) = (atoms.len() as i64, local.len() as i64);
            let status = unsafe { mlff_layered_begin(m, n, n_local, x.as_ptr(), z.as_ptr()) };
            assert_eq!(status, Status::Ok, "{}", last_error());
            LayeredRun {
                m,
                atoms,
                n_local: local.len(),
            }
        })
        .collect();
    let w = unsafe { mlff_layered_width(runs[0].m) } as usize;
    assert_eq!(w, 4 * 128);
    let blocks = unsafe { mlff_model_n_blocks(runs[0].m) };
    // Every atom's features as its owner last wrote them: the forward exchange.
    let mut features = vec![0.0; s.len() * w];
    for k in 0..blocks {
        let mut outs = Vec::new();
        for r in &runs {
            let ghosts: Vec<f64> = (r.atoms[r.n_local..].iter())
                .flat_map(|&i| features[i * w..(i + 1) * w].to_vec())
                .collect();
            let mut out = vec![0.0; r.n_local * w];
            let g = if k == 0 {
                std::ptr::null()
            } else {
                ghosts.as_ptr()
            };
            let status = unsafe { mlff_layered_forward(r.m, g, out.as_mut_ptr()) };
            assert_eq!(status, Status::Ok, "{}", last_error());
            outs.push(out);
        }
        for (r, out) in runs.iter().zip(&outs) {
            for (q, &i) in r.atoms[..r.n_local].iter().enumerate() {
                features[i * w..(i + 1) * w].copy_from_slice(&out[q * w..(q + 1) * w]);
            }
        }
    }
    let mut energy = 0.0;
    for r in &runs {
        let (mut e, mut ea) = (0.0, vec![0.0; r.n_local]);
        let status = unsafe { mlff_layered_energy(r.m, &mut e, ea.as_mut_ptr()) };
        assert_eq!(status, Status::Ok, "{}", last_error());
        assert!((ea.iter().sum::<f64>() - e).abs() < 1e-12);
        energy += e;
    }
    // Gradients on ghosts summed onto their owners: the reverse exchange.
    let mut received = vec![0.0; s.len() * w];
    for k in (0..blocks).rev() {
        let mut sent = vec![0.0; s.len() * w];
        for r in &runs {
            let mine: Vec<f64> = (r.atoms[..r.n_local].iter())
                .flat_map(|&i| received[i * w..(i + 1) * w].to_vec())
                .collect();
            let mut ghost_out = vec![0.0; (r.atoms.len() - r.n_local) * w];
            let rec = if k + 1 == blocks {
                std::ptr::null()
            } else {
                mine.as_ptr()
            };
            let status = unsafe { mlff_layered_backward(r.m, rec, ghost_out.as_mut_ptr()) };
            assert_eq!(status, Status::Ok, "{}", last_error());
            for (q, &i) in r.atoms[r.n_local..].iter().enumerate() {
                let row = &mut sent[i * w..(i + 1) * w];
                row.iter_mut()
                    .zip(&ghost_out[q * w..(q + 1) * w])
                    .for_each(|(a, b)| *a += b);
            }
        }
        received = sent;
    }
    let mut forces = vec![[0.0; 3]; s.len()];
    for r in &runs {
        let mut f = vec![0.0; 3 * r.atoms.len()];
        let status = unsafe { mlff_layered_forces(r.m, f.as_mut_ptr()) };
        assert_eq!(status, Status::Ok, "{}", last_error());
        for (row, &i) in f.chunks_exact(3).zip(&r.atoms) {
            (0..3).for_each(|c| forces[i][c] += row[c]);
        }
        unsafe { mlff_model_free(r.m) };
    }
    let e = want.energies[0];
    assert!((energy - e).abs() < 1e-10 * e.abs(), "{energy} vs {e}");
    for (got, want) in forces.iter().zip(&want.forces[0]) {
        for c in 0..3 {
            assert!((got[c] - want[c]).abs() < 1e-9, "{got:?} vs {want:?}");
        }
    }
}

#[test]
fn layered_calls_out_of_order_name_what_comes_first() {
    let (status, m) = load(shipped().to_str().unwrap(), "cpu", 64);
    assert_eq!(status, Status::Ok, "{}", last_error());
    let mut out = vec![0.0; 4 * 128];
    let status = unsafe { mlff_layered_forward(m, std::ptr::null(), out.as_mut_ptr()) };
    assert_eq!(status, Status::Argument);
    assert!(
        last_error().contains("call mlff_layered_begin first"),
        "{}",
        last_error()
    );
    let s = molecule();
    let x: Vec<f64> = s.positions.iter().flatten().copied().collect();
    let z: Vec<i32> = s.numbers.iter().map(|&z| i32::from(z)).collect();
    let status = unsafe { mlff_layered_begin(m, 8, 9, x.as_ptr(), z.as_ptr()) };
    assert_eq!(status, Status::Argument);
    assert!(last_error().contains("n_local 9"), "{}", last_error());
    let status = unsafe { mlff_layered_begin(m, 8, 1, x.as_ptr(), z.as_ptr()) };
    assert_eq!(status, Status::Ok, "{}", last_error());
    let mut e = 0.0;
    let status = unsafe { mlff_layered_energy(m, &mut e, std::ptr::null_mut()) };
    assert_eq!(status, Status::Model);
    assert!(
        last_error().contains("every block forward first"),
        "{}",
        last_error()
    );
    unsafe { mlff_model_free(m) };
}
