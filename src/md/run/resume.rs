//! A run's restart files: [`Simulation::write_restart`] writes one (atomically, after flushing
//! the outputs it points into), [`Simulation::resume`] continues the run it describes.

use super::Simulation;
use crate::error::Result;
use crate::md::analysis::Bonds;
use crate::md::forces::ForceProvider;
use crate::md::integrator::State;
use crate::md::npt::BarostatState;
use crate::md::output::{open_outputs, read_log, AppendFile};
use crate::md::positions::{device_positions, host_positions};
use crate::md::restart::{new_run_id, Restart, RESTART_FORMAT, RESTART_VERSION};
use crate::md::velocities::masses;
use crate::structure::Structure;
use candle_core::Tensor;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

impl<F: ForceProvider> Simulation<F> {
    /// Continues the run a restart file describes, with a force provider the caller rebuilt
    /// from `restart.caller`. Output files are cut back to the length the restart recorded.
    pub fn resume(mut forces: F, restart: Restart) -> Result<Self> {
        let settings = restart.settings.clone();
        settings.validate()?;
        let system = Structure {
            numbers: restart.numbers.clone(),
            positions: restart.positions.clone(),
            cell: restart.cell,
            pbc: restart.pbc,
            ..Default::default()
        };
        let masses = masses(&system.numbers)?;
        let bonds = Bonds {
            pairs: restart.bonds.iter().map(|&(i, j, _)| (i, j)).collect(),
            lengths: restart.bonds.iter().map(|b| b.2).collect(),
        };
        let mut rng = ChaCha20Rng::seed_from_u64(settings.seed);
        // Checked by Restart::load.
        rng.set_word_pos(restart.rng_word_pos.parse().unwrap_or(0));
        if let Some(reference) = &restart.list_reference {
            // An NPT list was built in the cell of its time; the provider then follows the
            // cell to the restart's.
            let list_cell = restart.barostat.and_then(|b| b.list_cell);
            if let Some(c) = list_cell {
                forces.set_cells(&[c])?;
            }
            forces.restore_list(reference)?;
            if let (Some(_), Some(cell)) = (list_cell, restart.cell) {
                forces.set_cells(&[cell])?;
            }
        }
        let (traj, log) = open_outputs(
            &settings.outputs,
            Some([
                (restart.traj_bytes, restart.traj_tail.clone()),
                (restart.log_bytes, restart.log_tail.clone()),
            ]),
        )?;
        let records = match (&log, restart.log_bytes) {
            (Some(l), Some(len)) => read_log(l.path(), len)?,
            _ => Vec::new(),
        };
        let device = forces.device().clone();
        let state = State {
            positions: device_positions(&restart.positions, &device)?,
            velocities: device_positions(&restart.velocities, &device)?,
            forces: device_positions(&restart.forces, &device)?,
            energy: Tensor::new(restart.energy, &device)?,
            step: restart.step,
        };
        let mut sim = Self::assemble(
            forces,
            settings,
            system,
            masses,
            state,
            rng,
            bonds,
            traj,
            log,
            restart.caller,
            restart.barostat,
        )?;
        sim.records = records;
        // (Version 1 restart files had no run id.)
        sim.run_id = restart.run_id.unwrap_or_else(new_run_id);
        sim.max_bond_deviation = restart.max_bond_deviation;
        sim.unstable_at_step = restart.unstable_at_step;
        Ok(sim)
    }

    /// Writes the restart file atomically, after flushing the outputs it points into.
    pub fn write_restart(&mut self) -> Result<()> {
        let Some(path) = self.settings.outputs.restart.clone() else {
            return Ok(());
        };
        let traj_bytes = self.traj.as_mut().map(AppendFile::sync).transpose()?;
        let log_bytes = self.log.as_mut().map(AppendFile::sync).transpose()?;
        let restart = Restart {
            format: RESTART_FORMAT.into(),
            version: RESTART_VERSION,
            settings: self.settings.clone(),
            numbers: self.system.numbers.clone(),
            cell: self.system.cell,
            pbc: self.system.pbc,
            bonds: (self.bonds.pairs.iter().zip(&self.bonds.lengths))
                .map(|(&(i, j), &d)| (i, j, d))
                .collect(),
            step: self.state.step,
            positions: host_positions(&self.state.positions)?,
            velocities: host_positions(&self.state.velocities)?,
            forces: host_positions(&self.state.forces)?,
            energy: self.state.energy.to_scalar::<f64>()?,
            list_reference: self.forces.list_reference()?,
            rng_word_pos: self.rng.get_word_pos().to_string(),
            traj_bytes,
            log_bytes,
            traj_tail: self.traj.as_ref().and_then(AppendFile::tail),
            log_tail: self.log.as_ref().and_then(AppendFile::tail),
            run_id: Some(self.run_id.clone()),
            max_bond_deviation: self.max_bond_deviation,
            unstable_at_step: self.unstable_at_step,
            list_builds: self.forces.list_builds(),
            caller: self.caller.clone(),
            barostat: self.npt.as_ref().map(|n| BarostatState {
                list_cell: self.forces.list_cell(),
                ..n.state
            }),
        };
        restart.save(&path)
    }
}
