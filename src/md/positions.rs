//! Positions between host and device, and the Verlet displacement measure. Apart from the force
//! providers so that the whole-step graph and the driver use them without depending on
//! `forces` (which depends on both).

use crate::error::{Error, Result};
use candle_core::{DType, Device, Tensor};

/// Σ and max over atoms of |x − reference|², as a \[2\] tensor (one host read for both: max()
/// may skip NaN on the GPU; the sum carries it).
pub fn displacement2(positions: &Tensor, reference: &Tensor) -> Result<Tensor> {
    Ok(crate::ops::md_displacement2(positions, reference)?)
}

/// The max of a [`displacement2`] pair [Σ, max], or NaN where the sum shows a position that
/// is not finite.
pub(super) fn largest_displacement2(both: &[f64]) -> f64 {
    if both[0].is_finite() {
        both[1]
    } else {
        f64::NAN
    }
}

/// The error for positions that are not all finite, naming the first such atom.
pub(super) fn non_finite_atom(positions: &Tensor) -> Error {
    let host = match host_positions(positions) {
        Ok(h) => h,
        Err(e) => return e,
    };
    let (i, p) = host
        .iter()
        .enumerate()
        .find(|(_, p)| p.iter().any(|x| !x.is_finite()))
        .map(|(i, p)| (i, *p))
        .unwrap_or((0, host.first().copied().unwrap_or_default()));
    Error::NonFinite(format!("atom {i} is at {p:?}"))
}

/// Host positions of an [N, 3] f64 tensor.
pub fn host_positions(t: &Tensor) -> Result<Vec<[f64; 3]>> {
    Ok(t.to_dtype(DType::F64)?
        .to_vec2::<f64>()?
        .into_iter()
        .map(|r| [r[0], r[1], r[2]])
        .collect())
}

/// An [N, 3] f64 tensor from host rows.
pub fn device_positions(rows: &[[f64; 3]], device: &Device) -> Result<Tensor> {
    let flat: Vec<f64> = rows.iter().flatten().copied().collect();
    Ok(Tensor::from_vec(flat, (rows.len(), 3), device)?)
}
