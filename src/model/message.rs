//! The PaiNN message block: continuous-filter convolution of neighbour features.

use super::Backend;
use crate::ops::message;
use candle_core::{Module, Result, Tensor};
use candle_nn::{linear, Linear, VarBuilder};

pub struct Message {
    pub(super) context1: Linear,
    pub(super) context2: Linear,
    hidden: usize,
}

/// Edge data shared by every block of one forward pass.
pub struct Edges<'a> {
    /// Receiving atom i of each edge, [E] u32.
    pub centers: &'a Tensor,
    /// Sending atom j of each edge, [E] u32.
    pub neighbors: &'a Tensor,
    /// Unit vectors r_ij / |r_ij|, [E, 3].
    pub directions: &'a Tensor,
    pub ops: Backend,
}

impl Message {
    pub fn new(hidden: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            context1: linear(hidden, hidden, vb.pp("context1"))?,
            context2: linear(hidden, 3 * hidden, vb.pp("context2"))?,
            hidden,
        })
    }

    /// Returns the updated (s [N, F], v [N, 3, F]). `filter` is W(r_ij) times the cutoff,
    /// [E, 3F]. `v_is_zero` skips the vector gather in the first block.
    pub fn forward(
        &self,
        s: &Tensor,
        v: &Tensor,
        filter: &Tensor,
        edges: &Edges,
        v_is_zero: bool,
    ) -> Result<(Tensor, Tensor)> {
        let (n, f) = (s.dim(0)?, self.hidden);
        let e = filter.dim(0)?;
        let phi = self.context2.forward(&self.context1.forward(s)?.silu()?)?;
        if edges.ops == Backend::Fused {
            let out = message(
                &phi,
                v,
                filter,
                edges.directions,
                edges.centers,
                edges.neighbors,
            )?;
            let ds = out.narrow(1, 0, f)?;
            let dv = out.narrow(1, f, 3 * f)?.reshape((n, 3, f))?;
            return Ok(((s + ds)?, (v + dv)?));
        }
        let x = (edges.ops.gather(&phi, edges.neighbors)? * filter)?;
        let ds = x.narrow(1, 0, f)?;
        let dv_dir = x.narrow(1, f, f)?.unsqueeze(1)?;
        let mut dv = dv_dir.broadcast_mul(&edges.directions.unsqueeze(2)?)?;
        if !v_is_zero {
            let dv_v = x.narrow(1, 2 * f, f)?.unsqueeze(1)?;
            let v_j = edges
                .ops
                .gather(&v.reshape((n, 3 * f))?, edges.neighbors)?
                .reshape((e, 3, f))?;
            dv = (dv + v_j.broadcast_mul(&dv_v)?)?;
        }
        let ds = edges.ops.scatter_add(&ds, edges.centers, n)?;
        let dv = edges
            .ops
            .scatter_add(&dv.reshape((e, 3 * f))?, edges.centers, n)?
            .reshape((n, 3, f))?;
        Ok(((s + ds)?, (v + dv)?))
    }
}
