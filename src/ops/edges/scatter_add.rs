//! Row scatter-add, `out[idx[e], ...] += src[e, ...]`; its backward is [`gather`].

use crate::ops::edges::gather::gather;
use crate::ops::edges::rows::{contiguous, cpu_index, out_shape, rows_of};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

#[cfg(feature = "cuda")]
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/scatter_add.ptx"));

/// The scatter-add custom op into `n_out` rows; use [`scatter_add`].
pub struct ScatterAdd {
    pub n_out: usize,
}

/// Sums rows of `src` (any rank ≥ 1) into `n_out` zero rows at the u32 indices `idx` (1-D,
/// one per row of `src`). Differentiable to any order with respect to `src`.
pub fn scatter_add(src: &Tensor, idx: &Tensor, n_out: usize) -> Result<Tensor> {
    if idx.dims() != [src.dim(0)?] {
        bail!(
            "mlff-scatter-add: index shape {:?} does not match the {} source rows",
            idx.dims(),
            src.dim(0)?
        )
    }
    src.contiguous()?
        .apply_op2(&idx.contiguous()?, ScatterAdd { n_out })
}

fn scatter_add_cpu<T: Copy + Default + std::ops::AddAssign>(
    src: &[T],
    idx: &[u32],
    row: usize,
    n_out: usize,
) -> Vec<T> {
    let mut out = vec![T::default(); n_out * row];
    for (e, &i) in idx.iter().enumerate() {
        let i = i as usize;
        for (o, &s) in out[i * row..(i + 1) * row]
            .iter_mut()
            .zip(&src[e * row..(e + 1) * row])
        {
            *o += s;
        }
    }
    out
}

impl CustomOp2 for ScatterAdd {
    fn name(&self) -> &'static str {
        "mlff-scatter-add"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (_, row) = rows_of(l1.shape(), self.name())?;
        let idx = cpu_index(s2, l2, self.n_out, self.name())?;
        let (a, b) = contiguous(l1, self.name(), "data")?;
        let n = self.n_out;
        let out = match s1 {
            CpuStorage::F32(v) => CpuStorage::F32(scatter_add_cpu(&v[a..b], idx, row, n)),
            CpuStorage::F64(v) => CpuStorage::F64(scatter_add_cpu(&v[a..b], idx, row, n)),
            s => bail!(
                "mlff-scatter-add: dtype {:?} is not supported (f32, f64)",
                s.dtype()
            ),
        };
        Ok((out, out_shape(l1.shape(), n)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (_, row) = rows_of(l1.shape(), self.name())?;
        let n = self.n_out;
        let out = crate::ops::edges::rows::cuda::launch_rows(
            "mlff_scatter_add",
            PTX,
            "scatter_add",
            s1,
            l1,
            s2,
            l2,
            n,
            row,
            n,
            true,
        )?;
        Ok((out, out_shape(l1.shape(), n)))
    }

    fn bwd(
        &self,
        _src: &Tensor,
        idx: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Ok((Some(gather(grad, idx)?), None))
    }
}
