//! Every performance threshold and switch of the engine, in one place.
//!
//! A [`Tuning`] is read once per process (defaults, then `--tuning FILE`, then the variable
//! `MLFF_TUNING=key=value,...` for quick experiments) and passed explicitly to the model and to
//! MD; [`crate::plan`] turns it, with the model's shape, the system's size and the device, into
//! the code path a call takes. No other module reads the environment (a test guards it).
//! Results never depend on the tuning, only speed and memory: every path gives the same
//! energies and forces to rounding. The measurements behind each default are in BENCHMARKS.md
//! ("Tuning defaults"); the one-line reasons below say what each trades.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// The environment variable read for quick experiments: `key=value` pairs separated by commas.
pub const TUNING_VARIABLE: &str = "MLFF_TUNING";

/// The `--tuning` flag's help.
pub const HELP: &str = "A JSON file of performance thresholds and switches (any subset of the \
    keys; the rest keep their defaults). MLFF_TUNING=key=value,... overrides single keys on \
    top. Results do not depend on it, only speed and memory.";

/// Declares [`Tuning`] with its defaults and keeps each field's doc line as its reason.
macro_rules! tuning {
    ($($(#[doc = $doc:literal])+ $name:ident: $ty:ty = $default:expr,)+) => {
        /// The engine's thresholds and switches (see the module docs). Field docs give each
        /// one's reason; [`Tuning::reasons`] returns them for reports.
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct Tuning {
            $($(#[doc = $doc])+ pub $name: $ty,)+
        }

        impl Default for Tuning {
            fn default() -> Self {
                Self { $($name: $default,)+ }
            }
        }

        impl Tuning {
            /// (key, one-line reason) of every field, in declaration order.
            pub fn reasons() -> Vec<(&'static str, String)> {
                vec![$((stringify!($name), [$($doc),+].join(" ").trim().to_string()),)+]
            }
        }
    };
}

tuning! {
    /// Molecules of up to this many atoms run as the feature-split kernel on CUDA (one launch,
    /// features split over the blocks): below it launch gaps, not arithmetic, are the time.
    feature_split_max_atoms: usize = 64,
    /// Thread blocks the feature-split kernel uses at most: more blocks own fewer features each
    /// while the barriers stay, and past 64 the barriers win.
    feature_split_max_blocks: usize = 64,
    /// Systems from this many atoms run as the atom-split kernel on CUDA where it fits (atoms
    /// split over the blocks: 4 barriers a block instead of 30); smaller ones leave it idle.
    atom_split_min_atoms: usize = 32,
    /// ... up to this many atoms (null: wherever it fits its shared memory).
    atom_split_max_atoms: Option<usize> = None,
    /// Dense layers of at most this many rows run as our row-block kernels on CUDA: cuBLAS's
    /// launch and tile shapes cost more than they save on molecule-sized inputs.
    dense_kernel_max_rows: usize = 512,
    /// Dense layers of this many rows and more run on tensor cores in split f16 (f32 on CUDA),
    /// an MLP in one launch instead of cuBLAS and a bias+SiLU kernel.
    dense_tensor_cores_from_rows: usize = 513,
    /// ... up to this many rows (the largest measured; cuBLAS above it).
    dense_tensor_cores_until_rows: usize = 30_000,
    /// Systems from this many atoms run each update block as one launch each way on CUDA (no
    /// mixed/context tensors between launches); smaller ones measured no gain.
    update_one_launch_from_atoms: usize = 2_000,
    /// The first interaction block as sums per sending element (exact: its context is the
    /// element's, its vector features zero), instead of per-edge work.
    first_block_sums: bool = true,
    /// Edge count from which each block's filter rows W(r) [E, 3F] are one matrix product
    /// instead of being formed per edge inside the interaction kernels (null: 8,192 on CUDA;
    /// on the CPU every size, where the product's SIMD beats forming the filter edge by edge
    /// in the forward and again in the adjoint from the smallest molecule on).
    filter_rows_from_edges: Option<usize> = None,
    /// Edge count from which CUDA forms the filter in the tiled kernels again (null: never in
    /// f32, where the tensor-core tiles beat the rows at every size; 100,000 in f64).
    filter_rows_until_edges: Option<usize> = None,
    /// Filter rows of all blocks up to this many bytes are kept for the adjoint instead of
    /// being made again (one product per block less, at the cost of memory).
    filter_rows_keep_bytes: usize = 3 << 30,
    /// Edge count from which the interaction runs as the tiled kernels on CUDA (null: 4,096 in
    /// f32 on tensor cores, 8,192 in f64); fewer edges leave most multiprocessors idle.
    tile_from_edges: Option<usize> = None,
    /// Edge count from which the untiled adjoint gives each warp all features of an edge: with
    /// fewer edges, one warp per 32 features keeps the multiprocessors busy.
    adjoint_warp_per_edge_from_edges: usize = 8_192,
    /// Device neighbour lists of periodic cells with at least this many atoms sort the atoms
    /// into bins first (each atom tests the atoms of the adjacent bins, not all atoms).
    device_list_bins_from_atoms: usize = 2_500,
    /// Device neighbour lists of at least this many edges are pruned to the cutoff before each
    /// eager MD call or domain call: the skin's extra pairs cost more than the four pruning
    /// launches.
    prune_from_edges: usize = 8_192,
    /// `--graphs auto` captures MD steps for neighbour lists of up to this many edges; beyond
    /// it the kernels, not their launches, are the time and each re-capture costs calls.
    graph_auto_max_edges: usize = 32_768,
    /// MD on CUDA reads the neighbour-list checks of a run of steps at once instead of every
    /// step (a step whose list no longer held is redone: same trajectory).
    defer_list_checks: bool = true,
    /// MD steps whose force call is one kernel run as one launch with the integrator folded
    /// in (same arithmetic, rounding for rounding).
    one_launch_steps: bool = true,
    /// The Verlet skin (Å) of a domain over many calls, as LAMMPS's pair style makes them
    /// (null: 0 on the CPU, where rebuilding is cheaper than the skin's pairs, 1 on CUDA, where
    /// a host list at every call would be the time).
    domain_skin: Option<f64> = None,
    /// A domain's ghost shells shrink block by block (block k updates the atoms within
    /// blocks − 1 − k list cutoffs of its own): the same energies and forces for less work
    /// (null: on the CPU; off on CUDA, where two H200s ran 11% faster with them at 98,304 atoms
    /// and 4% slower at 943,296: docs/bench-log/76).
    domain_shells: Option<bool> = None,
    /// `mlff distill` trains its committee's students side by side on a CUDA device (a thread
    /// each, one stream each): a molecule-sized training step leaves most of the GPU idle. On
    /// the CPU they train one after another (one training takes every core already).
    committee_side_by_side: bool = true,
}

/// A tuning that could not be read: names the file or variable and the key.
#[derive(Debug, thiserror::Error)]
pub enum TuningError {
    #[error("{origin}: cannot read the tuning file: {error}")]
    Read { origin: String, error: String },
    #[error("{origin}: {error} (keys: {keys})")]
    Invalid {
        origin: String,
        error: String,
        keys: String,
    },
}

impl Tuning {
    /// Defaults, then the JSON object in `file` (where given), then `MLFF_TUNING`: what every
    /// command that computes runs with.
    pub fn load(file: Option<&Path>) -> Result<Self, TuningError> {
        let mut tuning = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| TuningError::Read {
                    origin: path.display().to_string(),
                    error: e.to_string(),
                })?;
                Self::from_json(&text, &path.display().to_string())?
            }
            None => Self::default(),
        };
        if let Ok(pairs) = std::env::var(TUNING_VARIABLE) {
            tuning = tuning.with_pairs(&pairs, TUNING_VARIABLE)?;
        }
        Ok(tuning)
    }

    /// A JSON object of some or all fields over the defaults; `source` names it in errors.
    pub fn from_json(text: &str, source: &str) -> Result<Self, TuningError> {
        serde_json::from_str(text).map_err(|e| invalid(source, e.to_string()))
    }

    /// `self` with `key=value` pairs (comma-separated; values as JSON: numbers, true/false,
    /// null) applied; `source` names them in errors.
    pub fn with_pairs(&self, pairs: &str, source: &str) -> Result<Self, TuningError> {
        let mut object = match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(m)) => m,
            _ => return Err(invalid(source, "cannot represent the tuning".into())),
        };
        for pair in pairs.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((key, value)) = pair.split_once('=') else {
                return Err(invalid(source, format!("`{pair}` is not key=value")));
            };
            let key = key.trim();
            if !object.contains_key(key) {
                return Err(invalid(source, format!("unknown key `{key}`")));
            }
            let value = value.trim().replace('_', "");
            let parsed = serde_json::from_str(&value).map_err(|_| {
                invalid(
                    source,
                    format!("{key}: `{value}` is not a number, true, false or null"),
                )
            })?;
            object.insert(key.to_string(), parsed);
        }
        serde_json::from_value(serde_json::Value::Object(object))
            .map_err(|e| invalid(source, e.to_string()))
    }

    /// The fields that differ from the defaults, as `key=value` pairs (empty: all defaults).
    pub fn changes(&self) -> Vec<String> {
        let (Ok(serde_json::Value::Object(mine)), Ok(serde_json::Value::Object(base))) = (
            serde_json::to_value(self),
            serde_json::to_value(Self::default()),
        ) else {
            return Vec::new();
        };
        mine.iter()
            .filter(|(k, v)| base.get(*k) != Some(v))
            .map(|(k, v)| format!("{k}={v}"))
            .collect()
    }

    /// The edge count from which the interaction runs tiled for a precision whose tiles run
    /// on tensor cores (`tensor_cores`) or not.
    pub fn tile_from(&self, tensor_cores: bool) -> usize {
        self.tile_from_edges
            .unwrap_or(if tensor_cores { 4_096 } else { 8_192 })
    }

    /// The edge count from which the filter is one matrix product on CUDA (`cuda`) or the CPU.
    pub fn filter_rows_from(&self, cuda: bool) -> usize {
        self.filter_rows_from_edges
            .unwrap_or(if cuda { 8_192 } else { 0 })
    }

    /// The edge count from which CUDA leaves the filter rows for the tiled kernels.
    pub fn filter_rows_until(&self, tensor_cores: bool) -> usize {
        self.filter_rows_until_edges
            .unwrap_or(if tensor_cores { 0 } else { 100_000 })
    }

    /// The atom counts the atom-split kernel is tried for.
    pub fn atom_split_atoms(&self) -> std::ops::RangeInclusive<usize> {
        self.atom_split_min_atoms..=self.atom_split_max_atoms.unwrap_or(usize::MAX)
    }

    /// The row counts whose dense layers run on tensor cores.
    pub fn dense_tensor_core_rows(&self) -> std::ops::RangeInclusive<usize> {
        self.dense_tensor_cores_from_rows..=self.dense_tensor_cores_until_rows
    }
}

