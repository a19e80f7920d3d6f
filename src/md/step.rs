//! One MD step: the integrator's update around a force provider's evaluation, or the
//! provider's own whole step where it has one. Its own module (an `impl Integrator` block) so
//! that `integrator` depends on no provider while `forces` names the integrator.

use super::forces::{Evaluation, ForceProvider};
use super::integrator::{Integrator, NextStep, State};
use crate::error::Result;
use crate::stress::Matrix3;
use candle_core::Tensor;
use rand_chacha::ChaCha20Rng;

impl Integrator {
    /// Advances `state` by one step (one force evaluation). `rng` feeds the Langevin noise.
    /// A provider that captured the whole step as a CUDA graph runs it
    /// ([`ForceProvider::step_captured`]); otherwise, or when it declines, the step runs op by op.
    pub fn step(
        &self,
        state: &mut State,
        forces: &mut impl ForceProvider,
        rng: &mut ChaCha20Rng,
    ) -> Result<()> {
        let noise = self.draw_noise(state.positions.dim(0)?, rng);
        self.step_with_noise(state, forces, noise.as_deref())
    }

    /// [`step`](Self::step) with this step's Langevin noise given (3N standard normals; none
    /// for NVE): a batch of systems draws each system's from its own stream.
    pub fn step_with_noise(
        &self,
        state: &mut State,
        forces: &mut impl ForceProvider,
        noise: Option<&[f64]>,
    ) -> Result<()> {
        self.step_before(state, forces, noise, None)
    }

    /// [`step_with_noise`](Self::step_with_noise), where the caller runs `next` straight after
    /// it: a provider that replays whole steps may queue that one before it reads this one's
    /// list check.
    pub fn step_before(
        &self,
        state: &mut State,
        forces: &mut impl ForceProvider,
        noise: Option<&[f64]>,
        next: Option<NextStep>,
    ) -> Result<()> {
        if forces.step_captured(self, state, noise, next)? {
            return Ok(());
        }
        let mut x = self.start(state, noise)?;
        let evaluation = forces.evaluate(&mut x.0)?;
        self.finish(state, x, evaluation)
    }

    /// [`step`](Self::step) op by op, its force call giving the stress too
    /// ([`ForceProvider::evaluate_with_stress`]): a step whose log row has the pressure.
    pub fn step_with_stress(
        &self,
        state: &mut State,
        forces: &mut impl ForceProvider,
        rng: &mut ChaCha20Rng,
    ) -> Result<Vec<Option<Matrix3>>> {
        let noise = self.draw_noise(state.positions.dim(0)?, rng);
        let mut x = self.start(state, noise.as_deref())?;
        let (evaluation, stresses) = forces.evaluate_with_stress(&mut x.0)?;
        self.finish(state, x, evaluation)?;
        Ok(stresses)
    }

    /// The step up to the force call: the positions and velocities it is made at.
    fn start(&self, state: &State, noise: Option<&[f64]>) -> Result<(Tensor, Tensor)> {
        let noise = match noise {
            Some(xi) => Some(Tensor::from_slice(
                xi,
                state.positions.shape(),
                state.positions.device(),
            )?),
            None => None,
        };
        self.advance(
            &state.positions,
            &state.velocities,
            &state.forces,
            noise.as_ref(),
        )
    }

    /// The step after the force call at (x, v).
    fn finish(&self, state: &mut State, (x, v): (Tensor, Tensor), e: Evaluation) -> Result<()> {
        state.velocities = self.kick(&v, &e.forces)?;
        state.positions = x;
        state.forces = e.forces;
        state.energy = e.energy;
        state.step += 1;
        Ok(())
    }
}
