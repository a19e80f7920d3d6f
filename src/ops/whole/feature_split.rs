//! The whole fused PaiNN energy + forces of a feature split as one kernel
//! (kernels/whole/feature_split.cu): on CUDA, G thread blocks launched together each own F / G of the
//! features and run the forward and the explicit adjoint of `model::fused` as 10 phases per interaction block with a
//! barrier among them, instead of ~75 kernels. `model::fused` takes it for eager calls of
//! molecules whose layer inputs fit in shared memory (`FeatureSplitPlan::fit_widest`; the edge
//! geometry stays there whole or is formed again chunk by chunk, `edges_resident`), with G = 64
//! where the device allows; CUDA graphs and larger systems use the separate kernels. The CPU twin is the same maths as plain loops over the same packed
//! weights.

use super::cpu_twin::cpu_twin;
use super::packed::ModelShape;
#[cfg(feature = "profiling")]
use super::stamps::phase_times;
use super::stamps::stamp_room;
use crate::ops::launch::{
    barrier_counters, device_limits, kernel_source, launch, Init, Kernel, Real,
};
use crate::ops::{SHIPPED_HIDDEN, SHIPPED_RBF};
use candle_core::{bail, DType, Device, Result, Tensor};

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
/// ([`FeatureSplitPlan::with_groups`]; each owns F / groups features).
pub const GROUPS: usize = 16;
/// Threads per block (the kernel's __launch_bounds__): 16 warps per multiprocessor to hide the
/// latency of its loads.
#[cfg(feature = "cuda")]
const THREADS: usize = 512;

/// Sizes of one launch for `n` atoms and `e` edges.
#[derive(Clone, Copy, Debug)]
pub struct FeatureSplitPlan {
    n: usize,
    e: usize,
    groups: usize,
    /// Shared-memory staging area (elements): the widest layer input.
    xs_len: usize,
    /// Edges whose geometry shared memory holds at once (all of them: formed once per call).
    eb_edges: usize,
    model: ModelShape,
}

impl FeatureSplitPlan {
    /// The launch for `n` atoms and `e` edges, or why the model or system does not fit it:
    /// F must split into [`GROUPS`] slices of a power of two ≤ 32 features.
    pub fn new(model: ModelShape, n: usize, e: usize) -> std::result::Result<Self, String> {
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
        // Last the positions of an MD step ([`crate::ops::whole::md_step`]), [N, 3].
        (reals + edges + 3 * self.n) * elem_bytes + 2 * self.eb_edges * 4
    }

    /// Output length: forces, energies and edge gradients, then the scratch the kernel's adjoint
    /// reads (the phase stamps start at the next even element).
    pub(crate) fn out_len(&self) -> usize {
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

pub(crate) struct FeatureSplit {
    pub(crate) plan: FeatureSplitPlan,
    /// Record phase times (CUDA): block 0 stamps the clock after every barrier.
    pub(crate) stamps: bool,
    /// An MD step ([`crate::ops::whole::md_step`]): whether it is one, and a Langevin one.
    pub(crate) step: bool,
    pub(crate) langevin: bool,
    /// The step's dt and Langevin c1.
    pub(crate) dt: f64,
    pub(crate) c1: f64,
}

/// The kernel's f64 MD inputs and output between its float inputs and its index inputs:
/// positions, velocities, forces, half kick, noise, noise scale, reference, then the output.
pub(crate) const MD_SLOTS: usize = 8;

impl Kernel for FeatureSplit {
    kernel_source!("feature_split", "feature_split");
    /// The shipped model's shapes (F = 128 in blocks of 8 or 2 features, 20 basis functions)
    /// and F = 64 with 20 basis functions in blocks of one feature (64 blocks, what the model
    /// takes for it) have entries of their own (kernels/whole/feature_split.cu); any other takes the
    /// generic one.
    fn function(&self) -> &'static str {
        let m = &self.plan.model;
        let basis = m.n_rbf == SHIPPED_RBF;
        match (m.hidden, m.hidden / self.plan.groups) {
            (SHIPPED_HIDDEN, 8) if basis => "feature_split_128x8",
            (SHIPPED_HIDDEN, 2) if basis => "feature_split_128x2",
            (64, 1) if basis => "feature_split_64x1",
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
        crate::ops::launch::cooperative_grid(self.plan.groups, THREADS, self.plan.shared_bytes(b))
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
/// `weights` packed as [`ModelShape::packed_len`] describes; u32 `species`, `centers`,
/// `neighbors`; `offsets` [E, 3].
pub fn feature_split(
    plan: &FeatureSplitPlan,
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
pub(crate) fn check_inputs(
    plan: &FeatureSplitPlan,
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
pub(crate) fn check_system(
    model: &ModelShape,
    n: usize,
    e: usize,
    weights: &Tensor,
    positions: &[usize],
    offsets: &Tensor,
    [species, centers, neighbors]: [&Tensor; 3],
) -> Result<()> {
    crate::ops::launch::check_edges(centers, neighbors, n, "feature split")?;
    if positions != [n, 3] || offsets.dims() != [e, 3] || species.dims() != [n] {
        bail!(
            "feature split: positions {:?}, offsets {:?}, species {:?} do not fit {n} atoms and \
             {e} edges",
            positions,
            offsets.dims(),
            species.dims()
        )
    }
    if weights.dims() != [model.packed_len()] {
        bail!(
            "feature split: packed weights {:?}, expected [{}]",
            weights.dims(),
            model.packed_len()
        )
    }
    if species.device().is_cpu() {
        let sp = species.to_vec1::<u32>()?;
        if let Some(a) = sp.iter().position(|&z| z as usize >= model.elements) {
            bail!(
                "feature split: species[{a}] = {} but the model has {} elements",
                sp[a],
                model.elements
            )
        }
    }
    Ok(())
}

fn run(
    plan: &FeatureSplitPlan,
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
        FeatureSplit {
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

/// Each phase's name and microseconds: from the launch's start to the end of its first phase,
/// then between consecutive barriers, and from the last barrier to the end (as block 0 saw
/// them, by the GPU's global timer): where a one-kernel call spends its time. CUDA only, and
/// only built with the `profiling` feature;
/// inputs as for [`feature_split`].
#[cfg(feature = "profiling")]
pub fn feature_split_phase_times(
    plan: &FeatureSplitPlan,
    weights: &Tensor,
    [positions, offsets]: [&Tensor; 2],
    index: [&Tensor; 3],
) -> Result<Vec<(String, f64)>> {
    if !positions.device().is_cuda() {
        bail!("feature split: phase times are measured on CUDA devices")
    }
    let out = run(plan, weights, [positions, offsets], index, true)?;
    // A start, one stamp per barrier (5 per block forward but 3 for the first, 1, 5 per block
    // but 3 for the first backward, 1) and an end.
    let names = phase_names(plan.model.blocks);
    phase_times(&out, plan.out_len(), names)
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
