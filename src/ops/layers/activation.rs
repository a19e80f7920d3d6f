//! silu(x + b) fused with its bias, and its adjoint (kernels/layers/activation.cu): one kernel each
//! instead of candle's add, silu and their backward ops.

use crate::ops::launch::{kernel_source, launch, Init, Kernel, Real};
use candle_core::{bail, Result, Tensor};

struct Forward {
    m: usize,
    k: usize,
}

fn silu_parts<T: Real>(z: T) -> (T, T) {
    let s = T::one() / (T::one() + (-z).exp());
    (z * s, s * (T::one() + z * (T::one() - s)))
}

impl Kernel for Forward {
    kernel_source!("bias_silu_fwd", "activation");
    fn work(&self) -> usize {
        self.m * self.k
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.m, self.k]
    }
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        for (t, o) in out.iter_mut().enumerate() {
            *o = silu_parts(x[0][t] + x[1][t % self.k]).0;
        }
    }
}

struct Adjoint {
    m: usize,
    k: usize,
    rows_g: usize,
}

impl Kernel for Adjoint {
    kernel_source!("bias_silu_adj", "activation");
    fn work(&self) -> usize {
        self.m * self.k
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.m, self.k, self.rows_g]
    }
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        for (t, o) in out.iter_mut().enumerate() {
            let c = t % self.k;
            let g = x[2][if self.rows_g == 1 { c } else { t }];
            *o = g * silu_parts(x[0][t] + x[1][c]).1;
        }
    }
}

fn dims(x: &Tensor, b: &Tensor) -> Result<(usize, usize)> {
    let (m, k) = x.dims2()?;
    if b.dims() != [k] {
        bail!(
            "bias_silu: bias {:?} does not fit input {:?}",
            b.dims(),
            x.dims()
        )
    }
    Ok((m, k))
}

/// silu(x + b) for x [M, K] and b \[K\].
pub fn bias_silu(x: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (m, k) = dims(x, b)?;
    launch(Forward { m, k }, &[x, b], &[], (m, k), Init::Uninit)
}

/// dL/dx of [`bias_silu`] for dL/dy `g`, [M, K] or one row [1, K] standing for every row.
pub fn bias_silu_adjoint(x: &Tensor, b: &Tensor, g: &Tensor) -> Result<Tensor> {
    let (m, k) = dims(x, b)?;
    let rows_g = g.dim(0)?;
    if g.dims() != [rows_g, k] || (rows_g != 1 && rows_g != m) {
        bail!(
            "bias_silu: gradient {:?} does not fit {:?}",
            g.dims(),
            x.dims()
        )
    }
    launch(
        Adjoint { m, k, rows_g },
        &[x, b, g],
        &[],
        (m, k),
        Init::Uninit,
    )
}
