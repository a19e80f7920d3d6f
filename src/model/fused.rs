//! PaiNN energies and forces with fused kernels and an explicit adjoint pass.
//!
//! The forward keeps what the adjoint needs (a tape of per-atom tensors) and the adjoint is
//! written out by hand: edge basis → (φ MLP, interaction, mixing, context MLP, combine) × blocks
//! → readout, then back. candle's backprop would add a zeros + add pair for every input of every
//! op and compute weight gradients that inference never uses; here a step is ~90 launches
//! instead of ~1,000. Below [`FILTER_ROWS_FROM_EDGES`] edges no [E, F]-sized tensor exists at
//! all (the filter is formed inside the interaction kernels); from there on each block's filter
//! rows W(r) [E, 3F] are one cuBLAS product, made again in the adjoint rather than kept. Forces only: the weights are read once (`FusedPainn::new`), so this
//! path is for inference; training differentiates the graph of `Painn::atom_energies`.
//!
//! State tensors are component-major [4N, F] (s, then v_x, v_y, v_z), so that s and v are
//! contiguous row ranges that cuBLAS takes without copies.

use super::painn::{Painn, PainnInputs};
use crate::ops::{
    act_grad, bias_silu, bias_silu_adjoint, edge_basis, edge_basis_adjoint, gather, interaction,
    interaction_adjoint, update_combine, update_combine_adjoint, update_context,
    update_context_adjoint, EdgeFilter, InteractionInputs, StateGrad,
};
use candle_core::{Result, Tensor};
use candle_nn::Linear;

/// A linear layer as (weight [out, in], bias [out]).
#[derive(Clone)]
struct Dense {
    weight: Tensor,
    bias: Tensor,
}

impl Dense {
    fn of(l: &Linear) -> Result<Self> {
        let bias = match l.bias() {
            Some(b) => b.detach(),
            None => Tensor::zeros(l.weight().dim(0)?, l.weight().dtype(), l.weight().device())?,
        };
        Ok(Self {
            weight: l.weight().detach(),
            bias,
        })
    }

    /// x Wᵀ without the bias (the next fused kernel adds it).
    fn product(&self, x: &Tensor) -> Result<Tensor> {
        x.matmul(&self.weight.t()?)
    }

    /// dL/dx of [`product`](Self::product) for dL/d(output) `g`.
    fn product_adjoint(&self, g: &Tensor) -> Result<Tensor> {
        g.matmul(&self.weight)
    }
}

/// Edge count from which the filter rows are a matrix product instead of being formed per
/// edge and feature inside the interaction kernels: 12-15% faster at 54,000-541,000 edges on
/// an H100, for a transient [E, 3F] buffer (BENCHMARKS.md).
pub const FILTER_ROWS_FROM_EDGES: usize = 32_768;

/// Largest filter-rows buffer made (bytes); beyond it the kernels form the filter themselves,
/// so that very large systems keep the O(N·F + E·R) memory of that path.
pub const FILTER_ROWS_MAX_BYTES: usize = 2 << 30;

#[derive(Clone)]
struct Block {
    /// Filter weights transposed, bias as last row: [R + 1, 3F].
    filter: Tensor,
    /// The same with three zero rows for the unit-vector columns of the basis, [R + 4, 3F]:
    /// basis · this = the filter rows.
    filter_basis: Tensor,
    phi1: Dense,
    phi2: Dense,
    /// W_mix [2F, F] (no bias).
    mix: Tensor,
    ctx1: Dense,
    ctx2: Dense,
}

/// The weights of a [`Painn`] arranged for the fused kernels.
#[derive(Clone)]
pub struct FusedPainn {
    hidden: usize,
    n_rbf: usize,
    cutoff: f64,
    embedding: Tensor,
    blocks: Vec<Block>,
    readout_hidden: Dense,
    /// Output weights times the scale, [1, F/2].
    readout_out: Tensor,
    /// Per element: atom reference + output bias × scale + shift, [n_elements].
    atom_constant: Tensor,
    /// Filter rows by a matrix product from this many edges on.
    rows_from_edges: usize,
}

/// What one block's adjoint reads from its forward.
struct Tape {
    state: Tensor,
    phi_pre: Tensor,
    phi: Tensor,
    mixed: Tensor,
    ctx_pre: Tensor,
    act: Tensor,
}

