//! The one place that picks how a fused energy+forces call runs: [`plan`] turns a [`Tuning`],
//! the model's shape, the system's size and the device into a [`Plan`]. The fused model
//! follows it (`model::FusedPainn`), and `mlff bench` / `mlff profile` record it beside the
//! tuning. Results do not depend on the plan (every path gives the same energies and forces to
//! rounding), only speed and memory.
//!
//! Three ways a call can run, tried in this order:
//! - **atom split**: one launch, the atoms split over the thread blocks (`ops::atom_split`);
//! - **feature split**: one launch, the features split over the thread blocks
//!   (`ops::feature_split`);
//! - **layers**: a kernel per layer and an explicit adjoint, whose choices (dense layers,
//!   filter, update, first block) are a [`LayerPlan`].

pub use crate::ops::ModelShape;
use crate::ops::{
    dense_on_tensor_cores, dense_tc_fits, tiles_on_tensor_cores, AtomSplitPlan, FeatureSplitPlan,
    DENSE_MAX_WIDTH, ELEMENT_SUMS_MAX_ELEMENTS, TILE_GRAD_ROWS_MAX_BYTES, UPDATE_TC_FEATURES,
};
use crate::tuning::Tuning;
use candle_core::{DType, Device, Result};
use serde::Serialize;

/// Largest filter-rows buffer made (bytes); beyond it the kernels form the filter themselves,
/// so that very large systems keep the O(N·F + E·R) memory of that path.
pub const FILTER_ROWS_MAX_BYTES: usize = 2 << 30;

/// Atoms and edges of one call (all structures of a batch together).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SystemSize {
    pub atoms: usize,
    pub edges: usize,
}

/// Where the forces of a call are computed and in what precision, beside the tuning.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    pub device: &'a Device,
    pub dtype: DType,
    /// Run the CUDA paths' CPU twins on the CPU (dense kernels and tensor-core layers), so
    /// that tests can check them there; never set outside tests.
    pub cpu_twins: bool,
}

/// How a call runs.
#[derive(Clone, Debug)]
pub enum Plan {
    /// One launch, the atoms split over the thread blocks.
    AtomSplit(AtomSplitPlan),
    /// One launch, the features split over the thread blocks.
    FeatureSplit(FeatureSplitPlan),
    /// A kernel per layer and the explicit adjoint.
    Layers(LayerPlan),
}

/// How the dense layers of a pass run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DensePath {
    /// Our row-block kernels (kernels/layers/dense.cu), for molecule-sized inputs.
    Small,
    /// Tensor cores (kernels/layers/dense_tc.cu), an MLP in one launch; layers whose shapes the
    /// kernels do not take run as `Matmul`.
    TensorCores,
    /// candle's matmul (cuBLAS on CUDA) and the bias+SiLU kernels.
    Matmul,
}

/// Where each block's filter W(r) comes from in the per-layer path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FilterSource {
    /// Formed per edge inside the interaction kernels from the weights (tiled on CUDA from
    /// the tiles' threshold).
    InKernel,
    /// Rows [E, 3F] from one matrix product per block; `kept`: kept from the forward for the
    /// adjoint rather than made again.
    Rows { kept: bool },
}

/// The choices of a per-layer call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct LayerPlan {
    /// The first block as sums per sending element (else per edge).
    pub first_block_sums: bool,
    /// Dense layers of one row per atom (φ, context, readout).
    pub dense_atoms: DensePath,
    /// The mixing layer (three rows per atom), and its adjoint on tensor cores with the add
    /// folded in.
    pub dense_vectors: DensePath,
    pub mix_adjoint_tensor_cores: bool,
    /// Each update block as one launch each way.
    pub update_one_launch: bool,
    pub filter: FilterSource,
    /// The interaction runs as the tiled kernels (CUDA), and their adjoint as the
    /// symmetric-list kernel.
    pub tiled: bool,
}

impl LayerPlan {
    /// The plan with cuBLAS where it took the tensor-core layers: those read weights packed on
    /// the host once per model, which a model whose weights change every call (training)
    /// would pay on every call.
    pub fn without_packed_weights(mut self) -> Self {
        for path in [&mut self.dense_atoms, &mut self.dense_vectors] {
            if *path == DensePath::TensorCores {
                *path = DensePath::Matmul;
            }
        }
        self.mix_adjoint_tensor_cores = false;
        self.update_one_launch = false;
        self
    }

    /// The plan of a pass whose weights' gradients follow ([`without_packed_weights`]
    /// (Self::without_packed_weights), the first block per edge, untiled). On CUDA the filter
    /// is formed in the kernel, whose adjoint sums dL/dW over the edges itself; on the CPU the
    /// rows the plan picked stay, and dL/dW is one product of the basis with dL/d(rows) instead
    /// of an [R + 1, 3F] update per edge.
    pub fn for_weight_gradients(self, cuda: bool) -> Self {
        let mut plan = self.without_packed_weights();
        plan.first_block_sums = false;
        plan.tiled = false;
        if cuda {
            plan.filter = FilterSource::InKernel;
        }
        plan
    }
}

impl Plan {
    /// A short name: `atom_split`, `feature_split` or `layers`.
    pub fn name(&self) -> &'static str {
        match self {
            Self::AtomSplit(_) => "atom_split",
            Self::FeatureSplit(_) => "feature_split",
            Self::Layers(_) => "layers",
        }
    }

    /// The plan as JSON, for reports.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Self::AtomSplit(p) => serde_json::json!({
                "path": self.name(),
                "atoms_per_block": p.atoms_per_block(),
                "blocks": p.blocks(),
            }),
            Self::FeatureSplit(p) => serde_json::json!({
                "path": self.name(),
                "blocks": p.groups(),
                "edges_resident": p.edges_resident(),
            }),
            Self::Layers(l) => {
                let mut v = serde_json::to_value(l).unwrap_or_default();
                if let Some(m) = v.as_object_mut() {
                    m.insert("path".into(), self.name().into());
                }
                v
            }
        }
    }
}

