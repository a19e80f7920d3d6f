//! Device selection (`cpu`, `cuda[:N]`, `auto`) with a clear fallback, and GPU facts for
//! `mlff check`.

use crate::error::{Error, Result};
use candle_core::{DType, Device};
use serde::Serialize;

/// What the user asked for with `--device`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    Cpu,
    Cuda(usize),
    /// CUDA device 0 when this build and machine have one, else the CPU.
    Auto,
}

impl std::str::FromStr for DeviceSpec {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "auto" => Ok(Self::Auto),
            "cuda" | "gpu" => Ok(Self::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Self::Cuda(n)),
                _ => Err(format!(
                    "unknown device `{s}` (expected cpu, cuda, cuda:N or auto)"
                )),
            },
        }
    }
}

/// As `--device` takes it.
impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => write!(f, "cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
            Self::Auto => write!(f, "auto"),
        }
    }
}

/// The device chosen, and a note for the user when `auto` fell back to the CPU.
pub struct Selected {
    pub device: Device,
    pub fallback_note: Option<String>,
}

/// Opens the requested device. An explicit `cuda` that cannot be had is an error naming the
/// reason; `auto` falls back to the CPU and says why.
pub fn select(spec: DeviceSpec) -> Result<Selected> {
    match spec {
        DeviceSpec::Cpu => Ok(Selected {
            device: Device::Cpu,
            fallback_note: None,
        }),
        DeviceSpec::Cuda(n) => Ok(Selected {
            device: open_cuda(n)?,
            fallback_note: None,
        }),
        DeviceSpec::Auto => match open_cuda(0) {
            Ok(device) => Ok(Selected {
                device,
                fallback_note: None,
            }),
            Err(e) => Ok(Selected {
                device: Device::Cpu,
                fallback_note: Some(format!("using the CPU: {e}")),
            }),
        },
    }
}

/// Held while a device is opened or released and while a CUDA graph is captured, so that these
/// never overlap in one process: opening a device synchronises its whole context (cudarc does
/// so when a context object makes its first stream) and releasing one destroys its cuBLAS
/// handle, which synchronises the GPU; either invalidates a capture running in another thread,
/// and the failure surfaces at that thread's next call.
#[cfg(feature = "cuda")]
pub(crate) struct CaptureLock(std::sync::MutexGuard<'static, Vec<Device>>);

/// Takes the [`CaptureLock`], first releasing the opened devices nothing uses any more.
#[cfg(feature = "cuda")]
pub(crate) fn capture_lock() -> CaptureLock {
    // Every device `open_cuda` made: its last handle is dropped here, under the lock.
    static OPENED: std::sync::Mutex<Vec<Device>> = std::sync::Mutex::new(Vec::new());
    // A panic while holding it leaves nothing half-done that the next holder would see.
    let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    opened.retain(|dev| match dev {
        // The list's handle and this call's copy: no tensor or caller holds the device.
        Device::Cuda(c) => std::sync::Arc::strong_count(&c.cublas_handle()) > 2,
        _ => false,
    });
    CaptureLock(opened)
}

/// Opens CUDA device `n` with a stream of its own (CUDA graphs cannot capture the per-thread
/// default stream candle would use), a caching memory pool and no per-buffer events.
#[cfg(feature = "cuda")]
fn open_cuda(n: usize) -> Result<Device> {
    let mut lock = capture_lock();
    let dev = Device::new_cuda_with_stream(n)
        .map_err(|e| Error::Device(format!("cannot open CUDA device {n}: {e}")))?;
    keep_pool_memory(&dev);
    single_stream_without_events(&dev);
    lock.0.push(dev.clone());
    Ok(dev)
}

/// Stops cudarc from creating two CUDA events for every allocation (and destroying them on
/// free) and from recording them at every launch: they order a buffer's uses across streams,
/// and each device we open queues all its work on its one stream, in order, with
/// stream-ordered frees. At molecule size a step makes ~80 allocations, so this saves ~320
/// driver calls per step (a faster molecule call: docs/bench-log/11-cuda-graphs.md), and graph
/// capture needs it (a wait on an event recorded outside the capture is illegal inside it).
#[cfg(feature = "cuda")]
fn single_stream_without_events(dev: &Device) {
    let Device::Cuda(c) = dev else { return };
    // SAFETY: every tensor of this device is made and used on its single stream (candle
    // refuses to mix devices, and each device object has its own stream), and host reads
    // synchronise that stream.
    unsafe { c.disable_event_tracking() };
}

/// The device's default memory pool, which candle's stream-ordered allocations
/// (`cuMemAllocAsync`) come from.
#[cfg(feature = "cuda")]
pub fn default_mem_pool(
    c: &candle_core::CudaDevice,
) -> Option<candle_core::cuda_backend::cudarc::driver::sys::CUmemoryPool> {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let ctx = c.cuda_stream().context().clone();
    ctx.bind_to_thread().ok()?;
    let mut pool = std::mem::MaybeUninit::uninit();
    // SAFETY: a query that writes one handle for a device of this live context.
    let r = unsafe { sys::cuDeviceGetDefaultMemPool(pool.as_mut_ptr(), ctx.cu_device()) };
    // SAFETY: written by the successful call.
    (r == sys::cudaError_enum::CUDA_SUCCESS).then(|| unsafe { pool.assume_init() })
}

/// Keeps freed memory in the default pool instead of handing it back to the driver at every
/// synchronisation (the pool's default release threshold is 0), so that each step does not map
/// its ~1,000 allocations afresh: a caching allocator, as PyTorch has.
#[cfg(feature = "cuda")]
fn keep_pool_memory(dev: &Device) {
    use candle_core::cuda_backend::cudarc::driver::sys;
    let Device::Cuda(c) = dev else { return };
    if let Some(pool) = default_mem_pool(c) {
        let mut keep = u64::MAX;
        // SAFETY: the release threshold is a 64-bit integer read from `keep`.
        unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut keep as *mut u64 as *mut _,
            )
        };
    }
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(n: usize) -> Result<Device> {
    Err(Error::Device(format!(
        "cannot open CUDA device {n}: this binary was built without the `cuda` feature \
         (rebuild with `cargo build --release --features cuda`, or use --device cpu)"
    )))
}

