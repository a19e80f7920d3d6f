//! Neighbour lists built where the positions are, padded to a fixed capacity, with an overflow
//! flag on the device: MD on a GPU rebuilds its list without copying positions to the host,
//! and a CUDA graph can keep reading the list from the same buffers.
//!
//! For geometries where every pair has at most one image within the cutoff: molecules, and
//! cells whose perpendicular width is more than twice the cutoff along every periodic axis
//! ([`DeviceListBuilder::new`] refuses others; the host cell list handles them). Then the image
//! is the rounded fractional difference, and each atom's edges come from one pass over all
//! atoms: O(N²) pair tests, ~0.1 ms per 5,000 atoms on a GPU. Edges are listed exactly as
//! [`neighbor_list`](super::neighbor_list) lists them for the same positions: sorted by
//! (center, neighbor), the same exact test |x_j − x_i + S·cell|² < c² (the kernels round every
//! product and sum as Rust does). Slots after the edges are padding: atom k mod N to its own
//! image 2 c + 1 Å away along x, beyond the cutoff, so they change no energy or force.
//!
//! kernels/neighbors.cu on CUDA; on the CPU a twin of the same arithmetic, the test oracle.

use super::Geometry;
use crate::error::{Error, Result};
use crate::structure::Lattice;
use candle_core::{DType, Device, Tensor};

/// A padded edge list on a device.
#[derive(Clone, Debug)]
pub struct PaddedList {
    /// `i` of every slot, \[C\] u32.
    pub centers: Tensor,
    /// `j` of every slot, \[C\] u32.
    pub neighbors: Tensor,
    /// Cartesian image offsets S · cell, [C, 3] in the requested dtype.
    pub offsets: Tensor,
    /// \[2\] u32 on the device: the number of edges found (saturated at u32::MAX), and 1 when
    /// they did not fit the capacity (the list then holds padding only).
    pub status: Tensor,
    /// Each atom's first slot, then the status, [N + 2] u32 (for pruning).
    scan: Tensor,
}

/// What a build found, read from [`PaddedList::status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListStatus {
    pub edges: usize,
    pub overflowed: bool,
}

impl PaddedList {
    pub fn capacity(&self) -> usize {
        self.centers.dim(0).unwrap_or(0)
    }

    /// The edge count and overflow flag (one host read, which waits for the build).
    pub fn status(&self) -> Result<ListStatus> {
        let s = self.status.to_vec1::<u32>()?;
        Ok(ListStatus {
            edges: s[0] as usize,
            overflowed: s[1] != 0,
        })
    }

    /// The first `edges` slots (the list without its padding).
    pub fn narrow(&self, edges: usize) -> Result<(Tensor, Tensor, Tensor)> {
        Ok((
            self.centers.narrow(0, 0, edges)?,
            self.neighbors.narrow(0, 0, edges)?,
            self.offsets.narrow(0, 0, edges)?,
        ))
    }
}

/// How far along x a padding edge's image lies for `cutoff`: beyond it, so that its basis,
/// filter and gradients are exactly zero (also the host padding of `graph::pad_edges`).
pub fn padding_offset(cutoff: f64) -> f64 {
    2.0 * cutoff + 1.0
}

/// Builds [`PaddedList`]s for one cutoff and cell on one device.
#[derive(Clone, Debug)]
pub struct DeviceListBuilder {
    cutoff: f64,
    periodic: bool,
    /// The 30 numbers kernels/neighbors.cu reads: reciprocal rows, wrapping basis rows, cell
    /// rows, periodic flags; on the device.
    geometry: Tensor,
    host_geometry: [f64; GEOMETRY_LEN],
}

const GEOMETRY_LEN: usize = 30;
/// Relative margin below half the perpendicular width, far above the rounding of fractional
/// coordinates (a pair at the margin could otherwise have two candidate images).
const HALF_WIDTH_MARGIN: f64 = 1e-9;
/// Relative margin on the cutoff when pruning: far above where an f32 distance may round
/// below the cutoff (relative 6e-8) while the f64 one lies above it.
pub const PRUNE_MARGIN: f64 = 1e-5;

