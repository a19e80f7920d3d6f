//! Captured energy+forces graphs kept for reuse, keyed by (atoms, structures, edge capacity),
//! and a [`Calculator`] that replays them: `mlff predict` and `mlff eval` call the model on
//! batch after batch of a few recurring shapes (frames of the same molecules), so a batch whose
//! shape was captured before costs one replay instead of ~90 launches.
//!
//! A call takes the cached graph of its atoms and structures with the smallest capacity that
//! holds its edge list (padded, [`super::pad_edges`]); a shape is captured the second time it
//! is seen (a capture runs the call three times), for an edge capacity with room to grow
//! ([`edge_capacity`]). Shapes not worth capturing run op by op: lists longer than
//! [`Graphs::max_edges`], and with `auto` molecules whose eager call is one kernel that keeps
//! its edge geometry on chip (faster than a replay of the separate kernels). The least recently
//! used graph goes when more than [`CachePolicy::max_graphs`] graphs or
//! [`CachePolicy::max_edge_slots`] padded edges in all would be kept.

use super::{edge_capacity, ForceGraph, GraphEdges, GraphShape, Graphs, HostEdges};
use crate::calculator::{edge_offsets, Calculator, PainnCalculator, Prediction};
use crate::error::Result;
use crate::neighbors::{batch_neighbor_list, wrap_batch, NeighborList};
use crate::profiler::{NoClock, Phase, PhaseClock};
use crate::structure::Batch;
use candle_core::Tensor;
use std::cell::RefCell;
use std::collections::HashMap;

/// How many graphs a [`GraphCalculator`] keeps, and when it captures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachePolicy {
    /// Graphs kept at most.
    pub max_graphs: usize,
    /// Edge slots (summed capacities) kept at most: a graph's memory grows with its edges
    /// (~2.4 GB for a 541,000-edge water box); the newest graph is kept whatever its size.
    pub max_edge_slots: usize,
    /// Calls of a shape (atoms, structures) before it is captured: 1 captures at once.
    pub capture_at_call: usize,
}

impl Default for CachePolicy {
    fn default() -> Self {
        Self {
            max_graphs: 8,
            max_edge_slots: 1 << 21,
            capture_at_call: 2,
        }
    }
}

/// What a [`GraphCalculator`] did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CacheStats {
    pub captures: u64,
    pub replays: u64,
    /// Calls run op by op (shapes not captured, or graphs off).
    pub eager: u64,
    pub evictions: u64,
}

/// Items kept by [`GraphShape`], least recently used first out.
pub struct ShapeCache<T> {
    entries: Vec<(GraphShape, u64, T)>,
    clock: u64,
    policy: CachePolicy,
}

impl<T> ShapeCache<T> {
    pub fn new(policy: CachePolicy) -> Self {
        Self {
            entries: Vec::new(),
            clock: 0,
            policy,
        }
    }

    /// The item for a call of `atoms` atoms in `structures` structures with `edges` edges:
    /// the one with the smallest capacity that holds them (marked as used).
    pub fn get(&mut self, atoms: usize, structures: usize, edges: usize) -> Option<&T> {
        let k = (self.entries.iter().enumerate())
            .filter(|(_, (s, ..))| {
                s.atoms == atoms && s.structures == structures && s.edge_capacity >= edges
            })
            .min_by_key(|(_, (s, ..))| s.edge_capacity)?
            .0;
        self.clock += 1;
        self.entries[k].1 = self.clock;
        Some(&self.entries[k].2)
    }

    /// Keeps `item` for `shape`; returns how many items were dropped to stay within the
    /// policy (least recently used first; the new one always stays).
    pub fn insert(&mut self, shape: GraphShape, item: T) -> usize {
        self.clock += 1;
        self.entries.push((shape, self.clock, item));
        let mut dropped = 0;
        while self.entries.len() > 1 && self.over_limits() {
            let oldest = (self.entries.iter().enumerate())
                .min_by_key(|(_, (_, used, _))| *used)
                .map_or(0, |(k, _)| k);
            self.entries.swap_remove(oldest);
            dropped += 1;
        }
        dropped
    }

    fn over_limits(&self) -> bool {
        let slots: usize = self.entries.iter().map(|(s, ..)| s.edge_capacity).sum();
        self.entries.len() > self.policy.max_graphs || slots > self.policy.max_edge_slots
    }

