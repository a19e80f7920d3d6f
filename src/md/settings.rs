//! What defines an MD run ([`MdSettings`], [`MdOutputs`]). Apart from the driver (`run`) so
//! that restart files, which store the settings, do not depend on the driver that writes them.

use super::analysis::BOND_DEVIATION_LIMIT;
use super::barostat::Barostat;
use super::integrator::Ensemble;
use crate::error::{Error, Result};
use crate::graph::Graphs;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Where a run writes. Every file is opened (and the restart folder probed) before step 0.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MdOutputs {
    pub traj: Option<PathBuf>,
    pub log: Option<PathBuf>,
    pub restart: Option<PathBuf>,
    /// Add to an existing trajectory and log instead of starting them anew.
    #[serde(default)]
    pub append: bool,
    /// A batch run writes one trajectory per system, `traj` being their folder
    /// (`system-0000.extxyz`, ...), instead of one file with a `system` key per frame.
    #[serde(default)]
    pub traj_split: bool,
}

/// Everything that defines a run (stored in restart files).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MdSettings {
    /// Time step in fs.
    pub dt_fs: f64,
    /// Total number of steps (a resumed run continues to this step).
    pub steps: u64,
    pub ensemble: Ensemble,
    /// Maxwell-Boltzmann starting temperature in K (unless `keep_momenta`).
    pub init_temperature: f64,
    /// Start from the structure's `momenta` column instead of random velocities.
    pub keep_momenta: bool,
    /// Seeds the starting velocities and the Langevin noise.
    pub seed: u64,
    /// Verlet skin in Å for neighbour-list providers.
    pub skin: f64,
    pub log_every: u64,
    /// Trajectory frame every k steps (0: none).
    pub traj_every: u64,
    /// Restart file every k steps and at the end (0: none).
    pub restart_every: u64,
    /// Stop at the first step that breaks the bond-length criterion.
    pub stop_when_unstable: bool,
    /// The criterion: a run is unstable once a bond is this much (Å) off its starting length.
    /// Fu et al.'s 0.5 Å by default, which is for molecules; a hot crystal's bonds stretch
    /// by nearly that much while it stays intact.
    #[serde(default = "default_bond_limit")]
    pub bond_limit: f64,
    /// Pressure in every log row of a batch of periodic cells (an extra force call with the
    /// stress at each log step). Single runs of cells periodic along all three axes log it
    /// anyway, from their logging steps' own calls; for them this only insists on a cell.
    #[serde(default)]
    pub log_pressure: bool,
    /// Constant pressure (NPT) with this barostat, on the Langevin thermostat of `ensemble`.
    #[serde(default)]
    pub barostat: Option<Barostat>,
    pub outputs: MdOutputs,
}

impl Default for MdSettings {
    fn default() -> Self {
        Self {
            dt_fs: 0.5,
            steps: 1000,
            ensemble: Ensemble::Nve,
            init_temperature: 300.0,
            keep_momenta: false,
            seed: 0,
            skin: 1.0,
            log_every: 10,
            traj_every: 100,
            restart_every: 0,
            stop_when_unstable: true,
            bond_limit: BOND_DEVIATION_LIMIT,
            log_pressure: false,
            barostat: None,
            outputs: MdOutputs::default(),
        }
    }
}

/// What a step writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Writes {
    pub log: bool,
    pub traj: bool,
    pub restart: bool,
}

fn default_bond_limit() -> f64 {
    BOND_DEVIATION_LIMIT
}

impl MdSettings {
    /// What step `k` writes (the last step always logs, and writes a restart file if the
    /// run writes them).
    pub(super) fn writes_at(&self, k: u64) -> Writes {
        Writes {
            log: k.is_multiple_of(self.log_every) || k == self.steps,
            traj: self.traj_every > 0 && k.is_multiple_of(self.traj_every),
            restart: self.restart_every > 0
                && (k.is_multiple_of(self.restart_every) || k == self.steps),
        }
    }

    /// The first step after `k` that logs, writes a frame or a restart file, or ends the run.
    pub(super) fn next_output_step(&self, k: u64) -> u64 {
        let next = |every: u64| match every {
            0 => u64::MAX,
            e => (k / e + 1) * e,
        };
        next(self.log_every)
            .min(next(self.traj_every))
            .min(next(self.restart_every))
            .min(self.steps)
    }

    /// Checks the settings before a run starts or resumes.
    pub fn validate(&self) -> Result<()> {
        if self.log_every == 0 {
            return Err(Error::Md("log interval must be at least 1 step".into()));
        }
        if !(self.init_temperature.is_finite() && self.init_temperature >= 0.0) {
            return Err(Error::Md(format!(
                "starting temperature must be finite and >= 0 K, got {}",
                self.init_temperature
            )));
        }
        if !(self.bond_limit.is_finite() && self.bond_limit > 0.0) {
            return Err(Error::Md(format!(
                "the bond limit must be a positive length in Å, got {}",
                self.bond_limit
            )));
        }
        if !(self.skin.is_finite() && self.skin >= 0.0) {
            return Err(Error::Md(format!(
                "Verlet skin must be finite and >= 0 Å, got {}",
                self.skin
            )));
        }
        if self.restart_every > 0 && self.outputs.restart.is_none() {
            return Err(Error::Md(
                "restart interval given without a restart file path".into(),
            ));
        }
        if let Some(b) = &self.barostat {
            b.validate()?;
            if !matches!(self.ensemble, Ensemble::Nvt { .. }) {
                return Err(Error::Md(
                    "constant pressure runs on the Langevin thermostat (NVT settings)".into(),
                ));
            }
        }
        self.ensemble.validate()
    }

    /// The CUDA graphs a run of these settings can use, `asked` for: none at constant
    /// pressure, whose steps run op by op (the cell and the image offsets move every step;
    /// `on` is refused there).
    pub fn graphs(&self, asked: Graphs) -> Result<Graphs> {
        match (self.barostat, asked) {
            (None, g) => Ok(g),
            (Some(_), Graphs::On) => Err(Error::Md(
                "--graphs on: constant-pressure steps run op by op (the cell and the image \
                 offsets move every step); use auto or off"
                    .into(),
            )),
            (Some(_), _) => Ok(Graphs::Off),
        }
    }

    /// The ensemble's name in logs and summaries: nve, nvt or npt.
    pub fn ensemble_name(&self) -> &'static str {
        match self.barostat {
            Some(_) => "npt",
            None => self.ensemble.name(),
        }
    }
}
