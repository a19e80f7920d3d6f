//! Inputs and outputs of the fused update block (`ops::update_tc`, `update_tc_adjoint`) and of
//! the separate ops it replaces, shared by the CPU test of its twin and the GPU test.

use super::fused::random;
use candle_core::{DType, Device, Result, Tensor};
use mlff_distiller::ops::{
    act_grad, mlp_tc, mlp_tc_adjoint, tf32_split, update_combine, update_combine_adjoint,
    update_context, update_context_adjoint, update_tc, update_tc_adjoint, ContextMlp, StateGrad,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The fused update's feature and hidden width.
pub const F: usize = 128;

/// One case's inputs on the CPU: the messaged state [4N, F], mixed [3N, 2F], the context MLP
/// (w1 [F, 2F], b1 [F], w2 [3F, F], its output bias [3F]) and the gradient of the next state
/// (gx [N, F]; gm [4N, F], gve and gvj [3N, F] from a next block).
pub struct UpdateInputs {
    pub state: Tensor,
    pub mixed: Tensor,
    pub w1: Tensor,
    pub b1: Tensor,
    pub w2: Tensor,
    pub act_bias: Tensor,
    pub gx: Tensor,
    pub gm: Tensor,
    pub gve: Tensor,
    pub gvj: Tensor,
}

/// Features of order one, weights scaled by 1/√(inputs) as a trained layer's.
pub fn update_inputs(n: usize, dtype: DType, seed: u64) -> UpdateInputs {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut r = |shape: &[usize], scale: f64| random(&mut rng, shape, scale, dtype);
    UpdateInputs {
        state: r(&[4 * n, F], 1.0),
        mixed: r(&[3 * n, 2 * F], 1.0),
        w1: r(&[F, 2 * F], 1.7 / (2.0 * F as f64).sqrt()),
        b1: r(&[F], 0.5),
        w2: r(&[3 * F, F], 1.7 / (F as f64).sqrt()),
        act_bias: r(&[3 * F], 0.5),
        gx: r(&[n, F], 1.0),
        gm: r(&[4 * n, F], 1.0),
        gve: r(&[3 * n, F], 1.0),
        gvj: r(&[3 * n, F], 1.0),
    }
}

/// (name, output) of the update and its adjoint on `dev`, with and without a next block:
/// `fused` through `update_tc`, else through the separate ops (context, MLP, combine).
pub fn update_outputs(
    x: &UpdateInputs,
    dev: &Device,
    fused: bool,
) -> Result<Vec<(&'static str, Tensor)>> {
    let on = |t: &Tensor| t.to_device(dev);
    let split = |t: &Tensor| tf32_split(&t.to_device(dev)?);
    let split_t = |t: &Tensor| split(&t.t()?.contiguous()?);
    let (state, mixed) = (on(&x.state)?, on(&x.mixed)?);
    let (b1, act_bias) = (on(&x.b1)?, on(&x.act_bias)?);
    let (w1, w2, w2t, w1t) = (
        split(&x.w1)?,
        split(&x.w2)?,
        split_t(&x.w2)?,
        split_t(&x.w1)?,
    );
    let (gx, gm, gve, gvj) = (on(&x.gx)?, on(&x.gm)?, on(&x.gve)?, on(&x.gvj)?);
    let (pre, act, next) = match fused {
        true => {
            let mlp = ContextMlp {
                w1: &w1,
                b1: &b1,
                w2: &w2,
                act_bias: &act_bias,
            };
            let u = update_tc(&state, &mixed, &mlp)?;
            (u.pre, u.act, u.next)
        }
        false => {
            let (pre, act) = mlp_tc(&update_context(&state, &mixed)?, &w1, &b1, &w2)?;
            let next = update_combine(&state, &mixed, &act, &act_bias)?;
            (pre, act, next)
        }
    };
    let mut out = vec![
        ("context MLP pre-activation", pre.clone()),
        ("context MLP output", act.clone()),
        ("next state", next),
    ];
    let adjoint = |grad: &StateGrad| match fused {
        true => {
            let mlp = ContextMlp {
                w1: &w2t,
                b1: &b1,
                w2: &w1t,
                act_bias: &act_bias,
            };
            update_tc_adjoint(&mixed, &act, &pre, &mlp, grad)
        }
        false => {
            let combined = update_combine_adjoint(&mixed, &act, &act_bias, grad)?;
            let n = pre.dim(0)?;
            let g_act = act_grad(&combined, n, F)?;
            let g_ctx = mlp_tc_adjoint(&g_act, &pre, &b1, &w2t, &w1t)?;
            update_context_adjoint(&mixed, &g_ctx, &combined)
        }
    };
    let cases = [
        (None, ["dL/d(state)", "dL/d(mixed)"]),
        (
            Some((&gm, &gve, &gvj)),
            ["dL/d(state), next block", "dL/d(mixed), next block"],
        ),
    ];
    for (next, [state_name, mixed_name]) in cases {
        let (g_state, g_mixed) = adjoint(&StateGrad { gx: &gx, next })?;
        out.push((state_name, g_state));
        out.push((mixed_name, g_mixed));
    }
    Ok(out)
}
