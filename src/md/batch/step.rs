//! The batch run's loop: steps (checked, or with the list checks deferred as a single run
//! defers them), freezing systems that go non-finite or unstable, and the host-side look at
//! log, trajectory and restart steps.

use super::{BatchLogRecord, BatchProgress, BatchSimulation, BatchSummary, HostState};
use crate::error::{Error, Result};
use crate::md::barostat::density_g_cm3;
use crate::md::forces::ForceProvider;
use crate::md::integrator::NextStep;
use crate::md::lookahead::Lookahead;
use crate::md::output::{write_frame, AppendFile, Frame, LogRecord};
use crate::md::positions::host_positions;
use crate::md::pressure::pressure_bar;
use crate::md::summary::StopReason;
use crate::md::velocities::temperature;
use crate::ops::scatter_add;
use candle_core::{DType, Tensor};
use rand_chacha::ChaCha20Rng;
use std::time::Instant;

impl<F: ForceProvider> BatchSimulation<F> {
    /// Runs to `settings.steps`, or until every system is frozen, calling `progress` at every
    /// log step.
    pub fn run(&mut self, progress: &mut dyn FnMut(&BatchProgress)) -> Result<BatchSummary> {
        let first_step = self.state.step;
        let t0 = Instant::now();
        let mut stop = StopReason::Completed;
        if self.fresh {
            self.fresh = false;
            let temperature = self.observe(true, self.settings.traj_every > 0)?;
            progress(&self.progress(first_step, 0.0, temperature));
        }
        let s = self.settings.clone();
        let mut ahead = Lookahead::default();
        while !self.active.is_empty() && self.state.step < s.steps {
            if let Some(signal) = self.stop.raised() {
                self.undraw();
                self.write_restart()?;
                stop = StopReason::Interrupted {
                    step: self.state.step,
                    signal,
                };
                break;
            }
            let room = s.next_output_step(self.state.step) - self.state.step;
            // (NPT checks its list at every step, as a single run does.)
            let deferred = match self.npt {
                Some(_) => 0,
                None => (room as usize).min(ahead.steps()),
            };
            if deferred == 0 || !self.run_deferred(deferred, &mut ahead)? {
                let builds = self.forces.list_builds();
                match self.npt {
                    Some(_) => self.checked_npt_step()?,
                    None => self.checked_step(room)?,
                }
                if self.forces.list_builds() != builds {
                    ahead.rebuilt();
                }
            }
            let k = self.state.step;
            let w = s.writes_at(k);
            let (log_now, traj_now, restart_now) = (w.log, w.traj, w.restart);
            if self.active.is_empty() || !(log_now || traj_now || restart_now) {
                continue;
            }
            let temperature = self.observe(log_now, traj_now)?;
            if restart_now {
                self.write_restart()?;
            }
            if log_now {
                let elapsed = t0.elapsed().as_secs_f64();
                progress(&self.progress(first_step, elapsed, temperature));
            }
        }
        self.undraw();
        Ok(self.summary(first_step, t0.elapsed().as_secs_f64(), stop))
    }

    fn progress(&self, first_step: u64, elapsed: f64, temperature: f64) -> BatchProgress {
        let steps = (self.state.step - first_step) as f64;
        let atoms = *self.starts.last().unwrap_or(&0) as f64;
        BatchProgress {
            step: self.state.step,
            steps: self.settings.steps,
            active: self.active.len(),
            systems: self.members.len(),
            steps_per_s: steps / elapsed.max(1e-9),
            atom_steps_per_s: atoms * steps / elapsed.max(1e-9),
            temperature,
        }
    }

    /// This step's Langevin noise, each system's from its own stream (none for NVE).
    fn draw_noise(&mut self) -> Option<Vec<f64>> {
        let mut all = Vec::new();
        for &m in &self.active {
            let member = &mut self.members[m];
            let xi = self
                .integrator
                .draw_noise(member.masses.len(), &mut member.rng)?;
            all.extend(xi);
        }
        Some(all)
    }

    fn rngs(&self) -> Vec<ChaCha20Rng> {
        self.active
            .iter()
            .map(|&m| self.members[m].rng.clone())
            .collect()
    }

