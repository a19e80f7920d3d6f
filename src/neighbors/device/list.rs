//! The padded edge list a build leaves on the device, and where its padding slots point.

use crate::error::Result;
use candle_core::Tensor;

/// A padded edge list on a device.
#[derive(Clone, Debug)]
pub struct PaddedList {
    /// `i` of every slot, \[C\] u32.
    pub centers: Tensor,
    /// `j` of every slot, \[C\] u32.
    pub neighbors: Tensor,
    /// Cartesian image offsets S · cell, [C, 3] in the requested dtype.
    pub offsets: Tensor,
    /// \[2\] u32 on the device: the number of edges found (saturated at u32::MAX), and 1 when
    /// they did not fit the capacity (the list then holds padding only).
    pub status: Tensor,
    /// Each atom's first slot, then the status, [N + 2] u32 (for pruning).
    pub(super) scan: Tensor,
}

/// What a build found, read from [`PaddedList::status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListStatus {
    pub edges: usize,
    pub overflowed: bool,
}

impl PaddedList {
    pub fn capacity(&self) -> usize {
        self.centers.dim(0).unwrap_or(0)
    }

    /// The edge count and overflow flag (one host read, which waits for the build).
    pub fn status(&self) -> Result<ListStatus> {
        let s = crate::ops::edges::rows::host_u32s(&self.status)?;
        Ok(ListStatus {
            edges: s[0] as usize,
            overflowed: s[1] != 0,
        })
    }

    /// The first `edges` slots (the list without its padding).
    pub fn narrow(&self, edges: usize) -> Result<(Tensor, Tensor, Tensor)> {
        Ok((
            self.centers.narrow(0, 0, edges)?,
            self.neighbors.narrow(0, 0, edges)?,
            self.offsets.narrow(0, 0, edges)?,
        ))
    }
}

/// How far along x a padding edge's image lies for `cutoff`: beyond it, so that its basis,
/// filter and gradients are exactly zero (also the host padding of `graph::pad_edges`).
pub fn padding_offset(cutoff: f64) -> f64 {
    2.0 * cutoff + 1.0
}
