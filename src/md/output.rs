//! MD output files: the JSON-lines energy log and the extended-XYZ trajectory, both appended and
//! flushed record by record, and cut back to a restart's recorded length on resume (so a resumed
//! run's files equal an uninterrupted run's).

use super::settings::MdOutputs;
use crate::error::{Error, Result};
use crate::fsutil::sha256_hex;
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
    /// Pressure in bar (`log_pressure` runs of periodic cells): the kinetic part 2 E_kin / 3V
    /// less a third of the stress's trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure_bar: Option<f64>,
    /// NPT runs: the cell volume (Å³), the density (g/cm³), and the effective energy (eV):
    /// E_tot + P₀V + the heat exchanged with thermostat and barostat, constant up to the time
    /// step's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub density: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e_eff: Option<f64>,
}

/// A file written only by appending, that knows its length and its last record (what a
/// restart file records to recognise the file later).
pub struct AppendFile {
    path: PathBuf,
    writer: BufWriter<File>,
    len: u64,
    /// Where the last record written by this process starts, and its bytes.
    last: Option<(u64, Vec<u8>)>,
    /// The last record before that (from the restart file a run resumed from).
    earlier: Option<Tail>,
}

/// An output's last record as a restart file records it: where it starts and the SHA-256 of
/// its bytes (up to the recorded length).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tail {
    pub start: u64,
    pub sha256: String,
}

impl AppendFile {
    /// Creates (or empties) `path`.
    pub fn create(path: &Path) -> Result<Self> {
        let file = File::create(path).map_err(|e| io_err(path, e))?;
        Ok(Self {
            path: path.into(),
            writer: BufWriter::new(file),
            len: 0,
            last: None,
            earlier: None,
        })
    }

    /// Opens `path` to add to its end (creating it if missing).
    pub fn append(path: &Path) -> Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| io_err(path, e))?;
        let len = file.metadata().map_err(|e| io_err(path, e))?.len();
        Ok(Self {
            path: path.into(),
            writer: BufWriter::new(file),
            len,
            last: None,
            earlier: None,
        })
    }

    /// Opens `path` to continue after its first `len` bytes (what a restart file recorded);
    /// anything after them was written after that restart and will be written again.
    pub fn resume(path: &Path, len: u64, tail: Option<Tail>) -> Result<Self> {
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
            last: None,
            earlier: tail,
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
        self.last = Some((self.len, bytes.to_vec()));
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// The last record written by this process, if any.
    pub fn tail(&self) -> Option<Tail> {
        match &self.last {
            Some((start, bytes)) => Some(Tail {
                start: *start,
                sha256: sha256_hex(bytes),
            }),
            None => self.earlier.clone(),
        }
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
        cause: source,
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
    read_log_as(path, len)
}

/// [`read_log`] for any record type (a batch's log rows carry the system index).
pub fn read_log_as<T: serde::de::DeserializeOwned>(path: &Path, len: u64) -> Result<Vec<T>> {
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
    /// The system's index in a batch run (written as the frame's `system` key).
    pub index: Option<usize>,
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
        info: [
            ("step".into(), f.step.to_string()),
            ("time_fs".into(), format!("{}", f.time_fs)),
        ]
        .into_iter()
        .chain(f.index.map(|k| ("system".into(), k.to_string())))
        .collect(),
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

/// Opens the trajectory and log (fresh, or cut back to a restart's lengths) and checks that
/// the restart file's folder can be written, all before step 0.
pub(super) fn open_outputs(
    out: &MdOutputs,
    resume: Option<[(Option<u64>, Option<Tail>); 2]>,
) -> Result<(Option<AppendFile>, Option<AppendFile>)> {
    type Recorded = Option<(Option<u64>, Option<Tail>)>;
    let open = |path: &Option<PathBuf>, recorded: Recorded| -> Result<Option<AppendFile>> {
        match (path, recorded) {
            (None, _) => Ok(None),
            (Some(p), None) if out.append => AppendFile::append(p).map(Some),
            (Some(p), None) => AppendFile::create(p).map(Some),
            (Some(p), Some((Some(len), tail))) => AppendFile::resume(p, len, tail).map(Some),
            (Some(p), Some((None, _))) => Err(Error::Md(format!(
                "{}: the restart file records no length for this output",
                p.display()
            ))),
        }
    };
    if let Some(r) = &out.restart {
        probe_writable(r)?;
    }
    let [traj_at, log_at] = resume.map_or([None, None], |r| r.map(Some));
    let traj = open(&out.traj, traj_at)?;
    let log = open(&out.log, log_at)?;
    Ok((traj, log))
}

/// Fails now, naming the path, if a file cannot be created beside `path`.
fn probe_writable(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let probe = dir.join(format!(".mlff-probe.{}", std::process::id()));
    std::fs::File::create(&probe)
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|source| Error::Io {
            path: path.into(),
            cause: source,
        })
}