    /// Shapes kept, in no particular order.
    pub fn shapes(&self) -> impl Iterator<Item = GraphShape> + '_ {
        self.entries.iter().map(|(s, ..)| *s)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A [`PainnCalculator`] whose calls replay cached CUDA graphs where [`Graphs`] says so, and
/// run op by op elsewhere (the CPU, other code paths, shapes not worth capturing).
pub struct GraphCalculator<'a> {
    calc: &'a PainnCalculator,
    graphs: Graphs,
    state: RefCell<State>,
}

struct State {
    /// False when graphs are off, cannot run here, or a capture failed with `auto`.
    enabled: bool,
    cache: ShapeCache<ForceGraph>,
    calls: HashMap<(usize, usize), usize>,
    stats: CacheStats,
    failure: Option<String>,
}

impl<'a> GraphCalculator<'a> {
    /// `graphs` for `calc`: `On` where graphs cannot run is an error naming why.
    pub fn new(calc: &'a PainnCalculator, graphs: Graphs) -> Result<Self> {
        Self::with_policy(calc, graphs, CachePolicy::default())
    }

    pub fn with_policy(
        calc: &'a PainnCalculator,
        graphs: Graphs,
        policy: CachePolicy,
    ) -> Result<Self> {
        let enabled = graphs.wanted(calc)?;
        Ok(Self {
            calc,
            graphs,
            state: RefCell::new(State {
                enabled,
                cache: ShapeCache::new(policy),
                calls: HashMap::new(),
                stats: CacheStats::default(),
                failure: None,
            }),
        })
    }

    pub fn stats(&self) -> CacheStats {
        self.state.borrow().stats
    }

    /// Shapes of the graphs kept now.
    pub fn cached_shapes(&self) -> Vec<GraphShape> {
        self.state.borrow().cache.shapes().collect()
    }

    /// Why graphs were given up (`auto` after a failed capture).
    pub fn failure(&self) -> Option<String> {
        self.state.borrow().failure.clone()
    }

    /// The call as a replay, or `None` where it runs op by op. Nothing is built or uploaded
    /// for a call that runs op by op.
    fn replayed(
        &self,
        batch: &Batch,
        nl: &NeighborList,
        clock: &mut dyn PhaseClock,
    ) -> Result<Option<Prediction>> {
        let mut state = self.state.borrow_mut();
        let state = &mut *state;
        let (atoms, structures, e) = (batch.n_atoms(), batch.n_structures(), nl.len());
        if !state.enabled || atoms == 0 || !self.worth_capturing(atoms, e)? {
            return Ok(None);
        }
        let cached = state.cache.get(atoms, structures, e).is_some();
        if !cached {
            let calls = state.calls.entry((atoms, structures)).or_default();
            *calls += 1;
            if *calls < state.cache.policy.capture_at_call {
                return Ok(None);
            }
        }
        clock.mark(Phase::Call)?;
        let offsets = edge_offsets(batch, nl);
        let edges = HostEdges {
            centers: &nl.centers,
            neighbors: &nl.neighbors,
            offsets: &offsets,
        };
        let dev = self.calc.device();
        let species = Tensor::from_vec(self.calc.species_of(batch)?, atoms, dev)?;
        let atom_structure = Tensor::from_vec(batch.atom_structure(), atoms, dev)?;
        let flat: Vec<f64> = batch.positions().into_iter().flatten().collect();
        let positions = Tensor::from_vec(flat, (atoms, 3), dev)?;
        if !cached {
            let captured = ForceGraph::capture(
                self.calc,
                &species,
                &atom_structure,
                structures,
                &positions,
                GraphEdges::Host(edges, edge_capacity(e)),
            );
            let graph = match (captured, self.graphs) {
                (Ok(g), _) => g,
                (Err(err), Graphs::On) => return Err(err),
                (Err(err), _) => {
                    state.enabled = false;
                    state.failure = Some(err.to_string());
                    return Ok(None);
                }
            };
            state.stats.captures += 1;
            let shape = graph.shape();
            state.stats.evictions += state.cache.insert(shape, graph) as u64;
        }
        let Some(graph) = state.cache.get(atoms, structures, e) else {
            return Ok(None); // not reached: the shape is kept
        };
        graph.set_atoms(&species, &atom_structure)?;
        graph.set_edges(edges)?;
        graph.launch(&positions)?;
        let pred = Prediction::from_device(batch, graph.energies(), graph.forces())?;
        state.stats.replays += 1;
        Ok(Some(pred))
    }

