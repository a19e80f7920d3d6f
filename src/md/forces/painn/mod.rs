//! [`PainnForces`]: a PaiNN model as MD's force provider, with its Verlet neighbour list (built
//! on the host or the device, checked every step or deferred) and the eager call. Children
//! that see the provider's fields: `list` builds the list, `whole_step` holds the graph and
//! one-launch paths, `cell` the moving cell of NPT.

mod cell;
mod list;
mod whole_step;

use crate::calculator::{atom_energies_and_forces, PainnCalculator};
use crate::error::{Error, Result};
use crate::graph::ForceGraph;
use crate::md::forces::provider::{Evaluation, ForceProvider};
use crate::md::integrator::{Integrator, NextStep, State};
use crate::md::positions::{displacement2, host_positions, largest_displacement2, non_finite_atom};
use crate::md::step_graph::StepGraph;
use crate::model::PainnInputs;
use crate::neighbors::{DeviceListBuilder, NeighborList, PaddedList};
use crate::ops::scatter_add;
use crate::phase::{NoClock, Phase, PhaseClock};
use crate::stress::Matrix3;
use crate::structure::{Lattice, Structure};
use candle_core::{DType, Device, Tensor, Var};
pub(crate) use cell::DEVICE_LIST_BATCH_NPT;

/// Where MD builds its Verlet neighbour list (`--neighbor-list`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ListSite {
    /// On a CUDA device wherever the device list can (molecules, and cells more than twice
    /// the list cutoff wide along every periodic axis); on the host otherwise.
    #[default]
    Auto,
    /// The host cell list (any cell): positions are copied to the host at every build.
    Host,
    /// The device list ([`DeviceListBuilder`]; its CPU twin on the CPU); an error where it
    /// cannot serve the cell.
    Device,
}

impl std::str::FromStr for ListSite {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "host" => Ok(Self::Host),
            "device" => Ok(Self::Device),
            _ => Err(format!(
                "unknown --neighbor-list `{s}` (expected auto, host or device)"
            )),
        }
    }
}

/// A PaiNN model with a Verlet neighbour list, for one system or a batch of independent
/// systems (molecules or cells, each with its own list; one force call for all). Between list
/// builds everything stays on the device; the only per-step host read is the largest
/// displacement since the last build (one scalar) that decides whether to rebuild. A batch
/// rebuilds every system's list when any system needs it: lists are sorted by (center,
/// neighbour), so the extra builds change no sum's order, and pairs in the skin add exact zeros.
pub struct PainnForces<'a> {
    calculator: &'a PainnCalculator,
    /// The systems' numbers, cells and pbc (no positions), and where each one's atoms start
    /// (`starts[s]..starts[s + 1]`).
    systems: Vec<Structure>,
    starts: Vec<usize>,
    species: Tensor,
    /// System index of every atom.
    atom_structure: Tensor,
    cutoff: f64,
    skin: f64,
    /// The host list (all systems, atom indices of the batch) and its builds so far.
    host_list: NeighborList,
    host_builds: usize,
    /// Each atom's own system's atoms as [N, 2] u32, for a batch's device list.
    spans: Option<Tensor>,
    /// The list built on the device instead of `host_list` ([`ListSite`]), its builds so far,
    /// and the slots of its next build.
    device_list: Option<DeviceListBuilder>,
    /// Where the list was asked to be built (`Device`: an error wherever it cannot be).
    list_site: ListSite,
    device_builds: usize,
    list_capacity: usize,
    /// Eager calls on a device list of at least this many edges take only the pairs within
    /// the model's cutoff ([`DeviceListBuilder::prune`]).
    prune_from: usize,
    /// Device positions at the last build, and the edges built there.
    reference: Option<Tensor>,
    edges: Option<ListTensors>,
    /// Edge lists up to this length are captured ([`with_graphs`](Self::with_graphs); 0: no
    /// graphs).
    graph_max_edges: usize,
    /// `--graphs on`: a failed capture is an error (with `auto` the run goes on op by op and
    /// [`graph_failure`](Self::graph_failure) says why).
    graph_required: bool,
    /// `--graphs auto`: no capture where an eager call is one kernel with its edge geometry
    /// in shared memory (faster than the captured separate kernels).
    graph_auto: bool,
    graph_failure: Option<String>,
    /// The energy+forces graph: one, re-captured with a larger edge capacity when a list
    /// outgrows it (any shorter list fits it, padded).
    graph: Option<ForceGraph>,
    captures: usize,
    /// The whole MD step around `graph`, captured at the first step.
    steps: Option<StepGraph>,
    /// Whether MD may defer the list checks ([`ForceProvider::defer_list_checks`]): on CUDA
    /// devices, where each check's host read stalls the queue of launches, as the tuning says.
    may_defer: bool,
    /// While deferred: each evaluation's [Σ, max] |x − reference|² since then, on the device.
    deferred: Option<Vec<Tensor>>,
    /// Whether MD steps whose force call is one kernel run as one launch with the integrator
    /// folded in ([`feature_split_step`](crate::ops::feature_split_step); as the tuning says),
    /// and how many did.
    one_launch: bool,
    one_launch_steps: u64,
    /// Each system's cell when the list was built, once an NPT step has moved the cells
    /// ([`ForceProvider::set_cells`]): the list's pairs and image offsets then follow their
    /// system's deformation since.
    list_cells: Option<Vec<Lattice>>,
}

