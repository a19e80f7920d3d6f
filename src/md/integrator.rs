//! Velocity Verlet (NVE) and BAOAB Langevin (NVT, Leimkuhler & Matthews 2013), as tensor
//! updates on the force provider's device. Langevin noise comes from a seeded ChaCha stream on
//! the host (3N normals a step), so runs are reproducible and restartable on any device.

use super::forces::{Evaluation, ForceProvider};
use crate::error::{Error, Result};
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
pub struct State {
    pub positions: Tensor,
    pub velocities: Tensor,
    pub forces: Tensor,
    pub energy: Tensor,
    pub step: u64,
}

/// One step's worth of constants for a system of given masses.
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

    /// Advances `state` by one step (one force evaluation). `rng` feeds the Langevin noise.
    pub fn step(
        &self,
        state: &mut State,
        forces: &mut impl ForceProvider,
        rng: &mut ChaCha20Rng,
    ) -> Result<()> {
        let kick = |v: &Tensor, f: &Tensor| -> Result<Tensor> {
            Ok((v + f.broadcast_mul(&self.half_kick)?)?)
        };
        let mut v = kick(&state.velocities, &state.forces)?;
        let mut x = match &self.noise_scale {
            None => (&state.positions + (&v * self.dt)?)?,
            Some(scale) => {
                let half = 0.5 * self.dt;
                let x = (&state.positions + (&v * half)?)?;
                let n = v.dim(0)?;
                let xi: Vec<f64> = (0..3 * n).map(|_| rng.sample(StandardNormal)).collect();
                let xi = Tensor::from_vec(xi, (n, 3), v.device())?;
                v = ((&v * self.c1)? + xi.broadcast_mul(scale)?)?;
                (x + (&v * half)?)?
            }
        };
        let Evaluation { energy, forces: f } = forces.evaluate(&mut x)?;
        state.velocities = kick(&v, &f)?;
        state.positions = x;
        state.forces = f;
        state.energy = energy;
        state.step += 1;
        Ok(())
    }
}
