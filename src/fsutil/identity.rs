//! Whether two paths name the same file: the same device and inode after following links for
//! files that exist, the same canonical folder and name for files not yet written.

use crate::error::{Error, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// What a path names, once links and `..` are resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileKey {
    /// An existing file or folder.
    Existing { device: u64, inode: u64 },
    /// A file not yet written: its folder (canonical) and name.
    New { folder: PathBuf, name: OsString },
}

impl FileKey {
    /// The key of `path`; an error (naming `flag`) when its folder does not exist or the path
    /// names no file.
    pub fn of(flag: &str, path: &Path) -> Result<Self> {
        if let Ok(meta) = std::fs::metadata(path) {
            return Ok(existing(&meta, path));
        }
        let bad = |msg: String| Error::Output(format!("{flag} {}: {msg}", path.display()));
        let name = path
            .file_name()
            .ok_or_else(|| bad("names no file".into()))?
            .to_owned();
        let folder = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let folder = folder
            .canonicalize()
            .map_err(|_| bad(format!("the folder {} does not exist", folder.display())))?;
        // A dangling link names the file it would create: the link itself is the key.
        Ok(Self::New { folder, name })
    }
}

#[cfg(unix)]
fn existing(meta: &std::fs::Metadata, _path: &Path) -> FileKey {
    use std::os::unix::fs::MetadataExt;
    FileKey::Existing {
        device: meta.dev(),
        inode: meta.ino(),
    }
}

#[cfg(not(unix))]
fn existing(_meta: &std::fs::Metadata, path: &Path) -> FileKey {
    // Without inodes, the canonical path stands for the file.
    let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    FileKey::New {
        folder: canonical
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default(),
        name: canonical
            .file_name()
            .map(|n| n.to_owned())
            .unwrap_or_default(),
    }
}
