//! The teacher as external processes: the bridge's `label` command in parallel workers, and
//! what its `sample` command (teacher_md.rs) shares with it. Every failure names the
//! command, its log and its last words.

use super::config::TeacherConfig;
use crate::error::{Error, Result};
use crate::io::{read_extxyz, write_extxyz};
use crate::structure::Structure;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// `--key value` flags of the teacher's options.
pub(super) fn option_flags(t: &TeacherConfig) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in &t.options {
        let flag = format!("--{}", k.replace('_', "-"));
        match v {
            serde_json::Value::Bool(true) => out.push(flag),
            serde_json::Value::Bool(false) | serde_json::Value::Null => {}
            serde_json::Value::String(s) => out.extend([flag, s.clone()]),
            other => out.extend([flag, other.to_string()]),
        }
    }
    out
}

/// A process with its output going to `log`, with `threads` threads for OpenMP and BLAS.
pub(super) fn spawn(argv: &[String], log: &Path, threads: usize) -> Result<Child> {
    let file = std::fs::File::create(log).map_err(|cause| Error::Io {
        path: log.into(),
        cause,
    })?;
    let err = file.try_clone().map_err(|cause| Error::Io {
        path: log.into(),
        cause,
    })?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err);
    for var in ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"] {
        cmd.env(var, threads.max(1).to_string());
    }
    cmd.spawn().map_err(|e| {
        Error::Distill(format!(
            "could not start the teacher command `{}`: {e} (set teacher.label_command / \
             teacher.sample_command in the config)",
            argv.join(" ")
        ))
    })
}

/// Waits for `child`; a failure quotes the end of its log.
pub(super) fn finish(mut child: Child, argv: &[String], log: &Path) -> Result<()> {
    let status = child.wait().map_err(|cause| Error::Io {
        path: log.into(),
        cause,
    })?;
    if status.success() {
        return Ok(());
    }
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(5).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    Err(Error::Distill(format!(
        "the teacher command `{}` failed ({status}); its log {}: {}",
        argv.join(" "),
        log.display(),
        tail.join(" | ")
    )))
}

/// Teacher processes at once: `teacher.workers`, or as many as the cores hold at
/// `teacher.threads` threads each.
pub(super) fn workers(teacher: &TeacherConfig) -> usize {
    match teacher.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()) / teacher.threads.max(1),
        w => w,
    }
    .max(1)
}

/// `frames` labelled by the teacher in up to `workers` processes at once (contiguous parts,
/// merged in order; frames the teacher failed on are left out); scratch files in `work_dir`,
/// removed after success. `seed` seeds the Hessian-vector directions where asked for.
pub fn label(
    teacher: &TeacherConfig,
    frames: &[Structure],
    work_dir: &Path,
    seed: u64,
) -> Result<Vec<Structure>> {
    if frames.is_empty() {
        return Ok(Vec::new());
    }
    std::fs::create_dir_all(work_dir).map_err(|cause| Error::Io {
        path: work_dir.into(),
        cause,
    })?;
    let workers = workers(teacher).min(frames.len());
    let per = frames.len().div_ceil(workers);
    let mut running = Vec::new();
    for (k, part) in frames.chunks(per).enumerate() {
        let input = work_dir.join(format!("part-{k}.extxyz"));
        let output = work_dir.join(format!("part-{k}.labelled.extxyz"));
        let log = work_dir.join(format!("part-{k}.log"));
        write_extxyz(&input, part)?;
        let mut argv = teacher.label_command.clone();
        argv.extend([
            input.display().to_string(),
            "-o".into(),
            output.display().to_string(),
            "--overwrite".into(),
            "--quiet".into(),
            // A frame the teacher cannot do (an SCF that does not converge on a distorted
            // geometry) is dropped and counted, not the end of the loop.
            "--skip-failed".into(),
            "--teacher".into(),
            teacher.name.clone(),
        ]);
        argv.extend(option_flags(teacher));
        if teacher.hessian_vectors {
            // Each part its own seed: the directions are drawn per frame index within a part.
            let seed = seed * 1000 + k as u64;
            argv.extend([
                "--hessian-vectors".into(),
                "--seed".into(),
                seed.to_string(),
            ]);
        }
        running.push((
            spawn(&argv, &log, teacher.threads)?,
            argv,
            log,
            output,
            part.len(),
        ));
    }
    let mut labelled = Vec::with_capacity(frames.len());
    let mut first_error = None;
    for (child, argv, log, output, n) in running {
        if let Err(e) = finish(child, &argv, &log) {
            first_error.get_or_insert(e);
            continue;
        }
        let part = read_extxyz(&output)?;
        if part.len() > n {
            return Err(Error::Distill(format!(
                "{}: the teacher returned {} frames for {n}",
                output.display(),
                part.len()
            )));
        }
        labelled.extend(part);
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    let _ = std::fs::remove_dir_all(work_dir);
    Ok(labelled)
}

/// Removes the `PREFIX-PID` scratch folders in `dir` whose process is gone (what a killed
/// labelling left); those of live processes stay.
pub fn clean_stale_work(dir: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name
            .strip_prefix(prefix)
            .and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|pid| !crate::fsutil::process_alive(pid)) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Seconds the teacher spent on `frames`: their `teacher_time_s`, and `hvp_time_s` where a
/// Hessian-vector label took two more calls.
pub fn teacher_seconds(frames: &[Structure]) -> f64 {
    let key = |s: &Structure, k: &str| s.info_value(k).and_then(|v| v.parse::<f64>().ok());
    frames
        .iter()
        .map(|s| key(s, "teacher_time_s").unwrap_or(0.0) + key(s, "hvp_time_s").unwrap_or(0.0))
        .sum()
}
