//! A domain's whole call with ghost shells that shrink block by block: its ghosts reach the
//! receptive field (blocks × cutoff), yet block k needs new features only for the atoms within
//! B − 1 − k hops of a local atom (the last block for the local atoms alone, whose energies
//! count). With the atoms ordered by that depth (locals first), block k updates the first
//! `rows[k]` atoms, on a domain of the atoms the block before updated: the shells' work falls
//! from every block over every ghost to about one block's worth (docs/bench-log/75).
//!
//! Block k runs over the edges with an end among its first `rows[k]` atoms, both directions of
//! each pair: a list that holds every edge's reverse, which the symmetric adjoint takes (it sums
//! each atom's sending gradients over its own edges and dL/d(basis) in its kernel; one-sided
//! edges took an adjoint writing every edge's filter gradient, twice as slow on GPUs:
//! docs/bench-log/76). The edges into atoms past `rows[k]` carry messages nobody reads and,
//! backwards, zero gradients. The list is put in classes by its edges' smaller atom
//! ([`partition_edges`]): block k's edges are then a prefix of it, nested as the blocks shrink.

use super::pass::ReadoutTape;
use super::FusedPainn;
use crate::model::PainnInputs;
use crate::ops::edges::partition::{partition_edges, PARTITION_MAX_CLASSES};
use crate::ops::layers::edge_basis::basis_adjoint;
use crate::ops::{edge_basis, gather, initial_state, StateGrad};
use candle_core::{bail, Result, Tensor};

/// What a shell call gives.
pub struct ShellCall {
    /// Energies (eV) of the last block's rows (the local atoms).
    pub atom_energies: Tensor,
    /// −∂E/∂x of every atom [N, 3], E the sum of `atom_energies`.
    pub forces: Tensor,
    /// Each atom's share of the virial [N, 3, 3]: Σ over its edges of r ⊗ F (their sum is
    /// the domain's W, as [`FusedForward::forces_and_virials`](super::FusedForward) gives).
    pub virials: Tensor,
}

