//! File helpers that never lose data already written: atomic writes, outputs checked and
//! locked before a command opens them, and the clean-up of what killed runs left.

mod identity;
mod lock;
mod outputs;
mod temp;

pub use identity::FileKey;
pub use lock::{lock_path, OutputLock};
pub use outputs::{Claim, Mode, OutputSet, OVERWRITE_HINT};
pub use temp::{clean_stale_temps, process_alive, temp_owner};

use crate::error::{Error, Result};
use std::io::Write;
use std::path::Path;

/// Writes `bytes` to a temporary file beside `path`, syncs it, then renames it over `path`:
/// readers see the old file or the new one, never a partial one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, |w| w.write_all(bytes))
}

/// Like [`write_atomic`], with the content produced by `fill`.
pub fn write_atomic_with(
    path: &Path,
    fill: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> Result<()> {
    let io = |source| Error::Io {
        path: path.into(),
        cause: source,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| {
        io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "path names no file",
        ))
    })?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
        fill(&mut w)?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io)
}

/// Lower-case hex SHA-256 of `bytes` (data and model provenance).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Lower-case hex SHA-256 of a file's contents (model provenance in restarts and reports).
pub fn sha256_file(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.into(),
        cause: source,
    })?;
    Ok(sha256_hex(&bytes))
}

/// Writes `value` as pretty-printed JSON, atomically (see [`write_atomic`]).
pub fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<()> {
    let json = serde_json::to_vec_pretty(value).map_err(|e| Error::Json {
        path: path.into(),
        msg: e.to_string(),
    })?;
    write_atomic(path, &json)
}

/// Reads a JSON file that should hold `what` (e.g. "a bench report"), naming the file and the
/// place of any error.
pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> Result<T> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.into(),
        cause: source,
    })?;
    serde_json::from_slice(&bytes).map_err(|e| Error::Json {
        path: path.into(),
        msg: format!("not {what}: {e}"),
    })
}
