//! The launcher of kernels/neighbors.cu: a step's kernel, its launch shape and its arguments in
//! the kernels' order.

use super::step::{Step, StepOp};
use crate::ops::launch::{cached_function, grid_stride};
use candle_core::cuda_backend::cudarc::driver::{CudaView, LaunchConfig, PushKernelArg};
use candle_core::{CudaDevice, CudaStorage, DType, Result, Storage, Tensor};

const IMAGE: &[u8] = crate::ops::launch::kernel_image!("neighbors");
/// Threads per block of the warp-per-atom kernels.
const BLOCK: u32 = 256;

enum View<'a> {
    F64(CudaView<'a, f64>),
    F32(CudaView<'a, f32>),
    U32(CudaView<'a, u32>),
}

fn view<'a>(t: &Tensor, storage: &'a Storage) -> Result<View<'a>> {
    let Some((a, b)) = t.layout().contiguous_offsets() else {
        candle_core::bail!("neighbour list: inputs must be contiguous")
    };
    match storage {
        Storage::Cuda(s) if t.dtype() == DType::F64 => {
            Ok(View::F64(s.as_cuda_slice::<f64>()?.slice(a..b)))
        }
        Storage::Cuda(s) if t.dtype() == DType::F32 => {
            Ok(View::F32(s.as_cuda_slice::<f32>()?.slice(a..b)))
        }
        Storage::Cuda(s) => Ok(View::U32(s.as_cuda_slice::<u32>()?.slice(a..b))),
        _ => candle_core::bail!("neighbour list: inputs must be on the CUDA device"),
    }
}

fn warp_per_atom(n: usize) -> LaunchConfig {
    let blocks = (n * 32).div_ceil(BLOCK as usize).clamp(1, 65535) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(super) fn launch(op: &StepOp, dev: &CudaDevice) -> Result<(CudaStorage, candle_core::Shape)> {
    let guards: Vec<_> = op.inputs.iter().map(|t| t.storage_and_layout()).collect();
    let mut views = Vec::with_capacity(guards.len());
    for (t, (g, _)) in op.inputs.iter().zip(&guards) {
        views.push(view(t, g)?);
    }
    let (gguard, _) = op.geometry.storage_and_layout();
    let span_guard = op.spans.as_ref().map(|t| t.storage_and_layout());
    let spans = match (&op.spans, &span_guard) {
        (Some(t), Some((g, _))) => match view(t, g)? {
            View::U32(v) => Some(v),
            _ => candle_core::bail!("neighbour list: spans must be u32"),
        },
        _ => None,
    };
    // A null pointer where every atom's candidates are all atoms.
    let no_spans = 0u64;
    let View::F64(geometry) = view(&op.geometry, &gguard)? else {
        candle_core::bail!("neighbour list: geometry must be f64")
    };
    let (n, len) = (op.atoms, op.shape.elem_count());
    // The pruning kernels are instantiated for the list's offsets, the offsets kernel for
    // its output; the others read f64 positions only.
    let suffix = match op.step {
        Step::PruneCount { .. } | Step::PruneFill { .. } => op.inputs[3].dtype(),
        _ if op.dtype == DType::F32 => DType::F32,
        _ => DType::F64,
    };
    let func = cached_function(dev, op.step.kernel(), "neighbors", IMAGE, suffix, 0)?;
    let cfg = match op.step {
        Step::Wrap | Step::BinOf | Step::BinCount { .. } | Step::BinPlace { .. } => grid_stride(n),
        Step::Count
        | Step::Fill { .. }
        | Step::CountBinned
        | Step::FillBinned { .. }
        | Step::PruneCount { .. }
        | Step::PruneFill { .. } => warp_per_atom(n),
        Step::Scan { .. } => LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        },
        Step::Offsets { capacity } => grid_stride(capacity),
    };
    let periodic = u32::from(op.periodic);
    let stream = dev.cuda_stream();
    let mut b = stream.launch_builder(&func);
    for (k, v) in views.iter().enumerate() {
        match v {
            View::F64(v) => b.arg(v),
            View::F32(v) => b.arg(v),
            View::U32(v) => b.arg(v),
        };
        // The positions are followed by the geometry in the kernels that build.
        let builds = matches!(
            op.step,
            Step::Wrap
                | Step::Count
                | Step::Fill { .. }
                | Step::Offsets { .. }
                | Step::BinOf
                | Step::CountBinned
                | Step::FillBinned { .. }
        );
        if k == 0 && builds {
            b.arg(&geometry);
        }
    }
    let capacity = match op.step {
        Step::Scan { capacity }
        | Step::Fill { capacity }
        | Step::FillBinned { capacity }
        | Step::Offsets { capacity } => capacity,
        Step::PruneFill { edges, .. } => edges,
        _ => 0,
    };
    // The bin counts and cursors are added to atomically.
    let zeroed = matches!(op.step, Step::BinCount { .. } | Step::BinPlace { .. });
    macro_rules! finish {
        ($t:ty) => {{
            let mut out = match zeroed {
                true => dev.alloc_zeros::<$t>(len)?,
                // SAFETY: every other kernel of neighbors.cu writes all `len` elements of its
                // output.
                false => unsafe { dev.alloc::<$t>(len)? },
            };
            b.arg(&mut out);
            b.arg(&n);
            match op.step {
                Step::Wrap | Step::BinOf | Step::BinCount { .. } | Step::BinPlace { .. } => {}
                Step::CountBinned => {
                    b.arg(&periodic);
                    b.arg(&op.cut2);
                }
                Step::FillBinned { .. } => {
                    b.arg(&capacity);
                    b.arg(&periodic);
                    b.arg(&op.cut2);
                }
                Step::Count => {
                    b.arg(&periodic);
                    b.arg(&op.cut2);
                    match &spans {
                        Some(v) => b.arg(v),
                        None => b.arg(&no_spans),
                    };
                }
                Step::Scan { .. } => {
                    b.arg(&capacity);
                }
                Step::Fill { .. } => {
                    b.arg(&capacity);
                    b.arg(&periodic);
                    b.arg(&op.cut2);
                    match &spans {
                        Some(v) => b.arg(v),
                        None => b.arg(&no_spans),
                    };
                }
                Step::Offsets { .. } => {
                    b.arg(&capacity);
                    b.arg(&periodic);
                    b.arg(&op.cut2);
                    b.arg(&op.pad);
                }
                Step::PruneCount { .. } => {
                    b.arg(&op.cut2);
                }
                Step::PruneFill { .. } => {
                    b.arg(&capacity);
                    b.arg(&op.cut2);
                }
            }
            // SAFETY: the arguments follow the signatures of kernels/neighbors.cu.
            unsafe { b.launch(cfg) }.map_err(|e| candle_core::Error::Cuda(Box::new(e)))?;
            drop(b);
            CudaStorage::wrap_cuda_slice(out, dev.clone())
        }};
    }
    let out = match op.dtype {
        DType::U32 => finish!(u32),
        DType::F32 => finish!(f32),
        _ => finish!(f64),
    };
    Ok((out, op.shape.clone()))
}
