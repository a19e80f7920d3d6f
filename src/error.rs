//! Library errors. Every variant names the cause: file and line, tensor name, atom index.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cause is part of the message and not a `source()` as well, so that a chain of
    /// errors printed whole says it once.
    #[error("{path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },

    /// Malformed extended XYZ. `frame` counts from 0, `line` from 1.
    #[error("{path}: frame {frame}, line {line}: {msg}")]
    Xyz {
        path: PathBuf,
        frame: usize,
        line: usize,
        msg: String,
    },

    /// A JSON file (report, restart) that cannot be written or read as what it should hold.
    #[error("{path}: {msg}")]
    Json { path: PathBuf, msg: String },

    /// An output that would replace an input or another output, exists already, or is being
    /// written by another run (the message names the flags, the paths and the holder).
    #[error("{0}")]
    Output(String),

    /// The run was stopped by a signal (SIGINT is 2, SIGTERM 15) after saving what it had.
    #[error("stopped by signal {0}")]
    Interrupted(i32),

    #[error("invalid structure: {0}")]
    Structure(String),

    #[error("neighbour list: {0}")]
    NeighborList(String),

    #[error("element Z={z} (structure {structure}, atom {atom}) is not in the model's elements {known:?}")]
    UnknownElement {
        z: u8,
        structure: usize,
        atom: usize,
        known: Vec<u8>,
    },

    #[error("model config: {0}")]
    Config(String),

    /// Bad training or evaluation data: names the file and the frame.
    #[error("{path}: frame {frame}: {msg}")]
    Data {
        path: PathBuf,
        frame: usize,
        msg: String,
    },

    #[error("training: {0}")]
    Train(String),

    /// A distillation run (`mlff distill`): its settings, its teacher, its folder.
    #[error("distill: {0}")]
    Distill(String),

    #[error("checkpoint {path}: {kind}")]
    Checkpoint {
        path: PathBuf,
        kind: CheckpointError,
    },

    /// Molecular dynamics setup or run (bad settings, overlapping atoms, restart files).
    #[error("md: {0}")]
    Md(String),

    /// A position, energy or force became NaN or infinite (an MD run that blew up).
    #[error("non-finite values: {0}")]
    NonFinite(String),

    /// A model's energy or force came out NaN or infinite; `structure` counts within the
    /// batch or prediction, and callers that know the file say which frame it was.
    #[error("structure {structure}: {what} (not finite)")]
    NonFiniteResult { structure: usize, what: String },

    #[error("device: {0}")]
    Device(String),

    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

impl Error {
    /// The same error with the structure it names (in a batch) counted `by` further, for a
    /// batch that starts at structure `by` of a larger set.
    pub fn shifted(self, by: usize) -> Self {
        let renumber = |m: String| match m
            .strip_prefix("structure ")
            .and_then(|r| r.split_once(": "))
        {
            Some((k, rest)) => match k.parse::<usize>() {
                Ok(k) => format!("structure {}: {rest}", k + by),
                Err(_) => m,
            },
            None => m,
        };
        match self {
            Error::NonFiniteResult { structure, what } => Error::NonFiniteResult {
                structure: structure + by,
                what,
            },
            Error::UnknownElement {
                z,
                structure,
                atom,
                known,
            } => Error::UnknownElement {
                z,
                structure: structure + by,
                atom,
                known,
            },
            Error::Structure(m) => Error::Structure(renumber(m)),
            Error::NeighborList(m) => Error::NeighborList(renumber(m)),
            other => other,
        }
    }
}

/// What is wrong with a checkpoint file; one variant per kind of defect so callers and tests
/// can tell them apart.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("not a safetensors file: {0}")]
    NotSafetensors(String),
    #[error("header metadata is missing the key `{0}`")]
    MissingMetadata(&'static str),
    #[error("unsupported format version `{found}` (this build reads version {supported})")]
    UnsupportedVersion { found: String, supported: u32 },
    #[error("metadata `{key}` is invalid: {msg}")]
    BadMetadata { key: &'static str, msg: String },
    #[error("tensors missing: {0:?}")]
    MissingTensors(Vec<String>),
    #[error("unexpected tensors: {0:?}")]
    ExtraTensors(Vec<String>),
    #[error("tensor shapes differ from the config: {}", fmt_shapes(.0))]
    ShapeMismatch(Vec<(String, Vec<usize>, Vec<usize>)>),
    #[error("tensor `{name}` has dtype {found}, expected F32 or F64")]
    BadDtype { name: String, found: String },
}

fn fmt_shapes(v: &[(String, Vec<usize>, Vec<usize>)]) -> String {
    v.iter()
        .map(|(n, found, want)| format!("`{n}` is {found:?}, expected {want:?}"))
        .collect::<Vec<_>>()
        .join("; ")
}

pub type Result<T> = std::result::Result<T, Error>;
