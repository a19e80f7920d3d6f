//! A whole MD step as a CUDA graph: kick, drift (or A O A with uploaded noise), the Verlet
//! displacement check, the fused energy+forces call on the neighbour list of a
//! [`ForceGraph`], and the closing kick, replayed with one launch.
//!
//! Three graphs go round a ring of three sets of state buffers (A → B, B → C, C → A), so a
//! replay never overwrites the state it starts from, nor does the replay queued behind it:
//! when the check finds an atom beyond half the skin (or a value that is not finite), the step
//! is thrown away and redone op by op, which rebuilds the list. The host reads two numbers per
//! step (the check), and where the caller runs steps back to back it queues the next replay
//! before it reads them, so the device does not wait for the host between steps.
//!
//! Below the force providers (the PaiNN provider captures and owns one), so it names neither
//! them nor their module. Each replay is few launches: the step up to the force call into a
//! scratch, the check into its slot, the force call, and the closing kick written with the
//! positions, forces and energies into the next state's one buffer.

use super::integrator::{Ensemble, Integrator, State};
use crate::calculator::PainnCalculator;
use crate::error::Result;
use crate::graph::{capture_graph, launch, ForceGraph, Graph, Readback};
use crate::ops::{md_advance_into, md_displacement2_into, md_finish_into};
use candle_core::{DType, Tensor, Var};

/// One set of state buffers: positions, velocities, forces (3N each) and energies (S) packed
/// in one buffer, which a replay writes with one launch, and the state's tensors as views of
/// it.
struct Buffers {
    packed: Var,
    positions: Tensor,
    velocities: Tensor,
    forces: Tensor,
    energy: Tensor,
}

impl Buffers {
    fn of(state: &State) -> Result<Self> {
        let packed = Var::from_tensor(&pack(state)?)?;
        let t = packed.as_tensor();
        let n = state.positions.dim(0)?;
        let rows = |k: usize| t.narrow(0, 3 * n * k, 3 * n)?.reshape((n, 3));
        let (positions, velocities, forces) = (rows(0)?, rows(1)?, rows(2)?);
        let energy =
            (t.narrow(0, 9 * n, state.energy.elem_count())?).reshape(state.energy.shape())?;
        Ok(Self {
            packed,
            positions,
            velocities,
            forces,
            energy,
        })
    }

    fn load(&self, state: &State) -> Result<()> {
        Ok(self.packed.set(&pack(state)?)?)
    }

    /// Whether `state`'s tensors are these buffers' (the state a replay left).
    fn holds(&self, state: &State) -> bool {
        state.positions.id() == self.positions.id()
            && state.velocities.id() == self.velocities.id()
            && state.forces.id() == self.forces.id()
            && state.energy.id() == self.energy.id()
    }

    fn store(&self, state: &mut State) {
        state.positions = self.positions.clone();
        state.velocities = self.velocities.clone();
        state.forces = self.forces.clone();
        state.energy = self.energy.clone();
    }
}

/// `state` as one f64 buffer: positions, velocities, forces, energies (a new tensor).
fn pack(state: &State) -> Result<Tensor> {
    let parts = [
        &state.positions,
        &state.velocities,
        &state.forces,
        &state.energy,
    ]
    .map(|t| t.to_dtype(DType::F64)?.flatten_all());
    let [x, v, f, e] = parts;
    Ok(Tensor::cat(&[x?, v?, f?, e?], 0)?)
}

