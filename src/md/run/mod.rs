//! The MD driver: set-up checks, the device-resident step loop, logging, trajectory frames,
//! the stability watch and the closing summary; its restart files (written and resumed) in the
//! child `resume`. Its settings (`settings`) and the judgement of its log (`window`) are
//! modules below it, so that it uses `restart` and `validate` uses it without either pointing
//! back.

mod resume;

use super::analysis::{check_separation, Bonds};
use super::barostat::density_g_cm3;
use super::forces::ForceProvider;
use super::integrator::{Ensemble, Integrator, NextStep, State};
use super::lookahead::Lookahead;
use super::npt::{BarostatState, Npt};
use super::output::{open_outputs, write_frame, write_log, AppendFile, Frame, LogRecord};
use super::positions::{device_positions, host_positions};
use super::pressure::pressure_bar;
use super::restart::new_run_id;
use super::settings::MdSettings;
use super::summary::{judge, MdSummary, StopReason};
use super::velocities::{
    degrees_of_freedom, masses, maxwell_boltzmann, momenta_velocities, temperature,
};
use crate::error::{Error, Result};
use crate::interrupt::StopFlag;
use crate::stress::{stress_volume, Matrix3};
use crate::structure::Structure;
use candle_core::{DType, Device, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use std::time::Instant;

/// Reported at every log step, for progress bars and callbacks.
#[derive(Clone, Copy, Debug)]
pub struct Progress<'a> {
    pub step: u64,
    pub steps: u64,
    pub record: LogRecord,
    /// Steps per second since this invocation started.
    pub steps_per_s: f64,
    /// Positions at this step, Å (read for the log anyway).
    pub positions: &'a [[f64; 3]],
}

/// An MD run on one structure.
pub struct Simulation<F: ForceProvider> {
    forces: F,
    settings: MdSettings,
    system: Structure,
    masses: Vec<f64>,
    /// Masses as an [N, 1] device column, for the kinetic energy.
    mass_column: Tensor,
    dof: usize,
    integrator: Integrator,
    state: State,
    rng: ChaCha20Rng,
    bonds: Bonds,
    records: Vec<LogRecord>,
    max_bond_deviation: f64,
    unstable_at_step: Option<u64>,
    traj: Option<AppendFile>,
    log: Option<AppendFile>,
    caller: serde_json::Value,
    /// Shared by every restart file of this run ([`Restart::check_current`]).
    run_id: String,
    stop: StopFlag,
    /// Step 0 still to be logged (fresh runs).
    fresh: bool,
    /// Steps run with deferred list checks, and of them thrown away ([`MdSummary`]).
    deferred: (u64, u64),
    /// The next step's noise, drawn with the step before so that the provider could queue it
    /// ([`NextStep`]), and the stream before that draw.
    drawn: Option<(Option<Vec<f64>>, ChaCha20Rng)>,
    /// Positions at the last observed step (for [`Progress`]).
    observed: Vec<[f64; 3]>,
    /// The barostat of an NPT run; `system.cell` follows its cell.
    npt: Option<Npt>,
    /// Whether log rows have the pressure (cells periodic along all three axes), and the
    /// stress of the last step that computed one (NVE and NVT: the logging steps).
    logs_pressure: bool,
    stress: Option<(u64, Matrix3)>,
}

