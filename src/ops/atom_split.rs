//! The whole fused PaiNN energy + forces of a small system as one kernel with its atoms split
//! over the thread blocks (kernels/atom_split.cu): each block owns up to [`MAX_ATOMS`] atoms,
//! computes every feature of them and streams every weight once per pass, so the only barriers
//! among the blocks are where PaiNN mixes atoms (4 for three interaction blocks, against 30 in
//! `ops::small_system`, which splits the features). The forward reads the weights output-major
//! (a second buffer packed like the first, every matrix transposed: [`AtomSplitPlan`] takes
//! both), the adjoint input-major. The CPU path is the one-kernel CPU twin. The model takes
//! it only when asked (`FusedPainn::with_atom_split_up_to`): this first version is slower than
//! the feature split (BENCHMARKS.md, "Atoms split over the blocks").

use super::kernel::{kernel_source, launch, Init, Kernel, Real};
use super::small_system::{barrier_counters, check_system, cpu_twin, device_limits};
use super::SmallSystemModel;
use candle_core::{bail, DType, Device, Result, Tensor};

/// Atoms a thread block owns at most (kernels/atom_split.cu MAX_ATOMS).
pub const MAX_ATOMS: usize = 2;
/// Threads per block (the kernel's THREADS).
const THREADS: usize = 512;
/// Edges scanned at once for a block's own, and own edges whose geometry is formed at once
/// (the kernel's WINDOW and CHUNK).
const WINDOW: usize = 2048;
const CHUNK: usize = 128;
/// Per-edge basis gradient columns a warp reduces at once (kernels/common.cuh MAX_BASIS).
const MAX_BASIS: usize = 32;

/// Sizes of one atom-split launch.
#[derive(Clone, Copy, Debug)]
pub struct AtomSplitPlan {
    n: usize,
    e: usize,
    /// Atoms per block, and blocks.
    per_block: usize,
    grid: usize,
    model: SmallSystemModel,
}

impl AtomSplitPlan {
    /// The launch for `n` atoms and `e` edges with `per_block` atoms per thread block, or why
    /// the model does not fit the kernel (F a multiple of 32 up to 512, at most 28 radial
    /// functions).
    pub fn new(
        model: SmallSystemModel,
        n: usize,
        e: usize,
        per_block: usize,
    ) -> std::result::Result<Self, String> {
        let (f, r) = (model.hidden, model.n_rbf);
        if f == 0 || !f.is_multiple_of(32) || f > THREADS {
            return Err(format!(
                "{f} features: the atom-split kernel needs a multiple of 32 up to {THREADS}"
            ));
        }
        if r + 4 > MAX_BASIS {
            return Err(format!("{r} radial functions: at most {}", MAX_BASIS - 4));
        }
        if n == 0 || model.blocks == 0 {
            return Err("no atoms or no interaction blocks".into());
        }
        if per_block == 0 || per_block > MAX_ATOMS {
            return Err(format!(
                "{per_block} atoms per block: from 1 to {MAX_ATOMS}"
            ));
        }
        Ok(Self {
            n,
            e,
            per_block,
            grid: n.div_ceil(per_block),
            model,
        })
    }

    /// The launch with the fewest atoms per block whose blocks the device holds at once, with
    /// their shared memory within its limit; or why there is none.
    pub fn fit(
        model: SmallSystemModel,
        n: usize,
        e: usize,
        device: &Device,
        dtype: DType,
    ) -> std::result::Result<Self, String> {
        let (sms, limit) = device_limits(device)?;
        let plan = Self::new(model, n, e, n.div_ceil(sms.max(1)).max(1))?;
        let bytes = plan.shared_bytes(dtype.size_in_bytes());
        if bytes > limit {
            return Err(format!(
                "{} atoms per block need {bytes} bytes of shared memory, more than the \
                 device's {limit}",
                plan.per_block
            ));
        }
        Ok(plan)
    }

