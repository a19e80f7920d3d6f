//! Velocity Verlet (NVE) and BAOAB Langevin (NVT, Leimkuhler & Matthews 2013), as tensor
//! updates on the force provider's device. Langevin noise comes from a seeded ChaCha stream on
//! the host (3N normals a step), so runs are reproducible and restartable on any device.
//! The step that drives a force provider is in `step`, so that this module (which a provider's
//! whole-step path names) depends on no provider.

use crate::error::{Error, Result};
use crate::ops::{md_advance, md_kick, LangevinNoise};
use crate::units::{FS, KB, PS};
use candle_core::{Device, Tensor};
use rand::Rng;
use rand_chacha::ChaCha20Rng;
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};

/// Which equations of motion.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Ensemble {
    /// Velocity Verlet: constant energy.
    Nve,
    /// BAOAB Langevin thermostat at `temperature` K with `friction` in 1/ps.
    Nvt { temperature: f64, friction: f64 },
}

impl Ensemble {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Nve => "nve",
            Self::Nvt { .. } => "nvt",
        }
    }

    /// Checks the thermostat settings.
    pub fn validate(&self) -> Result<()> {
        if let Self::Nvt {
            temperature,
            friction,
        } = *self
        {
            if !(temperature.is_finite() && temperature >= 0.0) {
                return Err(Error::Md(format!(
                    "temperature must be finite and >= 0 K, got {temperature}"
                )));
            }
            if !(friction.is_finite() && friction > 0.0) {
                return Err(Error::Md(format!(
                    "Langevin friction must be finite and > 0 (1/ps), got {friction}"
                )));
            }
        }
        Ok(())
    }
}

/// The dynamical state, on the force provider's device: [N, 3] f64 positions (Å), velocities
/// (Å per ASE time unit) and forces (eV/Å), the scalar potential energy (eV), and the step.
/// A clone shares the tensors, which steps replace rather than change: it is a snapshot.
#[derive(Clone)]
pub struct State {
    pub positions: Tensor,
    pub velocities: Tensor,
    pub forces: Tensor,
    pub energy: Tensor,
    pub step: u64,
}

/// The step after the one asked for, where the caller asks for it straight after without
/// looking at the state in between: its Langevin noise (none for NVE). A provider may queue
/// it early ([`ForceProvider::step_captured`](super::ForceProvider::step_captured)).
#[derive(Clone, Copy, Debug)]
pub struct NextStep<'a> {
    pub noise: Option<&'a [f64]>,
}

impl<'a> NextStep<'a> {
    /// The next step with the noise drawn for it.
    pub fn of(noise: &'a Option<Vec<f64>>) -> Self {
        Self {
            noise: noise.as_deref(),
        }
    }
}

/// One step's worth of constants for a system of given masses.
#[derive(Clone)]
pub struct Integrator {
    ensemble: Ensemble,
    dt: f64,
    /// dt / (2 m), [N, 1]: the B (kick) half step is v += f · half_kick.
    half_kick: Tensor,
    /// Langevin O step: v ← c1 v + sqrt(1 - c1²) sqrt(kT/m) ξ.
    c1: f64,
    noise_scale: Option<Tensor>,
}

impl Integrator {
    /// `dt_fs` in femtoseconds; `masses` in amu.
    pub fn new(ensemble: Ensemble, dt_fs: f64, masses: &[f64], device: &Device) -> Result<Self> {
        ensemble.validate()?;
        if !(dt_fs.is_finite() && dt_fs > 0.0) {
            return Err(Error::Md(format!(
                "time step must be finite and > 0 fs, got {dt_fs}"
            )));
        }
        let dt = dt_fs * FS;
        let n = masses.len();
        let column = |f: &dyn Fn(f64) -> f64| -> Result<Tensor> {
            Ok(Tensor::from_vec(
                masses.iter().map(|&m| f(m)).collect::<Vec<f64>>(),
                (n, 1),
                device,
            )?)
        };
        let half_kick = column(&|m| 0.5 * dt / m)?;
        let (c1, noise_scale) = match ensemble {
            Ensemble::Nve => (1.0, None),
            Ensemble::Nvt {
                temperature,
                friction,
            } => {
                let c1 = (-friction / PS * dt).exp();
                let c2 = (1.0 - c1 * c1).sqrt();
                (c1, Some(column(&|m| c2 * (KB * temperature / m).sqrt())?))
            }
        };
        Ok(Self {
            ensemble,
            dt,
            half_kick,
            c1,
            noise_scale,
        })
    }

    pub fn ensemble(&self) -> Ensemble {
        self.ensemble
    }

    /// Time step in ASE time units.
    pub fn dt(&self) -> f64 {
        self.dt
    }

    /// One step's Langevin noise, 3N standard normals from `rng` (none for NVE).
    pub fn draw_noise(&self, atoms: usize, rng: &mut ChaCha20Rng) -> Option<Vec<f64>> {
        self.noise_scale
            .as_ref()
            .map(|_| (0..3 * atoms).map(|_| rng.sample(StandardNormal)).collect())
    }

    /// dt / 2m per atom, [N, 1].
    pub fn half_kick(&self) -> &Tensor {
        &self.half_kick
    }

    /// The Langevin O step with standard normals `xi` ([N, 3]); none for NVE.
    pub fn langevin<'a>(&'a self, xi: Option<&'a Tensor>) -> Result<Option<LangevinNoise<'a>>> {
        match (&self.noise_scale, xi) {
            (None, _) => Ok(None),
            (Some(scale), Some(xi)) => Ok(Some(LangevinNoise {
                xi,
                scale,
                c1: self.c1,
            })),
            (Some(_), None) => Err(Error::Md("a Langevin step needs its noise".into())),
        }
    }

    /// The B half step: v + f dt / 2m.
    pub fn kick(&self, v: &Tensor, f: &Tensor) -> Result<Tensor> {
        Ok(md_kick(v, f, &self.half_kick)?)
    }

    /// The step up to the force call: a kick with the current forces `f`, then the drift
    /// (NVE) or A O A with `noise` ([N, 3] standard normals, from
    /// [`draw_noise`](Self::draw_noise)). Returns the new positions and velocities.
    pub fn advance(
        &self,
        x: &Tensor,
        v: &Tensor,
        f: &Tensor,
        noise: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        let noise = self.langevin(noise)?;
        Ok(md_advance(x, v, f, &self.half_kick, self.dt, noise)?)
    }
}
