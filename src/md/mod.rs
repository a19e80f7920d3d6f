//! Molecular dynamics in ASE units (Å, eV, amu; time steps given in fs): velocity Verlet (NVE)
//! and BAOAB Langevin (NVT) on the force provider's device, Verlet neighbour lists rebuilt only
//! when some atom has moved half the skin, JSON-lines logs, extended-XYZ trajectories ASE reads
//! back (with momenta), exact restarts, and the stability and drift summary.

mod analysis;
mod barostat;
mod batch;
mod continuity;
mod forces;
mod integrator;
mod lookahead;
mod npt;
mod output;
mod positions;
pub mod potentials;
mod pressure;
mod restart;
mod run;
mod settings;
mod step;
mod step_graph;
mod summary;
pub mod validate;
mod velocities;
mod window;

pub use analysis::{
    check_separation, linear_fit, mean_std, BondDeviation, Bonds, BOND_DEVIATION_LIMIT,
    BOND_FACTOR, MIN_SEPARATION,
};
pub use barostat::{density_g_cm3, Barostat, BarostatMode};
pub use batch::{
    system_seed, system_traj, BatchLogRecord, BatchProgress, BatchRestart, BatchSimulation,
    BatchSummary, HostState, SystemRestart, SystemSummary, BATCH_RESTART_FORMAT,
};
pub(crate) use forces::DEVICE_LIST_BATCH_NPT;
pub use forces::{CalculatorForces, Evaluation, ForceProvider, ListSite, PainnForces};
pub use integrator::{Ensemble, Integrator, NextStep, State};
pub use npt::BarostatState;
pub use output::{read_log, read_log_as, LogRecord, Tail};
pub use positions::{device_positions, displacement2, host_positions};
pub use restart::{new_run_id, Restart};
pub use run::{Progress, Simulation};
pub use settings::{MdOutputs, MdSettings};
pub use summary::{MdSummary, StopReason};
pub use velocities::{
    degrees_of_freedom, kinetic_energy, masses, maxwell_boltzmann, remove_com_velocity, temperature,
};
