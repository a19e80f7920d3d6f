//! Temporary files of atomic writes (`.NAME.PID.tmp`, see [`super::write_atomic`]) left by a
//! process that was killed mid-write: removed at the next start in their folder, once their
//! process is gone.

use std::path::{Path, PathBuf};

/// The process id in a temporary file's name, if it is one of ours.
pub fn temp_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (file, pid) = rest.rsplit_once('.')?;
    if file.is_empty() {
        return None;
    }
    pid.parse().ok()
}

/// Removes the temporary files in `folder` whose process has ended; returns those removed.
pub fn clean_stale_temps(folder: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = temp_owner(&name.to_string_lossy()) else {
            continue;
        };
        if pid == std::process::id() || process_alive(pid) {
            continue;
        }
        if entry.file_type().is_ok_and(|t| t.is_file())
            && std::fs::remove_file(entry.path()).is_ok()
        {
            removed.push(entry.path());
        }
    }
    removed
}

/// Whether a process with this id runs (a process of another user counts as running).
#[cfg(unix)]
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 sends nothing; it only checks that the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(not(unix))]
pub fn process_alive(_pid: u32) -> bool {
    // Without a cheap check, keep the file.
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_temporary_names_have_an_owner() {
        assert_eq!(temp_owner(".best.safetensors.4242.tmp"), Some(4242));
        assert_eq!(temp_owner(".a.4242.tmp"), Some(4242));
        for other in [
            ".4242.tmp",
            "best.safetensors.4242.tmp",
            ".a.b.tmp",
            ".a.4242.tmp.x",
        ] {
            assert_eq!(temp_owner(other), None, "{other}");
        }
        assert!(process_alive(std::process::id()));
    }
}
