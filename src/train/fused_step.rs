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
use super::labels::{Labels, Norms};
use super::resident::{store_bytes, FramePlace, FrameStore, SHARE};
use super::step_graph::{
    Buffers, Need, StepGraph, StepInputs, StepPadding, StepSource, BUCKET_ATOMS, MAX_GRAPHS,
};
use super::trainer::Trainer;
use crate::calculator::edge_offsets;
use crate::error::{Error, Result};
use crate::graph::{edge_capacity, edge_tensors, HostEdges};
use crate::model::{FusedPainn, PainnInputs};
use crate::neighbors::{padding_offset, NeighborList};
use crate::ops::scatter_add;
use crate::ops::AdamWStep;
use crate::phase::{Phase, PhaseClock};
use crate::structure::Batch;
use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor};

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
        let packed = Labels::packed(batch, None, Norms::of(batch), &self.device)?;
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
        let (s, inv_b, inv_m) = (
            x.n_structures,
            &labels.inv_structures,
            &labels.inv_components,
        );
        // Energy errors per structure, summed in f64 (structure energies dwarf their errors).
        let sums = scatter_add(&atom_energies.to_dtype(DType::F64)?, &x.atom_structure, s)?;
        let per_atom = ((sums - &labels.energy)? * &labels.inv_atoms)?;
        let u = (forces - &labels.forces)?.broadcast_mul(&labels.mask.unsqueeze(1)?)?;
        let u_sq = u.sqr()?.sum_all()?.to_dtype(DType::F64)?;
        let loss = (((per_atom.sqr()?.sum_all()? * inv_b)? * cfg.energy_weight)?
            + ((&u_sq * inv_m)? * cfg.force_weight)?)?;
        // A data-parallel step takes h from all ranks' errors, as one device would.
        let u_sq = match &self.collective {
            None => u_sq,
            Some(c) => {
                let all = u_sq.copy()?;
                c.sum_in_place(&all)?;
                all
            }
        };
        // The energy term's seed of each structure: 2 w_E ΔE_k / (n_k² B), shared by the copies.
        let energy_seed =
            (((per_atom * &labels.inv_atoms)?.broadcast_mul(inv_b))? * (2.0 * cfg.energy_weight))?;
        let (positions, seeds, copies) = match cfg.force_weight > 0.0 {
            false => (x.positions.clone(), energy_seed, 1),
            true => {
                // h = rms / RMS(u); the force term −(w_F / M h)(E(x + h·u) − E(x − h·u)). An
                // exact force (u = 0) leaves the copies at x and the term at zero.
                let u_rms = (u_sq * inv_m)?.affine(1.0, 1e-60)?.sqrt()?;
                let rms = displacement_rms(dtype);
                let h = u_rms.recip()?.affine(rms, 0.0)?;
                let c = ((&u_rms * inv_m)? * (-cfg.force_weight / rms))?;
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
        // Padding atoms take no seed: their copies at x ± 0 would cancel only to rounding.
        let mask = Tensor::cat(&vec![&labels.mask; copies], 0)?;
        let seeds = (seeds
            .index_select(&all.atom_structure, 0)?
            .to_dtype(dtype)?
            * mask)?;
        Ok((loss, fused.weight_gradients(&all, &seeds)?))
    }

    /// Gradients by name as one flat vector in the optimiser's order.
    pub(super) fn flat_named(&self, named: Vec<(String, Tensor)>) -> Result<Tensor> {
        let store = self.grad_store(named)?;
        self.opt.flat_grads(&store)
    }

    /// What the batch of training frames `idx` needs of a captured step, from the frames'
    /// sizes (no batch assembled).
    pub(super) fn need(&self, idx: &[usize]) -> Need {
        Need {
            atoms: idx.iter().map(|&k| self.train[k].structure.len()).sum(),
            structures: idx.len() + 1,
            edges: idx.iter().map(|&k| self.train[k].edges.len()).sum(),
        }
    }

    /// The step on `idx` replayed as a CUDA graph (`step_graph`), or None where steps run op
    /// by op: graphs off, or no room for another graph ([`MAX_GRAPHS`]). `ready`: the
    /// frames' batch, where it was assembled ahead.
    pub(super) fn replayed(
        &mut self,
        idx: &[usize],
        step: AdamWStep,
        ready: Option<&(Batch, NeighborList)>,
        clock: &mut dyn PhaseClock,
    ) -> Result<Option<f64>> {
        if !self.graphed()? {
            return Ok(None);
        }
        self.place_frames()?;
        let (need, norms) = (self.need(idx), self.norms(idx));
        let Some(k) = self.graph_for(need, idx, norms, step, ready, clock)? else {
            return Ok(None);
        };
        let graph = &self.step_graphs[k];
        let source = self.source(idx, graph.padded(), norms, &step, ready, clock)?;
        clock.mark(Phase::Forward)?;
        graph.run(&source).map(Some)
    }

    /// The structures and atoms of the training frames `idx`.
    pub(super) fn norms(&self, idx: &[usize]) -> Norms {
        Norms {
            structures: idx.len(),
            atoms: idx.iter().map(|&k| self.train[k].structure.len()).sum(),
        }
    }

    /// Holds the training frames on the device where they fit ([`SHARE`] of its free memory),
    /// decided once, at the first captured step; else steps upload their batches.
    pub(super) fn place_frames(&mut self) -> Result<()> {
        if !matches!(self.resident, FramePlace::Undecided) {
            return Ok(());
        }
        let (atoms, edges) = self.train.iter().fold((0, 0), |(a, e), f| {
            (a + f.structure.len(), e + f.edges.len())
        });
        let bytes = store_bytes(self.train.len(), atoms, edges) as f64;
        let free = crate::profiler::sample(&self.device, 0).device_free_bytes;
        let counted = atoms.max(edges) < u32::MAX as usize;
        self.resident = match free.is_some_and(|f| bytes <= SHARE * f as f64) && counted {
            false => FramePlace::Host,
            true => {
                let frames = self.train.iter().map(|f| (&f.structure, &f.edges));
                FramePlace::Device(FrameStore::new(frames, &self.model_cfg, &self.device)?)
            }
        };
        Ok(())
    }

    /// What the step on the training frames `idx` padded to `padded` reads, averaged over
    /// `norms`: the table picking them where the frames are on the device, else their batch
    /// (`ready`, or assembled here) uploaded.
    pub(super) fn source(
        &self,
        idx: &[usize],
        padded: StepPadding,
        norms: Norms,
        step: &AdamWStep,
        ready: Option<&(Batch, NeighborList)>,
        clock: &mut dyn PhaseClock,
    ) -> Result<StepSource> {
        clock.mark(Phase::Batch)?;
        match &self.resident {
            FramePlace::Device(store) => {
                let table = store.table(idx, padded, norms, &self.device)?;
                let values = step.values(self.dtype, &self.device)?;
                Ok(StepSource::Picks { table, values })
            }
            FramePlace::Undecided | FramePlace::Host => {
                let assembled;
                let (batch, nl) = match ready {
                    Some((batch, nl)) => (batch, nl),
                    None => {
                        assembled = Self::batch(&self.train, idx)?;
                        (&assembled.0, &assembled.1)
                    }
                };
                clock.mark(Phase::Upload)?;
                let inputs = self.step_inputs(batch, nl, padded, norms, step)?;
                Ok(StepSource::Batch(inputs))
            }
        }
    }

    /// The step inputs `source` gives (device work only where it picks frames).
    pub(super) fn inputs_of(&self, source: StepSource, padded: StepPadding) -> Result<StepInputs> {
        match (source, &self.resident) {
            (StepSource::Batch(inputs), _) => Ok(inputs),
            (StepSource::Picks { table, values }, FramePlace::Device(store)) => {
                store.gather(&table, padded, self.dtype, &values)
            }
            (StepSource::Picks { .. }, _) => Err(Error::Train(
                "a step picks frames that are not on the device".into(),
            )),
        }
    }

    /// The captured step that runs a batch of `need`, captured (on the frames `idx`, as this
    /// rank's part) where none fits, or None where there is no room for another
    /// ([`MAX_GRAPHS`]). The smallest fitting graph is taken; a new one is for the exact atom
    /// count the first time, then (batches of this many structures come in several sizes) for
    /// the atoms rounded up to a multiple of [`BUCKET_ATOMS`], which later batches of other
    /// sizes share. The choice depends on `need` and the graphs captured only, so ranks given
    /// the same `need` make the same captures in the same order.
    pub(super) fn graph_for(
        &mut self,
        need: Need,
        idx: &[usize],
        norms: Norms,
        step: AdamWStep,
        ready: Option<&(Batch, NeighborList)>,
        clock: &mut dyn PhaseClock,
    ) -> Result<Option<usize>> {
        let fitting = self
            .step_graphs
            .iter()
            .enumerate()
            .filter(|(_, g)| g.fits(need))
            .min_by_key(|(_, g)| g.atoms());
        if let Some((k, _)) = fitting {
            return Ok(Some(k));
        }
        let mixed = self
            .step_graphs
            .iter()
            .any(|g| g.structures() == need.structures);
        let size = match mixed {
            false => need.atoms,
            true => need.atoms.next_multiple_of(BUCKET_ATOMS),
        };
        // A longer list than its size's graph holds replaces that graph.
        self.step_graphs
            .retain(|g| !g.same_atoms(size, need.structures));
        if self.step_graphs.len() >= MAX_GRAPHS {
            return Ok(None);
        }
        let padded = StepPadding {
            atoms: size,
            structures: need.structures,
            capacity: edge_capacity(need.edges * size / need.atoms.max(1)),
        };
        let source = self.source(idx, padded, norms, &step, ready, clock)?;
        clock.mark(Phase::Capture)?;
        let graph = self.capture_step(&source, padded, step)?;
        self.step_graphs.push(graph);
        Ok(Some(self.step_graphs.len() - 1))
    }

    /// `batch`'s inputs padded as `padded` says (the padding atoms isolated, far apart, in the
    /// first padding structure; edges beyond the cutoff), its loss averaged over `norms`.
    pub(super) fn step_inputs(
        &self,
        batch: &Batch,
        nl: &NeighborList,
        padded: StepPadding,
        norms: Norms,
        step: &AdamWStep,
    ) -> Result<StepInputs> {
        let (n, b, dev, dtype) = (
            batch.n_atoms(),
            batch.n_structures(),
            &self.device,
            self.dtype,
        );
        let (size, capacity) = (padded.atoms, padded.capacity);
        let pad = match size.checked_sub(n) {
            Some(pad) if padded.structures > b => pad,
            _ => {
                return Err(Error::Train(format!(
                    "a batch of {n} atoms in {b} structures given to a step of {size} in {}",
                    padded.structures
                )))
            }
        };
        let offsets = edge_offsets(batch, nl);
        let edges = HostEdges {
            centers: &nl.centers,
            neighbors: &nl.neighbors,
            offsets: &offsets,
        };
        let cutoff = self.calc.model().config().cutoff;
        let [centers, neighbors, offsets] =
            edge_tensors(edges, size, capacity, cutoff, dev, dtype)?;
        let mut positions: Vec<f64> = batch.positions().into_iter().flatten().collect();
        // Padding atoms beyond the cutoff of each other, far from the batch: no edges, no forces.
        let far = padding_offset(cutoff);
        positions.extend((0..pad).flat_map(|k| [1e4 + far * k as f64, 0.0, 0.0]));
        let mut species = self.calc.species_of(batch)?;
        species.resize(size, 0);
        let mut atom_structure = batch.atom_structure();
        atom_structure.resize(size, b as u32);
        let x = PainnInputs {
            species: Tensor::from_vec(species, size, dev)?,
            positions: Tensor::from_vec(positions, (size, 3), dev)?.to_dtype(dtype)?,
            centers,
            neighbors,
            offsets,
            atom_structure: Tensor::from_vec(atom_structure, size, dev)?,
            n_structures: padded.structures,
        };
        Ok(StepInputs {
            x,
            labels: Labels::packed(batch, Some(padded), norms, dev)?,
            values: step.values(dtype, dev)?,
        })
    }

    /// The fused step (loss, gradients, AdamW, EMA, the variables written) on `source`'s
    /// batch padded to `padded`, captured. The capture's two warm-up runs update the weights;
    /// they are put back, so the first replay takes the batch's step.
    fn capture_step(
        &self,
        source: &StepSource,
        padded: StepPadding,
        step: AdamWStep,
    ) -> Result<StepGraph> {
        let kept = self.opt.snapshot()?;
        let ema = self.ema.as_tensor().copy()?;
        let captured = StepGraph::capture(&self.device, Buffers::new(source)?, padded, |b| {
            let inputs = self.inputs_of(b.source(), padded)?;
            let (b_count, n) = (inputs.x.n_structures, inputs.x.species.dim(0)?);
            let labels = Labels::of(&inputs.labels, b_count, n, self.dtype)?;
            // The separate kernels at x, as `graph::ForceGraph` captures them.
            let (loss, named) = self.fused_device_step(&inputs.x, &labels, false)?;
            let g = self.flat_named(named)?;
            if let Some(c) = &self.collective {
                c.sum_in_place(&g)?;
            }
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
    pub(super) fn grad_store(&self, named: Vec<(String, Tensor)>) -> Result<GradStore> {
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::model::PainnConfig;
    use crate::train::{Dataset, TrainConfig};
    use candle_core::Device;

    /// A model small enough for the CPU's tests, of H, C and O.
    pub(in crate::train) fn small_config() -> PainnConfig {
        PainnConfig {
            hidden: 8,
            n_blocks: 2,
            n_rbf: 6,
            cutoff: 3.5,
            elements: vec![1, 6, 8],
        }
    }

    /// Three aspirins, moved and labelled differently.
    fn dataset() -> Dataset {
        let frames = (0..3)
            .map(|k| {
                let mut s = crate::systems::aspirin();
                for (i, x) in s.positions.iter_mut().enumerate() {
                    x[(i + k) % 3] += 0.05 * ((i * 7 + k) % 5) as f64 - 0.1;
                }
                s.energy = Some(-100.0 - k as f64);
                let n = s.len();
                s.forces = Some(
                    (0..n)
                        .map(|i| [0.1 * (i % 3) as f64, -0.2, k as f64])
                        .collect(),
                );
                s
            })
            .collect();
        Dataset::from_frames(std::path::Path::new("mem"), frames).unwrap()
    }

    /// A batch padded as a captured step runs it (isolated atoms in one more structure, an
    /// empty structure after it, edges beyond the cutoff) gives the loss and gradients of the
    /// batch itself.
    #[test]
    fn padded_steps_give_the_batch_loss_and_gradients() {
        let cfg = small_config();
        let ds = dataset();
        let tc = TrainConfig::default();
        let t = Trainer::new(&cfg, &tc, &ds, &ds, &Device::Cpu, DType::F64, None).unwrap();
        let (batch, nl) = Trainer::batch(&t.train, &[0, 2]).unwrap();
        let (n, b, norms) = (batch.n_atoms(), batch.n_structures(), Norms::of(&batch));
        let packed = Labels::packed(&batch, None, norms, &t.device).unwrap();
        let labels = Labels::of(&packed, b, n, DType::F64).unwrap();
        let (x, _) = t.calc.prepare_with(&batch, &nl).unwrap();
        let (loss, grads) = t.fused_device_step(&x, &labels, true).unwrap();
        let step = t.opt.next_step(1e-3, 10.0, 0.9);
        let padded = StepPadding {
            atoms: n + 7,
            structures: b + 2,
            capacity: nl.len() + 40,
        };
        let inputs = t.step_inputs(&batch, &nl, padded, norms, &step).unwrap();
        let labels = Labels::of(&inputs.labels, b + 2, n + 7, DType::F64).unwrap();
        let (padded_loss, padded) = t.fused_device_step(&inputs.x, &labels, false).unwrap();
        let (loss, padded_loss) = (
            loss.to_scalar::<f64>().unwrap(),
            padded_loss.to_scalar::<f64>().unwrap(),
        );
        assert!(loss > 0.0 && (loss - padded_loss).abs() <= 1e-12 * loss);
        for ((name, g), (_, p)) in grads.iter().zip(&padded) {
            let scale = g
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f64>()
                .unwrap();
            let diff = (g - p).unwrap().abs().unwrap().max_all().unwrap();
            let diff = diff.to_scalar::<f64>().unwrap();
            // Products over more (zero) rows round differently, and the directional seeds
            // ±c ~ 1/h amplify that: ~1e-10 of a gradient.
            assert!(diff <= 1e-9 * scale.max(1e-12), "{name}: {diff} of {scale}");
        }
        for (atoms, structures) in [(n - 1, b + 1), (n, b)] {
            let small = StepPadding {
                atoms,
                structures,
                capacity: nl.len(),
            };
            assert!(t.step_inputs(&batch, &nl, small, norms, &step).is_err());
        }
    }
}
