//! Cells that move (NPT): [`PainnForces`] keeps its Verlet list while each system's cell
//! deforms, carrying the list's reference positions and image offsets along with their
//! system's deformation since the build, and computes energy, forces and stress in one
//! strained autograd pass. A batch's systems each follow a cell of their own.

use super::{ListSite, PainnForces};
use crate::error::{Error, Result};
use crate::md::forces::provider::Evaluation;
use crate::md::positions::{displacement2, largest_displacement2, non_finite_atom};
use crate::neighbors::strained_half_skin;
use crate::stress::{strain_derivative, stresses_of, Matrix3};
use crate::structure::{inverse, Lattice};
use candle_core::{DType, Tensor, Var};

/// Why a batch whose cells move cannot keep the device list.
pub(crate) const DEVICE_LIST_BATCH_NPT: &str =
    "the device neighbour list serves one cell, and each \
     system of a batch at constant pressure moves its own: build the batch's lists on the host \
     (--neighbor-list host or auto)";

impl PainnForces<'_> {
    /// [`ForceProvider::set_cells`](crate::md::ForceProvider::set_cells): every system, each
    /// periodic along all three axes, takes its new cell. From the first move on, calls run
    /// eager (graphs and pruned lists keep the offsets of their capture), and a batch's list is
    /// built on the host (a device builder serves one cell).
    pub(super) fn follow_cells(&mut self, cells: &[Lattice]) -> Result<()> {
        if cells.len() != self.systems.len() {
            return Err(Error::Md(format!(
                "moving cells need one cell per system: {} cells for {} systems",
                cells.len(),
                self.systems.len()
            )));
        }
        let open = |s: &crate::structure::Structure| s.cell.is_none() || !s.pbc.iter().all(|&p| p);
        if let Some(k) = self.systems.iter().position(open) {
            return Err(Error::Md(format!(
                "system {k}: a moving cell needs a system periodic along all three axes"
            )));
        }
        if (self.systems.iter().zip(cells)).all(|(s, c)| s.cell.as_ref() == Some(c)) {
            return Ok(());
        }
        let batch = self.systems.len() > 1;
        if self.list_cells.is_none() {
            if batch && self.list_site == ListSite::Device {
                return Err(Error::NeighborList(DEVICE_LIST_BATCH_NPT.into()));
            }
            self.list_cells = Some(self.cells());
            (self.graph_max_edges, self.graph, self.steps) = (0, None, None);
            self.one_launch = false;
            self.prune_from = usize::MAX;
            if batch {
                self.device_list = None;
            }
        }
        for (system, cell) in self.systems.iter_mut().zip(cells) {
            system.cell = Some(*cell);
        }
        Ok(())
    }

    /// Every system's cell (each has one once cells move: [`follow_cells`](Self::follow_cells)
    /// checks it).
    pub(super) fn cells(&self) -> Vec<Lattice> {
        self.systems.iter().filter_map(|s| s.cell).collect()
    }

    /// A device list is built for one cell: before a build in a cell that has moved, a new
    /// builder for it (or, where the device list cannot serve it, the host list). Batches
    /// whose cells move build on the host.
    fn renew_builder(&mut self) -> Result<()> {
        let moved = self.list_cells.as_deref() != Some(&self.cells()[..]);
        if self.device_list.is_none() || self.systems.len() != 1 || !moved {
            return Ok(());
        }
        let s = &self.systems[0];
        let cutoff = self.cutoff + self.skin;
        let builder = self.device_builder(cutoff, s.cell.as_ref(), s.pbc);
        self.device_list = match (builder, self.list_site) {
            (Err(e), ListSite::Device) => return Err(e),
            (builder, _) => builder.ok(),
        };
        Ok(())
    }

    /// Each system's deformation since the build (its positions now = then · m; none while
    /// no cell has moved), and the largest squared displacement from the (deformed)
    /// reference that keeps the list valid: the smallest over the systems.
    fn deformation(&self) -> Result<(Option<Vec<Lattice>>, f64)> {
        let Some(then) = &self.list_cells else {
            return Ok((None, self.list_limit2()));
        };
        let (mut ms, mut limit2) = (Vec::with_capacity(then.len()), f64::INFINITY);
        for (then, now) in then.iter().zip(self.cells()) {
            let inv = inverse(then)
                .ok_or_else(|| Error::Md(format!("the cell {then:?} has no volume")))?;
            let m: Lattice = std::array::from_fn(|i| {
                std::array::from_fn(|j| (0..3).map(|k| inv[i][k] * now[k][j]).sum())
            });
            let half = strained_half_skin(self.cutoff, self.skin, &m);
            limit2 = limit2.min(if half > 0.0 { half * half } else { -1.0 });
            ms.push(m);
        }
        Ok((Some(ms), limit2))
    }

    /// The deformations `ms` as a device tensor: [3, 3] for one system, [S, 3, 3] for a batch.
    fn deformation_tensor(&self, ms: &[Lattice]) -> Result<Tensor> {
        let dev = self.calculator.device();
        Ok(match ms {
            [m] => Tensor::new(m, dev)?,
            _ => {
                let flat: Vec<f64> = ms.iter().flatten().flatten().copied().collect();
                Tensor::from_vec(flat, (ms.len(), 3, 3), dev)?
            }
        })
    }

    /// Energy, forces and stress at `positions` in the current cell: one forward and one
    /// backward pass under a strain, the list rebuilt first where the atoms or the cell have
    /// moved beyond what it allows.
    pub(super) fn call_with_stress(
        &mut self,
        positions: &mut Tensor,
    ) -> Result<(Evaluation, Vec<Option<Matrix3>>)> {
        let (m, limit2) = self.deformation()?;
        let m_t = m.map(|m| self.deformation_tensor(&m)).transpose()?;
        let rebuild = match &self.reference {
            None => true,
            Some(r) => {
                let moved = match &m_t {
                    Some(m) => deformed(r, m, &self.atom_structure)?,
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
        let edge_structure = self.atom_structure.index_select(&edges.centers, 0)?;
        let offsets = match &m_t {
            Some(m) => deformed(&edges.offsets.to_dtype(DType::F64)?, m, &edge_structure)?
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

/// `rows` [R, 3] (f64) times their system's deformation `m`: [3, 3] for one system, else
/// [S, 3, 3] picked per row by `structure` [R].
fn deformed(rows: &Tensor, m: &Tensor, structure: &Tensor) -> Result<Tensor> {
    Ok(match m.rank() {
        2 => rows.matmul(m)?,
        _ => {
            let per_row = m.index_select(structure, 0)?;
            rows.unsqueeze(1)?.matmul(&per_row)?.squeeze(1)?
        }
    })
}
