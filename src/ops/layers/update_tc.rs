//! The PaiNN update block in one launch on tensor cores (kernels/layers/update_tc.cu), forward and
//! adjoint. The forward is the mixing layer, the context, the context MLP and the combination
//! that the separate kernels run as four launches ([`crate::ops::layers::dense_tc`], [`crate::ops::layers::update`]),
//! each writing its result for the next to read back: a block of 16 atoms keeps the context
//! rows, the hidden layer, Uv and <Uv, Vv> in shared memory and writes the new state and the
//! adjoint's tape, as the separate kernels do. The adjoint likewise takes the combination's and
//! the context's adjoints, the context MLP's and the mixing layer's in one launch. CUDA runs
//! f32 students of 128 features (the shipped shape); the CPU twins, the separate ops' twins one
//! after the other, take any width and precision.

use crate::ops::launch::{kernel_source, launch, overlaps_previous, Init, Kernel, Real};
use crate::ops::layers::dense_tc::{
    arranged, check_inputs, check_weights, fit, staged_stride, Dims, Layer, MlpAdjoint, MlpForward,
    TcWeights,
};
use crate::ops::layers::update::{CombineAdj, CombineFwd, ContextAdj, ContextFwd, Rows, StateGrad};
use candle_core::{bail, Result, Tensor};

/// The feature count the CUDA kernel is compiled for (kernels/layers/update_tc.cu `F`).
pub const UPDATE_TC_FEATURES: usize = 128;

/// Atoms per CUDA block (kernels/layers/update_tc.cu `ATOMS`).
const ATOMS: usize = 16;

/// Shared memory of a block in 32-bit words (kernels/layers/update_tc.cu `Smem`): the staged rows
/// (the larger of 48 vector rows of F, and 16 context rows of 2F plus 16 hidden rows of F, two
/// f16 planes each), the context rows in f32, Uv and <Uv, Vv> in f32, then the inverse row
/// scales. (Shared-memory sizes are plain arithmetic, compiled without CUDA too, so that CI's
/// tests check that two blocks fit a multiprocessor.)
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn smem_words(f: usize) -> usize {
    let split = staged(3 * ATOMS, f).max(staged(ATOMS, 2 * f) + staged(ATOMS, f));
    split + ATOMS * (2 * f + 8) + 4 * ATOMS * (f + 8) + 5 * ATOMS
}

/// The adjoint's (kernels/layers/update_tc.cu `AdjointSmem`): the staged rows (the larger of 16 rows
/// of dL/d(act), 3F, plus 16 of the hidden layer's gradient, F, and 48 rows of dL/d(mixed),
/// 2F), dL/d(ctx) and the hidden layer's gradient in f32, then the inverse row scales.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn adjoint_smem_words(f: usize) -> usize {
    let split = (staged(ATOMS, 3 * f) + staged(ATOMS, f)).max(staged(3 * ATOMS, 2 * f));
    split + ATOMS * (2 * f + 8) + ATOMS * (f + 8) + 5 * ATOMS
}

/// 32-bit words of `rows` staged rows of `width` (kernels/include/dense_tc.cuh `staged_words`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn staged(rows: usize, width: usize) -> usize {
    rows * staged_stride(width)
}

/// A launch of one block per 16 atoms with `words` of shared memory.
#[cfg(feature = "cuda")]
fn config(n: usize, words: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
    candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        grid_dim: (n.div_ceil(ATOMS) as u32, 1, 1),
        block_dim: (crate::ops::layers::dense_tc::THREADS, 1, 1),
        shared_mem_bytes: (4 * words) as u32,
    }
}

/// What the update block's forward gives: the new state and the adjoint's tape.
pub struct UpdateOutputs {
    /// The block's output state [4N, F].
    pub next: Tensor,
    /// v W_mixᵀ = [Uv | Vv] [3N, 2F].
    pub mixed: Tensor,
    /// The context MLP's pre-activation [N, F].
    pub ctx_pre: Tensor,
    /// The context MLP's output before its bias [N, 3F] = (a_ss | a_vv | a_sv).
    pub act: Tensor,
}

struct UpdateForward(Rows);