impl FusedPainn {
    /// The shell call of `x` (atoms by depth; see the module's doc): block k updates the
    /// first `rows[k]` atoms (non-increasing). Every edge of `x` joining atoms the block before
    /// updated (every atom for the first block) to the block's rows must be in it, in both
    /// directions: a neighbour list built at these positions with the depths' cutoff holds them.
    pub fn shell_call(&self, x: &PainnInputs, rows: &[usize]) -> Result<ShellCall> {
        let blocks = self.blocks.len();
        let n = x.positions.dim(0)?;
        let ordered = rows.windows(2).all(|w| w[1] <= w[0]);
        if rows.len() != blocks || blocks == 0 || blocks >= PARTITION_MAX_CLASSES || !ordered {
            bail!("shell call: {blocks} blocks and rows {rows:?}")
        }
        if rows[0] > n {
            bail!("shell call: rows {rows:?} for {n} atoms")
        }
        let plan = self.layer_plan(x)?;
        let positions = x.positions.detach();
        // Class c: the edges whose smaller atom is of depth c; block k takes classes 0..B − k.
        let bounds: Vec<usize> = rows.iter().rev().copied().collect();
        let classes = partition_edges(&x.centers, &x.neighbors, &bounds)?;
        let edges: Vec<usize> = (0..blocks)
            .map(|k| classes.counts[..blocks - k].iter().sum())
            .collect();
        let offsets = gather(&x.offsets, &classes.order)?;
        let view = |k: usize| -> Result<PainnInputs> {
            let (atoms, e) = (if k == 0 { n } else { rows[k - 1] }, edges[k]);
            Ok(PainnInputs {
                species: x.species.narrow(0, 0, atoms)?,
                positions: positions.narrow(0, 0, atoms)?,
                centers: classes.centers.narrow(0, 0, e)?,
                neighbors: classes.neighbors.narrow(0, 0, e)?,
                offsets: offsets.narrow(0, 0, e)?,
                atom_structure: x.atom_structure.narrow(0, 0, atoms)?,
                n_structures: x.n_structures,
            })
        };
        let views = (0..blocks).map(view).collect::<Result<Vec<_>>>()?;
        let v0 = &views[0];
        let basis = edge_basis(
            &positions,
            &v0.offsets,
            &v0.centers,
            &v0.neighbors,
            self.n_rbf,
            self.cutoff,
        )?;
        let bases = (edges.iter().map(|&e| basis.narrow(0, 0, e))).collect::<Result<Vec<_>>>()?;
        let mut state = match plan.first_block_sums {
            true => None,
            false => Some(initial_state(&self.embedding, &x.species)?),
        };
        let mut tapes = Vec::with_capacity(blocks);
        for k in 0..blocks {
            let only = (true, Some(rows[k]));
            let (next, tape) =
                self.block_forward(k, state.take(), &bases[k], &views[k], &plan, false, only)?;
            tapes.push(tape);
            state = Some(next);
        }
        let (m, path) = (rows[blocks - 1], plan.dense_atoms);
        let Some(last) = state else {
            bail!("shell call: no blocks ran")
        };
        let (atom_energies, tape) = self.readout(
            &last.narrow(0, 0, m)?,
            &x.species.narrow(0, 0, m)?,
            path,
            true,
        )?;
        // −∂E/∂ of the last block's output (s, v), carried back block by block as a plain
        // gradient, as the layered pass carries it.
        let mut g_s = match tape {
            ReadoutTape::Seed(g) => g,
            ReadoutTape::Pre(pre) => {
                (self.readout).adjoint_from_hidden(&pre, &self.readout_force_seed, path)?
            }
        };
        let f = g_s.dim(1)?;
        let mut g_v = Tensor::zeros((3 * m, f), g_s.dtype(), g_s.device())?;
        let mut g_basis: Option<Tensor> = None;
        for k in (0..blocks).rev() {
            let (zeros_s, zeros_v) = (g_s.zeros_like()?, g_v.zeros_like()?);
            let grad = StateGrad {
                gx: &g_s,
                next: Some((&zeros_s, &g_v, &zeros_v)),
            };
            // The later blocks' dL/d(basis) on their edges, zero on the ones only this has.
            let after = match &g_basis {
                Some(g) => Some(pad_edges(g, edges[k])?),
                None => None,
            };
            let t = &tapes[k];
            if t.phi.is_none() {
                // The first block as sums per element: its adjoint ends in the forces.
                let only = (true, Some(rows[0]));
                let both =
                    self.sums_block_adjoint(t, &grad, &positions, v0, &plan, after.as_ref(), only)?;
                return finish(atom_energies, &both, n);
            }
            let only = (true, Some(rows[k]));
            let g = self.block_adjoint(
                k,
                t,
                &grad,
                &bases[k],
                &views[k],
                &plan,
                after.as_ref(),
                only,
            )?;
            g_basis = Some(g.g_basis);
            let Some(g_phi) = g.g_phi_input else { break };
            (g_s, g_v) = ((g_phi + g.g_s)?, (g.g_v + g.g_v_in)?);
        }
        let Some(g) = g_basis else {
            bail!("shell call: no block ran backward")
        };
        let (centers, neighbors) = (&v0.centers, &v0.neighbors);
        let cut = (self.n_rbf, self.cutoff);
        let both = basis_adjoint(&positions, &v0.offsets, &g, (centers, neighbors), cut, true)?;
        finish(atom_energies, &both, n)
    }
}

/// `g` [e, C] with zero rows after its own up to `edges` rows.
fn pad_edges(g: &Tensor, edges: usize) -> Result<Tensor> {
    let (e, c) = g.dims2()?;
    if e == edges {
        return Ok(g.clone());
    }
    let zeros = Tensor::zeros((edges - e, c), g.dtype(), g.device())?;
    Tensor::cat(&[g, &zeros], 0)
}

/// The call from the adjoint's [4N, 3] (forces, then the virial rows).
fn finish(atom_energies: Tensor, both: &Tensor, n: usize) -> Result<ShellCall> {
    Ok(ShellCall {
        atom_energies,
        forces: both.narrow(0, 0, n)?,
        virials: both.narrow(0, n, 3 * n)?.reshape((n, 3, 3))?,
    })
}
