//! The whole fused PaiNN energy + forces of a small system as one kernel
//! (kernels/small_system.cu): on CUDA, G thread blocks launched together each own F / G of the
//! features and run the forward and the explicit adjoint of `model::fused` as 10 phases per interaction block with a
//! barrier among them, instead of ~75 kernels. `model::fused` takes it for eager calls of
//! molecules whose layer inputs fit in shared memory (`SmallSystemPlan::fit_widest`; the edge
//! geometry stays there whole or is formed again chunk by chunk, `edges_resident`), with G = 64
//! where the device allows; CUDA graphs and larger systems use the separate kernels. The CPU twin is the same maths as plain loops over the same packed
//! weights.

use super::edge_basis::{basis_width, Geometry};
use super::kernel::{kernel_source, launch, Init, Kernel, Real};
use super::update::NORM_EPS;
use super::{SHIPPED_HIDDEN, SHIPPED_RBF};
use candle_core::{bail, DType, Device, Result, Tensor};

/// The model sizes packed weights describe (layout: [`SmallSystemModel::packed_len`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SmallSystemModel {
    pub hidden: usize,
    pub n_rbf: usize,
    pub blocks: usize,
    pub elements: usize,
    pub cutoff: f64,
}

/// Offsets within one block's packed weights (BlockWeights in the .cu file): matrices are
/// input-major [in, out].
struct BlockOffsets {
    filter: usize,
    w1: usize,
    b1: usize,
    w2: usize,
    b2: usize,
    mix: usize,
    c1: usize,
    cb1: usize,
    c2: usize,
    cb2: usize,
    len: usize,
}

impl BlockOffsets {
    fn new(f: usize, r: usize) -> Self {
        let filter = 0;
        let w1 = filter + (r + 1) * 3 * f;
        let b1 = w1 + f * f;
        let w2 = b1 + f;
        let b2 = w2 + 3 * f * f;
        let mix = b2 + 3 * f;
        let c1 = mix + 2 * f * f;
        let cb1 = c1 + 2 * f * f;
        let c2 = cb1 + f;
        let cb2 = c2 + 3 * f * f;
        Self {
            filter,
            w1,
            b1,
            w2,
            b2,
            mix,
            c1,
            cb1,
            c2,
            cb2,
            len: cb2 + 3 * f,
        }
    }
}

impl SmallSystemModel {
    /// Packed order: embedding [elements, F], per-element energy constants \[elements\], readout
    /// hidden layer [F, F/2] and bias [F/2], readout output weights times the scale [F/2], then
    /// per block: filter [R + 1, 3F] (bias last), φ [F, F] + \[F\], [F, 3F] + \[3F\], W_mix
    /// [F, 2F], context [2F, F] + \[F\], [F, 3F] + \[3F\]; last the first block's φ of each
    /// element [elements, 3F] (its input is the embedding, so it depends on the element alone).
    pub fn packed_len(&self) -> usize {
        let (f, h2) = (self.hidden, self.hidden / 2);
        self.elements * (f + 1)
            + f * h2
            + 2 * h2
            + self.blocks * self.block().len
            + self.elements * 3 * f
    }

    fn block(&self) -> BlockOffsets {
        BlockOffsets::new(self.hidden, self.n_rbf)
    }
}

/// Edges whose geometry a block keeps in shared memory at once; more are formed chunk by chunk
/// in every interaction.
const EDGES_RESIDENT: usize = 512;
/// Fewest edges per chunk a launch is fitted down to.
const MIN_EDGES_RESIDENT: usize = 32;

/// Values per edge in a chunk of edge geometry: basis and its derivative (R + 1 each), unit
/// vector, distance.
fn edge_row(n_rbf: usize) -> usize {
    2 * n_rbf + 6
}

/// Thread blocks a plan splits a system over unless told otherwise
/// ([`SmallSystemPlan::with_groups`]; each owns F / groups features).
pub const GROUPS: usize = 16;
/// Threads per block (the kernel's __launch_bounds__): 16 warps per multiprocessor to hide the
/// latency of its loads.
#[cfg(feature = "cuda")]
const THREADS: usize = 512;

/// Sizes of one launch for `n` atoms and `e` edges.
#[derive(Clone, Copy, Debug)]
pub struct SmallSystemPlan {
    n: usize,
    e: usize,
    groups: usize,
    /// Shared-memory staging area (elements): the widest layer input.
    xs_len: usize,
    /// Edges whose geometry shared memory holds at once (all of them: formed once per call).
    eb_edges: usize,
    model: SmallSystemModel,
}