impl<F: ForceProvider> Simulation<F> {
    /// Checks everything, opens the outputs and evaluates the starting forces. `caller` is
    /// stored in restart files as given (e.g. the model path and hash).
    pub fn new(
        forces: F,
        structure: &Structure,
        settings: MdSettings,
        caller: serde_json::Value,
    ) -> Result<Self> {
        settings.validate()?;
        structure.validate()?;
        if structure.is_empty() {
            return Err(Error::Md("the structure has no atoms".into()));
        }
        check_separation(structure)?;
        if (settings.log_pressure || settings.barostat.is_some())
            && stress_volume(structure).is_none()
        {
            return Err(Error::Md(format!(
                "{} needs a cell periodic along all three axes",
                match settings.barostat {
                    Some(_) => "constant pressure",
                    None => "pressure",
                }
            )));
        }
        let masses = masses(&structure.numbers)?;
        let bonds = Bonds::detect(structure)?;
        let mut rng = ChaCha20Rng::seed_from_u64(settings.seed);
        let velocities = if settings.keep_momenta {
            momenta_velocities(structure, &masses)?
        } else {
            maxwell_boltzmann(&masses, settings.init_temperature, &mut rng)
        };
        let (traj, log) = open_outputs(&settings.outputs, None)?;
        let system = Structure {
            energy: None,
            forces: None,
            info: Vec::new(),
            arrays: Vec::new(),
            ..structure.clone()
        };
        let device = forces.device().clone();
        let mut positions = device_positions(&structure.positions, &device)?;
        let mut forces = forces;
        let (start, stress) = match settings.barostat {
            Some(_) => {
                let (e, s) = forces.evaluate_with_stress(&mut positions)?;
                (e, s.first().copied().flatten())
            }
            None => (forces.evaluate(&mut positions)?, None),
        };
        let e0 = start.energy.to_scalar::<f64>()?;
        if !e0.is_finite() {
            return Err(Error::NonFinite(format!(
                "the energy of the starting structure is {e0}"
            )));
        }
        let f0 = host_positions(&start.forces)?;
        if let Some(i) = f0.iter().position(|f| f.iter().any(|x| !x.is_finite())) {
            return Err(Error::NonFinite(format!(
                "the force on atom {i} of the starting structure is {:?}",
                f0[i]
            )));
        }
        let state = State {
            positions,
            velocities: device_positions(&velocities, &device)?,
            forces: start.forces,
            energy: start.energy,
            step: 0,
        };
        let barostat = match (&system.cell, stress) {
            (Some(cell), Some(stress)) => Some(BarostatState {
                cell: *cell,
                stress,
                heat: 0.0,
                list_cell: None,
            }),
            _ => None,
        };
        let mut sim = Self::assemble(
            forces, settings, system, masses, state, rng, bonds, traj, log, caller, barostat,
        )?;
        sim.fresh = true;
        sim.run_id = new_run_id();
        Ok(sim)
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        forces: F,
        settings: MdSettings,
        system: Structure,
        masses: Vec<f64>,
        state: State,
        rng: ChaCha20Rng,
        bonds: Bonds,
        traj: Option<AppendFile>,
        log: Option<AppendFile>,
        caller: serde_json::Value,
        barostat: Option<BarostatState>,
    ) -> Result<Self> {
        let device: Device = forces.device().clone();
        let integrator = Integrator::new(settings.ensemble, settings.dt_fs, &masses, &device)?;
        let n = masses.len();
        let mass_column = Tensor::from_vec(masses.clone(), (n, 1), &device)?;
        let logs_pressure = stress_volume(&system).is_some();
        let npt = match (settings.barostat, settings.ensemble, barostat) {
            (None, _, _) => None,
            (Some(b), Ensemble::Nvt { temperature, .. }, Some(state)) => {
                Some(Npt::new(b, temperature, state, mass_column.clone()))
            }
            _ => {
                return Err(Error::Md(
                    "constant pressure needs the Langevin thermostat and the stress of a \
                     periodic cell (this force provider gives none)"
                        .into(),
                ))
            }
        };
        // Velocity Verlet from COM-free velocities keeps the momentum at zero; Langevin does not.
        let com_fixed = settings.ensemble == Ensemble::Nve && !settings.keep_momenta;
        Ok(Self {
            dof: degrees_of_freedom(n, com_fixed),
            forces,
            settings,
            system,
            masses,
            mass_column,
            integrator,
            state,
            rng,
            bonds,
            records: Vec::new(),
            max_bond_deviation: 0.0,
            unstable_at_step: None,
            traj,
            log,
            caller,
            run_id: String::new(),
            stop: StopFlag::new(),
            fresh: false,
            deferred: (0, 0),
            drawn: None,
            observed: Vec::new(),
            logs_pressure,
            npt,
            stress: None,
        })
    }

    /// Stops the run (after writing its restart file, if it has one) once `stop` is raised.
    pub fn with_stop(mut self, stop: StopFlag) -> Self {
        self.stop = stop;
        self
    }

