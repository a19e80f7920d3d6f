//! The loss of a batch and its gradients: the exact double-backward pass and the directional
//! pass of [`ForceGradient`] through autograd or, with a stress term, the fused kernels (the
//! fused one without stress is `fused_step`).

use super::force_gradient::{displacement_rms, step_along, ForceGradient};
use super::hessian::HessianLabels;
use super::labels::StressLabels;
use super::metrics::{stress_errors, HostErrors};
use super::trainer::{Ready, Trainer};
use crate::error::{Error, Result};
use crate::model::FusedPainn;
use crate::neighbors::NeighborList;
use crate::phase::{NoClock, Phase, PhaseClock};
use crate::stress::{strain_derivative_of_virials, strained, stress_volume, Matrix3};
use crate::structure::Batch;
use crate::structure::Structure;
use crate::train::TrainConfig;
use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor};

impl Trainer {
    /// Loss of training frames `idx` and its gradients with respect to every variable, the
    /// force term's by [`TrainConfig::force_gradient`](super::TrainConfig::force_gradient).
    pub fn loss_and_grads(&self, idx: &[usize]) -> Result<(f64, GradStore)> {
        self.loss_and_grads_phased(idx, &mut NoClock)
    }

    /// [`loss_and_grads`](Self::loss_and_grads) with its phases marked on `clock`.
    pub fn loss_and_grads_phased(
        &self,
        idx: &[usize],
        clock: &mut dyn PhaseClock,
    ) -> Result<(f64, GradStore)> {
        self.loss_and_grads_of(idx, None, clock)
    }

    /// [`loss_and_grads_phased`](Self::loss_and_grads_phased), on the frames' batch where it
    /// was assembled ahead.
    pub(super) fn loss_and_grads_of(
        &self,
        idx: &[usize],
        ready: Ready,
        clock: &mut dyn PhaseClock,
    ) -> Result<(f64, GradStore)> {
        clock.mark(Phase::Batch)?;
        let (batch, nl) = match ready {
            Some(ready) => ready,
            None => Self::batch(&self.train, idx)?,
        };
        let mode = self.cfg.gradient_mode(&self.device);
        let stress = self.cfg.stress_weight > 0.0;
        if mode == ForceGradient::Fused && !stress {
            return self.fused_loss_and_grads(&batch, &nl, clock);
        }
        if matches!(mode, ForceGradient::Directional | ForceGradient::Fused)
            && self.cfg.force_weight > 0.0
        {
            return self.directional_loss_and_grads(&batch, &nl, mode, clock);
        }
        clock.mark(Phase::Forward)?;
        // Forces come from a first backward pass whose graph is kept, so the force loss can
        // be differentiated again: that needs CANDLE_GRAD_DO_NOT_DETACH=1 in the environment
        // before the first backward on this thread (`mlff train` sets it).
        let loss = self.loss(&batch, &nl)?;
        let value = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        clock.mark(Phase::Backward)?;
        Ok((value, loss.backward()?))
    }

