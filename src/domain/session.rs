//! A domain over many calls (an MD engine's steps): a Verlet list with a skin, and the model
//! inputs built from it kept on the device until the list is rebuilt, so that a call between
//! builds uploads the positions alone. On CUDA the list is built on the device where it can
//! serve the cell (periodic axes wider than twice the list cutoff), else on the host. Pairs in
//! the skin go through the model as exact zeros.

use super::device_list::{DeviceList, Edges};
use super::shells::ShellOrder;
use super::{rows, DomainPrediction};
use crate::calculator::forces_from;
use crate::error::{Error, Result};
use crate::model::{Backend, PainnInputs};
use crate::neighbors::{flat_image_offsets, flat_image_offsets_into, VerletList};
use crate::structure::{Lattice, Matrix3};
use crate::tuning::Tuning;
use crate::PainnCalculator;
use candle_core::{DType, Device, Tensor, Var};

/// The skin a domain session uses on `device` ([`Tuning::domain_skin`], else 0 on the CPU,
/// where the model is the time and the skin's pairs would cost more than rebuilding, and 1 Å
/// on CUDA, where a list built at every call was the time (bench-log 54; the skin's pairs are
/// pruned before the model there).
pub fn skin_for(tuning: &Tuning, device: &Device) -> f64 {
    tuning
        .domain_skin
        .unwrap_or(if device.is_cuda() { 1.0 } else { 0.0 })
}

/// Whether a domain session on `device` shrinks its ghost shells block by block
/// ([`Tuning::domain_shells`], else on the CPU only: bench-log 76).
pub fn shells_for(tuning: &Tuning, device: &Device) -> bool {
    tuning.domain_shells.unwrap_or(!device.is_cuda())
}

/// The Verlet list and the device inputs of a domain between calls.
pub struct DomainSession {
    /// The host list: on the CPU, and on CUDA for cells the device list cannot serve.
    list: VerletList,
    /// The device list, on CUDA.
    device: Option<DeviceList>,
    /// Builds of either list so far.
    builds: usize,
    /// The atoms' order for shell calls, made at the last build (`Tuning::domain_shells`).
    order: Option<ShellOrder>,
    resident: Option<Resident>,
    staging: Staging,
}

/// Host memory the image offsets are built in before their upload, kept between builds so
/// that a rebuild writes to pages it already holds (fresh pages cost more than the writing).
#[derive(Default)]
struct Staging {
    f32: Vec<f32>,
    f64: Vec<f64>,
}

/// What the inputs were built for, and the device tensors built from the list.
struct Resident {
    numbers: Vec<u8>,
    n_local: usize,
    builds: usize,
    species: Tensor,
    centers: Tensor,
    neighbors: Tensor,
    offsets: Tensor,
    atom_structure: Tensor,
    /// 1 on local atoms, 0 on ghosts: the weights of the atom energies.
    mask: Tensor,
}

impl DomainSession {
    /// A session for `calc`'s cutoff with `skin` Å (0: the exact list at every call that
    /// moved an atom).
    pub fn new(calc: &PainnCalculator, skin: f64) -> Self {
        let cutoff = calc.model().config().cutoff;
        let bins_from = calc.tuning().device_list_bins_from_atoms;
        Self {
            list: VerletList::new(cutoff, skin),
            device: (calc.device().is_cuda()).then(|| DeviceList::new(cutoff, skin, bins_from)),
            builds: 0,
            order: None,
            resident: None,
            staging: Staging::default(),
        }
    }

    /// Number of neighbour-list builds so far.
    pub fn builds(&self) -> usize {
        self.builds
    }

    /// The atoms each block updated in the last call where the ghost shells shrank block by
    /// block (`Tuning::domain_shells`): the own atoms and the ghosts within blocks − 1 − k
    /// list cutoffs of them, for block k. None where every block ran over every atom.
    pub fn shell_rows(&self) -> Option<&[usize]> {
        self.order.as_ref().map(|o| o.rows.as_slice())
    }