    /// Atoms per thread block.
    pub fn atoms_per_block(&self) -> usize {
        self.per_block
    }

    /// Thread blocks of the launch.
    pub fn blocks(&self) -> usize {
        self.grid
    }

    /// Shared memory per block (the kernel's layout): features, their gradients and dense
    /// inputs/outputs (20 A F), the interaction's partial sums, the filter, a chunk of edge
    /// geometry and gradients, edge ids and warp counts.
    pub fn shared_bytes(&self, elem_bytes: usize) -> usize {
        let (f, r, a) = (self.model.hidden, self.model.n_rbf, self.per_block);
        let groups = THREADS / f;
        let reals = 20 * a * f + groups * 4 * a * f + (r + 1) * 3 * f + CHUNK * (2 * r + 9);
        reals * elem_bytes + (WINDOW + THREADS / 32) * 4
    }

    /// Output length: forces, energies, then the scratch (φ, v, the senders' gradients of
    /// interactions 1.., every atom's tape, each edge's basis gradient).
    fn out_len(&self) -> usize {
        let (n, f, b, r) = (
            self.n,
            self.model.hidden,
            self.model.blocks,
            self.model.n_rbf,
        );
        4 * n + 4 * (b - 1) * n * 3 * f + b * n * 12 * f + self.e * (r + 4)
    }
}

struct AtomSplit {
    plan: AtomSplitPlan,
}

impl Kernel for AtomSplit {
    kernel_source!("atom_split", "atom_split");
    fn work(&self) -> usize {
        self.plan.n
    }
    fn sizes(&self) -> Vec<usize> {
        let (p, m) = (&self.plan, &self.plan.model);
        vec![
            p.n,
            p.e,
            m.hidden,
            m.n_rbf,
            m.blocks,
            m.elements,
            p.per_block,
        ]
    }
    fn reals(&self) -> Vec<f64> {
        vec![self.plan.model.cutoff]
    }
    #[cfg(feature = "cuda")]
    fn launch_config(&self, b: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        candle_core::cuda_backend::cudarc::driver::LaunchConfig {
            grid_dim: (self.plan.grid as u32, 1, 1),
            block_dim: (THREADS as u32, 1, 1),
            shared_mem_bytes: self.plan.shared_bytes(b) as u32,
        }
    }
    #[cfg(feature = "cuda")]
    fn cooperative(&self) -> bool {
        true
    }
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        cpu_twin(&self.plan.model, x, idx, out);
    }
}

/// Per-atom energies [N] and forces [N, 3] of one flattened system by the atom-split kernel:
/// `weights` packed as [`SmallSystemModel::packed_len`] describes and `weights_out_major` the
/// same with every matrix transposed; u32 `species`, `centers`, `neighbors`; `offsets` [E, 3].
#[allow(clippy::too_many_arguments)]
pub fn atom_split(
    plan: &AtomSplitPlan,
    weights: &Tensor,
    weights_out_major: &Tensor,
    positions: &Tensor,
    offsets: &Tensor,
    species: &Tensor,
    centers: &Tensor,
    neighbors: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let (n, e) = (plan.n, plan.e);
    let index = [species, centers, neighbors];
    check_system(&plan.model, n, e, weights, positions.dims(), offsets, index)?;
    if weights_out_major.dims() != weights.dims() {
        bail!(
            "atom split: output-major weights {:?}, expected {:?}",
            weights_out_major.dims(),
            weights.dims()
        )
    }
    let counters = barrier_counters(positions.device())?;
    let out = launch(
        AtomSplit { plan: *plan },
        &[positions, offsets, weights, weights_out_major],
        &[species, centers, neighbors, &counters],
        plan.out_len(),
        // The kernel zeroes what its blocks add into before they do.
        Init::Uninit,
    )?;
    let forces = out.narrow(0, 0, 3 * n)?.reshape((n, 3))?;
    let energies = out.narrow(0, 3 * n, n)?;
    Ok((energies, forces))
}