struct ListTensors {
    centers: Tensor,
    neighbors: Tensor,
    offsets: Tensor,
    /// Where the edges came from, for graph inputs: the image offsets of a host list, or
    /// the padded slots of a device list.
    source: ListSource,
}

enum ListSource {
    Host(Vec<[f64; 3]>),
    Device(PaddedList),
}

impl<'a> PainnForces<'a> {
    /// Forces of `calculator` on the atoms of `template` (its numbers, cell and pbc), with a
    /// Verlet skin in Å (pairs are listed within cutoff + skin and reused until some atom has
    /// moved more than skin / 2).
    pub fn new(calculator: &'a PainnCalculator, template: &Structure, skin: f64) -> Result<Self> {
        Self::batch(calculator, std::slice::from_ref(template), skin)
    }

    /// Forces on a batch of independent systems, their atoms one after the other in the order
    /// given; energies come per system (\[S\]; a scalar for one system).
    pub fn batch(
        calculator: &'a PainnCalculator,
        systems: &[Structure],
        skin: f64,
    ) -> Result<Self> {
        if systems.is_empty() {
            return Err(Error::Md("a batch of MD systems needs at least one".into()));
        }
        let cfg = calculator.model().config();
        let mut species = Vec::new();
        let mut atom_structure = Vec::new();
        let mut starts = vec![0];
        for (k, s) in systems.iter().enumerate() {
            let z = cfg
                .species_of(&s.numbers)
                .map_err(|(atom, z)| Error::UnknownElement {
                    z,
                    structure: k,
                    atom,
                    known: cfg.elements.clone(),
                })?;
            species.extend(z);
            atom_structure.extend(std::iter::repeat_n(k as u32, s.len()));
            starts.push(species.len());
        }
        let dev = calculator.device();
        let n = species.len();
        let tuning = calculator.tuning();
        Self {
            calculator,
            systems: systems
                .iter()
                .map(|s| Structure {
                    cell: s.cell,
                    pbc: s.pbc,
                    ..Structure::molecule(s.numbers.clone(), Vec::new())
                })
                .collect(),
            starts,
            species: Tensor::from_vec(species, n, dev)?,
            atom_structure: Tensor::from_vec(atom_structure, n, dev)?,
            cutoff: cfg.cutoff,
            skin,
            host_list: NeighborList::default(),
            host_builds: 0,
            spans: None,
            device_list: None,
            list_site: ListSite::Auto,
            device_builds: 0,
            list_capacity: 0,
            prune_from: tuning.prune_from_edges,
            reference: None,
            edges: None,
            graph_max_edges: 0,
            graph_required: false,
            graph_auto: false,
            graph_failure: None,
            graph: None,
            captures: 0,
            steps: None,
            may_defer: dev.is_cuda() && tuning.defer_list_checks,
            deferred: None,
            one_launch: tuning.one_launch_steps && systems.len() == 1,
            one_launch_steps: 0,
            list_cells: None,
        }
        .with_spans()?
        .with_list_site(ListSite::Auto)
    }

