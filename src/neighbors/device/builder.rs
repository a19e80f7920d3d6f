//! The builder: checks a cell fits the device list, wraps positions and builds padded lists.

use super::bins::{ranges, BinGrid};
use super::list::{padding_offset, PaddedList};
use super::step::{Step, StepOp, GEOMETRY_LEN};
use crate::error::{Error, Result};
use crate::neighbors::Geometry;
use crate::structure::Lattice;
use candle_core::{DType, Device, Tensor};

/// Builds [`PaddedList`]s for one cutoff and cell on one device.
#[derive(Clone, Debug)]
pub struct DeviceListBuilder {
    cutoff: f64,
    periodic: bool,
    /// The 30 numbers kernels/neighbors.cu reads: reciprocal rows, wrapping basis rows, cell
    /// rows, periodic flags; on the device.
    geometry: Tensor,
    host_geometry: [f64; GEOMETRY_LEN],
    /// Perpendicular widths of the cell's basis.
    widths: [f64; 3],
    /// The bins of every build without spans (a periodic cell of many atoms), else all pairs;
    /// with their values on the device (no upload while a graph may be capturing a build).
    bins: Option<(BinGrid, Tensor)>,
}

/// Relative margin below half the perpendicular width, far above the rounding of fractional
/// coordinates (a pair at the margin could otherwise have two candidate images).
const HALF_WIDTH_MARGIN: f64 = 1e-9;

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
            widths: g.widths,
            bins: None,
        })
    }

    /// Builds without spans bin the atoms ([`build_binned`](Self::build_binned)) when the
    /// cell is periodic along every axis and there are at least `from_atoms` of the `n`
    /// atoms (`Tuning::device_list_bins_from_atoms`); else they test all pairs.
    pub fn binned_from(mut self, n: usize, from_atoms: usize) -> Result<Self> {
        let periodic = (0..3).all(|k| self.host_geometry[27 + k] != 0.0);
        self.bins = match periodic && n >= from_atoms {
            true => {
                let grid = self.bin_grid(n, None)?;
                let values = Tensor::from_slice(&grid.values, 9, self.geometry.device())?;
                Some((grid, values))
            }
            false => None,
        };
        Ok(self)
    }

    /// The bins of a binned build of `n` atoms; `positions` (on the host) give the range along
    /// non-periodic axes, which need them.
    pub fn bin_grid(&self, n: usize, positions: Option<&[[f64; 3]]>) -> Result<BinGrid> {
        let r = positions.map(|x| ranges(&self.host_geometry, x));
        BinGrid::new(&self.host_geometry, self.widths, self.cutoff, r, n)
    }

    pub fn cutoff(&self) -> f64 {
        self.cutoff
    }

    /// Offset along x of the padding slots' images.
    pub fn pad_distance(&self) -> f64 {
        padding_offset(self.cutoff)
    }

    /// Positions ([N, 3] f64) wrapped into the cell along periodic axes, as
    /// [`wrap_positions`](crate::neighbors::wrap_positions); the same tensor for molecules.
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
        self.build_systems(positions, None, capacity, dtype)
    }

    /// [`build`](Self::build) for a batch of independent systems in one cell: atom i pairs
    /// only with atoms `spans[i][0]..spans[i][1]` (its own system's; `spans` [N, 2] u32).
    pub fn build_systems(
        &self,
        positions: &Tensor,
        spans: Option<&Tensor>,
        capacity: usize,
        dtype: DType,
    ) -> Result<PaddedList> {
        self.check_build(positions, spans, capacity, dtype)?;
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
        if let (None, Some((grid, values))) = (spans, &self.bins) {
            return self.binned(&x, grid, values, capacity, dtype);
        }
        let counts = self.run_spans(Step::Count, &[&x], spans, n, DType::U32, n)?;
        let scan = self.run(Step::Scan { capacity }, &[&counts], n + 2, DType::U32, n)?;
        let edges = self.run_spans(
            Step::Fill { capacity },
            &[&x, &scan],
            spans,
            2 * capacity,
            DType::U32,
            n,
        )?;
        self.finish(&x, scan, edges, capacity, dtype)
    }

    /// [`build`](Self::build) with the atoms sorted into `grid`'s bins first: the same list.
    pub fn build_binned(
        &self,
        positions: &Tensor,
        grid: &BinGrid,
        capacity: usize,
        dtype: DType,
    ) -> Result<PaddedList> {
        self.check_build(positions, None, capacity, dtype)?;
        if positions.dim(0)? == 0 {
            return self.build_systems(positions, None, capacity, dtype);
        }
        let values = Tensor::from_slice(&grid.values, 9, positions.device())?;
        self.binned(&positions.contiguous()?, grid, &values, capacity, dtype)
    }

    /// The binned build; `g` holds `grid`'s values on the device.
    fn binned(
        &self,
        x: &Tensor,
        grid: &BinGrid,
        g: &Tensor,
        capacity: usize,
        dtype: DType,
    ) -> Result<PaddedList> {
        let (n, bins, u) = (x.dim(0)?, grid.bins(), DType::U32);
        let bin = self.run(Step::BinOf, &[x, g], n, u, n)?;
        let counts = self.run(Step::BinCount { bins }, &[&bin], bins, u, n)?;
        let bscan = self.run(Step::Scan { capacity: n }, &[&counts], bins + 2, u, bins)?;
        let placed = self.run(Step::BinPlace { bins }, &[&bin, &bscan], n + bins, u, n)?;
        let inputs = [x, g, &bin, &bscan, &placed];
        let counts = self.run(Step::CountBinned, &inputs, n, u, n)?;
        let scan = self.run(Step::Scan { capacity }, &[&counts], n + 2, u, n)?;
        let fill = [x, g, &bin, &bscan, &placed, &scan];
        let edges = self.run(Step::FillBinned { capacity }, &fill, 2 * capacity, u, n)?;
        self.finish(x, scan, edges, capacity, dtype)
    }

    /// The offsets of a filled list, and the list.
    fn finish(
        &self,
        x: &Tensor,
        scan: Tensor,
        edges: Tensor,
        capacity: usize,
        dtype: DType,
    ) -> Result<PaddedList> {
        let (n, dev) = (x.dim(0)?, x.device());
        let offsets = match capacity {
            0 => Tensor::zeros((0, 3), dtype, dev)?,
            _ => self.run(
                Step::Offsets { capacity },
                &[x, &scan, &edges],
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

    /// The arguments of a build are well formed.
    fn check_build(
        &self,
        positions: &Tensor,
        spans: Option<&Tensor>,
        capacity: usize,
        dtype: DType,
    ) -> Result<()> {
        self.check_positions(positions)?;
        if let Some(s) = spans {
            let n = positions.dim(0)?;
            if s.dims() != [n, 2] || s.dtype() != DType::U32 || !s.is_contiguous() {
                return Err(Error::NeighborList(format!(
                    "spans must be [{n}, 2] u32 and contiguous, got {:?} {:?}",
                    s.dims(),
                    s.dtype()
                )));
            }
        }
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
        Ok(())
    }

    pub(super) fn check_positions(&self, positions: &Tensor) -> Result<()> {
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
    pub(super) fn run(
        &self,
        step: Step,
        inputs: &[&Tensor],
        shape: impl Into<candle_core::Shape>,
        dtype: DType,
        atoms: usize,
    ) -> Result<Tensor> {
        self.run_spans(step, inputs, None, shape, dtype, atoms)
    }

    /// [`run`](Self::run) with each atom's candidate neighbours limited to its span.
    fn run_spans(
        &self,
        step: Step,
        inputs: &[&Tensor],
        spans: Option<&Tensor>,
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
            spans: spans.cloned(),
            shape,
            dtype,
        };
        Ok(inputs[0].apply_op1_no_bwd(&op)?)
    }
}
