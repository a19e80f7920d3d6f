//! The per-layer path: the forward pass, which keeps what the adjoint needs (a tape of
//! per-atom tensors), and the adjoint written out by hand, edge basis → (φ MLP, interaction,
//! mixing, context MLP, combine) × blocks → readout, then back, each layer as the
//! [`LayerPlan`] says.

use super::weights::Block;
use super::FusedPainn;
use crate::model::PainnInputs;
use crate::ops::layers::edge_basis::basis_adjoint;
use crate::ops::layers::element_sums::sums_adjoint;
use crate::ops::{
    act_grad, dense, dense_tc, dense_tc_adding, dense_tc_fits, edge_basis, element_sums, gather,
    initial_state, interaction, interaction_adjoint, readout_tc, update_combine,
    update_combine_adjoint, update_context, update_context_adjoint, update_tc, update_tc_adjoint,
    EdgeFilter, InteractionInputs, StateGrad, UpdateOutputs,
};
use crate::plan::{DensePath, FilterSource, LayerPlan};
use candle_core::{Result, Tensor};

/// What one block's adjoint reads from its forward.
pub(super) struct Tape {
    /// The block's input state; None where the block ran as sums per element.
    pub(super) state: Option<Tensor>,
    /// φ's pre-activation, except in the first block (gathered per element, no adjoint).
    pub(super) phi_pre: Option<Tensor>,
    /// φ's output; None where the block ran as sums per element ([`FirstBlockSums`]).
    pub(super) phi: Option<Tensor>,
    pub(super) mixed: Tensor,
    pub(super) ctx_pre: Tensor,
    pub(super) act: Tensor,
    /// The block's filter rows, when kept for the adjoint.
    pub(super) rows: Option<Tensor>,
    /// The state after the messages [4N, F], kept for the weight gradients only.
    pub(super) messaged: Option<Tensor>,
}

/// What the forces' adjoint takes from the readout: its pre-activation, or (on tensor cores,
/// where one launch gives both) the gradient of −E at its input already.
pub(super) enum ReadoutTape {
    Pre(Tensor),
    Seed(Tensor),
}

/// What one block's adjoint gives: (g_s, g_v) at its messaged state (the residual's share of
/// dL/d(input state)), dL/dv at its input through the messages, dL/ds at its input through
/// φ (None for the first block, whose input is the embedding) and dL/d(basis) so far.
pub(super) struct BlockGrads {
    pub(super) g_s: Tensor,
    pub(super) g_v: Tensor,
    pub(super) g_v_in: Tensor,
    pub(super) g_phi_input: Option<Tensor>,
    pub(super) g_basis: Tensor,
}

impl FusedPainn {
    /// Per-atom energies [N] from the last state's s rows, and the readout's tape: on tensor
    /// cores (`ops::readout_tc`) one launch that also gives −∂E/∂s, else the MLP (its output
    /// bias is in the per-element constants) and a gather of those.
    /// `seed_only` false keeps the pre-activation (the weight gradients need it).
    pub(super) fn readout(
        &self,
        s: &Tensor,
        species: &Tensor,
        path: DensePath,
        seed_only: bool,
    ) -> Result<(Tensor, ReadoutTape)> {
        let ro = &self.readout;
        let (h, f) = ro.hidden.weight.dims2()?;
        let fits = dense_tc_fits(f, h) && dense_tc_fits(h, f);
        if seed_only && path == DensePath::TensorCores && fits {
            let [w1, _, _, w1t] = ro.tc()?;
            let w = ro.out.weight.flatten_all()?;
            let (energies, seed) = readout_tc(
                s,
                w1,
                &ro.hidden.bias,
                &w,
                w1t,
                &self.atom_constant,
                species,
            )?;
            return Ok((energies, ReadoutTape::Seed(seed)));
        }
        let (pre, out) = ro.forward(s, path)?;
        let energies = (out.squeeze(1)? + gather(&self.atom_constant, species)?)?;
        Ok((energies, ReadoutTape::Pre(pre)))
    }

    /// mixed = v W_mixᵀ [3N, 2F].
    fn mix(&self, b: &Block, v: &Tensor, path: DensePath) -> Result<Tensor> {
        let f = self.hidden;
        match path {
            DensePath::Small => dense(v, &b.mix_t),
            DensePath::TensorCores if dense_tc_fits(f, 2 * f) => dense_tc(v, &b.mix_tc()?[0]),
            _ => v.matmul(&b.mix.t()?),
        }
    }

