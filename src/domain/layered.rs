//! A domain whose ghosts reach one cutoff, not the receptive field: the model runs one
//! message-passing block at a time for the local atoms, and between blocks the caller hands
//! features to the domains that hold those atoms as ghosts (forward) and gradients back to
//! their owners (reverse), as LAMMPS's forward and reverse communication do.
//!
//! Per atom a block's features are 4F numbers: s (F), then v's x, y and z rows (F each). Block
//! 0 reads every atom's element embedding, the same on every domain; block k > 0 reads the
//! local atoms' output of block k − 1 and, for the ghosts, their owners' (the caller's forward
//! exchange). After the last block the energy is the local atoms' readout. The backward pass
//! runs the blocks in reverse: block k's backward takes the gradient of the energy on its local
//! outputs (its own from block k + 1's backward, plus what other domains sent back for these
//! atoms) and returns the gradient on its ghosts' inputs, which the caller sends to their
//! owners for block k − 1. Forces come out for every atom, ghosts included, for the caller to
//! add to their owners, as with [`DomainPrediction`](super::DomainPrediction).
//!
//! Summed over domains this is the whole system's energy and forces when every atom within one
//! cutoff of a local atom is a ghost (tests/domain.rs). A domain then computes its own
//! atoms only, where a ghost shell of the receptive field (blocks × cutoff) makes it compute
//! every block for a shell three times as thick, at the price of 2 (blocks − 1) exchanges of
//! 4F numbers per ghost atom. Each block runs on the fused kernels with its hand-written
//! adjoint ([`LayeredPass`]), whatever the calculator's backend.

use super::rows;
use crate::error::{Error, Result};
use crate::model::{LayeredPass, PainnInputs};
use crate::neighbors::{neighbor_list, NeighborList};
use crate::PainnCalculator;
use candle_core::{DType, Tensor};

/// One call of a layered domain: `forward` once per block, then `backward` once per block in
/// reverse, then [`LayeredDomain::forces`], each with the calculator it was made with.
pub struct LayeredDomain {
    hidden: usize,
    n_blocks: usize,
    n_local: usize,
    n_atoms: usize,
    pass: LayeredPass,
    /// Block k's output state of the local atoms [4, n_local, F] (s, v_x, v_y, v_z).
    outputs: Vec<Tensor>,
    /// The local atoms' energies, after the last block.
    atom_energies: Option<Tensor>,
    /// −∂E/∂s of the local atoms' last state, after the last block.
    seed: Option<Tensor>,
    /// −∂E/∂ of the next backward block's output state [4, n_local, F].
    pending: Option<Tensor>,
    /// Every atom's force, after the first block's backward.
    forces: Option<Vec<[f64; 3]>>,
    forward_done: usize,
    backward_done: usize,
}

impl LayeredDomain {
    /// A domain of `numbers`/`positions`, the first `n_local` owned, the rest ghosts (no
    /// periodic images: the caller's ghosts stand for them). Edges run from every atom within
    /// the cutoff to the local atoms only.
    pub fn new(
        calc: &PainnCalculator,
        numbers: &[u8],
        positions: &[[f64; 3]],
        n_local: usize,
    ) -> Result<Self> {
        super::session::check_atoms(numbers, positions, n_local)?;
        let nl = neighbor_list(positions, None, [false; 3], calc.model().config().cutoff)?;
        let edges = DomainEdges::new(calc, numbers, n_local, &nl)?;
        Self::with_edges(calc, &edges, positions)
    }

    /// A domain at `positions` over `edges` (built for these atoms, their pairs within the
    /// cutoff at these positions among them).
    pub(super) fn with_edges(
        calc: &PainnCalculator,
        edges: &DomainEdges,
        positions: &[[f64; 3]],
    ) -> Result<Self> {
        let cfg = calc.model().config();
        let (n, dev) = (edges.numbers.len(), calc.device());
        let x = Tensor::from_slice(positions.as_flattened(), (n, 3), dev)?;
        let inputs = PainnInputs {
            species: edges.species.clone(),
            positions: x.to_dtype(calc.dtype())?,
            centers: edges.centers.clone(),
            neighbors: edges.neighbors.clone(),
            offsets: edges.offsets.clone(),
            atom_structure: edges.atom_structure.clone(),
            n_structures: 1,
        };
        let n_local = edges.n_local;
        Ok(Self {
            hidden: cfg.hidden,
            n_blocks: cfg.n_blocks,
            n_local,
            n_atoms: n,
            pass: LayeredPass::new(calc.fused()?, inputs, n_local)?,
            outputs: Vec::new(),
            atom_energies: None,
            seed: None,
            pending: None,
            forces: None,
            forward_done: 0,
            backward_done: 0,
        })
    }

    /// Message-passing blocks of the model: forward and backward calls each.
    pub fn blocks(&self) -> usize {
        self.n_blocks
    }

