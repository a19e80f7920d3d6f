//! Edge slots: how many a list or a captured graph gets for a number of edges, and a device
//! list built again with more of them until it fits.

use crate::error::{Error, Result};
use crate::neighbors::PaddedList;

/// Edge capacity for a list of `edges`: room for the list to grow by a quarter (atoms move
/// between neighbour-list builds) before a new capture is needed.
pub fn edge_capacity(edges: usize) -> usize {
    (edges + edges / 4).max(edges + 64).next_multiple_of(64)
}

/// A device list that fits its slots: `build(capacity)` from `capacity` slots, built again
/// with room to grow ([`edge_capacity`]) while it overflows. Returns the list, its edge count
/// and the capacity it fit; an error where `n` atoms have more pairs than u32 slots can hold.
pub fn fitted_list(
    n: usize,
    mut capacity: usize,
    mut build: impl FnMut(usize) -> Result<PaddedList>,
) -> Result<(PaddedList, usize, usize)> {
    loop {
        let list = build(capacity)?;
        let status = list.status()?;
        if status.edges >= u32::MAX as usize {
            return Err(Error::NeighborList(format!(
                "{n} atoms have more than {} pairs within the list cutoff",
                u32::MAX - 1
            )));
        }
        if !status.overflowed {
            return Ok((list, status.edges, capacity));
        }
        capacity = edge_capacity(status.edges);
    }
}
