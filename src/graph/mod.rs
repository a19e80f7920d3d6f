//! CUDA graphs of the fused energy+forces call. A call of the fused path is ~60 kernels plus
//! the memsets and copies of their outputs, each costing microseconds of host work (launch,
//! allocation) at molecule size; captured once as a graph, a replay queues them all with one
//! call and no allocation. (The GPU time of those kernels remains: the replayed column of
//! BENCHMARKS.md, "Latency by size".)
//!
//! A [`ForceGraph`] is captured for a fixed number of atoms and an edge *capacity*: its inputs
//! (positions, edge list, image offsets) and outputs (energies, forces) live in buffers that
//! stay put between replays. Edge lists shorter than the capacity are padded with edges from
//! an atom to its own image 2 r_c + 1 Å away: beyond the cutoff an edge's basis, filter
//! and gradient are exactly zero, so padding changes no energy or force. A longer list needs a
//! new capture ([`ForceGraph::fits`]).
//!
//! Capturing needs a device made by [`crate::device::select`] or
//! [`crate::device::with_own_stream`] (a stream of its own, without cudarc's per-buffer events)
//! and the fused path ([`Backend::Fused`]); the CPU has no graphs.

mod cache;
mod capacity;
mod readback;

pub use cache::{CachePolicy, CacheStats, GraphCalculator, ShapeCache};
pub use capacity::{edge_capacity, fitted_list};
pub(crate) use readback::Readback;

use crate::calculator::PainnCalculator;
use crate::error::{Error, Result};
use crate::model::Backend;
use crate::model::PainnInputs;
use crate::neighbors::{padding_offset, PaddedList};
use crate::ops::scatter_add;
use candle_core::{DType, Device, Tensor, Var};

/// Whether to replay energy+forces as CUDA graphs (`--graphs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Graphs {
    /// Where they can be used (a CUDA device and the fused path) and, in MD, pay off
    /// (neighbour lists of up to the tuning's `graph_auto_max_edges` edges).
    #[default]
    Auto,
    /// Always; an error where they cannot be used.
    On,
    Off,
}

impl std::str::FromStr for Graphs {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            _ => Err(format!("unknown --graphs `{s}` (expected auto, on or off)")),
        }
    }
}

impl Graphs {
    /// The longest edge list worth capturing: the tuning's `graph_auto_max_edges` for `Auto`,
    /// no limit for `On`.
    pub fn max_edges(self, tuning: &crate::tuning::Tuning) -> usize {
        match self {
            Self::Auto => tuning.graph_auto_max_edges,
            Self::On => usize::MAX,
            Self::Off => 0,
        }
    }

    /// Whether `calc` runs with graphs; `On` where they cannot be used is an error naming why.
    pub fn wanted(self, calc: &PainnCalculator) -> Result<bool> {
        let why_not = if !cfg!(feature = "cuda") {
            Some("this binary was built without the `cuda` feature")
        } else if !calc.device().is_cuda() {
            Some("they need a CUDA device")
        } else if calc.model().backend() != Backend::Fused {
            Some("they need the fused backend (--backend fused)")
        } else {
            None
        };
        match (self, why_not) {
            (Self::Off, _) | (Self::Auto, Some(_)) => Ok(false),
            (_, None) => Ok(true),
            (Self::On, Some(why)) => Err(Error::Device(format!("--graphs on: {why}"))),
        }
    }
}

/// A neighbour list on the host: edge i ← j with its Cartesian image offset.
#[derive(Clone, Copy, Debug)]
pub struct HostEdges<'a> {
    pub centers: &'a [u32],
    pub neighbors: &'a [u32],
    pub offsets: &'a [[f64; 3]],
}

impl HostEdges<'_> {
    pub fn len(&self) -> usize {
        self.centers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.centers.is_empty()
    }
}

/// The edge list a graph is captured with.
#[derive(Clone, Copy, Debug)]
pub enum GraphEdges<'a> {
    /// A host list, padded to the capacity given.
    Host(HostEdges<'a>, usize),
    /// A list built on the device, for its own capacity (an overflowed one is an error: it
    /// holds padding only).
    Padded(&'a PaddedList),
}

/// What a captured graph was made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphShape {
    pub atoms: usize,
    pub structures: usize,
    pub edge_capacity: usize,
}

