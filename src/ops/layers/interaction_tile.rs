//! The interaction's tiled CUDA kernels (kernels/layers/interaction_tile.cu) for many edges: the
//! filter formed in the kernel from weights staged in shared memory, several edges at once.
//! Their CPU twins are the untiled kernels' (`interaction`), whose maths they share; the
//! adjoints leave dL/dw as rows, as the filter-rows adjoint does. For lists that hold every
//! edge's reverse (`InteractionInputs::symmetric_edges`) a second adjoint computes each edge's
//! terms on its reverse, so that each atom's sending gradients are sums over its own edges.

use crate::ops::launch::{kernel_source, overlaps_previous, Kernel, Real};
use crate::ops::layers::edge_basis::basis_width;
use crate::ops::layers::interaction::{
    adjoint_cpu, forward_cpu, AdjointMode, InteractionInputs, Sizes,
};
use crate::ops::SHIPPED_RBF;
use candle_core::{DType, Tensor};

/// Threads per block and features per block of the tiled kernels (TILE_F), edges per staged
/// tile (TILE_E) and the transposed basis' row stride (TILE_SB), as in
/// kernels/interaction_tile.cu.
const TILE_F: usize = 128;
#[cfg(feature = "cuda")]
const TILE_E: usize = 64;
#[cfg(feature = "cuda")]
const TILE_SB: usize = TILE_E + 4;
/// Most blocks a tiled launch on CUDA cores takes along the edges (each stages its weights once
/// and walks its share of the tiles): four per multiprocessor of an H100 or H200 (132); the
/// tensor-core kernels take [`tensor_core_max_blocks`].
#[cfg(feature = "cuda")]
const TILE_MAX_BLOCKS: usize = 528;
/// Most blocks of a tensor-core tiled launch: the blocks the device holds at once (two per
/// multiprocessor: 128 registers a thread), so that each stages its weights once and no second
/// wave stages them again.
fn tensor_core_max_blocks(device: &candle_core::Device) -> usize {
    if !device.is_cuda() {
        return 264; // not launched: the CPU runs the twins
    }
    let per_device = crate::ops::launch::device_limits(device).map(|(sms, _)| 2 * sms);
    per_device.unwrap_or(264)
}

/// Largest dL/dw rows [E, 3F] the tiled adjoint writes (bytes); beyond it the untiled adjoint
/// sums dL/d(basis) itself, so that memory stays O(N·F + E·R).
pub const TILE_GRAD_ROWS_MAX_BYTES: usize = 2 << 30;

/// Whether the filter formed in the kernels runs as the tiled forward (`adjoint`: adjoint).
/// CUDA only: the CPU runs the same twins either way, and keeps the untiled adjoint's output
/// (a complete dL/d(basis), no dL/dw rows).
pub(crate) fn tiled(z: &Sizes, x: &InteractionInputs, adjoint: bool) -> bool {
    x.state.device().is_cuda()
        && if adjoint {
            adjoint_fits(z, x)
        } else {
            many_edges(z, x)
        }
}

/// Whether the adjoint takes the symmetric-list kernel (`tile_sym_adj`, `tc_sym_adj`): a list
/// that says it holds every edge's reverse, where the tiled adjoint would run (on tensor cores,
/// which write no dL/dw rows, at any size from the tiles' threshold). On any device, so that
/// the CPU twin gives the same layout of outputs to test it.
pub(crate) fn symmetric(z: &Sizes, x: &InteractionInputs) -> bool {
    let no_rows = FilterArithmetic::of(z, x.state.dtype()) == FilterArithmetic::TensorCores;
    x.symmetric_edges && many_edges(z, x) && (no_rows || adjoint_fits(z, x))
}

/// At least [`Tuning::tile_from`] edges for `x`'s precision.
fn many_edges(z: &Sizes, x: &InteractionInputs) -> bool {
    let tensor_cores = tiles_on_tensor_cores(x.state.dtype());
    z.n_edges >= x.tuning.tile_from(tensor_cores)
}

/// Enough edges for a tiled adjoint, whose dL/dw rows stay within
/// [`TILE_GRAD_ROWS_MAX_BYTES`].
fn adjoint_fits(z: &Sizes, x: &InteractionInputs) -> bool {
    let rows_bytes = z.n_edges * 3 * z.hidden * x.state.dtype().size_in_bytes();
    many_edges(z, x) && rows_bytes <= TILE_GRAD_ROWS_MAX_BYTES
}