    fn set_rngs(&mut self, rngs: Vec<ChaCha20Rng>) {
        for (&m, rng) in self.active.iter().zip(rngs) {
            self.members[m].rng = rng;
        }
    }

    /// One step, its list checked, of a run with `room` steps left before it next looks at
    /// the state: where there are more, the next step's noise is drawn with this one's, so
    /// that the provider may queue that step before it reads this one's check. Systems whose
    /// positions turn non-finite are frozen at their last finite step, and the step is run
    /// again for the others with their noise.
    fn checked_step(&mut self, room: u64) -> Result<()> {
        let mut noise = match self.drawn.take() {
            Some((xi, _)) => xi,
            None => self.draw_noise(),
        };
        let mut before_next = (room > 1).then(|| self.rngs());
        let mut next = before_next.as_ref().map(|_| self.draw_noise());
        loop {
            let stepped = self.integrator.step_before(
                &mut self.state,
                &mut self.forces,
                noise.as_deref(),
                next.as_ref().map(NextStep::of),
            );
            let what = match stepped {
                Ok(()) => {
                    self.drawn = next.zip(before_next);
                    return Ok(());
                }
                Err(Error::NonFinite(what)) => what,
                Err(e) => return Err(e),
            };
            // The next step is drawn again, for the systems left.
            if let Some(rngs) = before_next.take() {
                self.set_rngs(rngs);
                next = None;
            }
            let bad = self.non_finite_systems(noise.as_deref())?;
            if bad.is_empty() {
                return Err(Error::NonFinite(what));
            }
            if let Some(xi) = &mut noise {
                let mut kept = Vec::with_capacity(xi.len());
                for slot in (0..self.active.len()).filter(|s| !bad.iter().any(|b| b.0 == *s)) {
                    kept.extend_from_slice(&xi[3 * self.starts[slot]..3 * self.starts[slot + 1]]);
                }
                *xi = kept;
            }
            if !self.freeze_non_finite(bad)? {
                return Ok(());
            }
        }
    }

    /// Puts back the noise streams of a next step drawn ahead and not run.
    fn undraw(&mut self) {
        if let Some((_, rngs)) = self.drawn.take() {
            self.set_rngs(rngs);
        }
    }

    /// The systems whose positions the step's drift makes non-finite, with the first such
    /// atom (read back only after a step failed).
    fn non_finite_systems(&self, noise: Option<&[f64]>) -> Result<Vec<(usize, String)>> {
        let st = &self.state;
        let xi = noise
            .map(|xi| Tensor::from_slice(xi, st.positions.shape(), st.positions.device()))
            .transpose()?;
        let (x, _) =
            (self.integrator).advance(&st.positions, &st.velocities, &st.forces, xi.as_ref())?;
        Ok(self.non_finite_rows(&host_positions(&x)?))
    }

    /// The systems with a non-finite row among `rows` (the batch's positions), with the first
    /// such atom.
    pub(super) fn non_finite_rows(&self, rows: &[[f64; 3]]) -> Vec<(usize, String)> {
        (0..self.active.len())
            .filter_map(|slot| {
                let mine = &rows[self.starts[slot]..self.starts[slot + 1]];
                let i = mine.iter().position(|p| p.iter().any(|x| !x.is_finite()))?;
                Some((slot, format!("atom {i} is at {:?}", mine[i])))
            })
            .collect()
    }

    /// Up to `steps` steps with the list checks deferred, as [`Simulation`] runs them: the
    /// steps from the first whose list no longer held (or that failed) are undone, and the
    /// next, checked step redoes it. Returns whether all were kept.
    ///
    /// [`Simulation`]: crate::md::Simulation
    fn run_deferred(&mut self, steps: usize, ahead: &mut Lookahead) -> Result<bool> {
        if !self.forces.defer_list_checks() {
            return Ok(false);
        }
        self.undraw();
        let mut before = Vec::with_capacity(steps);
        let mut done = 0;
        for _ in 0..steps {
            before.push((self.state.clone(), self.rngs()));
            let noise = self.draw_noise();
            let stepped = self.integrator.step_with_noise(
                &mut self.state,
                &mut self.forces,
                noise.as_deref(),
            );
            if stepped.is_err() {
                break;
            }
            done += 1;
        }
        let checks = self.forces.take_deferred_checks()?;
        let kept = ahead.read(&checks).min(done);
        self.deferred.0 += done as u64;
        self.deferred.1 += (done - kept) as u64;
        if let Some((state, rngs)) = before.into_iter().nth(kept) {
            self.state = state;
            self.set_rngs(rngs);
            return Ok(false);
        }
        Ok(true)
    }