    /// The atoms' numbers and positions ordered by depth for a shell call; the order is made
    /// again, and the lists dropped, whenever the list in use would be rebuilt.
    fn by_depth(
        &mut self,
        numbers: &[u8],
        positions: &[[f64; 3]],
        n_local: usize,
        (lattice, pbc): (Option<&Lattice>, [bool; 3]),
        on_device: bool,
        blocks: usize,
    ) -> Result<(Vec<u8>, Vec<[f64; 3]>)> {
        let kept = (self.order.as_ref())
            .filter(|o| o.fits(numbers.len(), n_local))
            .map(|o| o.apply(positions));
        let stale = match (&kept, &self.device) {
            (None, _) => true,
            (Some(p), Some(d)) if on_device => d.would_rebuild(p),
            (Some(p), _) => self.list.would_rebuild(p, lattice, pbc),
        };
        if let (false, Some(p), Some(o)) = (stale, kept, &self.order) {
            return Ok((o.apply(numbers), p));
        }
        let reach = self.list.list_cutoff();
        let o = ShellOrder::new(positions, n_local, lattice, pbc, reach, blocks)?;
        self.list.invalidate();
        if let Some(d) = &mut self.device {
            d.invalidate();
        }
        let placed = (o.apply(numbers), o.apply(positions));
        self.order = Some(o);
        Ok(placed)
    }