    fn with_spans(mut self) -> Result<Self> {
        self.spans = self.spans_of()?;
        Ok(self)
    }

    /// The spans of a batch's systems (none for one system).
    fn spans_of(&self) -> Result<Option<Tensor>> {
        Ok(match self.systems.len() {
            1 => None,
            _ => {
                let spans: Vec<u32> = (0..self.systems.len())
                    .flat_map(|k| {
                        let (a, b) = (self.starts[k] as u32, self.starts[k + 1] as u32);
                        (a..b).flat_map(move |_| [a, b])
                    })
                    .collect();
                let n = spans.len() / 2;
                Some(Tensor::from_vec(spans, (n, 2), self.calculator.device())?)
            }
        })
    }

    /// [`ForceProvider::retain_systems`]: the kept systems' atoms stay in order; the list is
    /// built anew at the next call, and graphs captured anew.
    fn retain(&mut self, keep: &[bool]) -> Result<()> {
        if keep.len() != self.systems.len() || !keep.iter().any(|&k| k) {
            return Err(Error::Md(format!(
                "keeping {} of {} systems: need one flag per system and at least one kept",
                keep.iter().filter(|&&k| k).count(),
                self.systems.len()
            )));
        }
        let atoms: Vec<u32> = (0..self.systems.len())
            .filter(|&s| keep[s])
            .flat_map(|s| self.starts[s] as u32..self.starts[s + 1] as u32)
            .collect();
        let dev = self.calculator.device();
        let index = Tensor::from_vec(atoms.clone(), atoms.len(), dev)?;
        self.species = self.species.index_select(&index, 0)?;
        let mut systems = Vec::new();
        let mut starts = vec![0];
        let mut atom_structure = Vec::new();
        if let Some(cells) = self.list_cells.take() {
            let kept = cells.into_iter().zip(keep).filter(|(_, &k)| k);
            self.list_cells = Some(kept.map(|(c, _)| c).collect());
        }
        let kept = self.systems.drain(..).zip(keep).filter(|(_, &k)| k);
        for (system, _) in kept {
            atom_structure.extend(std::iter::repeat_n(systems.len() as u32, system.len()));
            starts.push(starts[starts.len() - 1] + system.len());
            systems.push(system);
        }
        self.atom_structure = Tensor::from_vec(atom_structure, atoms.len(), dev)?;
        (self.systems, self.starts) = (systems, starts);
        self.spans = self.spans_of()?;
        (self.reference, self.edges, self.deferred) = (None, None, None);
        (self.graph, self.steps) = (None, None);
        self.one_launch &= self.systems.len() == 1;
        Ok(())
    }

    /// Lets MD defer the neighbour-list checks of a run of steps and read them back at once
    /// (the default on CUDA devices), or makes it check every step (the default on the CPU).
    /// The trajectory is the same: a step whose list no longer held is redone.
    pub fn with_deferred_checks(mut self, defer: bool) -> Self {
        self.may_defer = defer;
        self
    }

    /// Runs MD steps whose force call is one kernel as one launch each, integrator folded in
    /// (the default on CUDA), or op by op around the force kernel. Same trajectories: the
    /// integrator's arithmetic is the same, rounding for rounding.
    pub fn with_one_launch_steps(mut self, on: bool) -> Self {
        self.one_launch = on;
        self
    }

