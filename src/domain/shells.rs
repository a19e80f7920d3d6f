//! The order of a domain's atoms for a shell call ([`FusedPainn::shell_call`]): its own atoms
//! first, then the ghosts by depth, and how many atoms each block updates.
//!
//! A ghost's depth is its distance from the box around the domain's own atoms, measured across
//! the axes the cell does not make periodic (along those the cell gives the images), in units
//! of the list cutoff, rounded up (at least 1). An edge of the list, built at these positions,
//! joins atoms less than one list cutoff apart, so its ends differ in depth by at most one:
//! block k of B, which updates the atoms of depth ≤ B − 1 − k, reads only atoms the block
//! before updated. The order is made at each build of the list and kept until the next.
//!
//! [`FusedPainn::shell_call`]: crate::model::FusedPainn::shell_call

use crate::error::Result;
use crate::neighbors::Geometry;
use crate::structure::Lattice;

/// A domain's atoms by depth, for the list built with them.
pub(super) struct ShellOrder {
    /// The caller's index of the atom at each place.
    order: Vec<usize>,
    /// The own-atom count the order was made for.
    n_local: usize,
    /// Atoms updated by each block: those of depth ≤ B − 1 − k.
    pub(super) rows: Vec<usize>,
}

impl ShellOrder {
    /// The order of the atoms at `positions` (the first `n_local` the domain's own) for a list of
    /// cutoff `reach` and a model of `blocks` blocks, in `cell` with periodic axes `pbc`.
    pub(super) fn new(
        positions: &[[f64; 3]],
        n_local: usize,
        cell: Option<&Lattice>,
        pbc: [bool; 3],
        reach: f64,
        blocks: usize,
    ) -> Result<Self> {
        let g = Geometry::of_cell(cell, pbc)?;
        let free: Vec<usize> = (0..3).filter(|&k| !g.periodic[k]).collect();
        let u = |x: &[f64; 3], k: usize| (0..3).map(|c| x[c] * g.recip[k][c]).sum::<f64>();
        let mut lo = [f64::INFINITY; 3];
        let mut hi = [f64::NEG_INFINITY; 3];
        for x in &positions[..n_local] {
            for &k in &free {
                lo[k] = lo[k].min(u(x, k));
                hi[k] = hi[k].max(u(x, k));
            }
        }
        let depth = |x: &[f64; 3]| -> usize {
            let d2: f64 = (free.iter())
                .map(|&k| {
                    let v = u(x, k);
                    (lo[k] - v).max(v - hi[k]).max(0.0).powi(2)
                })
                .sum();
            // NaN (no own atoms) and far ghosts alike: past every block.
            let d = (d2.sqrt() / reach).ceil();
            if d.is_finite() {
                (d as usize).clamp(1, blocks)
            } else {
                blocks
            }
        };
        let depths: Vec<usize> = (positions.iter().enumerate())
            .map(|(i, x)| if i < n_local { 0 } else { depth(x) })
            .collect();
        let mut order: Vec<usize> = (0..positions.len()).collect();
        order[n_local..].sort_by_key(|&i| depths[i]);
        let rows = (0..blocks)
            .map(|k| depths.iter().filter(|&&d| d < blocks - k).count())
            .collect();
        Ok(Self {
            order,
            n_local,
            rows,
        })
    }

    /// Whether the order was made for this many atoms and own atoms (a depth does not depend
    /// on the element; moved atoms are the list's to notice).
    pub(super) fn fits(&self, n_atoms: usize, n_local: usize) -> bool {
        self.n_local == n_local && self.order.len() == n_atoms
    }

    /// The caller's `values` (one per atom) in this order.
    pub(super) fn apply<T: Copy>(&self, values: &[T]) -> Vec<T> {
        self.order.iter().map(|&i| values[i]).collect()
    }

    /// `values` in this order back in the caller's.
    pub(super) fn undo<T: Copy + Default>(&self, values: &[T]) -> Vec<T> {
        let mut out = vec![T::default(); values.len()];
        for (&i, v) in self.order.iter().zip(values) {
            out[i] = *v;
        }
        out
    }
}