fn invalid(source: &str, error: String) -> TuningError {
    let keys: Vec<_> = Tuning::reasons().into_iter().map(|(k, _)| k).collect();
    TuningError::Invalid {
        origin: source.to_string(),
        error,
        keys: keys.join(", "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_and_json_override_the_defaults_and_name_bad_keys() {
        let t = Tuning::default()
            .with_pairs("feature_split_max_atoms=0, tile_from_edges=1_000", "test")
            .unwrap();
        assert_eq!(t.feature_split_max_atoms, 0);
        assert_eq!(t.tile_from_edges, Some(1000));
        assert_eq!(t.changes().len(), 2);
        let err = Tuning::default()
            .with_pairs("no_such=1", "MLFF_TUNING")
            .unwrap_err();
        assert!(err.to_string().contains("unknown key `no_such`"), "{err}");
        let err = Tuning::default()
            .with_pairs("first_block_sums=maybe", "x")
            .unwrap_err();
        assert!(err.to_string().contains("first_block_sums"), "{err}");
        let t = Tuning::from_json(r#"{"defer_list_checks": false}"#, "f.json").unwrap();
        assert!(!t.defer_list_checks && t.one_launch_steps);
        let err = Tuning::from_json(r#"{"defer_list_check": false}"#, "f.json").unwrap_err();
        assert!(
            err.to_string().starts_with("f.json: unknown field"),
            "{err}"
        );
    }

    #[test]
    fn every_field_has_a_reason_and_round_trips() {
        let reasons = Tuning::reasons();
        assert!(reasons.iter().all(|(_, r)| r.len() > 20));
        let json = serde_json::to_string(&Tuning::default()).unwrap();
        assert_eq!(Tuning::from_json(&json, "x").unwrap(), Tuning::default());
        let n_keys = serde_json::from_str::<serde_json::Value>(&json)
            .unwrap()
            .as_object()
            .unwrap()
            .len();
        assert_eq!(n_keys, reasons.len());
    }
}
