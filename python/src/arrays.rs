//! NumPy arrays in and out: shapes and values checked with errors naming the argument, the
//! index and the value, as `ValueError`.

use numpy::ndarray::{Array2, ArrayView2};
use numpy::{IntoPyArray, PyArray2};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

pub(crate) fn bad(msg: String) -> PyErr {
    PyValueError::new_err(msg)
}

/// Element `i` of `numbers` as an atomic number (1-255).
pub(crate) fn atomic_number(i: usize, value: i64) -> PyResult<u8> {
    u8::try_from(value)
        .ok()
        .filter(|&z| z > 0)
        .ok_or_else(|| bad(format!("numbers[{i}] = {value} is not an atomic number")))
}

/// The rows of an [n, 3] array `name`.
pub(crate) fn rows(a: ArrayView2<'_, f64>, name: &str, n: usize) -> PyResult<Vec<[f64; 3]>> {
    if a.shape() != [n, 3] {
        return Err(bad(format!(
            "{name}: shape {:?}, expected [{n}, 3]",
            a.shape()
        )));
    }
    Ok(a.rows().into_iter().map(|r| [r[0], r[1], r[2]]).collect())
}

/// Rows as an [n, 3] NumPy array.
pub(crate) fn array<'py>(py: Python<'py>, rows: &[[f64; 3]]) -> Bound<'py, PyArray2<f64>> {
    Array2::from_shape_fn((rows.len(), 3), |(i, d)| rows[i][d]).into_pyarray(py)
}
