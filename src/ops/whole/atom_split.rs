//! The whole fused PaiNN energy + forces of a feature split as one kernel with its atoms split
//! over the thread blocks (kernels/whole/atom_split.cu): each block owns up to [`MAX_ATOMS`] atoms,
//! computes every feature of them and streams every weight once per pass through a ring of
//! shared-memory stages loaded ahead of the arithmetic (kernels/include/weight_stream.cuh), so the
//! only barriers among the blocks are where PaiNN mixes atoms (4 for three interaction blocks,
//! against 30 in `ops::feature_split`, which splits the features). The forward reads the
//! weights output-major (a second buffer packed like the first, every matrix transposed:
//! [`AtomSplitPlan`] takes both), the adjoint input-major. The CPU path is the one-kernel CPU
//! twin. The plan takes it for the sizes where it is the fastest path
//! (`Tuning::atom_split_min_atoms`).

use crate::ops::launch::{barrier_counters, device_limits};
use crate::ops::launch::{kernel_source, launch, Init, Kernel, Real};
use crate::ops::whole::cpu_twin::cpu_twin;
use crate::ops::whole::feature_split::check_system;
#[cfg(feature = "profiling")]
use crate::ops::whole::stamps::phase_times;
use crate::ops::whole::stamps::stamp_room;
use crate::ops::ModelShape;
use candle_core::{bail, DType, Device, Result, Tensor};

/// Atoms a thread block owns at most (kernels/whole/atom_split.cu MAX_ATOMS): its dense layers run on
/// CUDA cores, whose arithmetic grows with every atom a block owns.
pub const MAX_ATOMS: usize = 2;
/// Feature counts the kernel is compiled for (kernels/whole/atom_split.cu ATOM_SPLIT_FEATURES):
/// each is a separate function whose loops the compiler lays out for it. Other models take the
/// feature-split one kernel.
pub const FEATURES: [usize; 2] = [32, 128];
/// Atoms of a system at most: the kernel's own-edge list keeps a neighbour's index in 27 bits
/// (kernels/whole/atom_split.cu LOCAL_BIT).
pub const MAX_SYSTEM_ATOMS: usize = 1 << 27;
/// Threads per block (the kernel's THREADS).
const THREADS: usize = 512;
/// Own edges whose geometry is formed at once (the kernel's CHUNK).
const CHUNK: usize = 64;
/// Own edges (receiver in the block's atoms) listed at once: a block lists them once per call
/// unless it owns more than this less [`THREADS`] (the kernel adds a round of THREADS edges
/// only while it surely fits), else it lists them again in every pass.
pub const OWN_EDGES: usize = 1024;
/// Weight-stream stages (kernels/include/weight_stream.cuh STAGES) and the bytes a stage holds
/// at most: one stage loads while the other is used. Two of 64 KB beat four of 32 KB (and three
/// of ~42 KB) at aspirin size (docs/bench-log/21-atom-split-second.md): the time per chunk grows
/// with its bytes, so fewer, larger chunks spend less on each one's fixed cost.
const STAGES: usize = 2;
const STAGE_BYTES: usize = 64 * 1024;
/// Bytes of one entry of the kernel's weight-stream table (pointer, rows, columns), and of its
/// two barriers per stage.
const LAYER_BYTES: usize = 16;
const STAGE_BARRIER_BYTES: usize = 16;
/// Per-edge basis gradient columns a warp reduces at once (kernels/include/common.cuh MAX_BASIS).
const MAX_BASIS: usize = 32;

/// Sizes of one atom-split launch.
#[derive(Clone, Copy, Debug)]
pub struct AtomSplitPlan {
    n: usize,
    e: usize,
    /// Atoms per block, and blocks.
    per_block: usize,
    grid: usize,
    model: ModelShape,
    /// Bytes of a real, values per weight-stream stage, own edges listed at once, and whether
    /// each atom's tape is kept in shared memory (else in the scratch).
    elem_bytes: usize,
    stage: usize,
    own_edges: usize,
    tape_shared: bool,
}

