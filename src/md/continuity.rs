//! Whether a restart file still continues its run: the outputs it points into must end, at the
//! lengths it recorded, with the records it recorded, and must not have moved on past where a
//! run killed after this restart could have got. A stale copy (an older restart file, a folder
//! restored from a backup) would otherwise cut the live trajectory back. `branch` continues
//! such a state in new files instead.

use super::output::Tail;
use super::restart::{new_run_id, Restart};
use crate::error::{Error, Result};
use crate::fsutil::sha256_hex;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// An output as a restart file recorded it: (name, path, length, last record).
pub(super) type Recorded<'a> = (
    &'static str,
    Option<&'a PathBuf>,
    Option<u64>,
    Option<&'a Tail>,
);

impl Restart {
    /// Refuses a resume from `path` (this file) that would lose or mix up data, naming the
    /// output that moved on.
    pub fn check_current(&self, path: &Path) -> Result<()> {
        let newer = |live: &Path| {
            Restart::load(live)
                .ok()
                .filter(|r| r.run_id.is_some() && r.run_id == self.run_id)
                .map(|r| r.step)
        };
        let run = RunPoint {
            step: self.step,
            restart_every: self.settings.restart_every,
            live: self.settings.outputs.restart.as_deref(),
            otherwise: "pass --branch DIR to continue this state in new files",
        };
        check_current(path, run, newer, &self.outputs())
    }

    /// Continues this state in `folder`: the outputs, cut to the lengths this restart
    /// recorded, are copied there under their names (an existing file is refused unless
    /// `overwrite`), the restart file goes there too, and the run gets a new id.
    pub fn branch(&mut self, folder: &Path, overwrite: bool) -> Result<()> {
        if !folder.is_dir() {
            return Err(Error::Md(format!(
                "--branch {}: not a folder (create it first)",
                folder.display()
            )));
        }
        let mut copies: Vec<(PathBuf, PathBuf, u64)> = Vec::new();
        for (what, file, len, tail) in self.outputs() {
            let (Some(file), Some(len)) = (file, len) else {
                continue;
            };
            check_tail(what, file, len, tail)?;
            let name = file.file_name().unwrap_or_default();
            copies.push((file.clone(), folder.join(name), len));
        }
        let restart_name = (self.settings.outputs.restart.as_ref())
            .and_then(|p| p.file_name())
            .map(PathBuf::from)
            .unwrap_or_else(|| "mlff-md.restart.json".into());
        let targets = (copies.iter().map(|c| c.1.clone())).chain([folder.join(&restart_name)]);
        for target in targets {
            if target.exists() && !overwrite {
                return Err(Error::Output(format!(
                    "--branch {}: {} exists already; pass --overwrite to replace it",
                    folder.display(),
                    target.display()
                )));
            }
        }
        for (from, to, len) in &copies {
            copy_prefix(from, to, *len)?;
        }
        let outs = &mut self.settings.outputs;
        let moved = |p: &Option<PathBuf>| {
            p.as_ref()
                .and_then(|p| p.file_name())
                .map(|n| folder.join(n))
        };
        outs.traj = moved(&outs.traj);
        outs.log = moved(&outs.log);
        outs.restart = Some(folder.join(restart_name));
        self.run_id = Some(new_run_id());
        Ok(())
    }

    /// (name, path, recorded length, recorded last record) of the trajectory and the log.
    fn outputs(&self) -> [Recorded<'_>; 2] {
        let o = &self.settings.outputs;
        [
            (
                "trajectory",
                o.traj.as_ref(),
                self.traj_bytes,
                self.traj_tail.as_ref(),
            ),
            (
                "log",
                o.log.as_ref(),
                self.log_bytes,
                self.log_tail.as_ref(),
            ),
        ]
    }
}

/// Where a restart file stands in its run: its step, the run's restart interval, the run's
/// own restart file, and how else its state can go on (for the error).
pub(super) struct RunPoint<'a> {
    pub step: u64,
    pub restart_every: u64,
    pub live: Option<&'a Path>,
    pub otherwise: &'static str,
}

