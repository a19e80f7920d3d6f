//! Learning-rate schedules: linear warm-up then cosine decay, or reduce-on-plateau.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Schedule {
    /// Linear warm-up over `warmup` steps, then cosine decay to `lr_min` at the last step.
    Cosine,
    /// Warm-up, then multiply by `factor` after `patience` validations without improvement.
    Plateau { factor: f64, patience: usize },
}

/// The learning rate as training goes, given the base rate and the run's length.
#[derive(Clone, Debug)]
pub struct LrSchedule {
    pub kind: Schedule,
    pub lr: f64,
    pub lr_min: f64,
    pub warmup: u64,
    pub total: u64,
    /// Plateau state: current factor, best validation loss, validations since it improved.
    pub plateau_scale: f64,
    best: f64,
    stale: usize,
}

impl LrSchedule {
    pub fn new(kind: Schedule, lr: f64, lr_min: f64, warmup: u64, total: u64) -> Self {
        Self {
            kind,
            lr,
            lr_min,
            warmup,
            total: total.max(1),
            plateau_scale: 1.0,
            best: f64::INFINITY,
            stale: 0,
        }
    }

    /// Learning rate for optimiser step `step` (counting from 1).
    pub fn at(&self, step: u64) -> f64 {
        if step <= self.warmup {
            return self.lr * step as f64 / self.warmup.max(1) as f64;
        }
        match self.kind {
            Schedule::Cosine => {
                let span = (self.total.saturating_sub(self.warmup)).max(1) as f64;
                let p = ((step - self.warmup) as f64 / span).min(1.0);
                self.lr_min
                    + 0.5 * (self.lr - self.lr_min) * (1.0 + (std::f64::consts::PI * p).cos())
            }
            Schedule::Plateau { .. } => (self.lr * self.plateau_scale).max(self.lr_min),
        }
    }

    /// Feeds a validation loss (plateau schedule only).
    pub fn observe(&mut self, val_loss: f64) {
        if let Schedule::Plateau { factor, patience } = self.kind {
            if val_loss < self.best * (1.0 - 1e-4) {
                self.best = val_loss;
                self.stale = 0;
            } else {
                self.stale += 1;
                if self.stale > patience {
                    self.plateau_scale *= factor;
                    self.stale = 0;
                }
            }
        }
    }
}