impl SmallSystemPlan {
    /// The launch for `n` atoms and `e` edges, or why the model or system does not fit it:
    /// F must split into [`GROUPS`] slices of a power of two ≤ 32 features.
    pub fn new(model: SmallSystemModel, n: usize, e: usize) -> std::result::Result<Self, String> {
        let f = model.hidden;
        if !f.is_multiple_of(8) {
            return Err(format!(
                "{f} features: the kernel stages layer inputs 4 at a time, which needs a \
                 multiple of 8"
            ));
        }
        if n == 0 {
            return Err("no atoms".into());
        }
        if model.blocks == 0 {
            return Err("no interaction blocks".into());
        }
        let pad = |rows: usize| rows.div_ceil(4) * 4;
        let xs_len = (pad(3 * n) * (f + 1))
            .max(pad(n) * (3 * f + 1))
            .next_multiple_of(4);
        let plan = Self {
            n,
            e,
            groups: GROUPS,
            xs_len,
            eb_edges: e.clamp(1, EDGES_RESIDENT),
            model,
        };
        plan.with_groups(GROUPS)
    }

    /// Shared memory per thread block for elements of `elem_bytes`: staging area (layer
    /// inputs), weight columns and biases, filter columns, own-feature rows (φ, v, [U | V], the
    /// context activations, |V| and pre-activations of every block; s, dE/ds, dE/dv) and
    /// accumulators, energies, per-edge gradients, a chunk of edge geometry and its atoms (the
    /// kernel's layout).
    pub fn shared_bytes(&self, elem_bytes: usize) -> usize {
        let (f, r) = (self.model.hidden, self.model.n_rbf);
        let s = f / self.groups;
        let own_rows = 17 * self.model.blocks + 11;
        // The filter columns start at a multiple of 4 elements and hold 4 per feature.
        let weights = (3 * f * s + 3 * s).next_multiple_of(4);
        let reals = self.xs_len + weights + 4 * s * (r + 1) + own_rows * self.n * s + self.n;
        let edges = 4 * self.e + self.eb_edges * edge_row(r);
        // Last the positions of an MD step ([`super::small_system_step`]), [N, 3].
        (reals + edges + 3 * self.n) * elem_bytes + 2 * self.eb_edges * 4
    }

    /// Output length: forces, energies and edge gradients, then the scratch the kernel's adjoint
    /// reads (the phase stamps start at the next even element).
    pub(super) fn out_len(&self) -> usize {
        let (n, f, b) = (self.n, self.model.hidden, self.model.blocks);
        let nf = n * f;
        let scratch =
            b * nf + (b - 1) * nf + b * (4 + 1 + 1) * nf + n * f / 2 + (3 + 1 + 6 + 3 + 1) * nf;
        self.summed_len() + scratch
    }

    /// The same launch split over `groups` thread blocks (F / groups features each, a power of
    /// two from 1 to 32) instead of [`GROUPS`].
    pub fn with_groups(mut self, groups: usize) -> std::result::Result<Self, String> {
        let f = self.model.hidden;
        let s = f / groups.max(1);
        if groups == 0 || !f.is_multiple_of(groups) || !s.is_power_of_two() || s > 32 {
            return Err(format!(
                "{f} features do not split into {groups} slices of a power of two ≤ 32"
            ));
        }
        self.groups = groups;
        Ok(self)
    }

    /// Output elements the blocks add into (zeroed by the kernel): forces, energies and the
    /// per-edge gradients.
    fn summed_len(&self) -> usize {
        4 * self.n + 4 * self.e
    }

    /// [`fit`](Self::fit) with the most thread blocks, at most `most`, that the device and the
    /// feature split allow (halving from `most`), or why none fits.
    pub fn fit_widest(
        self,
        device: &Device,
        dtype: DType,
        most: usize,
    ) -> std::result::Result<Self, String> {
        let mut groups = most.min(self.model.hidden).max(1);
        if !groups.is_power_of_two() {
            groups = groups.next_power_of_two() / 2;
        }
        loop {
            let fitted = self.with_groups(groups).and_then(|p| p.fit(device, dtype));
            match fitted {
                Err(_) if groups > 1 => groups /= 2,
                done => return done,
            }
        }
    }

    /// Thread blocks of the launch.
    pub fn groups(&self) -> usize {
        self.groups
    }

    /// Whether every edge's geometry stays in shared memory for the whole call (formed once),
    /// rather than being formed again chunk by chunk in each interaction.
    pub fn edges_resident(&self) -> bool {
        self.eb_edges >= self.e
    }

