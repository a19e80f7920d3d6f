//! The profiler: wraps a [`Calculator`] (or an MD [`ForceProvider`]) and records every call
//! without the caller doing anything else — per-phase timings (CUDA events on the GPU, the host
//! clock on the CPU), memory every N calls, then statistics, a leak check, hotspots with advice,
//! JSON export/import and a Chrome trace. The phase vocabulary the timed code marks lives in
//! [`crate::phase`] (re-exported here), so that calculators and MD need not import the profiler.

mod clock;
mod memory;
mod report;
mod stats;

pub use crate::phase::{NoClock, Phase, PhaseClock};
pub use clock::{DeviceClock, Segment};
pub use memory::{leak_check, reset_peak, rss_bytes, sample, LeakCheck, MemorySample};
pub use report::{Hotspot, PhaseStats, ProfileReport};
pub use stats::{quantile, Stats};

use crate::calculator::{Calculator, Prediction};
use crate::error::Result;
use crate::md::{Evaluation, ForceProvider};
use crate::structure::Batch;
use candle_core::{Device, Tensor};
use std::cell::RefCell;
use std::time::Instant;

/// One profiled call (or MD step).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CallRecord {
    pub index: usize,
    pub atoms: usize,
    pub structures: usize,
    pub segment: Segment,
    /// Host time spent in the profiler for this call, µs.
    pub profiler_us: f64,
}

/// What a profiler has collected.
#[derive(Default)]
struct Collected {
    calls: Vec<CallRecord>,
    memory: Vec<MemorySample>,
}

/// Records calls on one device.
pub struct Profiler {
    device: Device,
    clock: RefCell<DeviceClock>,
    collected: RefCell<Collected>,
    memory_every: usize,
}

impl Profiler {
    /// A profiler for work on `device`, sampling memory every `memory_every` calls (0: never).
    pub fn new(device: &Device, memory_every: usize) -> Result<Self> {
        Ok(Self {
            device: device.clone(),
            clock: RefCell::new(DeviceClock::new(device)?),
            collected: RefCell::new(Collected::default()),
            memory_every,
        })
    }

    /// Times `f`, which marks its phases on the clock it is given.
    fn record<T>(
        &self,
        atoms: usize,
        structures: usize,
        then: Option<Phase>,
        f: impl FnOnce(&mut dyn PhaseClock) -> Result<T>,
    ) -> Result<T> {
        let mut clock = self.clock.borrow_mut();
        let out = f(&mut *clock)?;
        // Not counted as the profiler's own time: mostly waiting for the call's device work.
        clock.finish()?;
        let t = Instant::now();
        let segment = clock.cut(then)?;
        let marks_us = clock.take_mark_time_us();
        drop(clock);
        let mut c = self.collected.borrow_mut();
        let index = c.calls.len();
        if self.memory_every > 0 && index.is_multiple_of(self.memory_every) {
            c.memory.push(sample(&self.device, index));
        }
        c.calls.push(CallRecord {
            index,
            atoms,
            structures,
            segment,
            profiler_us: marks_us + 1e6 * t.elapsed().as_secs_f64(),
        });
        Ok(out)
    }

    /// Number of calls recorded so far.
    pub fn calls(&self) -> usize {
        self.collected.borrow().calls.len()
    }

    /// Forgets what was recorded (e.g. after warm-up).
    pub fn clear(&self) {
        *self.collected.borrow_mut() = Collected::default();
    }

    /// Statistics, hotspots and the leak check over everything recorded.
    pub fn report(&self, label: &str, leak_tolerance_bytes: f64) -> ProfileReport {
        let c = self.collected.borrow();
        ProfileReport::build(
            label,
            &crate::device::device_name(&self.device),
            &c.calls,
            &c.memory,
            leak_tolerance_bytes,
        )
    }
}

/// A calculator whose every call is profiled; returns exactly what the inner one returns.
pub struct Profiled<C> {
    inner: C,
    profiler: Profiler,
}

impl<C: Calculator> Profiled<C> {
    pub fn new(inner: C, profiler: Profiler) -> Self {
        Self { inner, profiler }
    }

    pub fn profiler(&self) -> &Profiler {
        &self.profiler
    }

    pub fn inner(&self) -> &C {
        &self.inner
    }
}

impl<C: Calculator> Calculator for Profiled<C> {
    fn compute(&self, batch: &Batch) -> Result<Prediction> {
        self.profiler
            .record(batch.n_atoms(), batch.n_structures(), None, |clock| {
                self.inner.compute_phased(batch, clock)
            })
    }

    fn compute_phased(&self, batch: &Batch, _clock: &mut dyn PhaseClock) -> Result<Prediction> {
        self.compute(batch)
    }

    fn cutoff(&self) -> f64 {
        self.inner.cutoff()
    }

    fn compute_with_stress(&self, batch: &Batch) -> Result<crate::stress::StressPrediction> {
        self.profiler
            .record(batch.n_atoms(), batch.n_structures(), None, |clock| {
                clock.mark(crate::phase::Phase::Call)?;
                self.inner.compute_with_stress(batch)
            })
    }
}

/// MD forces whose every evaluation is profiled, the time until the next one counted as the
/// step's integrator phase: one record per MD step.
pub struct ProfiledForces<F> {
    inner: F,
    profiler: Profiler,
    atoms: usize,
}

impl<F: ForceProvider> ProfiledForces<F> {
    pub fn new(inner: F, profiler: Profiler, atoms: usize) -> Self {
        Self {
            inner,
            profiler,
            atoms,
        }
    }

    pub fn profiler(&self) -> &Profiler {
        &self.profiler
    }
}

impl<F: ForceProvider> ForceProvider for ProfiledForces<F> {
    fn device(&self) -> &Device {
        self.inner.device()
    }

    fn evaluate(&mut self, positions: &mut Tensor) -> Result<Evaluation> {
        let inner = &mut self.inner;
        self.profiler
            .record(self.atoms, 1, Some(Phase::Integrate), |clock| {
                inner.evaluate_phased(positions, clock)
            })
    }

    fn list_reference(&self) -> Result<Option<Vec<[f64; 3]>>> {
        self.inner.list_reference()
    }

    fn evaluate_with_stress(
        &mut self,
        positions: &mut Tensor,
    ) -> Result<(crate::md::Evaluation, Vec<Option<crate::stress::Matrix3>>)> {
        let inner = &mut self.inner;
        self.profiler
            .record(self.atoms, 1, Some(Phase::Integrate), |clock| {
                clock.mark(Phase::Call)?;
                inner.evaluate_with_stress(positions)
            })
    }

    fn set_cells(&mut self, cells: &[crate::structure::Lattice]) -> Result<()> {
        self.inner.set_cells(cells)
    }

    fn list_cell(&self) -> Option<crate::structure::Lattice> {
        self.inner.list_cell()
    }

    fn list_cells(&self) -> Option<Vec<crate::structure::Lattice>> {
        self.inner.list_cells()
    }

    fn restore_list(&mut self, reference: &[[f64; 3]]) -> Result<()> {
        self.inner.restore_list(reference)
    }

    fn list_builds(&self) -> usize {
        self.inner.list_builds()
    }

    fn systems(&self) -> usize {
        self.inner.systems()
    }

    fn stresses(&mut self, positions: &Tensor) -> Result<Vec<Option<crate::stress::Matrix3>>> {
        self.inner.stresses(positions)
    }

    fn retain_systems(&mut self, keep: &[bool]) -> Result<()> {
        self.inner.retain_systems(keep)
    }
}
