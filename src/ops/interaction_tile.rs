//! The interaction's tiled CUDA kernels (kernels/interaction_tile.cu) for many edges: the
//! filter formed in the kernel from weights staged in shared memory, several edges at once.
//! Their CPU twins are the untiled kernels' (`interaction`), whose maths they share; the
//! adjoints leave dL/dw as rows, as the filter-rows adjoint does. For lists that hold every
//! edge's reverse (`InteractionInputs::symmetric_edges`) a second adjoint computes each edge's
//! terms on its reverse, so that each atom's sending gradients are sums over its own edges.

#[cfg(feature = "cuda")]
use super::edge_basis::basis_width;
use super::interaction::{adjoint_cpu, forward_cpu, AdjointMode, InteractionInputs, Sizes};
use super::kernel::{kernel_source, Kernel, Real};

/// Edge count from which the filter formed in the kernels runs as the tiled kernels on CUDA
/// (kernels/interaction_tile.cu: a block's weights and a tile's basis in shared memory, the
/// filters of 8 edges formed at once); below it a tile leaves most SMs idle (4,672 edges, 16
/// aspirins, on an H100, a first version of these kernels: 0.74 ms replayed against 0.47
/// untiled). At 541,000 edges the tiled forward takes 0.59 ms a block against 1.46 untiled
/// (BENCHMARKS.md). The model uses filter
/// rows between 8,192 and 100,000 edges (`model::fused`), so by default the tiled kernels run
/// from there. `MLFF_INTERACTION_TILE_FROM` overrides it (for measurements).
pub const TILE_FROM_EDGES: usize = 8192;

/// Threads per block and features per block of the tiled kernels (TILE_F), edges per staged
/// tile (TILE_E) and the transposed basis' row stride (TILE_SB), as in
/// kernels/interaction_tile.cu.
#[cfg(feature = "cuda")]
const TILE_F: usize = 128;
#[cfg(feature = "cuda")]
const TILE_E: usize = 64;
#[cfg(feature = "cuda")]
const TILE_SB: usize = TILE_E + 4;
/// Most blocks a tiled launch takes along the edges (each stages its weights once and walks
/// its share of the tiles).
#[cfg(feature = "cuda")]
const TILE_MAX_BLOCKS: usize = 2048;

/// Largest dL/dw rows [E, 3F] the tiled adjoint writes (bytes); beyond it the untiled adjoint
/// sums dL/d(basis) itself, so that memory stays O(N·F + E·R).
pub const TILE_GRAD_ROWS_MAX_BYTES: usize = 2 << 30;

/// Whether the filter formed in the kernels runs as the tiled forward (`adjoint`: adjoint).
/// CUDA only: the CPU runs the same twins either way, and keeps the untiled adjoint's output
/// (a complete dL/d(basis), no dL/dw rows).
pub(super) fn tiled(z: &Sizes, x: &InteractionInputs, adjoint: bool) -> bool {
    x.state.device().is_cuda()
        && if adjoint {
            adjoint_fits(z, x)
        } else {
            many_edges(z)
        }
}

/// Whether the adjoint takes the symmetric-list kernel (`tile_sym_adj`): a list that says it
/// holds every edge's reverse, where the tiled adjoint would run. On any device, so that the
/// CPU twin gives the same layout of outputs to test it. `MLFF_INTERACTION_SYMMETRIC=0` turns
/// it off (for measurements).
pub(super) fn symmetric(z: &Sizes, x: &InteractionInputs) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on = *ON.get_or_init(|| crate::device::env_usize("MLFF_INTERACTION_SYMMETRIC", 1) != 0);
    on && x.symmetric_edges && adjoint_fits(z, x)
}

/// At least [`TILE_FROM_EDGES`] edges (or `MLFF_INTERACTION_TILE_FROM` when set).
fn many_edges(z: &Sizes) -> bool {
    static FROM: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let from = *FROM
        .get_or_init(|| crate::device::env_usize("MLFF_INTERACTION_TILE_FROM", TILE_FROM_EDGES));
    z.n_edges >= from
}

/// Enough edges for a tiled adjoint, whose dL/dw rows stay within
/// [`TILE_GRAD_ROWS_MAX_BYTES`].
fn adjoint_fits(z: &Sizes, x: &InteractionInputs) -> bool {
    let rows_bytes = z.n_edges * 3 * z.hidden * x.state.dtype().size_in_bytes();
    many_edges(z) && rows_bytes <= TILE_GRAD_ROWS_MAX_BYTES
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

/// The tiled forward and adjoint (filter formed in the kernels; the same CPU twins).
pub(super) struct TileForward(pub(super) Sizes);
/// SYMMETRIC: the adjoint for lists holding every edge's reverse (`tile_sym_adj`), whose CPU
/// twin follows the same edge-by-reverse-edge order.
pub(super) struct TileAdjoint<const SYMMETRIC: bool>(pub(super) Sizes);

impl Kernel for TileForward {
    kernel_source!("interaction_tile_fwd", "interaction_tile");
    fn work(&self) -> usize {
        self.0.n_edges * self.0.hidden
    }
    fn sizes(&self) -> Vec<usize> {
        self.0.list()
    }
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        forward_cpu(self.0, false, x, idx, out)
    }
    #[cfg(feature = "cuda")]
    fn launch_config(
        &self,
        elem_bytes: usize,
    ) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        tile_config(&self.0, elem_bytes, false)
    }
}

impl<const SYMMETRIC: bool> Kernel for TileAdjoint<SYMMETRIC> {
    const NAME: &'static str = if SYMMETRIC {
        "interaction_tile_sym_adj"
    } else {
        "interaction_tile_adj"
    };
    const MODULE: &'static str = "interaction_tile";
    #[cfg(feature = "cuda")]
    const IMAGE: &'static [u8] = super::kernel::kernel_image!("interaction_tile");
    fn work(&self) -> usize {
        self.0.n_edges * self.0.hidden
    }
    /// The untiled adjoint's sizes; its chunks-per-warp argument is unused.
    fn sizes(&self) -> Vec<usize> {
        let mut s = self.0.list();
        s.push(0);
        s
    }
    /// The filter from the weights, dL/dw out as rows.
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        let mode = AdjointMode {
            rows: false,
            grad_rows: true,
            symmetric: SYMMETRIC,
        };
        adjoint_cpu(self.0, mode, x, idx, out)
    }
    #[cfg(feature = "cuda")]
    fn launch_config(
        &self,
        elem_bytes: usize,
    ) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        tile_config(&self.0, elem_bytes, true)
    }
}