    /// Numbers per atom in an exchange: 4F.
    pub fn features_per_atom(&self) -> usize {
        4 * self.hidden
    }

    /// Atoms owned here.
    pub fn n_local(&self) -> usize {
        self.n_local
    }

    /// Ghost atoms.
    pub fn n_ghost(&self) -> usize {
        self.n_atoms - self.n_local
    }

    /// Runs the next block. `ghosts` holds its ghosts' input features (n_ghost × 4F, ghost
    /// order; the owners' outputs of the previous block); the first block takes none. Returns
    /// the local atoms' outputs (n_local × 4F) for the domains that hold them as ghosts.
    pub fn forward(&mut self, calc: &PainnCalculator, ghosts: Option<&[f64]>) -> Result<Vec<f64>> {
        let k = self.forward_done;
        if k == self.blocks() {
            return Err(Error::Config(format!(
                "layered domain: all {k} blocks have run forward",
            )));
        }
        let (f, n) = (self.hidden, self.n_atoms);
        // No ghosts: nothing to pass (a C caller may pass null).
        let ghosts = ghosts.or((k > 0 && self.n_ghost() == 0).then_some(&[][..]));
        if self.n_local == 0 {
            // Nothing of this domain's counts: its ghosts' features are checked, not used.
            if let Some(g) = ghosts.filter(|_| k > 0) {
                self.check_rows(g, self.n_ghost(), "ghost features")?;
            }
            self.forward_done += 1;
            return Ok(Vec::new());
        }
        let model = calc.fused()?;
        let state = match (k, ghosts) {
            (0, None) => self.pass.initial_state(model)?,
            (0, Some(_)) => {
                return Err(Error::Config(
                    "layered domain: the first block reads embeddings, not ghost features".into(),
                ))
            }
            (_, None) => {
                return Err(Error::Config(format!(
                    "layered domain: block {k} needs its ghosts' features"
                )))
            }
            (_, Some(g)) => {
                let ghost = self.rows_of(calc, g, self.n_ghost(), "ghost features")?;
                let ghost = ghost.reshape((self.n_ghost(), 4, f))?.transpose(0, 1)?;
                Some(Tensor::cat(&[&self.outputs[k - 1], &ghost], 1)?.reshape((4 * n, f))?)
            }
        };
        let out = self.pass.forward(model, state)?;
        if k + 1 == self.blocks() {
            let (energies, seed) = self.pass.readout(model, &out)?;
            self.atom_energies = Some(energies);
            self.seed = Some(seed);
        }
        let out = out.reshape((4, self.n_local, f))?;
        let local = per_atom(&out)?;
        self.outputs.push(out);
        self.forward_done += 1;
        Ok(local)
    }

    /// The local atoms' energies (eV), once every block has run forward.
    pub fn atom_energies(&self) -> Result<Vec<f64>> {
        if self.n_local == 0 && self.forward_done == self.blocks() {
            return Ok(Vec::new());
        }
        let e = self.atom_energies.as_ref().ok_or_else(|| {
            Error::Config("layered domain: the energy needs every block forward first".into())
        })?;
        Ok(e.to_dtype(DType::F64)?.to_vec1::<f64>()?)
    }

    /// Runs the next block backward, from the last. `received` is what the other domains sent
    /// back for the local atoms from the block after this one (n_local × 4F, summed over
    /// domains); the last block takes none. Returns the gradient of the energy on this block's
    /// ghost inputs (n_ghost × 4F) for their owners; empty after the first block, whose inputs
    /// are embeddings.
    pub fn backward(
        &mut self,
        calc: &PainnCalculator,
        received: Option<&[f64]>,
    ) -> Result<Vec<f64>> {
        let blocks = self.blocks();
        if self.forward_done < blocks {
            return Err(Error::Config(
                "layered domain: backward needs every block forward first".into(),
            ));
        }
        if self.backward_done == blocks {
            return Err(Error::Config(format!(
                "layered domain: all {blocks} blocks have run backward"
            )));
        }
        let k = blocks - 1 - self.backward_done;
        let (f, n, m) = (self.hidden, self.n_atoms, self.n_local);
        if m == 0 {
            // No energy here: every gradient is zero.
            self.backward_done += 1;
            return Ok(vec![0.0; if k == 0 { 0 } else { self.n_ghost() * 4 * f }]);
        }
        // −∂E/∂ of this block's output state, (s [n_local, F], v [3 n_local, F]).
        let (g_s, g_v) =
            match (k + 1 == blocks, received) {
                (true, None) => {
                    let seed = self
                        .seed
                        .clone()
                        .ok_or_else(|| internal("energy gradient"))?;
                    let zeros = Tensor::zeros((3 * m, f), seed.dtype(), seed.device())?;
                    (seed, zeros)
                }
                (true, Some(_)) => return Err(Error::Config(
                    "layered domain: the last block's gradient is the energy's, none is received"
                        .into(),
                )),
                (false, None) => {
                    return Err(Error::Config(format!(
                        "layered domain: block {k} needs the gradient the other domains sent back"
                    )))
                }
                (false, Some(r)) => {
                    let r = self.rows_of(calc, r, m, "received gradients")?;
                    let received = r.reshape((m, 4, f))?.transpose(0, 1)?;
                    let own = self
                        .pending
                        .take()
                        .ok_or_else(|| internal("pending gradient"))?;
                    // What came back is ∂E's; the pass carries −∂E's.
                    let g = (own - received)?.reshape((4 * m, f))?;
                    (g.narrow(0, 0, m)?, g.narrow(0, m, 3 * m)?)
                }
            };
        let model = calc.fused()?;
        let input = self.pass.backward(model, k, &g_s, &g_v)?;
        self.backward_done += 1;
        let Some((in_s, in_v)) = input else {
            self.forces = Some(rows(&self.pass.forces(model)?)?);
            return Ok(Vec::new());
        };
        let g = Tensor::cat(&[&in_s, &in_v], 0)?.reshape((4, n, f))?;
        self.pending = Some(g.narrow(1, 0, m)?);
        Ok(per_atom(&g.narrow(1, m, self.n_ghost())?.neg()?)?)
    }

