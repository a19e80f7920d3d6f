//! The second stage (`refine` in the settings): once the loop stops, student 0 of its last
//! trained iteration is trained again on every labelled frame with the stage's own settings,
//! then scored like an iteration's student. A loop that goes on after it (a resumed run with
//! lower stop thresholds) makes it run again from the newer student.

use super::phases::{assess, labelled_files};
use super::training::{s, train_args, train_one};
use super::Run;
use crate::distill::{Phase, Refined, RunState};
use crate::fsutil::write_json;
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

/// The loop's last iteration whose committee finished training.
pub(super) fn last_trained(state: &RunState) -> Option<usize> {
    state
        .iterations
        .iter()
        .rev()
        .find(|it| it.is_done(Phase::Train))
        .map(|it| it.index)
}

/// Where the stage's student lives.
pub(super) fn dir(run: &Run) -> PathBuf {
    run.out.join("refine")
}

/// Whether the run's result is the second stage's student (it is asked for and done from the
/// loop's last student).
pub(super) fn done(run: &Run, state: &RunState) -> bool {
    let last = last_trained(state);
    run.cfg.refine.is_some() && state.refined.as_ref().map(|r| r.from_iteration) == last
}

/// Runs the stage where it is asked for and not done from the loop's last student.
pub(super) fn refine(run: &Run, state: &mut RunState) -> Result<ExitCode> {
    let (Some(tc), Some(last)) = (&run.cfg.refine, last_trained(state)) else {
        return Ok(ExitCode::SUCCESS);
    };
    if done(run, state) {
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("== refine: student 0 of iteration {last} on every labelled frame");
    state.refined = None;
    let out = dir(run);
    // The iteration a half-trained stage started from: only then may it continue.
    let from = run.out.join("refine.from");
    let resume = std::fs::read_to_string(&from).ok().as_deref() == Some(&last.to_string());
    std::fs::write(&from, last.to_string())
        .with_context(|| format!("writing {}", from.display()))?;
    let tc_path = run.out.join("refine.train.json");
    write_json(&tc_path, tc)?;
    let mut args = train_args(run, &labelled_files(run, state, last + 1), &tc_path);
    args.extend(["--init".into(), s(&run.student(last, 0))]);
    let started = Instant::now();
    let epochs = match train_one(args, &out, resume)? {
        Ok(epochs) => epochs,
        Err(code) => return Ok(code),
    };
    let train_s = started.elapsed().as_secs_f64();
    let summary = run.out.join("refine.stability.json");
    let (test, stability) = match assess(run, &out.join("best.safetensors"), &summary)? {
        Ok(scores) => scores,
        Err(code) => return Ok(code),
    };
    state.refined = Some(Refined {
        from_iteration: last,
        epochs,
        train_s,
        test: Some(test),
        stability,
    });
    Ok(ExitCode::SUCCESS)
}
