//! One message-passing block at a time on the fused kernels, for a domain whose ghosts reach
//! one cutoff ([`crate::domain::LayeredDomain`]): each block's forward from a state the caller
//! assembles (its own atoms' outputs of the block before and its ghosts' from their owners),
//! and each block's hand-written adjoint from a plain gradient at its output to one at its
//! input, as the whole call's adjoint runs them ([`FusedForward`](super::FusedForward)); the
//! blocks' dL/d(basis) is summed as they go and the forces come from it at the end. This
//! replaces candle's autograd around the message, whose gradient sums over the edge-sized
//! filter were most of a layered domain's time (docs/bench-log/68).
//!
//! The edges run to the domain's own atoms only, so the interaction runs without the
//! symmetric-list kernels; the first block takes the plan's choice (sums per receiving atom
//! work on one-sided edges too), and each block updates the first `rows` atoms alone. Like the
//! whole call's adjoint, everything carries −E's gradient, so that it ends in the forces.

use super::pass::{ReadoutTape, Tape};
use super::FusedPainn;
use crate::model::PainnInputs;
use crate::ops::layers::edge_basis::basis_adjoint;
use crate::ops::{edge_basis, initial_state, StateGrad};
use crate::plan::LayerPlan;
use candle_core::{bail, Result, Tensor};

/// A layered call's state between blocks: the inputs, the plan, the edge basis, each block's
/// tape and the blocks' dL/d(basis) so far.
pub struct LayeredPass {
    inputs: PainnInputs,
    /// The atoms whose outputs count (the first ones; the rest are ghosts).
    rows: usize,
    plan: LayerPlan,
    positions: Tensor,
    basis: Tensor,
    tapes: Vec<Tape>,
    g_basis: Option<Tensor>,
    /// The forces, where the first block's adjoint (as sums per element) gave them.
    forces: Option<Tensor>,
}

impl LayeredPass {
    /// A pass of `model` over `inputs`, whose edges may be one-sided, for the outputs of its
    /// first `rows` atoms (the others, ghosts, only send messages).
    pub fn new(model: &FusedPainn, inputs: PainnInputs, rows: usize) -> Result<Self> {
        let plan = model.layer_plan(&inputs)?;
        let positions = inputs.positions.detach();
        let basis = edge_basis(
            &positions,
            &inputs.offsets,
            &inputs.centers,
            &inputs.neighbors,
            model.n_rbf,
            model.cutoff,
        )?;
        Ok(Self {
            inputs,
            rows,
            plan,
            positions,
            basis,
            tapes: Vec::new(),
            g_basis: None,
            forces: None,
        })
    }

    /// The first block's input state [4N, F] (component-major: s, then v_x, v_y, v_z rows):
    /// every atom's embedding and zero vectors; None where the plan runs the first block as
    /// sums per element, which add it themselves.
    pub fn initial_state(&self, model: &FusedPainn) -> Result<Option<Tensor>> {
        match self.plan.first_block_sums {
            true => Ok(None),
            false => Ok(Some(initial_state(&model.embedding, &self.inputs.species)?)),
        }
    }

    /// Runs the next block on its input state [4N, F] (every atom's): the output state of the
    /// first `rows` atoms [4 rows, F] (messages reach those alone, and only they are updated).
    pub fn forward(&mut self, model: &FusedPainn, state: Option<Tensor>) -> Result<Tensor> {
        let k = self.tapes.len();
        if k == model.blocks.len() {
            bail!("layered pass: all {k} blocks have run forward")
        }
        let (x, plan, basis) = (&self.inputs, &self.plan, &self.basis);
        let only = (false, Some(self.rows));
        let (next, tape) = model.block_forward(k, state, basis, x, plan, false, only)?;
        self.tapes.push(tape);
        Ok(next)
    }

    /// The energies [rows] (eV) of the first `rows` atoms from the last block's output state
    /// [4 rows, F], and −∂(their sum)/∂s [rows, F].
    pub fn readout(&self, model: &FusedPainn, state: &Tensor) -> Result<(Tensor, Tensor)> {
        let path = self.plan.dense_atoms;
        let s = state.narrow(0, 0, self.rows)?;
        let species = self.inputs.species.narrow(0, 0, self.rows)?;
        let (energies, tape) = model.readout(&s, &species, path, true)?;
        let seed = match tape {
            ReadoutTape::Seed(g) => g,
            ReadoutTape::Pre(pre) => {
                (model.readout).adjoint_from_hidden(&pre, &model.readout_force_seed, path)?
            }
        };
        Ok((energies, seed))
    }

    /// Block `k`'s adjoint: from −∂E/∂ of its output state, `g_s` [rows, F] and `g_v`
    /// [3 rows, F], to −∂E/∂ of its input state, every atom's (s [N, F], v [3N, F]); None for
    /// the first block, whose input is the embedding. Its share of the forces is kept for
    /// [`forces`](Self::forces).
    pub fn backward(
        &mut self,
        model: &FusedPainn,
        k: usize,
        g_s: &Tensor,
        g_v: &Tensor,
    ) -> Result<Option<(Tensor, Tensor)>> {
        let Some(tape) = self.tapes.get(k) else {
            bail!("layered pass: block {k} has not run forward")
        };
        let (zeros_s, zeros_v) = (g_s.zeros_like()?, g_v.zeros_like()?);
        // A plain gradient: gx on s and, as the next block's share, g_v on v.
        let grad = StateGrad {
            gx: g_s,
            next: Some((&zeros_s, g_v, &zeros_v)),
        };
        let (x, plan) = (&self.inputs, &self.plan);
        let after = self.g_basis.as_ref();
        if tape.phi.is_none() {
            // The first block as sums per element: its adjoint ends in the forces.
            let only = (false, Some(self.rows));
            let p = &self.positions;
            self.forces = Some(model.sums_block_adjoint(tape, &grad, p, x, plan, after, only)?);
            return Ok(None);
        }
        let only = (false, Some(self.rows));
        let grads = model.block_adjoint(k, tape, &grad, &self.basis, x, plan, after, only)?;
        self.g_basis = Some(grads.g_basis);
        // The residual carries the messaged state's gradient to the input; φ and the messages
        // add theirs.
        Ok(match grads.g_phi_input {
            None => None,
            Some(g_phi) => Some(((g_phi + grads.g_s)?, (grads.g_v + grads.g_v_in)?)),
        })
    }

    /// Forces [N, 3] (eV/Å): −∂E/∂x of every atom through the edge basis of every block run
    /// backward.
    pub fn forces(&self, model: &FusedPainn) -> Result<Tensor> {
        if let Some(f) = &self.forces {
            return Ok(f.clone());
        }
        let x = &self.inputs;
        match &self.g_basis {
            Some(g) => basis_adjoint(
                &self.positions,
                &x.offsets,
                g,
                (&x.centers, &x.neighbors),
                (model.n_rbf, model.cutoff),
                false,
            ),
            None => self.positions.zeros_like(),
        }
    }
}
