//! Restart files: everything a killed run needs to continue bit for bit (on the CPU) — the
//! state, the Langevin RNG position, the neighbour-list reference, how far each output file
//! had been written — as JSON with exactly round-tripping floats, written atomically.

use super::settings::MdSettings;
use crate::error::{Error, Result};
use crate::fsutil::{read_json, write_json};
use crate::structure::Lattice;
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const RESTART_FORMAT: &str = "mlff-md-restart";
pub const RESTART_VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Restart {
    pub format: String,
    pub version: u32,
    pub settings: MdSettings,
    pub numbers: Vec<u8>,
    pub cell: Option<Lattice>,
    pub pbc: [bool; 3],
    /// Starting structure's bonds (i, j, length in Å) for the stability check.
    pub bonds: Vec<(u32, u32, f64)>,
    pub step: u64,
    pub positions: Vec<[f64; 3]>,
    pub velocities: Vec<[f64; 3]>,
    pub forces: Vec<[f64; 3]>,
    pub energy: f64,
    pub list_reference: Option<Vec<[f64; 3]>>,
    /// ChaCha20 word position (a u128, as text since JSON numbers are not that wide).
    pub rng_word_pos: String,
    pub traj_bytes: Option<u64>,
    pub log_bytes: Option<u64>,
    pub max_bond_deviation: f64,
    pub unstable_at_step: Option<u64>,
    pub list_builds: usize,
    /// What the caller needs to rebuild the force provider (model path and hash, ops, dtype).
    pub caller: serde_json::Value,
}

impl Restart {
    pub fn save(&self, path: &Path) -> Result<()> {
        write_json(path, self)
    }

    /// Reads and checks a restart file: format, version, array lengths, finite values.
    pub fn load(path: &Path) -> Result<Self> {
        let r: Restart = read_json(path, "an mlff md restart file")?;
        let bad = |msg: String| Error::Md(format!("restart file {}: {msg}", path.display()));
        if r.format != RESTART_FORMAT || r.version != RESTART_VERSION {
            return Err(bad(format!(
                "format `{}` version {}, this build reads `{RESTART_FORMAT}` version \
                 {RESTART_VERSION}",
                r.format, r.version
            )));
        }
        let n = r.numbers.len();
        for (name, rows) in [
            ("positions", &r.positions),
            ("velocities", &r.velocities),
            ("forces", &r.forces),
        ] {
            if rows.len() != n {
                return Err(bad(format!("{n} atoms but {} {name}", rows.len())));
            }
            if let Some(i) = rows.iter().position(|p| p.iter().any(|x| !x.is_finite())) {
                return Err(bad(format!("atom {i} has non-finite {name}")));
            }
        }
        if r.list_reference.as_ref().is_some_and(|l| l.len() != n) {
            return Err(bad(
                "neighbour-list reference has the wrong atom count".into()
            ));
        }
        if r.rng_word_pos.parse::<u128>().is_err() {
            return Err(bad(format!(
                "rng_word_pos `{}` is not an integer",
                r.rng_word_pos
            )));
        }
        Ok(r)
    }
}
