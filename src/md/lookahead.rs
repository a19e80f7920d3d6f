//! How many MD steps to run before reading their neighbour-list checks back
//! ([`ForceProvider::defer_list_checks`](super::ForceProvider::defer_list_checks)).
//!
//! Each host read of a check waits for the GPU to drain, after which it idles while the host
//! queues the next step's launches; reading the checks of a run of steps at once removes that
//! from all but the run's last step. A run whose list stops holding at some step keeps the
//! steps before it and redoes that one; the steps after it are thrown away, so a run should end
//! before the list is due. The atoms' largest displacement since the build grows about
//! linearly over tens of steps, so the next run is sized to end at [`MARGIN`] of the steps the
//! last one's growth leaves.

/// Longest run of deferred steps (the states of a run are kept until it is read).
pub const MOST_STEPS: usize = 64;
/// Fraction of the steps left until the list is due that a run takes.
const MARGIN: f64 = 0.75;

/// The next run's length, from the checks read so far.
#[derive(Clone, Debug)]
pub struct Lookahead {
    /// Growth of the largest displacement per step, as a fraction of the half skin (the
    /// last estimate; none yet).
    rate: Option<f64>,
    /// The largest displacement after the last step, as a fraction of the half skin.
    reached: f64,
}

impl Default for Lookahead {
    fn default() -> Self {
        Self {
            rate: None,
            reached: 0.0,
        }
    }
}

impl Lookahead {
    /// Steps to defer next, at most [`MOST_STEPS`]: until the first estimate a short run of 8;
    /// none when the list is about due (the next step had better check it).
    pub fn steps(&self) -> usize {
        let Some(rate) = self.rate.filter(|r| *r > 0.0) else {
            return if self.rate.is_some() { MOST_STEPS } else { 8 };
        };
        let left = (1.0 - self.reached).max(0.0) / rate;
        ((MARGIN * left).floor() as usize).min(MOST_STEPS)
    }

    /// Takes a run's checks (squared displacement over the squared half skin, per step; > 1
    /// or NaN where the list no longer held) and returns how many of its steps to keep: all,
    /// or those before the first whose list did not hold.
    pub fn read(&mut self, checks: &[f64]) -> usize {
        let kept = checks
            .iter()
            .position(|c| c.is_nan() || *c > 1.0)
            .unwrap_or(checks.len());
        let fractions: Vec<f64> = checks[..kept].iter().map(|c| c.sqrt()).collect();
        if let [first, .., last] = fractions[..] {
            self.rate = Some((last - first) / (fractions.len() - 1) as f64);
        }
        if kept < checks.len() {
            // The list is rebuilt at the step redone: the displacement starts again from 0.
            self.reached = 0.0;
        } else if let Some(&last) = fractions.last() {
            self.reached = last;
        }
        kept
    }

    /// The list was rebuilt (at a checked step): displacements count from 0 again.
    pub fn rebuilt(&mut self) {
        self.reached = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_ends_before_the_list_is_due() {
        let mut ahead = Lookahead::default();
        assert_eq!(ahead.steps(), 8);
        // Displacement fraction 0.01 per step: 0.05 .. 0.12 after 8 steps.
        let checks: Vec<f64> = (5..13).map(|k| (0.01 * k as f64).powi(2)).collect();
        assert_eq!(ahead.read(&checks), 8);
        // 0.88 of the half skin left at 0.01 a step: 88 steps, three quarters of them, capped.
        assert_eq!(ahead.steps(), MOST_STEPS);
        let checks: Vec<f64> = (50..60).map(|k| (0.01 * k as f64).powi(2)).collect();
        assert_eq!(ahead.read(&checks), 10);
        // 0.41 left: 41 steps, 30 of them.
        assert_eq!(ahead.steps(), 30);
        // 0.01 left: none.
        let checks: Vec<f64> = (97..100).map(|k| (0.01 * k as f64).powi(2)).collect();
        assert_eq!(ahead.read(&checks), 3);
        assert_eq!(ahead.steps(), 0);
    }

    #[test]
    fn steps_after_the_first_broken_list_are_dropped() {
        let mut ahead = Lookahead::default();
        assert_eq!(ahead.read(&[0.81, 0.9025, 1.0201, 0.5]), 2);
        assert_eq!(ahead.read(&[0.1, f64::NAN, 0.2]), 1);
        assert_eq!(ahead.read(&[f64::NAN]), 0);
        // After a drop the list is rebuilt: a whole half skin at the last rate (0.05 a step).
        let mut ahead = Lookahead::default();
        assert_eq!(ahead.read(&[0.81, 0.9025, 1.0201]), 2);
        assert_eq!(ahead.steps(), 15);
    }

    #[test]
    fn atoms_at_rest_take_the_longest_runs() {
        let mut ahead = Lookahead::default();
        assert_eq!(ahead.read(&[0.0, 0.0, 0.0]), 3);
        assert_eq!(ahead.steps(), MOST_STEPS);
        ahead.rebuilt();
        assert_eq!(ahead.steps(), MOST_STEPS);
    }
}