    /// This launch fitted to `device` with `dtype`: its blocks all resident at once, and their
    /// shared memory within the device's opt-in limit, holding fewer edges' geometry at a time
    /// where all of them do not fit; or why it cannot run there.
    pub fn fit(mut self, device: &Device, dtype: DType) -> std::result::Result<Self, String> {
        let (sms, limit) = device_limits(device)?;
        if sms < self.groups {
            return Err(format!(
                "the device has {sms} multiprocessors, fewer than the {} blocks",
                self.groups
            ));
        }
        let bytes = |p: &Self| p.shared_bytes(dtype.size_in_bytes());
        while bytes(&self) > limit && self.eb_edges > MIN_EDGES_RESIDENT {
            self.eb_edges = (self.eb_edges / 2).max(MIN_EDGES_RESIDENT);
        }
        if bytes(&self) > limit {
            return Err(format!(
                "{} atoms need {} bytes of shared memory per block, more than the device's \
                 {limit}",
                self.n,
                bytes(&self)
            ));
        }
        Ok(self)
    }
}

/// The device's multiprocessors and shared memory per block (opt-in limit), asked of the driver
/// once per candle device: plans ask on every eager call.
#[cfg(feature = "cuda")]
pub(super) fn device_limits(device: &Device) -> std::result::Result<(usize, usize), String> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
    use candle_core::cuda_backend::DeviceId;
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static LIMITS: OnceLock<Mutex<HashMap<DeviceId, (usize, usize)>>> = OnceLock::new();
    let Device::Cuda(dev) = device else {
        return Err("the one-kernel path runs on CUDA devices".into());
    };
    let mut known = (LIMITS.get_or_init(Default::default).lock())
        .map_err(|_| "device limits: lock poisoned".to_string())?;
    if let Some(&limits) = known.get(&dev.id()) {
        return Ok(limits);
    }
    let attr = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN;
    let sms = dev
        .cuda_stream()
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| e.to_string())?;
    let limit = (dev.cuda_stream().context().attribute(attr)).map_err(|e| e.to_string())?;
    let limits = (sms as usize, limit as usize);
    known.insert(dev.id(), limits);
    Ok(limits)
}

#[cfg(not(feature = "cuda"))]
pub(super) fn device_limits(_: &Device) -> std::result::Result<(usize, usize), String> {
    Err("the one-kernel path runs on CUDA devices (built without the cuda feature)".into())
}

pub(super) struct SmallSystem {
    pub(super) plan: SmallSystemPlan,
    /// Record phase times (CUDA): block 0 stamps the clock after every barrier.
    pub(super) stamps: bool,
    /// An MD step ([`super::small_system_step`]): whether it is one, and a Langevin one.
    pub(super) step: bool,
    pub(super) langevin: bool,
    /// The step's dt and Langevin c1.
    pub(super) dt: f64,
    pub(super) c1: f64,
}

/// The kernel's f64 MD inputs and output between its float inputs and its index inputs:
/// positions, velocities, forces, half kick, noise, noise scale, reference, then the output.
pub(super) const MD_SLOTS: usize = 8;

/// Room for the phase stamps (8 bytes each) after the scratch.
const STAMP_ELEMENTS: usize = 2 * 64;

impl Kernel for SmallSystem {
    kernel_source!("small_system", "small_system");
    /// The shipped model's shapes (F = 128 in blocks of 8 or 2 features, 20 basis functions)
    /// and F = 64 with 20 basis functions in blocks of one feature (64 blocks, what the model
    /// takes for it) have entries of their own (kernels/small_system.cu); any other takes the
    /// generic one.
    fn function(&self) -> &'static str {
        let m = &self.plan.model;
        let basis = m.n_rbf == SHIPPED_RBF;
        match (m.hidden, m.hidden / self.plan.groups) {
            (SHIPPED_HIDDEN, 8) if basis => "small_system_128x8",
            (SHIPPED_HIDDEN, 2) if basis => "small_system_128x2",
            (64, 1) if basis => "small_system_64x1",
            _ => Self::NAME,
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
            m.hidden,
            m.n_rbf,
            m.blocks,
            p.groups,
            m.elements,
            p.xs_len,
            p.eb_edges,
            self.stamps as usize,
            self.step as usize,
            self.langevin as usize,
        ]
    }
    fn reals(&self) -> Vec<f64> {
        vec![self.plan.model.cutoff, self.dt, self.c1]
    }
    #[cfg(feature = "cuda")]
    fn launch_config(&self, b: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        super::kernel::cooperative_grid(self.plan.groups, THREADS, self.plan.shared_bytes(b))
    }
    #[cfg(feature = "cuda")]
    fn cooperative(&self) -> bool {
        true
    }
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        cpu_twin(&self.plan.model, x, idx, out);
    }
}

