//! Inputs and outputs of the tensor-core dense layers (`ops::dense_tc`), shared by the CPU test
//! against candle's matmul and backprop and the GPU test against the CPU twins.

use super::fused::random;
use candle_core::{DType, Device, Result, Tensor};
use mlff_distiller::ops::{
    dense_tc, dense_tc_adding, mlp_tc, mlp_tc_adjoint, readout_tc, tc_weights,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Rows, inputs, hidden width and outputs of one case.
#[derive(Clone, Copy, Debug)]
pub struct Layers {
    pub n: usize,
    pub k: usize,
    pub h: usize,
    pub j: usize,
}

/// A case of `n` rows, `k` inputs, hidden width `h` and `j` outputs.
pub const fn layers(n: usize, k: usize, h: usize, j: usize) -> Layers {
    Layers { n, k, h, j }
}

/// The inputs of every op for one case, on the CPU.
pub struct LayerInputs {
    pub x: Tensor,
    /// Weights output-major (the ops take them padded by `tc_weights`): w1 [H, K], w2 [J, H],
    /// wide [J, K].
    pub w1: Tensor,
    pub b1: Tensor,
    pub w2: Tensor,
    pub wide: Tensor,
    /// dL/d(output) [N, J] for the adjoint.
    pub g: Tensor,
}

/// Features of order one, weights scaled by 1/√(inputs) as a trained layer's.
pub fn layer_inputs(c: Layers, dtype: DType, seed: u64) -> LayerInputs {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let Layers { n, k, h, j } = c;
    LayerInputs {
        x: random(&mut rng, &[n, k], 2.0, dtype),
        w1: random(&mut rng, &[h, k], 1.7 / (k as f64).sqrt(), dtype),
        b1: random(&mut rng, &[h], 0.5, dtype),
        w2: random(&mut rng, &[j, h], 1.7 / (h as f64).sqrt(), dtype),
        wide: random(&mut rng, &[j, k], 1.7 / (k as f64).sqrt(), dtype),
        g: random(&mut rng, &[n, j], 1.0, dtype),
    }
}

/// (name, output) of the three ops on `dev`; the adjoint takes the forward's pre-activation.
pub fn layer_outputs(x: &LayerInputs, dev: &Device) -> Result<Vec<(&'static str, Tensor)>> {
    let on = |t: &Tensor| t.to_device(dev);
    let padded = |t: &Tensor| tc_weights(&t.to_device(dev)?);
    let padded_t = |t: &Tensor| padded(&t.t()?.contiguous()?);
    let b1 = on(&x.b1)?;
    let single = dense_tc(&on(&x.x)?, &padded(&x.wide)?)?;
    // The same layer plus g [N, J] (as the mixing layer's adjoint adds a gradient).
    let adding = dense_tc_adding(&on(&x.x)?, &padded(&x.wide)?, &on(&x.g)?)?;
    let (pre, y) = mlp_tc(&on(&x.x)?, &padded(&x.w1)?, &b1, &padded(&x.w2)?)?;
    let gx = mlp_tc_adjoint(&on(&x.g)?, &pre, &b1, &padded_t(&x.w2)?, &padded_t(&x.w1)?)?;
    Ok(vec![
        ("dense", single),
        ("dense, adding", adding),
        ("mlp pre-activation", pre),
        ("mlp output", y),
        ("mlp adjoint", gx),
    ])
}

/// The readout's inputs (`ops::readout_tc`) on the CPU: rows x [N, K], hidden weights w1 [H, K]
/// and bias b1 [H], output weights w [H], per-element constants [4] and element indices [N].
pub struct ReadoutInputs {
    pub x: Tensor,
    pub w1: Tensor,
    pub b1: Tensor,
    pub w: Tensor,
    pub constant: Tensor,
    pub species: Tensor,
}

pub fn readout_inputs(n: usize, k: usize, h: usize, dtype: DType, seed: u64) -> ReadoutInputs {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let species: Vec<u32> = (0..n as u32).map(|a| (a * 7 + 3) % 4).collect();
    ReadoutInputs {
        x: random(&mut rng, &[n, k], 2.0, dtype),
        w1: random(&mut rng, &[h, k], 1.7 / (k as f64).sqrt(), dtype),
        b1: random(&mut rng, &[h], 0.5, dtype),
        w: random(&mut rng, &[h], 1.7 / (h as f64).sqrt(), dtype),
        constant: random(&mut rng, &[4], 10.0, dtype),
        species: Tensor::new(species, &Device::Cpu).unwrap(),
    }
}

/// (name, output) of `ops::readout_tc` on `dev`: the energies and −∂(Σ energies)/∂x.
pub fn readout_outputs(x: &ReadoutInputs, dev: &Device) -> Result<Vec<(&'static str, Tensor)>> {
    let on = |t: &Tensor| t.to_device(dev);
    let padded = |t: &Tensor| tc_weights(&t.to_device(dev)?);
    let w1t = x.w1.t()?.contiguous()?;
    let (energies, seed) = readout_tc(
        &on(&x.x)?,
        &padded(&x.w1)?,
        &on(&x.b1)?,
        &on(&x.w)?,
        &padded(&w1t)?,
        &on(&x.constant)?,
        &on(&x.species)?,
    )?;
    Ok(vec![
        ("readout energies", energies),
        ("readout −dE/dx", seed),
    ])
}