    /// The update block of the state after the messages [4N, F]: its new state and the
    /// adjoint's tape, in one launch where the plan says, or as the mixing layer, the context,
    /// the context MLP and the combination in turn.
    fn update(&self, b: &Block, messaged: &Tensor, plan: &LayerPlan) -> Result<UpdateOutputs> {
        let (n, path) = (messaged.dim(0)? / 4, plan.dense_atoms);
        if plan.update_one_launch {
            let [w1, w2, ..] = b.ctx.tc()?;
            let (bias1, bias2) = (&b.ctx.hidden.bias, &b.ctx.out.bias);
            return update_tc(messaged, &b.mix_tc()?[0], w1, bias1, w2, bias2);
        }
        let mixed = self.mix(b, &messaged.narrow(0, n, 3 * n)?, plan.dense_vectors)?;
        let (ctx_pre, act) = b.ctx.forward(&update_context(messaged, &mixed)?, path)?;
        let next = update_combine(messaged, &mixed, &act, &b.ctx.out.bias)?;
        Ok(UpdateOutputs {
            next,
            mixed,
            ctx_pre,
            act,
        })
    }

    /// (dL/ds [N, F], dL/dv [3N, F]) of the state after block `b`'s messages for the gradient
    /// `grad` at its output, from its tape `t`: in one launch where the forward took one, else
    /// the combination's, the context MLP's, the context's and the mixing layer's adjoints.
    fn update_adjoint(
        &self,
        b: &Block,
        t: &Tape,
        grad: &StateGrad,
        plan: &LayerPlan,
    ) -> Result<(Tensor, Tensor)> {
        let (n, f, path) = (t.ctx_pre.dim(0)?, self.hidden, plan.dense_atoms);
        let (b1, act_bias) = (&b.ctx.hidden.bias, &b.ctx.out.bias);
        if plan.update_one_launch {
            let [_, _, w2t, w1t] = b.ctx.tc()?;
            let mix_t = &b.mix_tc()?[1];
            return update_tc_adjoint(
                &t.mixed, &t.act, act_bias, &t.ctx_pre, b1, grad, w2t, w1t, mix_t,
            );
        }
        let combined = update_combine_adjoint(&t.mixed, &t.act, act_bias, grad)?;
        let g_ctx = b
            .ctx
            .adjoint(&t.ctx_pre, &act_grad(&combined, n, f)?, path)?;
        let (g_messaged, g_mixed) = update_context_adjoint(&t.mixed, &g_ctx, combined)?;
        // dL/dv of the messaged state: its own rows' and the mixing's, summed.
        let g_v = self.mix_adjoint_adding(b, &g_mixed, &g_messaged.narrow(0, n, 3 * n)?, plan)?;
        Ok((g_messaged.narrow(0, 0, n)?, g_v))
    }

    /// dL/dv [3N, F] of [`mix`](Self::mix) for dL/d(mixed) `g`, plus `add` [3N, F]: in one
    /// launch on tensor cores where the plan says, else the product, then the add.
    pub(super) fn mix_adjoint_adding(
        &self,
        b: &Block,
        g: &Tensor,
        add: &Tensor,
        plan: &LayerPlan,
    ) -> Result<Tensor> {
        if plan.mix_adjoint_tensor_cores {
            return dense_tc_adding(g, &b.mix_tc()?[1], add);
        }
        let product = match plan.dense_vectors {
            DensePath::Small => dense(g, &b.mix)?,
            _ => g.matmul(&b.mix)?,
        };
        product + add
    }

