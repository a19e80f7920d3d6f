//! How to train: the settings saved with every checkpoint, their defaults and their checks.

use super::force_gradient::ForceGradient;
use super::schedule::Schedule;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// How to train (saved with every checkpoint's provenance).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    pub epochs: usize,
    pub batch_size: usize,
    pub lr: f64,
    pub lr_min: f64,
    pub warmup_steps: u64,
    pub schedule: Schedule,
    pub weight_decay: f64,
    /// Weight of the mean squared energy-per-atom error (eV²).
    pub energy_weight: f64,
    /// Weight of the mean squared force-component error ((eV/Å)²).
    pub force_weight: f64,
    /// Weight of the mean squared stress-component error ((eV/Å³)², ASE's stress) over the
    /// frames with `stress` labels (cells periodic along all three axes). Needs a force weight
    /// with the fused (`auto`'s pick) or directional force gradient, or the double backward.
    pub stress_weight: f64,
    /// Weight of the mean squared Hessian-vector-product error ((eV/Å²)²) over the frames with
    /// `hvp` labels (`teachers/label.py --hessian-vectors`); needs the double backward (which
    /// `auto` then picks).
    pub hessian_weight: f64,
    /// Step (Å) of the central differences of the student's forces that give its H·v.
    pub hessian_step: f64,
    /// Clip the global gradient norm to this (0: no clipping).
    pub clip_grad_norm: f64,
    /// Decay of the exponential moving average of the weights (0: none).
    pub ema_decay: f64,
    pub seed: u64,
    /// How the force loss is differentiated with respect to the weights.
    pub force_gradient: ForceGradient,
    /// Stop after this many epochs in a row without a better validation loss (0: never; the
    /// count starts again when a run is resumed).
    pub patience: usize,
    /// Epochs between validations, each with the checkpoints, the training state and a log
    /// line (the last epoch, and one that hits a time limit, always validate): on small sets
    /// these cost more than the epoch itself.
    pub val_every: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 100,
            batch_size: 16,
            lr: 1e-3,
            lr_min: 1e-5,
            warmup_steps: 100,
            schedule: Schedule::Cosine,
            weight_decay: 0.0,
            energy_weight: 1.0,
            force_weight: 100.0,
            stress_weight: 0.0,
            hessian_weight: 0.0,
            hessian_step: 5e-3,
            clip_grad_norm: 10.0,
            ema_decay: 0.99,
            seed: 0,
            force_gradient: ForceGradient::default(),
            patience: 0,
            val_every: 1,
        }
    }
}

impl TrainConfig {
    /// How the loss is differentiated on `device`: `force_gradient`, with `auto` the fused
    /// gradient, also with a stress term (its copies strained along the stress error: faster
    /// and smaller than the double backward, BENCHMARKS.md, "Training throughput"), unless the
    /// loss has no force term to scale the strain by or has an H·v term, which only the double
    /// backward differentiates.
    pub fn gradient_mode(&self, device: &candle_core::Device) -> ForceGradient {
        match (self.force_gradient, self.needs_second_order()) {
            (ForceGradient::Auto, true)
                if self.hessian_weight == 0.0 && self.force_weight > 0.0 =>
            {
                ForceGradient::Fused
            }
            (ForceGradient::Auto, true) => ForceGradient::DoubleBackward,
            (mode, _) => mode.on(device),
        }
    }

    /// Whether the loss has a term beyond energies and forces (stress, H·v).
    pub fn needs_second_order(&self) -> bool {
        self.stress_weight > 0.0 || self.hessian_weight > 0.0
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::Train(m.to_string()));
        if self.epochs == 0 {
            return bad(
                "epochs must be at least 1 (0 would train nothing and write no checkpoint)",
            );
        }
        if self.val_every == 0 {
            return bad("val_every must be at least 1");
        }
        if self.batch_size == 0 {
            return bad("batch_size must be at least 1");
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) || self.lr_min < 0.0 {
            return bad("lr must be positive and lr_min non-negative");
        }
        if [
            self.energy_weight,
            self.force_weight,
            self.stress_weight,
            self.hessian_weight,
        ]
        .iter()
        .any(|w| !(w.is_finite() && *w >= 0.0))
        {
            return bad("loss weights must be non-negative");
        }
        // The directional and fused gradients carry the stress term along a strain (with a
        // force term to scale it by); neither has an H·v term.
        let directional_stress = matches!(
            self.force_gradient,
            ForceGradient::Directional | ForceGradient::Fused
        ) && self.force_weight > 0.0;
        for (name, w, directional) in [
            ("stress_weight", self.stress_weight, directional_stress),
            ("hessian_weight", self.hessian_weight, false),
        ] {
            if w > 0.0
                && !directional
                && !matches!(
                    self.force_gradient,
                    ForceGradient::Auto | ForceGradient::DoubleBackward
                )
            {
                return bad(&format!(
                    "{name} needs force_gradient double-backward (or auto{}), not {}: the \
                     gradient has no such term yet",
                    if name == "stress_weight" {
                        ", or directional or fused with a force weight"
                    } else {
                        ""
                    },
                    self.force_gradient.name()
                ));
            }
        }
        if !(self.hessian_step.is_finite() && self.hessian_step > 0.0) {
            return bad("hessian_step must be a positive number of Å");
        }
        if self.energy_weight + self.force_weight == 0.0 {
            return bad("energy_weight and force_weight are both 0: nothing to fit");
        }
        if !(0.0..1.0).contains(&self.ema_decay) {
            return bad("ema_decay must be in [0, 1)");
        }
        Ok(())
    }
}
