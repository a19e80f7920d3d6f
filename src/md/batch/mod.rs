//! Many systems in one MD run ([`BatchSimulation`]): replicas of one structure or different
//! molecules, advanced together with one force call per step (a batched provider such as
//! [`PainnForces::batch`](crate::md::PainnForces::batch)) and one integrator over all their
//! atoms, positions staying on the device between log steps. Each system keeps its own
//! random stream (seed + its index), so system k follows exactly the trajectory of a single
//! run with that seed; its own log rows, stability watch and trajectory. A system that turns
//! unstable or non-finite is frozen: taken out of the batch with its state at that step,
//! while the others go on. At constant pressure each system has its own cell and barostat.
//!
//! `step` holds the loop (steps, checks, freezing, the host-side look at log steps), `npt`
//! the constant-pressure step, `restart` the restart file and the outputs, `summary` the
//! closing numbers.

mod npt;
mod restart;
mod step;
mod summary;

pub use restart::{system_traj, BatchRestart, SystemRestart, BATCH_RESTART_FORMAT};
pub use summary::{BatchSummary, SystemSummary};

use super::analysis::{check_separation, Bonds};
use super::forces::ForceProvider;
use super::integrator::{Ensemble, Integrator, State};
use super::npt::BarostatState;
use super::output::{AppendFile, LogRecord};
use super::positions::{device_positions, host_positions};
use super::restart::new_run_id;
use super::settings::MdSettings;
use super::summary::StopReason;
use super::velocities::{degrees_of_freedom, masses, maxwell_boltzmann, momenta_velocities};
use crate::error::{Error, Result};
use crate::interrupt::StopFlag;
use crate::structure::Structure;
use candle_core::{Device, Tensor};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

/// A log row of a batch run: the system's index beside the record of a single run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchLogRecord {
    pub system: usize,
    #[serde(flatten)]
    pub record: LogRecord,
}

/// One system's state on the host (where a frozen system's ends, and in restart files). A
/// system frozen as non-finite may hold NaN, which JSON writes as null and reads back as NaN.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostState {
    pub step: u64,
    #[serde(deserialize_with = "rows_or_nan")]
    pub positions: Vec<[f64; 3]>,
    #[serde(deserialize_with = "rows_or_nan")]
    pub velocities: Vec<[f64; 3]>,
    #[serde(deserialize_with = "rows_or_nan")]
    pub forces: Vec<[f64; 3]>,
    #[serde(deserialize_with = "number_or_nan")]
    pub energy: f64,
}

fn rows_or_nan<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Vec<[f64; 3]>, D::Error> {
    let rows: Vec<[Option<f64>; 3]> = Deserialize::deserialize(d)?;
    Ok(rows
        .into_iter()
        .map(|r| r.map(|x| x.unwrap_or(f64::NAN)))
        .collect())
}

fn number_or_nan<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Reported at every log step.
#[derive(Clone, Copy, Debug)]
pub struct BatchProgress {
    pub step: u64,
    pub steps: u64,
    /// Systems still in the batch, of all.
    pub active: usize,
    pub systems: usize,
    /// Since this invocation started.
    pub steps_per_s: f64,
    pub atom_steps_per_s: f64,
    /// Mean kinetic temperature of the systems in the batch, K.
    pub temperature: f64,
}

/// One system's bookkeeping.
struct Member {
    /// Numbers, cell and pbc (positions empty): the frames' template and the bond geometry.
    system: Structure,
    masses: Vec<f64>,
    dof: usize,
    bonds: Bonds,
    seed: u64,
    rng: ChaCha20Rng,
    records: Vec<LogRecord>,
    max_bond_deviation: f64,
    unstable_at_step: Option<u64>,
    /// Its own trajectory (`traj_split`).
    traj: Option<AppendFile>,
    /// Why and where it left the batch.
    frozen: Option<(StopReason, HostState)>,
    /// Its cell, stress and heat (NPT): `system.cell` follows the cell.
    barostat: Option<BarostatState>,
}

