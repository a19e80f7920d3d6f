//! mlff-distiller: PaiNN student force fields on candle, CPU and CUDA. `cli` is the `mlff`
//! command itself, so that the binary and the Python package run the same code.

pub mod bench;
pub mod calculator;
pub mod checkpoint;
pub mod cli;
pub mod device;
pub mod distill;
pub mod domain;
pub mod elements;
pub mod error;
pub mod eval;
pub mod fsutil;
pub mod graph;
pub mod interrupt;
pub mod io;
pub mod md;
pub mod model;
pub mod neighbors;
pub mod ops;
pub mod phase;
pub mod plan;
pub mod plot;
pub mod profiler;
pub mod stress;
pub mod structure;
pub mod systems;
pub mod train;
pub mod tuning;
pub mod units;

pub use calculator::{Calculator, PainnCalculator, Prediction};
pub use error::{Error, Result};
pub use structure::{Batch, Structure};
pub use tuning::Tuning;