impl DeviceListBuilder {
    /// A builder for `cutoff` (Å) in `cell` with `pbc`. An error (naming why) where a pair may
    /// have several images within the cutoff: a periodic axis at most twice the cutoff wide.
    pub fn new(
        cutoff: f64,
        cell: Option<&Lattice>,
        pbc: [bool; 3],
        device: &Device,
    ) -> Result<Self> {
        if !(cutoff.is_finite() && cutoff > 0.0) {
            return Err(Error::NeighborList(format!(
                "cutoff must be positive and finite, got {cutoff}"
            )));
        }
        let g = Geometry::of_cell(cell, pbc)?;
        for k in 0..3 {
            let fits = cutoff < 0.5 * g.widths[k] * (1.0 - HALF_WIDTH_MARGIN);
            if g.periodic[k] && !fits {
                return Err(Error::NeighborList(format!(
                    "the device list needs periodic widths above twice the cutoff: axis {k} is \
                     {:.4} Å wide, the cutoff {cutoff} Å (use the host cell list)",
                    g.widths[k]
                )));
            }
        }
        let mut host_geometry = [0.0; GEOMETRY_LEN];
        for k in 0..3 {
            for d in 0..3 {
                host_geometry[3 * k + d] = g.recip[k][d];
                host_geometry[9 + 3 * k + d] = g.basis[k][d];
                host_geometry[18 + 3 * k + d] = g.cell[k][d];
            }
            host_geometry[27 + k] = if g.periodic[k] { 1.0 } else { 0.0 };
        }
        Ok(Self {
            cutoff,
            periodic: g.periodic.iter().any(|&p| p),
            geometry: Tensor::from_slice(&host_geometry, GEOMETRY_LEN, device)?,
            host_geometry,
        })
    }

    pub fn cutoff(&self) -> f64 {
        self.cutoff
    }

    /// Offset along x of the padding slots' images.
    pub fn pad_distance(&self) -> f64 {
        padding_offset(self.cutoff)
    }

    /// Positions ([N, 3] f64) wrapped into the cell along periodic axes, as
    /// [`wrap_positions`](super::wrap_positions); the same tensor for molecules.
    pub fn wrap(&self, positions: &Tensor) -> Result<Tensor> {
        self.check_positions(positions)?;
        if !self.periodic {
            return Ok(positions.clone());
        }
        let n = positions.dim(0)?;
        self.run(Step::Wrap, &[positions], (n, 3), DType::F64, n)
    }

    /// The list of `positions` (already wrapped: see [`wrap`](Self::wrap)) in `capacity`
    /// slots, offsets in `dtype`.
    pub fn build(&self, positions: &Tensor, capacity: usize, dtype: DType) -> Result<PaddedList> {
        self.check_positions(positions)?;
        if capacity >= u32::MAX as usize {
            return Err(Error::NeighborList(format!(
                "capacity {capacity} does not fit u32 slots"
            )));
        }
        if !matches!(dtype, DType::F32 | DType::F64) {
            return Err(Error::NeighborList(format!(
                "offsets must be f32 or f64, not {dtype:?}"
            )));
        }
        let n = positions.dim(0)?;
        let dev = positions.device();
        if n == 0 {
            return Ok(PaddedList {
                centers: Tensor::zeros(capacity, DType::U32, dev)?,
                neighbors: Tensor::zeros(capacity, DType::U32, dev)?,
                offsets: Tensor::zeros((capacity, 3), dtype, dev)?,
                status: Tensor::zeros(2, DType::U32, dev)?,
                scan: Tensor::zeros(2, DType::U32, dev)?,
            });
        }
        let x = positions.contiguous()?;
        let counts = self.run(Step::Count, &[&x], n, DType::U32, n)?;
        let scan = self.run(Step::Scan { capacity }, &[&counts], n + 2, DType::U32, n)?;
        let edges = self.run(
            Step::Fill { capacity },
            &[&x, &scan],
            2 * capacity,
            DType::U32,
            n,
        )?;
        let offsets = match capacity {
            0 => Tensor::zeros((0, 3), dtype, dev)?,
            _ => self.run(
                Step::Offsets { capacity },
                &[&x, &scan, &edges],
                (capacity, 3),
                dtype,
                n,
            )?,
        };
        Ok(PaddedList {
            centers: edges.narrow(0, 0, capacity)?,
            neighbors: edges.narrow(0, capacity, capacity)?,
            offsets,
            status: scan.narrow(0, n, 2)?,
            scan,
        })
    }

