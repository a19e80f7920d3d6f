//! The PaiNN student (Schütt, Unke, Gastegger, ICML 2021).

mod backend;
mod config;
mod fused;
mod init;
mod message;
mod painn;
mod radial;
mod readout;
mod update;

pub use backend::Backend;
pub use config::PainnConfig;
pub use fused::{FusedForward, FusedPainn, LayeredPass, ShellCall};
pub use init::init_varmap;
pub use painn::{EdgeGeometry, Painn, PainnInputs};
pub use radial::{cosine_cutoff, gaussian_rbf};
