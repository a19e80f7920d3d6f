//! A run's log judged over its first k steps ([`Window`]): stability, energy drift, temperature.
//! Below both the driver (its closing summary) and the validation suite (one per window), so
//! that neither has to import the other for it.

use super::analysis::{linear_fit, mean_std, BOND_DEVIATION_LIMIT};
use super::output::LogRecord;
use serde::Serialize;

/// Metrics of a run's first `steps` steps, from its log.
#[derive(Clone, Debug, Serialize)]
pub struct Window {
    pub steps: u64,
    /// Last logged step inside the window (less than `steps` when the run stopped early).
    pub reached_step: u64,
    pub stable: bool,
    pub first_unstable_step: Option<u64>,
    pub max_bond_deviation: f64,
    /// Fitted slope of E_tot(t), meV/atom/ps (NVE; NPT: of the effective energy).
    pub energy_drift_mev_per_atom_ps: Option<f64>,
    /// Standard deviation of E_tot, meV/atom (NVE).
    pub energy_std_mev_per_atom: Option<f64>,
    /// Kinetic temperature after step 0, K.
    pub temperature_mean: Option<f64>,
    pub temperature_std: Option<f64>,
}

/// Judges the records up to `steps`. `nonfinite_at` is the step where the run went NaN, if it
/// did; `conserved` selects the energy metrics (NVE, and NPT's effective energy).
pub fn window(
    records: &[LogRecord],
    atoms: usize,
    steps: u64,
    conserved: bool,
    nonfinite_at: Option<u64>,
) -> Window {
    let rec: Vec<&LogRecord> = records.iter().filter(|r| r.step <= steps).collect();
    let t_ps: Vec<f64> = rec.iter().map(|r| r.time_fs / 1000.0).collect();
    // NPT runs conserve the effective energy instead.
    let e: Vec<f64> = rec
        .iter()
        .map(|r| 1000.0 * r.e_eff.unwrap_or(r.e_tot) / atoms.max(1) as f64)
        .collect();
    let temps: Vec<f64> = rec
        .iter()
        .filter(|r| r.step > 0)
        .map(|r| r.temperature)
        .collect();
    let t_stats = mean_std(&temps);
    let first_unstable_step = rec
        .iter()
        .find(|r| r.bond_deviation > BOND_DEVIATION_LIMIT)
        .map(|r| r.step);
    let blew_up = nonfinite_at.is_some_and(|s| s <= steps);
    Window {
        steps,
        reached_step: rec.last().map_or(0, |r| r.step),
        stable: first_unstable_step.is_none() && !blew_up,
        first_unstable_step,
        max_bond_deviation: rec.iter().map(|r| r.bond_deviation).fold(0.0, f64::max),
        energy_drift_mev_per_atom_ps: linear_fit(&t_ps, &e).map(|f| f.0).filter(|_| conserved),
        energy_std_mev_per_atom: mean_std(&e).map(|m| m.1).filter(|_| conserved),
        temperature_mean: t_stats.map(|t| t.0),
        temperature_std: t_stats.map(|t| t.1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(step: u64, e_tot: f64, bond_deviation: f64) -> LogRecord {
        LogRecord {
            step,
            time_fs: step as f64,
            e_pot: e_tot - 1.0,
            e_kin: 1.0,
            e_tot,
            temperature: 100.0 + step as f64,
            bond_deviation,
            pressure_bar: None,
            volume: None,
            density: None,
            e_eff: None,
        }
    }

    #[test]
    fn windows_judge_only_their_own_steps() {
        // E_tot rises 2 meV per fs over 2 atoms: 1000 meV/atom/ps; a bond breaks at step 30.
        let recs: Vec<LogRecord> = (0..=5)
            .map(|k| record(10 * k, 0.02 * k as f64, if k >= 3 { 0.6 } else { 0.1 }))
            .collect();
        let early = window(&recs, 2, 20, true, None);
        assert!(early.stable && early.first_unstable_step.is_none());
        assert_eq!(early.reached_step, 20);
        assert!((early.energy_drift_mev_per_atom_ps.unwrap() - 1000.0).abs() < 1e-9);
        assert_eq!(early.temperature_mean, Some(115.0));
        let late = window(&recs, 2, 50, true, None);
        assert!(!late.stable);
        assert_eq!(late.first_unstable_step, Some(30));
        assert_eq!(late.max_bond_deviation, 0.6);
        let nan = window(&recs[..2], 2, 50, false, Some(15));
        assert!(!nan.stable && nan.energy_drift_mev_per_atom_ps.is_none());
    }
}