/// Per-atom energies \[N\] and forces [N, 3] of one flattened system by the one-kernel path:
/// `weights` packed as [`SmallSystemModel::packed_len`] describes; u32 `species`, `centers`,
/// `neighbors`; `offsets` [E, 3].
pub fn small_system(
    plan: &SmallSystemPlan,
    weights: &Tensor,
    positions: &Tensor,
    offsets: &Tensor,
    species: &Tensor,
    centers: &Tensor,
    neighbors: &Tensor,
) -> Result<(Tensor, Tensor)> {
    check_inputs(
        plan,
        weights,
        positions.dims(),
        offsets,
        [species, centers, neighbors],
    )?;
    let n = plan.n;
    let out = run(
        plan,
        weights,
        [positions, offsets],
        [species, centers, neighbors],
        false,
    )?;
    let forces = out.narrow(0, 0, 3 * n)?.reshape((n, 3))?;
    let energies = out.narrow(0, 3 * n, n)?;
    Ok((energies, forces))
}

/// Checks a launch's inputs against its plan: positions [N, 3] (their `positions` dims),
/// offsets [E, 3], species [N], the packed weights, edges and, on the CPU, species in range.
pub(super) fn check_inputs(
    plan: &SmallSystemPlan,
    weights: &Tensor,
    positions: &[usize],
    offsets: &Tensor,
    index: [&Tensor; 3],
) -> Result<()> {
    check_system(
        &plan.model,
        plan.n,
        plan.e,
        weights,
        positions,
        offsets,
        index,
    )
}

/// [`check_inputs`] for `model`, `n` atoms and `e` edges.
pub(super) fn check_system(
    model: &SmallSystemModel,
    n: usize,
    e: usize,
    weights: &Tensor,
    positions: &[usize],
    offsets: &Tensor,
    [species, centers, neighbors]: [&Tensor; 3],
) -> Result<()> {
    super::kernel::check_edges(centers, neighbors, n, "small system")?;
    if positions != [n, 3] || offsets.dims() != [e, 3] || species.dims() != [n] {
        bail!(
            "small system: positions {:?}, offsets {:?}, species {:?} do not fit {n} atoms and \
             {e} edges",
            positions,
            offsets.dims(),
            species.dims()
        )
    }
    if weights.dims() != [model.packed_len()] {
        bail!(
            "small system: packed weights {:?}, expected [{}]",
            weights.dims(),
            model.packed_len()
        )
    }
    if species.device().is_cpu() {
        let sp = species.to_vec1::<u32>()?;
        if let Some(a) = sp.iter().position(|&z| z as usize >= model.elements) {
            bail!(
                "small system: species[{a}] = {} but the model has {} elements",
                sp[a],
                model.elements
            )
        }
    }
    Ok(())
}

fn run(
    plan: &SmallSystemPlan,
    weights: &Tensor,
    [positions, offsets]: [&Tensor; 2],
    index: [&Tensor; 3],
    stamps: bool,
) -> Result<Tensor> {
    let len = plan.out_len() + if stamps { stamp_room() } else { 0 };
    let counters = barrier_counters(positions.device())?;
    let [species, centers, neighbors] = index;
    // A plain call leaves the MD slots unread: its positions fill them.
    let mut inputs = vec![positions, offsets, weights];
    inputs.extend([positions; MD_SLOTS]);
    launch(
        SmallSystem {
            plan: *plan,
            stamps,
            step: false,
            langevin: false,
            dt: 0.0,
            c1: 0.0,
        },
        &inputs,
        &[species, centers, neighbors, &counters],
        len,
        // The kernel zeroes what its blocks add into, in its first phase.
        Init::Uninit,
    )
}