    /// The edges of `list` (built from earlier positions of the same atoms) whose length at
    /// `positions` is below `cutoff` (1 + [`PRUNE_MARGIN`]): (centers, neighbours, offsets)
    /// in the list's order. With the model's cutoff, what a Verlet list's skin adds and the
    /// model multiplies by zero is left out; the margin keeps every pair that the model, in
    /// f32, may still see inside its cutoff. `edges` is the list's edge count (its status).
    pub fn prune(
        &self,
        positions: &Tensor,
        list: &PaddedList,
        edges: usize,
        cutoff: f64,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        self.check_positions(positions)?;
        let n = positions.dim(0)?;
        if list.scan.dim(0)? != n + 2 || edges > list.capacity() {
            return Err(Error::NeighborList(format!(
                "a list of {} slots built for {} atoms cannot be pruned at {n} atoms with {edges} \
                 edges",
                list.capacity(),
                list.scan.dim(0)?.saturating_sub(2)
            )));
        }
        if n == 0 || edges == 0 {
            return list.narrow(0);
        }
        let cut2 = (cutoff * (1.0 + PRUNE_MARGIN)).powi(2);
        let x = positions.contiguous()?;
        let inputs = [&x, &list.scan, &list.neighbors, &list.offsets];
        let counts = self.run(Step::PruneCount { cut2 }, &inputs, n, DType::U32, n)?;
        let kept_scan = self.run(
            Step::Scan { capacity: edges },
            &[&counts],
            n + 2,
            DType::U32,
            n,
        )?;
        let kept = kept_scan.narrow(0, n, 1)?.to_vec1::<u32>()?[0] as usize;
        let mut inputs = inputs.to_vec();
        inputs.push(&kept_scan);
        let fill = Step::PruneFill { edges, cut2 };
        let out = self.run(fill, &inputs, 3 * edges, DType::U32, n)?;
        let slots = out.narrow(0, 2 * edges, kept)?;
        Ok((
            out.narrow(0, 0, kept)?,
            out.narrow(0, edges, kept)?,
            crate::ops::gather(&list.offsets, &slots)?,
        ))
    }

    fn check_positions(&self, positions: &Tensor) -> Result<()> {
        let n = positions.dim(0)?;
        if positions.dims() != [n, 3] || positions.dtype() != DType::F64 {
            return Err(Error::NeighborList(format!(
                "positions must be [N, 3] f64, got {:?} {:?}",
                positions.dims(),
                positions.dtype()
            )));
        }
        if n > u32::MAX as usize {
            return Err(Error::NeighborList(format!(
                "{n} atoms are more than u32 indices can address"
            )));
        }
        if !positions.device().same_device(self.geometry.device()) {
            return Err(Error::NeighborList(
                "positions are not on the builder's device".into(),
            ));
        }
        Ok(())
    }

