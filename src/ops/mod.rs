//! Edge ops: row gather and row scatter-add, with CPU and CUDA implementations.
//!
//! Every gather/scatter of the model goes through here. candle's CUDA `index_add` loops over
//! the indices serially (measured 345-930x slower than an atomic scatter at 20k-200k edges), so
//! the CUDA path uses our own kernels (kernels/gather.cu, kernels/scatter_add.cu). Each op's
//! backward is the other op applied as a differentiable custom op, so gradients of gradients
//! (training on forces) work.
//!
//! [`EdgeOps::Stock`] runs the same maths through candle's `index_select`/`index_add`, as the
//! baseline that benchmarks compare against.
//!
//! The fused kernels (`edge_basis`, `interaction`, `update`, `update_tc`, `activation`, `dense_tc`,
//! launched through [`kernel`]) are the forward and adjoint pieces of `model::FusedPainn`, the inference path of
//! [`EdgeOps::Fused`]; each has a CPU twin that is its test oracle.

mod activation;
mod atom_split;
mod dense;
mod dense_tc;
mod edge_basis;
mod element_sums;
mod gather;
mod integrator;
mod interaction;
mod interaction_tile;
pub mod kernel;
mod message;
#[cfg(feature = "cuda")]
mod overlap;
#[cfg(feature = "cuda")]
pub use overlap::set_enabled as set_overlapping_launches;
mod rows;
mod scatter_add;
mod small_system;
mod small_system_step;
mod update;
mod update_tc;

/// The shipped models' shapes (128 features, 20 basis functions), for which the kernels have
/// entries of their own (compile-time strides and unrolled loops: TC_RBF in
/// kernels/interaction_tc.cuh, the `small_system_128x*` entries); any other shape takes the
/// generic entries.
pub(crate) const SHIPPED_HIDDEN: usize = 128;
pub(crate) const SHIPPED_RBF: usize = 20;

pub use activation::{bias_silu, bias_silu_adjoint};
pub use atom_split::{
    atom_split, atom_split_phase_times, AtomSplitPlan, MAX_ATOMS as ATOM_SPLIT_MAX_ATOMS_PER_BLOCK,
    MAX_ATOMS_CUDA_CORES as ATOM_SPLIT_MAX_ATOMS_CUDA_CORES,
};
pub use dense::{dense, dense_silu, dense_silu_adjoint, DENSE_MAX_WIDTH};
pub use dense_tc::{
    dense_on_tensor_cores, dense_tc, dense_tc_adding, dense_tc_fits, mlp_tc, mlp_tc_adjoint,
    readout_tc, tc_weights, TcWeights, DENSE_TC_MAX_WIDTH,
};
pub use edge_basis::{basis_width, edge_basis, edge_basis_adjoint};
pub use element_sums::{element_sums, element_sums_position_adjoint, ELEMENT_SUMS_MAX_ELEMENTS};
pub use gather::{gather, initial_state, Gather};
pub use integrator::{md_advance, md_displacement2, md_kick, LangevinNoise};
pub use interaction::{
    interaction, interaction_adjoint, interaction_receiver_sums, EdgeFilter, InteractionGrads,
    InteractionInputs, FUSED_MAX_RBF,
};
pub use interaction_tile::{
    tiles_on_tensor_cores, TILE_FROM_EDGES, TILE_GRAD_ROWS_MAX_BYTES, TILE_TC_FROM_EDGES,
};
pub use message::{message, Message};
pub use scatter_add::{scatter_add, ScatterAdd};
pub use small_system::{
    small_system, small_system_phase_times, SmallSystemModel, SmallSystemPlan, GROUPS,
};
pub use small_system_step::{small_system_step, MdStepInputs, MdStepOutputs};
pub use update::{
    act_grad, update_combine, update_combine_adjoint, update_context, update_context_adjoint,
    StateGrad, NORM_EPS,
};
pub use update_tc::{update_tc, update_tc_adjoint, UpdateOutputs, UPDATE_TC_FEATURES};

use candle_core::{Result, Tensor};

/// Which implementation the model uses for its gathers and scatters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EdgeOps {
    /// Our custom ops (parallel atomic scatter on CUDA).
    #[default]
    Custom,
    /// candle's `index_select` / `index_add` (serial scatter on CUDA).
    Stock,
    /// Fused kernels: energies and forces by `model::FusedPainn`'s explicit adjoint
    /// (inference). The model's autograd graph, which training differentiates, then uses the
    /// differentiable fused message op ([`message`]).
    Fused,
}

impl EdgeOps {
    /// `out[e, ...] = x[idx[e], ...]` along dimension 0; `idx` is u32.
    pub fn gather(self, x: &Tensor, idx: &Tensor) -> Result<Tensor> {
        match self {
            Self::Custom | Self::Fused => gather(x, idx),
            Self::Stock => x.contiguous()?.index_select(idx, 0),
        }
    }

    /// `out[idx[e], ...] += src[e, ...]` into `n` zero rows; `idx` is u32.
    pub fn scatter_add(self, src: &Tensor, idx: &Tensor, n: usize) -> Result<Tensor> {
        match self {
            Self::Custom | Self::Fused => scatter_add(src, idx, n),
            Self::Stock => {
                let mut dims = src.dims().to_vec();
                dims[0] = n;
                // candle's index_add needs a contiguous source.
                Tensor::zeros(dims, src.dtype(), src.device())?.index_add(
                    idx,
                    &src.contiguous()?,
                    0,
                )
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Custom => "custom",
            Self::Stock => "stock",
            Self::Fused => "fused",
        }
    }
}

impl std::str::FromStr for EdgeOps {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "custom" | "ours" => Ok(Self::Custom),
            "stock" => Ok(Self::Stock),
            "fused" => Ok(Self::Fused),
            _ => Err(format!(
                "unknown ops `{s}` (expected custom, stock or fused)"
            )),
        }
    }
}
