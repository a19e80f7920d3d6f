//! Summary statistics of timing samples.

use serde::{Deserialize, Serialize};

/// Mean, spread and percentiles of a sample (same unit as the samples).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub n: usize,
    pub mean: f64,
    pub median: f64,
    /// Sample standard deviation (n - 1 in the denominator; 0 for one sample).
    pub std: f64,
    pub min: f64,
    pub max: f64,
    pub p95: f64,
    pub p99: f64,
    /// Coefficient of variation, std / mean.
    pub cv: f64,
}

/// The `q`-quantile (0..=1) of sorted values by linear interpolation between closest ranks
/// (NumPy's default): position q·(n-1).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let lo = pos.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            sorted[lo] + (pos - lo as f64) * (sorted[hi] - sorted[lo])
        }
    }
}

impl Stats {
    /// Statistics of `samples` (non-finite values are dropped); `None` when nothing is left.
    pub fn of(samples: &[f64]) -> Option<Self> {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        let std = var.sqrt();
        Some(Self {
            n,
            mean,
            median: quantile(&v, 0.5),
            std,
            min: v[0],
            max: v[n - 1],
            p95: quantile(&v, 0.95),
            p99: quantile(&v, 0.99),
            cv: if mean != 0.0 { std / mean } else { 0.0 },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use approx::assert_relative_eq;

    #[test]
    fn hand_computed_values() {
        let s = Stats::of(&[4.0, 1.0, 3.0, 2.0, 5.0]).unwrap();
        assert_eq!(
            (s.n, s.min, s.max, s.median, s.mean),
            (5, 1.0, 5.0, 3.0, 3.0)
        );
        // Sample variance (1+4+0+1+4... ) = (4+1+0+1+4)/4 = 2.5.
        assert_relative_eq!(s.std, 2.5f64.sqrt(), epsilon = 1e-15);
        assert_relative_eq!(s.cv, 2.5f64.sqrt() / 3.0, epsilon = 1e-15);
        // Positions 0.95·4 = 3.8 and 0.99·4 = 3.96: between 4 and 5.
        assert_relative_eq!(s.p95, 4.8, epsilon = 1e-12);
        assert_relative_eq!(s.p99, 4.96, epsilon = 1e-12);
    }

    #[test]
    fn percentiles_of_1_to_100() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Stats::of(&v).unwrap();
        // numpy.percentile(range(1, 101), [50, 95, 99]) = 50.5, 95.05, 99.01
        assert_relative_eq!(s.median, 50.5, epsilon = 1e-12);
        assert_relative_eq!(s.p95, 95.05, epsilon = 1e-12);
        assert_relative_eq!(s.p99, 99.01, epsilon = 1e-12);
        let one = Stats::of(&[7.0, f64::NAN]).unwrap();
        assert_eq!((one.n, one.p99, one.std), (1, 7.0, 0.0));
        assert!(Stats::of(&[]).is_none());
    }
}
