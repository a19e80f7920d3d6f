//! Distillation at scale (`mlff distill`): an active-learning loop from a teacher to a
//! validated student. The first iteration trains a committee of students on the teacher's
//! own MD; every later one samples candidates with the student (MD at several temperatures,
//! rattle-and-relax), lets the committee's force disagreement pick what the teacher labels,
//! and warm-starts the committee on everything labelled so far. The loop ends when the
//! committee agrees on fresh student-MD frames or a budget runs out.
//!
//! This module holds the pieces (settings, selection, augmentation, the teacher processes,
//! the saved state and the report); `cli::distill` runs the loop with `mlff train` and
//! `mlff md`.

mod augment;
mod config;
mod report;
mod select;
mod state;
mod teacher;
mod teacher_md;

pub use augment::{rattle_and_relax, set_info, unlabelled, Rattle};
pub use config::{
    DistillConfig, Sampling, SeedStructure, Selection, Share, Stability, Stopping, TeacherConfig,
    TeacherMd,
};
pub use report::{budget_plot, markdown};
pub use select::{
    close_contact, disagreement, most_disputed, most_disputed_molecule, most_disputed_overall,
    relative_to_goals, selected_groups,
};
pub use state::{
    GroupErrors, HeldOut, Iteration, Phase, Refined, RunState, SelectedGroup, StabilityRow,
    STATE_FORMAT,
};
pub use teacher::{clean_stale_work, label, teacher_seconds};
pub use teacher_md::{teacher_md, TeacherMdJob, TeacherStart};
