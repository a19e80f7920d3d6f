//! The PaiNN update block: per-atom mixing of scalar and vector channels.
//!
//! U and V act on the feature axis only, never across x, y, z, so the block is rotation
//! equivariant (the original Python project mixed the Cartesian components and was not).

use candle_core::{Module, Result, Tensor, D};
use candle_nn::{linear, linear_no_bias, Linear, VarBuilder};

/// Keeps ‖Vv‖ differentiable at v = 0 (schnetpack uses the same epsilon).
const NORM_EPS: f64 = 1e-8;

pub struct Update {
    pub(super) mix: Linear,
    pub(super) context1: Linear,
    pub(super) context2: Linear,
    hidden: usize,
}

impl Update {
    pub fn new(hidden: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            mix: linear_no_bias(hidden, 2 * hidden, vb.pp("mix"))?,
            context1: linear(2 * hidden, hidden, vb.pp("context1"))?,
            context2: linear(hidden, 3 * hidden, vb.pp("context2"))?,
            hidden,
        })
    }

    pub fn forward(&self, s: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let (n, f) = (s.dim(0)?, self.hidden);
        let mixed = self
            .mix
            .forward(&v.reshape((n * 3, f))?)?
            .reshape((n, 3, 2 * f))?;
        let v_u = mixed.narrow(2, 0, f)?;
        let v_v = mixed.narrow(2, f, f)?;
        let v_v_norm = (v_v.sqr()?.sum(1)? + NORM_EPS)?.sqrt()?;
        let ctx = Tensor::cat(&[s, &v_v_norm], D::Minus1)?;
        let a = self
            .context2
            .forward(&self.context1.forward(&ctx)?.silu()?)?;
        // Same split order as schnetpack: Δs, Δv gate, ⟨Uv, Vv⟩ gate.
        let a_ss = a.narrow(1, 0, f)?;
        let a_vv = a.narrow(1, f, f)?;
        let a_sv = a.narrow(1, 2 * f, f)?;
        let uv_dot = (&v_u * &v_v)?.sum(1)?;
        let s = ((s + a_ss)? + (a_sv * uv_dot)?)?;
        let v = (v + v_u.broadcast_mul(&a_vv.unsqueeze(1)?)?)?;
        Ok((s, v))
    }
}
