//! One NPT step: the BAOAB Langevin step with the barostat's cell move folded into its two
//! drifts (positions and cell scale by √s each half, velocities by 1/√s, and the drift of the
//! positions is averaged over the scaling so that it stays time-reversible), then a force call
//! that also gives the stress the next move reads. Op by op on the provider's device, with a
//! few host reads a step (the kinetic tensor and the stress) that the barostat needs.

use super::barostat::{scale_cell, Barostat, Move, PressureInputs};
use super::forces::ForceProvider;
use super::integrator::{Integrator, State};
use crate::error::{Error, Result};
use crate::stress::Matrix3;
use crate::structure::volume;
use candle_core::Tensor;
use rand::Rng;
use rand_chacha::ChaCha20Rng;
use rand_distr::StandardNormal;
use serde::{Deserialize, Serialize};

/// The barostat's state between steps (stored in restart files): the cell, the stress at the
/// current positions, and the heat exchanged with the thermostat and barostat so far.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BarostatState {
    pub cell: Matrix3,
    pub stress: Matrix3,
    /// eV: E_kin + E_pot + P₀V + heat is the effective energy, constant up to the time
    /// step's error.
    pub heat: f64,
    /// The cell the neighbour list was built in (to rebuild it exactly on resume).
    #[serde(default)]
    pub list_cell: Option<Matrix3>,
}

/// An NPT run's barostat with its state, and what its steps need.
pub(super) struct Npt {
    pub barostat: Barostat,
    pub temperature: f64,
    pub state: BarostatState,
    /// Masses as an [N, 1] column.
    mass_column: Tensor,
    /// Σ m v_α² after the next step's first kick, read with the last step's other values
    /// (one host read a step the fewer).
    next_twice_kinetic: Option<[f64; 3]>,
}

impl Npt {
    pub fn new(
        barostat: Barostat,
        temperature: f64,
        state: BarostatState,
        mass_column: Tensor,
    ) -> Self {
        Self {
            barostat,
            temperature,
            state,
            mass_column,
            next_twice_kinetic: None,
        }
    }

    /// The cell's volume, Å³.
    pub fn volume(&self) -> f64 {
        volume(&self.state.cell).abs()
    }

    /// The effective energy (eV) with potential energy `e_pot` and kinetic energy `e_kin`.
    pub fn effective_energy(&self, e_pot: f64, e_kin: f64) -> f64 {
        e_pot + e_kin + self.barostat.pressure() * self.volume() + self.state.heat
    }

    /// Σ m v_α² per axis, on the device ([3]).
    fn twice_kinetic(&self, v: &Tensor) -> Result<Tensor> {
        Ok(v.sqr()?.broadcast_mul(&self.mass_column)?.sum(0)?)
    }

    /// Advances `state` by one step, the cell and stress with it (`forces` gets the new cell
    /// before its call). `rng` feeds the Langevin noise, then the barostat's four normals.
    pub fn step(
        &mut self,
        integrator: &Integrator,
        state: &mut State,
        forces: &mut impl ForceProvider,
        rng: &mut ChaCha20Rng,
    ) -> Result<()> {
        let dev = state.positions.device().clone();
        let n = state.positions.dim(0)?;
        let noise = integrator.draw_noise(n, rng);
        let xi: [f64; 4] = std::array::from_fn(|_| rng.sample(StandardNormal));
        let Some(noise) = noise else {
            return Err(Error::Md(
                "the barostat needs the Langevin thermostat".into(),
            ));
        };
        let noise = Tensor::from_vec(noise, (n, 3), &dev)?;
        let Some(langevin) = integrator.langevin(Some(&noise))? else {
            return Err(Error::Md(
                "the barostat needs the Langevin thermostat".into(),
            ));
        };
        let dt = integrator.dt();

        let v = integrator.kick(&state.velocities, &state.forces)?;
        let k = match self.next_twice_kinetic.take() {
            Some(k) => k,
            None => {
                let k = self.twice_kinetic(&v)?.to_vec1::<f64>()?;
                [k[0], k[1], k[2]]
            }
        };
        let before = PressureInputs {
            volume: self.volume(),
            twice_kinetic: k,
            stress: self.state.stress,
        };
        let mv: Move = self.barostat.propose(&before, self.temperature, dt, xi)?;
        // Half the move around each half drift: x ← m x + (m + 1/m)/2 · v dt/2, v ← v / m.
        let m: Vec<f64> = mv.scale.iter().map(|s| s.sqrt()).collect();
        let mix: Vec<f64> = m.iter().map(|m| 0.25 * dt * (m + 1.0 / m)).collect();
        let inv: Vec<f64> = m.iter().map(|m| 1.0 / m).collect();
        let row = |x: &[f64]| Tensor::from_slice(x, (1, 3), &dev);
        let (m, mix, inv) = (row(&m)?, row(&mix)?, row(&inv)?);
        let drift = |x: &Tensor, v: &Tensor| -> Result<(Tensor, Tensor)> {
            let x = (x.broadcast_mul(&m)? + v.broadcast_mul(&mix)?)?;
            Ok((x, v.broadcast_mul(&inv)?))
        };
        let (x, v) = drift(&state.positions, &v)?;
        let k_before = self.twice_kinetic(&v)?.sum_all()?;
        let v = ((&v * langevin.c1)? + langevin.xi.broadcast_mul(langevin.scale)?)?;
        let k_after = self.twice_kinetic(&v)?.sum_all()?;
        let (mut x, v) = drift(&x, &v)?;

        let cell = scale_cell(&self.state.cell, &mv.scale);
        forces.set_cells(&[cell])?;
        let (evaluation, stresses) = forces.evaluate_with_stress(&mut x)?;
        let Some(Some(stress)) = stresses.first().copied() else {
            return Err(Error::Md(
                "the force provider gave no stress: constant pressure needs one".into(),
            ));
        };
        // The next step's first kick is this step's last one again: its kinetic tensor comes
        // with this read.
        let v_end = integrator.kick(&v, &evaluation.forces)?;
        let v_next = integrator.kick(&v_end, &evaluation.forces)?;
        let reads = Tensor::cat(
            &[
                self.twice_kinetic(&v)?,
                k_before.reshape(1)?,
                k_after.reshape(1)?,
                self.twice_kinetic(&v_next)?,
            ],
            0,
        )?
        .to_vec1::<f64>()?;
        self.next_twice_kinetic = Some([reads[5], reads[6], reads[7]]);
        self.state.cell = cell;
        self.state.stress = stress;
        let after = PressureInputs {
            volume: self.volume(),
            twice_kinetic: [reads[0], reads[1], reads[2]],
            stress,
        };
        let thermostat_heat = 0.5 * (reads[3] - reads[4]);
        self.state.heat +=
            thermostat_heat + mv.finish(&self.barostat, &after, self.temperature, dt);
        state.velocities = v_end;
        state.positions = x;
        state.forces = evaluation.forces;
        state.energy = evaluation.energy;
        state.step += 1;
        Ok(())
    }
}
