//! The update block's context MLP on tensor cores with the block's elementwise parts in the
//! same launch (kernels/update_tc.cu), for F = H = 128 (the shipped model's widths): the
//! forward stages [s, |Vv|] itself and forms the next state in its output layer's epilogue
//! ([`update_context`](super::update_context), [`mlp_tc`](super::mlp_tc),
//! [`update_combine`](super::update_combine) in one launch); the adjoint likewise holds
//! [`update_combine_adjoint`](super::update_combine_adjoint), [`mlp_tc_adjoint`](super::mlp_tc_adjoint)
//! and [`update_context_adjoint`](super::update_context_adjoint). On CUDA f32 only; the CPU
//! twins run those ops' twins in sequence, in any precision.

use super::dense_tc::{
    block_rows, check_inputs, check_weights, fit, Dims, MlpAdjoint, MlpForward, Tf32Weights,
};
use super::kernel::{kernel_source, launch, Init, Kernel, Real};
use super::update::{
    state_and_mixed_grads, CombineAdj, CombineFwd, ContextAdj, ContextFwd, Rows, StateGrad,
};
use candle_core::{bail, Result, Tensor};

/// The feature and hidden width the kernels take (known at compile time there).
const WIDTH: usize = 128;

/// Whether the fused update runs for `f` features and a context MLP of hidden width `h`.
pub fn update_tc_fits(f: usize, h: usize) -> bool {
    f == WIDTH && h == WIDTH
}

/// The context MLP's shapes: [s, |Vv|] (2F) → H → (a_ss, a_vv, a_sv) (3F).
fn mlp_dims(r: Rows) -> Dims {
    Dims {
        n: r.n,
        k: 2 * r.f,
        h: r.f,
        j: 3 * r.f,
    }
}

/// The function for the block rows the MLP with reduction `k` takes (16 or 32).
fn function(stem: Stem, n: usize, k: usize) -> &'static str {
    match (stem, block_rows(n, k)) {
        (Stem::Forward, 32) => "update_tc_fwd_32",
        (Stem::Forward, _) => "update_tc_fwd_16",
        (Stem::Adjoint, 32) => "update_tc_adj_32",
        (Stem::Adjoint, _) => "update_tc_adj_16",
    }
}

#[derive(Clone, Copy)]
enum Stem {
    Forward,
    Adjoint,
}

struct UpdateFwd(Rows);

impl Kernel for UpdateFwd {
    kernel_source!("update_tc_fwd", "update_tc");
    fn function(&self) -> &'static str {
        function(Stem::Forward, self.0.n, 2 * self.0.f)
    }
    fn work(&self) -> usize {
        self.0.n * self.0.f
    }
    #[cfg(feature = "cuda")]
    fn launch_config(&self, _: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        mlp_dims(self.0).config(true)
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.0.n]
    }
    /// x = [state, mixed, w1, b1, w2, act bias] → [pre (N H) | act (N 3F) | next (4NF)].
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        let Rows { n, f } = self.0;
        let mut ctx = vec![T::zero(); 2 * n * f];
        ContextFwd(self.0).cpu(&[x[0], x[1]], &[], &mut ctx);
        let (mlp, next) = out.split_at_mut(n * (f + 3 * f));
        MlpForward(mlp_dims(self.0)).cpu(&[&ctx, x[2], x[3], x[4]], &[], mlp);
        let act = &mlp[n * f..];
        CombineFwd(self.0).cpu(&[x[0], x[1], act, x[5]], &[], next);
    }
}

struct UpdateAdj {
    rows: Rows,
    has_next: bool,
}

impl Kernel for UpdateAdj {
    kernel_source!("update_tc_adj", "update_tc");
    fn function(&self) -> &'static str {
        function(Stem::Adjoint, self.rows.n, 3 * self.rows.f)
    }
    fn work(&self) -> usize {
        self.rows.n * self.rows.f
    }
    /// Staged as the MLP adjoint's: dL/d(act) (3F) → H → dL/d(ctx) (2F).
    #[cfg(feature = "cuda")]
    fn launch_config(&self, _: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        let d = mlp_dims(self.rows);
        Dims {
            k: d.j,
            j: d.k,
            ..d
        }
        .config(true)
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.rows.n, self.has_next as usize]
    }
    /// x = [mixed, act, act bias, gx, gm, gve, gvj, pre, b1, w2t, w1t] → [g_state (4NF) |
    /// g_mixed (6NF)].
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        let Rows { n, f } = self.rows;
        let mut combined = vec![T::zero(); 13 * n * f];
        let combine = CombineAdj {
            rows: self.rows,
            has_next: self.has_next,
        };
        combine.cpu(&x[..7], &[], &mut combined);
        let mut g_ctx = vec![T::zero(); 2 * n * f];
        let g_act = &combined[10 * n * f..];
        let mlp = MlpAdjoint(mlp_dims(self.rows));
        mlp.cpu(&[g_act, x[7], x[8], x[9], x[10]], &[], &mut g_ctx);
        ContextAdj(self.rows).cpu(&[x[0], &g_ctx, &combined], &[], out);
    }
}

