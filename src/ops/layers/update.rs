//! Elementwise parts of the PaiNN update block as fused kernels (kernels/layers/update.cu), with
//! their adjoints; the matrix products stay cuBLAS matmuls. State tensors are component-major
//! [4N, F]; `mixed` = v W_mixᵀ is [3N, 2F] = [Uv | Vv]; `act` is the context MLP's output
//! before its bias, [N, 3F] = (a_ss | a_vv | a_sv).

use crate::ops::launch::{
    kernel_source, launch, launch_in_place, overlaps_previous, Init, Kernel, Real,
};
use candle_core::{bail, Result, Tensor};

/// Keeps ‖Vv‖ differentiable at v = 0 (the same epsilon as `model::update`).
pub const NORM_EPS: f64 = 1e-8;

#[derive(Clone, Copy)]
pub(crate) struct Rows {
    pub(crate) n: usize,
    pub(crate) f: usize,
}

impl Rows {
    fn of(state: &Tensor, mixed: &Tensor) -> Result<Self> {
        let (n4, f) = state.dims2()?;
        let n = n4 / 4;
        if n4 % 4 != 0 || mixed.dims() != [3 * n, 2 * f] {
            bail!(
                "update: state {:?} and mixed {:?} do not fit [4N, F] and [3N, 2F]",
                state.dims(),
                mixed.dims()
            )
        }
        Ok(Self { n, f })
    }

    /// (Uv_a, Vv_a) of atom m, feature c.
    fn uv<T: Real>(&self, mixed: &[T], a: usize, m: usize, c: usize) -> (T, T) {
        let row = (a * self.n + m) * 2 * self.f;
        (mixed[row + c], mixed[row + self.f + c])
    }

    fn norm<T: Real>(&self, mixed: &[T], m: usize, c: usize) -> T {
        let mut q = T::of(NORM_EPS);
        for a in 0..3 {
            let v = self.uv(mixed, a, m, c).1;
            q += v * v;
        }
        q.sqrt()
    }

    /// (a_ss, a_vv, a_sv) with bias.
    fn act<T: Real>(&self, act: &[T], ab: &[T], m: usize, c: usize) -> [T; 3] {
        let f = self.f;
        [0, 1, 2].map(|p| act[m * 3 * f + p * f + c] + ab[p * f + c])
    }

    fn sizes(&self) -> Vec<usize> {
        vec![self.n, self.f]
    }
}

pub(crate) struct ContextFwd(pub(crate) Rows);

impl Kernel for ContextFwd {
    overlaps_previous!();
    kernel_source!("update_context_fwd", "update");
    fn work(&self) -> usize {
        self.0.n * self.0.f
    }
    fn sizes(&self) -> Vec<usize> {
        self.0.sizes()
    }
    /// x = [state, mixed] → ctx [N, 2F].
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        let Rows { n, f } = self.0;
        for m in 0..n {
            for c in 0..f {
                out[m * 2 * f + c] = x[0][m * f + c];
                out[m * 2 * f + f + c] = self.0.norm(x[1], m, c);
            }
        }
    }
}

pub(crate) struct CombineFwd(pub(crate) Rows);

impl Kernel for CombineFwd {
    overlaps_previous!();
    kernel_source!("update_combine_fwd", "update");
    fn work(&self) -> usize {
        self.0.n * self.0.f
    }
    fn sizes(&self) -> Vec<usize> {
        self.0.sizes()
    }
    /// x = [state, mixed, act, act_bias] → new state [4N, F].
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        let Rows { n, f } = self.0;
        for m in 0..n {
            for c in 0..f {
                let [a_ss, a_vv, a_sv] = self.0.act(x[2], x[3], m, c);
                let mut dot = T::zero();
                for a in 0..3 {
                    let (u, v) = self.0.uv(x[1], a, m, c);
                    dot += u * v;
                    let o = ((1 + a) * n + m) * f + c;
                    out[o] = x[0][o] + u * a_vv;
                }
                out[m * f + c] = x[0][m * f + c] + a_ss + a_sv * dot;
            }
        }
    }
}

pub(crate) struct CombineAdj {
    pub(crate) rows: Rows,
    pub(crate) has_next: bool,
}

impl Kernel for CombineAdj {
    overlaps_previous!();
    kernel_source!("update_combine_adj", "update");
    fn work(&self) -> usize {
        self.rows.n * self.rows.f
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.rows.n, self.rows.f, self.has_next as usize]
    }
    /// x = [mixed, act, act_bias, gx, gm, gve, gvj] → [g_state | g_mixed | g_act].
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        let Rows { n, f } = self.rows;
        let (mixed, gx, gm, gve, gvj) = (x[0], x[3], x[4], x[5], x[6]);
        let (g_sv, rest) = out.split_at_mut(4 * n * f);
        let (g_mixed, g_act) = rest.split_at_mut(6 * n * f);
        for m in 0..n {
            for c in 0..f {
                let k = m * f + c;
                let [_, a_vv, a_sv] = self.rows.act(x[1], x[2], m, c);
                let gs = gx[k] + if self.has_next { gm[k] } else { T::zero() };
                let (mut dot, mut g_avv) = (T::zero(), T::zero());
                for a in 0..3 {
                    let (u, v) = self.rows.uv(mixed, a, m, c);
                    let o = (a * n + m) * f + c;
                    let gv = if self.has_next {
                        gve[o] + gvj[o]
                    } else {
                        T::zero()
                    };
                    dot += u * v;
                    g_avv += gv * u;
                    g_sv[o + n * f] = gv;
                    let row = (a * n + m) * 2 * f;
                    g_mixed[row + c] = gs * a_sv * v + gv * a_vv;
                    g_mixed[row + f + c] = gs * a_sv * u;
                }
                g_sv[k] = gs;
                g_act[m * 3 * f + c] = gs;
                g_act[m * 3 * f + f + c] = g_avv;
                g_act[m * 3 * f + 2 * f + c] = gs * dot;
            }
        }
    }
}