    pub fn settings(&self) -> &MdSettings {
        &self.settings
    }

    pub fn step(&self) -> u64 {
        self.state.step
    }

    pub fn records(&self) -> &[LogRecord] {
        &self.records
    }

    /// The cell now (NPT runs move it).
    pub fn cell(&self) -> Option<crate::structure::Lattice> {
        self.system.cell
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    /// The force provider (e.g. to read a profiler it carries).
    pub fn forces(&self) -> &F {
        &self.forces
    }

    /// Runs to `settings.steps` (or to the first instability or NaN), calling `progress` at
    /// every log step.
    pub fn run(&mut self, progress: &mut dyn FnMut(&Progress)) -> Result<MdSummary> {
        let first_step = self.state.step;
        let t0 = Instant::now();
        let mut stop = StopReason::Completed;
        if self.fresh {
            self.fresh = false;
            if let Some(reason) = self.observe(true, self.settings.traj_every > 0)? {
                stop = reason;
            }
            if let Some(&record) = self.records.last() {
                progress(&Progress {
                    step: 0,
                    steps: self.settings.steps,
                    record,
                    steps_per_s: 0.0,
                    positions: &self.observed,
                });
            }
        }
        let s = self.settings.clone();
        let mut ahead = Lookahead::default();
        while stop == StopReason::Completed && self.state.step < s.steps {
            if let Some(signal) = self.stop.raised() {
                self.undraw();
                self.write_restart()?;
                stop = StopReason::Interrupted {
                    step: self.state.step,
                    signal,
                };
                break;
            }
            // Steps up to the next one that writes something (that one included) run with
            // their list checks read back at once, before anything is written; a step redone
            // after a run whose list stopped holding checks its own (it rebuilds the list).
            let next = s.next_output_step(self.state.step);
            let room = next - self.state.step;
            // A logging step's own force call gives the pressure: it runs checked, op by op.
            let with_stress = self.logs_pressure && self.npt.is_none() && s.writes_at(next).log;
            let deferred = match self.npt {
                Some(_) => 0,
                None => (room as usize - with_stress as usize).min(ahead.steps()),
            };
            if deferred == 0 || !self.run_deferred(deferred, &mut ahead)? {
                let builds = self.forces.list_builds();
                let plain = self.npt.is_none() && !(with_stress && self.state.step + 1 == next);
                if !plain {
                    self.undraw();
                }
                let stepped = match &mut self.npt {
                    Some(npt) => {
                        let stepped = npt.step(
                            &self.integrator,
                            &mut self.state,
                            &mut self.forces,
                            &mut self.rng,
                        );
                        self.system.cell = Some(npt.state.cell);
                        stepped
                    }
                    None if with_stress && self.state.step + 1 == next => self
                        .integrator
                        .step_with_stress(&mut self.state, &mut self.forces, &mut self.rng)
                        .map(|sigma| {
                            let step = self.state.step;
                            self.stress = sigma.first().copied().flatten().map(|s| (step, s));
                        }),
                    None => self.plain_step(room),
                };
                if let Err(Error::NonFinite(what)) = stepped {
                    stop = StopReason::NonFinite {
                        step: self.state.step + 1,
                        what,
                    };
                    break;
                }
                stepped?;
                if self.forces.list_builds() != builds {
                    ahead.rebuilt();
                }
            }
            let k = self.state.step;
            let w = s.writes_at(k);
            let (log_now, traj_now, restart_now) = (w.log, w.traj, w.restart);
            if !(log_now || traj_now || restart_now) {
                continue;
            }
            if let Some(reason) = self.observe(log_now, traj_now)? {
                stop = reason;
            }
            if restart_now && stop == StopReason::Completed {
                self.write_restart()?;
            }
            if let Some(record) = self.records.last().copied().filter(|_| log_now) {
                let elapsed = t0.elapsed().as_secs_f64();
                progress(&Progress {
                    step: k,
                    steps: s.steps,
                    record,
                    steps_per_s: (k - first_step) as f64 / elapsed.max(1e-9),
                    positions: &self.observed,
                });
            }
        }
        self.undraw();
        Ok(self.summary(first_step, t0.elapsed().as_secs_f64(), stop))
    }

    /// Up to `steps` steps with the force provider's list checks deferred (where it defers
    /// them): the states and noise streams stay until the checks are read, and the steps from
    /// the first whose list no longer held are undone (the next, checked step redoes it). A
    /// step that fails is undone too, so that the checked step reports it. Returns whether
    /// all `steps` were kept.
    fn run_deferred(&mut self, steps: usize, ahead: &mut Lookahead) -> Result<bool> {
        if !self.forces.defer_list_checks() {
            return Ok(false);
        }
        self.undraw();
        let mut before = Vec::with_capacity(steps);
        let mut done = 0;
        for _ in 0..steps {
            before.push((self.state.clone(), self.rng.clone()));
            let stepped = self
                .integrator
                .step(&mut self.state, &mut self.forces, &mut self.rng);
            if stepped.is_err() {
                break;
            }
            done += 1;
        }
        let checks = self.forces.take_deferred_checks()?;
        let kept = ahead.read(&checks).min(done);
        self.deferred.0 += done as u64;
        self.deferred.1 += (done - kept) as u64;
        if let Some((state, rng)) = before.into_iter().nth(kept) {
            self.state = state;
            self.rng = rng;
            return Ok(false);
        }
        Ok(true)
    }

    /// One step without a barostat or a stress, of a run with `room` steps left before it next
    /// looks at the state: where there are more, the next step's noise is drawn with this
    /// one's, so that the provider may queue that step before it reads this one's check.
    fn plain_step(&mut self, room: u64) -> Result<()> {
        let n = self.state.positions.dim(0)?;
        let noise = match self.drawn.take() {
            Some((xi, _)) => xi,
            None => self.integrator.draw_noise(n, &mut self.rng),
        };
        let before_next = (room > 1).then(|| self.rng.clone());
        let next = (before_next.as_ref()).map(|_| self.integrator.draw_noise(n, &mut self.rng));
        let stepped = self.integrator.step_before(
            &mut self.state,
            &mut self.forces,
            noise.as_deref(),
            next.as_ref().map(NextStep::of),
        );
        match (&stepped, before_next) {
            (Ok(()), before_next) => self.drawn = next.zip(before_next),
            (Err(_), Some(rng)) => self.rng = rng,
            (Err(_), None) => {}
        }
        stepped
    }

    /// Puts back the noise stream of a next step drawn ahead and not run.
    fn undraw(&mut self) {
        if let Some((_, rng)) = self.drawn.take() {
            self.rng = rng;
        }
    }

    /// Host-side look at the state: log row, frame, bond check. Returns why to stop, if so.
    fn observe(&mut self, log_now: bool, traj_now: bool) -> Result<Option<StopReason>> {
        let step = self.state.step;
        // Energies and positions in one host read: each read drains the device's queue.
        let twice_kinetic = (self.state.velocities.sqr()?)
            .broadcast_mul(&self.mass_column)?
            .sum_all()?;
        let parts = [
            self.state.energy.reshape(1)?,
            twice_kinetic.reshape(1)?,
            self.state.positions.to_dtype(DType::F64)?.flatten_all()?,
        ];
        let host = Tensor::cat(&parts, 0)?.to_vec1::<f64>()?;
        let (e_pot, e_kin) = (host[0], 0.5 * host[1]);
        if !(e_pot.is_finite() && e_kin.is_finite()) {
            return Ok(Some(StopReason::NonFinite {
                step,
                what: format!("potential energy {e_pot} eV, kinetic energy {e_kin} eV"),
            }));
        }
        let positions: Vec<[f64; 3]> = (host[2..].chunks_exact(3))
            .map(|c| [c[0], c[1], c[2]])
            .collect();
        let worst = self.bonds.deviation(&self.system, &positions)?;
        self.max_bond_deviation = self.max_bond_deviation.max(worst.max);
        let mut stop = None;
        if worst.max > self.settings.bond_limit && self.unstable_at_step.is_none() {
            self.unstable_at_step = Some(step);
            if self.settings.stop_when_unstable {
                stop = Some(StopReason::Unstable {
                    step,
                    atoms: worst.pair.unwrap_or((0, 0)),
                    deviation: worst.max,
                });
            }
        }
        let time_fs = step as f64 * self.settings.dt_fs;
        if log_now {
            let pressure_bar = match (&self.npt, self.stress, self.logs_pressure) {
                (Some(npt), _, _) => pressure_bar(Some(npt.state.stress), &self.system, e_kin),
                (None, Some((k, sigma)), _) if k == step => {
                    pressure_bar(Some(sigma), &self.system, e_kin)
                }
                (None, _, true) => self.pressure(e_kin)?,
                (None, _, false) => None,
            };
            let total_mass: f64 = self.masses.iter().sum();
            let npt = self.npt.as_ref();
            let record = LogRecord {
                step,
                time_fs,
                e_pot,
                e_kin,
                e_tot: e_pot + e_kin,
                temperature: temperature(e_kin, self.dof),
                bond_deviation: worst.max,
                pressure_bar,
                volume: npt.map(Npt::volume),
                density: npt.map(|n| density_g_cm3(total_mass, n.volume())),
                e_eff: npt.map(|n| n.effective_energy(e_pot, e_kin)),
            };
            if let Some(log) = &mut self.log {
                write_log(log, &record)?;
            }
            self.records.push(record);
        }
        if let (true, Some(traj)) = (traj_now, &mut self.traj) {
            write_frame(
                traj,
                Frame {
                    system: &self.system,
                    positions: positions.clone(),
                    velocities: host_positions(&self.state.velocities)?,
                    masses: &self.masses,
                    energy: e_pot,
                    forces: host_positions(&self.state.forces)?,
                    step,
                    time_fs,
                    index: None,
                },
            )?;
        }
        self.observed = positions;
        Ok(stop)
    }

    /// The pressure in bar with kinetic energy `e_kin` (none where the provider gives no
    /// stress).
    fn pressure(&mut self, e_kin: f64) -> Result<Option<f64>> {
        let sigma = self.forces.stresses(&self.state.positions)?;
        Ok(pressure_bar(
            sigma.first().copied().flatten(),
            &self.system,
            e_kin,
        ))
    }

    fn summary(&self, first_step: u64, wall_s: f64, stop: StopReason) -> MdSummary {
        let n = self.masses.len();
        let s = &self.settings;
        let steps_run = self.state.step - first_step;
        let steps_per_s = steps_run as f64 / wall_s.max(1e-9);
        let conserved = s.ensemble == Ensemble::Nve || s.barostat.is_some();
        let j = judge(
            &self.records,
            n,
            self.state.step,
            conserved,
            self.unstable_at_step,
            &stop,
        );
        MdSummary {
            atoms: n,
            ensemble: s.ensemble_name().into(),
            dt_fs: s.dt_fs,
            first_step,
            last_step: self.state.step,
            simulated_ps: self.state.step as f64 * s.dt_fs / 1000.0,
            wall_s,
            steps_per_s,
            ns_per_day: steps_per_s * s.dt_fs * 86_400.0 * 1e-6,
            energy_drift_mev_per_atom_ps: j.energy_drift_mev_per_atom_ps,
            energy_std_mev_per_atom: j.energy_std_mev_per_atom,
            temperature_mean: j.temperature_mean,
            temperature_std: j.temperature_std,
            pressure_mean_bar: j.pressure_mean_bar,
            pressure_std_bar: j.pressure_std_bar,
            volume_mean_a3: j.volume_mean_a3,
            volume_std_a3: j.volume_std_a3,
            density_mean_g_cm3: j.density_mean_g_cm3,
            bonds: self.bonds.pairs.len(),
            max_bond_deviation: self.max_bond_deviation,
            bond_limit: s.bond_limit,
            stable: j.stable,
            finite: j.finite,
            stop,
            neighbor_list_builds: self.forces.list_builds(),
            deferred_steps: self.deferred.0,
            redone_steps: self.deferred.1,
            one_launch_steps: self.forces.one_launch_steps(),
        }
    }
}
