//! Errors of predictions against labels: the loss on the host and the validation metrics.

use super::config::TrainConfig;
use super::hessian::{hessian_vector_products, hvp_label};
use super::trainer::Trainer;
use crate::calculator::{atom_energies_and_forces, PainnCalculator};
use crate::error::{Error, Result};
use crate::eval::stress_label;
use crate::model::Backend;
use crate::profiler::NoClock;
use crate::stress::{strain_derivative_of_virials, stresses_of, Matrix3};
use crate::structure::Batch;
use candle_core::{DType, Tensor};
use serde::Serialize;

/// Energy and force errors of one evaluation.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Metrics {
    pub loss: f64,
    pub energy_mae: f64,
    pub energy_per_atom_mae: f64,
    pub force_mae: f64,
    /// Mean absolute stress-component error (eV/Å³) over the frames with stress labels, where
    /// the loss has a stress term.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stress_mae: Option<f64>,
    /// Mean absolute Hessian-vector-product component error (eV/Å²) over the frames with `hvp`
    /// labels, where the loss has that term.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hvp_mae: Option<f64>,
    pub frames: usize,
}

/// Errors of one prediction of a batch against its labels, on the host in f64.
pub(super) struct HostErrors {
    /// Energy error of each structure (eV; atom energies summed in f64).
    pub(super) energy: Vec<f64>,
    /// Force error of each atom (eV/Å).
    pub(super) forces: Vec<[f64; 3]>,
    /// Stress error of each structure with a stress label (eV/Å³), where asked for.
    pub(super) stress: Vec<Matrix3>,
    /// H·v error of each atom of the frames with `hvp` labels (eV/Å²), where asked for.
    pub(super) hvp: Vec<[f64; 3]>,
}

impl HostErrors {
    pub(super) fn of(batch: &Batch, atom_energies: &Tensor, forces: &Tensor) -> Result<Self> {
        let atom_e = atom_energies.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        let f = forces.to_dtype(DType::F64)?.to_vec2::<f64>()?;
        let mut out = Self {
            energy: Vec::with_capacity(batch.n_structures()),
            forces: Vec::with_capacity(batch.n_atoms()),
            stress: Vec::new(),
            hvp: Vec::new(),
        };
        for (k, s) in batch.structures.iter().enumerate() {
            let atoms = batch.offsets[k]..batch.offsets[k + 1];
            let e: f64 = atom_e[atoms.clone()].iter().sum();
            out.energy.push(e - s.energy.unwrap_or(0.0));
            for (fr, fp) in s.forces.iter().flatten().zip(&f[atoms]) {
                out.forces
                    .push([fp[0] - fr[0], fp[1] - fr[1], fp[2] - fr[2]]);
            }
        }
        Ok(out)
    }

    /// The training loss: w_E · mean((ΔE / n_atoms)²) + w_F · mean(ΔF²) over components.
    pub(super) fn loss(&self, cfg: &TrainConfig, batch: &Batch) -> f64 {
        let per_atom = self
            .energy
            .iter()
            .zip(&batch.structures)
            .map(|(de, s)| (de / s.len() as f64).powi(2));
        let mut loss = cfg.energy_weight * per_atom.sum::<f64>() / self.energy.len().max(1) as f64;
        if cfg.force_weight > 0.0 {
            let sq = self.forces.iter().flatten().map(|c| c * c).sum::<f64>();
            loss += cfg.force_weight * sq / (3 * self.forces.len()).max(1) as f64;
        }
        if cfg.stress_weight > 0.0 && !self.stress.is_empty() {
            let sq = self
                .stress
                .iter()
                .flatten()
                .flatten()
                .map(|c| c * c)
                .sum::<f64>();
            loss += cfg.stress_weight * sq / (9 * self.stress.len()) as f64;
        }
        if cfg.hessian_weight > 0.0 && !self.hvp.is_empty() {
            let sq = self.hvp.iter().flatten().map(|c| c * c).sum::<f64>();
            loss += cfg.hessian_weight * sq / (3 * self.hvp.len()) as f64;
        }
        loss
    }

    /// The H·v errors of the frames of `batch` with labels, the student's by `calc`.
    pub(super) fn with_hvp(
        mut self,
        batch: &Batch,
        calc: &PainnCalculator,
        h: f64,
    ) -> Result<Self> {
        let (mut frames, mut directions, mut labels) = (Vec::new(), Vec::new(), Vec::new());
        for (k, s) in batch.structures.iter().enumerate() {
            let label = hvp_label(s)
                .map_err(|e| Error::Train(format!("structure {k} of the batch: {e}")))?;
            if let Some((v, hv)) = label {
                frames.push(s.clone());
                directions.push(v);
                labels.push(hv);
            }
        }
        if frames.is_empty() {
            return Ok(self);
        }
        let predicted = hessian_vector_products(calc, &frames, &directions, h)?;
        for (p, l) in predicted.iter().zip(&labels) {
            for (a, b) in p.iter().zip(l) {
                self.hvp.push(std::array::from_fn(|d| a[d] - b[d]));
            }
        }
        Ok(self)
    }

