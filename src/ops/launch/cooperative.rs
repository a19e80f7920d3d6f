//! What cooperative launches (every block resident at once, barriers among them) need of a
//! device: its multiprocessors and shared memory, and the barrier's counters.

use candle_core::{DType, Device, Result, Tensor};

/// The device's multiprocessors and shared memory per block (opt-in limit), asked of the driver
/// once per candle device: plans ask on every eager call.
#[cfg(feature = "cuda")]
pub(crate) fn device_limits(device: &Device) -> std::result::Result<(usize, usize), String> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUdevice_attribute;
    use candle_core::cuda_backend::DeviceId;
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static LIMITS: OnceLock<Mutex<HashMap<DeviceId, (usize, usize)>>> = OnceLock::new();
    let Device::Cuda(dev) = device else {
        return Err("the one-kernel path runs on CUDA devices".into());
    };
    let mut known = (LIMITS.get_or_init(Default::default).lock())
        .map_err(|_| "device limits: lock poisoned".to_string())?;
    if let Some(&limits) = known.get(&dev.id()) {
        return Ok(limits);
    }
    let attr = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN;
    let sms = dev
        .cuda_stream()
        .context()
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| e.to_string())?;
    let limit = (dev.cuda_stream().context().attribute(attr)).map_err(|e| e.to_string())?;
    let limits = (sms as usize, limit as usize);
    known.insert(dev.id(), limits);
    Ok(limits)
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn device_limits(_: &Device) -> std::result::Result<(usize, usize), String> {
    Err("the one-kernel path runs on CUDA devices (built without the cuda feature)".into())
}

/// The barrier's two counters (arrivals, finished blocks) of a device: zero between launches,
/// as the last block of each launch leaves them, so no launch waits for a memset. One per
/// candle device, whose launches all queue on its one stream (two at once would share it).
pub(crate) fn barrier_counters(device: &Device) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(dev) = device {
        use candle_core::cuda_backend::DeviceId;
        use std::collections::HashMap;
        use std::sync::{Mutex, OnceLock};
        static COUNTERS: OnceLock<Mutex<HashMap<DeviceId, Tensor>>> = OnceLock::new();
        let mut map = (COUNTERS.get_or_init(Default::default).lock())
            .map_err(|_| candle_core::Error::Msg("barrier counters: lock poisoned".into()))?;
        if let Some(t) = map.get(&dev.id()) {
            return Ok(t.clone());
        }
        let t = Tensor::zeros(2, DType::U32, device)?;
        map.insert(dev.id(), t.clone());
        return Ok(t);
    }
    // The CPU twin has no barriers.
    Tensor::zeros(2, DType::U32, device)
}

/// Shared memory a launch may use without opting in to more.
#[cfg(feature = "cuda")]
pub(super) const STATIC_SHARED_BYTES: u32 = 48 * 1024;

/// Launch shape of a cooperative one-kernel: `blocks` blocks of `threads` threads, each with
/// `shared_bytes` of dynamic shared memory.
#[cfg(feature = "cuda")]
pub(crate) fn cooperative_grid(
    blocks: usize,
    threads: usize,
    shared_bytes: usize,
) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
    candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: shared_bytes as u32,
    }
}