/// The update block's tape and output: the context MLP's pre-activation [N, H], its output
/// before the bias [N, 3F], and the next state [4N, F].
pub struct UpdateForward {
    pub pre: Tensor,
    pub act: Tensor,
    pub next: Tensor,
}

/// The context MLP's weights as the kernels take them (split), its hidden bias and its output
/// bias (the context's a_ss, a_vv, a_sv biases).
pub struct ContextMlp<'a> {
    pub w1: &'a Tf32Weights,
    pub b1: &'a Tensor,
    pub w2: &'a Tf32Weights,
    pub act_bias: &'a Tensor,
}

/// Checks the update's widths and the context MLP's forward weights ([2F → H], [H → 3F]).
fn check_mlp(op: &str, r: Rows, mlp: &ContextMlp, adjoint: bool) -> Result<()> {
    if !update_tc_fits(r.f, mlp.b1.elem_count()) {
        bail!(
            "{op}: the fused update takes F = H = {WIDTH}, got F = {} and H = {}",
            r.f,
            mlp.b1.elem_count()
        )
    }
    // (first layer's inputs, its outputs, the second's outputs)
    let (k, h, j) = match adjoint {
        false => (2 * r.f, r.f, 3 * r.f),
        true => (3 * r.f, r.f, 2 * r.f),
    };
    let layers = [(mlp.w1, k, h, "first"), (mlp.w2, h, j, "second")];
    for (w, inputs, outputs, which) in layers {
        let what = format!("the context MLP's {which} weight");
        if check_weights(op, &what, w, inputs)? != outputs {
            bail!(
                "{op}: {what} has {} outputs, expected {outputs}",
                w.outputs()
            )
        }
    }
    fit(op, "hidden bias", mlp.b1, &[h])?;
    fit(op, "context bias", mlp.act_bias, &[3 * r.f])
}

/// [`update_context`](super::update_context), the context MLP and
/// [`update_combine`](super::update_combine) in one launch, for the messaged state [4N, F]
/// and mixed [3N, 2F]; `mlp` holds the MLP's forward weights w1 [H, 2F] and w2 [3F, H].
pub fn update_tc(state: &Tensor, mixed: &Tensor, mlp: &ContextMlp) -> Result<UpdateForward> {
    const OP: &str = "update_tc";
    let r = Rows::of(state, mixed)?;
    check_mlp(OP, r, mlp, false)?;
    let inputs = [
        state,
        mixed,
        &mlp.w1.parts,
        mlp.b1,
        &mlp.w2.parts,
        mlp.act_bias,
    ];
    check_inputs(OP, &inputs)?;
    let (n, f) = (r.n, r.f);
    let out = launch(UpdateFwd(r), &inputs, &[], n * 8 * f, Init::Uninit)?;
    Ok(UpdateForward {
        pre: out.narrow(0, 0, n * f)?.reshape((n, f))?,
        act: out.narrow(0, n * f, 3 * n * f)?.reshape((n, 3 * f))?,
        next: out.narrow(0, 4 * n * f, 4 * n * f)?.reshape((4 * n, f))?,
    })
}

/// The adjoint of [`update_tc`] for the gradient `grad` of its next state: (g_state [4N, F],
/// g_mixed [3N, 2F]) as [`update_context_adjoint`](super::update_context_adjoint) returns
/// them. `mlp` holds the MLP's transposed weights, w2t [H, 3F] as `w1` and w1t [2F, H] as
/// `w2` (the adjoint's first and second layers); `pre` and `act` are the forward's.
pub fn update_tc_adjoint(
    mixed: &Tensor,
    act: &Tensor,
    pre: &Tensor,
    mlp: &ContextMlp,
    grad: &StateGrad,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "update_tc_adjoint";
    let (n3, f2) = mixed.dims2()?;
    let r = Rows {
        n: n3 / 3,
        f: f2 / 2,
    };
    let (n, f) = (r.n, r.f);
    check_mlp(OP, r, mlp, true)?;
    fit(OP, "the context's output", act, &[n, 3 * f])?;
    fit(OP, "the pre-activation", pre, &[n, f])?;
    let [gx, gm, gve, gvj] = grad.inputs(n, f)?;
    let inputs = [
        mixed,
        act,
        mlp.act_bias,
        gx,
        gm,
        gve,
        gvj,
        pre,
        mlp.b1,
        &mlp.w1.parts,
        &mlp.w2.parts,
    ];
    check_inputs(OP, &inputs)?;
    let k = UpdateAdj {
        rows: r,
        has_next: grad.next.is_some(),
    };
    let out = launch(k, &inputs, &[], 10 * n * f, Init::Uninit)?;
    state_and_mixed_grads(&out, n, f)
}
