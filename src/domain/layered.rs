//! A domain whose ghosts reach one cutoff, not the receptive field: the model runs one
//! message-passing block at a time for the local atoms, and between blocks the caller hands
//! features to the domains that hold those atoms as ghosts (forward) and gradients back to
//! their owners (reverse), as LAMMPS's forward and reverse communication do.
//!
//! Per atom a block's features are 4F numbers: s (F), then v's x, y and z rows (F each). Block
//! 0 reads every atom's element embedding, the same on every domain; block k > 0 reads the
//! local atoms' output of block k − 1 and, for the ghosts, their owners' (the caller's forward
//! exchange). After the last block the energy is the local atoms' readout. The backward pass
//! runs the blocks in reverse: block k's backward takes the gradient on its local outputs (its
//! own from block k + 1's backward, plus what other domains sent back for these atoms) and
//! returns the gradient on its ghosts' inputs, which the caller sends to their owners for block
//! k − 1. Forces come out for every atom, ghosts included, for the caller to add to their
//! owners, as with [`DomainPrediction`](super::DomainPrediction).
//!
//! Summed over domains this is the whole system's energy and forces when every atom within one
//! cutoff of a local atom is a ghost (tests/domain.rs). A domain then computes its own
//! atoms only, where a ghost shell of the receptive field (blocks × cutoff) makes it compute
//! every block for a shell three times as thick, at the price of 2 (blocks − 1) exchanges of
//! 4F numbers per ghost atom. It runs on candle's autograd over the model's modules, whose
//! message is the fused op with its first-derivative backward (on the CPU one pass over the
//! edges: nothing here differentiates the forces again).

use super::rows;
use crate::error::{Error, Result};
use crate::model::{Backend, PainnInputs};
use crate::neighbors::neighbor_list;
use crate::ops::Derivatives;
use crate::PainnCalculator;
use candle_core::{DType, Tensor, Var, D};

const OPS: Backend = Backend::Fused;