/// The fused energy+forces call of one calculator, captured for one [`GraphShape`].
pub struct ForceGraph {
    shape: GraphShape,
    cutoff: f64,
    dtype: DType,
    /// Static inputs: positions [N, 3] f64, the padded edge list, species and structure index.
    positions: Var,
    centers: Var,
    neighbors: Var,
    offsets: Var,
    species: Var,
    atom_structure: Var,
    /// Static outputs, rewritten by every replay: energy per structure [S] and forces [N, 3],
    /// both f64.
    energies: Var,
    forces: Var,
    graph: Graph,
}

/// An instantiated CUDA graph (without the `cuda` feature none is ever made).
#[cfg(feature = "cuda")]
pub(crate) type Graph = candle_core::cuda_backend::cudarc::driver::CudaGraph;
#[cfg(not(feature = "cuda"))]
pub(crate) enum Graph {}

/// Queues one replay of `graph` on its device's stream.
pub(crate) fn launch(graph: &Graph) -> Result<()> {
    #[cfg(feature = "cuda")]
    return graph
        .launch()
        .map_err(|e| Error::Device(format!("CUDA graph launch: {e}")));
    #[cfg(not(feature = "cuda"))]
    match *graph {}
}

impl ForceGraph {
    /// Captures `calc`'s energy+forces for atoms of model species `species` (\[N\] u32),
    /// structure index `atom_structure` (\[N\] u32, `structures` of them), at `positions`
    /// ([N, 3] f64) with `edges`.
    pub fn capture(
        calc: &PainnCalculator,
        species: &Tensor,
        atom_structure: &Tensor,
        structures: usize,
        positions: &Tensor,
        edges: GraphEdges,
    ) -> Result<Self> {
        let atoms = positions.dim(0)?;
        check_capturable(calc, atoms)?;
        let (cutoff, dtype) = (calc.model().config().cutoff, calc.dtype());
        let [centers, neighbors, offsets] = match edges {
            GraphEdges::Host(edges, capacity) => {
                edge_tensors(edges, atoms, capacity, cutoff, calc.device(), dtype)?
            }
            GraphEdges::Padded(list) => padded_tensors(list, dtype)?,
        };
        let dev = calc.device().clone();
        let shape = GraphShape {
            atoms,
            structures,
            edge_capacity: centers.dim(0)?,
        };
        let var = |t: Tensor| Var::from_tensor(&t);
        // Copies: a Var shares its tensor's storage, and replays overwrite these buffers.
        let positions = var(positions.to_dtype(DType::F64)?.copy()?)?;
        let (centers, neighbors, offsets) = (var(centers)?, var(neighbors)?, var(offsets)?);
        let (species, atom_structure) = (var(species.copy()?)?, var(atom_structure.copy()?)?);
        let energies = var(Tensor::zeros(structures, DType::F64, &dev)?)?;
        let forces = var(Tensor::zeros((atoms, 3), DType::F64, &dev)?)?;
        let parts = Parts {
            calc,
            positions: &positions,
            centers: &centers,
            neighbors: &neighbors,
            offsets: &offsets,
            species: &species,
            atom_structure: &atom_structure,
            structures,
            energies: &energies,
            forces: &forces,
        };
        let graph = capture_graph(&dev, || parts.step())?;
        Ok(Self {
            shape,
            cutoff,
            dtype,
            positions,
            centers,
            neighbors,
            offsets,
            species,
            atom_structure,
            energies,
            forces,
            graph,
        })
    }

    pub fn shape(&self) -> GraphShape {
        self.shape
    }

    /// Whether `edges` edges of `atoms` atoms fit this graph.
    pub fn fits(&self, atoms: usize, edges: usize) -> bool {
        atoms == self.shape.atoms && edges <= self.shape.edge_capacity
    }

    /// Replaces the edge list (same atoms; at most the capacity, padded to it).
    pub fn set_edges(&self, edges: HostEdges) -> Result<()> {
        let (atoms, capacity) = (self.shape.atoms, self.shape.edge_capacity);
        let dev = self.positions.device();
        let [centers, neighbors, offsets] =
            edge_tensors(edges, atoms, capacity, self.cutoff, dev, self.dtype)?;
        self.centers.set(&centers)?;
        self.neighbors.set(&neighbors)?;
        self.offsets.set(&offsets)?;
        Ok(())
    }