    /// −∂E/∂x of every atom (eV/Å), local and ghost, once every block has run backward: the
    /// ghosts' for their owners.
    pub fn forces(&self) -> Result<Vec<[f64; 3]>> {
        if self.backward_done < self.blocks() {
            return Err(Error::Config(
                "layered domain: forces need every block backward first".into(),
            ));
        }
        match &self.forces {
            Some(f) => Ok(f.clone()),
            // No local atoms: no energy, no forces.
            None => Ok(vec![[0.0; 3]; self.n_atoms]),
        }
    }

    /// `values` is `n` rows of 4F finite numbers, or an error naming `what` and the atom.
    fn check_rows(&self, values: &[f64], n: usize, what: &str) -> Result<()> {
        let width = self.features_per_atom();
        if values.len() != n * width {
            return Err(Error::Structure(format!(
                "layered domain: {} {what} for {n} atoms of {width}",
                values.len()
            )));
        }
        if let Some(i) = values.iter().position(|x| !x.is_finite()) {
            return Err(Error::NonFinite(format!(
                "layered domain: {what} of atom {} is {}",
                i / width,
                values[i]
            )));
        }
        Ok(())
    }

    /// `values` (`n` rows of 4F) as a tensor in the model's dtype.
    fn rows_of(
        &self,
        calc: &PainnCalculator,
        values: &[f64],
        n: usize,
        what: &str,
    ) -> Result<Tensor> {
        self.check_rows(values, n, what)?;
        let t = Tensor::from_slice(values, (n, self.features_per_atom()), calc.device())?;
        Ok(t.to_dtype(calc.dtype())?)
    }
}

/// A layered domain's atoms and one-sided edges on the device: the pairs of `list` whose center
/// is a local atom (the first `n_local`), no images (the ghosts stand for them).
pub(super) struct DomainEdges {
    pub(super) numbers: Vec<u8>,
    pub(super) n_local: usize,
    species: Tensor,
    centers: Tensor,
    neighbors: Tensor,
    offsets: Tensor,
    atom_structure: Tensor,
}

impl DomainEdges {
    pub(super) fn new(
        calc: &PainnCalculator,
        numbers: &[u8],
        n_local: usize,
        list: &NeighborList,
    ) -> Result<Self> {
        let (mut centers, mut neighbors) = (Vec::new(), Vec::new());
        for (&i, &j) in list.centers.iter().zip(&list.neighbors) {
            if (i as usize) < n_local {
                centers.push(i);
                neighbors.push(j);
            }
        }
        let (n, e, dev) = (numbers.len(), centers.len(), calc.device());
        Ok(Self {
            numbers: numbers.to_vec(),
            n_local,
            species: Tensor::from_vec(calc.structure_species(numbers, 0)?, n, dev)?,
            centers: Tensor::from_vec(centers, e, dev)?,
            neighbors: Tensor::from_vec(neighbors, e, dev)?,
            offsets: Tensor::zeros((e, 3), calc.dtype(), dev)?,
            atom_structure: Tensor::zeros(n, DType::U32, dev)?,
        })
    }
}

/// A state's rows [4, M, F] (s, v_x, v_y, v_z) as M atoms' 4F numbers each, in f64.
fn per_atom(x: &Tensor) -> candle_core::Result<Vec<f64>> {
    x.transpose(0, 1)?
        .to_dtype(DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()
}

/// A state the call order guarantees, missing.
fn internal(what: &str) -> Error {
    Error::Config(format!(
        "layered domain: no {what} (a bug: please report it)"
    ))
}
