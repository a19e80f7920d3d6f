//! A batch run's outputs and restart files. The restart file holds every system (its state,
//! random stream, stability watch, its trajectory's length, or why and where it was frozen)
//! and the shared log's and trajectory's lengths, so that a killed run continues bit for bit
//! on the CPU, as a single run's restart file does.

use super::{BatchLogRecord, BatchSimulation, HostState, Member};
use crate::error::{Error, Result};
use crate::fsutil::{read_json, write_json};
use crate::md::analysis::Bonds;
use crate::md::continuity::{check_current, Recorded, RunPoint};
use crate::md::forces::ForceProvider;
use crate::md::integrator::{Ensemble, State};
use crate::md::npt::BarostatState;
use crate::md::output::{self, read_log_as, AppendFile, Tail};
use crate::md::positions::device_positions;
use crate::md::restart::{outputs_absolute, outputs_relative};
use crate::md::settings::{MdOutputs, MdSettings};
use crate::md::summary::StopReason;
use crate::md::velocities::{degrees_of_freedom, masses};
use crate::structure::{Lattice, Structure};
use candle_core::Tensor;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const BATCH_RESTART_FORMAT: &str = "mlff-md-batch-restart";
/// 2: systems may carry a barostat state (NPT); version 1 files still load.
const BATCH_RESTART_VERSION: u32 = 2;

/// One system of a batch restart file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SystemRestart {
    pub numbers: Vec<u8>,
    pub cell: Option<Lattice>,
    pub pbc: [bool; 3],
    /// Starting structure's bonds (i, j, length in Å).
    pub bonds: Vec<(u32, u32, f64)>,
    pub seed: u64,
    /// ChaCha20 word position (a u128, as text).
    pub rng_word_pos: String,
    /// Its state at the file's step, or where it was frozen.
    pub state: HostState,
    /// Why it left the batch, if it did.
    pub frozen: Option<StopReason>,
    pub max_bond_deviation: f64,
    pub unstable_at_step: Option<u64>,
    /// Its own trajectory's length and last record (`traj_split`).
    pub traj_bytes: Option<u64>,
    pub traj_tail: Option<Tail>,
    /// Its cell, stress and heat, and the cell its list was built in (NPT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub barostat: Option<BarostatState>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BatchRestart {
    pub format: String,
    pub version: u32,
    pub settings: MdSettings,
    pub step: u64,
    pub systems: Vec<SystemRestart>,
    /// Positions of the systems in the batch at the last list build.
    pub list_reference: Option<Vec<[f64; 3]>>,
    /// The shared trajectory's and the log's lengths and last records.
    pub traj_bytes: Option<u64>,
    pub traj_tail: Option<Tail>,
    pub log_bytes: Option<u64>,
    pub log_tail: Option<Tail>,
    pub run_id: String,
    pub list_builds: usize,
    /// What the caller needs to rebuild the force provider (model path and hash, dtype).
    pub caller: serde_json::Value,
}

/// The trajectory of system `k` in a folder of per-system trajectories.
pub fn system_traj(folder: &Path, k: usize) -> PathBuf {
    folder.join(format!("system-{k:04}.extxyz"))
}

/// Opens the log and the trajectories (fresh, or cut back to a restart's lengths).
pub(super) fn open_outputs(
    out: &MdOutputs,
    members: &mut [Member],
    resume: Option<&BatchRestart>,
) -> Result<(Option<AppendFile>, Option<AppendFile>)> {
    let shared = MdOutputs {
        traj: out.traj.clone().filter(|_| !out.traj_split),
        ..out.clone()
    };
    let recorded = resume.map(|r| {
        [
            (r.traj_bytes, r.traj_tail.clone()),
            (r.log_bytes, r.log_tail.clone()),
        ]
    });
    let (traj, log) = output::open_outputs(&shared, recorded)?;
    if let (true, Some(folder)) = (out.traj_split, &out.traj) {
        std::fs::create_dir_all(folder).map_err(|e| Error::Io {
            path: folder.clone(),
            cause: e,
        })?;
        for (k, m) in members.iter_mut().enumerate() {
            let path = system_traj(folder, k);
            m.traj = Some(match resume.map(|r| &r.systems[k]) {
                Some(SystemRestart {
                    traj_bytes: Some(len),
                    traj_tail,
                    ..
                }) => AppendFile::resume(&path, *len, traj_tail.clone())?,
                Some(_) => {
                    return Err(Error::Md(format!(
                        "{}: the restart file records no length for this trajectory",
                        path.display()
                    )))
                }
                None if out.append => AppendFile::append(&path)?,
                None => AppendFile::create(&path)?,
            });
        }
    }
    Ok((traj, log))
}

