//! Verlet list: a neighbour list built with `cutoff + skin` and reused while no atom has moved
//! more than `skin / 2` since the build (then no pair can have closed in by more than `skin`).

use super::{edge_vector, neighbor_list_into, norm2, NeighborList};
use crate::error::{Error, Result};
use crate::structure::Lattice;

/// Neighbour list with a skin, for MD.
///
/// Displacements are measured in unwrapped coordinates: MD must not wrap positions between
/// rebuilds (if it does, call [`VerletList::invalidate`] or let [`VerletList::update`] see the
/// jump, which counts as a large move and rebuilds). A change of cell or pbc always rebuilds.
#[derive(Clone, Debug)]
pub struct VerletList {
    cutoff: f64,
    skin: f64,
    list: NeighborList,
    reference: Vec<[f64; 3]>,
    cell: Option<Lattice>,
    pbc: [bool; 3],
    built: bool,
    rebuilds: usize,
}

impl VerletList {
    /// A list for pairs within `cutoff`, built with `cutoff + skin`. Nothing is built until the
    /// first [`update`](Self::update); invalid values are reported there.
    pub fn new(cutoff: f64, skin: f64) -> Self {
        Self {
            cutoff,
            skin,
            list: NeighborList::default(),
            reference: Vec::new(),
            cell: None,
            pbc: [false; 3],
            built: false,
            rebuilds: 0,
        }
    }

    pub fn cutoff(&self) -> f64 {
        self.cutoff
    }

    pub fn skin(&self) -> f64 {
        self.skin
    }

    /// The cutoff the stored list was built with, `cutoff + skin`.
    pub fn list_cutoff(&self) -> f64 {
        self.cutoff + self.skin
    }

    /// Rebuilds the list when needed (first call, atom count, cell or pbc changed, or some atom
    /// moved more than `skin / 2` since the last build). Returns whether it rebuilt.
    pub fn update(
        &mut self,
        positions: &[[f64; 3]],
        cell: Option<&Lattice>,
        pbc: [bool; 3],
    ) -> Result<bool> {
        if !(self.skin.is_finite() && self.skin >= 0.0) {
            return Err(Error::NeighborList(format!(
                "Verlet skin must be finite and >= 0, got {}",
                self.skin
            )));
        }
        if !self.would_rebuild(positions, cell, pbc) {
            return Ok(false);
        }
        // Rebuilt in place, into the memory the last list holds; a failed build leaves no list.
        self.built = false;
        neighbor_list_into(
            positions,
            cell,
            pbc,
            self.cutoff + self.skin,
            &mut self.list,
        )?;
        self.reference.clear();
        self.reference.extend_from_slice(positions);
        self.cell = cell.copied();
        self.pbc = pbc;
        self.built = true;
        self.rebuilds += 1;
        Ok(true)
    }

    /// Whether [`update`](Self::update) would rebuild for these positions and cell.
    pub fn would_rebuild(
        &self,
        positions: &[[f64; 3]],
        cell: Option<&Lattice>,
        pbc: [bool; 3],
    ) -> bool {
        let same_box = self.cell.as_ref() == cell && self.pbc == pbc;
        !same_box || self.needs_rebuild(positions)
    }

    /// The list built with `cutoff + skin` (a superset of the pairs within `cutoff` while
    /// [`needs_rebuild`](Self::needs_rebuild) is false).
    pub fn list(&self) -> &NeighborList {
        &self.list
    }

    /// True before the first build, when the atom count changed, or when some atom moved more
    /// than `skin / 2` (or to a non-finite position) since the last build.
    pub fn needs_rebuild(&self, positions: &[[f64; 3]]) -> bool {
        !self.built || moved_past_half_skin(positions, &self.reference, self.skin)
    }

    /// Number of builds so far.
    pub fn rebuilds(&self) -> usize {
        self.rebuilds
    }

    /// Forces a rebuild at the next [`update`](Self::update).
    pub fn invalidate(&mut self) {
        self.built = false;
    }

    /// The edges of the stored list that are within `cutoff` at `positions` (same order).
    /// Exactly the true neighbour list as long as no rebuild is needed.
    pub fn within_cutoff(&self, positions: &[[f64; 3]], cell: Option<&Lattice>) -> NeighborList {
        let zero = [[0.0; 3]; 3];
        let cell = cell.unwrap_or(&zero);
        let c2 = self.cutoff * self.cutoff;
        let mut out = NeighborList::default();
        for ((&i, &j), &s) in self
            .list
            .centers
            .iter()
            .zip(&self.list.neighbors)
            .zip(&self.list.shifts)
        {
            let v = edge_vector(&positions[i as usize], &positions[j as usize], s, cell);
            if norm2(&v) < c2 {
                out.centers.push(i);
                out.neighbors.push(j);
                out.shifts.push(s);
            }
        }
        out
    }
}

/// Whether the atoms at `positions` are not those at `reference` (another count), or some
/// atom moved more than `skin / 2` from it (or to a non-finite position): a Verlet list
/// built at `reference` no longer holds.
pub fn moved_past_half_skin(positions: &[[f64; 3]], reference: &[[f64; 3]], skin: f64) -> bool {
    if positions.len() != reference.len() {
        return true;
    }
    let half2 = 0.25 * skin * skin;
    positions.iter().zip(reference).any(|(x, r)| {
        let d2 = norm2(&[x[0] - r[0], x[1] - r[1], x[2] - r[2]]);
        d2.is_nan() || d2 > half2
    })
}

/// How far (Å) an atom may move from its place at the list build, carried along by the
/// cell's deformation `m` since (positions now ≈ positions then · m, rows as vectors), before
/// the list may miss a pair: pairs outside the list were more than `cutoff + skin` apart, and
/// the deformation shrinks no distance below σ_min(m) times itself (σ_min ≥ 1 − ‖m − 1‖ in
/// the Frobenius norm). Zero or less: rebuild.
pub fn strained_half_skin(cutoff: f64, skin: f64, m: &Lattice) -> f64 {
    let off: f64 = (0..3)
        .flat_map(|i| (0..3).map(move |j| (i, j)))
        .map(|(i, j)| (m[i][j] - (i == j) as u8 as f64).powi(2))
        .sum();
    0.5 * ((1.0 - off.sqrt()) * (cutoff + skin) - cutoff)
}