/// The path a call of `size` takes for a model of `shape` on `target` under `tuning`.
pub fn plan(tuning: &Tuning, shape: &ModelShape, size: SystemSize, target: Target) -> Result<Plan> {
    if let Some(p) = atom_split(tuning, shape, size, target) {
        return Ok(Plan::AtomSplit(p));
    }
    if let Some(p) = feature_split(tuning, shape, size, target) {
        return Ok(Plan::FeatureSplit(p));
    }
    Ok(Plan::Layers(layers(tuning, shape, size, target)))
}

/// The atom-split launch, where it applies: CUDA, within the tuning's atom range, and where
/// the kernel fits (at most two atoms a block on this device).
pub fn atom_split(
    tuning: &Tuning,
    shape: &ModelShape,
    size: SystemSize,
    target: Target,
) -> Option<AtomSplitPlan> {
    if !target.device.is_cuda() || !tuning.atom_split_atoms().contains(&size.atoms) {
        return None;
    }
    AtomSplitPlan::fit(*shape, size.atoms, size.edges, target.device, target.dtype).ok()
}

/// The feature-split launch, where it applies: CUDA, up to the tuning's atoms, and where the
/// layer inputs fit shared memory on at most the tuning's blocks. (Also where the edge
/// geometry is formed again chunk by chunk: at 64 blocks that still beats the layers.)
pub fn feature_split(
    tuning: &Tuning,
    shape: &ModelShape,
    size: SystemSize,
    target: Target,
) -> Option<FeatureSplitPlan> {
    if !target.device.is_cuda() || size.atoms > tuning.feature_split_max_atoms {
        return None;
    }
    FeatureSplitPlan::new(*shape, size.atoms, size.edges)
        .ok()?
        .fit_widest(target.device, target.dtype, tuning.feature_split_max_blocks)
        .ok()
}

/// The per-layer choices for `size`.
pub fn layers(tuning: &Tuning, shape: &ModelShape, size: SystemSize, target: Target) -> LayerPlan {
    let cuda = target.device.is_cuda();
    let f = shape.hidden;
    let dense_atoms = dense_path(tuning, f, size.atoms, target);
    let dense_vectors = dense_path(tuning, f, 3 * size.atoms, target);
    let tensor_cores_possible = match cuda {
        true => dense_on_tensor_cores(target.dtype),
        false => target.cpu_twins,
    };
    // Where the layers take cuBLAS above the tensor cores' rows, the mixing adjoint still
    // runs there, its add folded in.
    let mix_adjoint_tensor_cores = dense_tc_fits(2 * f, f)
        && match dense_vectors {
            DensePath::TensorCores => true,
            DensePath::Matmul => {
                cuda && tensor_cores_possible
                    && 3 * size.atoms > tuning.dense_tensor_cores_until_rows
            }
            DensePath::Small => false,
        };
    let update_shapes = [(2 * f, f), (f, 3 * f), (3 * f, f), (f, 2 * f)];
    let update_one_launch = dense_atoms == DensePath::TensorCores
        && (!cuda
            || (f == UPDATE_TC_FEATURES && size.atoms >= tuning.update_one_launch_from_atoms))
        && update_shapes.iter().all(|&(k, j)| dense_tc_fits(k, j));
    let tc_tiles = tiles_on_tensor_cores(target.dtype);
    let bytes_per_block = size.edges * 3 * f * target.dtype.size_in_bytes();
    let tiled = cuda && size.edges >= tuning.tile_from(tc_tiles);
    let rows_on_cuda = !cuda || size.edges < tuning.filter_rows_until(tc_tiles);
    let filter = match size.edges >= tuning.filter_rows_from(cuda)
        && bytes_per_block <= FILTER_ROWS_MAX_BYTES
        && rows_on_cuda
    {
        true => FilterSource::Rows {
            kept: bytes_per_block * shape.blocks <= tuning.filter_rows_keep_bytes,
        },
        false => FilterSource::InKernel,
    };
    LayerPlan {
        first_block_sums: tuning.first_block_sums
            && shape.blocks > 0
            && shape.elements <= ELEMENT_SUMS_MAX_ELEMENTS,
        dense_atoms,
        dense_vectors,
        mix_adjoint_tensor_cores,
        update_one_launch,
        filter,
        tiled: tiled
            && (filter == FilterSource::InKernel)
            && (tc_tiles || bytes_per_block <= TILE_GRAD_ROWS_MAX_BYTES),
    }
}

/// How dense layers of `rows` rows of a model of `hidden` features run on `target` (the
/// widest reduction of the small kernels is the adjoint of a 3F-wide output layer).
pub fn dense_path(tuning: &Tuning, hidden: usize, rows: usize, target: Target) -> DensePath {
    let cuda = target.device.is_cuda();
    let tensor_cores = match cuda {
        true => dense_on_tensor_cores(target.dtype),
        false => target.cpu_twins,
    };
    if tensor_cores && tuning.dense_tensor_core_rows().contains(&rows) {
        DensePath::TensorCores
    } else if (cuda || target.cpu_twins)
        && rows <= tuning.dense_kernel_max_rows
        && 3 * hidden <= DENSE_MAX_WIDTH
    {
        DensePath::Small
    } else {
        DensePath::Matmul
    }
}