impl BatchRestart {
    /// Writes the file atomically, output paths relative to its folder.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut r = self.clone();
        outputs_relative(&mut r.settings.outputs, path);
        write_json(path, &r)
    }

    /// Reads and checks a batch restart file.
    pub fn load(path: &Path) -> Result<Self> {
        let mut r: BatchRestart = read_json(path, "an mlff md batch restart file")?;
        let bad = |msg: String| Error::Md(format!("restart file {}: {msg}", path.display()));
        if r.format != BATCH_RESTART_FORMAT || !(1..=BATCH_RESTART_VERSION).contains(&r.version) {
            return Err(bad(format!(
                "format `{}` version {}, this build reads `{BATCH_RESTART_FORMAT}` versions \
                 1 to {BATCH_RESTART_VERSION}",
                r.format, r.version
            )));
        }
        for (k, s) in r.systems.iter().enumerate() {
            let n = s.numbers.len();
            let st = &s.state;
            for (name, rows) in [
                ("positions", &st.positions),
                ("velocities", &st.velocities),
                ("forces", &st.forces),
            ] {
                if rows.len() != n {
                    return Err(bad(format!(
                        "system {k}: {n} atoms but {} {name}",
                        rows.len()
                    )));
                }
                if s.frozen.is_none() && rows.iter().flatten().any(|x| !x.is_finite()) {
                    return Err(bad(format!("system {k}: non-finite {name}")));
                }
            }
            if s.rng_word_pos.parse::<u128>().is_err() {
                return Err(bad(format!("system {k}: rng_word_pos is not an integer")));
            }
            if r.settings.barostat.is_some() && s.barostat.is_none() {
                return Err(bad(format!(
                    "system {k}: a constant-pressure run's system without a barostat state"
                )));
            }
        }
        let active: usize = (r.systems.iter())
            .filter(|s| s.frozen.is_none())
            .map(|s| s.numbers.len())
            .sum();
        if r.list_reference.as_ref().is_some_and(|l| l.len() != active) {
            return Err(bad(
                "neighbour-list reference has the wrong atom count".into()
            ));
        }
        outputs_absolute(&mut r.settings.outputs, path);
        Ok(r)
    }

    /// Refuses a resume from `path` (this file) that would lose or mix up data, as
    /// [`Restart::check_current`](crate::md::Restart::check_current) does for single runs.
    pub fn check_current(&self, path: &Path) -> Result<()> {
        let newer = |live: &Path| {
            BatchRestart::load(live)
                .ok()
                .filter(|r| r.run_id == self.run_id)
                .map(|r| r.step)
        };
        let o = &self.settings.outputs;
        let split: Vec<PathBuf> = match (&o.traj, o.traj_split) {
            (Some(folder), true) => (0..self.systems.len())
                .map(|k| system_traj(folder, k))
                .collect(),
            _ => Vec::new(),
        };
        let mut outputs: Vec<Recorded> = vec![(
            "log",
            o.log.as_ref(),
            self.log_bytes,
            self.log_tail.as_ref(),
        )];
        if !o.traj_split {
            let traj = (o.traj.as_ref(), self.traj_bytes, self.traj_tail.as_ref());
            outputs.push(("trajectory", traj.0, traj.1, traj.2));
        }
        for (p, s) in split.iter().zip(&self.systems) {
            outputs.push(("trajectory", Some(p), s.traj_bytes, s.traj_tail.as_ref()));
        }
        let run = RunPoint {
            step: self.step,
            restart_every: self.settings.restart_every,
            live: o.restart.as_deref(),
            otherwise: "copy the run's folder as it was at this restart and resume the copy",
        };
        check_current(path, run, newer, &outputs)
    }

    /// The systems still in the batch, in batch order (numbers, cell, pbc and positions),
    /// for the caller to build the force provider of [`BatchSimulation::resume`].
    pub fn active_systems(&self) -> Vec<Structure> {
        (self.systems.iter())
            .filter(|s| s.frozen.is_none())
            .map(|s| Structure {
                cell: s.cell,
                pbc: s.pbc,
                ..Structure::molecule(s.numbers.clone(), s.state.positions.clone())
            })
            .collect()
    }
}