impl Kernel for UpdateForward {
    overlaps_previous!();
    kernel_source!("update_tc_fwd", "update_tc");
    fn function(&self) -> &'static str {
        "update_tc_fwd_128"
    }
    fn work(&self) -> usize {
        self.0.n * self.0.f
    }
    #[cfg(feature = "cuda")]
    fn launch_config(&self, _: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        config(self.0.n, smem_words(self.0.f))
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.0.n, self.0.f]
    }
    /// x = [state, b1, act_bias, W_mix, W1, W2] → [next (4NF) | mixed (6NF) | pre (NF) |
    /// act (3NF)]: the separate ops' twins in turn.
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        let Rows { n, f } = self.0;
        let (state, b1, act_bias) = (x[0], x[1], x[2]);
        let (w_mix, w1, w2) = (x[3], x[4], x[5]);
        let (next, rest) = out.split_at_mut(4 * n * f);
        let (mixed, pre_act) = rest.split_at_mut(6 * n * f);
        // The mixing layer ([3N rows of F] → 2F), then the context MLP (2F → F → 3F).
        let mix = Layer {
            dims: Dims {
                n: 3 * n,
                k: f,
                h: 0,
                j: 2 * f,
            },
            adding: false,
        };
        mix.cpu(&[&state[n * f..], w_mix], idx, mixed);
        let mut ctx = vec![T::zero(); 2 * n * f];
        ContextFwd(self.0).cpu(&[state, mixed], idx, &mut ctx);
        let ctx_mlp = Dims {
            n,
            k: 2 * f,
            h: f,
            j: 3 * f,
        };
        MlpForward(ctx_mlp).cpu(&[&ctx, b1, w1, w2], idx, pre_act);
        let act = &pre_act[n * f..];
        CombineFwd(self.0).cpu(&[state, mixed, act, act_bias], idx, next);
    }
}

struct UpdateAdjoint {
    rows: Rows,
    has_next: bool,
}

impl Kernel for UpdateAdjoint {
    overlaps_previous!();
    kernel_source!("update_tc_adj", "update_tc");
    fn function(&self) -> &'static str {
        "update_tc_adj_128"
    }
    fn work(&self) -> usize {
        self.rows.n * self.rows.f
    }
    #[cfg(feature = "cuda")]
    fn launch_config(&self, _: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        config(self.rows.n, adjoint_smem_words(self.rows.f))
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.rows.n, self.rows.f, self.has_next as usize]
    }
    /// x = [mixed, act, act_bias, gx, gm, gve, gvj, pre, b1, W2ᵀ, W1ᵀ, W_mixᵀ] → [dL/ds (NF) |
    /// dL/dv (3NF)]: the separate ops' twins in turn.
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        let Rows { n, f } = self.rows;
        let nf = n * f;
        let (mixed, pre, b1) = (x[0], x[7], x[8]);
        let (w2t, w1t, w_mix_t) = (x[9], x[10], x[11]);
        // [dL/d(state) (4NF) | dL/d(mixed) (6NF) | dL/d(act) (3NF)]
        let mut combined = vec![T::zero(); 13 * nf];
        let combine = CombineAdj {
            rows: self.rows,
            has_next: self.has_next,
        };
        combine.cpu(&x[..7], idx, &mut combined);
        let mut g_ctx = vec![T::zero(); 2 * nf];
        let mlp = MlpAdjoint(Dims {
            n,
            k: 2 * f,
            h: f,
            j: 3 * f,
        });
        mlp.cpu(&[&combined[10 * nf..], pre, b1, w2t, w1t], idx, &mut g_ctx);
        ContextAdj(self.rows).cpu(&[mixed, &g_ctx], idx, &mut combined);
        let (g_s, g_v) = out.split_at_mut(nf);
        g_s.copy_from_slice(&combined[..nf]);
        let mix = Layer {
            dims: Dims {
                n: 3 * n,
                k: 2 * f,
                h: 0,
                j: f,
            },
            adding: true,
        };
        mix.cpu(
            &[&combined[4 * nf..10 * nf], &combined[nf..4 * nf], w_mix_t],
            idx,
            g_v,
        );
    }
}

/// The update block's forward for the state after the messages `state` [4N, F]: the mixing
/// layer `w_mix` [2F, F], the context MLP `w1` [F, 2F], `b1` \[F\], `w2` [3F, F] (as
/// [`crate::ops::tc_weights`] makes them, output-major) and its output bias `act_bias` \[3F\].
/// The same as [`crate::ops::layers::dense_tc`], [`crate::ops::update_context`], [`crate::ops::mlp_tc`] and
/// [`crate::ops::update_combine`] in turn. CUDA takes f32 and F = [`UPDATE_TC_FEATURES`].
pub fn update_tc(
    state: &Tensor,
    w_mix: &TcWeights,
    w1: &TcWeights,
    b1: &Tensor,
    w2: &TcWeights,
    act_bias: &Tensor,
) -> Result<UpdateOutputs> {
    const OP: &str = "update_tc";
    let (n4, f) = state.dims2()?;
    if n4 % 4 != 0 {
        bail!("{OP}: the state has {n4} rows, not 4N")
    }
    let n = n4 / 4;
    if state.device().is_cuda() && f != UPDATE_TC_FEATURES {
        bail!("{OP}: CUDA takes {UPDATE_TC_FEATURES} features, the state has {f}")
    }
    for (what, w, k, j) in [
        ("the mixing weight", w_mix, f, 2 * f),
        ("the context hidden weight", w1, 2 * f, f),
        ("the context output weight", w2, f, 3 * f),
    ] {
        if check_weights(OP, what, w, k)? != j {
            bail!("{OP}: {what} has {} outputs, expected {j}", w.outputs())
        }
    }
    fit(OP, "the context hidden bias", b1, &[f])?;
    fit(OP, "the context output bias", act_bias, &[3 * f])?;
    let (inputs, index) = arranged(&[state, b1, act_bias], &[w_mix, w1, w2], &[]);
    check_inputs(OP, &inputs)?;
    let nf = n * f;
    let out = launch(
        UpdateForward(Rows { n, f }),
        &inputs,
        &index,
        14 * nf,
        Init::Uninit,
    )?;
    // [rows N, cols] from `at` N F elements on.
    let part = |at: usize, rows: usize, cols: usize| {
        out.narrow(0, at * nf, rows * n * cols)?
            .reshape((rows * n, cols))
    };
    Ok(UpdateOutputs {
        next: part(0, 4, f)?,
        mixed: part(4, 3, 2 * f)?,
        ctx_pre: part(10, 1, f)?,
        act: part(11, 1, 3 * f)?,
    })
}

