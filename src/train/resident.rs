//! The training frames held on the device, so that a captured step's batch is gathered there
//! (`ops::gather_frames`, a kernel inside the step) instead of being assembled on the host and
//! uploaded: a step's uploads are then its table of frames (3 words a structure) and the
//! optimiser's step values. The frames move to the device at the first captured step where
//! they fit [`SHARE`] of its free memory; where they do not, steps upload their batches.

use super::labels::Norms;
use super::step_graph::{StepInputs, StepPadding};
use crate::error::{Error, Result};
use crate::model::{PainnConfig, PainnInputs};
use crate::neighbors::{flat_image_offsets, padding_offset, NeighborList};
use crate::ops::{gather_frames, FrameTensors, GatherShape};
use crate::structure::Structure;
use candle_core::{DType, Device, Tensor};

/// The part of the device's free memory the frames may take; the rest is the steps'.
pub(super) const SHARE: f64 = 0.25;

/// Where a trainer's frames are: not decided yet (at the first captured step), on the host
/// (each step uploads its batch), or on the device.
pub(super) enum FramePlace {
    Undecided,
    Host,
    Device(FrameStore),
}

/// Every training frame on one device, one after another ([`FrameTensors`]), and where each
/// frame's atoms and edges start (a host copy, for the steps' tables).
pub(super) struct FrameStore {
    tensors: FrameTensors,
    atom_begin: Vec<u32>,
    edge_begin: Vec<u32>,
    far: f64,
}

/// Bytes the frames of `atoms` atoms and `edges` edges take on the device (f64 positions,
/// forces and offsets, u32 indices).
pub(super) fn store_bytes(frames: usize, atoms: usize, edges: usize) -> u64 {
    (frames as u64) * 16 + (atoms as u64) * (48 + 4) + (edges as u64) * (24 + 8)
}