/// Refuses a resume from the restart file `path` that would lose or mix up data: the run's
/// own restart file has moved on (`newer` gives its step where it belongs to the same run),
/// or an output does not end as recorded or goes on past where a run killed after this
/// restart could have got.
pub(super) fn check_current(
    path: &Path,
    run: RunPoint,
    newer: impl Fn(&Path) -> Option<u64>,
    outputs: &[Recorded],
) -> Result<()> {
    let stale = |msg: String| {
        Error::Md(format!(
            "restart file {} is stale: {msg}; resume from the run's newest restart file, or \
             {}",
            path.display(),
            run.otherwise
        ))
    };
    // The run's own restart file, if this is a copy of it.
    if let Some(live) = run.live {
        let same = (live.canonicalize().ok()).zip(path.canonicalize().ok());
        if live.exists() && same.is_none_or(|(a, b)| a != b) {
            if let Some(step) = newer(live).filter(|&s| s > run.step) {
                return Err(stale(format!(
                    "the run's restart file {} is at step {step}, this copy at step {}",
                    live.display(),
                    run.step
                )));
            }
        }
    }
    // A run killed after this restart wrote at most up to its next restart.
    let reach = run.step + run.restart_every;
    for &(what, file, len, tail) in outputs {
        let (Some(file), Some(len)) = (file, len) else {
            continue;
        };
        check_tail(what, file, len, tail)?;
        if let Some(step) = last_step_after(what, file, len)?.filter(|&s| s > reach) {
            return Err(stale(format!(
                "the {what} {} goes on to step {step}, past this restart's step {} (its \
                 frames after step {} would be cut off)",
                file.display(),
                run.step,
                run.step
            )));
        }
    }
    Ok(())
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |cause| Error::Io {
        path: path.into(),
        cause,
    }
}

/// The file is at least `len` bytes long and its record before `len` is the recorded one.
fn check_tail(what: &str, file: &Path, len: u64, tail: Option<&Tail>) -> Result<()> {
    let actual = std::fs::metadata(file).map_err(io(file))?.len();
    if actual < len {
        return Err(Error::Md(format!(
            "the {what} {} has {actual} bytes, but the restart file says {len} were written: \
             it was truncated or replaced since",
            file.display()
        )));
    }
    let Some(tail) = tail.filter(|t| t.start <= len) else {
        return Ok(());
    };
    let mut bytes = Vec::new();
    let mut f = std::fs::File::open(file).map_err(io(file))?;
    f.seek(SeekFrom::Start(tail.start))
        .and_then(|_| f.take(len - tail.start).read_to_end(&mut bytes))
        .map_err(io(file))?;
    if sha256_hex(&bytes) != tail.sha256 {
        return Err(Error::Md(format!(
            "the {what} {} does not end at byte {len} with the record the restart file \
             recorded: it was replaced or rewritten since",
            file.display()
        )));
    }
    Ok(())
}

/// The largest step of the records after the first `len` bytes (log rows' `"step"`, frames'
/// `step=`), if any.
fn last_step_after(what: &str, file: &Path, len: u64) -> Result<Option<u64>> {
    let mut rest = Vec::new();
    let mut f = std::fs::File::open(file).map_err(io(file))?;
    f.seek(SeekFrom::Start(len))
        .and_then(|_| f.read_to_end(&mut rest))
        .map_err(io(file))?;
    let text = String::from_utf8_lossy(&rest);
    let steps = text.lines().filter_map(|line| match what {
        "log" => serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .and_then(|v| v.get("step")?.as_u64()),
        _ => line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("step=")?.parse::<u64>().ok()),
    });
    Ok(steps.max())
}

/// Copies the first `len` bytes of `from` to `to` (atomically).
fn copy_prefix(from: &Path, to: &Path, len: u64) -> Result<()> {
    let mut bytes = Vec::new();
    std::fs::File::open(from)
        .and_then(|f| f.take(len).read_to_end(&mut bytes))
        .map_err(io(from))?;
    crate::fsutil::write_atomic(to, &bytes)
}
