//! `mlff_distiller._native`: the engine as Python sees it. A `Model` (a checkpoint on a
//! device) computes batches from NumPy arrays; a `Session` keeps one system's neighbour list
//! (with a skin), device buffers and CUDA graphs between calls, for ASE's calculator; `run_md`
//! drives the MD engine; `main` runs the `mlff` command in process. The GIL is released while
//! the engine computes. The Python package (`mlff_distiller/`) wraps these in ASE terms.

mod arrays;
mod md;
mod model;

use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// A Rust error as the Python exception a user expects: a missing file is
/// `FileNotFoundError`, bad input `ValueError`, anything else `RuntimeError`.
pub(crate) fn to_py(e: mlff_distiller::Error) -> PyErr {
    use mlff_distiller::Error;
    let msg = e.to_string();
    match &e {
        Error::Io { cause, .. } if cause.kind() == std::io::ErrorKind::NotFound => {
            PyFileNotFoundError::new_err(msg)
        }
        Error::Io { .. } | Error::Device(_) | Error::Candle(_) | Error::Interrupted(_) => {
            PyRuntimeError::new_err(msg)
        }
        _ => PyValueError::new_err(msg),
    }
}

/// Runs the `mlff` command line with `args` (without the program name) in this process, the
/// GIL released. Returns its exit status and its error message, if it failed with one (clap's
/// usage errors and help print themselves).
#[pyfunction]
fn run_command(py: Python<'_>, args: Vec<String>) -> (i32, Option<String>) {
    let argv = std::iter::once("mlff".to_string()).chain(args);
    py.detach(move || match mlff_distiller::cli::run(argv) {
        Ok(code) => (exit_status(code), None),
        Err(e) => (1, Some(format!("{e:#}"))),
    })
}

/// The masses (amu) the engine uses for `numbers`.
#[pyfunction]
fn masses(numbers: Vec<i64>) -> PyResult<Vec<f64>> {
    let z = (numbers.iter().enumerate())
        .map(|(i, &v)| arrays::atomic_number(i, v))
        .collect::<PyResult<Vec<u8>>>()?;
    mlff_distiller::md::masses(&z).map_err(to_py)
}

/// The number in an `ExitCode` (which keeps it private).
fn exit_status(code: std::process::ExitCode) -> i32 {
    let text = format!("{code:?}");
    text.chars()
        .filter(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .unwrap_or(1)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<model::Model>()?;
    m.add_class::<model::Session>()?;
    m.add_function(wrap_pyfunction!(run_command, m)?)?;
    m.add_function(wrap_pyfunction!(masses, m)?)?;
    m.add_function(wrap_pyfunction!(md::run_md, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