/// The barrier's two counters (arrivals, finished blocks) of a device: zero between launches,
/// as the last block of each launch leaves them, so no launch waits for a memset. One per
/// candle device, whose launches all queue on its one stream (two at once would share it).
pub(super) fn barrier_counters(device: &Device) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        use candle_core::cuda_backend::DeviceId;
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock};
        static COUNTERS: OnceLock<Mutex<HashMap<DeviceId, Tensor>>> = OnceLock::new();
        let mut map = (COUNTERS.get_or_init(Default::default).lock())
            .map_err(|_| candle_core::Error::Msg("barrier counters: lock poisoned".into()))?;
        if let Some(t) = map.get(&dev.id()) {
            return Ok(t.clone());
        }
        let t = Tensor::zeros(2, DType::U32, device)?;
        map.insert(dev.id(), t.clone());
        return Ok(t);
    }
    // The CPU twin has no barriers.
    Tensor::zeros(2, DType::U32, device)
}

/// Each phase's name and microseconds: from the launch's start to the end of its first phase,
/// then between consecutive barriers, and from the last barrier to the end (as block 0 saw
/// them, by the GPU's global timer): where a one-kernel call spends its time. CUDA only, and
/// only built with the `profiling` feature (which compiles the stamps into the kernels);
/// inputs as for [`small_system`].
#[cfg(feature = "profiling")]
pub fn small_system_phase_times(
    plan: &SmallSystemPlan,
    weights: &Tensor,
    [positions, offsets]: [&Tensor; 2],
    index: [&Tensor; 3],
) -> Result<Vec<(String, f64)>> {
    if !positions.device().is_cuda() {
        bail!("small system: phase times are measured on CUDA devices")
    }
    let out = run(plan, weights, [positions, offsets], index, true)?;
    // A start, one stamp per barrier (5 per block forward but 3 for the first, 1, 5 per block
    // but 3 for the first backward, 1) and an end.
    let names = phase_names(plan.model.blocks);
    phase_times(&out, plan.out_len(), names)
}

/// Output elements a one-kernel launch adds after `out_len` for its phase stamps.
pub(super) const fn stamp_room() -> usize {
    1 + STAMP_ELEMENTS
}

/// The phases `names` with their microseconds, from the stamps (u64 nanoseconds) that a
/// kernel's block 0 wrote after its `out_len` output elements, at the next even element
/// (kernels/grid.cuh Stamps): one stamp more than phases.
#[cfg(feature = "profiling")]
pub(super) fn phase_times(
    out: &Tensor,
    out_len: usize,
    names: Vec<String>,
) -> Result<Vec<(String, f64)>> {
    let at = (out_len + 1) & !1;
    let raw = out.narrow(0, at, STAMP_ELEMENTS.min(out.dim(0)? - at))?;
    let ns: Vec<u64> = match raw.dtype() {
        DType::F32 => (raw.to_vec1::<f32>()?.chunks(2))
            .map(|p| p[0].to_bits() as u64 | (p[1].to_bits() as u64) << 32)
            .collect(),
        _ => (raw.to_vec1::<f64>()?.into_iter())
            .map(f64::to_bits)
            .collect(),
    };
    let stamped = &ns[..(names.len() + 1).min(ns.len())];
    Ok((names.into_iter())
        .zip(
            stamped
                .windows(2)
                .map(|w| (w[1] as f64 - w[0] as f64) / 1e3),
        )
        .collect())
}

/// What the kernel does between consecutive barriers, in order.
#[cfg(feature = "profiling")]
fn phase_names(blocks: usize) -> Vec<String> {
    let mut names = vec!["initial state; block 0: φ of the elements, interaction".to_string()];
    for b in 0..blocks {
        let first = if b == 0 { 2 } else { 0 };
        for what in &[
            "φ hidden layer",
            "φ output layer, interaction",
            "mixing, |V|",
            "context hidden layer",
            "context output layer, gated update",
        ][first..]
        {
            names.push(format!("block {b}: {what}"));
        }
    }
    names.push("readout".into());
    for b in (0..blocks).rev() {
        let first = match b + 1 == blocks {
            true => "readout adjoint, gated update adjoint".to_string(),
            false => format!("block {} φ input adjoint, gated update adjoint", b + 1),
        };
        names.push(format!("block {b}: {first}"));
        names.push(format!("block {b}: context output adjoint"));
        names.push(format!("block {b}: context input adjoint"));
        names.push(format!("block {b}: mixing adjoint, interaction adjoint"));
        if b > 0 {
            names.push(format!("block {b}: φ output adjoint"));
        }
    }
    names.push("forces from the edge gradients, energies".into());
    names
}

