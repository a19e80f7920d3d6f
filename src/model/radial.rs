//! Radial basis and cutoff of the filter network.

use candle_core::{Result, Tensor};

/// Gaussians exp(-(d - μ_k)² / 2σ²) with `n` centres evenly spaced on [0, cutoff] and σ the
/// spacing (schnetpack's GaussianRBF). `d` is \[E\]; returns [E, n].
pub fn gaussian_rbf(d: &Tensor, n: usize, cutoff: f64) -> Result<Tensor> {
    let width = cutoff / (n - 1) as f64;
    let centres: Vec<f64> = (0..n).map(|k| k as f64 * width).collect();
    let centres = Tensor::new(centres, d.device())?
        .to_dtype(d.dtype())?
        .unsqueeze(0)?;
    let diff = d.unsqueeze(1)?.broadcast_sub(&centres)?;
    (diff.sqr()? * (-0.5 / (width * width)))?.exp()
}

/// Cosine cutoff ½(cos(π d / r_c) + 1) for d < r_c, else 0. `d` is \[E\]; returns \[E\].
pub fn cosine_cutoff(d: &Tensor, cutoff: f64) -> Result<Tensor> {
    let inside = d.lt(cutoff)?.to_dtype(d.dtype())?;
    let smooth = ((d * (std::f64::consts::PI / cutoff))?.cos()? + 1.0)? * 0.5;
    smooth? * inside
}
