//! The phase-marking vocabulary that calculators and MD force providers report their calls in
//! ([`Phase`], [`PhaseClock`], [`NoClock`]). A leaf module, apart from the profiler that reads
//! the marks, so that the code being timed does not depend on the code timing it (the profiler
//! wraps calculators and force providers; they only mark phases).

use crate::error::Result;
use serde::{Deserialize, Serialize};

/// The components of a call or step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Neighbour list on the host (for MD: the skin check and any rebuild).
    NeighborList,
    /// Host → device copies of the inputs.
    Upload,
    /// Model forward pass (energies).
    Forward,
    /// Backward pass (forces).
    Backward,
    /// Device → host copies of the results.
    Download,
    /// MD: the integrator, logging and output between force calls.
    Integrate,
    /// A calculator that reports no finer phases.
    Call,
    /// Training: a batch (and its displaced copies) assembled on the host.
    Batch,
    /// Training: gradient flattening and clipping, the AdamW update and the EMA.
    Optimizer,
    /// Training: a step captured as a CUDA graph (its first run).
    Capture,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Self::NeighborList => "neighbor_list",
            Self::Upload => "upload",
            Self::Forward => "forward",
            Self::Backward => "backward",
            Self::Download => "download",
            Self::Integrate => "integrate",
            Self::Call => "call",
            Self::Batch => "batch",
            Self::Optimizer => "optimizer",
            Self::Capture => "capture",
        }
    }
}

/// Receives phase boundaries from a calculator.
pub trait PhaseClock {
    /// Marks the start of `phase`, ending the phase before it.
    fn mark(&mut self, phase: Phase) -> Result<()>;
}

/// A clock that records nothing (unprofiled calls).
pub struct NoClock;

impl PhaseClock for NoClock {
    fn mark(&mut self, _: Phase) -> Result<()> {
        Ok(())
    }
}
