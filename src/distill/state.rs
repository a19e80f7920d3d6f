//! What a distillation run has done, saved as `state.json` after every phase so that a killed
//! run continues where it stopped; it is also the JSON report.

use crate::error::Result;
use crate::eval::Errors;
use crate::fsutil::{read_json, write_json};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const STATE_FORMAT: &str = "mlff-distill-state/1";

/// The phases of an iteration, in order (the first iteration's sampling is the teacher's MD,
/// labelled as it runs, so it has no select or label phase).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    TeacherMd,
    Sample,
    Select,
    Label,
    Train,
    Evaluate,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunState {
    pub format: String,
    pub iterations: Vec<Iteration>,
    /// Why the loop ended, once it has.
    pub finished: Option<String>,
    /// The second stage (`refine`), once it has run from the loop's last student.
    #[serde(default)]
    pub refined: Option<Refined>,
}

/// The second stage: student 0 of iteration `from_iteration` trained again on every frame
/// labelled until then, scored like an iteration's student.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Refined {
    pub from_iteration: usize,
    pub epochs: usize,
    pub train_s: f64,
    pub test: Option<HeldOut>,
    pub stability: Vec<StabilityRow>,
}

/// One iteration's numbers (teacher and training times in seconds, errors in eV and eV/Å).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Iteration {
    pub index: usize,
    pub done: Vec<Phase>,
    /// Candidates scored, and those dropped for atoms closer than selection.min_distance.
    pub candidates: usize,
    pub rejected_close: usize,
    /// Mean committee disagreement over this iteration's candidates, and over the student-MD
    /// ones alone, eV/Å.
    pub disagreement_mean: Option<f64>,
    pub disagreement_md_mean: Option<f64>,
    pub disagreement_selected_mean: Option<f64>,
    /// The molecule whose student-MD candidates the committee disputes most, and their mean
    /// disagreement (eV/Å): what the stop criterion reads.
    #[serde(default)]
    pub disagreement_md_worst: Option<(String, f64)>,
    pub selected: usize,
    /// The selected frames per molecule and temperature: where the budget went.
    #[serde(default)]
    pub selected_groups: Vec<SelectedGroup>,
    /// Frames the teacher labelled (selected minus those it failed on).
    pub new_frames: usize,
    pub total_frames: usize,
    pub teacher_s: f64,
    pub teacher_s_total: f64,
    /// Wall time of the train phase (the committee side by side on CUDA), stopped attempts
    /// included: what `stop.max_train_minutes` spends.
    pub train_s: f64,
    pub train_s_total: f64,
    /// Epochs each committee member trained this iteration.
    pub epochs: Vec<usize>,
    /// Committee members whose training this iteration has finished (a resumed train phase
    /// skips them).
    #[serde(default)]
    pub members_trained: Vec<usize>,
    pub test: Option<HeldOut>,
    pub stability: Vec<StabilityRow>,
}

/// How many of an iteration's selected frames one molecule got at one temperature (none for
/// frames without a `temperature_K`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SelectedGroup {
    pub molecule: String,
    pub temperature_k: Option<f64>,
    pub frames: usize,
}

/// Student 0 on the held-out teacher frames.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct HeldOut {
    pub overall: Errors,
    pub groups: Vec<GroupErrors>,
    /// Stress MAE (eV/Å³) over the held-out frames with stress labels (periodic cells).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stress_mae: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct GroupErrors {
    pub molecule: String,
    pub temperature_k: Option<f64>,
    pub errors: Errors,
}

/// Student 0's NVT run from one seed structure.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StabilityRow {
    pub molecule: String,
    pub steps: u64,
    pub stable: bool,
    pub max_bond_deviation: f64,
}

impl RunState {
    pub fn load_or_new(path: &Path) -> Result<Self> {
        if !path.exists() {
            return Ok(Self {
                format: STATE_FORMAT.into(),
                ..Self::default()
            });
        }
        let s: Self = read_json(path, "an mlff distill state file")?;
        if s.format != STATE_FORMAT {
            return Err(crate::Error::Distill(format!(
                "{}: format `{}`, this mlff reads `{STATE_FORMAT}`",
                path.display(),
                s.format
            )));
        }
        Ok(s)
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        write_json(path, self)
    }

    /// Iteration `index`, created when first asked for.
    pub fn iteration(&mut self, index: usize) -> &mut Iteration {
        while self.iterations.len() <= index {
            let index = self.iterations.len();
            self.iterations.push(Iteration {
                index,
                ..Iteration::default()
            });
        }
        &mut self.iterations[index]
    }

    /// Labelled frames, teacher seconds and training seconds over all iterations.
    pub fn totals(&self) -> (usize, f64, f64) {
        self.iterations.iter().fold((0, 0.0, 0.0), |t, it| {
            (t.0 + it.new_frames, t.1 + it.teacher_s, t.2 + it.train_s)
        })
    }
}

impl Iteration {
    pub fn is_done(&self, phase: Phase) -> bool {
        self.done.contains(&phase)
    }
}