    /// Builds the neighbour list where `site` says (before the first step).
    pub fn with_list_site(mut self, site: ListSite) -> Result<Self> {
        let dev = self.calculator.device();
        let (cell, pbc) = (self.systems[0].cell.as_ref(), self.systems[0].pbc);
        let cutoff = self.cutoff + self.skin;
        let one_cell = (self.systems.iter()).all(|s| s.cell.as_ref() == cell && s.pbc == pbc);
        if !one_cell && site == ListSite::Device {
            return Err(Error::NeighborList(
                "the device neighbour list serves a batch of systems in one cell (or of \
                 molecules); these systems have different cells (use the host list)"
                    .into(),
            ));
        }
        self.list_site = site;
        self.device_list = match site {
            ListSite::Host => None,
            ListSite::Auto if !dev.is_cuda() || !one_cell => None,
            ListSite::Auto => self.device_builder(cutoff, cell, pbc).ok(),
            ListSite::Device => Some(self.device_builder(cutoff, cell, pbc)?),
        };
        Ok(self)
    }

    /// A device list builder for `cutoff` and the cell, binning builds of many atoms.
    pub(super) fn device_builder(
        &self,
        cutoff: f64,
        cell: Option<&Lattice>,
        pbc: [bool; 3],
    ) -> Result<DeviceListBuilder> {
        let n = self.starts[self.systems.len()];
        let from = self.calculator.tuning().device_list_bins_from_atoms;
        DeviceListBuilder::new(cutoff, cell, pbc, self.calculator.device())?.binned_from(n, from)
    }

    /// Prunes device lists of at least `edges` edges to the model's cutoff before each eager
    /// call (the tuning's `prune_from_edges` by default; `usize::MAX`: never).
    pub fn with_pruning_from(mut self, edges: usize) -> Self {
        self.prune_from = edges;
        self
    }

    /// Whether the list is built on the device.
    pub fn list_on_device(&self) -> bool {
        self.device_list.is_some()
    }
}

