//! The pressure of a periodic cell in MD logs and summaries: the kinetic part 2 E_kin / 3V
//! and the stress's (ASE's sign: σ = (1/V) ∂E/∂ε).

use super::output::LogRecord;
use crate::stress::stress_volume;
use crate::structure::Structure;
use crate::units::BAR_PER_EV_A3;

/// The pressure in bar of `system` (its cell) with stress `sigma` and kinetic energy `e_kin`:
/// 2 E_kin / 3V less a third of the stress's trace.
pub(crate) fn pressure_bar(
    sigma: Option<crate::stress::Matrix3>,
    system: &Structure,
    e_kin: f64,
) -> Option<f64> {
    let (sigma, v) = (sigma?, stress_volume(system)?);
    let trace = sigma[0][0] + sigma[1][1] + sigma[2][2];
    Some((2.0 * e_kin / (3.0 * v) - trace / 3.0) * BAR_PER_EV_A3)
}

/// Mean and standard deviation of the logged pressures after step 0, if any.
pub(crate) fn pressure_stats(records: &[LogRecord]) -> Option<(f64, f64)> {
    let p: Vec<f64> = (records.iter())
        .filter(|r| r.step > 0)
        .filter_map(|r| r.pressure_bar)
        .collect();
    super::analysis::mean_std(&p)
}
