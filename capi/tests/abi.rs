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