pub(crate) struct ContextAdj(pub(crate) Rows);

impl Kernel for ContextAdj {
    overlaps_previous!();
    kernel_source!("update_context_adj", "update");
    fn work(&self) -> usize {
        self.0.n * self.0.f
    }
    fn sizes(&self) -> Vec<usize> {
        self.0.sizes()
    }
    /// x = [mixed, g_ctx], out = [g_state | g_mixed | ..] (in place).
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        let Rows { n, f } = self.0;
        let (mixed, g_ctx) = (x[0], x[1]);
        let nf = n * f;
        for m in 0..n {
            for c in 0..f {
                let g_norm = g_ctx[m * 2 * f + f + c] / self.0.norm(mixed, m, c);
                out[m * f + c] += g_ctx[m * 2 * f + c];
                for a in 0..3 {
                    let v = self.0.uv(mixed, a, m, c).1;
                    out[4 * nf + (a * n + m) * 2 * f + f + c] += g_norm * v;
                }
            }
        }
    }
}

/// ctx = [s, ‖Vv‖] [N, 2F], the context MLP's input.
pub fn update_context(state: &Tensor, mixed: &Tensor) -> Result<Tensor> {
    let r = Rows::of(state, mixed)?;
    launch(
        ContextFwd(r),
        &[state, mixed],
        &[],
        (r.n, 2 * r.f),
        Init::Uninit,
    )
}

/// The block's new state [4N, F] from the state after the messages, `mixed`, and the context
/// MLP output `act` [N, 3F] before its bias `act_bias` \[3F\].
pub fn update_combine(
    state: &Tensor,
    mixed: &Tensor,
    act: &Tensor,
    act_bias: &Tensor,
) -> Result<Tensor> {
    let r = Rows::of(state, mixed)?;
    if act.dims() != [r.n, 3 * r.f] || act_bias.dims() != [3 * r.f] {
        bail!(
            "update: context output {:?} / bias {:?} do not fit [N, 3F] / [3F]",
            act.dims(),
            act_bias.dims()
        )
    }
    launch(
        CombineFwd(r),
        &[state, mixed, act, act_bias],
        &[],
        state.shape(),
        Init::Uninit,
    )
}

/// The gradient arriving at a block's output state: `gx` [N, F] on s and, from the next
/// block, `next` = (gm, gve, gvj): the first N rows of gm ([N, F] or more rows) on s, and
/// gve + gvj (both [3N, F]) on v.
pub struct StateGrad<'a> {
    pub gx: &'a Tensor,
    pub next: Option<(&'a Tensor, &'a Tensor, &'a Tensor)>,
}

/// Adjoint of [`update_combine`] then of [`update_context`] (whose gradient `g_ctx` the caller
/// gets from the context MLP in between, hence two calls). `combine` returns the packed
/// [g_state (4NF) | g_mixed (6NF) | g_act (3NF)].
pub fn update_combine_adjoint(
    mixed: &Tensor,
    act: &Tensor,
    act_bias: &Tensor,
    grad: &StateGrad,
) -> Result<Tensor> {
    let (n3, f2) = mixed.dims2()?;
    let (n, f) = (n3 / 3, f2 / 2);
    let (gm, gve, gvj) = grad.next.unwrap_or((grad.gx, grad.gx, grad.gx));
    let gm_fits = matches!(gm.dims(), [rows, cols] if *cols == f && *rows >= n);
    if grad.gx.dims() != [n, f]
        || grad.next.is_some() && (!gm_fits || gve.dims() != [3 * n, f])
        || grad.next.is_some() && gvj.dims() != [3 * n, f]
    {
        bail!("update adjoint: gradient shapes do not fit N = {n}, F = {f}")
    }
    let k = CombineAdj {
        rows: Rows { n, f },
        has_next: grad.next.is_some(),
    };
    launch(
        k,
        &[mixed, act, act_bias, grad.gx, gm, gve, gvj],
        &[],
        13 * n * f,
        Init::Uninit,
    )
}

/// Adds the context's adjoint for `g_ctx` [N, 2F] to `combined` (from
/// [`update_combine_adjoint`]), in place: only its s rows and the Vv half of g_mixed change,
/// where a copy of the whole took half the kernel's traffic; returns (g_state [4N, F], g_mixed
/// [3N, 2F]), views of it.
pub fn update_context_adjoint(
    mixed: &Tensor,
    g_ctx: &Tensor,
    combined: Tensor,
) -> Result<(Tensor, Tensor)> {
    let (n3, f2) = mixed.dims2()?;
    let (n, f) = (n3 / 3, f2 / 2);
    if g_ctx.dims() != [n, 2 * f] || combined.dims() != [13 * n * f] {
        bail!(
            "update adjoint: context gradient {:?} does not fit [N, 2F]",
            g_ctx.dims()
        )
    }
    launch_in_place(ContextAdj(Rows { n, f }), &combined, &[mixed, g_ctx], &[])?;
    Ok((
        combined.narrow(0, 0, 4 * n * f)?.reshape((4 * n, f))?,
        combined
            .narrow(0, 4 * n * f, 6 * n * f)?
            .reshape((3 * n, 2 * f))?,
    ))
}

/// g_act [N, 3F] of a packed [`update_combine_adjoint`] result.
pub fn act_grad(combined: &Tensor, n: usize, f: usize) -> Result<Tensor> {
    combined
        .narrow(0, 10 * n * f, 3 * n * f)?
        .reshape((n, 3 * f))
}
