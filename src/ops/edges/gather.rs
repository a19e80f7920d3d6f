//! Row gather, `out[e, ...] = x[idx[e], ...]`; its backward is [`scatter_add`]. Also the
//! PaiNN initial state, gathered into the first rows of a zeroed [4N, F] ([`initial_state`]).

use crate::ops::edges::rows::{contiguous, cpu_index, out_shape, rows_of};
use crate::ops::edges::scatter_add::scatter_add;
use crate::ops::launch::{
    check_elements, kernel_source, launch, overlaps_previous, Init, Kernel, Real,
};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

#[cfg(feature = "cuda")]
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/gather.ptx"));

/// The gather custom op; use [`gather`].
pub struct Gather;

/// Gathers rows of `x` (any rank ≥ 1) at the u32 indices `idx` (1-D). Differentiable to any
/// order with respect to `x`.
pub fn gather(x: &Tensor, idx: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op2(&idx.contiguous()?, Gather)
}

fn gather_cpu<T: Copy + Default>(src: &[T], idx: &[u32], row: usize) -> Vec<T> {
    let mut out = vec![T::default(); idx.len() * row];
    gather_into(src, idx, row, &mut out);
    out
}

/// Rows of `src` at `idx` into the first rows of `out`.
fn gather_into<T: Copy>(src: &[T], idx: &[u32], row: usize, out: &mut [T]) {
    for (to, &j) in out.chunks_exact_mut(row).zip(idx) {
        let j = j as usize;
        to.copy_from_slice(&src[j * row..(j + 1) * row]);
    }
}

impl CustomOp2 for Gather {
    fn name(&self) -> &'static str {
        "mlff-gather"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (n_src, row) = rows_of(l1.shape(), self.name())?;
        let idx = cpu_index(s2, l2, n_src, self.name())?;
        let (a, b) = contiguous(l1, self.name(), "data")?;
        let out = match s1 {
            CpuStorage::F32(v) => CpuStorage::F32(gather_cpu(&v[a..b], idx, row)),
            CpuStorage::F64(v) => CpuStorage::F64(gather_cpu(&v[a..b], idx, row)),
            s => bail!(
                "mlff-gather: dtype {:?} is not supported (f32, f64)",
                s.dtype()
            ),
        };
        Ok((out, out_shape(l1.shape(), idx.len())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (n_src, row) = rows_of(l1.shape(), self.name())?;
        let n_idx = l2.shape().elem_count();
        let out = crate::ops::edges::rows::cuda::launch_rows(
            "mlff_gather",
            PTX,
            "gather",
            s1,
            l1,
            s2,
            l2,
            n_idx,
            row,
            n_src,
            false,
        )?;
        Ok((out, out_shape(l1.shape(), n_idx)))
    }

    fn bwd(
        &self,
        x: &Tensor,
        idx: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(scatter_add(grad, idx, x.dim(0)?)?), None))
    }
}

/// The initial state's gather: rows of a table [n_src, F] at N indices into the first N rows.
struct InitialState {
    n: usize,
    f: usize,
    n_src: usize,
}

impl Kernel for InitialState {
    overlaps_previous!();
    kernel_source!("initial_state", "gather");
    fn work(&self) -> usize {
        self.n * self.f
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.n, self.f, self.n_src]
    }
    /// x = [table]; idx = [species], checked by [`initial_state`] on the CPU.
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        gather_into(x[0], idx[0], self.f, out);
    }
}

/// PaiNN's initial state [4N, F] for an embedding [elements, F] and per-atom element indices
/// `species` (u32, [N]): s = the embedding's rows, v = 0; one launch where a gather and a
/// concatenation took three. On the CPU every index is checked (the first out of range is
/// named); on CUDA they are trusted (the calculator builds them from checked elements).
pub fn initial_state(embedding: &Tensor, species: &Tensor) -> Result<Tensor> {
    let (n_src, f) = embedding.dims2()?;
    let n = species.dims1()?;
    check_elements(species, n_src, "initial state")?;
    let k = InitialState { n, f, n_src };
    launch(k, &[embedding], &[species], (4 * n, f), Init::Zero)
}