    /// These errors with `errors` as the labelled structures' stress errors (σ − σ̂).
    pub(super) fn with_stress_errors(mut self, errors: impl IntoIterator<Item = Matrix3>) -> Self {
        self.stress.extend(errors);
        self
    }

    /// The stress errors of the structures of `batch` with labels, from the strain derivative
    /// `de_deps` ([S, 3, 3]).
    pub(super) fn with_stress(self, batch: &Batch, de_deps: &Tensor) -> Result<Self> {
        let errors = stress_errors(batch, de_deps)?;
        Ok(self.with_stress_errors(errors.into_iter().flatten()))
    }
}

/// Each structure's stress error σ − σ̂, σ from the strain derivative `de_deps` ([S, 3, 3]):
/// None without a label or without a cell periodic along all three axes; an error naming a
/// structure whose label cannot be read.
pub(super) fn stress_errors(batch: &Batch, de_deps: &Tensor) -> Result<Vec<Option<Matrix3>>> {
    let predicted = stresses_of(&batch.structures, de_deps)?;
    (batch.structures.iter().zip(predicted).enumerate())
        .map(|(k, (s, p))| {
            let label = stress_label(s)
                .map_err(|e| Error::Train(format!("structure {k} of the batch: {e}")))?;
            Ok(label
                .zip(p)
                .map(|(l, p)| std::array::from_fn(|a| std::array::from_fn(|b| p[a][b] - l[a][b]))))
        })
        .collect()
}

impl Trainer {
    /// Loss and errors of the EMA model on the validation frames.
    pub fn validate(&self) -> Result<Metrics> {
        // The fused kernels' energies and forces (inference: no graph), totals summed in f64.
        let calc = PainnCalculator::new(self.ema_model()?, self.device.clone(), self.dtype)
            .with_backend(Backend::Fused);
        let mut m = Metrics::default();
        let idx: Vec<usize> = (0..self.val.len()).collect();
        let (mut n_f, mut loss_sum) = (0usize, 0.0);
        let (mut stress_sum, mut n_s) = (0.0, 0usize);
        let (mut hvp_sum, mut n_h) = (0.0, 0usize);
        for chunk in idx.chunks(self.cfg.batch_size.max(32)) {
            let (batch, nl) = Self::batch(&self.val, chunk)?;
            let (inputs, positions) = calc.prepare_with(&batch, &nl)?;
            let errors = match self.cfg.stress_weight > 0.0 {
                // The fused kernels' forces and virials in one call.
                true => {
                    let pass = calc.fused()?.forward(&inputs)?;
                    let (forces, virials) = pass.forces_and_virials()?;
                    let s = batch.n_structures();
                    let de_deps =
                        strain_derivative_of_virials(&virials, &inputs.atom_structure, s)?;
                    HostErrors::of(&batch, &pass.atom_energies, &forces)?
                        .with_stress(&batch, &de_deps)?
                }
                false => {
                    let (atom_e, f) =
                        atom_energies_and_forces(&calc, &inputs, &positions, &mut NoClock)?;
                    HostErrors::of(&batch, &atom_e, &f)?
                }
            };
            let errors = match self.cfg.hessian_weight > 0.0 {
                true => errors.with_hvp(&batch, &calc, self.cfg.hessian_step)?,
                false => errors,
            };
            hvp_sum += errors.hvp.iter().flatten().map(|c| c.abs()).sum::<f64>();
            n_h += 3 * errors.hvp.len();
            stress_sum += errors
                .stress
                .iter()
                .flatten()
                .flatten()
                .map(|c| c.abs())
                .sum::<f64>();
            n_s += 9 * errors.stress.len();
            for (de, s) in errors.energy.iter().zip(&batch.structures) {
                m.energy_mae += de.abs();
                m.energy_per_atom_mae += de.abs() / s.len() as f64;
            }
            m.force_mae += errors.forces.iter().flatten().map(|c| c.abs()).sum::<f64>();
            n_f += 3 * errors.forces.len();
            loss_sum += errors.loss(&self.cfg, &batch) * chunk.len() as f64;
        }
        let n = self.val.len().max(1) as f64;
        m.frames = self.val.len();
        m.loss = loss_sum / n;
        m.energy_mae /= n;
        m.energy_per_atom_mae /= n;
        m.force_mae /= n_f.max(1) as f64;
        m.stress_mae = (n_s > 0).then(|| stress_sum / n_s as f64);
        m.hvp_mae = (n_h > 0).then(|| hvp_sum / n_h as f64);
        Ok(m)
    }
}