    /// [`PainnCalculator::compute_domain`], reusing the list and the device inputs while no
    /// atom has moved more than half the skin and the atoms, their count and the cell are
    /// those of the last build.
    pub fn compute(
        &mut self,
        calc: &PainnCalculator,
        numbers: &[u8],
        positions: &[[f64; 3]],
        n_local: usize,
        cell: Option<(&Lattice, [bool; 3])>,
    ) -> Result<DomainPrediction> {
        check_atoms(numbers, positions, n_local)?;
        let periodic = cell.is_some_and(|(_, pbc)| pbc.contains(&true));
        let fused = calc.model().backend() == Backend::Fused;
        if periodic && !fused {
            return Err(Error::Config(format!(
                "a domain with periodic axes needs the fused backend, not {}",
                calc.model().backend().name()
            )));
        }
        let (lattice, pbc) = match cell {
            Some((c, p)) => (Some(c), p),
            None => (None, [false; 3]),
        };
        let dev = calc.device();
        let on_device = match &mut self.device {
            Some(d) if !positions.is_empty() => d.serves(lattice, pbc, dev),
            _ => false,
        };
        // Shells: the ghosts by depth, the order made again whenever the list is built.
        let blocks = calc.model().config().n_blocks;
        let shells =
            fused && shells_for(calc.tuning(), dev) && n_local < numbers.len() && blocks > 1;
        let placed = match shells {
            true => Some(self.by_depth(
                numbers,
                positions,
                n_local,
                (lattice, pbc),
                on_device,
                blocks,
            )?),
            false => {
                self.order = None;
                None
            }
        };
        // The atoms as the list and the model see them.
        let (numbers, positions) = match &placed {
            Some((z, p)) => (z.as_slice(), p.as_slice()),
            None => (numbers, positions),
        };
        let rebuilt = match (on_device, &mut self.device) {
            (true, Some(d)) => {
                let rebuilt = d.update(positions, dev, calc.dtype())?;
                if rebuilt {
                    self.list.invalidate();
                }
                rebuilt
            }
            _ => {
                let rebuilt = self.list.update(positions, lattice, pbc)?;
                if let (true, Some(d)) = (rebuilt, &mut self.device) {
                    d.invalidate();
                }
                rebuilt
            }
        };
        self.builds += usize::from(rebuilt);
        let builds = self.builds;
        let fresh = self
            .resident
            .as_ref()
            .is_some_and(|r| r.builds == builds && r.n_local == n_local && r.numbers == numbers);
        if !fresh {
            let edges = match (on_device, &self.device) {
                (true, Some(d)) => EdgeSource::Device(d.edges()?),
                _ => EdgeSource::Host(&self.list, lattice, &mut self.staging),
            };
            self.resident = Some(build(edges, calc, numbers, n_local, builds)?);
        }
        let r = (self.resident.as_ref()).ok_or_else(|| Error::Config("no inputs built".into()))?;
        let x64 = Tensor::from_slice(positions.as_flattened(), (positions.len(), 3), dev)?;
        // A large device list goes to the model without its skin's pairs, as MD's does.
        let (centers, neighbors, offsets) = match (on_device, &self.device) {
            (true, Some(d)) if r.centers.dim(0)? >= calc.tuning().prune_from_edges => {
                d.pruned(&x64, calc.model().config().cutoff)?
            }
            _ => (r.centers.clone(), r.neighbors.clone(), r.offsets.clone()),
        };
        let x = Var::from_tensor(&x64.to_dtype(calc.dtype())?)?;
        let inputs = PainnInputs {
            species: r.species.clone(),
            positions: x.as_tensor().clone(),
            centers,
            neighbors,
            offsets,
            atom_structure: r.atom_structure.clone(),
            n_structures: 1,
        };
        let (atom_energies, forces, virial) = match (fused, &self.order) {
            (true, Some(order)) => {
                let call = calc.fused()?.shell_call(&inputs, &order.rows)?;
                let w = call
                    .virials
                    .sum(0)?
                    .to_dtype(DType::F64)?
                    .to_vec2::<f64>()?;
                let w: Matrix3 = std::array::from_fn(|a| std::array::from_fn(|b| w[a][b]));
                (call.atom_energies, order.undo(&rows(&call.forces)?), w)
            }
            (true, None) => {
                // W = Σ over edges of r ⊗ F, gathered in the force kernel: valid with images.
                let pass = calc.fused()?.forward(&inputs)?;
                let (forces, virials) = pass.weighted_forces_and_virials(&r.mask)?;
                let w = virials.sum(0)?.to_dtype(DType::F64)?.to_vec2::<f64>()?;
                let w: Matrix3 = std::array::from_fn(|a| std::array::from_fn(|b| w[a][b]));
                (pass.atom_energies.clone(), rows(&forces)?, w)
            }
            (false, _) => {
                let atom_energies = calc.model().atom_energies(&inputs)?;
                let total = (&atom_energies * &r.mask)?.sum_all()?;
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

/// Where a build's edges are: the host list (its cell for the offsets, and the staging memory
/// they are built in), or the device list's tensors.
enum EdgeSource<'a> {
    Host(&'a VerletList, Option<&'a Lattice>, &'a mut Staging),
    Device(Edges),
}

/// The device inputs of the list as last built (pairs within cutoff + skin), the `builds`th.
fn build(
    edges: EdgeSource<'_>,
    calc: &PainnCalculator,
    numbers: &[u8],
    n_local: usize,
    builds: usize,
) -> Result<Resident> {
    let (n, dev) = (numbers.len(), calc.device());
    let (centers, neighbors, offsets) = match edges {
        EdgeSource::Device(edges) => edges,
        EdgeSource::Host(list, lattice, staging) => upload(list, calc, lattice, staging)?,
    };
    let mask: Vec<f64> = (0..n).map(|i| f64::from(u8::from(i < n_local))).collect();
    Ok(Resident {
        numbers: numbers.to_vec(),
        n_local,
        builds,
        species: Tensor::from_vec(calc.structure_species(numbers, 0)?, n, dev)?,
        centers,
        neighbors,
        offsets,
        atom_structure: Tensor::zeros(n, DType::U32, dev)?,
        mask: Tensor::from_vec(mask, n, dev)?.to_dtype(calc.dtype())?,
    })
}

/// The host list's edges on the device: centers, neighbours, image offsets.
fn upload(
    list: &VerletList,
    calc: &PainnCalculator,
    lattice: Option<&Lattice>,
    staging: &mut Staging,
) -> Result<Edges> {
    let nl = list.list();
    let (e, dev) = (nl.len(), calc.device());
    // Offsets in the model's float type where the host cast is the device's (f32, f64): half
    // the upload in f32, and no cast on the device.
    let offsets = match calc.dtype() {
        DType::F32 => {
            flat_image_offsets_into(&nl.shifts, lattice, &mut staging.f32);
            Tensor::from_slice(&staging.f32, (e, 3), dev)?
        }
        DType::F64 => {
            flat_image_offsets_into(&nl.shifts, lattice, &mut staging.f64);
            Tensor::from_slice(&staging.f64, (e, 3), dev)?
        }
        other => {
            let offsets = flat_image_offsets(&nl.shifts, lattice);
            Tensor::from_vec(offsets, (e, 3), dev)?.to_dtype(other)?
        }
    };
    // From the list's memory: no host copy on the way to a GPU.
    Ok((
        Tensor::from_slice(&nl.centers, e, dev)?,
        Tensor::from_slice(&nl.neighbors, e, dev)?,
        offsets,
    ))
}

/// Counts agree, the locals are among the atoms, every position is finite.
pub(super) fn check_atoms(numbers: &[u8], positions: &[[f64; 3]], n_local: usize) -> Result<()> {
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
    Ok(())
}
