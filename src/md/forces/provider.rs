//! The [`ForceProvider`] trait MD takes its forces from, and [`CalculatorForces`], the provider
//! over any [`Calculator`]. Names the integrator (a provider may run a whole step) but not the
//! step that drives a provider (`md::step`), so the dependency runs one way.

use crate::calculator::Calculator;
use crate::error::{Error, Result};
use crate::md::integrator::{Integrator, NextStep, State};
use crate::md::positions::{device_positions, host_positions};
use crate::phase::{Phase, PhaseClock};
use crate::stress::Matrix3;
use crate::structure::{Batch, Lattice, Structure};
use candle_core::{Device, Tensor};

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

    /// Independent systems the provider computes in one call (energies come as \[S\] when
    /// more than one).
    fn systems(&self) -> usize {
        1
    }

    /// Keeps the systems where `keep` is true, dropping the others from every later call (a
    /// batch run freezes a system this way); providers of one system cannot.
    fn retain_systems(&mut self, keep: &[bool]) -> Result<()> {
        Err(Error::Md(format!(
            "this force provider holds one system; asked to keep {} of {}",
            keep.iter().filter(|&&k| k).count(),
            keep.len()
        )))
    }

    /// The stress (eV/Å³, ASE's sign) of each of the provider's systems at `positions`
    /// ([N, 3] f64 on the device): `None` for a system without a cell periodic along all
    /// three axes, and for every system of a provider that cannot compute one.
    fn stresses(&mut self, _positions: &Tensor) -> Result<Vec<Option<Matrix3>>> {
        Ok(vec![None; self.systems()])
    }

    /// Energy, forces and each system's stress at `positions` in one call (an NPT step needs
    /// all three). By default [`evaluate`](Self::evaluate) then [`stresses`](Self::stresses).
    fn evaluate_with_stress(
        &mut self,
        positions: &mut Tensor,
    ) -> Result<(Evaluation, Vec<Option<Matrix3>>)> {
        let evaluation = self.evaluate(positions)?;
        let stresses = self.stresses(positions)?;
        Ok((evaluation, stresses))
    }

    /// Gives every system its new cell, after the caller moved the atoms with it (an NPT step
    /// scales positions and cell together). Providers that cannot follow a cell refuse.
    fn set_cells(&mut self, _cells: &[Lattice]) -> Result<()> {
        Err(Error::Md(
            "this force provider cannot change its cell (no constant-pressure MD)".into(),
        ))
    }

    /// The cell of the one system the neighbour list was built in, where it has a list and
    /// the cell may have moved since (NPT; for restart files).
    fn list_cell(&self) -> Option<Lattice> {
        None
    }

    /// [`list_cell`](Self::list_cell) of every system of a batch, in batch order.
    fn list_cells(&self) -> Option<Vec<Lattice>> {
        self.list_cell().map(|c| vec![c])
    }

    /// Neighbour-list builds so far (0 for providers without a list).
    fn list_builds(&self) -> usize {
        0
    }

    /// Steps run as one kernel launch each (integrator and forces in one kernel) so far.
    fn one_launch_steps(&self) -> u64 {
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
    /// list no longer holds). `next`, where the caller asks for the step after this one
    /// straight away, lets the provider queue that step before it reads this one's check.
    fn step_captured(
        &mut self,
        _integrator: &Integrator,
        _state: &mut State,
        _noise: Option<&[f64]>,
        _next: Option<NextStep>,
    ) -> Result<bool> {
        Ok(false)
    }
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
        let pred = self.calculator.compute(&self.at(positions)?)?;
        Ok(Evaluation {
            energy: Tensor::new(pred.energies[0], &self.device)?,
            forces: device_positions(&pred.forces[0], &self.device)?,
        })
    }

    fn stresses(&mut self, positions: &Tensor) -> Result<Vec<Option<Matrix3>>> {
        let got = self.calculator.compute_with_stress(&self.at(positions)?)?;
        Ok(got.stresses)
    }

    fn evaluate_with_stress(
        &mut self,
        positions: &mut Tensor,
    ) -> Result<(Evaluation, Vec<Option<Matrix3>>)> {
        let got = self.calculator.compute_with_stress(&self.at(positions)?)?;
        let evaluation = Evaluation {
            energy: Tensor::new(got.prediction.energies[0], &self.device)?,
            forces: device_positions(&got.prediction.forces[0], &self.device)?,
        };
        Ok((evaluation, got.stresses))
    }

    fn set_cells(&mut self, cells: &[Lattice]) -> Result<()> {
        match (cells, self.template.cell.is_some()) {
            ([cell], true) => {
                self.template.cell = Some(*cell);
                Ok(())
            }
            _ => Err(Error::Md(format!(
                "one periodic system takes one cell, got {} cells",
                cells.len()
            ))),
        }
    }
}

impl<C: Calculator> CalculatorForces<C> {
    /// The template at `positions` (copied to the host), as a batch of one.
    fn at(&self, positions: &Tensor) -> Result<Batch> {
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
        Batch::from_one(s)
    }
}