impl AtomSplitPlan {
    /// The launch for `n` atoms and `e` edges with `per_block` atoms per thread block in
    /// `elem_bytes`-byte reals within `shared_limit` bytes of shared memory per block, or why
    /// there is none (F one of `FEATURES`, at most 28 radial functions, every matrix of the
    /// packed weights 16-byte aligned for bulk copies, a weight-stream stage of at least one 3F
    /// row). The tape stays in shared memory where the stages still get their most bytes (else
    /// it goes to the scratch: a pass of the weights runs slower through smaller stages,
    /// docs/bench-log/22-atom-split-tensor-cores.md).
    pub fn new(
        model: ModelShape,
        n: usize,
        e: usize,
        per_block: usize,
        elem_bytes: usize,
        shared_limit: usize,
    ) -> std::result::Result<Self, String> {
        let (f, r) = (model.hidden, model.n_rbf);
        if !FEATURES.contains(&f) {
            return Err(format!(
                "{f} features: the atom-split kernel is compiled for {FEATURES:?}"
            ));
        }
        if r + 4 > MAX_BASIS {
            return Err(format!("{r} radial functions: at most {}", MAX_BASIS - 4));
        }
        // The embedding and atom constants come first; the matrices after start at multiples
        // of 4 values from there.
        if !(model.elements * (f + 1) * elem_bytes).is_multiple_of(16) {
            return Err(format!(
                "{} elements: the packed weights' matrices are not 16-byte aligned for the \
                 atom-split kernel's bulk copies",
                model.elements
            ));
        }
        if n == 0 || model.blocks == 0 {
            return Err("no atoms or no interaction blocks".into());
        }
        if n > MAX_SYSTEM_ATOMS {
            return Err(format!(
                "{n} atoms: the atom-split kernel takes at most {MAX_SYSTEM_ATOMS}"
            ));
        }
        if per_block == 0 || per_block > MAX_ATOMS {
            return Err(format!(
                "{per_block} atoms per block: from 1 to {MAX_ATOMS}"
            ));
        }
        let plan = Self {
            n,
            e,
            per_block,
            grid: n.div_ceil(per_block),
            model,
            elem_bytes,
            stage: 0,
            own_edges: OWN_EDGES,
            tape_shared: true,
        };
        plan.with_stages(shared_limit)
    }

    /// The plan with the stage size and tape place that fit `shared_limit` (see [`Self::new`]).
    fn with_stages(mut self, shared_limit: usize) -> std::result::Result<Self, String> {
        let elem_bytes = self.elem_bytes;
        let most = STAGE_BYTES / elem_bytes;
        let least = 3 * self.model.hidden;
        let stage_fitting = |plan: &Self| {
            let free = shared_limit.saturating_sub(plan.fixed_bytes());
            (free / (STAGES * elem_bytes)).min(most) / 4 * 4
        };
        self.tape_shared = true;
        self.stage = stage_fitting(&self);
        if self.stage < most {
            self.tape_shared = false;
            self.stage = stage_fitting(&self);
        }
        if self.stage < least {
            return Err(format!(
                "{} atoms per block leave {} values of shared memory per weight-stream stage, \
                 less than one {least}-value row (device limit {shared_limit} bytes)",
                self.per_block, self.stage
            ));
        }
        Ok(self)
    }

    /// The launch with the fewest atoms per block whose blocks the device holds at once, with
    /// their shared memory within its limit; or why there is none.
    pub fn fit(
        model: ModelShape,
        n: usize,
        e: usize,
        device: &Device,
        dtype: DType,
    ) -> std::result::Result<Self, String> {
        let (sms, limit) = device_limits(device)?;
        let per_block = n.div_ceil(sms.max(1)).max(1);
        Self::new(model, n, e, per_block, dtype.size_in_bytes(), limit)
    }

