//! The faster ways [`PainnForces`] runs a call or a whole MD step: the force call as a CUDA
//! graph (re-captured when a list outgrows it), the whole step as a graph around it
//! ([`StepGraph`]), and the whole step as one kernel launch ([`feature_split_step`]). Apart from
//! the eager path and its list handling (`painn/mod.rs`), which call in here after each build.

use super::{ListSource, PainnForces};
use crate::error::{Error, Result};
use crate::graph::{edge_capacity, ForceGraph, GraphEdges, Graphs, HostEdges};
use crate::md::integrator::{Integrator, NextStep, State};
use crate::md::positions::largest_displacement2;
use crate::md::step_graph::StepGraph;
use crate::model::Backend;
use crate::ops::{feature_split_step, MdStepInputs};
use candle_core::Tensor;

impl PainnForces<'_> {
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

    /// Of the replays queued behind another step since the last capture, those used and
    /// those thrown away (the step before them, or they, found the list no longer holding).
    pub fn queued_steps(&self) -> (u64, u64) {
        self.steps.as_ref().map_or((0, 0), |s| s.queued())
    }

    /// Puts the current list into the graph, capturing a larger one when it does not fit.
    pub(super) fn update_graph(&mut self, positions: &Tensor) -> Result<()> {
        let Some(edges) = &self.edges else {
            return Err(Error::Md("neighbour list missing after a build".into()));
        };
        let nl = &self.host_list;
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
        if e > self.graph_max_edges || (self.graph_auto && self.feature_split_keeps_edges(n, e)?) {
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
            self.systems.len(),
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
    /// hold the separate kernels; where the edges are formed chunk by chunk (trialanine) the
    /// replays win (BENCHMARKS.md, "MD throughput"; the A/B in
    /// docs/bench-log/15-md-fewer-launches.md).
    fn feature_split_keeps_edges(&self, n: usize, e: usize) -> Result<bool> {
        let calc = self.calculator;
        let Ok(fused) = calc.fused() else {
            return Ok(false);
        };
        let plan = fused.feature_split_plan(n, e, calc.device(), calc.dtype())?;
        Ok(plan.is_some_and(|p| p.edges_resident()))
    }

    /// The whole step as one launch ([`feature_split_step`]) where the force call is one
    /// kernel on an unpruned list: Ok(false), `state` untouched, where it does not apply or
    /// (checking each step) where the list no longer held after the drift, so that the step
    /// runs op by op and rebuilds it.
    fn step_one_launch(
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
        if !self.one_launch
            || pruned
            || self.skin <= 0.0
            || calc.model().backend() != Backend::Fused
        {
            return Ok(false);
        }
        let fused = calc.fused()?;
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
        let out = feature_split_step(
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
        self.one_launch_steps += 1;
        Ok(true)
    }

    /// [`ForceProvider::step_captured`](crate::md::ForceProvider::step_captured): a replay of
    /// the whole-step graph where the force call is captured (capturing it at the first step),
    /// one launch otherwise.
    pub(super) fn step_whole(
        &mut self,
        integrator: &Integrator,
        state: &mut State,
        noise: Option<&[f64]>,
        next: Option<NextStep>,
    ) -> Result<bool> {
        if self.graph.is_none() {
            return self.step_one_launch(integrator, state, noise);
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
            Some(steps) => steps.step(state, noise, next.map(|n| n.noise), limit2),
            None => Ok(false),
        }
    }
}
