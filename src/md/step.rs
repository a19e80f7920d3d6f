//! One MD step: the integrator's update around a force provider's evaluation, or the
//! provider's own whole step where it has one. Its own module (an `impl Integrator` block) so
//! that `integrator` depends on no provider while `forces` names the integrator.

use super::forces::{Evaluation, ForceProvider};
use super::integrator::{Integrator, State};
use crate::error::Result;
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
        if forces.step_captured(self, state, noise)? {
            return Ok(());
        }
        let noise = match noise {
            Some(xi) => Some(Tensor::from_slice(
                xi,
                state.positions.shape(),
                state.positions.device(),
            )?),
            None => None,
        };
        let (mut x, v) = self.advance(
            &state.positions,
            &state.velocities,
            &state.forces,
            noise.as_ref(),
        )?;
        let Evaluation { energy, forces: f } = forces.evaluate(&mut x)?;
        state.velocities = self.kick(&v, &f)?;
        state.positions = x;
        state.forces = f;
        state.energy = energy;
        state.step += 1;
        Ok(())
    }
}