/// The captured steps of one integrator with one force graph.
pub(crate) struct StepGraph {
    /// `graphs[k]` steps from `buffers[k]` to `buffers[(k + 1) % RING]`.
    graphs: Vec<Graph>,
    buffers: Vec<Buffers>,
    /// The buffer set holding the current state.
    current: usize,
    /// The step from `buffers[current]` queued already, with the noise it took (none: NVE).
    queued: Option<Option<Vec<f64>>>,
    /// Per graph: Σ and max over atoms of |x − reference|² after its drift, [2] f64, and the
    /// room its copy to the host lands in.
    displacement: Vec<Var>,
    readback: Vec<Readback>,
    /// Positions at the last neighbour-list build, [N, 3] f64.
    reference: Var,
    /// The replays' x' and v' up to the force call, 6N f64 (written and read by each; held
    /// here so that its memory outlives the graphs).
    _scratch: Var,
    /// Per graph, one step's standard normals for the Langevin noise, [N, 3] f64 (NVT only).
    noise: Option<Vec<Var>>,
    /// What it was captured for (dt, ensemble): another integrator needs a new capture.
    integrator: Integrator,
    /// The largest displacement (Å) of the last two checked steps since the list's build,
    /// latest last: whether a queued step is likely to find the list holding.
    recent: [Option<f64>; 2],
    /// Steps run as replays, and of the steps queued ahead, those used and thrown away.
    replayed: u64,
    queued_used: u64,
    queued_thrown: u64,
}

/// Buffer sets in the ring: a replay writes the set after the one it starts from, and the step
/// queued behind it the set after that, so neither overwrites the state the caller holds.
const RING: usize = 3;

impl StepGraph {
    /// Captures the ring's graphs of `integrator`'s step around `force` (which `calc` made),
    /// starting from `state`, with the list built at `reference`.
    pub(crate) fn capture(
        calc: &PainnCalculator,
        force: &ForceGraph,
        integrator: &Integrator,
        state: &State,
        reference: &Tensor,
    ) -> Result<Self> {
        let dev = calc.device();
        let buffers = (0..RING)
            .map(|_| Buffers::of(state))
            .collect::<Result<Vec<_>>>()?;
        let per_graph = |t: &Tensor| -> Result<Vec<Var>> {
            (0..RING)
                .map(|_| Ok(Var::from_tensor(&t.zeros_like()?)?))
                .collect()
        };
        let displacement = per_graph(&Tensor::zeros(2, DType::F64, dev)?)?;
        let readback = (0..RING)
            .map(|_| Readback::new(dev, 2))
            .collect::<Result<Vec<_>>>()?;
        let reference = Var::from_tensor(reference)?;
        let noise = match integrator.ensemble() {
            Ensemble::Nvt { .. } => Some(per_graph(&state.positions.to_dtype(DType::F64)?)?),
            Ensemble::Nve => None,
        };
        let n = state.positions.dim(0)?;
        // x' and v' of the step up to the force call (the replays run one after another).
        let scratch = Var::from_tensor(&Tensor::zeros(6 * n, DType::F64, dev)?)?;
        let mut graphs = Vec::with_capacity(RING);
        for k in 0..RING {
            let (from, to) = (&buffers[k], &buffers[(k + 1) % RING]);
            let xi = noise.as_ref().map(|n| n[k].as_tensor());
            graphs.push(capture_graph(dev, || {
                let (hk, mid) = (integrator.half_kick(), scratch.as_tensor());
                let langevin = integrator.langevin(xi)?;
                let (x, v, f) = (&from.positions, &from.velocities, &from.forces);
                md_advance_into(mid, x, v, f, hk, integrator.dt(), langevin)?;
                let x = mid.narrow(0, 0, 3 * n)?.reshape((n, 3))?;
                let v = mid.narrow(0, 3 * n, 3 * n)?.reshape((n, 3))?;
                md_displacement2_into(displacement[k].as_tensor(), &x, reference.as_tensor())?;
                let (energies, forces) = force.call_at(calc, &x)?;
                md_finish_into(to.packed.as_tensor(), &x, &v, &forces, hk, &energies)?;
                Ok(())
            })?);
        }
        Ok(Self {
            graphs,
            buffers,
            current: 0,
            queued: None,
            displacement,
            readback,
            reference,
            _scratch: scratch,
            noise,
            integrator: integrator.clone(),
            recent: [None; 2],
            replayed: 0,
            queued_used: 0,
            queued_thrown: 0,
        })
    }

