//! Masses, Maxwell-Boltzmann velocities (or those of a `momenta` column), kinetic energy and
//! temperature (ASE units: velocities in Å per ASE time unit, so E_kin = Σ m v² / 2 in eV).

use crate::elements::atomic_mass;
use crate::error::{Error, Result};
use crate::structure::Structure;
use crate::units::KB;
use rand::Rng;
use rand_distr::StandardNormal;

/// Atomic masses (amu) of `numbers`, ASE's standard values.
pub fn masses(numbers: &[u8]) -> Result<Vec<f64>> {
    numbers
        .iter()
        .enumerate()
        .map(|(i, &z)| {
            atomic_mass(z).ok_or_else(|| Error::Md(format!("atom {i}: no mass for element Z={z}")))
        })
        .collect()
}

/// Degrees of freedom for the kinetic temperature: 3N, less 3 when the centre of mass is held
/// at rest (NVE started with its momentum removed; a single atom keeps its 3).
pub fn degrees_of_freedom(n_atoms: usize, com_fixed: bool) -> usize {
    if com_fixed && n_atoms > 1 {
        3 * n_atoms - 3
    } else {
        3 * n_atoms
    }
}

/// Σ m v² / 2 in eV.
pub fn kinetic_energy(velocities: &[[f64; 3]], masses: &[f64]) -> f64 {
    velocities
        .iter()
        .zip(masses)
        .map(|(v, m)| 0.5 * m * (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]))
        .sum()
}

/// Kinetic temperature in K of `e_kin` eV spread over `dof` degrees of freedom.
pub fn temperature(e_kin: f64, dof: usize) -> f64 {
    if dof == 0 {
        return 0.0;
    }
    2.0 * e_kin / (dof as f64 * KB)
}

/// Subtracts the centre-of-mass velocity.
pub fn remove_com_velocity(velocities: &mut [[f64; 3]], masses: &[f64]) {
    let total: f64 = masses.iter().sum();
    if total <= 0.0 {
        return;
    }
    let mut p = [0.0; 3];
    for (v, m) in velocities.iter().zip(masses) {
        for d in 0..3 {
            p[d] += m * v[d];
        }
    }
    for v in velocities.iter_mut() {
        for d in 0..3 {
            v[d] -= p[d] / total;
        }
    }
}

/// Maxwell-Boltzmann velocities at `temperature` K with the centre-of-mass motion removed,
/// rescaled so that the kinetic temperature over 3N - 3 degrees of freedom is exactly the
/// target (as ASE's `MaxwellBoltzmannDistribution(force_temp=True)` after `Stationary`).
pub fn maxwell_boltzmann(masses: &[f64], temperature: f64, rng: &mut impl Rng) -> Vec<[f64; 3]> {
    let mut v: Vec<[f64; 3]> = masses
        .iter()
        .map(|m| {
            let sigma = (KB * temperature / m).sqrt();
            std::array::from_fn(|_| sigma * rng.sample::<f64, _>(StandardNormal))
        })
        .collect();
    remove_com_velocity(&mut v, masses);
    let dof = degrees_of_freedom(masses.len(), true);
    let t = self::temperature(kinetic_energy(&v, masses), dof);
    if t > 0.0 && temperature > 0.0 {
        let scale = (temperature / t).sqrt();
        v.iter_mut().flatten().for_each(|x| *x *= scale);
    }
    v
}

/// Velocities from the structure's `momenta` column (amu·Å per ASE time unit, as ASE writes).
pub(super) fn momenta_velocities(s: &Structure, masses: &[f64]) -> Result<Vec<[f64; 3]>> {
    let col = s
        .arrays
        .iter()
        .find(|a| a.name == "momenta" && a.ncols == 3)
        .ok_or_else(|| {
            Error::Md("--keep-momenta: the structure has no `momenta:R:3` column".into())
        })?;
    (0..s.len())
        .map(|i| {
            let mut v = [0.0; 3];
            for (vd, t) in v.iter_mut().zip(&col.values[3 * i..3 * i + 3]) {
                let p: f64 = t.parse().map_err(|_| {
                    Error::Md(format!(
                        "atom {i}: momentum component `{t}` is not a number"
                    ))
                })?;
                if !p.is_finite() {
                    return Err(Error::Md(format!("atom {i}: momentum {p} is not finite")));
                }
                *vd = p / masses[i];
            }
            Ok(v)
        })
        .collect()
}
