//! Small dense layers as single kernels (kernels/layers/dense.cu): for molecule-sized inputs a cuBLAS
//! call plus a separate bias+SiLU kernel cost more in launch overhead than their arithmetic.
//! `model::fused` uses them below a row count and cuBLAS above it.
//!
//! On CUDA each block computes [`ROWS`] rows × 32 output columns, its eight warps each summing a
//! slice of the reduction (see the .cu file); the CPU twins are plain loops.

use crate::ops::launch::{kernel_source, launch, Init, Kernel, Real};
use candle_core::{bail, Result, Tensor};

pub(crate) fn silu_and_slope<T: Real>(z: T) -> (T, T) {
    let s = T::one() / (T::one() + (-z).exp());
    (z * s, s * (T::one() + z * (T::one() - s)))
}

/// Rows per CUDA block (DENSE_ROWS in kernels/layers/dense.cu).
#[cfg(feature = "cuda")]
const ROWS: usize = 4;
/// Warps per CUDA block, each summing a slice of the reduction (DENSE_SPLIT).
#[cfg(feature = "cuda")]
const SPLIT: usize = 8;

/// Longest reduction (input width, or output width for the adjoint) the CUDA kernels take:
/// their staged rows must fit the 48 KiB of shared memory a launch gets without opting in.
pub const DENSE_MAX_WIDTH: usize = 1024;

/// Launch shape of the CUDA kernels for `n` rows, reduction length `l` and `j` outputs per row.
#[cfg(feature = "cuda")]
fn dense_launch(
    n: usize,
    l: usize,
    j: usize,
    elem_bytes: usize,
) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
    candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        grid_dim: (n.div_ceil(ROWS) as u32, j.div_ceil(32) as u32, 1),
        block_dim: (32 * SPLIT as u32, 1, 1),
        shared_mem_bytes: ((ROWS * l + SPLIT * ROWS * 32) * elem_bytes) as u32,
    }
}

#[derive(Clone, Copy)]
struct Dims {
    n: usize,
    k: usize,
    m: usize,
}

impl Dims {
    fn sizes(&self) -> Vec<usize> {
        vec![self.n, self.k, self.m]
    }

    /// Σ_i x[r, i] w[i, o] for x [N, K] and w [K, M].
    fn dot<T: Real>(&self, x: &[T], w: &[T], r: usize, o: usize) -> T {
        (0..self.k).fold(T::zero(), |acc, i| {
            acc + x[r * self.k + i] * w[i * self.m + o]
        })
    }
}

struct Plain(Dims);

impl Kernel for Plain {
    kernel_source!("dense", "dense");
    fn work(&self) -> usize {
        self.0.n * self.0.m
    }
    #[cfg(feature = "cuda")]
    fn launch_config(&self, b: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        dense_launch(self.0.n, self.0.k, self.0.m, b)
    }
    fn sizes(&self) -> Vec<usize> {
        self.0.sizes()
    }
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        for (t, y) in out.iter_mut().enumerate() {
            *y = self.0.dot(x[0], x[1], t / self.0.m, t % self.0.m);
        }
    }
}

struct Silu(Dims);

impl Kernel for Silu {
    kernel_source!("dense_silu", "dense");
    fn work(&self) -> usize {
        self.0.n * self.0.m
    }
    #[cfg(feature = "cuda")]
    fn launch_config(&self, b: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        dense_launch(self.0.n, self.0.k, self.0.m, b)
    }
    fn sizes(&self) -> Vec<usize> {
        self.0.sizes()
    }
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        let (pre, act) = out.split_at_mut(self.0.n * self.0.m);
        for (t, (p, a)) in pre.iter_mut().zip(act).enumerate() {
            let o = t % self.0.m;
            *p = self.0.dot(x[0], x[1], t / self.0.m, o);
            *a = silu_and_slope(*p + x[2][o]).0;
        }
    }
}

struct SiluAdjoint {
    dims: Dims,
    rows_g: usize,
}

impl Kernel for SiluAdjoint {
    kernel_source!("dense_silu_adj", "dense");
    fn work(&self) -> usize {
        self.dims.n * self.dims.k
    }
    #[cfg(feature = "cuda")]
    fn launch_config(&self, b: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        dense_launch(self.dims.n, self.dims.m, self.dims.k, b)
    }
    fn sizes(&self) -> Vec<usize> {
        let mut s = self.dims.sizes();
        s.push(self.rows_g);
        s
    }
    /// x = [g, pre, b, w [M, K]].
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        let Dims { k, m, .. } = self.dims;
        for (t, gx) in out.iter_mut().enumerate() {
            let (r, i) = (t / k, t % k);
            let g = &x[0][if self.rows_g == 1 { 0 } else { r * m }..];
            *gx = (0..m).fold(T::zero(), |acc, o| {
                let slope = silu_and_slope(x[1][r * m + o] + x[2][o]).1;
                acc + g[o] * slope * x[3][o * k + i]
            });
        }
    }
}

fn dims(x: &Tensor, w: &Tensor) -> Result<Dims> {
    let (n, k) = x.dims2()?;
    let (kw, m) = w.dims2()?;
    if kw != k {
        bail!(
            "dense: input {:?} and weights {:?} do not fit",
            x.dims(),
            w.dims()
        )
    }
    check_width(k)?;
    Ok(Dims { n, k, m })
}

fn check_width(l: usize) -> Result<()> {
    if l > DENSE_MAX_WIDTH {
        bail!("dense: a reduction over {l} values is longer than the kernels' {DENSE_MAX_WIDTH}")
    }
    Ok(())
}

/// x w for x [N, K] and w [K, M].
pub fn dense(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let d = dims(x, w)?;
    launch(Plain(d), &[x, w], &[], (d.n, d.m), Init::Uninit)
}

/// [pre | silu(pre + b)] as [2N, M], pre = x w, for x [N, K], w [K, M], b \[M\].
pub fn dense_silu(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    let d = dims(x, w)?;
    if b.dims() != [d.m] {
        bail!("dense: bias {:?} does not fit {} outputs", b.dims(), d.m)
    }
    launch(Silu(d), &[x, w, b], &[], (2 * d.n, d.m), Init::Uninit)
}

/// dL/dx [N, K] of y = silu(x wᵀ + b) for dL/dy `g` ([N, M], or one row for all), the saved
/// `pre` = x wᵀ [N, M], and w [M, K] (a linear layer's weight).
pub fn dense_silu_adjoint(g: &Tensor, pre: &Tensor, b: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (n, m) = pre.dims2()?;
    let (mw, k) = w.dims2()?;
    let rows_g = g.dim(0)?;
    if mw != m || b.dims() != [m] || g.dims() != [rows_g, m] || (rows_g != 1 && rows_g != n) {
        bail!(
            "dense adjoint: gradient {:?}, pre-activation {:?}, bias {:?}, weights {:?} do not fit",
            g.dims(),
            pre.dims(),
            b.dims(),
            w.dims()
        )
    }
    check_width(m)?;
    let kernel = SiluAdjoint {
        dims: Dims { n, k, m },
        rows_g,
    };
    launch(kernel, &[g, pre, b, w], &[], (n, k), Init::Uninit)
}
