//! Where MD gets its forces. A [`ForceProvider`] takes positions as a device tensor and returns
//! the potential energy and forces on the same device, so the MD loop never copies positions to
//! the host between log steps.

use super::integrator::{Integrator, State};
use super::step_graph::StepGraph;
use crate::calculator::{atom_energies_and_forces, Calculator, PainnCalculator};
use crate::error::{Error, Result};
use crate::graph::{edge_capacity, ForceGraph, GraphEdges, Graphs, HostEdges};
use crate::model::Backend;
use crate::model::PainnInputs;
use crate::neighbors::{image_offset, wrap_positions, DeviceListBuilder, PaddedList, VerletList};
use crate::ops::{small_system_step, MdStepInputs};
use crate::profiler::{NoClock, Phase, PhaseClock};
use crate::structure::{Batch, Structure};
use candle_core::{DType, Device, Tensor, Var};

/// Potential energy (a scalar) and forces ([N, 3]), f64, on the provider's device.
pub struct Evaluation {
    pub energy: Tensor,
    pub forces: Tensor,
}

/// Energies and forces for MD, device-resident.
pub trait ForceProvider {
    fn device(&self) -> &Device;

    /// Energy and forces at `positions` ([N, 3] f64 on [`device`](Self::device)). A provider
    /// with a neighbour list may replace `positions` by the same atoms wrapped into the periodic
    /// cell, only when it rebuilds its list (so the Verlet displacement test stays valid).
    fn evaluate(&mut self, positions: &mut Tensor) -> Result<Evaluation>;

    /// [`evaluate`](Self::evaluate), marking its phases on `clock` (for the profiler). The
    /// default reports the whole call as one phase.
    fn evaluate_phased(
        &mut self,
        positions: &mut Tensor,
        clock: &mut dyn PhaseClock,
    ) -> Result<Evaluation> {
        clock.mark(Phase::Call)?;
        self.evaluate(positions)
    }

    /// Positions at the last neighbour-list build (for restart files); `None` without a list.
    fn list_reference(&self) -> Result<Option<Vec<[f64; 3]>>> {
        Ok(None)
    }

    /// Rebuilds the neighbour list from positions a restart file recorded, so that a resumed
    /// run uses exactly the list the interrupted one had.
    fn restore_list(&mut self, _reference: &[[f64; 3]]) -> Result<()> {
        Ok(())
    }

    /// Neighbour-list builds so far (0 for providers without a list).
    fn list_builds(&self) -> usize {
        0
    }

    /// Steps run as one kernel launch each (integrator and forces in one kernel) so far.
    fn single_launch_steps(&self) -> u64 {
        0
    }

    /// Defers the neighbour-list check of the evaluations that follow, if the provider can:
    /// they then neither rebuild the list nor read anything back to the host, and keep each
    /// call's displacement on the device until [`take_deferred_checks`] (which ends the
    /// deferral). Returns whether it defers; by default it does not, and checks every call.
    ///
    /// [`take_deferred_checks`]: Self::take_deferred_checks
    fn defer_list_checks(&mut self) -> bool {
        false
    }

    /// The deferred evaluations' checks, in order, with one host read, and checks every call
    /// again from here on: each the largest squared displacement since the list was built over
    /// the largest the list allows, NaN where a position was not finite. Values above 1 (or
    /// NaN) mark calls whose list no longer held: their results are wrong.
    fn take_deferred_checks(&mut self) -> Result<Vec<f64>> {
        Ok(Vec::new())
    }

    /// Runs a whole step of `integrator` (with this step's Langevin `noise`) at once, if the
    /// provider can (a captured CUDA graph, or one kernel launch): Ok(true) when `state` has
    /// advanced, Ok(false) when the step must run op by op (no such path, or its neighbour
    /// list no longer holds).
    fn step_captured(
        &mut self,
        _integrator: &Integrator,
        _state: &mut State,
        _noise: Option<&[f64]>,
    ) -> Result<bool> {
        Ok(false)
    }
}

/// Σ and max over atoms of |x − reference|², as a \[2\] tensor (one host read for both: max()
/// may skip NaN on the GPU; the sum carries it).
pub fn displacement2(positions: &Tensor, reference: &Tensor) -> Result<Tensor> {
    Ok(crate::ops::md_displacement2(positions, reference)?)
}

