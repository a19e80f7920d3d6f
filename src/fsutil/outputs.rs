//! A command's outputs, claimed before any is opened: none may be the same file as an input or
//! as another output (after following links), an existing one is refused unless the user said
//! to replace or extend it, each is locked for the run, and temporary files that killed runs
//! left in their folders are removed.

use super::identity::FileKey;
use super::lock::OutputLock;
use super::temp::clean_stale_temps;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// What a command does to an output that exists already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Writes a new file; an existing one is refused.
    Create,
    /// Replaces an existing file (`--overwrite`).
    Overwrite,
    /// Adds to an existing file (`--append`), or creates it.
    Append,
    /// Continues a file an earlier run wrote (a resume): it must exist.
    Continue,
}

impl Mode {
    /// What the user asked for an existing output: `--overwrite` replaces it, `--append`
    /// (where a command has it) adds to it, neither refuses it.
    pub fn for_existing(overwrite: bool, append: bool) -> Self {
        match (overwrite, append) {
            (true, _) => Self::Overwrite,
            (_, true) => Self::Append,
            _ => Self::Create,
        }
    }
}

struct Output {
    flag: String,
    path: PathBuf,
    mode: Mode,
    /// What the user can do about an existing file, for [`Mode::Create`].
    hint: &'static str,
}

/// The inputs and outputs of one command.
#[derive(Default)]
pub struct OutputSet {
    inputs: Vec<(String, PathBuf)>,
    outputs: Vec<Output>,
}

/// The outputs, checked and locked; the locks are released when this is dropped.
#[derive(Debug)]
pub struct Claim {
    pub locks: Vec<OutputLock>,
    /// Temporary files of killed runs removed from the outputs' folders.
    pub removed_temps: Vec<PathBuf>,
}

/// The hint of an existing output that a command can only replace.
pub const OVERWRITE_HINT: &str = "pass --overwrite to replace it";

impl OutputSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// A file the command reads (named by `flag` in errors, e.g. `--structure`).
    pub fn input(&mut self, flag: &str, path: &Path) -> &mut Self {
        self.inputs.push((flag.into(), path.into()));
        self
    }

    /// A file the command writes.
    pub fn output(&mut self, flag: &str, path: &Path, mode: Mode) -> &mut Self {
        self.output_with_hint(flag, path, mode, OVERWRITE_HINT)
    }

    /// A file the command writes, with what to say when it exists and `mode` is `Create`.
    pub fn output_with_hint(
        &mut self,
        flag: &str,
        path: &Path,
        mode: Mode,
        hint: &'static str,
    ) -> &mut Self {
        self.outputs.push(Output {
            flag: flag.into(),
            path: path.into(),
            mode,
            hint,
        });
        self
    }

    /// Checks every output against the inputs and each other, removes stale temporary files,
    /// locks the outputs for `holder` (e.g. the command line) and checks what exists. Nothing
    /// is written but the lock files.
    pub fn claim(&self, holder: &str) -> Result<Claim> {
        let inputs: Vec<(&(String, PathBuf), FileKey)> = (self.inputs.iter())
            .filter(|(_, p)| p.exists())
            .map(|i| FileKey::of(&i.0, &i.1).map(|k| (i, k)))
            .collect::<Result<_>>()?;
        let mut seen: Vec<(&Output, FileKey)> = Vec::new();
        for out in &self.outputs {
            let what = format!("{} {}", out.flag, out.path.display());
            if out.path.is_dir() {
                return Err(Error::Output(format!("{what}: is a folder, not a file")));
            }
            let key = FileKey::of(&out.flag, &out.path)?;
            if let Some(((flag, path), _)) = inputs.iter().find(|(_, k)| *k == key) {
                return Err(Error::Output(format!(
                    "{what} is the same file as {flag} {}: an output must not replace an input",
                    path.display()
                )));
            }
            if let Some((other, _)) = seen.iter().find(|(_, k)| *k == key) {
                return Err(Error::Output(format!(
                    "{what} is the same file as {} {}: two outputs cannot share a file",
                    other.flag,
                    other.path.display()
                )));
            }
            seen.push((out, key));
        }
        let mut removed_temps = Vec::new();
        let mut folders: Vec<PathBuf> = Vec::new();
        for out in &self.outputs {
            let folder = match out.path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            let Ok(folder) = folder.canonicalize() else {
                continue;
            };
            if !folders.contains(&folder) {
                removed_temps.extend(clean_stale_temps(&folder));
                folders.push(folder);
            }
        }
        let locks = (self.outputs.iter())
            .map(|o| OutputLock::acquire(&o.flag, &o.path, holder))
            .collect::<Result<Vec<_>>>()?;
        for out in &self.outputs {
            let what = format!("{} {}", out.flag, out.path.display());
            match (out.mode, out.path.exists()) {
                (Mode::Create, true) => {
                    return Err(Error::Output(format!(
                        "{what}: exists already; {}",
                        out.hint
                    )))
                }
                (Mode::Continue, false) => {
                    return Err(Error::Output(format!(
                        "{what}: does not exist, but the run to continue wrote it"
                    )))
                }
                _ => {}
            }
        }
        Ok(Claim {
            locks,
            removed_temps,
        })
    }
}