    /// One step on the positions' device into a new `shape` tensor of `dtype`.
    fn run(
        &self,
        step: Step,
        inputs: &[&Tensor],
        shape: impl Into<candle_core::Shape>,
        dtype: DType,
        atoms: usize,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let cut2 = match step {
            Step::PruneCount { cut2 } | Step::PruneFill { cut2, .. } => cut2,
            _ => self.cutoff * self.cutoff,
        };
        let op = StepOp {
            step,
            atoms,
            cut2,
            pad: self.pad_distance(),
            periodic: self.periodic,
            host_geometry: self.host_geometry,
            geometry: self.geometry.clone(),
            inputs: inputs.iter().map(|t| (*t).clone()).collect(),
            shape,
            dtype,
        };
        Ok(inputs[0].apply_op1_no_bwd(&op)?)
    }
}

/// The kernels of one build, in order.
#[derive(Clone, Copy, Debug)]
enum Step {
    Wrap,
    Count,
    Scan {
        capacity: usize,
    },
    Fill {
        capacity: usize,
    },
    Offsets {
        capacity: usize,
    },
    /// Pruning, to the squared cutoff `cut2`.
    PruneCount {
        cut2: f64,
    },
    PruneFill {
        edges: usize,
        cut2: f64,
    },
}

struct StepOp {
    step: Step,
    atoms: usize,
    cut2: f64,
    pad: f64,
    periodic: bool,
    host_geometry: [f64; GEOMETRY_LEN],
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    geometry: Tensor,
    inputs: Vec<Tensor>,
    shape: candle_core::Shape,
    dtype: DType,
}

impl candle_core::CustomOp1 for StepOp {
    fn name(&self) -> &'static str {
        self.step.kernel()
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        use candle_core::CpuStorage;
        let f64s = |k: usize| self.inputs[k].flatten_all()?.to_vec1::<f64>();
        let u32s = |k: usize| self.inputs[k].flatten_all()?.to_vec1::<u32>();
        let twin = cpu::Twin {
            g: &self.host_geometry,
            n: self.atoms,
            periodic: self.periodic,
            cut2: self.cut2,
        };
        let out = match self.step {
            Step::Wrap => CpuStorage::F64(twin.wrap(&f64s(0)?)),
            Step::Count => CpuStorage::U32(twin.count(&f64s(0)?)),
            Step::Scan { capacity } => CpuStorage::U32(cpu::scan(&u32s(0)?, capacity)),
            Step::Fill { capacity } => CpuStorage::U32(twin.fill(&f64s(0)?, &u32s(1)?, capacity)),
            Step::PruneCount { .. } => {
                let off = self.inputs[3].flatten_all()?.to_dtype(DType::F64)?;
                let kept = twin.kept(&f64s(0)?, &u32s(1)?, &u32s(2)?, &off.to_vec1()?);
                CpuStorage::U32(kept.iter().map(|k| k.len() as u32).collect())
            }
            Step::PruneFill { edges, .. } => {
                let off = self.inputs[3].flatten_all()?.to_dtype(DType::F64)?;
                let kept = twin.kept(&f64s(0)?, &u32s(1)?, &u32s(2)?, &off.to_vec1()?);
                CpuStorage::U32(cpu::prune_fill(&kept, &u32s(2)?, &u32s(4)?, edges))
            }
            Step::Offsets { capacity } => {
                let o = twin.offsets(&f64s(0)?, &u32s(1)?, &u32s(2)?, capacity, self.pad);
                match self.dtype {
                    DType::F32 => CpuStorage::F32(o.iter().map(|&v| v as f32).collect()),
                    _ => CpuStorage::F64(o),
                }
            }
        };
        Ok((out, self.shape.clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        _: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> {
        cuda::launch(self, &s.device)
    }
}

impl Step {
    fn kernel(self) -> &'static str {
        match self {
            Self::Wrap => "nl_wrap",
            Self::Count => "nl_count",
            Self::Scan { .. } => "nl_scan",
            Self::Fill { .. } => "nl_fill",
            Self::Offsets { .. } => "nl_offsets",
            Self::PruneCount { .. } => "nl_within_count",
            Self::PruneFill { .. } => "nl_within_fill",
        }
    }
}

/// The CPU twin of kernels/neighbors.cu: the same operations in the same order.
mod cpu {
    /// One list's constants.
    pub(super) struct Twin<'a> {
        pub g: &'a [f64; super::GEOMETRY_LEN],
        pub n: usize,
        pub periodic: bool,
        pub cut2: f64,
    }

