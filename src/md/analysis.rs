//! What a trajectory is judged by: the bond-length stability criterion of Fu et al. (2023,
//! "Forces are not enough", TMLR), energy drift as a fitted slope, temperature statistics.

use crate::elements::covalent_radius;
use crate::error::{Error, Result};
use crate::neighbors::{minimum_image_distances, neighbor_list};
use crate::structure::Structure;

/// Fu et al.: a simulation is unstable once any bond deviates this much (Å) from its length
/// in the starting structure.
pub const BOND_DEVIATION_LIMIT: f64 = 0.5;

/// Two atoms are bonded when closer than this factor times the sum of their covalent radii.
pub const BOND_FACTOR: f64 = 1.2;

/// Atoms closer than this (Å) at the start are rejected as overlapping.
pub const MIN_SEPARATION: f64 = 0.5;

/// The bonds of a starting structure and their lengths.
#[derive(Clone, Debug, PartialEq)]
pub struct Bonds {
    pub pairs: Vec<(u32, u32)>,
    pub lengths: Vec<f64>,
}

/// The worst bond at some instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BondDeviation {
    /// Largest |length - starting length| in Å (0 without bonds).
    pub max: f64,
    /// Its atoms, when there are bonds.
    pub pair: Option<(u32, u32)>,
}

impl Bonds {
    /// Pairs closer than [`BOND_FACTOR`] × (r_cov,i + r_cov,j), each listed once (i < j).
    pub fn detect(s: &Structure) -> Result<Self> {
        let radius = |i: usize| {
            covalent_radius(s.numbers[i]).ok_or_else(|| {
                Error::Md(format!(
                    "atom {i}: no covalent radius for Z={}",
                    s.numbers[i]
                ))
            })
        };
        let radii = (0..s.len()).map(radius).collect::<Result<Vec<f64>>>()?;
        let largest = radii.iter().copied().fold(0.0, f64::max);
        if s.is_empty() || largest == 0.0 {
            return Ok(Self {
                pairs: Vec::new(),
                lengths: Vec::new(),
            });
        }
        let nl = neighbor_list(
            &s.positions,
            s.cell.as_ref(),
            s.pbc,
            2.0 * BOND_FACTOR * largest,
        )?;
        let mut pairs = Vec::new();
        for (d, (&i, &j)) in nl
            .distances(&s.positions, s.cell.as_ref())
            .iter()
            .zip(nl.centers.iter().zip(&nl.neighbors))
        {
            let bonded = *d < BOND_FACTOR * (radii[i as usize] + radii[j as usize]);
            // Sorted by (i, j, shift): repeats of a pair (other images) are adjacent.
            if i < j && bonded && pairs.last() != Some(&(i, j)) {
                pairs.push((i, j));
            }
        }
        let lengths = minimum_image_distances(&pairs, &s.positions, s.cell.as_ref(), s.pbc)?;
        Ok(Self { pairs, lengths })
    }

    /// The largest deviation from the starting lengths at `positions` (minimum image).
    pub fn deviation(&self, s: &Structure, positions: &[[f64; 3]]) -> Result<BondDeviation> {
        let now = minimum_image_distances(&self.pairs, positions, s.cell.as_ref(), s.pbc)?;
        let mut worst = BondDeviation {
            max: 0.0,
            pair: None,
        };
        for ((d, d0), &pair) in now.iter().zip(&self.lengths).zip(&self.pairs) {
            let dev = (d - d0).abs();
            if dev > worst.max || dev.is_nan() {
                worst = BondDeviation {
                    max: dev,
                    pair: Some(pair),
                };
                if dev.is_nan() {
                    break;
                }
            }
        }
        Ok(worst)
    }
}

/// Rejects atoms closer than [`MIN_SEPARATION`] (periodic images included), naming the pair.
pub fn check_separation(s: &Structure) -> Result<()> {
    let nl = neighbor_list(&s.positions, s.cell.as_ref(), s.pbc, MIN_SEPARATION)?;
    if let Some(((&i, &j), d)) = nl
        .centers
        .iter()
        .zip(&nl.neighbors)
        .zip(nl.distances(&s.positions, s.cell.as_ref()))
        .next()
    {
        return Err(Error::Md(format!(
            "atoms {i} and {j} are {d:.3} Å apart (closer than {MIN_SEPARATION} Å): \
             overlapping atoms"
        )));
    }
    Ok(())
}

/// Least-squares slope and intercept of y against x (`None` with fewer than two distinct x).
pub fn linear_fit(x: &[f64], y: &[f64]) -> Option<(f64, f64)> {
    let n = x.len().min(y.len());
    if n < 2 {
        return None;
    }
    let mx = x[..n].iter().sum::<f64>() / n as f64;
    let my = y[..n].iter().sum::<f64>() / n as f64;
    let sxx: f64 = x[..n].iter().map(|a| (a - mx) * (a - mx)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = x[..n]
        .iter()
        .zip(&y[..n])
        .map(|(a, b)| (a - mx) * (b - my))
        .sum();
    let slope = sxy / sxx;
    Some((slope, my - slope * mx))
}

/// Mean and (population) standard deviation; `None` when empty.
pub fn mean_std(v: &[f64]) -> Option<(f64, f64)> {
    if v.is_empty() {
        return None;
    }
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / v.len() as f64;
    Some((m, var.sqrt()))
}