    /// The plan listing at most `own_edges` own edges at once (at least `THREADS`): fewer
    /// than a block owns makes it list them again in every pass (for tests of that path).
    pub fn with_own_edges(
        mut self,
        own_edges: usize,
        shared_limit: usize,
    ) -> std::result::Result<Self, String> {
        self.own_edges = own_edges.max(THREADS);
        self.with_stages(shared_limit)
    }

    /// Whether `device` holds the launch: every block at once (a cooperative launch), each
    /// with its shared memory; or why not.
    pub fn fits_device(&self, device: &Device) -> std::result::Result<(), String> {
        let (sms, limit) = device_limits(device)?;
        if self.grid > sms {
            return Err(format!(
                "{} thread blocks of {} atoms: the device holds {sms} at once",
                self.grid, self.per_block
            ));
        }
        if self.shared_bytes() > limit {
            return Err(format!(
                "{} bytes of shared memory per block: the device allows {limit}",
                self.shared_bytes()
            ));
        }
        Ok(())
    }

    /// Atoms per thread block.
    pub fn atoms_per_block(&self) -> usize {
        self.per_block
    }

    /// Thread blocks of the launch.
    pub fn blocks(&self) -> usize {
        self.grid
    }

    /// Values per weight-stream stage.
    pub fn stage_values(&self) -> usize {
        self.stage
    }

    /// Whether each atom's tape is kept in shared memory (else in the scratch).
    pub fn tape_in_shared_memory(&self) -> bool {
        self.tape_shared
    }

    /// Shared memory per block (the kernel's layout): the weight-stream stages, then the rest
    /// (`Self::fixed_bytes`).
    pub fn shared_bytes(&self) -> usize {
        STAGES * self.stage * self.elem_bytes + self.fixed_bytes()
    }

    /// Shared memory besides the stages: features (their gradients in the same place) and
    /// dense inputs/outputs (16 A F), the filter, a chunk of edge geometry and
    /// gradients, the biases, the tape where kept, the weight-stream table and barriers, the
    /// own-edge lists and warp counts.
    fn fixed_bytes(&self) -> usize {
        let (f, r, a, b) = (
            self.model.hidden,
            self.model.n_rbf,
            self.per_block,
            self.model.blocks,
        );
        let tape = if self.tape_shared { b * a * 12 * f } else { 0 };
        let reals = 16 * a * f + (r + 1) * 3 * f + CHUNK * (2 * r + 9) + b * 8 * f + f + tape;
        reals * self.elem_bytes
            + (12 * b - 2) * LAYER_BYTES
            + STAGES * STAGE_BARRIER_BYTES
            + (2 * self.own_edges + THREADS / 32) * 4
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
    /// Record phase times (CUDA): block 0 stamps the clock between phases.
    stamps: bool,
}

impl Kernel for AtomSplit {
    kernel_source!("atom_split", "atom_split");
    fn function(&self) -> &'static str {
        // `atom_split_{F}x{atoms per block at most}` for F in FEATURES.
        match (self.plan.model.hidden, self.plan.per_block) {
            (32, 1) => "atom_split_32x1",
            (32, _) => "atom_split_32x2",
            (_, 1) => "atom_split_128x1",
            _ => "atom_split_128x2",
        }
    }
    fn work(&self) -> usize {
        self.plan.n
    }
    fn sizes(&self) -> Vec<usize> {
        let (p, m) = (&self.plan, &self.plan.model);
        vec![
            p.n,
            p.e,
            m.n_rbf,
            m.blocks,
            m.elements,
            p.stage,
            p.own_edges,
            p.tape_shared as usize,
            self.stamps as usize,
            p.per_block,
        ]
    }
    fn reals(&self) -> Vec<f64> {
        vec![self.plan.model.cutoff]
    }
    #[cfg(feature = "cuda")]
    fn launch_config(&self, _: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        crate::ops::launch::cooperative_grid(self.plan.grid, THREADS, self.plan.shared_bytes())
    }
    #[cfg(feature = "cuda")]
    fn cooperative(&self) -> bool {
        true
    }
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        cpu_twin(&self.plan.model, x, idx, out);
    }
}

