//! Training a PaiNN student on teacher labels: loss on energies per atom and forces (through
//! second-order backprop), AdamW, warm-up + cosine or plateau schedule, gradient clipping, EMA
//! of the weights, per-element reference energies and scale/shift fitted before training.
//!
//! `trainer` runs the loop, `gradients` takes a batch's loss and gradients, `metrics` scores
//! the validation frames, `state` saves and restores checkpoints and training state.

mod adamw;
mod collective;
mod config;
mod data;
mod force_gradient;
mod fused_step;
#[cfg(test)]
mod gather_tests;
mod gradients;
mod hessian;
mod labels;
mod metrics;
mod ranks;
mod reference;
mod replicas;
mod resident;
mod schedule;
mod state;
mod step_graph;
mod trainer;
mod variables;

pub use adamw::AdamW;
pub use config::TrainConfig;
pub use data::{split_by_trajectory, Dataset};
pub use force_gradient::ForceGradient;
pub use hessian::{hessian_vector_products, hvp_label, HvpLabel};
pub use metrics::Metrics;
pub use reference::{composition, fit_reference_energies, fit_scale_shift};
pub use schedule::{LrSchedule, Schedule};
pub use trainer::Trainer;
