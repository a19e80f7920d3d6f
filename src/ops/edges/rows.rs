//! Shared plumbing for ops that move whole rows (dimension 0) of a tensor by a u32 index.

use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, DType, Layout, Result, Shape, Tensor};

/// The values of a few u32s (1-D) on the host. A view of a larger buffer is first cast into a
/// storage of its own (f64: exact for any u32), because candle reads a CUDA tensor back by
/// copying its whole storage: a count at the end of an edge list's buffer would otherwise
/// bring the list along (hundreds of MB at millions of edges).
pub(crate) fn host_u32s(t: &Tensor) -> Result<Vec<u32>> {
    if t.device().is_cpu() {
        return t.to_vec1::<u32>();
    }
    let v = t.to_dtype(DType::F64)?.to_vec1::<f64>()?;
    Ok(v.into_iter().map(|x| x as u32).collect())
}

/// (number of rows, elements per row) of a tensor with at least one dimension.
pub(crate) fn rows_of(shape: &Shape, op: &str) -> Result<(usize, usize)> {
    let dims = shape.dims();
    if dims.is_empty() {
        bail!("{op}: data must have at least one dimension, got a scalar")
    }
    Ok((dims[0], dims[1..].iter().product()))
}

/// The output shape: the data's shape with its first dimension replaced by `n_rows`.
pub(crate) fn out_shape(shape: &Shape, n_rows: usize) -> Shape {
    let mut dims = shape.dims().to_vec();
    dims[0] = n_rows;
    Shape::from(dims)
}

/// The contiguous `[start, end)` element range of a layout, or an error naming the op.
pub(crate) fn contiguous(l: &Layout, op: &str, what: &str) -> Result<(usize, usize)> {
    match l.contiguous_offsets() {
        Some(r) => Ok(r),
        None => bail!("{op}: {what} must be contiguous"),
    }
}

/// The u32 index slice of a CPU storage, checked against `bound`.
pub(crate) fn cpu_index<'a>(
    s: &'a CpuStorage,
    l: &Layout,
    bound: usize,
    op: &str,
) -> Result<&'a [u32]> {
    if l.dims().len() != 1 {
        bail!("{op}: index must be 1-D, got shape {:?}", l.dims())
    }
    let (a, b) = contiguous(l, op, "index")?;
    let idx = match s {
        CpuStorage::U32(v) => &v[a..b],
        _ => bail!("{op}: index must be u32, got {:?}", s.dtype()),
    };
    if let Some((e, &i)) = idx.iter().enumerate().find(|(_, &i)| i as usize >= bound) {
        bail!("{op}: index[{e}] = {i} is out of range for {bound} rows")
    }
    Ok(idx)
}

#[cfg(feature = "cuda")]
pub(crate) mod cuda {
    use super::*;
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    use candle_core::cuda_backend::{CudaStorage, CudaStorageSlice};
    use candle_core::DType;

    /// Launches `{kernel}_{f32|f64}(src, idx, out, n_idx, row, n_rows_other)` over
    /// `n_idx * row` threads. `out_rows` rows are allocated for the output, zeroed when
    /// `zero_init` (scatter) and left uninitialised otherwise (gather writes every element).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_rows(
        module: &str,
        ptx: &'static str,
        kernel: &str,
        src: &CudaStorage,
        src_l: &Layout,
        idx: &CudaStorage,
        idx_l: &Layout,
        out_rows: usize,
        row: usize,
        bound: usize,
        zero_init: bool,
    ) -> Result<CudaStorage> {
        let dev = src.device.clone();
        let (ia, ib) = contiguous(idx_l, kernel, "index")?;
        let (sa, sb) = contiguous(src_l, kernel, "data")?;
        let idx = match &idx.slice {
            CudaStorageSlice::U32(s) => s.slice(ia..ib),
            _ => bail!("{kernel}: index must be u32, got {:?}", idx.dtype()),
        };
        let n_idx = ib - ia;
        let n_out = out_rows * row;
        let threads = n_idx * row;
        let cfg = crate::ops::launch::grid_stride(threads);
        macro_rules! run {
            ($t:ty, $variant:ident, $suffix:literal) => {{
                let s = match &src.slice {
                    CudaStorageSlice::$variant(s) => s.slice(sa..sb),
                    _ => unreachable!(),
                };
                let out = if zero_init {
                    dev.alloc_zeros::<$t>(n_out)?
                } else {
                    // SAFETY: gather writes every one of the n_out elements.
                    unsafe { dev.alloc::<$t>(n_out)? }
                };
                if threads > 0 {
                    let name = format!("{kernel}{}", $suffix);
                    let f = dev.get_or_load_custom_func(&name, module, ptx)?;
                    let mut b = f.builder();
                    b.arg(&s).arg(&idx).arg(&out);
                    let (n_idx, row, bound) = (n_idx, row, bound);
                    b.arg(&n_idx).arg(&row).arg(&bound);
                    // SAFETY: argument types match the kernel's signature.
                    unsafe { b.launch(cfg) }.map_err(|e| candle_core::Error::Cuda(Box::new(e)))?;
                }
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            }};
        }
        Ok(match src.dtype() {
            DType::F32 => run!(f32, F32, "_f32"),
            DType::F64 => run!(f64, F64, "_f64"),
            d => bail!("{kernel}: dtype {d:?} is not supported (f32, f64)"),
        })
    }
}
