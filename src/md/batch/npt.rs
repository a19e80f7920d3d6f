//! Constant pressure for every system of a batch: the single run's NPT step (`md::npt`) with a
//! barostat state and a cell per system. Each system draws its Langevin noise and then its
//! barostat's four normals from its own stream, in the single run's order, so that a replica
//! follows the single run of its seed; the kinetic tensors are per-system sums on the device
//! (one host read a step for all of them), the moves per system on the host, and one force
//! call with every system's new cell gives the forces and every stress.

use super::BatchSimulation;
use crate::error::{Error, Result};
use crate::md::barostat::{scale_cell, Barostat, Move, PressureInputs};
use crate::md::forces::ForceProvider;
use crate::md::npt::half_move;
use crate::ops::scatter_add;
use crate::stress::Matrix3;
use candle_core::{Tensor, D};
use rand::Rng;
use rand_distr::StandardNormal;

/// The barostat of a batched NPT run (its state is per system: `Member::barostat`).
pub(super) struct BatchNpt {
    pub barostat: Barostat,
    pub temperature: f64,
    /// Each system's Σ m v_α² after the next step's first kick, read with the last step's
    /// other values (none after the batch changed).
    pub next_twice_kinetic: Option<Vec<[f64; 3]>>,
}

/// One system's draws for a step: its Langevin normals (3n) and its barostat's four.
struct Draws {
    noise: Vec<f64>,
    xi: [f64; 4],
}

impl<F: ForceProvider> BatchSimulation<F> {
    /// Σ m v_α² of every system in the batch, [S, 3] on the device.
    fn twice_kinetic(&self, v: &Tensor) -> Result<Tensor> {
        let per_atom = v.sqr()?.broadcast_mul(&self.mass_column)?;
        Ok(scatter_add(&per_atom, &self.atom_slot, self.active.len())?)
    }

    /// One NPT step of every system. A system whose barostat move or positions turn
    /// non-finite is frozen at its last finite step, and the step is run again for the others
    /// with the draws they had.
    pub(super) fn checked_npt_step(&mut self) -> Result<()> {
        let mut draws = Vec::with_capacity(self.active.len());
        for &m in &self.active {
            let member = &mut self.members[m];
            let Some(noise) = self
                .integrator
                .draw_noise(member.masses.len(), &mut member.rng)
            else {
                return Err(Error::Md(
                    "the barostat needs the Langevin thermostat".into(),
                ));
            };
            let xi = std::array::from_fn(|_| member.rng.sample(StandardNormal));
            draws.push(Draws { noise, xi });
        }
        loop {
            let bad = match self.try_npt_step(&draws)? {
                None => return Ok(()),
                Some(bad) => bad,
            };
            let mut kept = Vec::with_capacity(draws.len());
            for (slot, d) in draws.into_iter().enumerate() {
                if !bad.iter().any(|b| b.0 == slot) {
                    kept.push(d);
                }
            }
            draws = kept;
            if !self.freeze_non_finite(bad)? {
                return Ok(());
            }
        }
    }

