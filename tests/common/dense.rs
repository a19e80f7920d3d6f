//! Inputs and outputs of the tensor-core dense layers (`ops::dense_tc`), shared by the CPU test
//! against candle's matmul and backprop and the GPU test against the CPU twins.

use super::fused::random;
use candle_core::{DType, Device, Result, Tensor};
use mlff_distiller::ops::{
    act_grad, dense_tc, dense_tc_adding, mlp_tc, mlp_tc_adjoint, readout_tc, tc_weights,
    update_combine, update_combine_adjoint, update_context, update_context_adjoint, update_tc,
    update_tc_adjoint, StateGrad, UpdateOutputs,
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

/// The update block's inputs (`ops::update_tc`) on the CPU: the state after the messages
/// [4N, F], the mixing weight [2F, F], the context MLP's w1 [F, 2F], b1 \[F\], w2 [3F, F] and
/// its output bias [3F].
pub struct UpdateInputs {
    pub state: Tensor,
    pub mix: Tensor,
    pub w1: Tensor,
    pub b1: Tensor,
    pub w2: Tensor,
    pub act_bias: Tensor,
}

pub fn update_inputs(n: usize, f: usize, dtype: DType, seed: u64) -> UpdateInputs {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let w = |rng: &mut ChaCha8Rng, rows: usize, k: usize| {
        random(rng, &[rows, k], 1.7 / (k as f64).sqrt(), dtype)
    };
    UpdateInputs {
        state: random(&mut rng, &[4 * n, f], 2.0, dtype),
        mix: w(&mut rng, 2 * f, f),
        w1: w(&mut rng, f, 2 * f),
        b1: random(&mut rng, &[f], 0.5, dtype),
        w2: w(&mut rng, 3 * f, f),
        act_bias: random(&mut rng, &[3 * f], 0.5, dtype),
    }
}

/// (name, output) of the update block on `dev`: in one launch (`one`, `ops::update_tc`) or as
/// the mixing layer, context, context MLP and combination apart.
pub fn update_outputs(
    x: &UpdateInputs,
    dev: &Device,
    one: bool,
) -> Result<Vec<(&'static str, Tensor)>> {
    let on = |t: &Tensor| t.to_device(dev);
    let padded = |t: &Tensor| tc_weights(&t.to_device(dev)?);
    let (state, b1, act_bias) = (on(&x.state)?, on(&x.b1)?, on(&x.act_bias)?);
    let (mix, w1, w2) = (padded(&x.mix)?, padded(&x.w1)?, padded(&x.w2)?);
    let out = match one {
        true => update_tc(&state, &mix, &w1, &b1, &w2, &act_bias)?,
        false => {
            let n = state.dim(0)? / 4;
            let mixed = dense_tc(&state.narrow(0, n, 3 * n)?, &mix)?;
            let ctx = update_context(&state, &mixed)?;
            let (ctx_pre, act) = mlp_tc(&ctx, &w1, &b1, &w2)?;
            let next = update_combine(&state, &mixed, &act, &act_bias)?;
            UpdateOutputs {
                next,
                mixed,
                ctx_pre,
                act,
            }
        }
    };
    Ok(vec![
        ("update next state", out.next),
        ("update mixed", out.mixed),
        ("update context pre-activation", out.ctx_pre),
        ("update context output", out.act),
    ])
}

/// The gradient at the update block's output for [`update_adjoint_outputs`]: gx and gm [N, F]
/// on s, gve and gvj [3N, F] on v.
pub struct UpdateGrads {
    pub gx: Tensor,
    pub gm: Tensor,
    pub gve: Tensor,
    pub gvj: Tensor,
}

pub fn update_grads(n: usize, f: usize, dtype: DType, seed: u64) -> UpdateGrads {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut g = |rows: usize| random(&mut rng, &[rows, f], 1.0, dtype);
    UpdateGrads {
        gx: g(n),
        gm: g(n),
        gve: g(3 * n),
        gvj: g(3 * n),
    }
}

/// (name, output) of the update block's adjoint on `dev` for the tape of its forward there
/// (`ops::update_tc`), with the next block's gradients where `has_next`: in one launch (`one`,
/// `ops::update_tc_adjoint`) or as the combination's, the context MLP's, the context's and the
/// mixing layer's adjoints apart. Gives dL/ds [N, F] and dL/dv [3N, F].
pub fn update_adjoint_outputs(
    x: &UpdateInputs,
    g: &UpdateGrads,
    has_next: bool,
    dev: &Device,
    one: bool,
) -> Result<Vec<(&'static str, Tensor)>> {
    let on = |t: &Tensor| t.to_device(dev);
    let padded = |t: &Tensor| tc_weights(&t.to_device(dev)?);
    let padded_t = |t: &Tensor| padded(&t.t()?.contiguous()?);
    let (state, b1, act_bias) = (on(&x.state)?, on(&x.b1)?, on(&x.act_bias)?);
    let tape = update_tc(
        &state,
        &padded(&x.mix)?,
        &padded(&x.w1)?,
        &b1,
        &padded(&x.w2)?,
        &act_bias,
    )?;
    let (w2t, w1t, mix_t) = (padded_t(&x.w2)?, padded_t(&x.w1)?, padded_t(&x.mix)?);
    let (gx, gm, gve, gvj) = (on(&g.gx)?, on(&g.gm)?, on(&g.gve)?, on(&g.gvj)?);
    let grad = StateGrad {
        gx: &gx,
        next: has_next.then_some((&gm, &gve, &gvj)),
    };
    let (mixed, act, pre) = (&tape.mixed, &tape.act, &tape.ctx_pre);
    let (g_s, g_v) = match one {
        true => update_tc_adjoint(mixed, act, &act_bias, pre, &b1, &grad, &w2t, &w1t, &mix_t)?,
        false => {
            let (n, f) = pre.dims2()?;
            let combined = update_combine_adjoint(mixed, act, &act_bias, &grad)?;
            let g_ctx = mlp_tc_adjoint(&act_grad(&combined, n, f)?, pre, &b1, &w2t, &w1t)?;
            let (g_state, g_mixed) = update_context_adjoint(mixed, &g_ctx, combined)?;
            let g_v = dense_tc_adding(&g_mixed, &mix_t, &g_state.narrow(0, n, 3 * n)?)?;
            (g_state.narrow(0, 0, n)?, g_v)
        }
    };
    Ok(vec![
        ("update adjoint dL/ds", g_s),
        ("update adjoint dL/dv", g_v),
    ])
}