/// Forces [N, 3] then energies [N] into `out` by the CPU twin, for float inputs positions,
/// offsets, packed weights (`x`) and species, centers, neighbours (`idx`): the CPU path of
/// every one-kernel op.
pub(super) fn cpu_twin<T: Real>(m: &SmallSystemModel, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
    let n = idx[0].len();
    let (forces, rest) = out.split_at_mut(3 * n);
    let reference = Reference {
        m,
        pos: x[0],
        off: x[1],
        w: x[2],
        species: idx[0],
        centers: idx[1],
        neighbors: idx[2],
    };
    reference.run(forces, &mut rest[..n]);
}

/// The CPU twin: the forward and explicit adjoint of `model::fused`, written out.
struct Reference<'a, T> {
    m: &'a SmallSystemModel,
    pos: &'a [T],
    off: &'a [T],
    w: &'a [T],
    species: &'a [u32],
    centers: &'a [u32],
    neighbors: &'a [u32],
}

/// x [rows, k] · wt [k, m] (+ bias) → [rows, m].
fn linear<T: Real>(x: &[T], k: usize, wt: &[T], m: usize, bias: Option<&[T]>) -> Vec<T> {
    let rows = x.len() / k;
    let mut y = vec![T::zero(); rows * m];
    for r in 0..rows {
        let yr = &mut y[r * m..(r + 1) * m];
        if let Some(b) = bias {
            yr.copy_from_slice(&b[..m]);
        }
        for (i, &xi) in x[r * k..(r + 1) * k].iter().enumerate() {
            for (yo, &wo) in yr.iter_mut().zip(&wt[i * m..(i + 1) * m]) {
                *yo += xi * wo;
            }
        }
    }
    y
}

/// g [rows, m] · wtᵀ for wt [k, m] → [rows, k]: the adjoint of [`linear`].
fn linear_adjoint<T: Real>(g: &[T], m: usize, wt: &[T], k: usize) -> Vec<T> {
    let rows = g.len() / m;
    let mut x = vec![T::zero(); rows * k];
    for r in 0..rows {
        for i in 0..k {
            let w = &wt[i * m..(i + 1) * m];
            x[r * k + i] = g[r * m..(r + 1) * m]
                .iter()
                .zip(w)
                .fold(T::zero(), |a, (&gv, &wv)| a + gv * wv);
        }
    }
    x
}

fn sigmoid<T: Real>(z: T) -> T {
    T::one() / (T::one() + (-z).exp())
}

fn silu<T: Real>(z: T) -> T {
    z * sigmoid(z)
}

fn silu_grad<T: Real>(z: T) -> T {
    let s = sigmoid(z);
    s * (T::one() + z * (T::one() - s))
}

/// What one block's adjoint reads from its forward.
struct BlockTape<T> {
    v_in: Vec<T>,
    h1: Vec<T>,
    phi: Vec<T>,
    mixed: Vec<T>,
    nrm: Vec<T>,
    cpre: Vec<T>,
    act: Vec<T>,
}

