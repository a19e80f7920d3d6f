//! Analytic potentials as [`Calculator`]s, with exact forces: test oracles for the integrators
//! (energy conservation, thermostats) independent of any trained model.

use crate::calculator::{Calculator, Prediction};
use crate::error::{Error, Result};
use crate::neighbors::structure_neighbor_list;
use crate::stress::{stress_volume, Matrix3, StressPrediction};
use crate::structure::{Batch, Structure};

/// Harmonic springs E = Σ k (r - r0)² / 2 between listed atom pairs of a molecule.
#[derive(Clone, Debug)]
pub struct HarmonicBonds {
    /// (i, j, rest length in Å).
    pub bonds: Vec<(usize, usize, f64)>,
    /// Spring constant in eV/Å².
    pub k: f64,
}

/// Lennard-Jones pairs, E = Σ 4ε[(σ/r)¹² - (σ/r)⁶] - E(r_c), truncated and shifted at `cutoff`.
#[derive(Clone, Debug)]
pub struct LennardJones {
    /// Well depth in eV.
    pub epsilon: f64,
    /// Zero crossing in Å.
    pub sigma: f64,
    pub cutoff: f64,
}

impl LennardJones {
    /// Pair energy (eV) and its derivative dE/dr (eV/Å), unshifted.
    fn pair(&self, r: f64) -> (f64, f64) {
        let sr6 = (self.sigma / r).powi(6);
        let e = 4.0 * self.epsilon * (sr6 * sr6 - sr6);
        let de = 4.0 * self.epsilon * (-12.0 * sr6 * sr6 + 6.0 * sr6) / r;
        (e, de)
    }

    fn one(&self, s: &Structure) -> Result<(f64, Vec<[f64; 3]>)> {
        self.with_strain_derivative(s).map(|(e, f, _)| (e, f))
    }

    /// Energy, forces and ∂E/∂ε (the strain derivative, eV; stress times volume).
    fn with_strain_derivative(&self, s: &Structure) -> Result<(f64, Vec<[f64; 3]>, Matrix3)> {
        let nl = structure_neighbor_list(s, self.cutoff)?;
        let shift = self.pair(self.cutoff).0;
        let mut energy = 0.0;
        let mut forces = vec![[0.0; 3]; s.len()];
        let mut de_deps = [[0.0; 3]; 3];
        for (v, &i) in nl
            .vectors(&s.positions, s.cell.as_ref())
            .iter()
            .zip(&nl.centers)
        {
            let r = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt();
            let (e, de) = self.pair(r);
            // Every pair appears as two directed edges.
            energy += 0.5 * (e - shift);
            for d in 0..3 {
                forces[i as usize][d] += de * v[d] / r;
                for b in 0..3 {
                    de_deps[d][b] += 0.5 * de * v[d] * v[b] / r;
                }
            }
        }
        Ok((energy, forces, de_deps))
    }
}

impl HarmonicBonds {
    fn one(&self, s: &Structure) -> Result<(f64, Vec<[f64; 3]>)> {
        if s.is_periodic() {
            return Err(Error::Structure(
                "HarmonicBonds is for molecules, not periodic cells".into(),
            ));
        }
        let mut energy = 0.0;
        let mut forces = vec![[0.0; 3]; s.len()];
        for &(i, j, r0) in &self.bonds {
            if i.max(j) >= s.len() {
                return Err(Error::Structure(format!(
                    "bond {i}-{j} names an atom beyond the {} atoms",
                    s.len()
                )));
            }
            let (xi, xj) = (s.positions[i], s.positions[j]);
            let v = [xj[0] - xi[0], xj[1] - xi[1], xj[2] - xi[2]];
            let r = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt();
            energy += 0.5 * self.k * (r - r0) * (r - r0);
            let de = self.k * (r - r0);
            for d in 0..3 {
                forces[i][d] += de * v[d] / r;
                forces[j][d] -= de * v[d] / r;
            }
        }
        Ok((energy, forces))
    }
}

/// Applies a per-structure evaluation to every structure of a batch.
fn per_structure(
    batch: &Batch,
    one: impl Fn(&Structure) -> Result<(f64, Vec<[f64; 3]>)>,
) -> Result<Prediction> {
    let (energies, forces) = batch
        .structures
        .iter()
        .map(one)
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    Ok(Prediction { energies, forces })
}

impl Calculator for HarmonicBonds {
    fn compute(&self, batch: &Batch) -> Result<Prediction> {
        per_structure(batch, |s| self.one(s))
    }

    fn cutoff(&self) -> f64 {
        0.0
    }
}

impl Calculator for LennardJones {
    fn compute(&self, batch: &Batch) -> Result<Prediction> {
        per_structure(batch, |s| self.one(s))
    }

    fn cutoff(&self) -> f64 {
        self.cutoff
    }

    /// The analytic stress: σ = (1/V) Σ_pairs E'(r) r ⊗ r / r.
    fn compute_with_stress(&self, batch: &Batch) -> Result<StressPrediction> {
        let mut prediction = Prediction {
            energies: Vec::new(),
            forces: Vec::new(),
        };
        let mut stresses = Vec::new();
        for s in &batch.structures {
            let (e, f, d) = self.with_strain_derivative(s)?;
            prediction.energies.push(e);
            prediction.forces.push(f);
            stresses.push(stress_volume(s).map(|v| d.map(|row| row.map(|x| x / v))));
        }
        Ok(StressPrediction {
            prediction,
            stresses,
        })
    }
}
