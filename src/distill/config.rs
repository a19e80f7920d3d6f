//! What a distillation run does: the teacher, the seed structures, how each iteration samples,
//! selects, labels and trains, and when the loop stops. Read from JSON (`mlff distill
//! --config`), saved as `distill.json` in the run's folder.

use crate::error::{Error, Result};
use crate::train::TrainConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A distillation run's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistillConfig {
    pub teacher: TeacherConfig,
    /// The molecules or cells the student is for.
    pub seeds: Vec<SeedStructure>,
    /// Temperatures (K) of the teacher's and the student's sampling MD.
    #[serde(default = "default_temperatures")]
    pub temperatures: Vec<f64>,
    /// Student model config JSON (default: the default PaiNN). Paths in a config file (this
    /// and seed files) are relative to its folder; the run keeps copies.
    #[serde(default)]
    pub model: Option<PathBuf>,
    /// Number of students trained side by side (seeds 0..n): their force disagreement picks
    /// the frames the teacher labels; student 0 is the one shipped.
    #[serde(default = "default_committee")]
    pub committee: usize,
    /// Training of every iteration (warm-started from the previous one after the first);
    /// `patience` ends an iteration's training on a validation plateau.
    #[serde(default = "default_train")]
    pub train: TrainConfig,
    #[serde(default)]
    pub teacher_md: TeacherMd,
    #[serde(default)]
    pub sampling: Sampling,
    #[serde(default)]
    pub selection: Selection,
    #[serde(default)]
    pub stop: Stopping,
    #[serde(default)]
    pub stability: Stability,
    /// A second stage once the loop stops: student 0 of its last iteration trained again on
    /// every labelled frame with these settings (a larger `energy_weight` and a lower `lr`,
    /// as MACE's second stage); its student is the one shipped. Fields not given are `mlff
    /// train`'s defaults.
    #[serde(default)]
    pub refine: Option<TrainConfig>,
}

/// The teacher and how to run it: any command that takes the bridge's `label` arguments
/// (`INPUT -o OUTPUT --teacher NAME [--OPTION VALUE...]`) and writes labelled extended XYZ.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TeacherConfig {
    /// The bridge's teacher name (gfn2, ani2x, sevenn, ...).
    pub name: String,
    /// Extra options, passed to both commands as `--KEY VALUE` (underscores become dashes;
    /// `true` as a bare flag).
    pub options: BTreeMap<String, serde_json::Value>,
    pub label_command: Vec<String>,
    pub sample_command: Vec<String>,
    /// Labelling processes run at once (0: one per CPU core).
    pub workers: usize,
    /// OpenMP/BLAS threads of each teacher process (the workers share the cores).
    pub threads: usize,
    /// Also label one Hessian-vector product per selected frame (`label --hessian-vectors`,
    /// two more teacher calls each) for `train.hessian_weight`.
    pub hessian_vectors: bool,
}

impl Default for TeacherConfig {
    fn default() -> Self {
        let module = |m: &str| ["python3", "-m", m].into_iter().map(String::from).collect();
        Self {
            name: "gfn2".into(),
            options: BTreeMap::new(),
            label_command: module("mlff_distiller.teachers.label"),
            sample_command: module("mlff_distiller.teachers.sample"),
            workers: 0,
            threads: 1,
            hessian_vectors: false,
        }
    }
}

/// A seed: exactly one of `smiles`, `cluster` (`SMILES:N`, N copies packed at ~1 g/cm³) or
/// `file` (its first frame).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedStructure {
    pub name: String,
    #[serde(default)]
    pub smiles: Option<String>,
    #[serde(default)]
    pub cluster: Option<String>,
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// Flat-bottom wall radius (Å) of this seed's teacher MD, in place of
    /// `teacher_md.wall_radius` (a cluster's own size).
    #[serde(default)]
    pub wall_radius: Option<f64>,
}

/// The teacher's own MD: the first training set, and the validation and test sets (other
/// seeds, never trained on).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TeacherMd {
    pub timestep: f64,
    /// Langevin friction, 1/ps.
    pub friction_per_ps: f64,
    pub equil_steps: u64,
    pub steps: u64,
    pub every: u64,
    pub train_seeds: Vec<u64>,
    pub val_seeds: Vec<u64>,
    pub test_seeds: Vec<u64>,
    /// Flat-bottom wall radius (Å) for clusters that would evaporate.
    pub wall_radius: Option<f64>,
}

impl Default for TeacherMd {
    fn default() -> Self {
        Self {
            timestep: 0.5,
            friction_per_ps: 10.0,
            equil_steps: 200,
            steps: 2000,
            every: 40,
            train_seeds: vec![0],
            val_seeds: vec![1],
            test_seeds: vec![2],
            wall_radius: None,
        }
    }
}

