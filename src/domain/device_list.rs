//! A domain's Verlet list built on the device (CUDA), where the host list and the upload of
//! its edges made most of the plugin's time over `mlff md` (bench-log 55). The positions come
//! from the host anyway: the displacement check stays there, a build uploads the positions
//! once and leaves the edges where the model reads them. Many atoms are sorted into bins
//! first ([`DeviceListBuilder::build_binned`]); the list is the host's for the same positions.

use crate::error::Result;
use crate::graph::{edge_capacity, fitted_list};
use crate::neighbors::{moved_past_half_skin, DeviceListBuilder, PaddedList};
use crate::structure::Lattice;
use candle_core::{DType, Device, Tensor};

/// The list's edges as the model reads them: centers, neighbours, image offsets.
pub(super) type Edges = (Tensor, Tensor, Tensor);

/// The device list of a [`DomainSession`](super::DomainSession) between calls.
pub(super) struct DeviceList {
    cutoff: f64,
    skin: f64,
    /// Builds of at least this many atoms bin them first.
    bins_from: usize,
    /// The builder of the last cell (`None`: the device list cannot serve that cell).
    builder: Option<(Option<Lattice>, [bool; 3], Option<DeviceListBuilder>)>,
    reference: Vec<[f64; 3]>,
    /// The last build and its edge count.
    list: Option<(PaddedList, usize)>,
    capacity: usize,
}

impl DeviceList {
    pub(super) fn new(cutoff: f64, skin: f64, bins_from: usize) -> Self {
        Self {
            cutoff,
            skin,
            bins_from,
            builder: None,
            reference: Vec::new(),
            list: None,
            capacity: 0,
        }
    }

    /// Whether the device list serves this cell: its periodic axes are wider than twice the
    /// list cutoff (else the host's cell list takes it).
    pub(super) fn serves(&mut self, cell: Option<&Lattice>, pbc: [bool; 3], dev: &Device) -> bool {
        let same = |(c, p, _): &(Option<Lattice>, [bool; 3], _)| c.as_ref() == cell && *p == pbc;
        if !self.builder.as_ref().is_some_and(same) {
            let b = DeviceListBuilder::new(self.cutoff + self.skin, cell, pbc, dev).ok();
            self.builder = Some((cell.copied(), pbc, b));
            self.list = None;
        }
        self.builder.as_ref().is_some_and(|(_, _, b)| b.is_some())
    }

    /// Forgets the list (the host list was used meanwhile).
    pub(super) fn invalidate(&mut self) {
        self.list = None;
    }

    /// Builds the list when it has none or an atom moved more than half the skin since its
    /// build; returns whether it built. [`serves`](Self::serves) said yes for this cell.
    pub(super) fn update(
        &mut self,
        positions: &[[f64; 3]],
        dev: &Device,
        dtype: DType,
    ) -> Result<bool> {
        if !self.would_rebuild(positions) {
            return Ok(false);
        }
        self.list = None;
        let Some((_, _, Some(builder))) = &self.builder else {
            return Err(crate::error::Error::NeighborList(
                "no device list builder for this cell".into(),
            ));
        };
        let n = positions.len();
        let x = Tensor::from_slice(positions.as_flattened(), (n, 3), dev)?;
        let grid = match n >= self.bins_from {
            true => Some(builder.bin_grid(n, Some(positions))?),
            false => None,
        };
        let start = self.capacity.max(edge_capacity(32 * n));
        let (list, edges, capacity) = fitted_list(n, start, |c| match &grid {
            Some(g) => builder.build_binned(&x, g, c, dtype),
            None => builder.build(&x, c, dtype),
        })?;
        self.capacity = capacity;
        self.list = Some((list, edges));
        self.reference.clear();
        self.reference.extend_from_slice(positions);
        Ok(true)
    }

    /// Whether [`update`](Self::update) would build at these positions: no list, or an atom
    /// moved more than half the skin since its build.
    pub(super) fn would_rebuild(&self, positions: &[[f64; 3]]) -> bool {
        self.list.is_none() || moved_past_half_skin(positions, &self.reference, self.skin)
    }

    /// The edges of the last build.
    pub(super) fn edges(&self) -> Result<Edges> {
        match &self.list {
            Some((list, edges)) => list.narrow(*edges),
            None => Err(no_list()),
        }
    }

    /// The edges of the last build within `cutoff` at `x` (the positions on the device, f64),
    /// in the list's order: the skin's pairs, which the model multiplies by zero, left out.
    pub(super) fn pruned(&self, x: &Tensor, cutoff: f64) -> Result<Edges> {
        match (&self.list, &self.builder) {
            (Some((list, edges)), Some((_, _, Some(b)))) => b.prune(x, list, *edges, cutoff),
            _ => Err(no_list()),
        }
    }
}

fn no_list() -> crate::error::Error {
    crate::error::Error::NeighborList("the device list holds no edges".into())
}
