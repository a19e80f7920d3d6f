//! [`ForceGradient::Fused`](super::ForceGradient::Fused): a batch's loss and weight gradients
//! on the device, with no autograd graph and one read back (the loss).
//!
//! The batch and its labels go up once. The fused kernels give energies and forces at x; the
//! errors, the loss, the step h along u = F − F̂ (`force_gradient`), the displaced copies at
//! x ± h·u and each atom's seed d(surrogate)/dEᵢ are then device tensors, so nothing waits for
//! the host until the loss is read. `FusedPainn::weight_gradients` over the copies gives the
//! gradients: the force term's from their difference, the energy term's from their mean.
//!
//! On CUDA the whole step, AdamW and the EMA included, is captured once per batch shape and
//! replayed ([`Trainer::replayed`], `step_graph`).

use super::force_gradient::displacement_rms;
use super::step_graph::{Buffers, StepGraph, StepInputs, MAX_GRAPHS};
use super::trainer::Trainer;
use crate::calculator::edge_offsets;
use crate::error::{Error, Result};
use crate::graph::{edge_capacity, edge_tensors, HostEdges};
use crate::model::{FusedPainn, PainnInputs};
use crate::neighbors::NeighborList;
use crate::ops::scatter_add;
use crate::ops::AdamWStep;
use crate::phase::{Phase, PhaseClock};
use crate::structure::Batch;
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};

/// A batch's labels on the device: reference energies and 1 / atoms per structure (f64),
/// reference forces [N, 3] (the model's dtype).
pub(super) struct Labels {
    energy: Tensor,
    inv_atoms: Tensor,
    forces: Tensor,
}

impl Labels {
    /// The labels of `batch` in one buffer, [Ê (B) | 1 / n (B) | F̂ (3N)] f64, on `dev`.
    pub(super) fn packed(batch: &Batch, dev: &Device) -> Result<Tensor> {
        let (b, n) = (batch.n_structures(), batch.n_atoms());
        let mut host = Vec::with_capacity(2 * b + 3 * n);
        host.extend(batch.structures.iter().map(|s| s.energy.unwrap_or(0.0)));
        host.extend(batch.structures.iter().map(|s| 1.0 / s.len().max(1) as f64));
        host.extend(
            batch
                .structures
                .iter()
                .flat_map(|s| s.forces.iter().flatten().flatten().copied()),
        );
        if host.len() != 2 * b + 3 * n {
            return Err(Error::Train("a training frame has no forces".into()));
        }
        Ok(Tensor::from_vec(host, 2 * b + 3 * n, dev)?)
    }

    /// Views of a [`packed`](Self::packed) buffer of `b` structures and `n` atoms.
    pub(super) fn of(packed: &Tensor, b: usize, n: usize, dtype: DType) -> Result<Self> {
        Ok(Self {
            energy: packed.narrow(0, 0, b)?,
            inv_atoms: packed.narrow(0, b, b)?,
            forces: packed
                .narrow(0, 2 * b, 3 * n)?
                .reshape((n, 3))?
                .to_dtype(dtype)?,
        })
    }
}

/// `copies` copies of `x` side by side as one batch, at `positions` [copies · N, 3]: every
/// index shifted by the atoms (structures) before its copy, on the device.
fn copies_of(x: &PainnInputs, positions: Tensor, copies: usize) -> Result<PainnInputs> {
    let (n, b) = (x.species.dim(0)?, x.n_structures);
    let shifted = |t: &Tensor, by: usize| -> Result<Tensor> {
        let parts = (0..copies)
            .map(|c| t.affine(1.0, (c * by) as f64))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Tensor::cat(&parts, 0)?)
    };
    let repeated = |t: &Tensor| Tensor::cat(&vec![t; copies], 0);
    Ok(PainnInputs {
        species: repeated(&x.species)?,
        positions,
        centers: shifted(&x.centers, n)?,
        neighbors: shifted(&x.neighbors, n)?,
        offsets: repeated(&x.offsets)?,
        atom_structure: shifted(&x.atom_structure, b)?,
        n_structures: copies * b,
    })
}

