//! Restart files: everything a killed run needs to continue bit for bit (on the CPU) — the
//! state, the Langevin RNG position, the neighbour-list reference, how far each output file
//! had been written and how its last record ended — as JSON with exactly round-tripping
//! floats, written atomically. Output paths are stored relative to the restart file's folder,
//! so that a copied run folder continues in the copy.

use super::npt::BarostatState;
use super::output::Tail;
use super::settings::{MdOutputs, MdSettings};
use crate::error::{Error, Result};
use crate::fsutil::{read_json, write_json};
use crate::structure::Lattice;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const RESTART_FORMAT: &str = "mlff-md-restart";
/// Version 2 added the run id, the outputs' last records and relative paths; version 1 files
/// (absolute paths) still load.
pub const RESTART_VERSION: u32 = 2;

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
    /// The trajectory's and the log's last record up to their recorded lengths.
    #[serde(default)]
    pub traj_tail: Option<Tail>,
    #[serde(default)]
    pub log_tail: Option<Tail>,
    /// The same for every restart file of one run, branches get a new one.
    #[serde(default)]
    pub run_id: Option<String>,
    pub max_bond_deviation: f64,
    pub unstable_at_step: Option<u64>,
    pub list_builds: usize,
    /// What the caller needs to rebuild the force provider (model path and hash, ops, dtype).
    pub caller: serde_json::Value,
    /// NPT runs: the barostat's state (`cell` above is its cell).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub barostat: Option<BarostatState>,
}

impl Restart {
    /// Writes the file atomically, with the output paths relative to its folder.
    pub fn save(&self, path: &Path) -> Result<()> {
        let mut r = self.clone();
        outputs_relative(&mut r.settings.outputs, path);
        write_json(path, &r)
    }

    /// Reads and checks a restart file: format, version, array lengths, finite values.
    pub fn load(path: &Path) -> Result<Self> {
        let mut r: Restart = read_json(path, "an mlff md restart file")?;
        let bad = |msg: String| Error::Md(format!("restart file {}: {msg}", path.display()));
        if r.format != RESTART_FORMAT || !(1..=RESTART_VERSION).contains(&r.version) {
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
        outputs_absolute(&mut r.settings.outputs, path);
        Ok(r)
    }
}

/// The output paths of `outs` made relative to the folder of the restart file `path`.
pub(super) fn outputs_relative(outs: &mut MdOutputs, path: &Path) {
    let folder = folder_of(path);
    for p in [&mut outs.traj, &mut outs.log, &mut outs.restart]
        .into_iter()
        .flatten()
    {
        *p = relative_to(p, &folder);
    }
}

/// The relative output paths of `outs` resolved against the folder of the restart file `path`.
pub(super) fn outputs_absolute(outs: &mut MdOutputs, path: &Path) {
    let folder = folder_of(path);
    for p in [&mut outs.traj, &mut outs.log, &mut outs.restart]
        .into_iter()
        .flatten()
    {
        if p.is_relative() {
            *p = folder.join(&*p);
        }
    }
}

/// A new run id (16 hex digits from the operating system's randomness).
pub fn new_run_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// The absolute, link-free folder of `path` (as given where it cannot be resolved).
fn folder_of(path: &Path) -> PathBuf {
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    folder
        .canonicalize()
        .or_else(|_| std::path::absolute(folder))
        .unwrap_or_else(|_| folder.to_path_buf())
}

/// `path` relative to the folder `base` (both resolved); as given where they share no root.
fn relative_to(path: &Path, base: &Path) -> PathBuf {
    let Some(name) = path.file_name() else {
        return path.to_path_buf();
    };
    let dir = folder_of(path);
    let (a, b): (Vec<_>, Vec<_>) = (dir.components().collect(), base.components().collect());
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    if common == 0 {
        return dir.join(name);
    }
    let mut out = PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &a[common..] {
        out.push(c);
    }
    out.join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_paths_are_stored_relative_to_the_restart_folder() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        std::fs::create_dir_all(run.join("out")).unwrap();
        let base = folder_of(&run.join("r.json"));
        assert_eq!(
            relative_to(&run.join("t.extxyz"), &base),
            Path::new("t.extxyz")
        );
        assert_eq!(
            relative_to(&run.join("out/l.jsonl"), &base),
            Path::new("out/l.jsonl")
        );
        let up = dir.path().join("elsewhere.extxyz");
        assert_eq!(relative_to(&up, &base), Path::new("../elsewhere.extxyz"));
    }
}