/// The error for positions that are not all finite, naming the first such atom.
fn non_finite_atom(positions: &Tensor) -> Error {
    let host = match host_positions(positions) {
        Ok(h) => h,
        Err(e) => return e,
    };
    let (i, p) = host
        .iter()
        .enumerate()
        .find(|(_, p)| p.iter().any(|x| !x.is_finite()))
        .map(|(i, p)| (i, *p))
        .unwrap_or((0, host.first().copied().unwrap_or_default()));
    Error::NonFinite(format!("atom {i} is at {p:?}"))
}

/// Host positions of an [N, 3] f64 tensor.
pub fn host_positions(t: &Tensor) -> Result<Vec<[f64; 3]>> {
    Ok(t.to_dtype(DType::F64)?
        .to_vec2::<f64>()?
        .into_iter()
        .map(|r| [r[0], r[1], r[2]])
        .collect())
}

/// An [N, 3] f64 tensor from host rows.
pub fn device_positions(rows: &[[f64; 3]], device: &Device) -> Result<Tensor> {
    let flat: Vec<f64> = rows.iter().flatten().copied().collect();
    Ok(Tensor::from_vec(flat, (rows.len(), 3), device)?)
}

/// Any [`Calculator`] (analytic potentials, or a model called the host way): positions are
/// copied to the host every step. For tests and reference runs, not for speed.
pub struct CalculatorForces<C> {
    calculator: C,
    template: Structure,
    device: Device,
}

impl<C: Calculator> CalculatorForces<C> {
    /// `template` gives the atoms, cell and pbc; its positions are replaced at every call.
    pub fn new(calculator: C, template: &Structure, device: Device) -> Self {
        let template = Structure {
            energy: None,
            forces: None,
            info: Vec::new(),
            arrays: Vec::new(),
            ..template.clone()
        };
        Self {
            calculator,
            template,
            device,
        }
    }
}

impl<C: Calculator> ForceProvider for CalculatorForces<C> {
    fn device(&self) -> &Device {
        &self.device
    }

    fn evaluate(&mut self, positions: &mut Tensor) -> Result<Evaluation> {
        let mut s = self.template.clone();
        s.positions = host_positions(positions)?;
        if let Some((i, p)) = s
            .positions
            .iter()
            .enumerate()
            .find(|(_, p)| p.iter().any(|x| !x.is_finite()))
        {
            return Err(Error::NonFinite(format!("atom {i} is at {p:?}")));
        }
        let pred = self.calculator.compute(&Batch::from_one(s)?)?;
        Ok(Evaluation {
            energy: Tensor::new(pred.energies[0], &self.device)?,
            forces: device_positions(&pred.forces[0], &self.device)?,
        })
    }
}

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