/// Short human name of a device, e.g. `cpu` or `cuda:0`.
pub fn device_name(dev: &Device) -> String {
    match dev {
        Device::Cpu => "cpu".into(),
        Device::Cuda(_) => format!("cuda:{}", cuda_ordinal(dev)),
        Device::Metal(_) => "metal".into(),
    }
}

fn cuda_ordinal(_dev: &Device) -> usize {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(c) = _dev {
        return c.cuda_stream().context().ordinal();
    }
    0
}

/// The same device with another stream of its own (CUDA), so that work queued there runs
/// alongside other streams' work; the CPU is returned as is.
pub fn with_own_stream(dev: &Device) -> Result<Device> {
    match dev {
        Device::Cuda(_) => open_cuda(cuda_ordinal(dev)),
        other => Ok(other.clone()),
    }
}

/// Warms a device up: runs the model's kinds of kernels once (matmul, elementwise, our gather
/// and scatter, a backward pass) so that later timings exclude kernel loading (modules loaded
/// on first use; candle's own kernels are PTX, compiled by the driver then) and first
/// allocations. Returns how long that took.
pub fn warm_up(dev: &Device) -> Result<std::time::Duration> {
    let t = std::time::Instant::now();
    let x = candle_core::Var::from_tensor(&candle_core::Tensor::ones((64, 128), DType::F32, dev)?)?;
    let idx = candle_core::Tensor::arange(0u32, 64, dev)?;
    let y = crate::ops::gather(&x.matmul(&x.t()?)?.silu()?, &idx)?;
    let s = crate::ops::scatter_add(&y, &idx, 64)?;
    s.sum_all()?.backward()?;
    dev.synchronize()?;
    Ok(t.elapsed())
}

/// Waits for queued device work, so host clocks measure finished work.
pub fn synchronize(dev: &Device) -> Result<()> {
    Ok(dev.synchronize()?)
}

/// Facts about one GPU.
#[derive(Clone, Debug, Serialize)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    pub compute_capability: String,
    pub memory_total_bytes: usize,
    pub memory_free_bytes: usize,
    /// CUDA version the driver supports, e.g. "13.0".
    pub driver_cuda_version: String,
    /// CUDA version this binary was built against.
    pub runtime_cuda_version: String,
}

/// What `mlff check` reports.
#[derive(Clone, Debug, Serialize)]
pub struct SystemReport {
    pub version: &'static str,
    pub cuda_feature: bool,
    pub cpu_threads: usize,
    pub gpus: Vec<GpuInfo>,
    /// Why no GPU is listed, when none is.
    pub gpu_error: Option<String>,
}

pub fn system_report() -> SystemReport {
    let (gpus, gpu_error) = match gpu_infos() {
        Ok(g) if g.is_empty() => (g, Some("no CUDA device found".into())),
        Ok(g) => (g, None),
        Err(e) => (vec![], Some(e.to_string())),
    };
    SystemReport {
        version: env!("CARGO_PKG_VERSION"),
        cuda_feature: cfg!(feature = "cuda"),
        cpu_threads: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        gpus,
        gpu_error,
    }
}

/// Number of CUDA devices the driver sees, without creating a context on any (0 without the
/// `cuda` feature or a driver): for callers that pick a device per process, as LAMMPS ranks do.
pub fn cuda_device_count() -> usize {
    #[cfg(feature = "cuda")]
    {
        use candle_core::cuda_backend::cudarc::driver::CudaContext;
        CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
    }
    #[cfg(not(feature = "cuda"))]
    {
        0
    }
}

#[cfg(not(feature = "cuda"))]
pub fn gpu_infos() -> Result<Vec<GpuInfo>> {
    Err(Error::Device(
        "built without the `cuda` feature (rebuild with --features cuda)".into(),
    ))
}

#[cfg(feature = "cuda")]
pub fn gpu_infos() -> Result<Vec<GpuInfo>> {
    use candle_core::cuda_backend::cudarc::driver::{sys, CudaContext};
    let e = |e: candle_core::cuda_backend::cudarc::driver::DriverError| {
        Error::Device(format!("CUDA driver: {e}"))
    };
    let count = CudaContext::device_count().map_err(e)?;
    let mut driver = 0i32;
    // SAFETY: plain query writing one int.
    unsafe { sys::cuDriverGetVersion(&mut driver) };
    let version = |v: i64| format!("{}.{}", v / 1000, (v % 1000) / 10);
    (0..count as usize)
        .map(|n| {
            let ctx = CudaContext::new(n).map_err(e)?;
            let (major, minor) = ctx.compute_capability().map_err(e)?;
            let (free, total) = ctx.mem_get_info().map_err(e)?;
            Ok(GpuInfo {
                ordinal: n,
                name: ctx.name().map_err(e)?,
                compute_capability: format!("{major}.{minor}"),
                memory_total_bytes: total,
                memory_free_bytes: free,
                driver_cuda_version: version(driver as i64),
                runtime_cuda_version: version(sys::CUDA_VERSION as i64),
            })
        })
        .collect()
}
