//! A cell that moves (NPT): [`PainnForces`] keeps its Verlet list while the cell deforms,
//! carrying the list's reference positions and image offsets along with the deformation
//! since the build, and computes energy, forces and stress in one strained autograd pass.

use super::PainnForces;
use crate::error::{Error, Result};
use crate::md::forces::provider::Evaluation;
use crate::md::positions::{displacement2, largest_displacement2, non_finite_atom};
use crate::neighbors::strained_half_skin;
use crate::neighbors::DeviceListBuilder;
use crate::stress::{strain_derivative, stresses_of, Matrix3};
use crate::structure::{inverse, Lattice};
use candle_core::{DType, Tensor, Var};

impl PainnForces<'_> {
    /// [`ForceProvider::set_cells`](crate::md::ForceProvider::set_cells): one periodic system
    /// takes its new cell. From the first move on, calls run eager (graphs and pruned lists
    /// keep the offsets of their capture).
    pub(super) fn follow_cell(&mut self, cells: &[Lattice]) -> Result<()> {
        let ([cell], [system]) = (cells, self.systems.as_slice()) else {
            return Err(Error::Md(format!(
                "a moving cell needs one system with one cell, got {} systems and {} cells",
                self.systems.len(),
                cells.len()
            )));
        };
        if system.cell.is_none() || !system.pbc.iter().all(|&p| p) {
            return Err(Error::Md(
                "a moving cell needs a system periodic along all three axes".into(),
            ));
        }
        if system.cell.as_ref() == Some(cell) {
            return Ok(());
        }
        if self.list_cell.is_none() {
            self.list_cell = system.cell;
            (self.graph_max_edges, self.graph, self.steps) = (0, None, None);
            self.one_launch = false;
            self.prune_from = usize::MAX;
        }
        self.systems[0].cell = Some(*cell);
        Ok(())
    }

    /// A device list is built for one cell: before a build in a cell that has moved, a new
    /// builder for it (or, where the device list cannot serve it, the host list).
    fn renew_builder(&mut self) -> Result<()> {
        if self.device_list.is_none() || self.list_cell == self.systems[0].cell {
            return Ok(());
        }
        let s = &self.systems[0];
        let dev = self.calculator.device();
        let cutoff = self.cutoff + self.skin;
        self.device_list = DeviceListBuilder::new(cutoff, s.cell.as_ref(), s.pbc, dev).ok();
        Ok(())
    }

    /// The deformation since the build (positions now = then · m; none while the cell has
    /// not moved), and the largest squared displacement from the (deformed) reference that
    /// keeps the list valid.
    fn deformation(&self) -> Result<(Option<Lattice>, f64)> {
        let (Some(then), Some(now)) = (self.list_cell, self.systems[0].cell) else {
            return Ok((None, self.list_limit2()));
        };
        let inv =
            inverse(&then).ok_or_else(|| Error::Md(format!("the cell {then:?} has no volume")))?;
        let m: Lattice = std::array::from_fn(|i| {
            std::array::from_fn(|j| (0..3).map(|k| inv[i][k] * now[k][j]).sum())
        });
        let half = strained_half_skin(self.cutoff, self.skin, &m);
        Ok((Some(m), if half > 0.0 { half * half } else { -1.0 }))
    }

    /// Energy, forces and stress at `positions` in the current cell: one forward and one
    /// backward pass under a strain, the list rebuilt first where the atoms or the cell have
    /// moved beyond what it allows.
    pub(super) fn call_with_stress(
        &mut self,
        positions: &mut Tensor,
    ) -> Result<(Evaluation, Vec<Option<Matrix3>>)> {
        let dev = self.calculator.device().clone();
        let (m, limit2) = self.deformation()?;
        let m_t = m.map(|m| Tensor::new(&m, &dev)).transpose()?;
        let rebuild = match &self.reference {
            None => true,
            Some(r) => {
                let moved = match &m_t {
                    Some(m) => r.matmul(m)?,
                    None => r.clone(),
                };
                let d2 = largest_displacement2(&displacement2(positions, &moved)?.to_vec1()?);
                if d2.is_nan() {
                    return Err(non_finite_atom(positions));
                }
                d2 > limit2
            }
        };
        let m_t = if rebuild {
            self.renew_builder()?;
            self.rebuild_at(positions)?;
            None
        } else {
            m_t
        };
        let Some(edges) = &self.edges else {
            return Err(Error::Md("neighbour list missing after a build".into()));
        };
        let calc = self.calculator;
        let offsets = match &m_t {
            Some(m) => edges
                .offsets
                .to_dtype(DType::F64)?
                .matmul(m)?
                .to_dtype(calc.dtype())?,
            None => edges.offsets.clone(),
        };
        let var = Var::from_tensor(&positions.to_dtype(calc.dtype())?)?;
        let inputs = crate::model::PainnInputs {
            species: self.species.clone(),
            positions: var.as_tensor().clone(),
            centers: edges.centers.clone(),
            neighbors: edges.neighbors.clone(),
            offsets,
            atom_structure: self.atom_structure.clone(),
            n_structures: self.systems.len(),
        };
        let edge_structure = self.atom_structure.index_select(&edges.centers, 0)?;
        let (energies, forces, de_deps) = strain_derivative(calc, &inputs, &var, &edge_structure)?;
        let stresses = stresses_of(&self.systems, &de_deps)?;
        let energy = match self.systems.len() {
            1 => energies.sum_all()?,
            _ => energies,
        };
        Ok((
            Evaluation {
                energy,
                forces: forces.to_dtype(DType::F64)?,
            },
            stresses,
        ))
    }
}