impl FusedPainn {
    pub fn new(model: &Painn) -> Result<Self> {
        let cfg = model.config();
        let (f, r) = (cfg.hidden, cfg.n_rbf);
        let filter = Dense::of(&model.filter)?;
        let mut blocks = Vec::with_capacity(cfg.n_blocks);
        for (k, (m, u)) in model.messages.iter().zip(&model.updates).enumerate() {
            let w = filter.weight.narrow(0, 3 * f * k, 3 * f)?; // [3F, R]
            let b = filter.bias.narrow(0, 3 * f * k, 3 * f)?.unsqueeze(0)?;
            let filter = Tensor::cat(&[&w.t()?, &b], 0)?.contiguous()?;
            let zeros = Tensor::zeros((3, 3 * f), filter.dtype(), filter.device())?;
            blocks.push(Block {
                filter_basis: Tensor::cat(&[&filter, &zeros], 0)?.contiguous()?,
                filter,
                phi1: Dense::of(&m.context1)?,
                phi2: Dense::of(&m.context2)?,
                mix: u.mix.weight().detach(),
                ctx1: Dense::of(&u.context1)?,
                ctx2: Dense::of(&u.context2)?,
            });
        }
        let ro = &model.readout;
        let out = Dense::of(&ro.out)?;
        let scale = ro.scale.detach();
        let readout_out = out.weight.broadcast_mul(&scale)?.contiguous()?;
        let constant = ((&out.bias * &scale)? + ro.shift.detach())?;
        let atom_constant = ro.atom_ref.detach().broadcast_add(&constant)?;
        Ok(Self {
            hidden: f,
            n_rbf: r,
            cutoff: cfg.cutoff,
            embedding: model.embedding.detach(),
            blocks,
            readout_hidden: Dense::of(&ro.hidden)?,
            readout_out,
            atom_constant,
            rows_from_edges: FILTER_ROWS_FROM_EDGES,
        })
    }

    /// Uses filter rows (a matrix product) from `edges` edges on instead of
    /// [`FILTER_ROWS_FROM_EDGES`] (0: always, `usize::MAX`: never), up to
    /// [`FILTER_ROWS_MAX_BYTES`]; both paths give the same forces.
    pub fn with_filter_rows_from(mut self, edges: usize) -> Self {
        self.rows_from_edges = edges;
        self
    }

    /// Block `b`'s filter for `basis`: the weights, or rows made into `rows`.
    fn filter<'a>(
        &self,
        b: &'a Block,
        basis: &Tensor,
        rows: &'a mut Option<Tensor>,
    ) -> Result<EdgeFilter<'a>> {
        let e = basis.dim(0)?;
        let bytes = e * b.filter.dim(1)? * basis.dtype().size_in_bytes();
        if e < self.rows_from_edges || bytes > FILTER_ROWS_MAX_BYTES {
            return Ok(EdgeFilter::Weights(&b.filter));
        }
        Ok(EdgeFilter::Rows(
            rows.insert(basis.matmul(&b.filter_basis)?),
        ))
    }

    /// The forward pass: per-atom energies (eV) and what [`FusedForward::forces`] needs.
    pub fn forward<'a>(&'a self, x: &'a PainnInputs) -> Result<FusedForward<'a>> {
        let f = self.hidden;
        let n = x.positions.dim(0)?;
        let positions = x.positions.detach();
        let basis = edge_basis(
            &positions,
            &x.offsets,
            &x.centers,
            &x.neighbors,
            self.n_rbf,
            self.cutoff,
        )?;
        let s0 = gather(&self.embedding, &x.species)?;
        let v0 = Tensor::zeros((3 * n, f), s0.dtype(), s0.device())?;
        let mut state = Tensor::cat(&[&s0, &v0], 0)?;
        let mut tape = Vec::with_capacity(self.blocks.len());
        for b in &self.blocks {
            let phi_pre = b.phi1.product(&state.narrow(0, 0, n)?)?;
            let phi = b.phi2.product(&bias_silu(&phi_pre, &b.phi1.bias)?)?;
            let mut rows = None;
            let messaged = interaction(&InteractionInputs {
                phi: &phi,
                phi_bias: &b.phi2.bias,
                filter: self.filter(b, &basis, &mut rows)?,
                basis: &basis,
                state: &state,
                centers: &x.centers,
                neighbors: &x.neighbors,
            })?;
            let mixed = messaged.narrow(0, n, 3 * n)?.matmul(&b.mix.t()?)?;
            let ctx_pre = b.ctx1.product(&update_context(&messaged, &mixed)?)?;
            let act = b.ctx2.product(&bias_silu(&ctx_pre, &b.ctx1.bias)?)?;
            let next = update_combine(&messaged, &mixed, &act, &b.ctx2.bias)?;
            tape.push(Tape {
                state,
                phi_pre,
                phi,
                mixed,
                ctx_pre,
                act,
            });
            state = next;
        }
        let ro_pre = self.readout_hidden.product(&state.narrow(0, 0, n)?)?;
        let ro = bias_silu(&ro_pre, &self.readout_hidden.bias)?;
        let atom_energies = (ro.matmul(&self.readout_out.t()?)?.squeeze(1)?
            + gather(&self.atom_constant, &x.species)?)?;
        Ok(FusedForward {
            model: self,
            inputs: x,
            positions,
            basis,
            tape,
            readout_pre: ro_pre,
            atom_energies,
        })
    }
}