impl ForceProvider for PainnForces<'_> {
    fn device(&self) -> &Device {
        self.calculator.device()
    }

    fn evaluate(&mut self, positions: &mut Tensor) -> Result<Evaluation> {
        self.evaluate_phased(positions, &mut NoClock)
    }

    fn evaluate_phased(
        &mut self,
        positions: &mut Tensor,
        clock: &mut dyn PhaseClock,
    ) -> Result<Evaluation> {
        if self.list_cells.is_some() {
            // The cells have moved (NPT): only the strained call follows them.
            return self.call_with_stress(positions).map(|(e, _)| e);
        }
        clock.mark(Phase::NeighborList)?;
        let rebuild = match (&self.reference, &mut self.deferred) {
            (None, _) => true,
            (Some(r), Some(pending)) => {
                pending.push(displacement2(positions, r)?);
                false
            }
            (Some(r), None) => {
                let d2 = self.max_displacement2(positions, r)?;
                if d2.is_nan() {
                    return Err(non_finite_atom(positions));
                }
                d2 > self.list_limit2()
            }
        };
        if rebuild {
            self.rebuild_at(positions)?;
        }
        if let Some(g) = &self.graph {
            clock.mark(Phase::Forward)?;
            let (energies, forces) = g.replay(positions)?;
            return Ok(Evaluation {
                energy: energies.squeeze(0)?,
                forces,
            });
        }
        let Some(edges) = &self.edges else {
            return Err(Error::Md("neighbour list missing after a build".into()));
        };
        let calc = self.calculator;
        let (centers, neighbors, offsets) = match (&edges.source, &self.device_list) {
            (ListSource::Device(list), Some(b)) if edges.centers.dim(0)? >= self.prune_from => {
                let cutoff = calc.model().config().cutoff;
                b.prune(positions, list, edges.centers.dim(0)?, cutoff)?
            }
            _ => (
                edges.centers.clone(),
                edges.neighbors.clone(),
                edges.offsets.clone(),
            ),
        };
        let var = Var::from_tensor(&positions.to_dtype(calc.dtype())?)?;
        let inputs = PainnInputs {
            species: self.species.clone(),
            positions: var.as_tensor().clone(),
            centers,
            neighbors,
            offsets,
            atom_structure: self.atom_structure.clone(),
            n_structures: self.systems.len(),
        };
        // Forces from the model-dtype sum; the energy summed in f64, so that an f32 model's
        // rounding of a large total (ulp 0.015 eV at 2e5 eV) does not swamp drift estimates.
        let (atom_energies, forces) = atom_energies_and_forces(calc, &inputs, &var, clock)?;
        let atom_energies = atom_energies.to_dtype(DType::F64)?;
        let energy = match self.systems.len() {
            1 => atom_energies.sum_all()?,
            s => scatter_add(&atom_energies, &self.atom_structure, s)?,
        };
        Ok(Evaluation {
            energy,
            forces: forces.to_dtype(DType::F64)?,
        })
    }

    fn list_reference(&self) -> Result<Option<Vec<[f64; 3]>>> {
        self.reference.as_ref().map(host_positions).transpose()
    }

    fn restore_list(&mut self, reference: &[[f64; 3]]) -> Result<()> {
        self.build(reference)
    }

    fn list_builds(&self) -> usize {
        self.host_builds + self.device_builds
    }

    fn systems(&self) -> usize {
        self.systems.len()
    }

    /// The strained call on the list as it stands (at positions just evaluated it holds; where
    /// it does not, the list is rebuilt around a copy of the positions, and the next step's
    /// check sees the jump and rebuilds it again).
    fn stresses(&mut self, positions: &Tensor) -> Result<Vec<Option<Matrix3>>> {
        let mut x = positions.clone();
        Ok(self.call_with_stress(&mut x)?.1)
    }

    fn retain_systems(&mut self, keep: &[bool]) -> Result<()> {
        self.retain(keep)
    }

    fn evaluate_with_stress(
        &mut self,
        positions: &mut Tensor,
    ) -> Result<(Evaluation, Vec<Option<Matrix3>>)> {
        self.call_with_stress(positions)
    }

    fn set_cells(&mut self, cells: &[Lattice]) -> Result<()> {
        self.follow_cells(cells)
    }

    fn list_cell(&self) -> Option<Lattice> {
        match self.list_cells.as_deref() {
            Some([cell]) => Some(*cell),
            _ => None,
        }
    }

    fn list_cells(&self) -> Option<Vec<Lattice>> {
        self.list_cells.clone()
    }

    fn one_launch_steps(&self) -> u64 {
        self.one_launch_steps
    }

    /// Where the whole step is not a captured graph (which checks its own list) and a list
    /// has been built.
    fn defer_list_checks(&mut self) -> bool {
        let can =
            self.may_defer && self.graph.is_none() && self.reference.is_some() && self.skin > 0.0;
        if can && self.deferred.is_none() {
            self.deferred = Some(Vec::new());
        }
        can
    }

    fn take_deferred_checks(&mut self) -> Result<Vec<f64>> {
        let Some(pending) = self.deferred.take() else {
            return Ok(Vec::new());
        };
        if pending.is_empty() {
            return Ok(Vec::new());
        }
        let rows = Tensor::stack(&pending, 0)?.to_vec2::<f64>()?;
        let limit2 = self.list_limit2();
        Ok(rows
            .iter()
            .map(|d| largest_displacement2(d) / limit2)
            .collect())
    }

    fn step_captured(
        &mut self,
        integrator: &Integrator,
        state: &mut State,
        noise: Option<&[f64]>,
        next: Option<NextStep>,
    ) -> Result<bool> {
        self.step_whole(integrator, state, noise, next)
    }
}
