//! Pruning a built list to a cutoff at new positions, for the model's calls between rebuilds.

use super::builder::DeviceListBuilder;
use super::list::PaddedList;
use super::step::Step;
use crate::error::{Error, Result};
use crate::ops::edges::rows::host_u32s;
use candle_core::{DType, Tensor};

/// Relative margin on the cutoff when pruning: far above where an f32 distance may round
/// below the cutoff (relative 6e-8) while the f64 one lies above it.
pub const PRUNE_MARGIN: f64 = 1e-5;

impl DeviceListBuilder {
    /// The edges of `list` (built from earlier positions of the same atoms) whose length at
    /// `positions` is below `cutoff` (1 + [`PRUNE_MARGIN`]): (centers, neighbours, offsets)
    /// in the list's order. With the model's cutoff, what a Verlet list's skin adds and the
    /// model multiplies by zero is left out; the margin keeps every pair that the model, in
    /// f32, may still see inside its cutoff. `edges` is the list's edge count (its status).
    pub fn prune(
        &self,
        positions: &Tensor,
        list: &PaddedList,
        edges: usize,
        cutoff: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        self.check_positions(positions)?;
        let n = positions.dim(0)?;
        if list.scan.dim(0)? != n + 2 || edges > list.capacity() {
            return Err(Error::NeighborList(format!(
                "a list of {} slots built for {} atoms cannot be pruned at {n} atoms with {edges} \
                 edges",
                list.capacity(),
                list.scan.dim(0)?.saturating_sub(2)
            )));
        }
        if n == 0 || edges == 0 {
            return list.narrow(0);
        }
        let cut2 = (cutoff * (1.0 + PRUNE_MARGIN)).powi(2);
        let x = positions.contiguous()?;
        let inputs = [&x, &list.scan, &list.neighbors, &list.offsets];
        let counts = self.run(Step::PruneCount { cut2 }, &inputs, n, DType::U32, n)?;
        let kept_scan = self.run(
            Step::Scan { capacity: edges },
            &[&counts],
            n + 2,
            DType::U32,
            n,
        )?;
        let kept = host_u32s(&kept_scan.narrow(0, n, 1)?)?[0] as usize;
        let mut inputs = inputs.to_vec();
        inputs.push(&kept_scan);
        let fill = Step::PruneFill { edges, cut2 };
        let out = self.run(fill, &inputs, 3 * edges, DType::U32, n)?;
        let slots = out.narrow(0, 2 * edges, kept)?;
        Ok((
            out.narrow(0, 0, kept)?,
            out.narrow(0, edges, kept)?,
            crate::ops::gather(&list.offsets, &slots)?,
        ))
    }
}