    /// Host-side look at every system in the batch: log rows, frames, the stability watch;
    /// systems found non-finite or unstable (when the run stops on that) are frozen. Returns
    /// the mean kinetic temperature of the systems looked at.
    fn observe(&mut self, log_now: bool, traj_now: bool) -> Result<f64> {
        let step = self.state.step;
        let n_active = self.active.len();
        let twice_kinetic = (self.state.velocities.sqr()?)
            .broadcast_mul(&self.mass_column)?
            .sum(1)?;
        let twice_kinetic = scatter_add(&twice_kinetic, &self.atom_slot, n_active)?;
        let parts = [
            self.energies()?,
            twice_kinetic,
            self.state.positions.to_dtype(DType::F64)?.flatten_all()?,
        ];
        let host = Tensor::cat(&parts, 0)?.to_vec1::<f64>()?;
        let positions: Vec<[f64; 3]> = (host[2 * n_active..].chunks_exact(3))
            .map(|c| [c[0], c[1], c[2]])
            .collect();
        let traj_now = traj_now && self.settings.outputs.traj.is_some();
        let (velocities, forces) = match traj_now {
            true => (
                host_positions(&self.state.velocities)?,
                host_positions(&self.state.forces)?,
            ),
            false => (Vec::new(), Vec::new()),
        };
        let time_fs = step as f64 * self.settings.dt_fs;
        let stresses = match (log_now && self.settings.log_pressure, &self.npt) {
            // An NPT step keeps each system's stress.
            (_, Some(_)) => (self.active.iter())
                .map(|&m| self.members[m].barostat.map(|b| b.stress))
                .collect(),
            (true, None) => self.forces.stresses(&self.state.positions)?,
            (false, None) => vec![None; n_active],
        };
        let mut freeze = Vec::new();
        let mut temperatures = Vec::with_capacity(n_active);
        for slot in 0..n_active {
            let k = self.active[slot];
            let (a, b) = (self.starts[slot], self.starts[slot + 1]);
            let (e_pot, e_kin) = (host[slot], 0.5 * host[n_active + slot]);
            let member = &mut self.members[k];
            if !(e_pot.is_finite() && e_kin.is_finite()) {
                let what = format!("potential energy {e_pot} eV, kinetic energy {e_kin} eV");
                freeze.push((slot, StopReason::NonFinite { step, what }));
                continue;
            }
            let worst = member.bonds.deviation(&member.system, &positions[a..b])?;
            member.max_bond_deviation = member.max_bond_deviation.max(worst.max);
            if worst.max > self.settings.bond_limit && member.unstable_at_step.is_none() {
                member.unstable_at_step = Some(step);
                if self.settings.stop_when_unstable {
                    let reason = StopReason::Unstable {
                        step,
                        atoms: worst.pair.unwrap_or((0, 0)),
                        deviation: worst.max,
                    };
                    freeze.push((slot, reason));
                }
            }
            let t = temperature(e_kin, member.dof);
            temperatures.push(t);
            if log_now {
                let record = LogRecord {
                    step,
                    time_fs,
                    e_pot,
                    e_kin,
                    e_tot: e_pot + e_kin,
                    temperature: t,
                    bond_deviation: worst.max,
                    pressure_bar: pressure_bar(stresses[slot], &member.system, e_kin),
                    volume: member.barostat.map(|b| b.volume()),
                    density: (member.barostat)
                        .map(|b| density_g_cm3(member.masses.iter().sum(), b.volume())),
                    e_eff: match (&member.barostat, &self.npt) {
                        (Some(b), Some(npt)) => {
                            Some(b.effective_energy(&npt.barostat, e_pot, e_kin))
                        }
                        _ => None,
                    },
                };
                if let Some(log) = &mut self.log {
                    let row = BatchLogRecord { system: k, record };
                    let mut line =
                        serde_json::to_string(&row).map_err(|e| Error::Md(e.to_string()))?;
                    line.push('\n');
                    log.write(line.as_bytes())?;
                }
                member.records.push(record);
            }
            let file: Option<&mut AppendFile> = match member.traj.as_mut() {
                Some(own) => Some(own),
                None => self.traj.as_mut(),
            };
            if let (true, Some(file)) = (traj_now, file) {
                let frame = Frame {
                    system: &member.system,
                    positions: positions[a..b].to_vec(),
                    velocities: velocities[a..b].to_vec(),
                    masses: &member.masses,
                    energy: e_pot,
                    forces: forces[a..b].to_vec(),
                    step,
                    time_fs,
                    index: Some(k),
                };
                write_frame(file, frame)?;
            }
        }
        self.freeze(freeze)?;
        let mean = temperatures.iter().sum::<f64>() / temperatures.len().max(1) as f64;
        Ok(mean)
    }

