//! The `Calculator` trait (energies and forces of a batch) that MD, training, benchmarks and the
//! profiler share, and its PaiNN implementation.

use crate::checkpoint;
use crate::error::{Error, Result};
use crate::model::Backend;
use crate::model::{FusedPainn, Painn, PainnInputs};
use crate::neighbors::{batch_neighbor_list, image_offset, wrap_batch, NeighborList};
use crate::phase::{NoClock, Phase, PhaseClock};
use crate::structure::{Batch, Matrix3};
use crate::tuning::Tuning;
use candle_core::{DType, Device, Tensor, Var};
use std::path::Path;
use std::sync::OnceLock;

/// Energies (eV) and forces (eV/Å) of every structure of a batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    pub energies: Vec<f64>,
    /// One force row per atom, grouped by structure.
    pub forces: Vec<Vec<[f64; 3]>>,
}

/// Energies, forces and stresses of a batch: the stress of each structure with a cell periodic
/// along all three axes (others have no volume: `None`). Computed in `stress`.
#[derive(Clone, Debug, PartialEq)]
pub struct StressPrediction {
    pub prediction: Prediction,
    /// σ in eV/Å³ (ASE's sign), per structure.
    pub stresses: Vec<Option<Matrix3>>,
}

impl Prediction {
    /// The first non-finite energy or force (a NaN weight, overlapping atoms) as
    /// [`Error::NonFiniteResult`], structures counted within this prediction.
    pub fn check_finite(&self) -> Result<()> {
        for (k, (e, f)) in self.energies.iter().zip(&self.forces).enumerate() {
            if !e.is_finite() {
                return Err(Error::NonFiniteResult {
                    structure: k,
                    what: format!("the predicted energy is {e}"),
                });
            }
            if let Some(i) = f.iter().position(|r| r.iter().any(|x| !x.is_finite())) {
                return Err(Error::NonFiniteResult {
                    structure: k,
                    what: format!("the predicted force on atom {i} is {:?}", f[i]),
                });
            }
        }
        Ok(())
    }

    /// Copies energies \[S\] and forces [N, 3] (any float dtype) off the device, the forces
    /// split by structure as `batch` holds its atoms.
    pub fn from_device(batch: &Batch, energies: &Tensor, forces: &Tensor) -> Result<Self> {
        let energies = energies.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        let forces = forces.to_dtype(DType::F64)?.to_vec2::<f64>()?;
        let forces = batch
            .offsets
            .windows(2)
            .map(|w| {
                forces[w[0]..w[1]]
                    .iter()
                    .map(|r| [r[0], r[1], r[2]])
                    .collect()
            })
            .collect();
        Ok(Self { energies, forces })
    }
}

/// Anything that gives energies and forces for a batch of structures.
pub trait Calculator {
    fn compute(&self, batch: &Batch) -> Result<Prediction>;

    /// [`compute`](Self::compute), marking its phases on `clock` (for the profiler). The
    /// default reports the whole call as one phase.
    fn compute_phased(&self, batch: &Batch, clock: &mut dyn PhaseClock) -> Result<Prediction> {
        clock.mark(Phase::Call)?;
        self.compute(batch)
    }

    /// Interaction range in Å (for neighbour lists built by the caller).
    fn cutoff(&self) -> f64;

    /// Energies, forces and the stress of every structure with a cell periodic along all
    /// three axes ([`StressPrediction`]). Calculators without
    /// a stress give `None` for every structure.
    fn compute_with_stress(&self, batch: &Batch) -> Result<StressPrediction> {
        Ok(StressPrediction {
            prediction: self.compute(batch)?,
            stresses: vec![None; batch.structures.len()],
        })
    }
}

/// A PaiNN model on a device, in a dtype.
pub struct PainnCalculator {
    model: Painn,
    device: Device,
    dtype: DType,
    /// What the fused backend's plan picks kernels from, and MD its step paths.
    tuning: Tuning,
    /// The fused form of the model (weights read once), built on first use.
    fused: OnceLock<FusedPainn>,
}

/// Device-side energies \[B\] and forces [N, 3] of one call.
pub struct DeviceOutput {
    pub energies: Tensor,
    pub forces: Tensor,
}

impl PainnCalculator {
    pub fn new(model: Painn, device: Device, dtype: DType) -> Self {
        Self {
            model,
            device,
            dtype,
            tuning: Tuning::default(),
            fused: OnceLock::new(),
        }
    }

    /// Loads a checkpoint onto `device` (f32 unless `dtype` says otherwise).
    pub fn from_checkpoint(path: &Path, device: &Device, dtype: DType) -> Result<Self> {
        let ckpt = checkpoint::load(path)?;
        Ok(Self::new(ckpt.model(device, dtype)?, device.clone(), dtype))
    }

