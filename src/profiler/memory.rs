//! Memory sampling (process RSS; on CUDA the device's free/total memory and the stream-ordered
//! allocator pool that candle allocates from) and leak detection by a fitted slope.

use crate::md::linear_fit;
use candle_core::Device;
use serde::{Deserialize, Serialize};

/// Memory at one call or step. Fields that do not apply to the device are `None`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MemorySample {
    /// Call (or MD step) index the sample was taken after.
    pub call: usize,
    /// Resident set size of this process, bytes.
    pub rss_bytes: Option<u64>,
    pub device_free_bytes: Option<u64>,
    pub device_total_bytes: Option<u64>,
    /// Bytes in use / high-water mark of the device's default memory pool (cuMemAllocAsync).
    pub pool_used_bytes: Option<u64>,
    pub pool_high_bytes: Option<u64>,
    /// High-water mark of what replayed CUDA graphs allocate (their own memory, outside the
    /// pool: a captured training step's working memory is here).
    #[serde(default)]
    pub graph_high_bytes: Option<u64>,
}

impl MemorySample {
    /// The figure leak detection follows: the allocator pool on CUDA, else the RSS.
    pub fn tracked_bytes(&self) -> Option<u64> {
        self.pool_used_bytes.or(self.rss_bytes)
    }

    /// The peak since the last [`reset_peak`]: on CUDA the pool's high-water mark plus the
    /// graphs', else the RSS.
    pub fn peak_bytes(&self) -> Option<u64> {
        match (self.pool_high_bytes, self.graph_high_bytes) {
            (None, None) => self.rss_bytes,
            (pool, graphs) => Some(pool.unwrap_or(0) + graphs.unwrap_or(0)),
        }
    }
}

/// Resident set size (VmRSS in /proc/self/status, Linux), bytes.
pub fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Samples memory now, tagged with `call`.
pub fn sample(dev: &Device, call: usize) -> MemorySample {
    #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
    let mut s = MemorySample {
        call,
        rss_bytes: rss_bytes(),
        ..Default::default()
    };
    #[cfg(feature = "cuda")]
    if let Device::Cuda(c) = dev {
        cuda::fill(c, &mut s);
    }
    let _ = dev;
    s
}

/// Resets the pool's high-water mark (peak memory of what follows); no-op on the CPU.
pub fn reset_peak(dev: &Device) {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(c) = dev {
        cuda::reset_high(c);
    }
    let _ = dev;
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::MemorySample;
    use candle_core::cuda_backend::cudarc::driver::sys;
    use candle_core::CudaDevice;

    fn pool(c: &CudaDevice) -> Option<sys::CUmemoryPool> {
        crate::device::default_mem_pool(c)
    }

    fn attr(pool: sys::CUmemoryPool, a: sys::CUmemPool_attribute) -> Option<u64> {
        let mut v: u64 = 0;
        // SAFETY: these attributes are 64-bit integers written into `v`.
        let r = unsafe { sys::cuMemPoolGetAttribute(pool, a, &mut v as *mut u64 as *mut _) };
        (r == sys::cudaError_enum::CUDA_SUCCESS).then_some(v)
    }

    pub fn fill(c: &CudaDevice, s: &mut MemorySample) {
        if let Ok((free, total)) = c.cuda_stream().context().mem_get_info() {
            s.device_free_bytes = Some(free as u64);
            s.device_total_bytes = Some(total as u64);
        }
        if let Some(p) = pool(c) {
            use sys::CUmemPool_attribute::*;
            s.pool_used_bytes = attr(p, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
            s.pool_high_bytes = attr(p, CU_MEMPOOL_ATTR_USED_MEM_HIGH);
        }
        let device = c.cuda_stream().context().cu_device();
        let mut v: u64 = 0;
        let high = sys::CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH;
        // SAFETY: this attribute is a 64-bit integer written into `v`.
        let r = unsafe {
            sys::cuDeviceGetGraphMemAttribute(device, high, &mut v as *mut u64 as *mut _)
        };
        s.graph_high_bytes = (r == sys::cudaError_enum::CUDA_SUCCESS).then_some(v);
    }

    pub fn reset_high(c: &CudaDevice) {
        let device = c.cuda_stream().context().cu_device();
        let mut zero: u64 = 0;
        let high = sys::CUgraphMem_attribute::CU_GRAPH_MEM_ATTR_USED_MEM_HIGH;
        // SAFETY: resetting the graphs' high-water mark takes a 64-bit zero.
        unsafe {
            sys::cuDeviceSetGraphMemAttribute(device, high, &mut zero as *mut u64 as *mut _);
        }
        if let Some(p) = pool(c) {
            let mut zero: u64 = 0;
            // SAFETY: resetting the high-water mark takes a 64-bit zero.
            unsafe {
                sys::cuMemPoolSetAttribute(
                    p,
                    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                    &mut zero as *mut u64 as *mut _,
                )
            };
        }
    }
}

/// Memory growth fitted over a run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeakCheck {
    /// Least-squares slope of tracked bytes against the call index.
    pub slope_bytes_per_call: f64,
    /// The slope times the calls spanned: the growth the fit attributes to the run.
    pub fitted_growth_bytes: f64,
    pub tolerance_bytes: f64,
    pub leaking: bool,
}

/// Flags a leak when the fitted growth over the sampled calls exceeds `tolerance_bytes`.
/// `None` with fewer than three samples (no fit worth the name).
pub fn leak_check(samples: &[MemorySample], tolerance_bytes: f64) -> Option<LeakCheck> {
    let pts: Vec<(f64, f64)> = samples
        .iter()
        .filter_map(|s| s.tracked_bytes().map(|b| (s.call as f64, b as f64)))
        .collect();
    if pts.len() < 3 {
        return None;
    }
    let (x, y): (Vec<f64>, Vec<f64>) = pts.into_iter().unzip();
    let (slope, _) = linear_fit(&x, &y)?;
    let span = x[x.len() - 1] - x[0];
    let growth = slope * span;
    Some(LeakCheck {
        slope_bytes_per_call: slope,
        fitted_growth_bytes: growth,
        tolerance_bytes,
        leaking: growth > tolerance_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(bytes: impl Fn(usize) -> u64) -> Vec<MemorySample> {
        (0..50)
            .map(|k| MemorySample {
                call: 10 * k,
                rss_bytes: Some(bytes(10 * k)),
                ..Default::default()
            })
            .collect()
    }

    #[test]
    fn flags_growth_and_passes_flat_noisy_memory() {
        const MIB: f64 = 1024.0 * 1024.0;
        // 4 KiB more every call: ~2 MiB over 490 calls.
        let leak = leak_check(&samples(|c| 100_000_000 + 4096 * c as u64), MIB).unwrap();
        assert!(leak.leaking, "{leak:?}");
        assert!((leak.slope_bytes_per_call - 4096.0).abs() < 1e-6);
        // Flat with ±64 KiB of allocator noise.
        let flat = samples(|c| 100_000_000 + if c % 20 == 0 { 65_536 } else { 0 });
        let ok = leak_check(&flat, MIB).unwrap();
        assert!(!ok.leaking, "{ok:?}");
        assert!(leak_check(&flat[..2], MIB).is_none());
    }

    #[test]
    fn rss_is_readable_here() {
        let s = sample(&Device::Cpu, 3);
        assert_eq!(s.call, 3);
        assert!(s.rss_bytes.unwrap() > 1_000_000);
        assert_eq!(s.tracked_bytes(), s.rss_bytes);
    }
}
