//! The CUDA side of the launcher: kernel arguments as device views, the functions of
//! kernels/ loaded once per device from the embedded images, and plain launches.

use super::cooperative::STATIC_SHARED_BYTES;
use super::{range, Kernel};
use candle_core::{bail, DType, Result, Storage, Tensor};

/// The elements of a contiguous CUDA tensor `t` (whose storage is `storage`), as a kernel
/// argument of op `op`; `what` names it in errors ("inputs", "indices").
#[cfg(feature = "cuda")]
pub(crate) fn cuda_view<'a, T: candle_core::cuda_backend::CudaDType>(
    storage: &'a Storage,
    t: &Tensor,
    op: &str,
    what: &str,
) -> Result<candle_core::cuda_backend::cudarc::driver::CudaView<'a, T>> {
    let (a, b) = range(t, op)?;
    match storage {
        Storage::Cuda(s) => Ok(s.as_cuda_slice::<T>()?.slice(a..b)),
        _ => bail!("{op}: {what} must be on the CUDA device"),
    }
}

/// `kernel`'s function for `dtype` (f32 or f64) on `dev` and its launch shape.
#[cfg(feature = "cuda")]
pub(crate) fn kernel_function<K: Kernel>(
    kernel: &K,
    dev: &candle_core::CudaDevice,
    dtype: DType,
) -> Result<(
    candle_core::cuda_backend::cudarc::driver::CudaFunction,
    candle_core::cuda_backend::cudarc::driver::LaunchConfig,
)> {
    let cfg = kernel.launch_config(dtype.size_in_bytes());
    let func = cached_function(
        dev,
        kernel.function(),
        K::MODULE,
        K::IMAGE,
        dtype,
        cfg.shared_mem_bytes,
    )?;
    Ok((func, cfg))
}

/// Pushes `kernel`'s `sizes` and `reals` (its [`Kernel::sizes`] and [`Kernel::reals`]) after
/// the pointers `b` holds, and launches it with `cfg` (cooperatively where it asks to be).
#[cfg(feature = "cuda")]
pub(crate) fn launch_with_sizes<'a, K: Kernel>(
    kernel: &K,
    mut b: candle_core::cuda_backend::cudarc::driver::LaunchArgs<'a>,
    sizes: &'a [usize],
    reals: &'a [f64],
    cfg: candle_core::cuda_backend::cudarc::driver::LaunchConfig,
) -> Result<()> {
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    for s in sizes {
        b.arg(s);
    }
    for r in reals {
        b.arg(r);
    }
    // SAFETY: the argument list follows the convention documented at the top of this file,
    // which every kernel in kernels/ declares.
    let launched = match kernel.cooperative() {
        true => unsafe { b.launch_cooperative(cfg) },
        false => unsafe { b.launch(cfg) },
    };
    launched.map_err(|e| candle_core::Error::Cuda(Box::new(e)))?;
    Ok(())
}

/// The kernel `{name}_{f32|f64}` of a device, loaded once: looking it up per launch (a name
/// string and a driver query) costs host time that small-molecule steps feel.
/// Launches asking for more than [`STATIC_SHARED_BYTES`] of shared memory opt in to it here,
/// once per function and size rather than per launch.
#[cfg(feature = "cuda")]
pub(crate) fn cached_function(
    dev: &candle_core::CudaDevice,
    name: &'static str,
    module: &'static str,
    image: &'static [u8],
    dtype: DType,
    shared_bytes: u32,
) -> Result<candle_core::cuda_backend::cudarc::driver::CudaFunction> {
    use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
    use candle_core::cuda_backend::cudarc::driver::CudaFunction;
    use candle_core::cuda_backend::DeviceId;
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    /// Each function with the most dynamic shared memory it was opted in to.
    type Cache = Mutex<HashMap<(DeviceId, &'static str, DType), (CudaFunction, u32)>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = (dev.id(), name, dtype);
    let cache = CACHE.get_or_init(Default::default);
    let cached = cache.lock().ok().and_then(|c| c.get(&key).cloned());
    if let Some((f, opted)) = &cached {
        if shared_bytes <= (*opted).max(STATIC_SHARED_BYTES) {
            return Ok(f.clone());
        }
    }
    let f = match cached {
        Some((f, _)) => f,
        None => {
            let suffix = if dtype == DType::F32 { "f32" } else { "f64" };
            load_module(dev, module, image)?
                .load_function(&format!("{name}_{suffix}"))
                .map_err(|e| candle_core::Error::Cuda(Box::new(e)))?
        }
    };
    let mut opted = 0;
    if shared_bytes > STATIC_SHARED_BYTES {
        let attr = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        f.set_attribute(attr, shared_bytes as i32)
            .map_err(|e| candle_core::Error::Cuda(Box::new(e)))?;
        opted = shared_bytes;
    }
    if let Ok(mut c) = cache.lock() {
        c.insert(key, (f.clone(), opted));
    }
    Ok(f)
}

/// kernels/`module`.cu's compiled `image` on `dev`, loaded once per device.
#[cfg(feature = "cuda")]
fn load_module(
    dev: &candle_core::CudaDevice,
    module: &'static str,
    image: &'static [u8],
) -> Result<std::sync::Arc<candle_core::cuda_backend::cudarc::driver::CudaModule>> {
    use candle_core::cuda_backend::cudarc::driver::CudaModule;
    use candle_core::cuda_backend::cudarc::nvrtc::Ptx;
    use candle_core::cuda_backend::DeviceId;
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    type Modules = Mutex<HashMap<(DeviceId, &'static str), Arc<CudaModule>>>;
    static MODULES: OnceLock<Modules> = OnceLock::new();
    let mut modules = (MODULES.get_or_init(Default::default).lock())
        .map_err(|_| candle_core::Error::Msg("kernel modules: lock poisoned".into()))?;
    if let Some(m) = modules.get(&(dev.id(), module)) {
        return Ok(m.clone());
    }
    let loaded = (dev
        .cuda_stream()
        .context()
        .load_module(Ptx::from_binary(image.to_vec())))
    .map_err(|e| candle_core::Error::Cuda(Box::new(e)))?;
    modules.insert((dev.id(), module), loaded.clone());
    Ok(loaded)
}