    /// Block `b`'s filter as the plan says: the weights, or the rows in `rows` (made there
    /// when it holds none).
    pub(super) fn filter<'a>(
        &self,
        b: &'a Block,
        basis: &Tensor,
        rows: &'a mut Option<Tensor>,
        plan: &LayerPlan,
    ) -> Result<EdgeFilter<'a>> {
        if plan.filter == FilterSource::InKernel {
            return Ok(EdgeFilter::Weights(&b.filter));
        }
        let made = match rows.take() {
            Some(r) => r,
            None => basis.matmul(&b.filter_basis)?,
        };
        Ok(EdgeFilter::Rows(rows.insert(made)))
    }

    /// The first block's messaged state [4N, F]: the per-element sums times their weights
    /// ([`FirstBlockSums`]), which add the initial state too.
    fn first_block_messages(&self, basis: &Tensor, x: &PainnInputs) -> Result<Tensor> {
        let n = x.species.dim(0)?;
        let sums = element_sums(
            basis,
            &x.centers,
            &x.neighbors,
            &x.species,
            self.embedding.dim(0)?,
            self.n_rbf,
        )?;
        let k = sums.dim(1)?;
        let product = &self.first_sums()?.product;
        let messaged = sums.reshape((4, n, k))?.matmul(product)?;
        messaged.reshape((4 * n, self.hidden))
    }

    /// Block `k` from its input state [4N, F] (None: the first block by sums per element,
    /// which adds the initial state itself): its output state and its adjoint's tape.
    /// `symmetric` says the edges hold both directions of every pair (`PainnInputs`), as a
    /// domain's one-sided edges to its own atoms do not.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn block_forward(
        &self,
        k: usize,
        state: Option<Tensor>,
        basis: &Tensor,
        x: &PainnInputs,
        plan: &LayerPlan,
        for_weights: bool,
        (symmetric, updated): (bool, Option<usize>),
    ) -> Result<(Tensor, Tape)> {
        let (b, n, path) = (&self.blocks[k], x.positions.dim(0)?, plan.dense_atoms);
        let keep_rows = plan.filter == FilterSource::Rows { kept: true };
        // The block's messaged state, and what its adjoint needs of the interaction.
        let (messaged, phi_pre, phi, rows) = match &state {
            None => (self.first_block_messages(basis, x)?, None, None, None),
            Some(state_in) => {
                let (phi_pre, phi) = match k {
                    0 => (None, gather(self.first_phi()?, &x.species)?),
                    _ => {
                        let (pre, phi) = b.phi.forward(&state_in.narrow(0, 0, n)?, path)?;
                        (Some(pre), phi)
                    }
                };
                let mut rows = None;
                let messaged = interaction(&InteractionInputs {
                    phi: &phi,
                    phi_bias: &b.phi.out.bias,
                    filter: self.filter(b, basis, &mut rows, plan)?,
                    basis,
                    state: state_in,
                    centers: &x.centers,
                    neighbors: &x.neighbors,
                    symmetric_edges: symmetric,
                    tuning: &self.tuning,
                })?;
                let rows = if keep_rows { rows } else { None };
                (messaged, phi_pre, Some(phi), rows)
            }
        };
        // Only the first `updated` atoms' outputs are wanted: update those alone.
        let messaged = match updated {
            Some(m) if m < n => first_rows(&messaged, n, m)?,
            _ => messaged,
        };
        let UpdateOutputs {
            next,
            mixed,
            ctx_pre,
            act,
        } = self.update(b, &messaged, plan)?;
        let tape = Tape {
            state,
            phi_pre,
            phi,
            mixed,
            ctx_pre,
            act,
            rows,
            messaged: for_weights.then_some(messaged),
        };
        Ok((next, tape))
    }

    /// (dL/ds [N, F], dL/dv [3N, F]) of block `k`'s messaged state of `n` atoms from its update's
    /// adjoint; where the block updated its first `updated` atoms alone, the others' messaged
    /// rows went nowhere and their gradient is zero.
    fn messaged_adjoint(
        &self,
        k: usize,
        t: &Tape,
        grad: &StateGrad,
        plan: &LayerPlan,
        n: usize,
        updated: Option<usize>,
    ) -> Result<(Tensor, Tensor)> {
        let (g_s, g_v) = self.update_adjoint(&self.blocks[k], t, grad, plan)?;
        Ok(match updated {
            Some(m) if m < n => (pad_rows(&g_s, 1, n)?, pad_rows(&g_v, 3, n)?),
            _ => (g_s, g_v),
        })
    }

    /// Block `k`'s adjoint (a block run per edge) for the gradient `grad` at its output, from
    /// its tape `t`; `g_basis_after` is the later blocks' dL/d(basis), summed into the result's.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn block_adjoint(
        &self,
        k: usize,
        t: &Tape,
        grad: &StateGrad,
        basis: &Tensor,
        x: &PainnInputs,
        plan: &LayerPlan,
        g_basis_after: Option<&Tensor>,
        (symmetric, updated): (bool, Option<usize>),
    ) -> Result<BlockGrads> {
        let b = &self.blocks[k];
        let (g_s, g_v) = self.messaged_adjoint(k, t, grad, plan, x.positions.dim(0)?, updated)?;
        let (Some(phi), Some(state)) = (&t.phi, &t.state) else {
            candle_core::bail!("block {k} ran as sums per element: its adjoint is the sums'")
        };
        let mut rows = t.rows.clone();
        let inputs = InteractionInputs {
            phi,
            phi_bias: &b.phi.out.bias,
            filter: self.filter(b, basis, &mut rows, plan)?,
            basis,
            state,
            centers: &x.centers,
            neighbors: &x.neighbors,
            symmetric_edges: symmetric,
            tuning: &self.tuning,
        };
        // dL/d(basis) summed over the blocks as it goes (in the kernel where it can).
        let grads = interaction_adjoint(&inputs, &g_s, &g_v, g_basis_after)?;
        let g_basis = grads.complete_basis(&b.filter_basis)?;
        // The first block's state is the embedding: nothing upstream needs its gradient.
        let g_phi_input = match &t.phi_pre {
            Some(phi_pre) => Some(b.phi.adjoint(phi_pre, &grads.phi, plan.dense_atoms)?),
            None => None,
        };
        Ok(BlockGrads {
            g_s,
            g_v,
            g_v_in: grads.v,
            g_phi_input,
            g_basis,
        })
    }

    /// The adjoint of the first block run as sums per element, for the gradient `grad` at its
    /// output (of its first `updated` atoms, where given): it ends in the forces [N, 3] (and
    /// the virials under them, [4N, 3], with `virial`), through `g_basis_after` too, the later
    /// blocks' dL/d(basis).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn sums_block_adjoint(
        &self,
        t: &Tape,
        grad: &StateGrad,
        positions: &Tensor,
        x: &PainnInputs,
        plan: &LayerPlan,
        g_basis_after: Option<&Tensor>,
        (virial, updated): (bool, Option<usize>),
    ) -> Result<Tensor> {
        let (g_s, g_v) = self.messaged_adjoint(0, t, grad, plan, positions.dim(0)?, updated)?;
        let sums = self.first_sums()?;
        sums_adjoint(
            positions,
            &x.offsets,
            g_basis_after,
            (
                &g_s.matmul(&sums.scalar_t)?,
                &g_v.matmul(&sums.direction_t)?,
            ),
            (&x.centers, &x.neighbors),
            (&x.species, self.embedding.dim(0)?),
            (self.n_rbf, self.cutoff),
            virial,
        )
    }

    /// The forward pass: per-atom energies (eV) and what `FusedForward::forces` needs.
    pub fn forward<'a>(&'a self, x: &'a PainnInputs) -> Result<FusedForward<'a>> {
        self.forward_planned(x, self.layer_plan(x)?, false)
    }

    /// The forward pass as `plan` says; `for_weights` keeps what the weight gradients need
    /// besides what the forces' adjoint does (`grads`).
    pub(super) fn forward_planned<'a>(
        &'a self,
        x: &'a PainnInputs,
        plan: LayerPlan,
        for_weights: bool,
    ) -> Result<FusedForward<'a>> {
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
        // (None: the first block's sums add the initial state themselves.)
        let mut state = match plan.first_block_sums {
            true => None,
            false => Some(initial_state(&self.embedding, &x.species)?),
        };
        let mut tape = Vec::with_capacity(self.blocks.len());
        let path = plan.dense_atoms;
        for k in 0..self.blocks.len() {
            let (next, t) =
                self.block_forward(k, state.take(), &basis, x, &plan, for_weights, (true, None))?;
            tape.push(t);
            state = Some(next);
        }
        let Some(state) = state else {
            candle_core::bail!("the model has no interaction blocks")
        };
        let last_s = state.narrow(0, 0, n)?;
        let (atom_energies, readout) = self.readout(&last_s, &x.species, path, !for_weights)?;
        Ok(FusedForward {
            model: self,
            plan,
            inputs: x,
            positions,
            basis,
            tape,
            readout,
            last_s,
            atom_energies,
        })
    }
}
/// A fused forward pass, ready for its adjoint.
pub struct FusedForward<'a> {
    pub(super) model: &'a FusedPainn,
    pub(super) plan: LayerPlan,
    pub(super) inputs: &'a PainnInputs,
    pub(super) positions: Tensor,
    pub(super) basis: Tensor,
    pub(super) tape: Vec<Tape>,
    pub(super) readout: ReadoutTape,
    /// The last state's s rows [N, F], the readout's input.
    pub(super) last_s: Tensor,
    /// Energy of each atom [N], eV.
    pub atom_energies: Tensor,
}

