//! Atomwise readout: MLP on the scalar features, scale/shift, per-element reference energies.

use super::Backend;
use candle_core::{Module, Result, Tensor};
use candle_nn::{linear, Init, Linear, VarBuilder};

pub struct Readout {
    pub(super) hidden: Linear,
    pub(super) out: Linear,
    /// Per-element reference energy (eV), [n_elements].
    pub(super) atom_ref: Tensor,
    /// Scale and shift (eV) of the network output, [1] each.
    pub(super) scale: Tensor,
    pub(super) shift: Tensor,
}

impl Readout {
    pub fn new(hidden: usize, n_elements: usize, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            hidden: linear(hidden, hidden / 2, vb.pp("hidden"))?,
            out: linear(hidden / 2, 1, vb.pp("out"))?,
            atom_ref: vb.get_with_hints(n_elements, "atom_ref", Init::Const(0.0))?,
            scale: vb.get_with_hints(1, "scale", Init::Const(1.0))?,
            shift: vb.get_with_hints(1, "shift", Init::Const(0.0))?,
        })
    }

    /// Per-atom energies [N] from scalar features s [N, F] and species [N] (u32).
    pub fn atom_energies(&self, s: &Tensor, species: &Tensor, ops: Backend) -> Result<Tensor> {
        let y = self
            .out
            .forward(&self.hidden.forward(s)?.silu()?)?
            .squeeze(1)?;
        let y = y.broadcast_mul(&self.scale)?.broadcast_add(&self.shift)?;
        y + ops.gather(&self.atom_ref, species)?
    }
}
