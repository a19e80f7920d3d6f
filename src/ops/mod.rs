//! Edge ops: row gather and row scatter-add, with CPU and CUDA implementations.
//!
//! Every gather/scatter of the model goes through here. candle's CUDA `index_add` loops over
//! the indices serially (measured 345-930x slower than an atomic scatter at 20k-200k edges), so
//! the CUDA path uses our own kernels (kernels/gather.cu, kernels/scatter_add.cu). Each op's
//! backward is the other op applied as a differentiable custom op, so gradients of gradients
//! (training on forces) work.
//!
//! `model::Backend::Stock` runs the same maths through candle's `index_select`/`index_add`,
//! as the baseline that benchmarks compare against.
//!
//! The fused kernels (`edge_basis`, `interaction`, `update`, `update_tc`, `activation`,
//! `dense_tc`, launched through [`kernel`]) are the forward and adjoint pieces of
//! `model::FusedPainn`, the inference path of `model::Backend::Fused`; each has a CPU twin
//! that is its test oracle.

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
#[cfg(feature = "profiling")]
pub use atom_split::atom_split_phase_times;
pub use atom_split::{atom_split, AtomSplitPlan, MAX_ATOMS as ATOM_SPLIT_MAX_ATOMS_PER_BLOCK};
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
    interaction, interaction_adjoint, EdgeFilter, InteractionGrads, InteractionInputs,
    FUSED_MAX_RBF,
};
pub use interaction_tile::{tiles_on_tensor_cores, TILE_GRAD_ROWS_MAX_BYTES};
pub use message::{message, Message};
pub use scatter_add::{scatter_add, ScatterAdd};
#[cfg(feature = "profiling")]
pub use small_system::small_system_phase_times;
pub use small_system::{small_system, SmallSystemModel, SmallSystemPlan, GROUPS};
pub use small_system_step::{small_system_step, MdStepInputs, MdStepOutputs};
pub use update::{
    act_grad, update_combine, update_combine_adjoint, update_context, update_context_adjoint,
    StateGrad, NORM_EPS,
};
pub use update_tc::{update_tc, update_tc_adjoint, UpdateOutputs, UPDATE_TC_FEATURES};