/// A PaiNN model with a Verlet neighbour list. Between list builds everything stays on the
/// device; the only per-step host read is the largest displacement since the last build (one
/// scalar) that decides whether to rebuild.
pub struct PainnForces<'a> {
    calculator: &'a PainnCalculator,
    template: Structure,
    species: Tensor,
    atom_structure: Tensor,
    verlet: VerletList,
    /// The list built on the device instead of `verlet` ([`ListSite`]), its builds so far,
    /// and the slots of its next build.
    device_list: Option<DeviceListBuilder>,
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
    /// folded in ([`ops::small_system_step`]; as the tuning says), and how many did.
    single_launch: bool,
    single_launch_steps: u64,
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
        let cfg = calculator.model().config();
        let species =
            cfg.species_of(&template.numbers)
                .map_err(|(atom, z)| Error::UnknownElement {
                    z,
                    structure: 0,
                    atom,
                    known: cfg.elements.clone(),
                })?;
        let dev = calculator.device();
        let n = template.len();
        let tuning = calculator.tuning();
        Self {
            calculator,
            template: Structure {
                cell: template.cell,
                pbc: template.pbc,
                ..Structure::molecule(template.numbers.clone(), Vec::new())
            },
            species: Tensor::from_vec(species, n, dev)?,
            atom_structure: Tensor::zeros(n, DType::U32, dev)?,
            verlet: VerletList::new(cfg.cutoff, skin),
            device_list: None,
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
            single_launch: tuning.one_launch_steps,
            single_launch_steps: 0,
        }
        .with_list_site(ListSite::Auto)
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
    pub fn with_single_launch_steps(mut self, on: bool) -> Self {
        self.single_launch = on;
        self
    }

    /// Builds the neighbour list where `site` says (before the first step).
    pub fn with_list_site(mut self, site: ListSite) -> Result<Self> {
        let dev = self.calculator.device();
        let (cell, pbc) = (self.template.cell.as_ref(), self.template.pbc);
        let cutoff = self.verlet.list_cutoff();
        self.device_list = match site {
            ListSite::Host => None,
            ListSite::Auto if !dev.is_cuda() => None,
            ListSite::Auto => DeviceListBuilder::new(cutoff, cell, pbc, dev).ok(),
            ListSite::Device => Some(DeviceListBuilder::new(cutoff, cell, pbc, dev)?),
        };
        Ok(self)
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

    /// Runs MD steps as CUDA graphs as `graphs` says: `On` always (an error where they cannot
    /// run: see [`Graphs::wanted`]), `Auto` where they can and the neighbour list has at most
    /// the tuning's `graph_auto_max_edges` edges (longer lists run op by op).
    pub fn with_graphs(mut self, graphs: Graphs) -> Result<Self> {
        self.graph_max_edges = match graphs.wanted(self.calculator)? {
            true => graphs.max_edges(self.calculator.tuning()),
            false => 0,
        };
        self.graph_required = graphs == Graphs::On;
        self.graph_auto = graphs == Graphs::Auto;
        Ok(self)
    }

    /// Why CUDA graphs were given up in this run (`--graphs auto` after a failed capture).
    pub fn graph_failure(&self) -> Option<&str> {
        self.graph_failure.as_deref()
    }

    /// A failed capture: an error with `--graphs on`; with `auto`, no more graphs in this run.
    fn capture_failed(&mut self, e: Error) -> Result<()> {
        if self.graph_required {
            return Err(e);
        }
        self.graph_failure = Some(e.to_string());
        (self.graph_max_edges, self.graph, self.steps) = (0, None, None);
        Ok(())
    }

    /// Force-call CUDA graphs captured so far (a new one when a neighbour list outgrew the
    /// last).
    pub fn graph_captures(&self) -> usize {
        self.captures
    }

    /// MD steps run as replays of the captured whole step, since its last capture.
    pub fn replayed_steps(&self) -> u64 {
        self.steps.as_ref().map_or(0, |s| s.replayed())
    }

    /// Puts the current list into the graph, capturing a larger one when it does not fit.
    fn update_graph(&mut self, positions: &Tensor) -> Result<()> {
        let Some(edges) = &self.edges else {
            return Err(Error::Md("neighbour list missing after a build".into()));
        };
        let nl = self.verlet.list();
        let host = |offsets| HostEdges {
            centers: &nl.centers,
            neighbors: &nl.neighbors,
            offsets,
        };
        let (n, e) = (positions.dim(0)?, edges.centers.dim(0)?);
        // A device list is built with the graph's capacity while it fits, and copied as is.
        let fits = |g: &ForceGraph| match &edges.source {
            ListSource::Host(_) => g.fits(n, e),
            ListSource::Device(list) => g.fits(n, e) && list.capacity() == g.shape().edge_capacity,
        };
        if let Some(g) = self.graph.as_ref().filter(|g| fits(g)) {
            return match &edges.source {
                ListSource::Host(offsets) => g.set_edges(host(offsets)),
                ListSource::Device(list) => g.set_padded(list),
            };
        }
        // Their memory back before the next capture; the step graph ran on the old one.
        self.steps = None;
        self.graph = None;
        if e > self.graph_max_edges || (self.graph_auto && self.one_kernel_keeps_edges(n, e)?) {
            return Ok(()); // not worth capturing: op by op
        }
        let graph_edges = match &edges.source {
            ListSource::Host(offsets) => GraphEdges::Host(host(offsets), edge_capacity(e)),
            ListSource::Device(list) => GraphEdges::Padded(list),
        };
        let captured = ForceGraph::capture(
            self.calculator,
            &self.species,
            &self.atom_structure,
            1,
            positions,
            graph_edges,
        );
        match captured {
            Ok(g) => {
                self.graph = Some(g);
                self.captures += 1;
                Ok(())
            }
            Err(e) => self.capture_failed(e),
        }
    }

    /// Whether an eager call on `n` atoms and `e` edges is one kernel that keeps its edge
    /// geometry in shared memory: then MD steps op by op beat whole-step replays, whose graphs
    /// hold the separate kernels (H100, 5,000 NVE steps: aspirin 4,231-4,245 steps/s against
    /// 3,762-3,772, ethanol 4,949-4,961 against 3,931-3,967; trialanine, whose 820 edges are
    /// formed chunk by chunk, 2,193-2,197 against 3,455-3,469).
    fn one_kernel_keeps_edges(&self, n: usize, e: usize) -> Result<bool> {
        let calc = self.calculator;
        let Ok(fused) = calc.model().fused() else {
            return Ok(false);
        };
        let plan = fused.feature_split_plan(n, e, calc.device(), calc.dtype())?;
        Ok(plan.is_some_and(|p| p.edges_resident()))
    }

    /// Builds the list at `host` (positions as given, not wrapped again) and uploads it.
    fn build(&mut self, host: &[[f64; 3]]) -> Result<()> {
        if self.device_list.is_some() {
            let positions = device_positions(host, self.calculator.device())?;
            return self.build_on_device(&positions, false).map(drop);
        }
        let (cell, pbc) = (self.template.cell.as_ref(), self.template.pbc);
        self.verlet.invalidate();
        self.verlet.update(host, cell, pbc)?;
        let nl = self.verlet.list();
        let host_offsets: Vec<[f64; 3]> =
            nl.shifts.iter().map(|&s| image_offset(s, cell)).collect();
        let dev = self.calculator.device();
        let e = nl.len();
        let offsets = host_offsets.iter().flatten().copied().collect();
        self.edges = Some(ListTensors {
            centers: Tensor::from_vec(nl.centers.clone(), e, dev)?,
            neighbors: Tensor::from_vec(nl.neighbors.clone(), e, dev)?,
            offsets: Tensor::from_vec(offsets, (e, 3), dev)?.to_dtype(self.calculator.dtype())?,
            source: ListSource::Host(host_offsets),
        });
        let reference = device_positions(host, dev)?;
        self.built(reference)
    }

    /// Builds the list on the device at `positions` ([N, 3] f64), wrapped into the cell first
    /// when `wrap`; returns the positions the list refers to. Nothing goes to the host but the
    /// edge count (and, where it is not finite, the atom at fault).
    fn build_on_device(&mut self, positions: &Tensor, wrap: bool) -> Result<Tensor> {
        let Some(builder) = &self.device_list else {
            return Err(Error::Md("no device neighbour list".into()));
        };
        let x = if wrap {
            builder.wrap(positions)?
        } else {
            positions.clone()
        };
        if !x.sum_all()?.to_scalar::<f64>()?.is_finite() {
            return Err(non_finite_atom(&x));
        }
        // The graph's capacity while the list fits it, so that its slots are copied as they
        // are; a list that overflows is built again with room to grow.
        let mut capacity = self
            .graph
            .as_ref()
            .map_or(self.list_capacity, |g| g.shape().edge_capacity);
        let dtype = self.calculator.dtype();
        let (list, edges) = loop {
            let list = builder.build(&x, capacity, dtype)?;
            let status = list.status()?;
            if status.edges >= u32::MAX as usize {
                return Err(Error::NeighborList(format!(
                    "{} atoms have more than {} pairs within the list cutoff",
                    x.dim(0)?,
                    u32::MAX - 1
                )));
            }
            if !status.overflowed {
                break (list, status.edges);
            }
            capacity = edge_capacity(status.edges);
        };
        self.list_capacity = capacity;
        self.device_builds += 1;
        let (centers, neighbors, offsets) = list.narrow(edges)?;
        self.edges = Some(ListTensors {
            centers,
            neighbors,
            offsets,
            source: ListSource::Device(list),
        });
        self.built(x.clone())?;
        Ok(x)
    }

    /// After a build: the graph gets the new list, and the displacement check its reference.
    fn built(&mut self, reference: Tensor) -> Result<()> {
        if self.graph_max_edges > 0 {
            self.update_graph(&reference)?;
        }
        if let Some(steps) = &self.steps {
            steps.set_reference(&reference)?;
        }
        self.reference = Some(reference);
        Ok(())
    }

    /// Largest squared displacement since the last build (NaN when a position is not finite).
    fn max_displacement2(&self, positions: &Tensor, reference: &Tensor) -> Result<f64> {
        let both = displacement2(positions, reference)?.to_vec1::<f64>()?;
        Ok(largest_displacement2(&both))
    }

    /// The whole step as one launch ([`small_system_step`]) where the force call is one
    /// kernel on an unpruned list: Ok(false), `state` untouched, where it does not apply or
    /// (checking each step) where the list no longer held after the drift, so that the step
    /// runs op by op and rebuilds it.
    fn step_single_launch(
        &mut self,
        integrator: &Integrator,
        state: &mut State,
        noise: Option<&[f64]>,
    ) -> Result<bool> {
        let calc = self.calculator;
        let (Some(reference), Some(edges)) = (&self.reference, &self.edges) else {
            return Ok(false);
        };
        let (n, e) = (state.positions.dim(0)?, edges.centers.dim(0)?);
        let pruned = matches!(edges.source, ListSource::Device(_)) && e >= self.prune_from;
        if !self.single_launch
            || pruned
            || self.verlet.skin() <= 0.0
            || calc.model().backend() != Backend::Fused
        {
            return Ok(false);
        }
        let fused = calc.model().fused()?;
        let Some(plan) = fused.feature_split_plan(n, e, calc.device(), calc.dtype())? else {
            return Ok(false);
        };
        let xi = noise
            .map(|xi| Tensor::from_slice(xi, (n, 3), calc.device()))
            .transpose()?;
        let inputs = MdStepInputs {
            positions: &state.positions,
            velocities: &state.velocities,
            forces: &state.forces,
            half_kick: integrator.half_kick(),
            dt: integrator.dt(),
            noise: integrator.langevin(xi.as_ref())?,
            reference,
        };
        let index = [&self.species, &edges.centers, &edges.neighbors];
        let out = small_system_step(
            &plan,
            fused.packed_weights()?,
            &edges.offsets,
            index,
            &inputs,
        )?;
        match &mut self.deferred {
            Some(pending) => pending.push(out.displacement2),
            None => {
                let d2 = largest_displacement2(&out.displacement2.to_vec1::<f64>()?);
                if d2.is_nan() || d2 > self.list_limit2() {
                    return Ok(false);
                }
            }
        }
        state.positions = out.positions;
        state.velocities = out.velocities;
        state.forces = out.forces;
        state.energy = out.energy;
        state.step += 1;
        self.single_launch_steps += 1;
        Ok(true)
    }

    /// Largest squared displacement since the build that the list allows: (skin / 2)².
    fn list_limit2(&self) -> f64 {
        let half = 0.5 * self.verlet.skin();
        half * half
    }
}

