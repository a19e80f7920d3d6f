//! A whole fused training step as a CUDA graph: the weights' fused form, the pass at x, the
//! loss, the displaced copies, the weight gradients, AdamW, the EMA and the write-back into the
//! variables, replayed with one launch. A step is then its uploads into the graph's static
//! inputs (the table of frames it takes where the frames are held on the device, `resident`;
//! else the batch the host assembled), the launch and one read of the loss, instead of a few
//! hundred launches, each with its allocation.
//!
//! A graph is captured for a number of atoms and structures and an edge capacity; shorter edge
//! lists are padded with edges beyond the cutoff (`graph::pad_edges`: zero basis, zero
//! filter, zero weight gradient), smaller batches with isolated atoms in one more structure
//! whose labels and seeds are zero (`labels`). Up to [`MAX_GRAPHS`] are kept; a batch that
//! fits none of them runs op by op. The values that change from step to step
//! (learning rate, bias corrections, EMA decay) are a device input of the optimiser kernel.
//! What the step is, the trainer says (`fused_step`); this holds the buffers and the graph.

use crate::error::{Error, Result};
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

/// What a step is given: a batch assembled on the host, or, where the frames are held on the
/// device (`resident`), the table that picks them (u32) and the step values.
pub(super) enum StepSource {
    Batch(StepInputs),
    Picks { table: Tensor, values: Tensor },
}

/// A graph's static inputs (those of its [`StepSource`]) and its output, the step's loss
/// (f64 \[1\]).
pub(super) struct Buffers {
    statics: Statics,
    pub(super) loss: Var,
}

enum Statics {
    /// The batch's tensors in the order of [`batch_parts`], and its structure count.
    Batch {
        structures: usize,
        vars: Vec<Var>,
    },
    Picks {
        table: Var,
        values: Var,
    },
}

/// A batch's tensors in one order: positions, species, centers, neighbors, offsets,
/// atom_structure, labels, values.
fn batch_parts(inputs: &StepInputs) -> [&Tensor; 8] {
    let x = &inputs.x;
    [
        &x.positions,
        &x.species,
        &x.centers,
        &x.neighbors,
        &x.offsets,
        &x.atom_structure,
        &inputs.labels,
        &inputs.values,
    ]
}

impl Buffers {
    /// Buffers holding copies of `source`.
    pub(super) fn new(source: &StepSource) -> Result<Self> {
        let var = |x: &Tensor| Var::from_tensor(&x.copy()?);
        let (statics, dev) = match source {
            StepSource::Batch(inputs) => {
                let vars = batch_parts(inputs).map(var);
                let statics = Statics::Batch {
                    structures: inputs.x.n_structures,
                    vars: vars.into_iter().collect::<candle_core::Result<_>>()?,
                };
                (statics, inputs.x.positions.device())
            }
            StepSource::Picks { table, values } => {
                let statics = Statics::Picks {
                    table: var(table)?,
                    values: var(values)?,
                };
                (statics, table.device())
            }
        };
        Ok(Self {
            statics,
            loss: Var::zeros(1, DType::F64, dev)?,
        })
    }

    /// Writes `source` (of the captured kind and shape) into the buffers.
    fn load(&self, source: &StepSource) -> Result<()> {
        match (&self.statics, source) {
            (Statics::Batch { vars, .. }, StepSource::Batch(inputs)) => {
                for (var, t) in vars.iter().zip(batch_parts(inputs)) {
                    var.set(t)?;
                }
            }
            (
                Statics::Picks { table, values },
                StepSource::Picks {
                    table: t,
                    values: v,
                },
            ) => {
                table.set(t)?;
                values.set(v)?;
            }
            _ => {
                return Err(Error::Train(
                    "a step given a batch where its graph picks frames, or the other way".into(),
                ))
            }
        }
        Ok(())
    }

    /// The buffers as a step's source (tensors sharing their storage).
    pub(super) fn source(&self) -> StepSource {
        let t = |v: &Var| v.as_tensor().clone();
        match &self.statics {
            Statics::Batch { structures, vars } => {
                let v = |k: usize| t(&vars[k]);
                StepSource::Batch(StepInputs {
                    x: PainnInputs {
                        positions: v(0),
                        species: v(1),
                        centers: v(2),
                        neighbors: v(3),
                        offsets: v(4),
                        atom_structure: v(5),
                        n_structures: *structures,
                    },
                    labels: v(6),
                    values: v(7),
                })
            }
            Statics::Picks { table, values } => StepSource::Picks {
                table: t(table),
                values: t(values),
            },
        }
    }
}

/// One captured step, the shape it runs and its static buffers.
pub(super) struct StepGraph {
    buffers: Buffers,
    padded: StepPadding,
    graph: Graph,
}

impl StepGraph {
    /// Captures `step` run on `buffers` for batches padded to `padded` on `dev` (it runs
    /// twice before, for real: the caller puts back what those runs changed).
    pub(super) fn capture(
        dev: &Device,
        buffers: Buffers,
        padded: StepPadding,
        step: impl Fn(&Buffers) -> Result<()>,
    ) -> Result<Self> {
        let graph = capture_graph(dev, || step(&buffers))?;
        Ok(Self {
            buffers,
            padded,
            graph,
        })
    }

    /// Whether a batch of `need` runs on this graph.
    pub(super) fn fits(&self, need: Need) -> bool {
        need.atoms <= self.atoms()
            && need.structures == self.structures()
            && need.edges <= self.padded.capacity
    }

    /// The shape batches are padded to for this graph.
    pub(super) fn padded(&self) -> StepPadding {
        self.padded
    }

    /// The atoms it was captured for (padding included).
    pub(super) fn atoms(&self) -> usize {
        self.padded.atoms
    }

    /// The structures it was captured for (the padding one included).
    pub(super) fn structures(&self) -> usize {
        self.padded.structures
    }

    /// Whether this graph is for `atoms` atoms in `structures` structures (whatever the edges).
    pub(super) fn same_atoms(&self, atoms: usize, structures: usize) -> bool {
        self.atoms() == atoms && self.structures() == structures
    }

    /// Replays the step on `source`; returns its loss (the one read back).
    pub(super) fn run(&self, source: &StepSource) -> Result<f64> {
        self.buffers.load(source)?;
        launch(&self.graph)?;
        // The step done before the loss is copied out: a data-parallel step's sums wait for
        // the other ranks, and a copy queued behind them could hold the driver's staging
        // buffers that another rank needs (`collective`).
        let loss = self.buffers.loss.as_tensor();
        loss.device().synchronize()?;
        Ok(loss.get(0)?.to_scalar::<f64>()?)
    }
}
