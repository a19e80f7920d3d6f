//! Edge ops: row gather and row scatter-add, with CPU and CUDA implementations.
//!
//! Every gather/scatter of the model goes through here. candle's CUDA `index_add` loops over
//! the indices serially (measured far slower than an atomic scatter once there are thousands of
//! edges: the whole call against stock candle in docs/bench-log/01-first-timing-table.md), so
//! the CUDA path uses our own kernels (kernels/edges/gather.cu, kernels/edges/scatter_add.cu).
//! Each op's backward is the other op applied as a differentiable custom op, so gradients of
//! gradients (training on forces) work.
//!
//! `model::Backend::Stock` runs the same maths through candle's `index_select`/`index_add`,
//! as the baseline that benchmarks compare against.
//!
//! The fused kernels (`edge_basis`, `interaction`, `update`, `update_tc`, `activation`,
//! `dense_tc`, launched through [`kernel`]) are the forward and adjoint pieces of
//! `model::FusedPainn`, the inference path of `model::Backend::Fused`; each has a CPU twin
//! that is its test oracle.

pub(crate) mod edges;
mod frames;
mod integrator;
pub mod launch;
pub(crate) mod layers;
mod optimizer;
pub(crate) mod whole;

/// The shipped models' shapes (128 features, 20 basis functions), for which the kernels have
/// entries of their own (compile-time strides and unrolled loops: TC_RBF in
/// kernels/layers/interaction_tc_shape.cuh, the `feature_split_128x*` entries); any other shape takes the
/// generic entries.
pub(crate) const SHIPPED_HIDDEN: usize = 128;
pub(crate) const SHIPPED_RBF: usize = 20;

pub use edges::gather::{gather, initial_state, Gather};
pub use edges::partition::{partition_edges, EdgeClasses, PARTITION_MAX_CLASSES};
pub use edges::scatter_add::{scatter_add, ScatterAdd};
pub use frames::{gather_frames, FrameTensors, GatherShape};
pub use integrator::{
    md_advance, md_advance_into, md_displacement2, md_displacement2_into, md_finish_into, md_kick,
    LangevinNoise,
};
pub use layers::activation::{bias_silu, bias_silu_adjoint};
pub use layers::dense::{dense, dense_silu, dense_silu_adjoint, DENSE_MAX_WIDTH};
pub use layers::dense_tc::{
    dense_on_tensor_cores, dense_tc, dense_tc_adding, dense_tc_fits, mlp_tc, mlp_tc_adjoint,
    readout_tc, tc_weights, TcWeights, DENSE_TC_MAX_WIDTH,
};
pub use layers::edge_basis::{basis_width, edge_basis, edge_basis_adjoint};
pub use layers::element_sums::{
    element_sums, element_sums_position_adjoint, ELEMENT_SUMS_MAX_ELEMENTS,
};
pub use layers::interaction::{
    interaction, interaction_adjoint, interaction_weight_adjoint, EdgeFilter, InteractionGrads,
    InteractionInputs, FUSED_MAX_RBF,
};
pub use layers::interaction_tile::{tiles_on_tensor_cores, TILE_GRAD_ROWS_MAX_BYTES};
pub use layers::message::{message, Message};
pub use layers::update::{
    act_grad, update_combine, update_combine_adjoint, update_context, update_context_adjoint,
    StateGrad, NORM_EPS,
};
pub use layers::update_tc::{update_tc, update_tc_adjoint, UpdateOutputs, UPDATE_TC_FEATURES};
pub use optimizer::{adamw_ema, AdamWStep};
#[cfg(feature = "profiling")]
pub use whole::atom_split::atom_split_phase_times;
pub use whole::atom_split::{
    atom_split, AtomSplitPlan, MAX_ATOMS as ATOM_SPLIT_MAX_ATOMS_PER_BLOCK,
};
#[cfg(feature = "profiling")]
pub use whole::feature_split::feature_split_phase_times;
pub use whole::feature_split::{feature_split, FeatureSplitPlan, GROUPS};
pub use whole::md_step::{feature_split_step, MdStepInputs, MdStepOutputs};
pub use whole::packed::ModelShape;