    /// [`ForceGradient::Directional`]: energies and forces at x by the fused kernels (no
    /// graph), then one forward and backward pass over the batch at x + h·u and x − h·u,
    /// u = F − F̂ (see `force_gradient`): their difference gives the force term's gradient,
    /// their mean the energy term's. With [`ForceGradient::Fused`] (a stress term: the copies
    /// strained on the host, which the device step does not do) the copies' weight gradients
    /// come from the fused kernels' adjoint instead of autograd.
    fn directional_loss_and_grads(
        &self,
        batch: &Batch,
        nl: &NeighborList,
        mode: ForceGradient,
        clock: &mut dyn PhaseClock,
    ) -> Result<(f64, GradStore)> {
        let model = self.calc.model();
        clock.mark(Phase::Upload)?;
        let (inputs, _) = self.calc.prepare_with(batch, nl)?;
        clock.mark(Phase::Forward)?;
        let fused = FusedPainn::new(model, self.calc.tuning())?.used_once(true);
        let b = batch.n_structures();
        let pass = fused.forward(&inputs)?;
        // With stress labels, each structure's strain direction (below) from its virial.
        let (forces, strains) = match self.cfg.stress_weight > 0.0 {
            true => {
                let (forces, virials) = pass.forces_and_virials()?;
                let de_deps = strain_derivative_of_virials(&virials, &inputs.atom_structure, b)?;
                (forces, strain_directions(batch, &de_deps, &self.cfg)?)
            }
            false => (pass.forces()?, (0..b).map(|_| None).collect()),
        };
        clock.mark(Phase::Download)?;
        let errors = HostErrors::of(batch, &pass.atom_energies, &forces)?;
        let errors = errors.with_stress_errors(strains.iter().flatten().map(|g| g.error));
        clock.mark(Phase::Batch)?;
        let h = step_along(&errors.forces, displacement_rms(self.dtype));
        let step = h.unwrap_or(0.0);
        // The batch at x + h·u and x − h·u (or at x alone when every force is exact), each
        // structure with stress labels also strained by ±h·γΔ.
        let signs: &[f64] = if h.is_some() { &[1.0, -1.0] } else { &[0.0] };
        let mut structures = Vec::with_capacity(signs.len() * b);
        for &sign in signs {
            for (k, s) in batch.structures.iter().enumerate() {
                let u = &errors.forces[batch.offsets[k]..batch.offsets[k + 1]];
                let mut moved = s.clone();
                for (x, u) in moved.positions.iter_mut().zip(u) {
                    for d in 0..3 {
                        x[d] += sign * step * u[d];
                    }
                }
                if let Some(g) = &strains[k] {
                    strain_by(&mut moved, &g.direction, sign * step);
                }
                structures.push(moved);
            }
        }
        // The copies keep x's neighbour list: they are ~1e-3 Å away, and a pair that crosses
        // the cutoff in between weighs ~1e-7 (the cosine cutoff and its slope vanish there).
        let copies = signs.len();
        let all = Batch::new(structures)?;
        let n = batch.n_atoms();
        let offsets: Vec<usize> = (0..copies).map(|c| c * n).collect();
        let all_nl = NeighborList::concat(vec![nl; copies].into_iter(), &offsets);
        clock.mark(Phase::Upload)?;
        let (all_inputs, _) = self.calc.prepare_with(&all, &all_nl)?;
        clock.mark(Phase::Forward)?;
        // Energy term: its gradient is 2 w_E mean(ΔE_k ∂E_k/∂θ / n_k²), ΔE_k the error at x,
        // with ∂E_k/∂θ taken as the mean of the copies' (equal to O(h²)).
        let weights: Vec<f64> = (0..b)
            .map(|k| {
                let n_k = batch.structures[k].len() as f64;
                2.0 * errors.energy[k] / (n_k * n_k * b as f64)
            })
            .collect();
        // The force term −(w_F / M h)(E(+) − E(−)) has this factor on each copy's energy.
        let m = 3.0 * batch.n_atoms() as f64;
        let c = h.map(|h| -self.cfg.force_weight / (m * h));
        if mode == ForceGradient::Fused {
            // d(surrogate)/dE of each copy's structure, every atom of it taking its seed.
            let c = c.unwrap_or(0.0);
            let mut seeds = Vec::with_capacity(copies * n);
            for &sign in signs {
                for (k, s) in batch.structures.iter().enumerate() {
                    let seed = self.cfg.energy_weight * weights[k] / copies as f64 + sign * c;
                    seeds.extend(std::iter::repeat_n(seed, s.len()));
                }
            }
            let seeds = Tensor::from_vec(seeds, copies * n, &self.device)?.to_dtype(self.dtype)?;
            let named = fused.weight_gradients(&all_inputs, &seeds)?;
            clock.mark(Phase::Backward)?;
            return Ok((errors.loss(&self.cfg, batch), self.grad_store(named)?));
        }
        let energies = model.energies(&all_inputs)?.reshape((copies, b))?;
        let dev = &self.device;
        let weights = Tensor::from_vec(weights, b, dev)?.to_dtype(self.dtype)?;
        let mean_energies = energies.mean(0)?;
        let mut surrogate = ((mean_energies * weights)?.sum_all()? * self.cfg.energy_weight)?;
        if let Some(c) = c {
            let along = (energies.get(0)? - energies.get(1)?)?.sum_all()?;
            surrogate = (surrogate + (along * c)?)?;
        }
        clock.mark(Phase::Backward)?;
        Ok((errors.loss(&self.cfg, batch), surrogate.backward()?))
    }

