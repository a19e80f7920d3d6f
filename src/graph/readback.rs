//! A few f64s read back from the device without draining its queue: the copy to page-locked
//! host memory is queued behind the work that makes them, and the host waits for that copy
//! alone. A host that reads each replay's result this way can queue the next replay first, so
//! that the device does not idle while the host reads (`md::step_graph` queues MD steps so).

use crate::error::{Error, Result};
use candle_core::{DType, Device, Tensor};

/// Page-locked room for `len` f64s of one device, and the copy queued into it, if any.
pub(crate) struct Readback {
    len: usize,
    /// The room, and an event recorded after each copy into it (waited for by spinning: the
    /// room's own event puts the waiting thread to sleep, which wakes it late).
    #[cfg(feature = "cuda")]
    host: Option<(
        candle_core::cuda_backend::cudarc::driver::PinnedHostSlice<f64>,
        candle_core::cuda_backend::cudarc::driver::CudaEvent,
    )>,
    /// A CPU tensor (or, without page-locked room, a device one) to read at [`wait`].
    ///
    /// [`wait`]: Readback::wait
    queued: Option<Tensor>,
    /// Whether a copy into `host` is queued and not yet waited for.
    #[cfg(feature = "cuda")]
    pending: bool,
}

impl Readback {
    /// Room for `len` values on `dev` (page-locked on CUDA).
    pub(crate) fn new(dev: &Device, len: usize) -> Result<Self> {
        #[cfg(feature = "cuda")]
        let host = match dev {
            Device::Cuda(cuda) => {
                use candle_core::cuda_backend::cudarc::driver::sys::CUevent_flags;
                let driver = |e| Error::Device(format!("read back: {e}"));
                let ctx = cuda.cuda_stream().context().clone();
                // SAFETY: the room is only read after a copy into it has landed (`wait`).
                let room = unsafe { ctx.alloc_pinned_with_flags::<f64>(len, 0) };
                let event = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
                Some((room.map_err(driver)?, event.map_err(driver)?))
            }
            _ => None,
        };
        #[cfg(not(feature = "cuda"))]
        let _ = dev;
        Ok(Self {
            len,
            #[cfg(feature = "cuda")]
            host,
            queued: None,
            #[cfg(feature = "cuda")]
            pending: false,
        })
    }

    /// Queues the copy of `values` ([len] f64, on the device given to [`new`](Self::new)).
    pub(crate) fn start(&mut self, values: &Tensor) -> Result<()> {
        if values.dims() != [self.len] || values.dtype() != DType::F64 {
            return Err(Error::Device(format!(
                "read back {:?} {:?}, room for [{}] f64",
                values.dims(),
                values.dtype(),
                self.len
            )));
        }
        #[cfg(feature = "cuda")]
        if let (Some((host, landed)), candle_core::Device::Cuda(cuda)) =
            (&mut self.host, values.device())
        {
            use candle_core::Storage;
            let values = values.contiguous()?;
            let (storage, layout) = values.storage_and_layout();
            let Storage::Cuda(s) = &*storage else {
                return Err(Error::Device(
                    "read back: values not on the CUDA device".into(),
                ));
            };
            let start = layout.start_offset();
            let src = s.as_cuda_slice::<f64>()?.slice(start..start + self.len);
            let driver = |e| Error::Device(format!("read back: {e}"));
            let stream = cuda.cuda_stream();
            stream.memcpy_dtoh(&src, host).map_err(driver)?;
            landed.record(&stream).map_err(driver)?;
            self.pending = true;
            return Ok(());
        }
        self.queued = Some(values.clone());
        Ok(())
    }

    /// The values of the last [`start`](Self::start), once their copy has landed.
    pub(crate) fn wait(&mut self) -> Result<Vec<f64>> {
        #[cfg(feature = "cuda")]
        if let (Some((host, landed)), true) = (&self.host, self.pending) {
            self.pending = false;
            let driver = |e| Error::Device(format!("read back: {e}"));
            landed.synchronize().map_err(driver)?;
            return Ok(host.as_slice().map_err(driver)?.to_vec());
        }
        match self.queued.take() {
            Some(t) => Ok(t.to_vec1::<f64>()?),
            None => Err(Error::Device("read back: nothing was queued".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_come_back_once_per_start() {
        let dev = Device::Cpu;
        let mut r = Readback::new(&dev, 2).unwrap();
        assert!(r.wait().is_err(), "nothing queued yet");
        r.start(&Tensor::new(&[1.5f64, -2.0], &dev).unwrap())
            .unwrap();
        assert_eq!(r.wait().unwrap(), [1.5, -2.0]);
        assert!(r.wait().is_err(), "read twice");
        let wrong = Tensor::new(&[1.0f32, 2.0], &dev).unwrap();
        assert!(r.start(&wrong).is_err());
    }
}
