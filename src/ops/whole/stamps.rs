//! Phase stamps of the one-launch kernels: block 0 records the GPU's global timer at each mark
//! after the output (kernels/include/grid.cuh Stamps; read with the `profiling` feature).

#[cfg(feature = "profiling")]
use candle_core::{DType, Result, Tensor};

/// Room for the phase stamps (8 bytes each) after the scratch.
const STAMP_ELEMENTS: usize = 2 * 64;

/// Output elements a one-kernel launch adds after `out_len` for its phase stamps.
pub(crate) const fn stamp_room() -> usize {
    1 + STAMP_ELEMENTS
}

/// The phases `names` with their microseconds, from the stamps (u64 nanoseconds) that a
/// kernel's block 0 wrote after its `out_len` output elements, at the next even element
/// (kernels/grid.cuh Stamps): one stamp more than phases.
#[cfg(feature = "profiling")]
pub(crate) fn phase_times(
    out: &Tensor,
    out_len: usize,
    names: Vec<String>,
) -> Result<Vec<(String, f64)>> {
    let at = (out_len + 1) & !1;
    let raw = out.narrow(0, at, STAMP_ELEMENTS.min(out.dim(0)? - at))?;
    let ns: Vec<u64> = match raw.dtype() {
        DType::F32 => (raw.to_vec1::<f32>()?.chunks(2))
            .map(|p| p[0].to_bits() as u64 | (p[1].to_bits() as u64) << 32)
            .collect(),
        _ => (raw.to_vec1::<f64>()?.into_iter())
            .map(f64::to_bits)
            .collect(),
    };
    let stamped = &ns[..(names.len() + 1).min(ns.len())];
    Ok((names.into_iter())
        .zip(
            stamped
                .windows(2)
                .map(|w| (w[1] as f64 - w[0] as f64) / 1e3),
        )
        .collect())
}