    fn dot3(a: [f64; 3], b: &[f64]) -> f64 {
        a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
    }

    impl Twin<'_> {
        /// Image shift of pair i <- j and whether it is an edge.
        fn pair(&self, x: &[f64], i: usize, j: usize) -> (bool, [i32; 3]) {
            let d = [
                x[3 * j] - x[3 * i],
                x[3 * j + 1] - x[3 * i + 1],
                x[3 * j + 2] - x[3 * i + 2],
            ];
            let mut s = [0i32; 3];
            if self.periodic {
                for (k, sk) in s.iter_mut().enumerate() {
                    if self.g[27 + k] != 0.0 {
                        *sk = -(dot3(d, &self.g[3 * k..3 * k + 3]).round() as i32);
                    }
                }
            }
            if i == j && s == [0; 3] {
                return (false, s);
            }
            let mut v = d;
            for (k, &sk) in s.iter().enumerate() {
                if sk != 0 {
                    for (c, vc) in v.iter_mut().enumerate() {
                        *vc += sk as f64 * self.g[18 + 3 * k + c];
                    }
                }
            }
            (v[0] * v[0] + v[1] * v[1] + v[2] * v[2] < self.cut2, s)
        }

        pub fn wrap(&self, x: &[f64]) -> Vec<f64> {
            let mut out = vec![0.0; x.len()];
            for (xi, oi) in x.chunks_exact(3).zip(out.chunks_exact_mut(3)) {
                let mut f = [0.0; 3];
                for (k, fk) in f.iter_mut().enumerate() {
                    *fk = dot3([xi[0], xi[1], xi[2]], &self.g[3 * k..3 * k + 3]);
                    if self.g[27 + k] != 0.0 {
                        *fk -= fk.floor();
                    }
                }
                for (c, oc) in oi.iter_mut().enumerate() {
                    let mut o = 0.0;
                    for (k, fk) in f.iter().enumerate() {
                        o += fk * self.g[9 + 3 * k + c];
                    }
                    *oc = o;
                }
            }
            out
        }

        pub fn count(&self, x: &[f64]) -> Vec<u32> {
            (0..self.n)
                .map(|i| (0..self.n).filter(|&j| self.pair(x, i, j).0).count() as u32)
                .collect()
        }

        pub fn fill(&self, x: &[f64], scan: &[u32], capacity: usize) -> Vec<u32> {
            let n = self.n;
            let mut out = vec![0u32; 2 * capacity];
            let overflow = scan[n + 1] != 0;
            let total = if overflow { 0 } else { scan[n] as usize };
            if !overflow {
                for (i, &start) in scan[..n].iter().enumerate() {
                    let edges = (0..n).filter(|&j| self.pair(x, i, j).0);
                    for (slot, j) in (start as usize..).zip(edges) {
                        out[slot] = i as u32;
                        out[capacity + slot] = j as u32;
                    }
                }
            }
            for k in total..capacity {
                let a = ((k - total) % n) as u32;
                out[k] = a;
                out[capacity + k] = a;
            }
            out
        }

        /// Each atom's slots of a built list (`scan`, `neighbors`, f64 `off`sets) whose pair
        /// is still within the cutoff at `x`.
        pub fn kept(
            &self,
            x: &[f64],
            scan: &[u32],
            neighbors: &[u32],
            off: &[f64],
        ) -> Vec<Vec<usize>> {
            (0..self.n)
                .map(|i| {
                    (scan[i] as usize..scan[i + 1] as usize)
                        .filter(|&k| {
                            let j = neighbors[k] as usize;
                            let v: [f64; 3] = std::array::from_fn(|c| {
                                x[3 * j + c] - x[3 * i + c] + off[3 * k + c]
                            });
                            v[0] * v[0] + v[1] * v[1] + v[2] * v[2] < self.cut2
                        })
                        .collect()
                })
                .collect()
        }