/// A fused forward pass, ready for its adjoint.
pub struct FusedForward<'a> {
    model: &'a FusedPainn,
    inputs: &'a PainnInputs,
    positions: Tensor,
    basis: Tensor,
    tape: Vec<Tape>,
    readout_pre: Tensor,
    /// Energy of each atom [N], eV.
    pub atom_energies: Tensor,
}

impl FusedForward<'_> {
    /// Forces [N, 3] in eV/Å: −∂(Σ atom energies)/∂x by the explicit adjoint.
    pub fn forces(&self) -> Result<Tensor> {
        let (m, x, basis) = (self.model, self.inputs, &self.basis);
        let (n, f) = (self.positions.dim(0)?, m.hidden);
        // Every atom energy has gradient 1.
        let ro_pre = &self.readout_pre;
        let g_ro = bias_silu_adjoint(ro_pre, &m.readout_hidden.bias, &m.readout_out)?;
        let mut gx = m.readout_hidden.product_adjoint(&g_ro)?;
        let mut next: Option<(Tensor, Tensor, Tensor)> = None;
        let mut g_basis: Option<Tensor> = None;
        for (k, (b, t)) in m.blocks.iter().zip(&self.tape).enumerate().rev() {
            let grad = StateGrad {
                gx: &gx,
                next: next.as_ref().map(|(a, b, c)| (a, b, c)),
            };
            let combined = update_combine_adjoint(&t.mixed, &t.act, &b.ctx2.bias, &grad)?;
            let g_ctx_h = b.ctx2.product_adjoint(&act_grad(&combined, n, f)?)?;
            let g_ctx_pre = bias_silu_adjoint(&t.ctx_pre, &b.ctx1.bias, &g_ctx_h)?;
            let g_ctx = b.ctx1.product_adjoint(&g_ctx_pre)?;
            let (g_messaged, g_mixed) = update_context_adjoint(&t.mixed, &g_ctx, &combined)?;
            let g_mix = g_mixed.matmul(&b.mix)?;
            let mut rows = None;
            let inputs = InteractionInputs {
                phi: &t.phi,
                phi_bias: &b.phi2.bias,
                filter: m.filter(b, basis, &mut rows)?,
                basis,
                state: &t.state,
                centers: &x.centers,
                neighbors: &x.neighbors,
            };
            let grads = interaction_adjoint(&inputs, &g_messaged, &g_mix)?;
            let (g_v, g_phi) = (grads.v, grads.phi);
            let mut g_b = grads.basis;
            if let Some(g_rows) = grads.filter_rows {
                g_b = (g_b + g_rows.matmul(&b.filter_basis.t()?)?)?;
            }
            g_basis = Some(match g_basis {
                Some(acc) => (acc + g_b)?,
                None => g_b,
            });
            if k > 0 {
                // The first block's state is the embedding: nothing upstream needs its gradient.
                let g_phi_h = b.phi2.product_adjoint(&g_phi)?;
                let g_phi_pre = bias_silu_adjoint(&t.phi_pre, &b.phi1.bias, &g_phi_h)?;
                gx = b.phi1.product_adjoint(&g_phi_pre)?;
                next = Some((g_messaged, g_mix, g_v));
            }
        }
        match g_basis {
            Some(g) => edge_basis_adjoint(
                &self.positions,
                &x.offsets,
                &g,
                &x.centers,
                &x.neighbors,
                m.n_rbf,
                m.cutoff,
            )?
            .neg(),
            None => self.positions.zeros_like(),
        }
    }
}
