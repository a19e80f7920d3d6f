//! The whole PaiNN model: edge geometry, filters, blocks, readout, per-structure energies.

use super::config::PainnConfig;
use super::message::{Edges, Message};
use super::radial::{cosine_cutoff, gaussian_rbf};
use super::readout::Readout;
use super::update::Update;
use super::Backend;
use candle_core::{Module, Result, Tensor};
use candle_nn::{linear, Linear, VarBuilder};

/// Device tensors describing a flattened batch for one forward pass.
pub struct PainnInputs {
    /// Embedding row of each atom, \[N\] u32.
    pub species: Tensor,
    /// Cartesian positions, [N, 3] (a `Var` when forces are wanted).
    pub positions: Tensor,
    /// Receiving atom i of each edge, \[E\] u32. Every edge i ← j with offset S·cell comes with
    /// its reverse j ← i with −S·cell, as [`NeighborList`](crate::neighbors::NeighborList)
    /// gives them (the fused path's adjoint for large systems relies on it; padding edges
    /// beyond the cutoff contribute nothing either way).
    pub centers: Tensor,
    /// Sending atom j of each edge, \[E\] u32.
    pub neighbors: Tensor,
    /// Image offset S·cell of each edge in Å, [E, 3]: r_ij = x_j - x_i + offset.
    pub offsets: Tensor,
    /// Structure of each atom, \[N\] u32.
    pub atom_structure: Tensor,
    pub n_structures: usize,
}

/// What the blocks read of the edges: unit vectors r_ij / |r_ij| \[E, 3\] and the filters
/// W(r_ij) times the cutoff, \[E, blocks × 3F\].
pub struct EdgeGeometry {
    pub filters: Tensor,
    pub directions: Tensor,
}

pub struct Painn {
    cfg: PainnConfig,
    pub(super) embedding: Tensor,
    pub(super) filter: Linear,
    pub(super) messages: Vec<Message>,
    pub(super) updates: Vec<Update>,
    pub(super) readout: Readout,
    backend: Backend,
}

impl Painn {
    /// Builds the model with weights from `vb` (a checkpoint, or a VarMap for training).
    pub fn new(cfg: &PainnConfig, vb: VarBuilder) -> Result<Self> {
        let f = cfg.hidden;
        let embedding = vb.get_with_hints(
            (cfg.elements.len(), f),
            "embedding.weight",
            candle_nn::Init::Randn {
                mean: 0.0,
                stdev: 1.0,
            },
        )?;
        // One filter network for all blocks, as in the paper (shared_filters = false).
        let filter = linear(cfg.n_rbf, cfg.n_blocks * 3 * f, vb.pp("filter"))?;
        let mut messages = Vec::with_capacity(cfg.n_blocks);
        let mut updates = Vec::with_capacity(cfg.n_blocks);
        for k in 0..cfg.n_blocks {
            let b = vb.pp("blocks").pp(k);
            messages.push(Message::new(f, b.pp("message"))?);
            updates.push(Update::new(f, b.pp("update"))?);
        }
        let readout = Readout::new(f, cfg.elements.len(), vb.pp("readout"))?;
        Ok(Self {
            cfg: cfg.clone(),
            embedding,
            filter,
            messages,
            updates,
            readout,
            backend: Backend::default(),
        })
    }

    pub fn config(&self) -> &PainnConfig {
        &self.cfg
    }

    pub fn with_backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Per-atom energies \[N\] in eV.
    pub fn atom_energies(&self, x: &PainnInputs) -> Result<Tensor> {
        let ops = self.backend;
        let geometry = self.edge_geometry(x, ops)?;
        let (mut s, mut v) = self.embed(&x.species, ops)?;
        for k in 0..self.messages.len() {
            (s, v) = self.block(k, &s, &v, x, &geometry, ops)?;
        }
        self.readout.atom_energies(&s, &x.species, ops)
    }

    /// Every edge's unit vector and every block's filter W(r_ij) times the cutoff.
    pub fn edge_geometry(&self, x: &PainnInputs, ops: Backend) -> Result<EdgeGeometry> {
        let r_ij = ((ops.gather(&x.positions, &x.neighbors)?
            - ops.gather(&x.positions, &x.centers)?)?
            + &x.offsets)?;
        let d = r_ij.sqr()?.sum(1)?.sqrt()?;
        let directions = r_ij.broadcast_div(&d.unsqueeze(1)?)?;
        let rbf = gaussian_rbf(&d, self.cfg.n_rbf, self.cfg.cutoff)?;
        let fcut = cosine_cutoff(&d, self.cfg.cutoff)?;
        let w = self.filter.forward(&rbf)?;
        Ok(EdgeGeometry {
            filters: w.broadcast_mul(&fcut.unsqueeze(1)?)?,
            directions,
        })
    }

    /// The features before the first block: (s, v) = (the element's embedding, 0).
    pub fn embed(&self, species: &Tensor, ops: Backend) -> Result<(Tensor, Tensor)> {
        let s = ops.gather(&self.embedding, species)?;
        let v = Tensor::zeros((s.dim(0)?, 3, self.cfg.hidden), s.dtype(), s.device())?;
        Ok((s, v))
    }

    /// Block `k` (message over `x`'s edges, then update) from every atom's features (s \[N, F\],
    /// v \[N, 3, F\]): every atom's features after it.
    pub fn block(
        &self,
        k: usize,
        s: &Tensor,
        v: &Tensor,
        x: &PainnInputs,
        geometry: &EdgeGeometry,
        ops: Backend,
    ) -> Result<(Tensor, Tensor)> {
        let f = self.cfg.hidden;
        let edges = Edges {
            centers: &x.centers,
            neighbors: &x.neighbors,
            directions: &geometry.directions,
            ops,
        };
        let w = geometry.filters.narrow(1, k * 3 * f, 3 * f)?;
        let (s, v) = self.messages[k].forward(s, v, &w, &edges, k == 0)?;
        self.updates[k].forward(&s, &v)
    }

    /// Per-atom energies \[N\] in eV from the last block's scalar features.
    pub fn readout(&self, s: &Tensor, species: &Tensor, ops: Backend) -> Result<Tensor> {
        self.readout.atom_energies(s, species, ops)
    }

    /// Energy of each structure, \[n_structures\] in eV.
    pub fn energies(&self, x: &PainnInputs) -> Result<Tensor> {
        let e_atom = self.atom_energies(x)?;
        self.backend
            .scatter_add(&e_atom, &x.atom_structure, x.n_structures)
    }
}