/// The tiled kernels' launch: (edge tiles, feature chunks) blocks of [`TILE_F`] threads with
/// the staged basis, weights and (adjoint) per-edge sums in shared memory.
#[cfg(feature = "cuda")]
fn tile_config(
    z: &Sizes,
    elem_bytes: usize,
    adjoint: bool,
) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
    let (nb, bw) = (z.n_rbf + 1, basis_width(z.n_rbf));
    let reals = bw * TILE_SB + nb * 3 * TILE_F + if adjoint { TILE_E * 3 } else { 0 };
    candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        grid_dim: (
            z.n_edges.div_ceil(TILE_E).clamp(1, TILE_MAX_BLOCKS) as u32,
            z.hidden.div_ceil(TILE_F) as u32,
            1,
        ),
        block_dim: (TILE_F as u32, 1, 1),
        shared_mem_bytes: (reals * elem_bytes + 2 * TILE_E * 4) as u32,
    }
}

/// How the tiled kernels form their filters on CUDA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FilterArithmetic {
    /// FMAs per thread (`tile_fwd`, `tile_sym_adj`): f64; f32 where the tensor-core kernels'
    /// 32-bit offsets would not hold (4NF or E(R + 4) from 2^32).
    CudaCores,
    /// A tile's filters as one product on tensor cores in split TF32 (`tc_fwd`, `tc_sym_adj`;
    /// kernels/layers/interaction_tc.cuh), f32.
    TensorCores,
    /// Forward only, f32, F = [`TILE_F`]: the tensor-core tiles with each warp's filters kept
    /// in the mma's output fragments, not in shared memory, its gathers 16 bytes wide and its
    /// messages summed per receiving atom by warp shuffles (`frag_fwd`,
    /// kernels/layers/interaction_frag.cuh).
    Fragments,
}

/// Whether the tiled kernels form their filters on tensor cores for `dtype` (f32; systems
/// whose 4NF or E(R + 4) reach 2^32 excepted).
pub fn tiles_on_tensor_cores(dtype: DType) -> bool {
    dtype == DType::F32
}

impl FilterArithmetic {
    fn of(z: &Sizes, dtype: DType) -> Self {
        let fits = |count: usize| count < 1 << 32;
        let offsets_fit = fits(4 * z.n_atoms * z.hidden) && fits(z.n_edges * (z.n_rbf + 4));
        match tiles_on_tensor_cores(dtype) && offsets_fit {
            true => Self::TensorCores,
            false => Self::CudaCores,
        }
    }
}

/// The tiled forward and adjoint (filter formed in the kernels; the same CPU twins).
pub(crate) struct TileForward {
    z: Sizes,
    filters: FilterArithmetic,
    /// Most blocks on tensor cores ([`tensor_core_max_blocks`]).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    tc_blocks: usize,
}

impl TileForward {
    pub(crate) fn new(z: Sizes, state: &Tensor) -> Self {
        let filters = match FilterArithmetic::of(&z, state.dtype()) {
            FilterArithmetic::TensorCores if z.hidden == TILE_F => FilterArithmetic::Fragments,
            other => other,
        };
        let tc_blocks = tensor_core_max_blocks(state.device());
        Self {
            z,
            filters,
            tc_blocks,
        }
    }
}
/// SYMMETRIC: the adjoint for lists holding every edge's reverse (`tile_sym_adj`), whose CPU
/// twin follows the same edge-by-reverse-edge order. On tensor cores (f32, symmetric) it sums
/// dL/d(basis) itself (`tc_sym_adj`) instead of leaving dL/dw as rows.
pub(crate) struct TileAdjoint<const SYMMETRIC: bool> {
    z: Sizes,
    filters: FilterArithmetic,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    tc_blocks: usize,
    /// (SYMMETRIC) x[7], the later blocks' dL/d(basis), is added to g_basis.
    accumulate: bool,
    /// dL/dW [R + 1, 3F] is summed in the kernel instead of dL/dw rows written
    /// ([`reducing_weights`](Self::reducing_weights)).
    reduce: bool,
}