/// An MD run of many independent systems at once.
pub struct BatchSimulation<F: ForceProvider> {
    forces: F,
    settings: MdSettings,
    members: Vec<Member>,
    /// The members still in the batch, in batch order, and where each one's atoms start.
    active: Vec<usize>,
    starts: Vec<usize>,
    /// Batch slot of every atom (u32), for per-system sums on the device.
    atom_slot: Tensor,
    /// Masses as an [N, 1] column, for the kinetic energies.
    mass_column: Tensor,
    integrator: Integrator,
    /// All atoms of the batch; `energy` per system (a scalar when one is left).
    state: State,
    /// The trajectory all systems share (unless `traj_split`), and the log.
    traj: Option<AppendFile>,
    log: Option<AppendFile>,
    caller: serde_json::Value,
    run_id: String,
    stop: StopFlag,
    fresh: bool,
    deferred: (u64, u64),
    /// The next step's noise, drawn with the step before so that the provider could queue it
    /// ([`NextStep`](crate::md::NextStep)), and the systems' streams before that draw.
    drawn: Option<(Option<Vec<f64>>, Vec<ChaCha20Rng>)>,
    /// The barostat of an NPT batch (its state is each member's).
    npt: Option<npt::BatchNpt>,
}

/// The seed of system `k` of a run seeded with `seed`.
pub fn system_seed(seed: u64, k: usize) -> u64 {
    seed.wrapping_add(k as u64)
}

impl<F: ForceProvider> BatchSimulation<F> {
    /// Checks every system, opens the outputs and evaluates the starting forces. `forces`
    /// computes `systems` in this order. Each system starts from its own Maxwell-Boltzmann
    /// velocities, seeded with [`system_seed`] (or from its `momenta` with `keep_momenta`).
    pub fn new(
        forces: F,
        systems: &[Structure],
        settings: MdSettings,
        caller: serde_json::Value,
    ) -> Result<Self> {
        let seeds: Vec<u64> = (0..systems.len())
            .map(|k| system_seed(settings.seed, k))
            .collect();
        Self::with_seeds(forces, systems, &seeds, settings, caller)
    }

