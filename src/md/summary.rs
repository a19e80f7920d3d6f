//! What a run ends with: why it stopped ([`StopReason`]) and its closing numbers
//! ([`MdSummary`]). Apart from the driver (`run`) so that batch runs and the validation suite
//! name them without it.

use super::analysis::mean_std;
use super::output::LogRecord;
use super::pressure::pressure_stats;
use super::window::window;
use serde::Serialize;

/// Why a run ended.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StopReason {
    Completed,
    Unstable {
        step: u64,
        atoms: (u32, u32),
        deviation: f64,
    },
    NonFinite {
        step: u64,
        what: String,
    },
    /// SIGINT or SIGTERM (or [`StopFlag::raise`]): the restart file (if the run has one) was
    /// written at `step`.
    Interrupted {
        step: u64,
        signal: i32,
    },
}

/// The closing numbers of a run (covering the whole trajectory, resumed parts included, as
/// far as the log reaches).
#[derive(Clone, Debug, Serialize)]
pub struct MdSummary {
    pub atoms: usize,
    pub ensemble: String,
    pub dt_fs: f64,
    pub first_step: u64,
    pub last_step: u64,
    pub simulated_ps: f64,
    /// This invocation only.
    pub wall_s: f64,
    pub steps_per_s: f64,
    pub ns_per_day: f64,
    /// Slope of a least-squares line through E_tot(t), meV/atom/ps (NVE; NPT: through the
    /// effective energy E_tot + P₀V + heat exchanged with thermostat and barostat).
    pub energy_drift_mev_per_atom_ps: Option<f64>,
    /// Standard deviation of E_tot, meV/atom (NVE; NPT: of the effective energy).
    pub energy_std_mev_per_atom: Option<f64>,
    /// Kinetic temperature after step 0: mean and standard deviation, K.
    pub temperature_mean: Option<f64>,
    pub temperature_std: Option<f64>,
    /// Pressure after step 0 (`log_pressure`): mean and standard deviation, bar.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pressure_mean_bar: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pressure_std_bar: Option<f64>,
    /// NPT runs: cell volume after step 0, mean and standard deviation (Å³), and the mean
    /// density (g/cm³).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_mean_a3: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume_std_a3: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub density_mean_g_cm3: Option<f64>,
    pub bonds: usize,
    pub max_bond_deviation: f64,
    /// The deviation (Å) past which the run counts as unstable.
    pub bond_limit: f64,
    pub stable: bool,
    pub finite: bool,
    pub stop: StopReason,
    pub neighbor_list_builds: usize,
    /// Steps run with deferred neighbour-list checks (this invocation), and those of them
    /// thrown away because the list had stopped holding before them.
    pub deferred_steps: u64,
    pub redone_steps: u64,
    /// Steps run as one kernel launch each, integrator folded into the force kernel (so far,
    /// over the provider's life; with those of deferred runs later thrown away).
    pub one_launch_steps: u64,
}

/// What a trajectory's log and stop say about it: the figures a single run's summary and a
/// batch's row per system share.
pub(super) struct Judged {
    pub energy_drift_mev_per_atom_ps: Option<f64>,
    pub energy_std_mev_per_atom: Option<f64>,
    pub temperature_mean: Option<f64>,
    pub temperature_std: Option<f64>,
    pub pressure_mean_bar: Option<f64>,
    pub pressure_std_bar: Option<f64>,
    pub volume_mean_a3: Option<f64>,
    pub volume_std_a3: Option<f64>,
    pub density_mean_g_cm3: Option<f64>,
    pub stable: bool,
    pub finite: bool,
}

/// Judges a trajectory of `atoms` atoms from its log up to `last_step` (energy metrics where
/// `conserved`), whether it ever went unstable, and why it stopped.
pub(super) fn judge(
    records: &[LogRecord],
    atoms: usize,
    last_step: u64,
    conserved: bool,
    unstable_at_step: Option<u64>,
    stop: &StopReason,
) -> Judged {
    let w = window(records, atoms, last_step, conserved, None);
    let pressure = pressure_stats(records);
    let after_start = |f: fn(&LogRecord) -> Option<f64>| -> Vec<f64> {
        records
            .iter()
            .filter(|r| r.step > 0)
            .filter_map(f)
            .collect()
    };
    let volume = mean_std(&after_start(|r| r.volume));
    let density = mean_std(&after_start(|r| r.density));
    let finite = !matches!(stop, StopReason::NonFinite { .. });
    Judged {
        energy_drift_mev_per_atom_ps: w.energy_drift_mev_per_atom_ps,
        energy_std_mev_per_atom: w.energy_std_mev_per_atom,
        temperature_mean: w.temperature_mean,
        temperature_std: w.temperature_std,
        pressure_mean_bar: pressure.map(|p| p.0),
        pressure_std_bar: pressure.map(|p| p.1),
        volume_mean_a3: volume.map(|v| v.0),
        volume_std_a3: volume.map(|v| v.1),
        density_mean_g_cm3: density.map(|d| d.0),
        stable: unstable_at_step.is_none() && finite,
        finite,
    }
}
