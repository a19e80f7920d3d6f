//! The bins of a binned build: atoms sorted into bins at least one list cutoff wide along
//! every axis, so that each atom's candidates are the atoms of its own and the adjacent bins
//! (O(N) pair tests where the all-pairs kernels make O(N²): bench-log 73).

use super::step::GEOMETRY_LEN;
use crate::error::{Error, Result};

/// How a binned build sorts atoms into bins. Along axis k the coordinate is u_k = x · recip[k]:
/// the fractional coordinate along a periodic axis (wrapped into [0, 1)), a Cartesian one along
/// the unit vector the geometry completes a non-periodic axis with.
#[derive(Clone, Debug, PartialEq)]
pub struct BinGrid {
    /// As kernels/neighbors.cu reads it: bins per axis, then lo, then inv (bin = floor((u -
    /// lo) inv), clamped into the axis's bins).
    pub(super) values: [f64; 9],
}

impl BinGrid {
    /// Bins in all.
    pub fn bins(&self) -> usize {
        (0..3).map(|k| self.values[k] as usize).product()
    }

    /// Bins per axis.
    pub fn shape(&self) -> [usize; 3] {
        std::array::from_fn(|k| self.values[k] as usize)
    }

    /// The grid for `n` atoms, `cutoff` and the builder's geometry (`g`: reciprocal rows,
    /// periodic flags); along a non-periodic axis the atoms' range `ranges[k]` (from
    /// [`ranges`]). At most about 2 n bins: an axis has fewer, wider bins where the cell or the
    /// atoms' range would give more (wider bins stay correct, they hold more candidates).
    pub(super) fn new(
        g: &[f64; GEOMETRY_LEN],
        widths: [f64; 3],
        cutoff: f64,
        ranges: Option<[[f64; 2]; 3]>,
        n: usize,
    ) -> Result<Self> {
        let mut nb = [1usize; 3];
        let mut lo = [0.0; 3];
        let mut span = [1.0; 3];
        for k in 0..3 {
            let (extent, from, periodic) = if g[27 + k] != 0.0 {
                (widths[k], 0.0, true)
            } else {
                let r = ranges.ok_or_else(|| {
                    Error::NeighborList(format!(
                        "a binned build along non-periodic axis {k} needs the atoms' range"
                    ))
                })?[k];
                (r[1] - r[0], r[0], false)
            };
            if !(extent.is_finite() && extent >= 0.0) {
                return Err(Error::NeighborList(format!(
                    "the atoms span {extent} Å along axis {k}"
                )));
            }
            nb[k] = ((extent / cutoff).floor() as usize).max(1);
            lo[k] = from;
            span[k] = if periodic { 1.0 } else { extent };
        }
        let limit = 2 * n.max(4);
        while nb.iter().product::<usize>() > limit {
            let k = (0..3).max_by_key(|&k| nb[k]).unwrap_or(0);
            nb[k] = nb[k].div_ceil(2);
        }
        let mut values = [0.0; 9];
        for k in 0..3 {
            values[k] = nb[k] as f64;
            values[3 + k] = lo[k];
            // A zero range puts every atom in bin 0.
            values[6 + k] = if span[k] > 0.0 {
                nb[k] as f64 / span[k]
            } else {
                0.0
            };
        }
        Ok(Self { values })
    }
}

/// The range of u_k = x · recip[k] over `positions` along every axis (the non-periodic axes'
/// bins need it; the host has the positions where a domain session builds).
pub(super) fn ranges(g: &[f64; GEOMETRY_LEN], positions: &[[f64; 3]]) -> [[f64; 2]; 3] {
    let mut r = [[f64::INFINITY, f64::NEG_INFINITY]; 3];
    for x in positions {
        for (k, rk) in r.iter_mut().enumerate() {
            let u = x[0] * g[3 * k] + x[1] * g[3 * k + 1] + x[2] * g[3 * k + 2];
            rk[0] = rk[0].min(u);
            rk[1] = rk[1].max(u);
        }
    }
    if positions.is_empty() {
        r = [[0.0; 2]; 3];
    }
    r
}