    /// Replaces the atoms' species and structure index (\[N\] u32 each, as captured): another
    /// batch of the same shape.
    pub fn set_atoms(&self, species: &Tensor, atom_structure: &Tensor) -> Result<()> {
        for (what, t) in [("species", species), ("structure index", atom_structure)] {
            if t.dims() != [self.shape.atoms] || t.dtype() != DType::U32 {
                return Err(Error::Device(format!(
                    "graph captured for {} atoms given a {what} tensor {:?} of {:?}",
                    self.shape.atoms,
                    t.dims(),
                    t.dtype()
                )));
            }
        }
        self.species.set(species)?;
        self.atom_structure.set(atom_structure)?;
        Ok(())
    }

    /// Replaces the edge list by one built on the device with this graph's capacity.
    pub fn set_padded(&self, list: &PaddedList) -> Result<()> {
        if list.capacity() != self.shape.edge_capacity {
            return Err(Error::Device(format!(
                "a list of {} slots given to a graph captured for {}",
                list.capacity(),
                self.shape.edge_capacity
            )));
        }
        let [centers, neighbors, offsets] = padded_tensors(list, self.dtype)?;
        self.centers.set(&centers)?;
        self.neighbors.set(&neighbors)?;
        self.offsets.set(&offsets)?;
        Ok(())
    }

    /// Energy+forces at `positions` ([N, 3], any float dtype, on the graph's device): the
    /// graph replayed, and its outputs copied, as (energies \[S\], forces [N, 3]), f64.
    pub fn replay(&self, positions: &Tensor) -> Result<(Tensor, Tensor)> {
        self.launch(positions)?;
        Ok((self.energies.as_tensor().copy()?, self.forces.copy()?))
    }

    /// Replays the graph at `positions`; its outputs ([`energies`](Self::energies),
    /// [`forces`](Self::forces)) hold the result until the next launch.
    pub fn launch(&self, positions: &Tensor) -> Result<()> {
        if positions.dims() != [self.shape.atoms, 3] {
            return Err(Error::Device(format!(
                "graph captured for [{}, 3] positions, got {:?}",
                self.shape.atoms,
                positions.dims()
            )));
        }
        self.positions.set(&positions.to_dtype(DType::F64)?)?;
        launch(&self.graph)
    }

    /// The captured call run op by op on the static edge buffers at `positions` ([N, 3] f64):
    /// energies \[S\] and forces [N, 3], f64, as new tensors (for capturing it inside a
    /// larger graph, a whole MD step, which writes them where it keeps its state).
    pub(crate) fn call_at(
        &self,
        calc: &PainnCalculator,
        positions: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        Parts {
            calc,
            positions: &self.positions,
            centers: &self.centers,
            neighbors: &self.neighbors,
            offsets: &self.offsets,
            species: &self.species,
            atom_structure: &self.atom_structure,
            structures: self.shape.structures,
            energies: &self.energies,
            forces: &self.forces,
        }
        .call(positions)
    }

    /// Energy per structure \[S\], f64, of the last launch (overwritten by the next).
    pub fn energies(&self) -> &Tensor {
        self.energies.as_tensor()
    }

    /// Forces [N, 3], f64, of the last launch (overwritten by the next).
    pub fn forces(&self) -> &Tensor {
        self.forces.as_tensor()
    }
}

/// What the captured step reads and writes.
struct Parts<'a> {
    calc: &'a PainnCalculator,
    positions: &'a Var,
    centers: &'a Var,
    neighbors: &'a Var,
    offsets: &'a Var,
    species: &'a Var,
    atom_structure: &'a Var,
    structures: usize,
    energies: &'a Var,
    forces: &'a Var,
}

