//! The closing numbers of a batch run: one row per system (as a single run's summary) and the
//! totals (aggregate atom-steps per second).

use super::BatchSimulation;
use crate::md::forces::ForceProvider;
use crate::md::integrator::Ensemble;
use crate::md::summary::{judge, MdSummary, StopReason};
use serde::Serialize;

/// One system's row.
#[derive(Clone, Debug, Serialize)]
pub struct SystemSummary {
    pub system: usize,
    pub atoms: usize,
    /// Its last step: the run's, or the one it was frozen at.
    pub last_step: u64,
    pub simulated_ps: f64,
    /// Slope of a least-squares line through E_tot(t) (NPT: the effective energy), meV/atom/ps
    /// (NVE and NPT only).
    pub energy_drift_mev_per_atom_ps: Option<f64>,
    pub energy_std_mev_per_atom: Option<f64>,
    pub temperature_mean: Option<f64>,
    pub temperature_std: Option<f64>,
    /// Pressure after step 0 (`log_pressure`), bar.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pressure_mean_bar: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pressure_std_bar: Option<f64>,
    /// Volume and density after step 0 (NPT), Å³ and g/cm³.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_mean_a3: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_std_a3: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub density_mean_g_cm3: Option<f64>,
    pub bonds: usize,
    pub max_bond_deviation: f64,
    pub stable: bool,
    pub finite: bool,
    /// `completed` for systems that ran to the end (or to an interruption) in the batch.
    pub stop: StopReason,
}

/// The run's totals and its systems' rows.
#[derive(Clone, Debug, Serialize)]
pub struct BatchSummary {
    pub ensemble: String,
    pub dt_fs: f64,
    pub first_step: u64,
    pub last_step: u64,
    /// This invocation only.
    pub wall_s: f64,
    pub steps_per_s: f64,
    /// Atoms times steps, over all systems while in the batch, per second of wall time.
    pub atom_steps_per_s: f64,
    /// Simulated time per day of one system (all run at once).
    pub ns_per_day: f64,
    pub atoms: usize,
    /// The bond deviation (Å) past which a system counts as unstable.
    pub bond_limit: f64,
    pub stable_systems: usize,
    pub frozen_systems: usize,
    /// Completed, or interrupted.
    pub stop: StopReason,
    pub neighbor_list_builds: usize,
    pub deferred_steps: u64,
    pub redone_steps: u64,
    pub systems: Vec<SystemSummary>,
}

impl<F: ForceProvider> BatchSimulation<F> {
    pub(super) fn summary(&self, first_step: u64, wall_s: f64, stop: StopReason) -> BatchSummary {
        let s = &self.settings;
        // The energy a run conserves: E_tot (NVE), the effective energy (NPT).
        let conserved = s.ensemble == Ensemble::Nve || s.barostat.is_some();
        let mut atom_steps = 0u64;
        let mut rows = Vec::with_capacity(self.members.len());
        for (k, m) in self.members.iter().enumerate() {
            let (last_step, reason) = match &m.frozen {
                Some((reason, state)) => (state.step, reason.clone()),
                None => (self.state.step, StopReason::Completed),
            };
            let n = m.masses.len();
            atom_steps += n as u64 * last_step.saturating_sub(first_step);
            let j = judge(
                &m.records,
                n,
                last_step,
                conserved,
                m.unstable_at_step,
                &reason,
            );
            rows.push(SystemSummary {
                system: k,
                atoms: n,
                last_step,
                simulated_ps: last_step as f64 * s.dt_fs / 1000.0,
                energy_drift_mev_per_atom_ps: j.energy_drift_mev_per_atom_ps,
                energy_std_mev_per_atom: j.energy_std_mev_per_atom,
                temperature_mean: j.temperature_mean,
                temperature_std: j.temperature_std,
                pressure_mean_bar: j.pressure_mean_bar,
                pressure_std_bar: j.pressure_std_bar,
                volume_mean_a3: j.volume_mean_a3,
                volume_std_a3: j.volume_std_a3,
                density_mean_g_cm3: j.density_mean_g_cm3,
                bonds: m.bonds.pairs.len(),
                max_bond_deviation: m.max_bond_deviation,
                stable: j.stable,
                finite: j.finite,
                stop: reason,
            });
        }
        let steps = self.state.step - first_step;
        let steps_per_s = steps as f64 / wall_s.max(1e-9);
        BatchSummary {
            ensemble: s.ensemble_name().into(),
            dt_fs: s.dt_fs,
            first_step,
            last_step: self.state.step,
            wall_s,
            steps_per_s,
            atom_steps_per_s: atom_steps as f64 / wall_s.max(1e-9),
            ns_per_day: steps_per_s * s.dt_fs * 86_400.0 * 1e-6,
            atoms: rows.iter().map(|r| r.atoms).sum(),
            bond_limit: s.bond_limit,
            stable_systems: rows.iter().filter(|r| r.stable).count(),
            frozen_systems: self.members.iter().filter(|m| m.frozen.is_some()).count(),
            stop,
            neighbor_list_builds: self.forces.list_builds(),
            deferred_steps: self.deferred.0,
            redone_steps: self.deferred.1,
            systems: rows,
        }
    }
}

impl BatchSummary {
    /// System `k`'s row as a single run's summary (the speed and list figures are the
    /// batch's).
    pub fn run_summary(&self, k: usize) -> Option<MdSummary> {
        let r = self.systems.get(k)?;
        Some(MdSummary {
            atoms: r.atoms,
            ensemble: self.ensemble.clone(),
            dt_fs: self.dt_fs,
            first_step: self.first_step,
            last_step: r.last_step,
            simulated_ps: r.simulated_ps,
            wall_s: self.wall_s,
            steps_per_s: self.steps_per_s,
            ns_per_day: self.ns_per_day,
            energy_drift_mev_per_atom_ps: r.energy_drift_mev_per_atom_ps,
            energy_std_mev_per_atom: r.energy_std_mev_per_atom,
            temperature_mean: r.temperature_mean,
            temperature_std: r.temperature_std,
            pressure_mean_bar: r.pressure_mean_bar,
            pressure_std_bar: r.pressure_std_bar,
            volume_mean_a3: r.volume_mean_a3,
            volume_std_a3: r.volume_std_a3,
            density_mean_g_cm3: r.density_mean_g_cm3,
            bonds: r.bonds,
            max_bond_deviation: r.max_bond_deviation,
            bond_limit: self.bond_limit,
            stable: r.stable,
            finite: r.finite,
            stop: r.stop.clone(),
            neighbor_list_builds: self.neighbor_list_builds,
            deferred_steps: self.deferred_steps,
            redone_steps: self.redone_steps,
            one_launch_steps: 0,
        })
    }
}
