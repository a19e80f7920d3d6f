//! Library errors. Every variant names the cause: file and line, tensor name, atom index.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
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

    #[error("device: {0}")]
    Device(String),

    #[error(transparent)]
    Candle(#[from] candle_core::Error),
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