impl Parts<'_> {
    /// The step the graph holds: static inputs → fused energy+forces → static outputs. Every
    /// tensor it makes is freed before it returns, so the graph owns no memory between
    /// replays beyond its buffers.
    fn step(&self) -> Result<()> {
        let (energies, forces) = self.call(self.positions.as_tensor())?;
        self.energies.set(&energies)?;
        self.forces.set(&forces)?;
        Ok(())
    }

    /// Energies \[S\] and forces [N, 3], f64, at `positions` on the static edge buffers.
    fn call(&self, positions: &Tensor) -> Result<(Tensor, Tensor)> {
        let inputs = PainnInputs {
            species: self.species.as_tensor().clone(),
            positions: positions.to_dtype(self.calc.dtype())?,
            centers: self.centers.as_tensor().clone(),
            neighbors: self.neighbors.as_tensor().clone(),
            offsets: self.offsets.as_tensor().clone(),
            atom_structure: self.atom_structure.as_tensor().clone(),
            n_structures: self.structures,
        };
        // The separate kernels, even where an eager call takes the one kernel: replayed, the
        // one kernel was no faster per call, and capturing it made a later capture of the
        // graph tests fail twice (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, cause not found).
        let (atom_energies, forces) = self.calc.fused()?.by_layers(&inputs)?;
        let forces = forces.to_dtype(DType::F64)?;
        let atom_energies = atom_energies.to_dtype(DType::F64)?;
        let energies = scatter_add(&atom_energies, self.atom_structure, self.structures)?;
        Ok((energies, forces))
    }
}

/// An edge list as a graph's static inputs hold it.
#[derive(Clone, Debug, PartialEq)]
pub struct PaddedEdges {
    pub centers: Vec<u32>,
    pub neighbors: Vec<u32>,
    /// Image offsets, [capacity × 3] flattened.
    pub offsets: Vec<f64>,
}

/// `edges` padded to `capacity` with edges from an atom to its own image 2 r_c + 1 Å away,
/// spread over the atoms (so that their zero contributions do not all add into one row).
pub fn pad_edges(
    edges: HostEdges,
    atoms: usize,
    capacity: usize,
    cutoff: f64,
) -> Result<PaddedEdges> {
    let e = edges.len();
    if edges.neighbors.len() != e || edges.offsets.len() != e {
        return Err(Error::NeighborList(format!(
            "{e} centers, {} neighbors and {} offsets",
            edges.neighbors.len(),
            edges.offsets.len()
        )));
    }
    if e > capacity {
        return Err(Error::Device(format!(
            "{e} edges do not fit a graph captured for {capacity}"
        )));
    }
    if let Some(k) =
        (0..e).find(|&k| edges.centers[k] as usize >= atoms || edges.neighbors[k] as usize >= atoms)
    {
        return Err(Error::NeighborList(format!(
            "edge {k} ({} <- {}) is out of range for {atoms} atoms",
            edges.centers[k], edges.neighbors[k]
        )));
    }
    let pad = (0..capacity - e).map(|k| (k % atoms) as u32);
    let centers = edges.centers.iter().copied().chain(pad.clone()).collect();
    let neighbors = edges.neighbors.iter().copied().chain(pad).collect();
    let far = [padding_offset(cutoff), 0.0, 0.0];
    let offsets = edges
        .offsets
        .iter()
        .chain(std::iter::repeat_n(&far, capacity - e))
        .flatten()
        .copied()
        .collect();
    Ok(PaddedEdges {
        centers,
        neighbors,
        offsets,
    })
}

/// `edges` padded to `capacity` as device tensors: centers and neighbors [C] u32, image
/// offsets [C, 3] in `dtype`.
pub(crate) fn edge_tensors(
    edges: HostEdges,
    atoms: usize,
    capacity: usize,
    cutoff: f64,
    dev: &Device,
    dtype: DType,
) -> Result<[Tensor; 3]> {
    let p = pad_edges(edges, atoms, capacity, cutoff)?;
    Ok([
        Tensor::from_vec(p.centers, capacity, dev)?,
        Tensor::from_vec(p.neighbors, capacity, dev)?,
        Tensor::from_vec(p.offsets, (capacity, 3), dev)?.to_dtype(dtype)?,
    ])
}

/// Whether `calc` can capture a call for `atoms` atoms.
fn check_capturable(calc: &PainnCalculator, atoms: usize) -> Result<()> {
    if calc.model().backend() != Backend::Fused {
        return Err(Error::Device(format!(
            "CUDA graphs need the fused path (--backend fused), not `{}`",
            calc.model().backend().name()
        )));
    }
    if atoms == 0 {
        return Err(Error::Device(
            "cannot capture a graph for zero atoms".into(),
        ));
    }
    Ok(())
}

