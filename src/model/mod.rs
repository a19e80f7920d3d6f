//! The PaiNN student (Schütt, Unke, Gastegger, ICML 2021).

mod config;
mod fused;
mod init;
mod message;
mod painn;
mod radial;
mod readout;
mod update;

pub use config::PainnConfig;
pub use fused::{
    FusedPainn, ATOM_SPLIT_MAX_ATOMS, ATOM_SPLIT_MIN_ATOMS, FILTER_ROWS_FROM_EDGES,
    FILTER_ROWS_MAX_BYTES, ONE_KERNEL_MAX_ATOMS, ONE_KERNEL_MAX_BLOCKS,
};
pub use init::init_varmap;
pub use painn::{Painn, PainnInputs};
pub use radial::{cosine_cutoff, gaussian_rbf};