    /// Whether a call of `atoms` atoms and `edges` edges is captured at all.
    fn worth_capturing(&self, atoms: usize, edges: usize) -> Result<bool> {
        if edges > self.graphs.max_edges(self.calc.tuning()) {
            return Ok(false);
        }
        if self.graphs != Graphs::Auto {
            return Ok(true);
        }
        let fused = self.calc.fused()?;
        let plan = fused.feature_split_plan(atoms, edges, self.calc.device(), self.calc.dtype())?;
        Ok(!plan.is_some_and(|p| p.edges_resident()))
    }
}

impl Calculator for GraphCalculator<'_> {
    fn compute(&self, batch: &Batch) -> Result<Prediction> {
        self.compute_phased(batch, &mut NoClock)
    }

    fn compute_phased(&self, batch: &Batch, clock: &mut dyn PhaseClock) -> Result<Prediction> {
        clock.mark(Phase::NeighborList)?;
        let batch = wrap_batch(batch)?;
        let nl = batch_neighbor_list(&batch, self.cutoff())?;
        if let Some(pred) = self.replayed(&batch, &nl, clock)? {
            return Ok(pred);
        }
        self.state.borrow_mut().stats.eager += 1;
        self.calc.compute_with(&batch, &nl, clock)
    }

    fn cutoff(&self) -> f64 {
        self.calc.cutoff()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(atoms: usize, structures: usize, edge_capacity: usize) -> GraphShape {
        GraphShape {
            atoms,
            structures,
            edge_capacity,
        }
    }

    #[test]
    fn a_call_takes_the_smallest_capacity_that_holds_its_edges() {
        let mut c = ShapeCache::new(CachePolicy::default());
        assert_eq!(c.insert(shape(21, 1, 512), "large"), 0);
        assert_eq!(c.insert(shape(21, 1, 384), "small"), 0);
        c.insert(shape(21, 2, 1024), "two structures");
        c.insert(shape(9, 1, 128), "ethanol");
        assert_eq!(c.get(21, 1, 300), Some(&"small"));
        assert_eq!(c.get(21, 1, 384), Some(&"small"));
        assert_eq!(c.get(21, 1, 385), Some(&"large"));
        assert_eq!(c.get(21, 1, 513), None);
        assert_eq!(c.get(21, 2, 600), Some(&"two structures"));
        assert_eq!(c.get(42, 2, 600), None);
        assert_eq!(c.get(9, 1, 0), Some(&"ethanol"));
    }

    #[test]
    fn the_least_recently_used_graph_goes_first() {
        let policy = CachePolicy {
            max_graphs: 2,
            ..CachePolicy::default()
        };
        let mut c = ShapeCache::new(policy);
        c.insert(shape(1, 1, 64), 1);
        c.insert(shape(2, 1, 64), 2);
        assert_eq!(c.get(1, 1, 10), Some(&1)); // 2 is now the least recently used
        assert_eq!(c.insert(shape(3, 1, 64), 3), 1);
        assert_eq!(c.get(2, 1, 10), None);
        assert_eq!(c.get(1, 1, 10), Some(&1));
        assert_eq!(c.get(3, 1, 10), Some(&3));
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn edge_slots_bound_the_cache_but_the_newest_graph_stays() {
        let policy = CachePolicy {
            max_edge_slots: 1000,
            ..CachePolicy::default()
        };
        let mut c = ShapeCache::new(policy);
        c.insert(shape(1, 1, 600), 1);
        c.insert(shape(2, 1, 300), 2);
        assert_eq!(c.insert(shape(3, 1, 200), 3), 1); // 1,100 slots: the oldest goes
        assert_eq!(c.get(1, 1, 1), None);
        assert_eq!(c.insert(shape(4, 1, 5000), 4), 2); // alone over the budget: kept alone
        assert_eq!(c.shapes().collect::<Vec<_>>(), [shape(4, 1, 5000)]);
    }
}