    /// The weighted loss as a tensor whose force and stress terms are differentiable (double
    /// backward).
    fn loss(&self, batch: &Batch, nl: &NeighborList) -> Result<Tensor> {
        let calc = &self.calc;
        let (inputs, positions) = calc.prepare_with(batch, nl)?;
        let dev = &self.device;
        let stress = StressLabels::of(batch, self.cfg.stress_weight, self.dtype, dev)?;
        // With stress labels the model sees the inputs under a zero strain, whose gradient is
        // the stress times the volume.
        let (strain, inputs) = match &stress {
            Some(_) => {
                let edge_structure = nl.edge_structures(&batch.offsets);
                let edge_structure = Tensor::from_vec(edge_structure, nl.len(), dev)?;
                let (strain, strained) = strained(&inputs, &edge_structure)?;
                (Some(strain), strained)
            }
            None => (None, inputs),
        };
        let energies = calc.model().energies(&inputs)?;
        let n_atoms: Vec<f64> = batch.structures.iter().map(|s| s.len() as f64).collect();
        let e_ref: Vec<f64> = batch
            .structures
            .iter()
            .map(|s| s.energy.unwrap_or(0.0))
            .collect();
        let b = batch.n_structures();
        let n_atoms = Tensor::from_vec(n_atoms, b, dev)?.to_dtype(self.dtype)?;
        let e_ref = Tensor::from_vec(e_ref, b, dev)?.to_dtype(self.dtype)?;
        let e_err = ((&energies - e_ref)? / n_atoms)?;
        let mut loss = (e_err.sqr()?.mean_all()? * self.cfg.energy_weight)?;
        let hessian = HessianLabels::of(batch, self.cfg.hessian_weight, self.dtype, dev)?;
        if let Some(labels) = &hessian {
            let term = labels.loss(calc, calc.model(), batch, nl, self.cfg.hessian_step)?;
            loss = (loss + (term * self.cfg.hessian_weight)?)?;
        }
        if self.cfg.force_weight == 0.0 && stress.is_none() {
            return Ok(loss);
        }
        let grads = energies.sum_all()?.backward()?;
        if let (Some(labels), Some(strain)) = (&stress, &strain) {
            let de_deps = grads
                .get(strain.as_tensor())
                .ok_or_else(|| Error::Train("the energy does not depend on the strain".into()))?;
            loss = (loss + (labels.loss(de_deps)? * self.cfg.stress_weight)?)?;
        }
        if self.cfg.force_weight > 0.0 {
            let x = positions.as_tensor();
            let forces = match grads.get(x) {
                Some(g) => g.neg()?,
                None => x.zeros_like()?,
            };
            if !nl.is_empty() && !forces.track_op() {
                return Err(Error::Train(
                    "forces were detached from the graph, so the force loss has no gradient: \
                     set CANDLE_GRAD_DO_NOT_DETACH=1 before the first backward pass"
                        .into(),
                ));
            }
            let f_ref: Vec<f64> = batch
                .structures
                .iter()
                .flat_map(|s| s.forces.iter().flatten().flatten().copied())
                .collect();
            let f_ref = Tensor::from_vec(f_ref, (batch.n_atoms(), 3), dev)?.to_dtype(self.dtype)?;
            let f_loss = (forces - f_ref)?.sqr()?.mean_all()?;
            loss = (loss + (f_loss * self.cfg.force_weight)?)?;
        }
        Ok(loss)
    }
}

/// A structure's stress error Δ = σ − σ̂ and the strain direction γΔ that, applied with the
/// force error's displacement, makes the copies' energy difference carry the stress term's
/// gradient too: the stress loss w_σ·Σ Δ²/(9L) over L labelled structures has the weights'
/// gradient (2 w_σ / 9L) Σ_k (1/V_k) ∂/∂θ (Δ_k : ∂E_k/∂ε), and Δ : ∂E/∂ε is E's derivative
/// along the strain Δ. With the force term's factor −w_F / (M h) on E(+) − E(−), the strain
/// of structure k is γ_k Δ_k with γ_k = −w_σ M / (9 L V_k w_F).
struct StrainDirection {
    error: Matrix3,
    direction: Matrix3,
}

/// [`StrainDirection`] of each structure of `batch` with a stress label, from ∂E/∂ε `de_deps`
/// ([S, 3, 3]).
fn strain_directions(
    batch: &Batch,
    de_deps: &Tensor,
    cfg: &TrainConfig,
) -> Result<Vec<Option<StrainDirection>>> {
    let errors = stress_errors(batch, de_deps)?;
    let labelled = errors.iter().flatten().count() as f64;
    let m = 3.0 * batch.n_atoms() as f64;
    (batch.structures.iter().zip(errors).enumerate())
        .map(|(k, (s, error))| match (error, stress_volume(s)) {
            (Some(error), Some(v)) => {
                let gamma = -cfg.stress_weight * m / (9.0 * labelled * v * cfg.force_weight);
                let direction = error.map(|row| row.map(|e| gamma * e));
                Ok(Some(StrainDirection { error, direction }))
            }
            (_, None) if s.info_value("stress").is_some() => Err(Error::Train(format!(
                "structure {k} of the batch has a stress label but no cell periodic along all \
                 three axes"
            ))),
            _ => Ok(None),
        })
        .collect()
}

/// `s` strained by t·ε (ε symmetric): positions and cell rows r → r (1 + t ε).
fn strain_by(s: &mut Structure, eps: &Matrix3, t: f64) {
    let apply = |r: &mut [f64; 3]| {
        let old = *r;
        for c in 0..3 {
            r[c] += t * (0..3).map(|a| old[a] * eps[a][c]).sum::<f64>();
        }
    };
    s.positions.iter_mut().for_each(apply);
    if let Some(cell) = s.cell.as_mut() {
        cell.iter_mut().for_each(apply);
    }
}