    /// Whether this graph runs `integrator`'s steps.
    pub(crate) fn fits(&self, integrator: &Integrator) -> bool {
        self.integrator.dt() == integrator.dt()
            && self.integrator.ensemble() == integrator.ensemble()
    }

    /// Steps run as replays so far.
    pub(crate) fn replayed(&self) -> u64 {
        self.replayed
    }

    /// Of the steps queued behind another, those that were used and those thrown away (their
    /// list no longer held, or the step before them was redone).
    pub(crate) fn queued(&self) -> (u64, u64) {
        (self.queued_used, self.queued_thrown)
    }

    /// Positions of a new neighbour-list build.
    pub(crate) fn set_reference(&mut self, reference: &Tensor) -> Result<()> {
        self.forget_queued();
        self.recent = [None; 2];
        Ok(self.reference.set(reference)?)
    }

    /// One replayed step from `state` with `noise` (NVT). Ok(false), `state` untouched, when
    /// some atom moved beyond `limit2` (squared, Å²) from the reference or a value is not
    /// finite: the caller then redoes the step op by op.
    ///
    /// `next`, where the caller will ask for the step after this one straight away (with that
    /// noise, none for NVE), lets it be queued before this step's check is read, so that the
    /// device has work while the host reads and decides; it is thrown away where this step
    /// does not hold, and queued at all only where the last checks leave the list room for it.
    pub(crate) fn step(
        &mut self,
        state: &mut State,
        noise: Option<&[f64]>,
        next: Option<Option<&[f64]>>,
        limit2: f64,
    ) -> Result<bool> {
        let k = self.current;
        if !self.buffers[k].holds(state) {
            self.forget_queued();
            self.buffers[k].load(state)?;
        }
        match self.queued.take() {
            Some(queued) if queued.as_deref() == noise => self.queued_used += 1,
            Some(_) => {
                self.queued_thrown += 1;
                self.launch(k, noise)?;
            }
            None => self.launch(k, noise)?,
        }
        if let Some(next_noise) = next.filter(|_| self.room_for_one_more(limit2)) {
            self.launch((k + 1) % RING, next_noise)?;
            self.queued = Some(next_noise.map(<[f64]>::to_vec));
        }
        let d = self.readback[k].wait()?;
        if !(d[0].is_finite() && d[1] <= limit2) {
            self.forget_queued();
            return Ok(false);
        }
        self.recent = [self.recent[1], Some(d[1].sqrt())];
        self.current = (k + 1) % RING;
        self.buffers[self.current].store(state);
        state.step += 1;
        self.replayed += 1;
        Ok(true)
    }

    /// Queues the replay of `graphs[k]` with `noise` and the copy of its check.
    fn launch(&mut self, k: usize, noise: Option<&[f64]>) -> Result<()> {
        if let (Some(buffers), Some(xi)) = (&self.noise, noise) {
            let buffer = &buffers[k];
            buffer.set(&Tensor::from_slice(xi, buffer.shape(), buffer.device())?)?;
        }
        launch(&self.graphs[k])?;
        self.readback[k].start(self.displacement[k].as_tensor())
    }

    /// A queued step is no longer wanted: it runs on and writes a buffer set nobody reads.
    fn forget_queued(&mut self) {
        if self.queued.take().is_some() {
            self.queued_thrown += 1;
        }
    }

    /// Whether the list likely holds two steps past the last checked one (the step running
    /// and the one to queue behind it), the largest displacement growing as over the last
    /// two checks; without two checks since the build, yes.
    fn room_for_one_more(&self, limit2: f64) -> bool {
        match self.recent {
            [Some(a), Some(b)] => b + 3.0 * (b - a).max(0.0) < limit2.sqrt(),
            _ => true,
        }
    }
}
