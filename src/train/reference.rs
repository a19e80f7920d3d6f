//! Statistics fitted to the training data before training: per-element reference energies
//! (least squares on the composition) and the readout's scale and shift.

use crate::structure::Structure;

/// Reference energy per element (same order as `elements`), minimising
/// Σ_frames (E - Σ_Z n_Z e_Z)². When the compositions do not determine every e_Z (e.g. all
/// frames are one molecule) a tiny ridge term picks the minimum-norm solution.
pub fn fit_reference_energies(frames: &[Structure], elements: &[u8]) -> Vec<f64> {
    let m = elements.len();
    let mut ata = vec![vec![0.0f64; m]; m];
    let mut atb = vec![0.0f64; m];
    for s in frames {
        let counts = composition(s, elements);
        let e = s.energy.unwrap_or(0.0);
        for a in 0..m {
            atb[a] += counts[a] * e;
            for b in 0..m {
                ata[a][b] += counts[a] * counts[b];
            }
        }
    }
    let trace: f64 = (0..m).map(|a| ata[a][a]).sum();
    let ridge = 1e-12 * trace.max(1.0);
    for (a, row) in ata.iter_mut().enumerate() {
        row[a] += ridge;
    }
    solve_spd(ata, atb)
}

/// Number of atoms of each element of `elements` in `s`.
pub fn composition(s: &Structure, elements: &[u8]) -> Vec<f64> {
    let mut c = vec![0.0; elements.len()];
    for z in &s.numbers {
        if let Some(k) = elements.iter().position(|e| e == z) {
            c[k] += 1.0;
        }
    }
    c
}

/// Readout scale (eV) and shift (eV per atom): the RMS force component of the data, so the
/// network works with order-one numbers, and the mean per-atom residual after reference
/// energies.
pub fn fit_scale_shift(frames: &[Structure], elements: &[u8], atom_ref: &[f64]) -> (f64, f64) {
    let (mut sq, mut n_f) = (0.0, 0usize);
    let (mut resid, mut n_atoms) = (0.0, 0usize);
    for s in frames {
        for f in s.forces.iter().flatten() {
            sq += f.iter().map(|x| x * x).sum::<f64>();
            n_f += 3;
        }
        let counts = composition(s, elements);
        let e_ref: f64 = counts.iter().zip(atom_ref).map(|(c, e)| c * e).sum();
        resid += s.energy.unwrap_or(0.0) - e_ref;
        n_atoms += s.len();
    }
    let scale = if n_f > 0 && sq > 0.0 {
        (sq / n_f as f64).sqrt()
    } else {
        1.0
    };
    let shift = if n_atoms > 0 {
        resid / n_atoms as f64
    } else {
        0.0
    };
    (scale, shift)
}

/// Solves A x = b for a small symmetric positive definite A (Cholesky).
fn solve_spd(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Vec<f64> {
    let n = b.len();
    for j in 0..n {
        let d = a[j][j] - (0..j).map(|k| a[j][k] * a[j][k]).sum::<f64>();
        a[j][j] = d.max(f64::MIN_POSITIVE).sqrt();
        for i in j + 1..n {
            let s = a[i][j] - (0..j).map(|k| a[i][k] * a[j][k]).sum::<f64>();
            a[i][j] = s / a[j][j];
        }
    }
    for i in 0..n {
        b[i] = (b[i] - (0..i).map(|k| a[i][k] * b[k]).sum::<f64>()) / a[i][i];
    }
    for i in (0..n).rev() {
        b[i] = (b[i] - (i + 1..n).map(|k| a[k][i] * b[k]).sum::<f64>()) / a[i][i];
    }
    b
}