impl<const SYMMETRIC: bool> TileAdjoint<SYMMETRIC> {
    pub(crate) fn new(z: Sizes, state: &Tensor) -> Self {
        let filters = match SYMMETRIC {
            true => FilterArithmetic::of(&z, state.dtype()),
            false => FilterArithmetic::CudaCores,
        };
        let tc_blocks = tensor_core_max_blocks(state.device());
        Self {
            z,
            filters,
            tc_blocks,
            accumulate: false,
            reduce: false,
        }
    }
    /// Sums dL/dW [R + 1, 3F] (each edge's dL/dw times its basis row) in the kernel, on CUDA
    /// cores, instead of writing dL/dw rows [E, 3F]: for the weights' gradient, which needs
    /// nothing else of them.
    pub(crate) fn reducing_weights(self) -> Self {
        Self {
            reduce: true,
            filters: FilterArithmetic::CudaCores,
            ..self
        }
    }
    /// `on`: adds the later blocks' dL/d(basis) to g_basis. The symmetric kernels take it as
    /// their last input either way (any tensor, not read, where `on` is false).
    pub(crate) fn accumulating(self, on: bool) -> Self {
        Self {
            accumulate: on && SYMMETRIC,
            ..self
        }
    }
    /// Whether the output ends with dL/dw rows [E, 3F] (g_basis then holding only its
    /// unit-vector columns) rather than a complete g_basis.
    pub(crate) fn grad_rows(&self) -> bool {
        self.filters == FilterArithmetic::CudaCores && !self.reduce
    }
}

impl Kernel for TileForward {
    overlaps_previous!();
    kernel_source!("interaction_tile_fwd", "interaction_tile");
    fn function(&self) -> &'static str {
        match self.filters {
            FilterArithmetic::CudaCores => "interaction_tile_cc_fwd",
            FilterArithmetic::TensorCores => match self.z.hidden {
                TILE_F => "interaction_tile_fwd_128",
                64 => ks_entry(&TILE_FWD_64, self.z.n_rbf),
                h if h < 64 => ks_entry(&TILE_FWD_UNDER64, self.z.n_rbf),
                _ => ks_entry(&TILE_FWD, self.z.n_rbf),
            },
            FilterArithmetic::Fragments if self.z.n_rbf == SHIPPED_RBF => "interaction_frag_fwd_20",
            FilterArithmetic::Fragments => ks_entry(&FRAG_FWD, self.z.n_rbf),
        }
    }
    fn work(&self) -> usize {
        self.z.n_edges * self.z.hidden
    }
    fn sizes(&self) -> Vec<usize> {
        self.z.list()
    }
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        forward_cpu(self.z, false, x, idx, out)
    }
    #[cfg(feature = "cuda")]
    fn launch_config(
        &self,
        elem_bytes: usize,
    ) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        match self.filters {
            FilterArithmetic::CudaCores => tile_config(&self.z, elem_bytes, false),
            FilterArithmetic::TensorCores => tensor_core_config(&self.z, self.tc_blocks, false),
            FilterArithmetic::Fragments => tensor_core_config(&self.z, self.tc_blocks, true),
        }
    }
}

/// Threads per block of the tensor-core kernels (TC_THREADS in
/// kernels/layers/interaction_tc_shape.cuh).
#[cfg(feature = "cuda")]
const TC_THREADS: usize = 256;

/// Features per block of the tensor-core kernels (their chunk, CW): 64 for models of at most
/// 64 features, which would otherwise form 128 features' filters per edge (half of them of zero
/// weights, and an F = 64 model at 10,000 atoms slower than the F = 128 one:
/// docs/bench-log/38-other-shapes.md), else [`TILE_F`].
#[cfg(feature = "cuda")]
fn tc_chunk(hidden: usize) -> usize {
    if hidden <= 64 {
        64
    } else {
        TILE_F
    }
}

/// Edges per tile of the tensor-core kernels for chunks of `chunk` features (TcShape::E): the
/// 8 warps are chunk / 32 across the features and the rest across the edges, 16 each.
#[cfg(feature = "cuda")]
fn tc_edges(chunk: usize) -> usize {
    TC_THREADS / 32 / (chunk / 32) * 16
}

/// The basis rows the tensor-core products take: R + 1 rounded up to the mma's k steps of 8.
fn tc_k_rows(n_rbf: usize) -> usize {
    (n_rbf + 1).div_ceil(8) * 8
}

/// The tensor-core kernels' row stride of the staged basis and weights (`tc_stride`): the
/// basis width and [`tc_k_rows`] at least, rounded to an odd multiple of 8, or to 32 (swizzled:
/// [`tc_swizzled`]) where that would be 40.
fn tc_stride(n_rbf: usize) -> usize {
    let rows = basis_width(n_rbf).max(tc_k_rows(n_rbf));
    let s = rows.div_ceil(8) * 8;
    if (s / 8) % 2 == 1 || s == 32 {
        s
    } else {
        s + 8
    }
}