/// The candidates of an iteration: the student's MD at every temperature (replicas of every
/// seed in one batched run), and rattle-and-relax children of labelled frames.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sampling {
    pub replicas: u64,
    pub steps: u64,
    pub every: u64,
    pub timestep: f64,
    /// Langevin friction, 1/ps.
    pub friction_per_ps: f64,
    /// Rattled frames per molecule (0: none).
    pub rattle_per_molecule: usize,
    /// Gaussian displacement of every coordinate, Å.
    pub rattle_sigma: f64,
    /// Steepest-descent steps on the student after the rattle.
    pub relax_steps: usize,
    /// Largest displacement of an atom per relaxation step, Å.
    pub relax_max_step: f64,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            replicas: 4,
            steps: 2000,
            every: 20,
            timestep: 0.5,
            friction_per_ps: 10.0,
            rattle_per_molecule: 20,
            rattle_sigma: 0.05,
            relax_steps: 5,
            relax_max_step: 0.02,
        }
    }
}

/// Which candidates go to the teacher.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Selection {
    /// Frames per molecule per iteration, the most disputed first; with `share` `disputed`,
    /// the iteration's budget is this times the molecules.
    pub per_molecule: usize,
    pub share: Share,
    /// With `share` `disputed`: frames every molecule gets at least.
    pub min_per_molecule: usize,
    /// Candidates with two atoms closer than this (Å) are dropped unscored.
    pub min_distance: f64,
    /// Force-error goals (eV/Å), one per entry of `temperatures`: candidates are ranked by
    /// their disagreement over their temperature's goal, so that the budget goes where the
    /// student is furthest from what it must reach rather than to the hottest frames, whose
    /// forces the committee always disputes most. Empty: by the disagreement itself.
    pub force_goals: Vec<f64>,
}

impl Default for Selection {
    fn default() -> Self {
        Self {
            per_molecule: 50,
            share: Share::Even,
            min_per_molecule: 10,
            min_distance: 0.5,
            force_goals: Vec::new(),
        }
    }
}

/// How an iteration's labelling budget is shared among the molecules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Share {
    /// `per_molecule` frames each.
    Even,
    /// The most disputed frames over all molecules, each molecule `min_per_molecule` at
    /// least: the molecules the committee disputes most get the most teacher calls.
    Disputed,
}

/// When the loop ends: the first of these that holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Stopping {
    /// Iterations after the first (teacher-MD) one.
    pub max_iterations: usize,
    /// Mean force disagreement (eV/Å) of the committee on fresh student-MD frames below which
    /// the student is done.
    pub disagreement: f64,
    /// Labelled frames in all.
    pub max_frames: Option<usize>,
    /// Teacher wall time summed over frames, hours.
    pub max_teacher_hours: Option<f64>,
    /// Training wall time in all, minutes.
    pub max_train_minutes: Option<f64>,
}

impl Default for Stopping {
    fn default() -> Self {
        Self {
            max_iterations: 5,
            disagreement: 0.01,
            max_frames: None,
            max_teacher_hours: None,
            max_train_minutes: None,
        }
    }
}

/// The MD stability check of every iteration's student (NVT from each seed).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Stability {
    /// Steps (0: no check).
    pub steps: u64,
    /// K (default: the highest of `temperatures`).
    pub temperature: Option<f64>,
    pub timestep: f64,
    /// Å: a bond this far off its starting length makes a run unstable, here and in the
    /// sampling MD (whose unstable replicas stop giving frames). Fu et al.'s 0.5 Å suits
    /// molecules; a crystal at high temperature needs more.
    pub bond_limit: f64,
}

impl Default for Stability {
    fn default() -> Self {
        Self {
            steps: 2000,
            temperature: None,
            timestep: 0.5,
            bond_limit: crate::md::BOND_DEVIATION_LIMIT,
        }
    }
}

fn positive(x: f64) -> bool {
    x.is_finite() && x > 0.0
}

fn non_negative(x: f64) -> bool {
    x.is_finite() && x >= 0.0
}

fn default_temperatures() -> Vec<f64> {
    vec![300.0, 600.0]
}

fn default_committee() -> usize {
    3
}

fn default_train() -> TrainConfig {
    TrainConfig {
        epochs: 200,
        patience: 20,
        val_every: 10,
        ..TrainConfig::default()
    }
}