/// The max of a [`displacement2`] pair [Σ, max], or NaN where the sum shows a position that
/// is not finite.
fn largest_displacement2(both: &[f64]) -> f64 {
    if both[0].is_finite() {
        both[1]
    } else {
        f64::NAN
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
        if rebuild && self.device_list.is_some() {
            let wrapped = self.build_on_device(positions, true)?;
            *positions = wrapped;
        } else if rebuild {
            let mut host = host_positions(positions)?;
            wrap_positions(&mut host, self.template.cell.as_ref(), self.template.pbc)?;
            self.build(&host)?;
            if self.template.is_periodic() {
                *positions = device_positions(&host, self.calculator.device())?;
            }
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
            n_structures: 1,
        };
        // Forces from the model-dtype sum; the energy summed in f64, so that an f32 model's
        // rounding of a large total (ulp 0.015 eV at 2e5 eV) does not swamp drift estimates.
        let (atom_energies, forces) = atom_energies_and_forces(calc.model(), &inputs, &var, clock)?;
        Ok(Evaluation {
            energy: atom_energies.to_dtype(DType::F64)?.sum_all()?,
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
        self.verlet.rebuilds() + self.device_builds
    }

    fn single_launch_steps(&self) -> u64 {
        self.single_launch_steps
    }

    /// Where the whole step is not a captured graph (which checks its own list) and a list
    /// has been built.
    fn defer_list_checks(&mut self) -> bool {
        let can = self.may_defer
            && self.graph.is_none()
            && self.reference.is_some()
            && self.verlet.skin() > 0.0;
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
    ) -> Result<bool> {
        if self.graph.is_none() {
            return self.step_single_launch(integrator, state, noise);
        }
        let (Some(graph), Some(reference)) = (&self.graph, &self.reference) else {
            return Ok(false);
        };
        if !self.steps.as_ref().is_some_and(|s| s.fits(integrator)) {
            self.steps = None;
            match StepGraph::capture(self.calculator, graph, integrator, state, reference) {
                Ok(steps) => self.steps = Some(steps),
                Err(e) => {
                    self.capture_failed(e)?;
                    return Ok(false);
                }
            }
        }
        let limit2 = self.list_limit2();
        match &mut self.steps {
            Some(steps) => steps.step(state, noise, limit2),
            None => Ok(false),
        }
    }
}
