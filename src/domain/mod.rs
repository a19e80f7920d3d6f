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

mod device_list;
mod layered;
mod layered_session;
mod session;
mod shells;

pub use layered::LayeredDomain;
pub use layered_session::LayeredSession;
pub use session::{shells_for, skin_for, DomainSession};

use crate::error::{Error, Result};
use crate::model::PainnConfig;
use crate::structure::{Lattice, Matrix3};
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
    /// between ranks), and the fused backend is needed. One call of a [`DomainSession`]
    /// without a skin.
    pub fn compute_domain(
        &self,
        numbers: &[u8],
        positions: &[[f64; 3]],
        n_local: usize,
        cell: Option<(&Lattice, [bool; 3])>,
    ) -> Result<DomainPrediction> {
        DomainSession::new(self, 0.0).compute(self, numbers, positions, n_local, cell)
    }
}

/// The rows of an [N, 3] tensor, in f64.
pub(crate) fn rows(t: &Tensor) -> Result<Vec<[f64; 3]>> {
    // One flat read: a Vec per row costs more than the copy at 100,000 atoms.
    let flat = t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    Ok(flat.chunks_exact(3).map(|r| [r[0], r[1], r[2]]).collect())
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
    pub(crate) fn check_finite(&self) -> Result<()> {
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
