//! Training in this process: the committee of an iteration (side by side on CUDA) and the
//! single `mlff train` runs the second stage makes, each a `mlff` sub-command on a thread.

use super::Run;
use crate::distill::RunState;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Runs `mlff ARGS` in this process.
pub(super) fn mlff(args: Vec<String>) -> Result<ExitCode> {
    eprintln!("   mlff {}", args.join(" "));
    super::super::run(std::iter::once("mlff".to_string()).chain(args))
}

pub(super) fn s(p: &Path) -> String {
    p.display().to_string()
}

/// The committee of iteration `i` trained on `files`, everything labelled so far
/// (warm-started after iteration 0); members a stopped attempt finished are kept. On CUDA the
/// members train side by side (`Tuning::committee_side_by_side`), each on a thread and stream
/// of its own.
pub(super) fn committee(
    run: &Run,
    state: &mut RunState,
    files: &[PathBuf],
    i: usize,
) -> Result<ExitCode> {
    let dir = run.iter_dir(i);
    let todo: Vec<usize> = (0..run.cfg.committee)
        .filter(|k| !state.iteration(i).members_trained.contains(k))
        .collect();
    let groups: Vec<Vec<usize>> = match run.dev.is_cuda() && run.tuning.committee_side_by_side {
        true => vec![todo],
        false => todo.into_iter().map(|k| vec![k]).collect(),
    };
    for group in groups.into_iter().filter(|g| !g.is_empty()) {
        let started = Instant::now();
        let mut jobs = Vec::new();
        for &k in &group {
            let mut tc = run.cfg.train.clone();
            tc.seed += k as u64;
            let tc_path = dir.join(format!("student-{k}.train.json"));
            crate::fsutil::write_json(&tc_path, &tc)?;
            let mut args = train_args(run, files, &tc_path);
            if i > 0 {
                args.extend(["--init".into(), s(&run.student(i - 1, k))]);
            } else if let Some(model) = &run.cfg.model {
                args.extend(["--config".into(), s(&run.out.join(model))]);
            }
            jobs.push((args, dir.join(format!("student-{k}"))));
        }
        let results: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = jobs
                .into_iter()
                .map(|(args, out)| scope.spawn(move || train_one(args, &out, true)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        // Every member that finished is kept, also where another failed or was stopped.
        let before: f64 = state.iterations[..i].iter().map(|x| x.train_s).sum();
        let mut ended = None;
        for (k, result) in group.into_iter().zip(results) {
            match result {
                Ok(Ok(epochs)) => {
                    let it = state.iteration(i);
                    it.epochs.push(epochs);
                    it.members_trained.push(k);
                }
                Ok(Err(code)) => ended = ended.or(Some(Ok(code))),
                Err(e) => ended = ended.or(Some(Err(e))),
            }
        }
        let it = state.iteration(i);
        it.train_s += started.elapsed().as_secs_f64();
        it.train_s_total = before + it.train_s;
        state.save(&run.out.join("state.json"))?;
        if let Some(end) = ended {
            return end;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `mlff train` on `files` with the settings in `tc_path`, validated on the run's validation
/// frames, on the run's device.
pub(super) fn train_args(run: &Run, files: &[PathBuf], tc_path: &Path) -> Vec<String> {
    let mut args = vec!["train".to_string(), "--train".into()];
    args.extend(files.iter().map(|p| s(p)));
    args.extend([
        "--val".into(),
        s(&run.data("val.extxyz")),
        "--train-config".into(),
        s(tc_path),
    ]);
    args.extend(run.device_flags());
    args
}

/// `mlff train ARGS --out OUT`: a run a stopped attempt left half-trained continues from its
/// last saved epoch (same data and settings; `resume` false starts over). The epochs trained,
/// or the status where it did not complete.
pub(super) fn train_one(
    args: Vec<String>,
    out: &Path,
    resume: bool,
) -> Result<std::result::Result<usize, ExitCode>> {
    let args = [args, vec!["--out".into(), s(out)]].concat();
    let resumed = match resume && out.join("state.safetensors").exists() {
        true => mlff([args.clone(), vec!["--resume".into()]].concat()),
        false => Err(anyhow::anyhow!("no saved state")),
    };
    let code = match resumed {
        Ok(code) => code,
        Err(e) => {
            if out.join("state.safetensors").exists() {
                eprintln!("note: {} starts over: {e:#}", s(out));
            }
            mlff([args, vec!["--overwrite".into()]].concat())?
        }
    };
    if code != ExitCode::SUCCESS {
        return Ok(Err(code));
    }
    let log = std::fs::read_to_string(out.join("log.jsonl"))
        .with_context(|| format!("reading {}", s(&out.join("log.jsonl"))))?;
    let last: serde_json::Value = log
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_default();
    Ok(Ok(last["epoch"].as_u64().unwrap_or(0) as usize))
}