impl FrameStore {
    /// The `frames` (labelled structures with their lists) of a model of `cfg` on `dev`: an
    /// error where they hold more atoms or edges than u32 counts.
    pub(super) fn new<'a>(
        frames: impl ExactSizeIterator<Item = (&'a Structure, &'a NeighborList)> + Clone,
        cfg: &PainnConfig,
        dev: &Device,
    ) -> Result<Self> {
        let count = frames.len();
        let (mut atom_begin, mut edge_begin) = (vec![0u32], vec![0u32]);
        let (mut positions, mut forces, mut energy, mut offsets) = (
            Vec::new(),
            Vec::new(),
            Vec::with_capacity(count),
            Vec::new(),
        );
        let (mut species, mut centers, mut neighbors) = (Vec::new(), Vec::new(), Vec::new());
        let too_many =
            || Error::Train("the training frames hold more than 2³² atoms or edges".into());
        for (k, (s, nl)) in frames.enumerate() {
            let labels = s.forces.as_ref().zip(s.energy);
            let Some((f, e)) = labels else {
                return Err(Error::Train(format!("training frame {k} has no labels")));
            };
            positions.extend(s.positions.iter().flatten());
            forces.extend(f.iter().flatten());
            energy.push(e);
            species.extend(cfg.species_of(&s.numbers).map_err(|(atom, z)| {
                Error::Train(format!("training frame {k}: atom {atom} is element Z={z}"))
            })?);
            offsets.extend(flat_image_offsets(&nl.shifts, s.cell.as_ref()));
            centers.extend(&nl.centers);
            neighbors.extend(&nl.neighbors);
            let atoms = u32::try_from(species.len()).map_err(|_| too_many())?;
            let edges = u32::try_from(centers.len()).map_err(|_| too_many())?;
            atom_begin.push(atoms);
            edge_begin.push(edges);
        }
        let (n, e) = (species.len(), centers.len());
        let f64s = |v: Vec<f64>, rows: usize| Tensor::from_vec(v, rows, dev);
        let u32s = |v: Vec<u32>| {
            let len = v.len();
            Tensor::from_vec(v, len, dev)
        };
        Ok(Self {
            tensors: FrameTensors {
                positions: f64s(positions, 3 * n)?,
                forces: f64s(forces, 3 * n)?,
                energy: f64s(energy, count)?,
                offsets: f64s(offsets, 3 * e)?,
                atom_begin: u32s(atom_begin.clone())?,
                edge_begin: u32s(edge_begin.clone())?,
                species: u32s(species)?,
                centers: u32s(centers)?,
                neighbors: u32s(neighbors)?,
            },
            atom_begin,
            edge_begin,
            far: padding_offset(cfg.cutoff),
        })
    }

    fn shape(&self, padded: StepPadding) -> GatherShape {
        GatherShape {
            structures: padded.structures,
            atoms: padded.atoms,
            capacity: padded.capacity,
            far: self.far,
        }
    }

    /// The table that picks the frames `idx` as a batch padded to `padded`, its loss averaged
    /// over `norms` (`ops::gather_frames`), on `dev`; an error where the batch does not fit.
    pub(super) fn table(
        &self,
        idx: &[usize],
        padded: StepPadding,
        norms: Norms,
        dev: &Device,
    ) -> Result<Tensor> {
        let (b, s) = (idx.len(), padded.structures);
        let frames = self.atom_begin.len() - 1;
        if let Some(&k) = idx.iter().find(|&&k| k >= frames) {
            return Err(Error::Train(format!(
                "training frame {k} of {frames} picked for a step"
            )));
        }
        let size = |begin: &[u32], k: usize| (begin[k + 1] - begin[k]) as usize;
        let n: usize = idx.iter().map(|&k| size(&self.atom_begin, k)).sum();
        let e: usize = idx.iter().map(|&k| size(&self.edge_begin, k)).sum();
        if b >= s || n > padded.atoms || e > padded.capacity {
            return Err(Error::Train(format!(
                "a batch of {n} atoms, {e} edges in {b} structures given to a step of {} atoms, \
                 {} edges in {s}",
                padded.atoms, padded.capacity
            )));
        }
        let count = |x: usize| {
            u32::try_from(x).map_err(|_| Error::Train(format!("{x} does not fit a step's table")))
        };
        let mut table = Vec::with_capacity(3 * s + 5);
        for x in [b, norms.structures, norms.atoms] {
            table.push(count(x)?);
        }
        table.extend(idx.iter().map(|&k| k as u32));
        table.extend(std::iter::repeat_n(0, s - b));
        for begin in [&self.atom_begin, &self.edge_begin] {
            let mut at = 0u32;
            for &k in idx {
                table.push(at);
                at += begin[k + 1] - begin[k];
            }
            table.extend(std::iter::repeat_n(at, s + 1 - b));
        }
        let len = table.len();
        Ok(Tensor::from_vec(table, len, dev)?)
    }

    /// The inputs of the step `table` picks (device work only, nothing read back), with the
    /// optimiser's step `values`: the host's `Trainer::step_inputs` of the same batch.
    pub(super) fn gather(
        &self,
        table: &Tensor,
        padded: StepPadding,
        dtype: DType,
        values: &Tensor,
    ) -> Result<StepInputs> {
        let shape = self.shape(padded);
        let (s, n, c) = (shape.structures, shape.atoms, shape.capacity);
        let out = gather_frames(&self.tensors, table, shape)?;
        let labels = out.narrow(0, 0, 2 * s + 4 * n + 2)?;
        let at = 2 * s + 4 * n + 2;
        let positions = out.narrow(0, at, 3 * n)?.reshape((n, 3))?.to_dtype(dtype)?;
        let offsets = out.narrow(0, at + 3 * n, 3 * c)?;
        let offsets = offsets.reshape((c, 3))?.to_dtype(dtype)?;
        let index = out.narrow(0, at + 3 * n + 3 * c, 2 * n + 2 * c)?;
        let index = index.to_dtype(DType::U32)?;
        Ok(StepInputs {
            x: PainnInputs {
                species: index.narrow(0, 0, n)?,
                positions,
                centers: index.narrow(0, 2 * n, c)?,
                neighbors: index.narrow(0, 2 * n + c, c)?,
                offsets,
                atom_structure: index.narrow(0, n, n)?,
                n_structures: s,
            },
            labels,
            values: values.clone(),
        })
    }
}
