//! [`ForceGradient::Fused`](super::ForceGradient::Fused): a batch's loss and weight gradients
//! on the device, with no autograd graph and one read back (the loss).
//!
//! The batch and its labels go up once. The fused kernels give energies and forces at x; the
//! errors, the loss, the step h along u = F − F̂ (`force_gradient`), the displaced copies at
//! x ± h·u and each atom's seed d(surrogate)/dEᵢ are then device tensors, so nothing waits for
//! the host until the loss is read. `FusedPainn::weight_gradients` over the copies gives the
//! gradients: the force term's from their difference, the energy term's from their mean.

use super::force_gradient::displacement_rms;
use super::trainer::Trainer;
use crate::error::{Error, Result};
use crate::model::{FusedPainn, PainnInputs};
use crate::neighbors::NeighborList;
use crate::ops::scatter_add;
use crate::phase::{Phase, PhaseClock};
use crate::structure::Batch;
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};

/// A batch's labels on the device: reference energies and 1 / atoms per structure (f64),
/// reference forces [N, 3] (the model's dtype).
struct Labels {
    energy: Tensor,
    inv_atoms: Tensor,
    forces: Tensor,
}

impl Labels {
    /// In one upload.
    fn of(batch: &Batch, dtype: DType, dev: &Device) -> Result<Self> {
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
        let all = Tensor::from_vec(host, 2 * b + 3 * n, dev)?;
        Ok(Self {
            energy: all.narrow(0, 0, b)?,
            inv_atoms: all.narrow(0, b, b)?,
            forces: all
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
        let (dev, dtype, cfg) = (&self.device, self.dtype, &self.cfg);
        clock.mark(Phase::Upload)?;
        let (x, _) = self.calc.prepare_with(batch, nl)?;
        let labels = Labels::of(batch, dtype, dev)?;
        clock.mark(Phase::Forward)?;
        let fused = FusedPainn::new(self.calc.model(), self.calc.tuning())?.used_once(true);
        let (atom_energies, forces) = fused.energies_and_forces(&x)?;
        let (b, m) = (batch.n_structures(), 3.0 * batch.n_atoms() as f64);
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
                let u_rms = (u_sq / m)?.sqrt()?.maximum(1e-30)?;
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
        let all = copies_of(&x, positions, copies)?;
        let seeds = seeds
            .index_select(&all.atom_structure, 0)?
            .to_dtype(dtype)?;
        let named = fused.weight_gradients(&all, &seeds)?;
        let grads = self.grad_store(named)?;
        clock.mark(Phase::Download)?;
        let loss = loss.to_scalar::<f64>()?;
        Ok((loss, grads))
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