/// One call of a layered domain: `forward` once per block, then `backward` once per block in
/// reverse, then [`LayeredDomain::forces`], each with the calculator it was made with.
pub struct LayeredDomain {
    hidden: usize,
    n_blocks: usize,
    n_local: usize,
    inputs: PainnInputs,
    positions: Var,
    /// Block k's input (s, v) of every atom, as variables for its backward.
    block_inputs: Vec<(Var, Var)>,
    /// Block k's output (s, v), local rows.
    block_outputs: Vec<(Tensor, Tensor)>,
    /// The local atoms' energies, after the last block.
    atom_energies: Option<Tensor>,
    /// The gradient of the energy on the local rows of the next backward block's output.
    pending: Option<Tensor>,
    /// ∂E/∂x summed over the blocks run backward so far.
    position_grad: Tensor,
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
        let cfg = calc.model().config();
        let nl = neighbor_list(positions, None, [false; 3], cfg.cutoff)?;
        let (mut centers, mut neighbors) = (Vec::new(), Vec::new());
        for (&i, &j) in nl.centers.iter().zip(&nl.neighbors) {
            if (i as usize) < n_local {
                centers.push(i);
                neighbors.push(j);
            }
        }
        let (n, e, dev) = (numbers.len(), centers.len(), calc.device());
        let x = Tensor::from_slice(positions.as_flattened(), (n, 3), dev)?;
        let positions = Var::from_tensor(&x.to_dtype(calc.dtype())?)?;
        let inputs = PainnInputs {
            species: Tensor::from_vec(calc.structure_species(numbers, 0)?, n, dev)?,
            positions: positions.as_tensor().clone(),
            centers: Tensor::from_vec(centers, e, dev)?,
            neighbors: Tensor::from_vec(neighbors, e, dev)?,
            offsets: Tensor::zeros((e, 3), calc.dtype(), dev)?,
            atom_structure: Tensor::zeros(n, DType::U32, dev)?,
            n_structures: 1,
        };
        let position_grad = positions.as_tensor().zeros_like()?;
        Ok(Self {
            hidden: cfg.hidden,
            n_blocks: cfg.n_blocks,
            n_local,
            inputs,
            positions,
            block_inputs: Vec::new(),
            block_outputs: Vec::new(),
            atom_energies: None,
            pending: None,
            position_grad,
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
        self.inputs.species.dims()[0] - self.n_local
    }

    /// Runs the next block. `ghosts` holds its ghosts' input features (n_ghost × 4F, ghost
    /// order; the owners' outputs of the previous block); the first block takes none. Returns
    /// the local atoms' outputs (n_local × 4F) for the domains that hold them as ghosts.
    pub fn forward(&mut self, calc: &PainnCalculator, ghosts: Option<&[f64]>) -> Result<Vec<f64>> {
        let k = self.forward_done;
        let model = calc.model();
        if k == self.blocks() {
            return Err(Error::Config(format!(
                "layered domain: all {k} blocks have run forward",
            )));
        }
        let f = self.hidden;
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
        let (s, v) = match (k, ghosts) {
            (0, None) => model.embed(&self.inputs.species, OPS)?,
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
                let (s_loc, v_loc) = &self.block_outputs[k - 1];
                let local = join(s_loc, v_loc, f)?;
                split(&Tensor::cat(&[&local, &ghost], 0)?, f)?
            }
        };
        let (s_in, v_in) = (Var::from_tensor(&s)?, Var::from_tensor(&v)?);
        let geometry = model.block_geometry(&self.inputs, k, OPS)?;
        let (s_out, v_out) = model.block(
            k,
            s_in.as_tensor(),
            v_in.as_tensor(),
            &self.inputs,
            &geometry,
            self.n_local,
            (OPS, Derivatives::First),
        )?;
        let out = flat(&join(&s_out, &v_out, f)?)?;
        if k + 1 == self.blocks() {
            let species = self.inputs.species.narrow(0, 0, self.n_local)?;
            self.atom_energies = Some(model.readout(&s_out, &species, OPS)?);
        }
        self.block_inputs.push((s_in, v_in));
        self.block_outputs.push((s_out, v_out));
        self.forward_done += 1;
        Ok(out)
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
    /// domains); the last block takes none. Returns the gradient on this block's ghost inputs
    /// (n_ghost × 4F) for their owners; empty after the first block, whose inputs are
    /// embeddings.
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
        let f = self.hidden;
        if self.n_local == 0 {
            // No energy here: every gradient is zero.
            self.backward_done += 1;
            return Ok(vec![0.0; if k == 0 { 0 } else { self.n_ghost() * 4 * f }]);
        }
        let (s_out, v_out) = &self.block_outputs[k];
        let objective =
            match (k + 1 == blocks, received) {
                (true, None) => self
                    .atom_energies
                    .clone()
                    .ok_or_else(|| internal("energies"))?,
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
                    let r = self.rows_of(calc, r, self.n_local, "received gradients")?;
                    let own = self
                        .pending
                        .take()
                        .ok_or_else(|| internal("pending gradient"))?;
                    let g = (own + r)?;
                    let (g_s, g_v) = split(&g, f)?;
                    ((s_out * g_s)?.sum_all()? + (v_out * g_v)?.sum_all()?)?
                }
            };
        let grads = objective.sum_all()?.backward()?;
        if let Some(g) = grads.get(self.positions.as_tensor()) {
            self.position_grad = (&self.position_grad + g)?;
        }
        self.backward_done += 1;
        if k == 0 {
            return Ok(Vec::new());
        }
        let (s_in, v_in) = &self.block_inputs[k];
        let zeros = |t: &Var| t.as_tensor().zeros_like();
        let g_s = grads
            .get(s_in.as_tensor())
            .cloned()
            .map_or_else(|| zeros(s_in), Ok)?;
        let g_v = grads
            .get(v_in.as_tensor())
            .cloned()
            .map_or_else(|| zeros(v_in), Ok)?;
        let g = join(&g_s, &g_v, f)?;
        self.pending = Some(g.narrow(0, 0, self.n_local)?);
        Ok(flat(&g.narrow(0, self.n_local, self.n_ghost())?)?)
    }

    /// −∂E/∂x of every atom (eV/Å), local and ghost, once every block has run backward: the
    /// ghosts' for their owners.
    pub fn forces(&self) -> Result<Vec<[f64; 3]>> {
        if self.backward_done < self.blocks() {
            return Err(Error::Config(
                "layered domain: forces need every block backward first".into(),
            ));
        }
        rows(&self.position_grad.neg()?)
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

/// (s [N, F], v [N, 3, F]) as [N, 4F].
fn join(s: &Tensor, v: &Tensor, f: usize) -> candle_core::Result<Tensor> {
    let n = s.dim(0)?;
    Tensor::cat(&[s, &v.reshape((n, 3 * f))?], D::Minus1)
}

/// [N, 4F] as (s [N, F], v [N, 3, F]).
fn split(x: &Tensor, f: usize) -> candle_core::Result<(Tensor, Tensor)> {
    let n = x.dim(0)?;
    let s = x.narrow(1, 0, f)?.contiguous()?;
    let v = x.narrow(1, f, 3 * f)?.contiguous()?.reshape((n, 3, f))?;
    Ok((s, v))
}

/// A tensor's values in f64, row-major.
fn flat(x: &Tensor) -> candle_core::Result<Vec<f64>> {
    x.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
}

/// A state the call order guarantees, missing.
fn internal(what: &str) -> Error {
    Error::Config(format!(
        "layered domain: no {what} (a bug: please report it)"
    ))
}
