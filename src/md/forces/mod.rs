//! Where MD gets its forces. A [`ForceProvider`] takes positions as a device tensor and returns
//! the potential energy and forces on the same device, so the MD loop never copies positions to
//! the host between log steps.
//!
//! `provider` holds the trait and the provider over any calculator; `painn` the PaiNN provider
//! with its neighbour list, and under it the graph and one-launch paths.

mod painn;
mod provider;

pub(crate) use painn::DEVICE_LIST_BATCH_NPT;
pub use painn::{ListSite, PainnForces};
pub use provider::{CalculatorForces, Evaluation, ForceProvider};