    /// Freezes the systems at these slots as gone non-finite in the coming step, with what
    /// did; returns whether any system is left to retry the step with.
    pub(super) fn freeze_non_finite(&mut self, bad: Vec<(usize, String)>) -> Result<bool> {
        let step = self.state.step + 1;
        let frozen = bad
            .into_iter()
            .map(|(slot, what)| (slot, StopReason::NonFinite { step, what }))
            .collect();
        self.freeze(frozen)?;
        Ok(!self.active.is_empty())
    }

    /// Takes the systems at these batch slots out of the batch, recording why and their state
    /// now; the others' atoms keep their order.
    fn freeze(&mut self, slots: Vec<(usize, StopReason)>) -> Result<()> {
        if slots.is_empty() {
            return Ok(());
        }
        let energies = self.energies()?.to_vec1::<f64>()?;
        let [x, v, f] = [
            &self.state.positions,
            &self.state.velocities,
            &self.state.forces,
        ]
        .map(host_positions);
        let (x, v, f) = (x?, v?, f?);
        let mut keep = vec![true; self.active.len()];
        for (slot, reason) in slots {
            let (a, b) = (self.starts[slot], self.starts[slot + 1]);
            let state = HostState {
                step: self.state.step,
                positions: x[a..b].to_vec(),
                velocities: v[a..b].to_vec(),
                forces: f[a..b].to_vec(),
                energy: energies[slot],
            };
            self.members[self.active[slot]].frozen = Some((reason, state));
            keep[slot] = false;
        }
        let kept: Vec<usize> = (0..keep.len()).filter(|&s| keep[s]).collect();
        let active: Vec<usize> = kept.iter().map(|&s| self.active[s]).collect();
        if active.is_empty() {
            self.active = active;
            return Ok(());
        }
        let atoms: Vec<u32> = kept
            .iter()
            .flat_map(|&s| self.starts[s] as u32..self.starts[s + 1] as u32)
            .collect();
        let dev = self.state.positions.device().clone();
        let rows = Tensor::from_vec(atoms.clone(), atoms.len(), &dev)?;
        let slots = Tensor::from_vec(kept.iter().map(|&s| s as u32).collect(), kept.len(), &dev)?;
        let energies = self.energies()?.index_select(&slots, 0)?;
        self.state.positions = self.state.positions.index_select(&rows, 0)?;
        self.state.velocities = self.state.velocities.index_select(&rows, 0)?;
        self.state.forces = self.state.forces.index_select(&rows, 0)?;
        self.state.energy = match kept.len() {
            1 => energies.squeeze(0)?,
            _ => energies,
        };
        self.forces.retain_systems(&keep)?;
        self.active = active;
        if let Some(npt) = &mut self.npt {
            npt.next_twice_kinetic = None;
        }
        self.layout()
    }
}