impl Trainer {
    /// The loss of `batch` and its gradients by the fused kernels (see the module docs).
    pub(super) fn fused_loss_and_grads(
        &self,
        batch: &Batch,
        nl: &NeighborList,
        clock: &mut dyn PhaseClock,
    ) -> Result<(f64, GradStore)> {
        clock.mark(Phase::Upload)?;
        let (x, _) = self.calc.prepare_with(batch, nl)?;
        let packed = Labels::packed(batch, &self.device)?;
        let labels = Labels::of(&packed, batch.n_structures(), batch.n_atoms(), self.dtype)?;
        clock.mark(Phase::Forward)?;
        let (loss, named) = self.fused_device_step(&x, &labels, true)?;
        let grads = self.grad_store(named)?;
        clock.mark(Phase::Download)?;
        Ok((loss.to_scalar::<f64>()?, grads))
    }

    /// The loss (an f64 scalar) and the weight gradients by name of the batch `x` with labels
    /// `labels`: device work only, nothing read back (what a captured step holds).
    /// `one_launch` lets the pass at x take the one-launch kernels where the plan does.
    pub(super) fn fused_device_step(
        &self,
        x: &PainnInputs,
        labels: &Labels,
        one_launch: bool,
    ) -> Result<(Tensor, Vec<(String, Tensor)>)> {
        let (dtype, cfg) = (self.dtype, &self.cfg);
        let fused = FusedPainn::new(self.calc.model(), self.calc.tuning())?.used_once(true);
        let (atom_energies, forces) = match one_launch {
            true => fused.energies_and_forces(x)?,
            false => fused.by_layers(x)?,
        };
        let (b, m) = (x.n_structures, 3.0 * x.species.dim(0)? as f64);
        // Energy errors per structure, summed in f64 (structure energies dwarf their errors).
        let sums = scatter_add(&atom_energies.to_dtype(DType::F64)?, &x.atom_structure, b)?;
        let per_atom = ((sums - &labels.energy)? * &labels.inv_atoms)?;
        let u = (forces - &labels.forces)?;
        let u_sq = u.sqr()?.sum_all()?.to_dtype(DType::F64)?;
        let loss = ((per_atom.sqr()?.sum_all()? * (cfg.energy_weight / b as f64))?
            + (&u_sq * (cfg.force_weight / m))?)?;
        // The energy term's seed of each structure: 2 w_E ΔE_k / (n_k² B), shared by the copies.
        let energy_seed = ((per_atom * &labels.inv_atoms)? * (2.0 * cfg.energy_weight / b as f64))?;
        let (positions, seeds, copies) = match cfg.force_weight > 0.0 {
            false => (x.positions.clone(), energy_seed, 1),
            true => {
                // h = rms / RMS(u); the force term −(w_F / M h)(E(x + h·u) − E(x − h·u)). An
                // exact force (u = 0) leaves the copies at x and the term at zero.
                let u_rms = (u_sq / m)?.affine(1.0, 1e-60)?.sqrt()?;
                let rms = displacement_rms(dtype);
                let h = u_rms.recip()?.affine(rms, 0.0)?;
                let c = (u_rms * (-cfg.force_weight / (m * rms)))?;
                let half = (energy_seed * 0.5)?;
                let seeds = Tensor::cat(&[half.broadcast_add(&c)?, half.broadcast_sub(&c)?], 0)?;
                let step = u.broadcast_mul(&h.to_dtype(dtype)?)?;
                let moved = [(&x.positions + &step)?, (&x.positions - &step)?];
                (Tensor::cat(&moved, 0)?, seeds, 2)
            }
        };
        // The copies keep x's neighbour list: they are ~1e-3 Å away, and a pair that crosses
        // the cutoff in between weighs ~1e-7 (the cosine cutoff and its slope vanish there).
        let all = copies_of(x, positions, copies)?;
        let seeds = seeds
            .index_select(&all.atom_structure, 0)?
            .to_dtype(dtype)?;
        Ok((loss, fused.weight_gradients(&all, &seeds)?))
    }

    /// Gradients by name as one flat vector in the optimiser's order.
    pub(super) fn flat_named(&self, named: Vec<(String, Tensor)>) -> Result<Tensor> {
        let store = self.grad_store(named)?;
        self.opt.flat_grads(&store)
    }