/// Whether the tensor-core kernels stage at stride 32 with swizzled rows (their "_sw" entries,
/// SWZ in kernels/layers/interaction_tc.cuh): more than 24 basis rows or columns (21-28 radial
/// functions), where the odd multiple of 8 would be 40 and the adjoint would fit one block a
/// multiprocessor instead of two.
fn tc_swizzled(n_rbf: usize) -> bool {
    tc_stride(n_rbf) == 32
}

/// A family of tensor-core entries, one per reachable (swizzle, k steps) pair
/// (TC_KS_FAMILY in kernels/layers/interaction_tc_kernels.cuh): "_k1" to "_k3" unswizzled, "_sw_k3" and
/// "_sw_k4" at stride 32.
type KsFamily = [&'static str; 5];

macro_rules! ks_family {
    ($stem:literal) => {
        [
            concat!($stem, "_k1"),
            concat!($stem, "_k2"),
            concat!($stem, "_k3"),
            concat!($stem, "_sw_k3"),
            concat!($stem, "_sw_k4"),
        ]
    };
}

/// The entry of `family` for `n_rbf` radial functions: unswizzled strides (8, 24) hold at
/// most 24 basis rows (k steps 1-3), stride 32 more than 24 basis columns (3 or 4).
fn ks_entry(family: &KsFamily, n_rbf: usize) -> &'static str {
    let ks = tc_k_rows(n_rbf) / 8;
    match tc_swizzled(n_rbf) {
        false => family[ks - 1],
        true => family[ks],
    }
}

const FRAG_FWD: KsFamily = ks_family!("interaction_frag_fwd");
const TILE_FWD: KsFamily = ks_family!("interaction_tile_fwd");
const TILE_FWD_64: KsFamily = ks_family!("interaction_tile_fwd_64");
const TILE_FWD_UNDER64: KsFamily = ks_family!("interaction_tile_fwd_under64");
const SYM_ADJ: KsFamily = ks_family!("interaction_tile_sym_adj");
const SYM_ADJ_128: KsFamily = ks_family!("interaction_tile_sym_adj_128");
const SYM_ADJ_64: KsFamily = ks_family!("interaction_tile_sym_adj_64");
const SYM_ADJ_UNDER64: KsFamily = ks_family!("interaction_tile_sym_adj_under64");

/// The tensor-core forward's launch: (edge tiles, feature chunks) blocks of [`TC_THREADS`]
/// threads with the weights, the tile's basis and its filters in shared memory (f32); with
/// `fragments` no filters, and the weights as split f16 in 3 chunk x 32 words
/// (`TcTile<FC, true>::stage_weights_f16`).
#[cfg(feature = "cuda")]
fn tensor_core_config(
    z: &Sizes,
    max_blocks: usize,
    fragments: bool,
) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
    let stride = tc_stride(z.n_rbf);
    let chunk = tc_chunk(z.hidden);
    let edges = tc_edges(chunk);
    // The filters' row stride is TcShape::SF, 3 chunk + 8.
    let filters = match fragments {
        true => 0,
        false => edges * (3 * chunk + 8),
    };
    let weights = 3 * chunk * if fragments { 32 } else { stride };
    let reals = weights + edges * stride + filters;
    candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        grid_dim: (
            z.n_edges.div_ceil(edges).clamp(1, max_blocks) as u32,
            z.hidden.div_ceil(chunk) as u32,
            1,
        ),
        block_dim: (TC_THREADS as u32, 1, 1),
        shared_mem_bytes: (reals * 4 + 2 * edges * 4) as u32,
    }
}