/// The adjoint of [`update_tc`] for the gradient `grad` at the block's output: (dL/ds [N, F],
/// dL/dv [3N, F]) of the state after the messages, from the forward's tape (`mixed`, `act`,
/// `ctx_pre`), the context MLP's hidden bias `b1` and output bias `act_bias`, and the weights
/// transposed (output-major, as [`crate::ops::tc_weights`] makes them): `w2t` [F, 3F], `w1t`
/// [2F, F], `w_mix_t` [F, 2F]. The same as [`crate::ops::update_combine_adjoint`],
/// [`crate::ops::mlp_tc_adjoint`], [`crate::ops::update_context_adjoint`] and [`crate::ops::dense_tc_adding`]
/// in turn. CUDA takes f32 and F = [`UPDATE_TC_FEATURES`].
#[allow(clippy::too_many_arguments)]
pub fn update_tc_adjoint(
    mixed: &Tensor,
    act: &Tensor,
    act_bias: &Tensor,
    ctx_pre: &Tensor,
    b1: &Tensor,
    grad: &StateGrad,
    w2t: &TcWeights,
    w1t: &TcWeights,
    w_mix_t: &TcWeights,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "update_tc_adjoint";
    let (n3, f2) = mixed.dims2()?;
    let (n, f) = (n3 / 3, f2 / 2);
    if n3 % 3 != 0 || f2 % 2 != 0 {
        bail!("{OP}: mixed is {:?}, not [3N, 2F]", mixed.dims())
    }
    if mixed.device().is_cuda() && f != UPDATE_TC_FEATURES {
        bail!("{OP}: CUDA takes {UPDATE_TC_FEATURES} features, mixed has {f}")
    }
    for (what, w, k, j) in [
        ("the transposed context output weight", w2t, 3 * f, f),
        ("the transposed context hidden weight", w1t, f, 2 * f),
        ("the transposed mixing weight", w_mix_t, 2 * f, f),
    ] {
        if check_weights(OP, what, w, k)? != j {
            bail!("{OP}: {what} has {} outputs, expected {j}", w.outputs())
        }
    }
    fit(OP, "the context output", act, &[n, 3 * f])?;
    fit(OP, "the context output bias", act_bias, &[3 * f])?;
    fit(OP, "the context pre-activation", ctx_pre, &[n, f])?;
    fit(OP, "the context hidden bias", b1, &[f])?;
    fit(OP, "the gradient on s", grad.gx, &[n, f])?;
    let (gm, gve, gvj) = grad.next.unwrap_or((grad.gx, grad.gx, grad.gx));
    if grad.next.is_some() {
        if gm.dim(1)? != f || gm.dim(0)? < n {
            bail!(
                "{OP}: the next block's gradient on s is {:?}, expected [N, {f}] or more rows",
                gm.dims()
            )
        }
        fit(OP, "the next block's gradient on v", gve, &[3 * n, f])?;
        fit(OP, "the interaction's gradient on v", gvj, &[3 * n, f])?;
    }
    let floats = [mixed, act, act_bias, grad.gx, gm, gve, gvj, ctx_pre, b1];
    let (inputs, index) = arranged(&floats, &[w2t, w1t, w_mix_t], &[]);
    check_inputs(OP, &inputs)?;
    let k = UpdateAdjoint {
        rows: Rows { n, f },
        has_next: grad.next.is_some(),
    };
    let out = launch(k, &inputs, &index, (4 * n, f), Init::Uninit)?;
    Ok((out.narrow(0, 0, n)?, out.narrow(0, n, 3 * n)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both kernels are compiled for two blocks of 256 threads a multiprocessor
    /// (`__launch_bounds__(THREADS, 2)`, all 64K registers): their shared memory must let two
    /// blocks fit an H100's or H200's 228 KB (1 KB of it reserved per block). A layout grown
    /// past that would still launch, at one block a multiprocessor and half the warps.
    #[test]
    fn two_blocks_fit_a_multiprocessor() {
        let f = UPDATE_TC_FEATURES;
        for (what, words) in [
            ("forward", smem_words(f)),
            ("adjoint", adjoint_smem_words(f)),
        ] {
            let per_block = 4 * words + 1024;
            assert!(
                2 * per_block <= 228 * 1024,
                "{what}: {per_block} bytes a block"
            );
        }
    }
}
