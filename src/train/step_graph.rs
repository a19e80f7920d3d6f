//! A whole fused training step as a CUDA graph: the weights' fused form, the pass at x, the
//! loss, the displaced copies, the weight gradients, AdamW, the EMA and the write-back into the
//! variables, replayed with one launch. A step is then the host's batch (its uploads into the
//! graph's static inputs), the launch and one read of the loss, instead of a few hundred
//! launches, each with its allocation.
//!
//! A graph is captured for a number of atoms and structures and an edge capacity; shorter edge
//! lists are padded with edges beyond the cutoff (`graph::pad_edges`: zero basis, zero
//! filter, zero weight gradient), smaller batches with isolated atoms in one more structure
//! whose labels and seeds are zero (`labels`). Up to [`MAX_GRAPHS`] are kept; a batch that
//! fits none of them runs op by op. The values that change from step to step
//! (learning rate, bias corrections, EMA decay) are a device input of the optimiser kernel.
//! What the step is, the trainer says (`fused_step`); this holds the buffers and the graph.

use crate::error::Result;
use crate::graph::{capture_graph, launch, Graph};
use crate::model::PainnInputs;
use candle_core::{DType, Device, Tensor, Var};

/// Batch shapes captured at most; a batch that fits none of them runs op by op.
pub(super) const MAX_GRAPHS: usize = 8;

/// Where batches of one structure count come in several sizes, graphs are captured for atom
/// counts in steps of this, the batches padded up to them (at most this many atoms more).
pub(super) const BUCKET_ATOMS: usize = 64;

/// What a batch needs of a captured step: its atoms, its structures with the padding one,
/// its edges. In a data-parallel step (`replicas`), the largest of the ranks' shards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Need {
    pub(super) atoms: usize,
    pub(super) structures: usize,
    pub(super) edges: usize,
}

impl Need {
    /// The largest need of each kind.
    pub(super) fn max(self, other: Self) -> Self {
        Self {
            atoms: self.atoms.max(other.atoms),
            structures: self.structures.max(other.structures),
            edges: self.edges.max(other.edges),
        }
    }
}

/// The shape a batch is padded to: atoms and structures (padding included), edge capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct StepPadding {
    pub(super) atoms: usize,
    pub(super) structures: usize,
    pub(super) capacity: usize,
}

/// One batch's inputs as a step reads them: the model inputs (edges padded to the graph's
/// capacity), the packed labels (`Labels::packed`) and the optimiser's step values
/// (`AdamWStep::values`).
pub(super) struct StepInputs {
    pub(super) x: PainnInputs,
    pub(super) labels: Tensor,
    pub(super) values: Tensor,
}

/// A graph's static inputs and its output, the step's loss (f64 \[1\]).
pub(super) struct Buffers {
    structures: usize,
    positions: Var,
    species: Var,
    centers: Var,
    neighbors: Var,
    offsets: Var,
    atom_structure: Var,
    labels: Var,
    values: Var,
    pub(super) loss: Var,
}

impl Buffers {
    /// Buffers holding copies of `inputs`.
    pub(super) fn new(inputs: &StepInputs) -> Result<Self> {
        let var = |x: &Tensor| Var::from_tensor(&x.copy()?);
        let x = &inputs.x;
        Ok(Self {
            structures: x.n_structures,
            positions: var(&x.positions)?,
            species: var(&x.species)?,
            centers: var(&x.centers)?,
            neighbors: var(&x.neighbors)?,
            offsets: var(&x.offsets)?,
            atom_structure: var(&x.atom_structure)?,
            labels: var(&inputs.labels)?,
            values: var(&inputs.values)?,
            loss: Var::zeros(1, DType::F64, x.positions.device())?,
        })
    }

    /// Writes `inputs` (of the captured shape) into the buffers.
    fn load(&self, inputs: &StepInputs) -> Result<()> {
        let x = &inputs.x;
        self.positions.set(&x.positions)?;
        self.species.set(&x.species)?;
        self.centers.set(&x.centers)?;
        self.neighbors.set(&x.neighbors)?;
        self.offsets.set(&x.offsets)?;
        self.atom_structure.set(&x.atom_structure)?;
        self.labels.set(&inputs.labels)?;
        self.values.set(&inputs.values)?;
        Ok(())
    }

    /// The buffers as a step's inputs (tensors sharing their storage).
    pub(super) fn inputs(&self) -> StepInputs {
        StepInputs {
            x: PainnInputs {
                species: self.species.as_tensor().clone(),
                positions: self.positions.as_tensor().clone(),
                centers: self.centers.as_tensor().clone(),
                neighbors: self.neighbors.as_tensor().clone(),
                offsets: self.offsets.as_tensor().clone(),
                atom_structure: self.atom_structure.as_tensor().clone(),
                n_structures: self.structures,
            },
            labels: self.labels.as_tensor().clone(),
            values: self.values.as_tensor().clone(),
        }
    }
}

/// One captured step and its static buffers.
pub(super) struct StepGraph {
    buffers: Buffers,
    graph: Graph,
}

impl StepGraph {
    /// Captures `step` run on `buffers` on `dev` (it runs twice before, for real: the caller
    /// puts back what those runs changed).
    pub(super) fn capture(
        dev: &Device,
        buffers: Buffers,
        step: impl Fn(&Buffers) -> Result<()>,
    ) -> Result<Self> {
        let graph = capture_graph(dev, || step(&buffers))?;
        Ok(Self { buffers, graph })
    }

    /// Whether a batch of `need` runs on this graph.
    pub(super) fn fits(&self, need: Need) -> bool {
        need.atoms <= self.atoms()
            && need.structures == self.structures()
            && need.edges <= self.capacity()
    }

    /// The shape batches are padded to for this graph.
    pub(super) fn padded(&self) -> StepPadding {
        StepPadding {
            atoms: self.atoms(),
            structures: self.structures(),
            capacity: self.capacity(),
        }
    }

    /// The atoms it was captured for (padding included).
    pub(super) fn atoms(&self) -> usize {
        self.buffers.species.dim(0).unwrap_or(0)
    }

    /// The structures it was captured for (the padding one included).
    pub(super) fn structures(&self) -> usize {
        self.buffers.structures
    }

    /// Whether this graph is for `atoms` atoms in `structures` structures (whatever the edges).
    pub(super) fn same_atoms(&self, atoms: usize, structures: usize) -> bool {
        let b = &self.buffers;
        b.species.dim(0).ok() == Some(atoms) && b.structures == structures
    }

    /// The edges its buffers hold (padding included).
    pub(super) fn capacity(&self) -> usize {
        self.buffers.centers.dim(0).unwrap_or(0)
    }

    /// Replays the step on `inputs`; returns its loss (the one read back).
    pub(super) fn run(&self, inputs: &StepInputs) -> Result<f64> {
        self.buffers.load(inputs)?;
        launch(&self.graph)?;
        // The step done before the loss is copied out: a data-parallel step's sums wait for
        // the other ranks, and a copy queued behind them could hold the driver's staging
        // buffers that another rank needs (`collective`).
        let loss = self.buffers.loss.as_tensor();
        loss.device().synchronize()?;
        Ok(loss.get(0)?.to_scalar::<f64>()?)
    }
}