impl<F: ForceProvider> BatchSimulation<F> {
    /// Continues the run a batch restart file describes, with a force provider the caller
    /// built for [`BatchRestart::active_systems`]. Outputs are cut back to the recorded
    /// lengths.
    pub fn resume(mut forces: F, restart: BatchRestart) -> Result<Self> {
        let settings = restart.settings.clone();
        settings.validate()?;
        let active: Vec<usize> = (0..restart.systems.len())
            .filter(|&k| restart.systems[k].frozen.is_none())
            .collect();
        if active.is_empty() || forces.systems() != active.len() {
            return Err(Error::Md(format!(
                "the restart has {} systems in its batch, the force provider computes {}",
                active.len(),
                forces.systems()
            )));
        }
        let com_fixed = settings.ensemble == Ensemble::Nve && !settings.keep_momenta;
        let mut members = Vec::with_capacity(restart.systems.len());
        for s in &restart.systems {
            let mut rng = ChaCha20Rng::seed_from_u64(s.seed);
            rng.set_word_pos(s.rng_word_pos.parse().unwrap_or(0));
            members.push(Member {
                system: Structure {
                    cell: s.cell,
                    pbc: s.pbc,
                    ..Structure::molecule(s.numbers.clone(), s.state.positions.clone())
                },
                masses: masses(&s.numbers)?,
                dof: degrees_of_freedom(s.numbers.len(), com_fixed),
                bonds: Bonds {
                    pairs: s.bonds.iter().map(|&(i, j, _)| (i, j)).collect(),
                    lengths: s.bonds.iter().map(|b| b.2).collect(),
                },
                seed: s.seed,
                rng,
                records: Vec::new(),
                max_bond_deviation: s.max_bond_deviation,
                unstable_at_step: s.unstable_at_step,
                traj: None,
                frozen: s.frozen.clone().map(|r| (r, s.state.clone())),
                barostat: s.barostat,
            });
        }
        // NPT: the list is rebuilt in the cells it was built in, then follows the cells now.
        let cells_of = |f: fn(&BarostatState) -> Option<Lattice>| -> Option<Vec<Lattice>> {
            (active.iter())
                .map(|&k| restart.systems[k].barostat.as_ref().and_then(f))
                .collect()
        };
        let (list_cells, cells) = (cells_of(|b| b.list_cell), cells_of(|b| Some(b.cell)));
        if let Some(c) = &list_cells {
            forces.set_cells(c)?;
        }
        if let Some(reference) = &restart.list_reference {
            forces.restore_list(reference)?;
        }
        if let (Some(_), Some(c)) = (&list_cells, &cells) {
            forces.set_cells(c)?;
        }
        let (traj, log) = open_outputs(&settings.outputs, &mut members, Some(&restart))?;
        if let (Some(l), Some(len)) = (&log, restart.log_bytes) {
            for row in read_log_as::<BatchLogRecord>(l.path(), len)? {
                if let Some(m) = members.get_mut(row.system) {
                    m.records.push(row.record);
                }
            }
        }
        let device = forces.device().clone();
        let rows = |f: fn(&HostState) -> &Vec<[f64; 3]>| -> Vec<[f64; 3]> {
            active
                .iter()
                .flat_map(|&k| f(&restart.systems[k].state).clone())
                .collect()
        };
        let energies: Vec<f64> = active
            .iter()
            .map(|&k| restart.systems[k].state.energy)
            .collect();
        let energy = Tensor::from_vec(energies, active.len(), &device)?;
        let state = State {
            positions: device_positions(&rows(|s| &s.positions), &device)?,
            velocities: device_positions(&rows(|s| &s.velocities), &device)?,
            forces: device_positions(&rows(|s| &s.forces), &device)?,
            energy: if active.len() == 1 {
                energy.squeeze(0)?
            } else {
                energy
            },
            step: restart.step,
        };
        let mut sim = Self::assemble(
            forces,
            settings,
            members,
            active,
            state,
            traj,
            log,
            restart.caller,
        )?;
        sim.run_id = restart.run_id;
        Ok(sim)
    }

    /// Writes the restart file atomically, after flushing the outputs it points into.
    pub fn write_restart(&mut self) -> Result<()> {
        let Some(path) = self.settings.outputs.restart.clone() else {
            return Ok(());
        };
        let traj_bytes = self.traj.as_mut().map(AppendFile::sync).transpose()?;
        let log_bytes = self.log.as_mut().map(AppendFile::sync).transpose()?;
        let mut systems = Vec::with_capacity(self.members.len());
        let list_cells = self.forces.list_cells();
        for (k, state) in self.host_states()?.into_iter().enumerate() {
            let slot = self.active.iter().position(|&a| a == k);
            let m = &mut self.members[k];
            // (A frozen system keeps the state it left with, and has no list.)
            let barostat = m.barostat.map(|mut b| {
                let cells = list_cells.as_ref();
                b.list_cell = slot.and_then(|slot| cells.and_then(|c| c.get(slot).copied()));
                b
            });
            let own_bytes = m.traj.as_mut().map(AppendFile::sync).transpose()?;
            systems.push(SystemRestart {
                numbers: m.system.numbers.clone(),
                cell: m.system.cell,
                pbc: m.system.pbc,
                bonds: (m.bonds.pairs.iter().zip(&m.bonds.lengths))
                    .map(|(&(i, j), &d)| (i, j, d))
                    .collect(),
                seed: m.seed,
                rng_word_pos: m.rng.get_word_pos().to_string(),
                state,
                frozen: m.frozen.as_ref().map(|(r, _)| r.clone()),
                max_bond_deviation: m.max_bond_deviation,
                unstable_at_step: m.unstable_at_step,
                traj_bytes: own_bytes,
                traj_tail: m.traj.as_ref().and_then(AppendFile::tail),
                barostat,
            });
        }
        let list_reference = match self.active.is_empty() {
            true => None,
            false => self.forces.list_reference()?,
        };
        let restart = BatchRestart {
            format: BATCH_RESTART_FORMAT.into(),
            version: BATCH_RESTART_VERSION,
            settings: self.settings.clone(),
            step: self.state.step,
            systems,
            list_reference,
            traj_bytes,
            traj_tail: self.traj.as_ref().and_then(AppendFile::tail),
            log_bytes,
            log_tail: self.log.as_ref().and_then(AppendFile::tail),
            run_id: self.run_id.clone(),
            list_builds: self.forces.list_builds(),
            caller: self.caller.clone(),
        };
        restart.save(&path)
    }
}
