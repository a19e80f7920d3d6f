//! Energies and forces of one spatial domain of a larger system, as a domain-decomposed MD
//! engine (LAMMPS) hands it over: `n_local` owned atoms first, then ghost atoms (copies of
//! atoms owned by other domains, periodic images included).
//!
//! The domain's energy is the sum of its local atoms' energies only; forces are −∂E/∂x on every
//! atom, ghosts included, for the engine to add back to their owners (LAMMPS's reverse
//! communication with `newton_pair on`). Summed over domains this is exactly the whole system's
//! energy and forces when ghosts reach [`receptive_field`] from every local atom: after B
//! message-passing blocks an atom's energy depends on atoms within B × cutoff only, and a ghost
//! at that edge enters through its embedding alone, which needs no neighbours.

use crate::calculator::forces_from;
use crate::error::{Error, Result};
use crate::model::{Backend, PainnConfig};
use crate::neighbors::batch_neighbor_list;
use crate::structure::{Batch, Lattice, Matrix3, Structure};
use crate::PainnCalculator;
use candle_core::{DType, Tensor};

/// How far from a local atom its energy can feel another atom: blocks × cutoff, in Å.
pub fn receptive_field(cfg: &PainnConfig) -> f64 {
    cfg.n_blocks as f64 * cfg.cutoff
}

/// What one domain contributes.
#[derive(Clone, Debug, PartialEq)]
pub struct DomainPrediction {
    /// Σ of the local atoms' energies, eV (summed in f64).
    pub energy: f64,
    /// Energy of every local atom, eV.
    pub atom_energies: Vec<f64>,
    /// −∂energy/∂x of every atom, local and ghost, eV/Å.
    pub forces: Vec<[f64; 3]>,
    /// W = Σ over the domain's edges of r ⊗ F (eV; without images Σ over every atom of x ⊗ f),
    /// rows as r: the domain's share of the system's virial −∂E/∂ε = −V σ, whose symmetric
    /// part the shares add up to. LAMMPS's `virial[]` is its xx, yy, zz, xy, xz, yz.
    pub virial: Matrix3,
}

impl PainnCalculator {
    /// Blocks × cutoff of this model ([`receptive_field`]).
    pub fn receptive_field(&self) -> f64 {
        receptive_field(self.model().config())
    }

    /// The energy of the first `n_local` of `numbers`/`positions` and the forces on all of
    /// them (see the module's doc). The neighbour list is built here. Without `cell` the ghosts
    /// stand for every periodic image; with it, the axes it marks periodic take their images
    /// from the cell instead (no ghost copies along them: an axis the engine did not divide
    /// between ranks), and the fused backend is needed.
    pub fn compute_domain(
        &self,
        numbers: &[u8],
        positions: &[[f64; 3]],
        n_local: usize,
        cell: Option<(&Lattice, [bool; 3])>,
    ) -> Result<DomainPrediction> {
        let n = numbers.len();
        if positions.len() != n {
            return Err(Error::Structure(format!(
                "{n} atomic numbers but {} positions",
                positions.len()
            )));
        }
        if n_local > n {
            return Err(Error::Structure(format!(
                "{n_local} local atoms but only {n} atoms in all"
            )));
        }
        if let Some(i) = positions
            .iter()
            .position(|x| x.iter().any(|c| !c.is_finite()))
        {
            return Err(Error::NonFinite(format!(
                "atom {i} is at {:?}",
                positions[i]
            )));
        }
        let periodic = cell.is_some_and(|(_, pbc)| pbc.contains(&true));
        let fused = self.model().backend() == Backend::Fused;
        if periodic && !fused {
            return Err(Error::Config(format!(
                "a domain with periodic axes needs the fused backend, not {}",
                self.model().backend().name()
            )));
        }
        let s = Structure {
            cell: cell.map(|(c, _)| *c),
            pbc: cell.map_or([false; 3], |(_, p)| p),
            ..Structure::molecule(numbers.to_vec(), positions.to_vec())
        };
        let batch = Batch::new(vec![s])?;
        let nl = batch_neighbor_list(&batch, self.model().config().cutoff)?;
        let (inputs, x) = self.prepare_with(&batch, &nl)?;
        let mask: Vec<f64> = (0..n).map(|i| f64::from(u8::from(i < n_local))).collect();
        let mask = Tensor::from_vec(mask, n, self.device())?.to_dtype(self.dtype())?;
        let (atom_energies, forces, virial) = match fused {
            true => {
                // W = Σ over edges of r ⊗ F, gathered in the force kernel: valid with images.
                let pass = self.fused()?.forward(&inputs)?;
                let (forces, virials) = pass.weighted_forces_and_virials(&mask)?;
                let w = virials.sum(0)?.to_dtype(DType::F64)?.to_vec2::<f64>()?;
                let w: Matrix3 = std::array::from_fn(|a| std::array::from_fn(|b| w[a][b]));
                (pass.atom_energies.clone(), rows(&forces)?, w)
            }
            false => {
                let atom_energies = self.model().atom_energies(&inputs)?;
                let total = (&atom_energies * &mask)?.sum_all()?;
                let forces = rows(&forces_from(&total, &x)?)?;
                // Without images, Σ x ⊗ f is the same sum over edges.
                let mut w = [[0.0; 3]; 3];
                for (x, f) in positions.iter().zip(&forces) {
                    for (row, xa) in w.iter_mut().zip(x) {
                        for (wab, fb) in row.iter_mut().zip(f) {
                            *wab += xa * fb;
                        }
                    }
                }
                (atom_energies, forces, w)
            }
        };
        let atom_energies = atom_energies
            .narrow(0, 0, n_local)?
            .to_dtype(DType::F64)?
            .to_vec1::<f64>()?;
        let out = DomainPrediction {
            energy: atom_energies.iter().sum(),
            atom_energies,
            forces,
            virial,
        };
        out.check_finite()?;
        Ok(out)
    }
}

/// The rows of an [N, 3] tensor, in f64.
fn rows(t: &Tensor) -> Result<Vec<[f64; 3]>> {
    let rows = t.to_dtype(DType::F64)?.to_vec2::<f64>()?;
    Ok(rows.into_iter().map(|r| [r[0], r[1], r[2]]).collect())
}

impl DomainPrediction {
    /// No atoms: nothing to add.
    pub fn empty() -> Self {
        Self {
            energy: 0.0,
            atom_energies: vec![],
            forces: vec![],
            virial: [[0.0; 3]; 3],
        }
    }

    /// A NaN weight or overlapping atoms, as [`Error::NonFiniteResult`] naming the atom.
    fn check_finite(&self) -> Result<()> {
        let bad = |what: String| Error::NonFiniteResult { structure: 0, what };
        if let Some(i) = self.atom_energies.iter().position(|e| !e.is_finite()) {
            return Err(bad(format!(
                "the energy of atom {i} is {}",
                self.atom_energies[i]
            )));
        }
        if let Some(i) = self
            .forces
            .iter()
            .position(|f| f.iter().any(|c| !c.is_finite()))
        {
            return Err(bad(format!(
                "the force on atom {i} is {:?}",
                self.forces[i]
            )));
        }
        Ok(())
    }
}
