//! Kernels launched to overlap the previous kernel on their stream (CUDA's programmatic
//! dependent launch, sm_90 and later). A separate-kernel call at 1,000-4,000 atoms is ~40
//! short kernels, each of which used to start only once the previous one had finished:
//! its launch, its first loads (a dense layer's weights) and the previous kernel's last blocks
//! ran one after another. Launched this way a kernel's blocks may start as soon as every block
//! of the previous kernel has passed `wait_for_previous_kernel` (kernels/include/common.cuh); each
//! waits there itself before it reads anything another kernel wrote or writes anything, so
//! only work on the model's constants (staging weights) runs early. A kernel opts in with
//! [`Kernel::overlaps_previous`](super::Kernel::overlaps_previous), and must then call
//! the wait. Captured into a CUDA graph the launches become programmatic edges. Eager calls
//! gain a little; replayed graphs, whose launches were already back to back, nothing (the A/B
//! in docs/bench-log/27-dense-half-bytes-overlap.md).

use candle_core::cuda_backend::cudarc::driver::{
    sys, CudaFunction, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, LaunchConfig,
};
use candle_core::Result;
use std::ffi::c_void;

/// Launches `func` with `cfg` on `stream` allowed to overlap the previous kernel, with the
/// arguments of the convention of `ops::launch` (input pointers, index pointers, the output
/// pointer, then `sizes` as size_t and `reals` as double).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch<T>(
    func: &CudaFunction,
    cfg: LaunchConfig,
    stream: &CudaStream,
    inputs: &[CudaView<'_, T>],
    index: &[CudaView<'_, u32>],
    out: &mut CudaViewMut<'_, T>,
    sizes: &[usize],
    reals: &[f64],
) -> Result<()> {
    let cuda = |e| candle_core::Error::Cuda(Box::new(e));
    // The pointers first, all of them, so that the argument array below points into vectors
    // that no longer grow. The guards record nothing while event tracking is off (device.rs)
    // and are kept until the launch is queued either way.
    let mut pointers = Vec::with_capacity(inputs.len() + index.len() + 1);
    let mut guards = Vec::with_capacity(pointers.capacity());
    for (p, g) in inputs.iter().map(|v| v.device_ptr(stream)) {
        pointers.push(p);
        guards.push(g);
    }
    for (p, g) in index.iter().map(|v| v.device_ptr(stream)) {
        pointers.push(p);
        guards.push(g);
    }
    let (out_pointer, out_guard) = out.device_ptr_mut(stream);
    pointers.push(out_pointer);
    let mut sizes: Vec<u64> = sizes.iter().map(|&s| s as u64).collect();
    let mut reals = reals.to_vec();
    let mut args: Vec<*mut c_void> = pointers
        .iter_mut()
        .map(|p| p as *mut u64 as *mut c_void)
        .chain(sizes.iter_mut().map(|s| s as *mut u64 as *mut c_void))
        .chain(reals.iter_mut().map(|r| r as *mut f64 as *mut c_void))
        .collect();
    // SAFETY: a zeroed attribute is valid (id 0 is "ignore"); the id and the union field set
    // below are the ones CUDA reads for programmatic stream serialisation.
    let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attribute.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attribute.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: &mut attribute,
        numAttrs: 1,
    };
    stream.context().bind_to_thread().map_err(cuda)?;
    // SAFETY: `args` holds one pointer per kernel parameter, in the order and of the types
    // that every kernel of kernels/ declares (ops::kernel's convention), each pointing at a
    // live value; the device pointers are views of live allocations on this stream.
    let launched = unsafe {
        sys::cuLaunchKernelEx(
            &config,
            func.cu_function(),
            args.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    drop((guards, out_guard));
    launched.result().map_err(cuda)
}