impl FusedForward<'_> {
    /// Forces [N, 3] in eV/Å: −∂(Σ atom energies)/∂x by the explicit adjoint.
    pub fn forces(&self) -> Result<Tensor> {
        self.adjoint(false, None)
    }

    /// Forces [N, 3] of Σ w_i E_i (weights \[N\] in the model's dtype): with w 1 on a domain's
    /// own atoms and 0 on its ghosts, the forces of the domain's energy (`crate::domain`).
    pub fn weighted_forces(&self, weights: &Tensor) -> Result<Tensor> {
        self.adjoint(false, Some(weights))
    }

    /// [`forces_and_virials`](Self::forces_and_virials) of Σ w_i E_i, as
    /// [`weighted_forces`](Self::weighted_forces).
    pub fn weighted_forces_and_virials(&self, weights: &Tensor) -> Result<(Tensor, Tensor)> {
        self.split_virials(&self.adjoint(true, Some(weights))?)
    }

    /// The forces [N, 3] and, gathered in the same kernel, every atom's virial [N, 3, 3]:
    /// Σ over its edges e (i ← j) of r_e ⊗ F_e, with r_e = x_j − x_i + offset and
    /// F_e = −∂(Σ atom energies)/∂r_e (their sum is the structure's virial W = −∂E/∂ε).
    pub fn forces_and_virials(&self) -> Result<(Tensor, Tensor)> {
        self.split_virials(&self.adjoint(true, None)?)
    }

    /// The adjoint's [4N, 3] output as forces [N, 3] and virials [N, 3, 3].
    fn split_virials(&self, both: &Tensor) -> Result<(Tensor, Tensor)> {
        let n = self.positions.dim(0)?;
        Ok((
            both.narrow(0, 0, n)?,
            both.narrow(0, n, 3 * n)?.reshape((n, 3, 3))?,
        ))
    }

    fn adjoint(&self, virial: bool, weights: Option<&Tensor>) -> Result<Tensor> {
        let (m, x, basis) = (self.model, self.inputs, &self.basis);
        // Every atom energy has gradient −1: the adjoint carries −E's, so it ends in the forces.
        let (plan, path) = (&self.plan, self.plan.dense_atoms);
        let mut gx = match &self.readout {
            ReadoutTape::Seed(g) => g.clone(),
            ReadoutTape::Pre(pre) => {
                let g_hidden = &m.readout_force_seed; // one row, for every atom
                m.readout.adjoint_from_hidden(pre, g_hidden, path)?
            }
        };
        // Each atom's energy depends on its own last state alone: a weight scales its row.
        if let Some(w) = weights {
            gx = gx.broadcast_mul(&w.unsqueeze(1)?)?;
        }
        let mut next: Option<(Tensor, Tensor, Tensor)> = None;
        let mut g_basis: Option<Tensor> = None;
        for (k, t) in self.tape.iter().enumerate().rev() {
            let grad = StateGrad {
                gx: &gx,
                next: next.as_ref().map(|(a, b, c)| (a, b, c)),
            };
            if t.phi.is_none() {
                // The first block by sums per element (last here): its adjoint ends in the
                // forces, through the basis rows of every block.
                let after = g_basis.as_ref();
                return m.sums_block_adjoint(
                    t,
                    &grad,
                    &self.positions,
                    x,
                    plan,
                    after,
                    (virial, None),
                );
            }
            let after = g_basis.as_ref();
            let grads = m.block_adjoint(k, t, &grad, basis, x, plan, after, (true, None))?;
            g_basis = Some(grads.g_basis);
            if let Some(g) = grads.g_phi_input {
                gx = g;
                next = Some((grads.g_s, grads.g_v, grads.g_v_in));
            }
        }
        match (g_basis, virial) {
            (Some(g), _) => basis_adjoint(
                &self.positions,
                &x.offsets,
                &g,
                (&x.centers, &x.neighbors),
                (m.n_rbf, m.cutoff),
                virial,
            ),
            (None, false) => self.positions.zeros_like(),
            (None, true) => {
                let p = &self.positions;
                Tensor::zeros((4 * p.dim(0)?, 3), p.dtype(), p.device())
            }
        }
    }
}

/// The rows of the first `m` of `n` atoms of a component-major state [4N, F]: [4m, F].
fn first_rows(state: &Tensor, n: usize, m: usize) -> Result<Tensor> {
    let f = state.dim(1)?;
    state
        .reshape((4, n, f))?
        .narrow(1, 0, m)?
        .reshape((4 * m, f))
}

/// `parts` component-major blocks of m rows each [parts·m, F], each padded with zero rows to
/// `n`: [parts·n, F].
fn pad_rows(g: &Tensor, parts: usize, n: usize) -> Result<Tensor> {
    let (rows, f) = g.dims2()?;
    let m = rows / parts;
    let zeros = Tensor::zeros((parts, n - m, f), g.dtype(), g.device())?;
    Tensor::cat(&[&g.reshape((parts, m, f))?, &zeros], 1)?.reshape((parts * n, f))
}