    /// The step on `idx` replayed as a CUDA graph (`step_graph`; captured first where none
    /// fits), or None where steps run op by op: graphs off, or a batch shape beyond
    /// [`MAX_GRAPHS`].
    pub(super) fn replayed(
        &mut self,
        idx: &[usize],
        step: AdamWStep,
        clock: &mut dyn PhaseClock,
    ) -> Result<Option<f64>> {
        if !self.graphed()? {
            return Ok(None);
        }
        clock.mark(Phase::Batch)?;
        let (batch, nl) = Self::batch(&self.train, idx)?;
        let (atoms, structures) = (batch.n_atoms(), batch.n_structures());
        let fits = |g: &StepGraph| g.fits(atoms, structures, nl.len());
        let k = match self.step_graphs.iter().position(fits) {
            Some(k) => k,
            None => {
                // A longer list than its shape's graph holds replaces that graph.
                self.step_graphs
                    .retain(|g| !g.same_atoms(atoms, structures));
                if self.step_graphs.len() >= MAX_GRAPHS {
                    return Ok(None);
                }
                clock.mark(Phase::Capture)?;
                let inputs = self.step_inputs(&batch, &nl, edge_capacity(nl.len()), &step)?;
                let graph = self.capture_step(&inputs, step)?;
                self.step_graphs.push(graph);
                self.step_graphs.len() - 1
            }
        };
        clock.mark(Phase::Upload)?;
        let graph = &self.step_graphs[k];
        let inputs = self.step_inputs(&batch, &nl, graph.capacity(), &step)?;
        clock.mark(Phase::Forward)?;
        graph.run(&inputs).map(Some)
    }

    /// `batch`'s inputs for a captured step: its edges padded to `capacity`.
    fn step_inputs(
        &self,
        batch: &Batch,
        nl: &NeighborList,
        capacity: usize,
        step: &AdamWStep,
    ) -> Result<StepInputs> {
        let (n, dev, dtype) = (batch.n_atoms(), &self.device, self.dtype);
        let offsets = edge_offsets(batch, nl);
        let edges = HostEdges {
            centers: &nl.centers,
            neighbors: &nl.neighbors,
            offsets: &offsets,
        };
        let cutoff = self.calc.model().config().cutoff;
        let [centers, neighbors, offsets] = edge_tensors(edges, n, capacity, cutoff, dev, dtype)?;
        let positions: Vec<f64> = batch.positions().into_iter().flatten().collect();
        let x = PainnInputs {
            species: Tensor::from_vec(self.calc.species_of(batch)?, n, dev)?,
            positions: Tensor::from_vec(positions, (n, 3), dev)?.to_dtype(dtype)?,
            centers,
            neighbors,
            offsets,
            atom_structure: Tensor::from_vec(batch.atom_structure(), n, dev)?,
            n_structures: batch.n_structures(),
        };
        Ok(StepInputs {
            x,
            labels: Labels::packed(batch, dev)?,
            values: step.values(dtype, dev)?,
        })
    }

    /// The fused step (loss, gradients, AdamW, EMA, the variables written) on `inputs`,
    /// captured. The capture's two warm-up runs update the weights; they are put back, so the
    /// first replay takes the batch's step.
    fn capture_step(&self, inputs: &StepInputs, step: AdamWStep) -> Result<StepGraph> {
        let kept = self.opt.snapshot()?;
        let ema = self.ema.as_tensor().copy()?;
        let captured = StepGraph::capture(&self.device, Buffers::new(inputs)?, |b| {
            let inputs = b.inputs();
            let (b_count, n) = (inputs.x.n_structures, inputs.x.species.dim(0)?);
            let labels = Labels::of(&inputs.labels, b_count, n, self.dtype)?;
            // The separate kernels at x, as `graph::ForceGraph` captures them.
            let (loss, named) = self.fused_device_step(&inputs.x, &labels, false)?;
            let g = self.flat_named(named)?;
            self.opt.update(&g, step, &inputs.values, &self.ema)?;
            b.loss.set(&loss.reshape(1)?)?;
            Ok(())
        });
        self.opt.restore(&kept)?;
        self.ema.set(&ema)?;
        captured
    }

    /// Gradients by variable name (`FusedPainn::weight_gradients`) as the store backprop
    /// fills, keyed by the optimiser's variables.
    fn grad_store(&self, named: Vec<(String, Tensor)>) -> Result<GradStore> {
        let mut named: std::collections::HashMap<String, Tensor> = named.into_iter().collect();
        let mut store = GradStore::default();
        for (name, var) in self.opt.vars() {
            let Some(g) = named.remove(name) else {
                return Err(Error::Train(format!(
                    "the fused weight gradients hold none for `{name}`"
                )));
            };
            store.insert(var.as_tensor(), g);
        }
        Ok(store)
    }
}
