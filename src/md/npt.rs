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

impl BarostatState {
    /// The cell's volume, Å³.
    pub fn volume(&self) -> f64 {
        volume(&self.cell).abs()
    }

    /// The effective energy (eV) with potential energy `e_pot` and kinetic energy `e_kin`.
    pub fn effective_energy(&self, barostat: &Barostat, e_pot: f64, e_kin: f64) -> f64 {
        e_pot + e_kin + barostat.pressure() * self.volume() + self.heat
    }

    /// Ends a step whose move was `mv`: the new cell and the stress there, and the heat that
    /// the thermostat (Σ m v² before and after its O step, `k_before`, `k_after`) and the
    /// barostat exchanged; `twice_kinetic` is Σ m v_α² at the step's end.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn commit(
        &mut self,
        barostat: &Barostat,
        temperature: f64,
        dt: f64,
        mv: &Move,
        cell: Matrix3,
        stress: Matrix3,
        twice_kinetic: [f64; 3],
        (k_before, k_after): (f64, f64),
    ) {
        self.cell = cell;
        self.stress = stress;
        let after = PressureInputs {
            volume: self.volume(),
            twice_kinetic,
            stress,
        };
        let thermostat_heat = 0.5 * (k_before - k_after);
        self.heat += thermostat_heat + mv.finish(barostat, &after, temperature, dt);
    }
}

/// Half of the move `scale` around each half drift (x ← m x + (m + 1/m)/2 · v dt/2, v ← v / m):
/// per axis m = √s, the drift's mixing factor and 1 / m.
pub(super) fn half_move(scale: &[f64; 3], dt: f64) -> [[f64; 3]; 3] {
    let m: [f64; 3] = std::array::from_fn(|a| scale[a].sqrt());
    let mix = m.map(|m| 0.25 * dt * (m + 1.0 / m));
    let inv = m.map(|m| 1.0 / m);
    [m, mix, inv]
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
        self.state.volume()
    }

    /// The effective energy (eV) with potential energy `e_pot` and kinetic energy `e_kin`.
    pub fn effective_energy(&self, e_pot: f64, e_kin: f64) -> f64 {
        self.state.effective_energy(&self.barostat, e_pot, e_kin)
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
        let [m, mix, inv] = half_move(&mv.scale, dt);
        let row = |x: &[f64; 3]| Tensor::from_slice(x, (1, 3), &dev);
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
        let (b, t) = (&self.barostat, self.temperature);
        let k = [reads[0], reads[1], reads[2]];
        (self.state).commit(b, t, dt, &mv, cell, stress, k, (reads[3], reads[4]));
        state.velocities = v_end;
        state.positions = x;
        state.forces = evaluation.forces;
        state.energy = evaluation.energy;
        state.step += 1;
        Ok(())
    }
}
