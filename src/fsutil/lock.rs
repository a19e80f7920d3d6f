//! Advisory locks on outputs for the length of a run: a lock file `.NAME.lock` beside each
//! output, locked exclusively and holding who holds it, so that a second writer fails at once
//! and can say which process has the file. The operating system drops the lock of a killed
//! process, so a lock file left behind blocks nobody.

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// A held lock on one output; released (and its lock file removed) when dropped.
#[derive(Debug)]
pub struct OutputLock {
    file: File,
    path: PathBuf,
}

/// The lock file of `output`: `.NAME.lock` in the same folder.
pub fn lock_path(output: &Path) -> PathBuf {
    let name = output
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    output.with_file_name(format!(".{name}.lock"))
}

impl OutputLock {
    /// Locks `output` (named by `flag` in errors) for `holder` (e.g. the command line).
    pub fn acquire(flag: &str, output: &Path, holder: &str) -> Result<Self> {
        let path = lock_path(output);
        let io = |cause| Error::Io {
            path: path.clone(),
            cause,
        };
        // A lock file removed by its holder between our open and our lock is not the lock
        // any more: try again on the new one.
        for _ in 0..8 {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io)?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    let mut text = String::new();
                    let _ = file.read_to_string(&mut text);
                    return Err(Error::Output(format!(
                        "{flag} {}: being written by another run ({}); wait for it to end or \
                         choose another file",
                        output.display(),
                        describe_holder(&text)
                    )));
                }
                Err(TryLockError::Error(e)) => return Err(io(e)),
            }
            if !same_file(&file, &path) {
                continue;
            }
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let text = format!("pid {}\nsince {now}\n{holder}\n", std::process::id());
            file.set_len(0)
                .and_then(|_| file.write_all(text.as_bytes()))
                .and_then(|_| file.flush())
                .map_err(io)?;
            return Ok(Self { file, path });
        }
        Err(Error::Output(format!(
            "{flag} {}: its lock file {} keeps being replaced",
            output.display(),
            path.display()
        )))
    }
}

impl Drop for OutputLock {
    fn drop(&mut self) {
        // Removed while still locked: a process that opened it meanwhile sees it replaced.
        let _ = std::fs::remove_file(&self.path);
        let _ = self.file.unlock();
    }
}

/// Whether `file` is still the file at `path`.
#[cfg(unix)]
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

#[cfg(not(unix))]
fn same_file(_file: &File, path: &Path) -> bool {
    path.exists()
}

/// "pid 123, `mlff md ...`, for 42 s" from a lock file's text.
fn describe_holder(text: &str) -> String {
    let mut lines = text.lines();
    let pid = lines.next().unwrap_or("pid unknown");
    let since = lines
        .next()
        .and_then(|l| l.strip_prefix("since "))
        .and_then(|s| s.parse::<u64>().ok());
    let command = lines.next().unwrap_or("").trim();
    let mut out = pid.to_string();
    if !command.is_empty() {
        out.push_str(&format!(", `{command}`"));
    }
    if let Some(since) = since {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(since, |d| d.as_secs());
        out.push_str(&format!(", running for {} s", now.saturating_sub(since)));
    }
    out
}
