//! The O(N² · images) oracle: every ordered pair, every image shift in a provably large enough
//! box, no wrapping, no binning.

use super::{edge_vector, norm2, Geometry, NeighborList};
use crate::error::Result;
use crate::structure::Lattice;

/// Brute-force neighbour list with the same arguments and output as
/// [`neighbor_list`](super::neighbor_list); public as the test oracle.
///
/// Image range: with fractional coordinates `s = x · basis⁻¹`, the k-th fractional component of
/// `r_ij = x_j - x_i + S · cell` is `f_k = s_jk - s_ik + S_k`, and `|f_k| ≤ |r_ij| / d_k` where
/// `d_k` is the perpendicular width of axis k. Every pair with `|r_ij| < cutoff` therefore has
/// `|S_k| < cutoff / d_k + spread_k` (spread = max - min of `s_k` over the atoms), so
/// `S_k ∈ -R_k..=R_k` with `R_k = ceil(cutoff / d_k + spread_k) + 1` covers all of them.
pub fn brute_force_neighbor_list(
    positions: &[[f64; 3]],
    cell: Option<&Lattice>,
    pbc: [bool; 3],
    cutoff: f64,
) -> Result<NeighborList> {
    let g = Geometry::new(positions, cell, pbc, cutoff)?;
    let mut range = [0i32; 3];
    for (k, r) in range.iter_mut().enumerate() {
        if g.periodic[k] && !positions.is_empty() {
            let s: Vec<f64> = positions.iter().map(|x| g.frac(x)[k]).collect();
            let spread = s.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                - s.iter().copied().fold(f64::INFINITY, f64::min);
            *r = (cutoff / g.widths[k] + spread).ceil() as i32 + 1;
        }
    }
    let c2 = cutoff * cutoff;
    let mut edges: Vec<(u32, u32, [i32; 3])> = Vec::new();
    for (i, xi) in positions.iter().enumerate() {
        for (j, xj) in positions.iter().enumerate() {
            for s0 in -range[0]..=range[0] {
                for s1 in -range[1]..=range[1] {
                    for s2 in -range[2]..=range[2] {
                        let s = [s0, s1, s2];
                        if i == j && s == [0, 0, 0] {
                            continue;
                        }
                        if norm2(&edge_vector(xi, xj, s, &g.cell)) < c2 {
                            edges.push((i as u32, j as u32, s));
                        }
                    }
                }
            }
        }
    }
    edges.sort_unstable();
    let mut out = NeighborList::default();
    for (i, j, s) in edges {
        out.centers.push(i);
        out.neighbors.push(j);
        out.shifts.push(s);
    }
    Ok(out)
}
