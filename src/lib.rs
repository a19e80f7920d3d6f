//! mlff-distiller: PaiNN student force fields on candle, CPU and CUDA.

pub mod error;
pub mod structure;

pub use error::{Error, Result};
pub use structure::{Batch, Structure};