impl DistillConfig {
    pub fn from_file(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|cause| Error::Io {
            path: path.into(),
            cause,
        })?;
        let c: Self = serde_json::from_str(&text).map_err(|e| Error::Json {
            path: path.into(),
            msg: format!("not a distillation config: {e}"),
        })?;
        c.validate()
            .map_err(|e| Error::Distill(format!("{}: {e}", path.display())))?;
        Ok(c)
    }

    /// Every setting that would stop the loop later, checked before anything runs.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.teacher.name.trim().is_empty() {
            return Err("teacher.name is empty".into());
        }
        for (what, cmd) in [
            ("teacher.label_command", &self.teacher.label_command),
            ("teacher.sample_command", &self.teacher.sample_command),
        ] {
            if cmd.is_empty() || cmd[0].is_empty() {
                return Err(format!("{what} is empty"));
            }
        }
        if self.seeds.is_empty() {
            return Err("seeds is empty: name at least one molecule or cell".into());
        }
        let mut names = std::collections::BTreeSet::new();
        for (k, s) in self.seeds.iter().enumerate() {
            let given = [s.smiles.is_some(), s.cluster.is_some(), s.file.is_some()];
            if given.iter().filter(|&&g| g).count() != 1 {
                return Err(format!(
                    "seeds[{k}] ({}): give exactly one of smiles, cluster, file",
                    s.name
                ));
            }
            let ok = !s.name.is_empty()
                && s.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
            if !ok {
                return Err(format!(
                    "seeds[{k}]: name `{}` must be letters, digits, '-' or '.' (it names \
                     files and trajectories)",
                    s.name
                ));
            }
            if !names.insert(&s.name) {
                return Err(format!("seeds[{k}]: name `{}` is used twice", s.name));
            }
            if s.wall_radius.is_some_and(|r| !positive(r)) {
                return Err(format!(
                    "seeds[{k}] ({}): wall_radius must be positive (Å)",
                    s.name
                ));
            }
        }
        if self.temperatures.is_empty() || self.temperatures.iter().any(|&t| !positive(t)) {
            return Err("temperatures must be one or more positive values (K)".into());
        }
        if self.committee < 2 {
            return Err(format!(
                "committee is {}: disagreement needs at least 2 students",
                self.committee
            ));
        }
        self.train.validate().map_err(|e| format!("train: {e}"))?;
        if let Some(r) = &self.refine {
            r.validate().map_err(|e| format!("refine: {e}"))?;
        }
        let md = &self.teacher_md;
        if md.every == 0 || md.steps < md.every || !positive(md.timestep) {
            return Err("teacher_md: timestep > 0 and steps >= every >= 1 are needed".into());
        }
        if md.wall_radius.is_some_and(|r| !positive(r)) {
            return Err("teacher_md.wall_radius must be positive (Å)".into());
        }
        for (what, seeds) in [
            ("train_seeds", &md.train_seeds),
            ("val_seeds", &md.val_seeds),
            ("test_seeds", &md.test_seeds),
        ] {
            if seeds.is_empty() {
                return Err(format!("teacher_md.{what} is empty"));
            }
        }
        let all: Vec<u64> = [&md.train_seeds, &md.val_seeds, &md.test_seeds]
            .into_iter()
            .flatten()
            .copied()
            .collect();
        let distinct: std::collections::BTreeSet<_> = all.iter().collect();
        if distinct.len() != all.len() {
            return Err(
                "teacher_md: train_seeds, val_seeds and test_seeds must all differ (held-out \
                 frames come from other trajectories)"
                    .into(),
            );
        }
        let s = &self.sampling;
        if s.replicas == 0 || s.every == 0 || s.steps < s.every || !positive(s.timestep) {
            return Err(
                "sampling: replicas >= 1, timestep > 0 and steps >= every >= 1 are needed".into(),
            );
        }
        if s.rattle_per_molecule > 0
            && !(positive(s.rattle_sigma) && non_negative(s.relax_max_step))
        {
            return Err("sampling: rattle_sigma must be positive".into());
        }
        if self.selection.per_molecule == 0 {
            return Err("selection.per_molecule must be at least 1".into());
        }
        let sel = &self.selection;
        if sel.share == Share::Disputed && sel.min_per_molecule > sel.per_molecule {
            return Err(format!(
                "selection.min_per_molecule ({}) must not exceed per_molecule ({}) with share \
                 \"disputed\"",
                sel.min_per_molecule, sel.per_molecule
            ));
        }
        if !non_negative(self.selection.min_distance) {
            return Err("selection.min_distance must be non-negative".into());
        }
        let goals = &self.selection.force_goals;
        if !goals.is_empty() && goals.len() != self.temperatures.len() {
            return Err(format!(
                "selection.force_goals has {} entries for {} temperatures: give one goal per \
                 temperature, in the same order",
                goals.len(),
                self.temperatures.len()
            ));
        }
        if let Some(g) = goals.iter().find(|g| !positive(**g)) {
            return Err(format!(
                "selection.force_goals: {g} is not a positive force error (eV/Å)"
            ));
        }
        if !non_negative(self.stop.disagreement) {
            return Err("stop.disagreement must be non-negative (eV/Å)".into());
        }
        if !positive(self.stability.timestep) {
            return Err("stability.timestep must be positive".into());
        }
        if !positive(self.stability.bond_limit) {
            return Err("stability.bond_limit must be positive (Å)".into());
        }
        Ok(())
    }

    /// The stability check's temperature.
    pub fn stability_temperature(&self) -> f64 {
        self.stability
            .temperature
            .unwrap_or_else(|| self.temperatures.iter().copied().fold(0.0, f64::max))
    }
}
