//! The kernels of one build and the arguments one of them runs with.

use candle_core::{DType, Tensor};

/// Length of the geometry kernels/neighbors.cu reads: reciprocal rows, wrapping basis rows,
/// cell rows, periodic flags.
pub(super) const GEOMETRY_LEN: usize = 30;

/// The kernels of one build, in order.
#[derive(Clone, Copy, Debug)]
pub(super) enum Step {
    Wrap,
    Count,
    Scan {
        capacity: usize,
    },
    Fill {
        capacity: usize,
    },
    Offsets {
        capacity: usize,
    },
    /// Each atom's bin (binned builds; inputs: positions, bin grid).
    BinOf,
    /// Atoms per bin, of `bins` (input: the atoms' bins).
    BinCount {
        bins: usize,
    },
    /// The atoms in bin order, then the bins' cursors (inputs: bins, their scan).
    BinPlace {
        bins: usize,
    },
    /// [`Count`](Self::Count) over the adjacent bins (inputs: positions, grid, bins, their
    /// scan, the placed atoms).
    CountBinned,
    /// [`Fill`](Self::Fill) over the adjacent bins (the inputs of `CountBinned`, then the
    /// edges' scan).
    FillBinned {
        capacity: usize,
    },
    /// Pruning, to the squared cutoff `cut2`.
    PruneCount {
        cut2: f64,
    },
    PruneFill {
        edges: usize,
        cut2: f64,
    },
}

pub(super) struct StepOp {
    pub(super) step: Step,
    pub(super) atoms: usize,
    pub(super) cut2: f64,
    pub(super) pad: f64,
    pub(super) periodic: bool,
    pub(super) host_geometry: [f64; GEOMETRY_LEN],
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) geometry: Tensor,
    pub(super) inputs: Vec<Tensor>,
    /// [N, 2] u32: each atom's candidate neighbours (a batch of systems); all atoms without.
    pub(super) spans: Option<Tensor>,
    pub(super) shape: candle_core::Shape,
    pub(super) dtype: DType,
}

impl Step {
    pub(super) fn kernel(self) -> &'static str {
        match self {
            Self::Wrap => "nl_wrap",
            Self::Count => "nl_count",
            Self::Scan { .. } => "nl_scan",
            Self::Fill { .. } => "nl_fill",
            Self::Offsets { .. } => "nl_offsets",
            Self::BinOf => "nl_bin_of",
            Self::BinCount { .. } => "nl_bin_count",
            Self::BinPlace { .. } => "nl_bin_place",
            Self::CountBinned => "nl_count_binned",
            Self::FillBinned { .. } => "nl_fill_binned",
            Self::PruneCount { .. } => "nl_within_count",
            Self::PruneFill { .. } => "nl_within_fill",
        }
    }
}