impl<const SYMMETRIC: bool> Kernel for TileAdjoint<SYMMETRIC> {
    overlaps_previous!();
    const NAME: &'static str = if SYMMETRIC {
        "interaction_tile_sym_adj"
    } else {
        "interaction_tile_adj"
    };
    const MODULE: &'static str = "interaction_tile";
    #[cfg(feature = "cuda")]
    const IMAGE: &'static [u8] = crate::ops::launch::kernel_image!("interaction_tile");
    fn function(&self) -> &'static str {
        match (SYMMETRIC, self.filters) {
            (true, FilterArithmetic::CudaCores) => "interaction_tile_cc_sym_adj",
            // Its filters and dL/d(basis) in split f16 (`TcTile<.., HALF>`), the others' in
            // split TF32.
            (true, FilterArithmetic::TensorCores)
                if self.z.hidden == TILE_F && self.z.n_rbf == SHIPPED_RBF =>
            {
                "interaction_tile_sym_adj_128_20"
            }
            (true, FilterArithmetic::TensorCores) => {
                let family = match self.z.hidden {
                    TILE_F => &SYM_ADJ_128,
                    64 => &SYM_ADJ_64,
                    h if h < 64 => &SYM_ADJ_UNDER64,
                    _ => &SYM_ADJ,
                };
                ks_entry(family, self.z.n_rbf)
            }
            _ => Self::NAME,
        }
    }
    fn work(&self) -> usize {
        self.z.n_edges * self.z.hidden
    }
    /// The untiled adjoint's sizes, then (SYMMETRIC) whether g_basis accumulates, else its
    /// chunks-per-warp argument, unused; on CUDA cores then whether dL/dW is summed.
    fn sizes(&self) -> Vec<usize> {
        let mut s = self.z.list();
        s.push(self.accumulate as usize);
        if self.filters == FilterArithmetic::CudaCores {
            s.push(self.reduce as usize);
        }
        s
    }
    /// The filter from the weights, dL/dw out as rows where [`grad_rows`](Self::grad_rows).
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        let mode = AdjointMode {
            rows: false,
            grad_rows: self.grad_rows(),
            grad_weights: self.reduce,
            symmetric: SYMMETRIC,
            accumulate: self.accumulate,
        };
        adjoint_cpu(self.z, mode, x, idx, out)
    }
    #[cfg(feature = "cuda")]
    fn launch_config(
        &self,
        elem_bytes: usize,
    ) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        match self.filters == FilterArithmetic::CudaCores {
            true => {
                let mut cfg = tile_config(&self.z, elem_bytes, true);
                if self.reduce {
                    // Each thread's column of the block's dL/dW [R + 1, 3, TILE_F].
                    cfg.shared_mem_bytes += ((self.z.n_rbf + 1) * 3 * TILE_F * elem_bytes) as u32;
                }
                cfg
            }
            false => {
                // The quarters' unit-vector sums [chunk / 32, E, 3], partial dL/d(basis)
                // [chunk / 32, E, k rows] and the later blocks' rows [E, R + 4] after the
                // forward's layout.
                let mut cfg = tensor_core_config(&self.z, self.tc_blocks, false);
                let chunk = tc_chunk(self.z.hidden);
                let edges = tc_edges(chunk);
                // (Swizzled, the partial sums take the filters' space.)
                let partials = if tc_swizzled(self.z.n_rbf) {
                    0
                } else {
                    tc_k_rows(self.z.n_rbf)
                };
                let sums = chunk / 32 * edges * (3 + partials);
                let prev = edges * basis_width(self.z.n_rbf);
                cfg.shared_mem_bytes += (4 * (sums + prev)) as u32;
                cfg
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every basis the fused kernels take maps to an entry whose k steps hold its R + 1 rows
    /// exactly rounded up, swizzled exactly where the stride is 32, and the shipped basis to
    /// the unswizzled three k steps.
    #[test]
    fn each_basis_takes_the_entry_of_its_k_steps_and_stride() {
        for n_rbf in 2..=crate::ops::FUSED_MAX_RBF {
            let name = ks_entry(&SYM_ADJ_128, n_rbf);
            let ks = (n_rbf + 1).div_ceil(8);
            assert!(name.ends_with(&format!("_k{ks}")), "{n_rbf}: {name}");
            assert_eq!(
                name.contains("_sw_"),
                tc_stride(n_rbf) == 32,
                "{n_rbf}: {name}"
            );
            assert!([8, 24, 32].contains(&tc_stride(n_rbf)), "{n_rbf}");
        }
        assert_eq!(ks_entry(&FRAG_FWD, SHIPPED_RBF), "interaction_frag_fwd_k3");
    }

    /// The shipped symmetric adjoint (`TcTile<.., HALF>`) stages its weights as split-f16 rows
    /// of 24 halves in the space the launch sizes for 3 chunk x stride f32 words, and reads
    /// basis rows up to 24: the shipped basis must keep stride 24 and at most 24 rows.
    #[test]
    fn the_shipped_basis_fits_the_split_f16_adjoint() {
        assert_eq!(tc_stride(SHIPPED_RBF), 24);
        assert!(tc_k_rows(SHIPPED_RBF) <= 24);
    }
}
