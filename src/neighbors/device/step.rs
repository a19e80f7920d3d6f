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
            Self::PruneCount { .. } => "nl_within_count",
            Self::PruneFill { .. } => "nl_within_fill",
        }
    }
}
