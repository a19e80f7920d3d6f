//! Filter rows basis[:, ..K] · W for every edge (kernels/filter_rows.cu): the product of the
//! filter-rows path of `model::fused` on CUDA, where cuBLAS ran this K = R + 1 product at a
//! fraction of its peak. The CPU twin is the plain sum, the test oracle (the CPU path itself
//! keeps candle's matmul).

use super::kernel::{kernel_source, launch, Init, Kernel, Real};
use candle_core::{bail, Result, Tensor};

/// Largest K (rows of W) the kernel keeps in registers.
pub const FILTER_ROWS_MAX_K: usize = 32;

struct FilterRows {
    e: usize,
    kb: usize,
    k: usize,
    c: usize,
}

impl Kernel for FilterRows {
    kernel_source!("filter_rows", "filter_rows");
    fn work(&self) -> usize {
        self.e * self.c
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.e, self.kb, self.k, self.c]
    }
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        let (basis, w) = (x[0], x[1]);
        for (b, o) in basis
            .chunks_exact(self.kb)
            .zip(out.chunks_exact_mut(self.c))
        {
            for (col, oc) in o.iter_mut().enumerate() {
                let mut a = T::zero();
                for (q, &bq) in b[..self.k].iter().enumerate() {
                    a += bq * w[q * self.c + col];
                }
                *oc = a;
            }
        }
    }
    /// Two columns per thread (up to 256 threads), 32-edge tiles over a grid-stride loop.
    #[cfg(feature = "cuda")]
    fn launch_config(
        &self,
        _elem_bytes: usize,
    ) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        let threads = self.c.div_ceil(2).next_multiple_of(32).min(256);
        let chunks = self.c.div_ceil(2 * threads);
        let tiles = self.e.div_ceil(32).clamp(1, 8192);
        candle_core::cuda_backend::cudarc::driver::LaunchConfig {
            grid_dim: (tiles as u32, chunks as u32, 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// `basis[:, ..K] · weights` for basis [E, KB] and weights [K, C] (K ≤ KB, K ≤
/// [`FILTER_ROWS_MAX_K`]): [E, C].
pub fn filter_rows(basis: &Tensor, weights: &Tensor) -> Result<Tensor> {
    let (e, kb) = basis.dims2()?;
    let (k, c) = weights.dims2()?;
    if k > kb || k > FILTER_ROWS_MAX_K || c == 0 {
        bail!(
            "filter_rows: weights {:?} do not fit basis {:?} (at most {FILTER_ROWS_MAX_K} rows)",
            weights.dims(),
            basis.dims()
        )
    }
    launch(
        FilterRows { e, kb, k, c },
        &[basis, weights],
        &[],
        (e, c),
        Init::Uninit,
    )
}