/// Per-atom energies \[N\] and forces [N, 3] of one flattened system by the atom-split kernel:
/// `weights` packed as [`ModelShape::packed_len`] describes and `weights_out_major` the
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
    let n = plan.n;
    let index = [species, centers, neighbors];
    let inputs = [weights, weights_out_major, positions, offsets];
    let out = run(plan, inputs, index, false)?;
    let forces = out.narrow(0, 0, 3 * n)?.reshape((n, 3))?;
    let energies = out.narrow(0, 3 * n, n)?;
    Ok((energies, forces))
}

fn run(
    plan: &AtomSplitPlan,
    inputs: [&Tensor; 4],
    index: [&Tensor; 3],
    stamps: bool,
) -> Result<Tensor> {
    let [weights, weights_out_major, positions, offsets] = inputs;
    let (n, e) = (plan.n, plan.e);
    check_system(&plan.model, n, e, weights, positions.dims(), offsets, index)?;
    if positions.dtype().size_in_bytes() != plan.elem_bytes {
        bail!(
            "atom split: a plan for {}-byte reals launched with {:?} positions",
            plan.elem_bytes,
            positions.dtype()
        )
    }
    if weights_out_major.dims() != weights.dims() {
        bail!(
            "atom split: output-major weights {:?}, expected {:?}",
            weights_out_major.dims(),
            weights.dims()
        )
    }
    if positions.device().is_cuda() {
        plan.fits_device(positions.device())
            .map_err(|why| candle_core::Error::Msg(format!("atom split: {why}")))?;
    }
    let counters = barrier_counters(positions.device())?;
    let [species, centers, neighbors] = index;
    launch(
        AtomSplit {
            plan: *plan,
            stamps,
        },
        &[positions, offsets, weights, weights_out_major],
        &[species, centers, neighbors, &counters],
        plan.out_len() + if stamps { stamp_room() } else { 0 },
        // The kernel zeroes what its blocks add into before they do.
        Init::Uninit,
    )
}

/// Each phase's name and microseconds as block 0 of an atom-split launch saw them (the GPU's
/// global timer): where a call spends its time. CUDA only; inputs as for [`atom_split`].
#[cfg(feature = "profiling")]
pub fn atom_split_phase_times(
    plan: &AtomSplitPlan,
    [weights, weights_out_major]: [&Tensor; 2],
    [positions, offsets]: [&Tensor; 2],
    index: [&Tensor; 3],
) -> Result<Vec<(String, f64)>> {
    if !positions.device().is_cuda() {
        bail!("atom split: phase times are measured on CUDA devices")
    }
    let inputs = [weights, weights_out_major, positions, offsets];
    let out = run(plan, inputs, index, true)?;
    phase_times(&out, plan.out_len(), phase_names(plan.model.blocks))
}

/// What the kernel does between block 0's stamps, in order.
#[cfg(feature = "profiling")]
fn phase_names(blocks: usize) -> Vec<String> {
    let mut names = Vec::new();
    for b in 0..blocks {
        names.push(match b {
            0 => "initial state, own edges; block 0: filter".to_string(),
            _ => format!("block {b}: filter, φ layers, barrier"),
        });
        names.push(format!("block {b}: interaction"));
        names.push(format!("block {b}: update"));
    }
    names.push("readout and its gradient".into());
    for b in (0..blocks).rev() {
        names.push(format!("block {b} adjoint: filter, update"));
        names.push(format!("block {b} adjoint: interaction"));
        if b > 0 {
            names.push(format!("block {b} adjoint: barrier, φ layers"));
        }
    }
    names.push("forces".into());
    names
}
