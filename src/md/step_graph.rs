//! A whole MD step as a CUDA graph: kick, drift (or A O A with uploaded noise), the Verlet
//! displacement check, the fused energy+forces call on the neighbour list of a
//! [`ForceGraph`], and the closing kick, replayed with one launch.
//!
//! Two graphs ping-pong between two sets of state buffers (A → B, then B → A), so a replay never
//! overwrites the state it starts from: when the check finds an atom beyond half the skin (or
//! a value that is not finite), the step is thrown away and redone op by op, which rebuilds
//! the list. The host reads two numbers per step (the check), nothing else.
//!
//! Below the force providers (the PaiNN provider captures and owns one), so it names neither
//! them nor their module: the displacement check comes from `positions`.

use super::integrator::{Ensemble, Integrator, State};
use super::positions::displacement2;
use crate::calculator::PainnCalculator;
use crate::error::Result;
use crate::graph::{capture_graph, launch, ForceGraph, Graph};
use candle_core::{DType, Tensor, Var};

/// One set of state buffers.
struct Buffers {
    positions: Var,
    velocities: Var,
    forces: Var,
    energy: Var,
}

impl Buffers {
    fn of(state: &State) -> Result<Self> {
        let var = |t: &Tensor| Var::from_tensor(&t.to_dtype(DType::F64)?);
        Ok(Self {
            positions: var(&state.positions)?,
            velocities: var(&state.velocities)?,
            forces: var(&state.forces)?,
            energy: var(&state.energy)?,
        })
    }

    fn load(&self, state: &State) -> Result<()> {
        self.positions.set(&state.positions)?;
        self.velocities.set(&state.velocities)?;
        self.forces.set(&state.forces)?;
        self.energy.set(&state.energy)?;
        Ok(())
    }

    fn store(&self, state: &mut State) {
        state.positions = self.positions.as_tensor().clone();
        state.velocities = self.velocities.as_tensor().clone();
        state.forces = self.forces.as_tensor().clone();
        state.energy = self.energy.as_tensor().clone();
    }
}

/// The captured steps of one integrator with one force graph.
pub(crate) struct StepGraph {
    graphs: Vec<Graph>,
    buffers: [Buffers; 2],
    /// The buffer set holding the current state.
    current: usize,
    /// The step whose state `buffers[current]` holds (another step: reload from the state).
    synced_step: Option<u64>,
    /// Σ and max over atoms of |x − reference|² after the last replay's drift, [2] f64.
    displacement: Var,
    /// Positions at the last neighbour-list build, [N, 3] f64.
    reference: Var,
    /// One step's standard normals for the Langevin noise, [N, 3] f64 (NVT only).
    noise: Option<Var>,
    /// What it was captured for (dt, ensemble): another integrator needs a new capture.
    integrator: Integrator,
    /// Steps run as replays.
    replayed: u64,
}

impl StepGraph {
    /// Captures both graphs of `integrator`'s step around `force` (which `calc` made), starting
    /// from `state`, with the list built at `reference`.
    pub(crate) fn capture(
        calc: &PainnCalculator,
        force: &ForceGraph,
        integrator: &Integrator,
        state: &State,
        reference: &Tensor,
    ) -> Result<Self> {
        let dev = calc.device();
        let buffers = [Buffers::of(state)?, Buffers::of(state)?];
        let displacement = Var::from_tensor(&Tensor::zeros(2, DType::F64, dev)?)?;
        let reference = Var::from_tensor(reference)?;
        let noise = match integrator.ensemble() {
            Ensemble::Nvt { .. } => Some(Var::from_tensor(&state.positions.zeros_like()?)?),
            Ensemble::Nve => None,
        };
        let mut graphs = Vec::with_capacity(2);
        for k in 0..2 {
            let (from, to) = (&buffers[k], &buffers[1 - k]);
            graphs.push(capture_graph(dev, || {
                let (x, v) = integrator.advance(
                    from.positions.as_tensor(),
                    from.velocities.as_tensor(),
                    from.forces.as_tensor(),
                    noise.as_ref().map(|n| n.as_tensor()),
                )?;
                displacement.set(&displacement2(&x, reference.as_tensor())?)?;
                force.run_on(calc, &x)?;
                to.velocities.set(&integrator.kick(&v, force.forces())?)?;
                to.positions.set(&x)?;
                to.forces.set(force.forces())?;
                to.energy.set(&force.energies().squeeze(0)?)?;
                Ok(())
            })?);
        }
        Ok(Self {
            graphs,
            buffers,
            current: 0,
            synced_step: None,
            displacement,
            reference,
            noise,
            integrator: integrator.clone(),
            replayed: 0,
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

    /// Positions of a new neighbour-list build.
    pub(crate) fn set_reference(&self, reference: &Tensor) -> Result<()> {
        Ok(self.reference.set(reference)?)
    }

    /// One replayed step from `state` with `noise` (NVT). Ok(false), `state` untouched, when
    /// some atom moved beyond `limit2` (squared, Å²) from the reference or a value is not
    /// finite: the caller then redoes the step op by op.
    pub(crate) fn step(
        &mut self,
        state: &mut State,
        noise: Option<&[f64]>,
        limit2: f64,
    ) -> Result<bool> {
        if self.synced_step != Some(state.step) {
            self.buffers[self.current].load(state)?;
        }
        if let (Some(buffer), Some(xi)) = (&self.noise, noise) {
            let dev = buffer.device();
            buffer.set(&Tensor::from_slice(xi, buffer.shape(), dev)?)?;
        }
        launch(&self.graphs[self.current])?;
        let d = self.displacement.to_vec1::<f64>()?;
        if !(d[0].is_finite() && d[1] <= limit2) {
            self.synced_step = None;
            return Ok(false);
        }
        self.current = 1 - self.current;
        self.buffers[self.current].store(state);
        state.step += 1;
        self.synced_step = Some(state.step);
        self.replayed += 1;
        Ok(true)
    }
}