    pub fn with_backend(mut self, backend: Backend) -> Self {
        self.model = self.model.with_backend(backend);
        self
    }

    /// Picks the fused backend's kernels and MD's step paths under `tuning` (every path gives
    /// the same results).
    pub fn with_tuning(mut self, tuning: Tuning) -> Self {
        self.tuning = tuning;
        self.fused = OnceLock::new();
        self
    }

    /// The tuning the fused backend and MD pick their paths from.
    pub fn tuning(&self) -> &Tuning {
        &self.tuning
    }

    /// The fused-kernel form of the model (weights read once, on first use: for inference).
    pub fn fused(&self) -> Result<&FusedPainn> {
        if let Some(f) = self.fused.get() {
            return Ok(f);
        }
        let built = FusedPainn::new(&self.model, &self.tuning)?;
        Ok(self.fused.get_or_init(|| built))
    }

    /// Builds what its code path needs before the first call (the fused form of the model,
    /// with `--backend fused`), so that a model the path cannot run fails here, not at a frame.
    pub fn check_ops(&self) -> Result<()> {
        if self.model.backend() == Backend::Fused {
            self.fused()?;
        }
        Ok(())
    }

    pub fn model(&self) -> &Painn {
        &self.model
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Host-side preparation: species, neighbour list, image offsets, uploaded to the device.
    /// Returns the inputs and the positions variable that forces are taken against.
    pub fn prepare(&self, batch: &Batch) -> Result<(PainnInputs, Var)> {
        let batch = wrap_batch(batch)?;
        let nl = batch_neighbor_list(&batch, self.model.config().cutoff)?;
        self.prepare_with(&batch, &nl)
    }

    /// Like [`prepare`](Self::prepare) with a neighbour list the caller built (e.g. a Verlet
    /// list with a skin: edges beyond the cutoff contribute exactly zero).
    pub fn prepare_with(&self, batch: &Batch, nl: &NeighborList) -> Result<(PainnInputs, Var)> {
        let species = self.species_of(batch)?;
        let offsets = edge_offsets(batch, nl);
        let dev = &self.device;
        let n = batch.n_atoms();
        let e = nl.len();
        let flat_pos: Vec<f64> = batch.positions().into_iter().flatten().collect();
        let positions =
            Var::from_tensor(&Tensor::from_vec(flat_pos, (n, 3), dev)?.to_dtype(self.dtype)?)?;
        let offsets: Vec<f64> = offsets.into_iter().flatten().collect();
        let inputs = PainnInputs {
            species: Tensor::from_vec(species, n, dev)?,
            positions: positions.as_tensor().clone(),
            centers: Tensor::from_vec(nl.centers.clone(), e, dev)?,
            neighbors: Tensor::from_vec(nl.neighbors.clone(), e, dev)?,
            offsets: Tensor::from_vec(offsets, (e, 3), dev)?.to_dtype(self.dtype)?,
            atom_structure: Tensor::from_vec(batch.atom_structure(), n, dev)?,
            n_structures: batch.n_structures(),
        };
        Ok((inputs, positions))
    }

    /// The model's species index of every atom of `batch`; an unknown element is an error
    /// naming its structure and atom.
    pub fn species_of(&self, batch: &Batch) -> Result<Vec<u32>> {
        let mut species = Vec::with_capacity(batch.n_atoms());
        for (k, s) in batch.structures.iter().enumerate() {
            species.extend(self.structure_species(&s.numbers, k)?);
        }
        Ok(species)
    }

    /// The species index of every atom of structure `k`, whose atomic numbers are `numbers`.
    pub(crate) fn structure_species(&self, numbers: &[u8], k: usize) -> Result<Vec<u32>> {
        let cfg = self.model.config();
        cfg.species_of(numbers)
            .map_err(|(atom, z)| Error::UnknownElement {
                z,
                structure: k,
                atom,
                known: cfg.elements.clone(),
            })
    }

    /// [`Calculator::compute_phased`] on a neighbour list the caller built.
    pub fn compute_with(
        &self,
        batch: &Batch,
        nl: &NeighborList,
        clock: &mut dyn PhaseClock,
    ) -> Result<Prediction> {
        Ok(self.evaluate(batch, nl, clock)?.0)
    }

    /// [`compute_with`](Self::compute_with), and the atom energies [N] (f64, on the device) the
    /// structure energies are sums of.
    fn evaluate(
        &self,
        batch: &Batch,
        nl: &NeighborList,
        clock: &mut dyn PhaseClock,
    ) -> Result<(Prediction, Tensor)> {
        clock.mark(Phase::Upload)?;
        let (inputs, positions) = self.prepare_with(batch, nl)?;
        let (atom_energies, forces) = atom_energies_and_forces(self, &inputs, &positions, clock)?;
        clock.mark(Phase::Download)?;
        // Per-structure totals summed in f64: in f32 a sum of 10,000 atom energies of a few
        // hundred eV each is off by ~1 eV (measured against the same sum in another order).
        let atom_energies = atom_energies.to_dtype(DType::F64)?;
        let energies = self.model.backend().scatter_add(
            &atom_energies,
            &inputs.atom_structure,
            inputs.n_structures,
        )?;
        Ok((
            Prediction::from_device(batch, &energies, &forces)?,
            atom_energies,
        ))
    }

    /// [`Calculator::compute`] and every atom's energy (eV, the terms each structure's energy
    /// sums), split by structure as `batch` holds its atoms.
    pub fn compute_with_atom_energies(&self, batch: &Batch) -> Result<(Prediction, Vec<Vec<f64>>)> {
        let batch = wrap_batch(batch)?;
        let nl = batch_neighbor_list(&batch, self.model.config().cutoff)?;
        let (prediction, atom_energies) = self.evaluate(&batch, &nl, &mut NoClock)?;
        let all = atom_energies.to_vec1::<f64>()?;
        let split = batch.offsets.windows(2).map(|w| all[w[0]..w[1]].to_vec());
        Ok((prediction, split.collect()))
    }

    /// Energies and forces on the device: one forward and one backward for the whole batch.
    pub fn compute_device(&self, inputs: &PainnInputs, positions: &Var) -> Result<DeviceOutput> {
        let (atom_energies, forces) =
            atom_energies_and_forces(self, inputs, positions, &mut NoClock)?;
        // One structure: a sum, without the zeroed buffer a scatter adds into.
        let energies = match inputs.n_structures {
            1 => atom_energies.sum_keepdim(0)?,
            s => (self.model.backend()).scatter_add(&atom_energies, &inputs.atom_structure, s)?,
        };
        Ok(DeviceOutput { energies, forces })
    }
}

/// Per-atom energies \[N\] and forces [N, 3] of prepared inputs, marking the forward and
/// backward phases on `clock`: with `Backend::Fused` the fused kernels and their explicit
/// adjoint, otherwise candle's backprop through the model's graph.
pub fn atom_energies_and_forces(
    calc: &PainnCalculator,
    inputs: &PainnInputs,
    positions: &Var,
    clock: &mut dyn PhaseClock,
) -> Result<(Tensor, Tensor)> {
    clock.mark(Phase::Forward)?;
    let model = calc.model();
    if model.backend() == Backend::Fused {
        let fused = calc.fused()?;
        if let Some(out) = fused.one_launch(inputs)? {
            // Forward and adjoint are one launch: the profiler sees it all as the forward.
            clock.mark(Phase::Backward)?;
            return Ok(out);
        }
        let pass = fused.forward(inputs)?;
        clock.mark(Phase::Backward)?;
        return Ok((pass.atom_energies.clone(), pass.forces()?));
    }
    let atom_energies = model.atom_energies(inputs)?;
    let total = atom_energies.sum_all()?;
    clock.mark(Phase::Backward)?;
    let forces = forces_from(&total, positions)?;
    Ok((atom_energies, forces))
}

/// Forces −∂total/∂positions by one backward pass.
pub fn forces_from(total: &Tensor, positions: &Var) -> Result<Tensor> {
    let grads = total.backward()?;
    Ok(match grads.get(positions.as_tensor()) {
        Some(g) => g.neg()?,
        // No edges at all: the energy does not depend on positions.
        None => positions.as_tensor().zeros_like()?,
    })
}

/// Cartesian image offset S·cell of every edge, each with its own structure's cell.
pub fn edge_offsets(batch: &Batch, nl: &NeighborList) -> Vec<[f64; 3]> {
    nl.edge_structures(&batch.offsets)
        .iter()
        .zip(&nl.shifts)
        .map(|(&k, &s)| image_offset(s, batch.structures[k as usize].cell.as_ref()))
        .collect()
}

impl Calculator for PainnCalculator {
    fn compute(&self, batch: &Batch) -> Result<Prediction> {
        self.compute_phased(batch, &mut NoClock)
    }

    fn compute_phased(&self, batch: &Batch, clock: &mut dyn PhaseClock) -> Result<Prediction> {
        clock.mark(Phase::NeighborList)?;
        let batch = wrap_batch(batch)?;
        let nl = batch_neighbor_list(&batch, self.model.config().cutoff)?;
        self.compute_with(&batch, &nl, clock)
    }

    fn cutoff(&self) -> f64 {
        self.model.config().cutoff
    }

    fn compute_with_stress(&self, batch: &Batch) -> Result<StressPrediction> {
        PainnCalculator::compute_with_stress(self, batch)
    }
}