    /// [`new`](Self::new) with each system's seed given (the validation suite gives every
    /// system the seed its single run has).
    pub fn with_seeds(
        forces: F,
        systems: &[Structure],
        seeds: &[u64],
        settings: MdSettings,
        caller: serde_json::Value,
    ) -> Result<Self> {
        settings.validate()?;
        if seeds.len() != systems.len() {
            return Err(Error::Md(format!(
                "{} seeds for {} systems",
                seeds.len(),
                systems.len()
            )));
        }
        if systems.is_empty() {
            return Err(Error::Md("a batch run needs at least one system".into()));
        }
        if forces.systems() != systems.len() {
            return Err(Error::Md(format!(
                "the force provider computes {} systems, the run has {}",
                forces.systems(),
                systems.len()
            )));
        }
        let mut members = Vec::with_capacity(systems.len());
        let mut velocities = Vec::new();
        for (k, s) in systems.iter().enumerate() {
            let in_system = |e: Error| Error::Md(format!("system {k}: {e}"));
            s.validate().map_err(in_system)?;
            if s.is_empty() {
                return Err(Error::Md(format!("system {k} has no atoms")));
            }
            check_separation(s).map_err(in_system)?;
            let npt = settings.barostat.is_some();
            if (settings.log_pressure || npt) && crate::stress::stress_volume(s).is_none() {
                return Err(Error::Md(format!(
                    "system {k}: {} needs a cell periodic along all three axes",
                    if npt { "constant pressure" } else { "pressure" }
                )));
            }
            let m = masses(&s.numbers).map_err(in_system)?;
            let bonds = Bonds::detect(s).map_err(in_system)?;
            let seed = seeds[k];
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            velocities.extend(if settings.keep_momenta {
                momenta_velocities(s, &m).map_err(in_system)?
            } else {
                maxwell_boltzmann(&m, settings.init_temperature, &mut rng)
            });
            let com_fixed = settings.ensemble == Ensemble::Nve && !settings.keep_momenta;
            members.push(Member {
                system: Structure {
                    positions: s.positions.clone(),
                    cell: s.cell,
                    pbc: s.pbc,
                    ..Structure::molecule(s.numbers.clone(), Vec::new())
                },
                dof: degrees_of_freedom(s.len(), com_fixed),
                masses: m,
                bonds,
                seed,
                rng,
                records: Vec::new(),
                max_bond_deviation: 0.0,
                unstable_at_step: None,
                traj: None,
                frozen: None,
                barostat: None,
            });
        }
        let (traj, log) = restart::open_outputs(&settings.outputs, &mut members, None)?;
        let device = forces.device().clone();
        let all: Vec<[f64; 3]> = systems.iter().flat_map(|s| s.positions.clone()).collect();
        let mut positions = device_positions(&all, &device)?;
        let mut forces = forces;
        let start = match settings.barostat {
            Some(_) => {
                let (start, stresses) = forces.evaluate_with_stress(&mut positions)?;
                for ((member, s), stress) in members.iter_mut().zip(systems).zip(stresses) {
                    if let (Some(cell), Some(stress)) = (s.cell, stress) {
                        member.barostat = Some(BarostatState {
                            cell,
                            stress,
                            heat: 0.0,
                            list_cell: None,
                        });
                    }
                }
                start
            }
            None => forces.evaluate(&mut positions)?,
        };
        let e0 = start.energy.reshape(systems.len())?.to_vec1::<f64>()?;
        let f0 = host_positions(&start.forces)?;
        let mut first = 0;
        for (k, s) in systems.iter().enumerate() {
            if !e0[k].is_finite() {
                return Err(Error::NonFinite(format!(
                    "system {k}: the energy of the starting structure is {}",
                    e0[k]
                )));
            }
            let f = &f0[first..first + s.len()];
            if let Some(i) = f.iter().position(|f| f.iter().any(|x| !x.is_finite())) {
                return Err(Error::NonFinite(format!(
                    "system {k}: the force on atom {i} of the starting structure is {:?}",
                    f[i]
                )));
            }
            first += s.len();
        }
        let state = State {
            positions,
            velocities: device_positions(&velocities, &device)?,
            forces: start.forces,
            energy: start.energy,
            step: 0,
        };
        let active = (0..members.len()).collect();
        let mut sim = Self::assemble(forces, settings, members, active, state, traj, log, caller)?;
        sim.fresh = true;
        sim.run_id = new_run_id();
        Ok(sim)
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        forces: F,
        settings: MdSettings,
        members: Vec<Member>,
        active: Vec<usize>,
        state: State,
        traj: Option<AppendFile>,
        log: Option<AppendFile>,
        caller: serde_json::Value,
    ) -> Result<Self> {
        let device = forces.device().clone();
        let empty = Tensor::zeros(0, candle_core::DType::U32, &device)?;
        let integrator = Integrator::new(settings.ensemble, settings.dt_fs, &[], &device)?;
        let stressed = members.iter().all(|m| m.barostat.is_some());
        let npt = match (settings.barostat, settings.ensemble, stressed) {
            (None, _, _) => None,
            (Some(barostat), Ensemble::Nvt { temperature, .. }, true) => Some(npt::BatchNpt {
                barostat,
                temperature,
                next_twice_kinetic: None,
            }),
            _ => {
                return Err(Error::Md(
                    "constant pressure needs the Langevin thermostat and the stress of every \
                     system's periodic cell (this force provider gives none)"
                        .into(),
                ))
            }
        };
        let mut sim = Self {
            forces,
            settings,
            members,
            active,
            starts: Vec::new(),
            atom_slot: empty.clone(),
            mass_column: empty,
            integrator,
            state,
            traj,
            log,
            caller,
            run_id: String::new(),
            stop: StopFlag::new(),
            fresh: false,
            deferred: (0, 0),
            drawn: None,
            npt,
        };
        sim.layout()?;
        Ok(sim)
    }