/// A device-built list's slots as a graph's inputs; an error when it overflowed.
fn padded_tensors(list: &PaddedList, dtype: DType) -> Result<[Tensor; 3]> {
    let status = list.status()?;
    if status.overflowed {
        return Err(Error::NeighborList(format!(
            "{} edges overflowed a list of {} slots",
            status.edges,
            list.capacity()
        )));
    }
    Ok([
        list.centers.clone(),
        list.neighbors.clone(),
        list.offsets.to_dtype(dtype)?,
    ])
}

/// Runs `step` twice to warm up (kernels loaded, the fused weights built, candle's small
/// host-to-device uploads cached) and captures a third run on the device's stream.
/// Whether graphs can be captured on `dev`: a CUDA device without cudarc's per-buffer event
/// tracking (opened by [`crate::device::select`] or [`crate::device::with_own_stream`]).
pub fn capturable(dev: &Device) -> bool {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = dev {
        return !cuda.is_event_tracking();
    }
    let _ = dev;
    false
}

#[cfg(feature = "cuda")]
pub(crate) fn capture_graph(dev: &Device, step: impl Fn() -> Result<()>) -> Result<Graph> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let Device::Cuda(cuda) = dev else {
        return Err(Error::Device("CUDA graphs need a CUDA device".into()));
    };
    if cuda.is_event_tracking() {
        return Err(Error::Device(
            "CUDA graphs need a device without per-buffer event tracking \
             (open it with device::select or device::with_own_stream)"
                .into(),
        ));
    }
    let driver = |what: &str, e: candle_core::cuda_backend::cudarc::driver::DriverError| {
        Error::Device(format!("CUDA graph {what}: {e}"))
    };
    let _cache = cuda.enable_cuda_graph_htod_cache();
    step()?;
    step()?;
    dev.synchronize()?;
    let stream = cuda.cuda_stream();
    let _no_device_opened_meanwhile = crate::device::capture_lock();
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(|e| driver("capture", e))?;
    let ran = step();
    // Capture must end even when the step failed, or the stream stays unusable.
    let graph = stream.end_capture(
        sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
    );
    ran?;
    let graph = graph
        .map_err(|e| driver("capture", e))?
        .ok_or_else(|| Error::Device("CUDA graph capture recorded nothing".into()))?;
    graph.upload().map_err(|e| driver("upload", e))?;
    Ok(graph)
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn capture_graph(_: &Device, _: impl Fn() -> Result<()>) -> Result<Graph> {
    Err(Error::Device(
        "CUDA graphs need a build with the `cuda` feature and a CUDA device".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_adds_far_self_edges_up_to_the_capacity() {
        let offsets = [[0.0; 3], [1.0, 0.0, 0.0]];
        let edges = HostEdges {
            centers: &[0, 1],
            neighbors: &[1, 0],
            offsets: &offsets,
        };
        let PaddedEdges {
            centers: c,
            neighbors: n,
            offsets: o,
        } = pad_edges(edges, 3, 6, 5.0).unwrap();
        assert_eq!(c, [0, 1, 0, 1, 2, 0]);
        assert_eq!(n, [1, 0, 0, 1, 2, 0]);
        assert_eq!(&o[3..6], &[1.0, 0.0, 0.0]);
        assert!(o[6..].chunks(3).all(|r| r == [11.0, 0.0, 0.0]));
        assert!(pad_edges(edges, 3, 1, 5.0).is_err());
        let bad = HostEdges {
            centers: &[0, 3],
            ..edges
        };
        let msg = pad_edges(bad, 3, 6, 5.0).unwrap_err().to_string();
        assert!(msg.contains("edge 1 (3 <- 0)"), "{msg}");
    }

    #[test]
    fn capacity_leaves_room_to_grow() {
        for e in [0, 1, 63, 64, 1000, 541_044] {
            let c = edge_capacity(e);
            assert!(
                c >= e + 64 && c >= e + e / 4 && c.is_multiple_of(64),
                "{e} -> {c}"
            );
        }
    }
}
