//! MD output files: the JSON-lines energy log and the extended-XYZ trajectory, both appended and
//! flushed record by record, and cut back to a restart's recorded length on resume (so a resumed
//! run's files equal an uninterrupted run's).

use crate::error::{Error, Result};
use crate::io::write_extxyz_to;
use crate::structure::{ExtraArray, Structure};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

/// One row of the MD log: energies in eV, time in fs, temperature in K, lengths in Å.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogRecord {
    pub step: u64,
    pub time_fs: f64,
    pub e_pot: f64,
    pub e_kin: f64,
    pub e_tot: f64,
    pub temperature: f64,
    /// Largest change of a bond length from the starting structure, Å (the stability watch).
    pub bond_deviation: f64,
}

/// A file written only by appending, that knows its length.
pub struct AppendFile {
    path: PathBuf,
    writer: BufWriter<File>,
    len: u64,
}

impl AppendFile {
    /// Creates (or empties) `path`.
    pub fn create(path: &Path) -> Result<Self> {
        let file = File::create(path).map_err(|e| io_err(path, e))?;
        Ok(Self {
            path: path.into(),
            writer: BufWriter::new(file),
            len: 0,
        })
    }

    /// Opens `path` to continue after its first `len` bytes (what a restart file recorded);
    /// anything after them was written after that restart and will be written again.
    pub fn resume(path: &Path, len: u64) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| io_err(path, e))?;
        let actual = file.metadata().map_err(|e| io_err(path, e))?.len();
        if actual < len {
            return Err(Error::Md(format!(
                "{}: {actual} bytes, but the restart file says {len} were written: the file was \
                 truncated or replaced since",
                path.display()
            )));
        }
        file.set_len(len).map_err(|e| io_err(path, e))?;
        let mut file = file;
        use std::io::Seek;
        file.seek(std::io::SeekFrom::End(0))
            .map_err(|e| io_err(path, e))?;
        Ok(Self {
            path: path.into(),
            writer: BufWriter::new(file),
            len,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.writer
            .write_all(bytes)
            .and_then(|_| self.writer.flush())
            .map_err(|e| io_err(&self.path, e))?;
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// Flushes to the disk and returns the length, for a restart file to record.
    pub fn sync(&mut self) -> Result<u64> {
        self.writer
            .flush()
            .and_then(|_| self.writer.get_ref().sync_data())
            .map_err(|e| io_err(&self.path, e))?;
        Ok(self.len)
    }
}

fn io_err(path: &Path, source: std::io::Error) -> Error {
    Error::Io {
        path: path.into(),
        source,
    }
}

/// Appends one log row.
pub fn write_log(file: &mut AppendFile, r: &LogRecord) -> Result<()> {
    let mut line = serde_json::to_string(r).map_err(|e| Error::Md(e.to_string()))?;
    line.push('\n');
    file.write(line.as_bytes())
}

/// The first `len` bytes of a log as records (a resumed run's history). Errors name the line.
pub fn read_log(path: &Path, len: u64) -> Result<Vec<LogRecord>> {
    let mut text = String::new();
    File::open(path)
        .and_then(|f| f.take(len).read_to_string(&mut text))
        .map_err(|e| io_err(path, e))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(k, l)| {
            serde_json::from_str(l)
                .map_err(|e| Error::Md(format!("{}: line {}: {e}", path.display(), k + 1)))
        })
        .collect()
}

/// A trajectory frame as ASE writes one: positions, energy, forces, `momenta` (amu·Å per ASE
/// time unit, which `ase.io.read` gives back as `atoms.get_momenta()`), step and time.
pub struct Frame<'a> {
    pub system: &'a Structure,
    pub positions: Vec<[f64; 3]>,
    pub velocities: Vec<[f64; 3]>,
    pub masses: &'a [f64],
    pub energy: f64,
    pub forces: Vec<[f64; 3]>,
    pub step: u64,
    pub time_fs: f64,
}

/// Appends one frame.
pub fn write_frame(file: &mut AppendFile, f: Frame) -> Result<()> {
    let momenta = f
        .velocities
        .iter()
        .zip(f.masses)
        .flat_map(|(v, m)| v.map(|x| format!("{:e}", m * x)))
        .collect();
    let s = Structure {
        positions: f.positions,
        energy: Some(f.energy),
        forces: Some(f.forces),
        info: vec![
            ("step".into(), f.step.to_string()),
            ("time_fs".into(), format!("{}", f.time_fs)),
        ],
        arrays: vec![ExtraArray {
            name: "momenta".into(),
            kind: 'R',
            ncols: 3,
            values: momenta,
        }],
        ..f.system.clone()
    };
    let mut buf = Vec::new();
    write_extxyz_to(&mut buf, std::slice::from_ref(&s))?;
    file.write(&buf)
}