    /// The per-atom tensors and the integrator for the systems now in the batch.
    fn layout(&mut self) -> Result<()> {
        let device: Device = self.forces.device().clone();
        let mut starts = vec![0];
        let mut slots = Vec::new();
        let mut all_masses = Vec::new();
        for (slot, &m) in self.active.iter().enumerate() {
            let member = &self.members[m];
            slots.extend(std::iter::repeat_n(slot as u32, member.masses.len()));
            all_masses.extend_from_slice(&member.masses);
            starts.push(all_masses.len());
        }
        let n = all_masses.len();
        self.atom_slot = Tensor::from_vec(slots, n, &device)?;
        self.mass_column = Tensor::from_vec(all_masses.clone(), (n, 1), &device)?;
        let s = &self.settings;
        self.integrator = Integrator::new(s.ensemble, s.dt_fs, &all_masses, &device)?;
        self.starts = starts;
        Ok(())
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

    /// Number of systems, frozen ones included.
    pub fn systems(&self) -> usize {
        self.members.len()
    }

    /// The indices of the systems still in the batch.
    pub fn active(&self) -> &[usize] {
        &self.active
    }

    /// The force provider (e.g. to read a profiler it carries).
    pub fn forces(&self) -> &F {
        &self.forces
    }

    /// System `k`'s log so far.
    pub fn records(&self, k: usize) -> &[LogRecord] {
        &self.members[k].records
    }

    /// System `k`'s state now (where it was frozen, for a frozen one), on the host.
    pub fn system_state(&self, k: usize) -> Result<HostState> {
        let member = self.members.get(k).ok_or_else(|| {
            Error::Md(format!(
                "no system {k} (the run has {})",
                self.members.len()
            ))
        })?;
        if let Some((_, state)) = &member.frozen {
            return Ok(state.clone());
        }
        let slot = self.active.iter().position(|&m| m == k).unwrap_or(0);
        let (a, b) = (self.starts[slot], self.starts[slot + 1]);
        let rows = |t: &Tensor| host_positions(&t.narrow(0, a, b - a)?);
        Ok(HostState {
            step: self.state.step,
            positions: rows(&self.state.positions)?,
            velocities: rows(&self.state.velocities)?,
            forces: rows(&self.state.forces)?,
            energy: self.energies()?.get(slot)?.to_scalar::<f64>()?,
        })
    }

    /// Every system's state now (where it was frozen, for frozen ones), with one host read of
    /// the batch.
    pub fn host_states(&self) -> Result<Vec<HostState>> {
        let live = !self.active.is_empty();
        let rows = |t: &Tensor| match live {
            true => host_positions(t),
            false => Ok(Vec::new()),
        };
        let (x, v, f) = (
            rows(&self.state.positions)?,
            rows(&self.state.velocities)?,
            rows(&self.state.forces)?,
        );
        let energies = match live {
            true => self.energies()?.to_vec1::<f64>()?,
            false => Vec::new(),
        };
        let mut slots = vec![None; self.members.len()];
        for (slot, &m) in self.active.iter().enumerate() {
            slots[m] = Some(slot);
        }
        (self.members.iter().zip(slots))
            .map(|(member, slot)| match (&member.frozen, slot) {
                (Some((_, state)), _) => Ok(state.clone()),
                (None, Some(s)) => {
                    let (a, b) = (self.starts[s], self.starts[s + 1]);
                    Ok(HostState {
                        step: self.state.step,
                        positions: x[a..b].to_vec(),
                        velocities: v[a..b].to_vec(),
                        forces: f[a..b].to_vec(),
                        energy: energies[s],
                    })
                }
                (None, None) => Err(Error::Md(
                    "a system is neither in the batch nor frozen".into(),
                )),
            })
            .collect()
    }

    /// System `k`'s cell now (NPT moves it; where it was frozen, for a frozen one).
    pub fn cell(&self, k: usize) -> Option<crate::structure::Lattice> {
        self.members.get(k)?.system.cell
    }

    /// Why system `k` left the batch, if it did.
    pub fn frozen(&self, k: usize) -> Option<&StopReason> {
        self.members.get(k)?.frozen.as_ref().map(|(r, _)| r)
    }

    /// The energies of the systems in the batch, \[S\].
    fn energies(&self) -> Result<Tensor> {
        Ok(self.state.energy.reshape(self.active.len())?)
    }
}
