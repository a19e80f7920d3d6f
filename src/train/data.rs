//! Labelled data for training and evaluation: loading with checks, hashing, splitting by
//! trajectory.

use crate::error::{Error, Result};
use crate::fsutil::sha256_hex;
use crate::io::parse_extxyz_bytes;
use crate::model::PainnConfig;
use crate::structure::Structure;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One file a dataset was read from (kept in checkpoint provenance).
#[derive(Clone, Debug, Serialize)]
pub struct DataSource {
    pub path: PathBuf,
    /// SHA-256 of the file's bytes (empty for frames made in memory).
    pub sha256: String,
    pub frames: usize,
}

/// Frames with energy and force labels, read from one or more files.
#[derive(Debug)]
pub struct Dataset {
    pub sources: Vec<DataSource>,
    pub frames: Vec<Structure>,
    /// (source, frame index within that source) of every frame, for error messages.
    origin: Vec<(usize, usize)>,
}

impl Dataset {
    /// Reads an extended-XYZ file and checks that every frame has finite energy and force
    /// labels for every atom.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.into(),
            cause: source,
        })?;
        let mut ds = Self::from_frames(path, parse_extxyz_bytes(&bytes, path)?)?;
        ds.sources[0].sha256 = sha256_hex(&bytes);
        Ok(ds)
    }

    /// Reads several files (e.g. one per molecule) as one dataset.
    pub fn load_all(paths: &[PathBuf]) -> Result<Self> {
        let mut all = Self {
            sources: Vec::new(),
            frames: Vec::new(),
            origin: Vec::new(),
        };
        for path in paths {
            let ds = Self::load(path)?;
            let base = all.sources.len();
            all.origin
                .extend(ds.origin.iter().map(|&(s, k)| (base + s, k)));
            all.sources.extend(ds.sources);
            all.frames.extend(ds.frames);
        }
        if all.frames.is_empty() {
            return Err(Error::Train("no data files given".into()));
        }
        Ok(all)
    }

    /// A dataset from frames already in memory (tests, splits).
    pub fn from_frames(path: &Path, frames: Vec<Structure>) -> Result<Self> {
        let ds = Self {
            sources: vec![DataSource {
                path: path.into(),
                sha256: String::new(),
                frames: frames.len(),
            }],
            origin: (0..frames.len()).map(|k| (0, k)).collect(),
            frames,
        };
        ds.check_labels()?;
        Ok(ds)
    }

    /// The frames `idx`, keeping the sources (for provenance) and each frame's origin.
    pub fn select(&self, idx: &[usize]) -> Self {
        Self {
            sources: self.sources.clone(),
            frames: idx.iter().map(|&k| self.frames[k].clone()).collect(),
            origin: idx.iter().map(|&k| self.origin[k]).collect(),
        }
    }

    /// The files, joined for messages.
    pub fn describe(&self) -> String {
        let names: Vec<String> = self
            .sources
            .iter()
            .map(|s| s.path.display().to_string())
            .collect();
        names.join(", ")
    }

    /// The file and the frame within it of frame `k` of the set.
    pub fn origin_of(&self, k: usize) -> (PathBuf, usize) {
        let (source, frame) = self.origin.get(k).copied().unwrap_or((0, k));
        (self.sources[source].path.clone(), frame)
    }

    fn err(&self, frame: usize, msg: String) -> Error {
        let (source, frame) = self.origin.get(frame).copied().unwrap_or((0, frame));
        Error::Data {
            path: self.sources[source].path.clone(),
            frame,
            msg,
        }
    }

    fn check_labels(&self) -> Result<()> {
        if self.frames.is_empty() {
            return Err(self.err(0, "the file holds no frames".into()));
        }
        for (k, s) in self.frames.iter().enumerate() {
            s.validate().map_err(|e| self.err(k, e.to_string()))?;
            match s.energy {
                None => return Err(self.err(k, "no `energy` label".into())),
                Some(e) if !e.is_finite() => {
                    return Err(self.err(k, format!("energy label is {e}")))
                }
                _ => {}
            }
            let forces = s
                .forces
                .as_ref()
                .ok_or_else(|| self.err(k, "no `forces` column".into()))?;
            if let Some(i) = forces.iter().position(|f| f.iter().any(|x| !x.is_finite())) {
                return Err(self.err(k, format!("atom {i} has a non-finite force label")));
            }
            super::hessian::hvp_label(s).map_err(|e| self.err(k, e))?;
            // A stress label must read, be finite, and belong to a cell with a volume.
            let stress = crate::eval::stress_label(s).map_err(|e| self.err(k, e))?;
            if let Some(sigma) = stress {
                if sigma.iter().flatten().any(|x| !x.is_finite()) {
                    return Err(self.err(k, format!("stress label {sigma:?} is not finite")));
                }
                if crate::stress::stress_volume(s).is_none() {
                    return Err(self.err(
                        k,
                        "a `stress` label without a cell periodic along all three axes".into(),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every atom's element must be one the model knows.
    pub fn check_elements(&self, cfg: &PainnConfig) -> Result<()> {
        for (k, s) in self.frames.iter().enumerate() {
            if let Err((atom, z)) = cfg.species_of(&s.numbers) {
                return Err(self.err(
                    k,
                    format!(
                        "atom {atom} is element Z={z}, not among the model's elements {:?}",
                        cfg.elements
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Distinct values of a per-frame info key (e.g. `teacher`), in first-seen order.
    pub fn info_values(&self, key: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for s in &self.frames {
            if let Some(v) = s.info_value(key) {
                if !out.iter().any(|o| o == v) {
                    out.push(v.to_string());
                }
            }
        }
        out
    }
}

/// Splits frames into (train, validation) by their `trajectory` info key, so that frames of
/// one trajectory never end up on both sides. `val_fraction` of the trajectories (at least one)
/// go to validation, chosen with `seed`.
pub fn split_by_trajectory(
    ds: &Dataset,
    val_fraction: f64,
    seed: u64,
) -> Result<(Dataset, Dataset)> {
    let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (k, s) in ds.frames.iter().enumerate() {
        match s.info_value("trajectory") {
            Some(t) => groups.entry(t).or_default().push(k),
            None => {
                return Err(ds.err(
                    k,
                    "no `trajectory` key: give a validation file, or label frames with the \
                     trajectory they come from (splitting by frame would leak correlated frames)"
                        .into(),
                ))
            }
        }
    }
    if groups.len() < 2 {
        return Err(ds.err(
            0,
            format!(
                "only {} trajectory: a split by trajectory needs at least 2 (or give a validation file)",
                groups.len()
            ),
        ));
    }
    let mut names: Vec<&str> = groups.keys().copied().collect();
    names.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    let n_val = ((names.len() as f64 * val_fraction).round() as usize).clamp(1, names.len() - 1);
    let pick = |names: &[&str]| {
        let mut idx: Vec<usize> = names.iter().flat_map(|n| groups[n].clone()).collect();
        idx.sort_unstable();
        ds.select(&idx)
    };
    Ok((pick(&names[n_val..]), pick(&names[..n_val])))
}