        pub fn offsets(
            &self,
            x: &[f64],
            scan: &[u32],
            edges: &[u32],
            capacity: usize,
            pad: f64,
        ) -> Vec<f64> {
            let n = self.n;
            let total = if scan[n + 1] != 0 {
                0
            } else {
                scan[n] as usize
            };
            let mut out = Vec::with_capacity(3 * capacity);
            for k in 0..capacity {
                if k >= total {
                    out.extend([pad, 0.0, 0.0]);
                    continue;
                }
                let (i, j) = (edges[k] as usize, edges[capacity + k] as usize);
                let (_, s) = self.pair(x, i, j);
                for c in 0..3 {
                    let mut o = 0.0;
                    if s != [0; 3] {
                        for (kk, &sk) in s.iter().enumerate() {
                            o += sk as f64 * self.g[18 + 3 * kk + c];
                        }
                    }
                    out.push(o);
                }
            }
            out
        }
    }

    /// The kept slots ([`Twin::kept`]) at their new places (`kept_scan`): [centers |
    /// neighbours | slot in the old list], each `edges` long.
    pub(super) fn prune_fill(
        kept: &[Vec<usize>],
        neighbors: &[u32],
        kept_scan: &[u32],
        edges: usize,
    ) -> Vec<u32> {
        let mut out = vec![0u32; 3 * edges];
        for (i, (slots, &start)) in kept.iter().zip(kept_scan).enumerate() {
            for (s, &k) in (start as usize..).zip(slots) {
                out[s] = i as u32;
                out[edges + s] = neighbors[k];
                out[2 * edges + s] = k as u32;
            }
        }
        out
    }

    /// Exclusive prefix sum, then the edge count (saturated) and the overflow flag.
    pub(super) fn scan(counts: &[u32], capacity: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(counts.len() + 2);
        let mut total = 0u64;
        for &c in counts {
            out.push(total as u32);
            total += c as u64;
        }
        out.push(total.min(u32::MAX as u64) as u32);
        out.push(u32::from(total > capacity as u64));
        out
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::{Step, StepOp};
    use crate::ops::kernel::{cached_function, grid_stride};
    use candle_core::cuda_backend::cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};
    use candle_core::{CudaDevice, CudaStorage, DType, Result, Storage, Tensor};

    const IMAGE: &[u8] = crate::ops::kernel::kernel_image!("neighbors");
    /// Threads per block of the warp-per-atom kernels.
    const BLOCK: u32 = 256;

    enum View<'a> {
        F64(CudaView<'a, f64>),
        F32(CudaView<'a, f32>),
        U32(CudaView<'a, u32>),
    }

    fn view<'a>(t: &Tensor, storage: &'a Storage) -> Result<View<'a>> {
        let Some((a, b)) = t.layout().contiguous_offsets() else {
            candle_core::bail!("neighbour list: inputs must be contiguous")
        };
        match storage {
            Storage::Cuda(s) if t.dtype() == DType::F64 => {
                Ok(View::F64(s.as_cuda_slice::<f64>()?.slice(a..b)))
            }
            Storage::Cuda(s) if t.dtype() == DType::F32 => {
                Ok(View::F32(s.as_cuda_slice::<f32>()?.slice(a..b)))
            }
            Storage::Cuda(s) => Ok(View::U32(s.as_cuda_slice::<u32>()?.slice(a..b))),
            _ => candle_core::bail!("neighbour list: inputs must be on the CUDA device"),
        }
    }

    fn warp_per_atom(n: usize) -> LaunchConfig {
        let blocks = (n * 32).div_ceil(BLOCK as usize).clamp(1, 65535) as u32;
        LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    pub(super) fn launch(
        op: &StepOp,
        dev: &CudaDevice,
    ) -> Result<(CudaStorage, candle_core::Shape)> {
        let guards: Vec<_> = op.inputs.iter().map(|t| t.storage_and_layout()).collect();
        let mut views = Vec::with_capacity(guards.len());
        for (t, (g, _)) in op.inputs.iter().zip(&guards) {
            views.push(view(t, g)?);
        }
        let (gguard, _) = op.geometry.storage_and_layout();
        let View::F64(geometry) = view(&op.geometry, &gguard)? else {
            candle_core::bail!("neighbour list: geometry must be f64")
        };
        let (n, len) = (op.atoms, op.shape.elem_count());
        // The pruning kernels are instantiated for the list's offsets, the offsets kernel for
        // its output; the others read f64 positions only.
        let suffix = match op.step {
            Step::PruneCount { .. } | Step::PruneFill { .. } => op.inputs[3].dtype(),
            _ if op.dtype == DType::F32 => DType::F32,
            _ => DType::F64,
        };
        let func = cached_function(dev, op.step.kernel(), "neighbors", IMAGE, suffix, 0)?;
        let cfg = match op.step {
            Step::Wrap => grid_stride(n),
            Step::Count | Step::Fill { .. } | Step::PruneCount { .. } | Step::PruneFill { .. } => {
                warp_per_atom(n)
            }
            Step::Scan { .. } => LaunchConfig {
                grid_dim: (1, 1, 1),
                block_dim: (1024, 1, 1),
                shared_mem_bytes: 0,
            },
            Step::Offsets { capacity } => grid_stride(capacity),
        };
        let periodic = u32::from(op.periodic);
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&func);
        for (k, v) in views.iter().enumerate() {
            match v {
                View::F64(v) => b.arg(v),
                View::F32(v) => b.arg(v),
                View::U32(v) => b.arg(v),
            };
            // The positions are followed by the geometry in the kernels that build.
            let builds = matches!(
                op.step,
                Step::Wrap | Step::Count | Step::Fill { .. } | Step::Offsets { .. }
            );
            if k == 0 && builds {
                b.arg(&geometry);
            }
        }
        let capacity = match op.step {
            Step::Scan { capacity } | Step::Fill { capacity } | Step::Offsets { capacity } => {
                capacity
            }
            Step::PruneFill { edges, .. } => edges,
            Step::Wrap | Step::Count | Step::PruneCount { .. } => 0,
        };
        macro_rules! finish {
            ($t:ty) => {{
                // SAFETY: every kernel of neighbors.cu writes all `len` elements of its output.
                let mut out = unsafe { dev.alloc::<$t>(len)? };
                b.arg(&mut out);
                b.arg(&n);
                match op.step {
                    Step::Wrap => {}
                    Step::Count => {
                        b.arg(&periodic);
                        b.arg(&op.cut2);
                    }
                    Step::Scan { .. } => {
                        b.arg(&capacity);
                    }
                    Step::Fill { .. } => {
                        b.arg(&capacity);
                        b.arg(&periodic);
                        b.arg(&op.cut2);
                    }
                    Step::Offsets { .. } => {
                        b.arg(&capacity);
                        b.arg(&periodic);
                        b.arg(&op.cut2);
                        b.arg(&op.pad);
                    }
                    Step::PruneCount { .. } => {
                        b.arg(&op.cut2);
                    }
                    Step::PruneFill { .. } => {
                        b.arg(&capacity);
                        b.arg(&op.cut2);
                    }
                }
                // SAFETY: the arguments follow the signatures of kernels/neighbors.cu.
                unsafe { b.launch(cfg) }.map_err(|e| candle_core::Error::Cuda(Box::new(e)))?;
                drop(b);
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            }};
        }
        let out = match op.dtype {
            DType::U32 => finish!(u32),
            DType::F32 => finish!(f32),
            _ => finish!(f64),
        };
        Ok((out, op.shape.clone()))
    }
}