    /// The step with `draws` (one per system in the batch): done (None), or the systems that
    /// turned non-finite, with what did, and the batch's state as it was (the provider may
    /// have taken the step's cells; a retry gives the kept systems theirs again).
    fn try_npt_step(&mut self, draws: &[Draws]) -> Result<Option<Vec<(usize, String)>>> {
        let Some(npt) = &self.npt else {
            return Err(Error::Md(
                "an NPT step of a batch without a barostat".into(),
            ));
        };
        let (barostat, temperature) = (npt.barostat, npt.temperature);
        let dev = self.state.positions.device().clone();
        let (n, s) = (self.state.positions.dim(0)?, self.active.len());
        let noise: Vec<f64> = draws.iter().flat_map(|d| d.noise.iter().copied()).collect();
        let noise = Tensor::from_vec(noise, (n, 3), &dev)?;
        let integrator = &self.integrator;
        let Some(langevin) = integrator.langevin(Some(&noise))? else {
            return Err(Error::Md(
                "the barostat needs the Langevin thermostat".into(),
            ));
        };
        let dt = integrator.dt();
        let v = integrator.kick(&self.state.velocities, &self.state.forces)?;
        let k: Vec<[f64; 3]> = match npt.next_twice_kinetic.clone() {
            Some(k) => k,
            None => rows3(&self.twice_kinetic(&v)?.flatten_all()?.to_vec1::<f64>()?),
        };
        let mut moves: Vec<Move> = Vec::with_capacity(s);
        let mut bad = Vec::new();
        for (slot, &m) in self.active.iter().enumerate() {
            let state = barostat_state(&self.members[m])?;
            let before = PressureInputs {
                volume: state.volume(),
                twice_kinetic: k[slot],
                stress: state.stress,
            };
            match barostat.propose(&before, temperature, dt, draws[slot].xi) {
                Ok(mv) => moves.push(mv),
                Err(Error::NonFinite(what)) => bad.push((slot, what)),
                Err(e) => return Err(e),
            }
        }
        if !bad.is_empty() {
            return Ok(Some(bad));
        }
        // Each system's half moves as per-atom rows: the single run's products, atom by atom.
        let halves: Vec<[[f64; 3]; 3]> = moves.iter().map(|mv| half_move(&mv.scale, dt)).collect();
        let per_atom = |part: usize| -> Result<Tensor> {
            let rows: Vec<f64> = halves.iter().flat_map(|h| h[part]).collect();
            let rows = Tensor::from_vec(rows, (s, 3), &dev)?;
            Ok(rows.index_select(&self.atom_slot, 0)?)
        };
        let (m, mix, inv) = (per_atom(0)?, per_atom(1)?, per_atom(2)?);
        let drift = |x: &Tensor, v: &Tensor| -> Result<(Tensor, Tensor)> {
            Ok((((x * &m)? + (v * &mix)?)?, (v * &inv)?))
        };
        let (x, v) = drift(&self.state.positions, &v)?;
        let k_before = self.twice_kinetic(&v)?.sum(D::Minus1)?;
        let v = ((&v * langevin.c1)? + langevin.xi.broadcast_mul(langevin.scale)?)?;
        let k_after = self.twice_kinetic(&v)?.sum(D::Minus1)?;
        let (mut x, v) = drift(&x, &v)?;
        let cells: Vec<Matrix3> = (self.active.iter().zip(&moves))
            .map(|(&m, mv)| {
                Ok(scale_cell(
                    &barostat_state(&self.members[m])?.cell,
                    &mv.scale,
                ))
            })
            .collect::<Result<_>>()?;
        self.forces.set_cells(&cells)?;
        let (evaluation, stresses) = match self.forces.evaluate_with_stress(&mut x) {
            Ok(done) => done,
            Err(Error::NonFinite(what)) => {
                let rows = crate::md::positions::host_positions(&x)?;
                let bad = self.non_finite_rows(&rows);
                if bad.is_empty() {
                    return Err(Error::NonFinite(what));
                }
                return Ok(Some(bad));
            }
            Err(e) => return Err(e),
        };
        if stresses.len() != s || stresses.iter().any(Option::is_none) {
            return Err(Error::Md(
                "the force provider gave no stress for every system: constant pressure needs one"
                    .into(),
            ));
        }
        let v_end = integrator.kick(&v, &evaluation.forces)?;
        let v_next = integrator.kick(&v_end, &evaluation.forces)?;
        let parts = [
            self.twice_kinetic(&v)?.flatten_all()?,
            k_before,
            k_after,
            self.twice_kinetic(&v_next)?.flatten_all()?,
        ];
        let reads = Tensor::cat(&parts, 0)?.to_vec1::<f64>()?;
        let (k_end, rest) = reads.split_at(3 * s);
        let (k_before, rest) = rest.split_at(s);
        let (k_after, k_next) = rest.split_at(s);
        for (slot, &m) in self.active.iter().enumerate() {
            let member = &mut self.members[m];
            let stress = stresses[slot].unwrap_or_default();
            let Some(state) = member.barostat.as_mut() else {
                return Err(Error::Md(format!("system {m} has no barostat state")));
            };
            let k = [k_end[3 * slot], k_end[3 * slot + 1], k_end[3 * slot + 2]];
            let heat = (k_before[slot], k_after[slot]);
            let mv = &moves[slot];
            state.commit(&barostat, temperature, dt, mv, cells[slot], stress, k, heat);
            member.system.cell = Some(cells[slot]);
        }
        if let Some(npt) = &mut self.npt {
            npt.next_twice_kinetic = Some(rows3(k_next));
        }
        self.state.velocities = v_end;
        self.state.positions = x;
        self.state.forces = evaluation.forces;
        self.state.energy = evaluation.energy;
        self.state.step += 1;
        Ok(None)
    }
}

/// A system's barostat state (every system of an NPT batch has one).
fn barostat_state(member: &super::Member) -> Result<&crate::md::npt::BarostatState> {
    member
        .barostat
        .as_ref()
        .ok_or_else(|| Error::Md("a system of an NPT batch has no barostat state".into()))
}

/// [x, y, z] rows of a flat list.
fn rows3(flat: &[f64]) -> Vec<[f64; 3]> {
    flat.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect()
}