impl<T: Real> Reference<'_, T> {
    fn edges(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        (self.centers.iter().zip(self.neighbors).enumerate())
            .map(|(e, (&i, &j))| (i as usize, j as usize, e))
    }

    /// Block `b`'s filter row (3F values) for edge basis `g`.
    fn filter(&self, b: &[T], g: &[T]) -> Vec<T> {
        let (f3, r) = (3 * self.m.hidden, self.m.n_rbf);
        let mut w = vec![T::zero(); f3];
        for (k, &gk) in g[..=r].iter().enumerate() {
            for (wo, &fo) in w.iter_mut().zip(&b[k * f3..(k + 1) * f3]) {
                *wo += gk * fo;
            }
        }
        w
    }

    fn run(&self, forces: &mut [T], energies: &mut [T]) {
        let m = self.m;
        let (n, f, r) = (self.species.len(), m.hidden, m.n_rbf);
        let (f3, h2, bw, nf) = (3 * f, f / 2, basis_width(r), n * f);
        let geo = Geometry {
            n_edges: self.centers.len(),
            n_rbf: r,
            cutoff: m.cutoff,
        };
        let mut basis = vec![T::zero(); geo.n_edges * bw];
        for ed in self.edges() {
            geo.basis(
                self.pos,
                self.off,
                ed,
                &mut basis[ed.2 * bw..(ed.2 + 1) * bw],
            );
        }
        let emb = &self.w[..m.elements * f];
        let atom_const = &self.w[m.elements * f..m.elements * (f + 1)];
        let ro_w = &self.w[m.elements * (f + 1)..];
        let (ro_b, ro_out) = (&ro_w[f * h2..], &ro_w[f * h2 + h2..]);
        let bo = m.block();
        let block_w = |b: usize| &ro_w[f * h2 + 2 * h2 + b * bo.len..];
        let phi_of_element = block_w(m.blocks);

        let mut s: Vec<T> = (self.species.iter())
            .flat_map(|&z| emb[z as usize * f..(z as usize + 1) * f].iter().copied())
            .collect();
        let mut v = vec![T::zero(); 3 * nf];
        let mut tape = Vec::with_capacity(m.blocks);
        for b in 0..m.blocks {
            let w = block_w(b);
            let (h1, phi) = match b {
                // The first block's φ from the element table, as the kernel takes it.
                0 => (
                    Vec::new(),
                    (self.species.iter())
                        .flat_map(|&z| &phi_of_element[z as usize * f3..(z as usize + 1) * f3])
                        .copied()
                        .collect(),
                ),
                _ => {
                    let h1 = linear(&s, f, &w[bo.w1..], f, Some(&w[bo.b1..]));
                    let act1: Vec<T> = h1.iter().map(|&z| silu(z)).collect();
                    let phi = linear(&act1, f, &w[bo.w2..], f3, Some(&w[bo.b2..]));
                    (h1, phi)
                }
            };
            let (mut ms, mut mv) = (s.clone(), v.clone());
            for (i, j, e) in self.edges() {
                let g = &basis[e * bw..(e + 1) * bw];
                let wf = self.filter(&w[bo.filter..], g);
                for t in 0..f {
                    let p = &phi[j * f3 + t..];
                    let (x0, x1, x2) = (p[0] * wf[t], p[f] * wf[f + t], p[2 * f] * wf[2 * f + t]);
                    ms[i * f + t] += x0;
                    for k in 0..3 {
                        mv[(i * 3 + k) * f + t] += x1 * g[r + 1 + k] + x2 * v[(j * 3 + k) * f + t];
                    }
                }
            }
            let mixed = linear(&mv, f, &w[bo.mix..], 2 * f, None);
            let mut nrm = vec![T::zero(); nf];
            let mut ctx = vec![T::zero(); 2 * nf];
            for a in 0..n {
                for t in 0..f {
                    let mut q = T::of(NORM_EPS);
                    for k in 0..3 {
                        let vv = mixed[(a * 3 + k) * 2 * f + f + t];
                        q += vv * vv;
                    }
                    nrm[a * f + t] = q.sqrt();
                    ctx[a * 2 * f + t] = ms[a * f + t];
                    ctx[a * 2 * f + f + t] = q.sqrt();
                }
            }
            let cpre = linear(&ctx, 2 * f, &w[bo.c1..], f, Some(&w[bo.cb1..]));
            let act2: Vec<T> = cpre.iter().map(|&z| silu(z)).collect();
            let act = linear(&act2, f, &w[bo.c2..], f3, Some(&w[bo.cb2..]));
            for a in 0..n {
                for t in 0..f {
                    let aa = &act[a * f3 + t..];
                    let mut dot = T::zero();
                    for k in 0..3 {
                        let mx = &mixed[(a * 3 + k) * 2 * f + t..];
                        dot += mx[0] * mx[f];
                        mv[(a * 3 + k) * f + t] += mx[0] * aa[f];
                    }
                    ms[a * f + t] += aa[0] + aa[2 * f] * dot;
                }
            }
            let v_in = std::mem::replace(&mut v, mv);
            s = ms;
            tape.push(BlockTape {
                v_in,
                h1,
                phi,
                mixed,
                nrm,
                cpre,
                act,
            });
        }

        // Readout and its adjoint.
        let ro = linear(&s, f, ro_w, h2, Some(ro_b));
        let mut g_ro = vec![T::zero(); n * h2];
        for a in 0..n {
            let mut en = atom_const[self.species[a] as usize];
            for o in 0..h2 {
                en += silu(ro[a * h2 + o]) * ro_out[o];
                g_ro[a * h2 + o] = ro_out[o] * silu_grad(ro[a * h2 + o]);
            }
            energies[a] = en;
        }
        let mut gs = linear_adjoint(&g_ro, h2, ro_w, f);
        let mut gv = vec![T::zero(); 3 * nf];
        let mut gbasis = vec![T::zero(); geo.n_edges * bw];
        for (b, t) in tape.iter().enumerate().rev() {
            let w = block_w(b);
            let mut g_act = vec![T::zero(); n * f3];
            let mut g_mixed = vec![T::zero(); 6 * nf];
            for a in 0..n {
                for c in 0..f {
                    let aa = &t.act[a * f3 + c..];
                    let g_s = gs[a * f + c];
                    let (mut dot, mut g_avv) = (T::zero(), T::zero());
                    for k in 0..3 {
                        let mx = &t.mixed[(a * 3 + k) * 2 * f + c..];
                        dot += mx[0] * mx[f];
                        g_avv += gv[(a * 3 + k) * f + c] * mx[0];
                    }
                    g_act[a * f3 + c] = g_s;
                    g_act[a * f3 + f + c] = g_avv;
                    g_act[a * f3 + 2 * f + c] = g_s * dot;
                    let g_dot = g_s * aa[2 * f];
                    for k in 0..3 {
                        let o = (a * 3 + k) * 2 * f + c;
                        g_mixed[o] = gv[(a * 3 + k) * f + c] * aa[f] + g_dot * t.mixed[o + f];
                        g_mixed[o + f] = g_dot * t.mixed[o];
                    }
                }
            }
            let mut g_cpre = linear_adjoint(&g_act, f3, &w[bo.c2..], f);
            for (g, &z) in g_cpre.iter_mut().zip(&t.cpre) {
                *g *= silu_grad(z);
            }
            let g_ctx = linear_adjoint(&g_cpre, f, &w[bo.c1..], 2 * f);
            for a in 0..n {
                for c in 0..f {
                    gs[a * f + c] += g_ctx[a * 2 * f + c];
                    let inv = g_ctx[a * 2 * f + f + c] / t.nrm[a * f + c];
                    for k in 0..3 {
                        let o = (a * 3 + k) * 2 * f + f + c;
                        g_mixed[o] += inv * t.mixed[o];
                    }
                }
            }
            for (g, d) in gv
                .iter_mut()
                .zip(linear_adjoint(&g_mixed, 2 * f, &w[bo.mix..], f))
            {
                *g += d;
            }
            let mut g_phi = vec![T::zero(); n * f3];
            let mut g_vj = vec![T::zero(); 3 * nf];
            let wfb = &w[bo.filter..];
            for (i, j, e) in self.edges() {
                let g = &basis[e * bw..(e + 1) * bw];
                let wf = self.filter(wfb, g);
                let ge = &mut gbasis[e * bw..(e + 1) * bw];
                for c in 0..f {
                    let p = &t.phi[j * f3 + c..];
                    let gvi: [T; 3] = std::array::from_fn(|k| gv[(i * 3 + k) * f + c]);
                    let vj: [T; 3] = std::array::from_fn(|k| t.v_in[(j * 3 + k) * f + c]);
                    let gx0 = gs[i * f + c];
                    let gx1 = (0..3).fold(T::zero(), |s, k| s + gvi[k] * g[r + 1 + k]);
                    let gx2 = (0..3).fold(T::zero(), |s, k| s + gvi[k] * vj[k]);
                    g_phi[j * f3 + c] += gx0 * wf[c];
                    g_phi[j * f3 + f + c] += gx1 * wf[f + c];
                    g_phi[j * f3 + 2 * f + c] += gx2 * wf[2 * f + c];
                    for k in 0..3 {
                        g_vj[(j * 3 + k) * f + c] += gvi[k] * p[2 * f] * wf[2 * f + c];
                        ge[r + 1 + k] += gvi[k] * p[f] * wf[f + c];
                    }
                    let gw = [gx0 * p[0], gx1 * p[f], gx2 * p[2 * f]];
                    for (k, gk) in ge[..=r].iter_mut().enumerate() {
                        let row = &wfb[k * f3..];
                        *gk += gw[0] * row[c] + gw[1] * row[f + c] + gw[2] * row[2 * f + c];
                    }
                }
            }
            for (g, d) in gv.iter_mut().zip(g_vj) {
                *g += d;
            }
            if b > 0 {
                let mut g_h = linear_adjoint(&g_phi, f3, &w[bo.w2..], f);
                for (g, &z) in g_h.iter_mut().zip(&t.h1) {
                    *g *= silu_grad(z);
                }
                for (g, d) in gs.iter_mut().zip(linear_adjoint(&g_h, f, &w[bo.w1..], f)) {
                    *g += d;
                }
            }
        }
        for (i, j, e) in self.edges() {
            let gr = geo.grad(self.pos, self.off, (i, j, e), &gbasis[e * bw..(e + 1) * bw]);
            for a in 0..3 {
                forces[3 * j + a] -= gr[a];
                forces[3 * i + a] += gr[a];
            }
        }
    }
}
