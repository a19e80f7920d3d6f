//! Sums over the ranks of a data-parallel training step (`replicas`): NCCL between GPUs
//! (the `nccl` feature), host memory between CPU ranks (the CPU twin the data-parallel tests
//! run in CI, where there is no GPU).
//!
//! A sum is in place (an `InplaceOp1`), so on CUDA it is one NCCL launch on the device's
//! stream, which a captured training step (`step_graph`) records like any kernel. Every rank
//! must call the same sums in the same order, as NCCL requires.

use crate::error::{Error, Result};
use candle_core::{CpuStorage, InplaceOp1, Layout, Tensor};
use std::sync::{Arc, Barrier, Mutex};

/// One rank's end of the sums.
pub(crate) enum Collective {
    /// CPU ranks (threads of one process) meeting in host memory.
    Host(HostSum),
    #[cfg(feature = "nccl")]
    Nccl(nccl::NcclSum),
}

impl Collective {
    /// Replaces `t` (contiguous, f32 or f64) by its sum over the ranks, in place.
    pub(crate) fn sum_in_place(&self, t: &Tensor) -> Result<()> {
        if !t.is_contiguous() {
            return Err(Error::Train(
                "a sum over ranks needs a contiguous tensor".into(),
            ));
        }
        match self {
            Self::Host(h) => Ok(t.inplace_op1(h)?),
            #[cfg(feature = "nccl")]
            Self::Nccl(n) => Ok(t.inplace_op1(n)?),
        }
    }
}

struct HostShared {
    slots: Mutex<Vec<Vec<f64>>>,
    barrier: Barrier,
}

/// A CPU rank's end: each rank puts its values in its slot, and after a barrier every rank
/// adds the slots up in rank order (the same sum, bit for bit, on every rank).
pub(crate) struct HostSum {
    shared: Arc<HostShared>,
    rank: usize,
}

impl HostSum {
    /// `ranks` connected host ends, rank k at index k.
    pub(crate) fn ends(ranks: usize) -> Vec<Self> {
        let shared = Arc::new(HostShared {
            slots: Mutex::new(vec![Vec::new(); ranks]),
            barrier: Barrier::new(ranks),
        });
        (0..ranks)
            .map(|rank| Self {
                shared: shared.clone(),
                rank,
            })
            .collect()
    }

    fn sum(&self, values: &mut [f64]) -> candle_core::Result<()> {
        let lock = || {
            self.shared
                .slots
                .lock()
                .map_err(|_| candle_core::Error::Msg("a rank panicked during a sum".into()))
        };
        lock()?[self.rank] = values.to_vec();
        self.shared.barrier.wait();
        {
            let slots = lock()?;
            if slots.iter().any(|s| s.len() != values.len()) {
                return Err(candle_core::Error::Msg(
                    "ranks summed tensors of different sizes".into(),
                ));
            }
            for (i, v) in values.iter_mut().enumerate() {
                *v = slots.iter().map(|s| s[i]).sum();
            }
        }
        // Nobody writes its slot for the next sum before all have read this one.
        self.shared.barrier.wait();
        Ok(())
    }
}

impl InplaceOp1 for HostSum {
    fn name(&self) -> &'static str {
        "host-sum"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let range = layout.start_offset()..layout.start_offset() + layout.shape().elem_count();
        match storage {
            CpuStorage::F64(v) => self.sum(&mut v[range]),
            CpuStorage::F32(v) => {
                let mut wide: Vec<f64> = v[range.clone()].iter().map(|&x| x as f64).collect();
                self.sum(&mut wide)?;
                for (x, w) in v[range].iter_mut().zip(wide) {
                    *x = w as f32;
                }
                Ok(())
            }
            _ => Err(candle_core::Error::Msg(
                "a sum over ranks takes f32 or f64".into(),
            )),
        }
    }
}

#[cfg(feature = "nccl")]
pub(crate) mod nccl {
    //! NCCL ends: one communicator per GPU, all made together on the calling thread
    //! (`ncclCommInitAll`) and connected there by one grouped sum, before any rank's thread
    //! starts work: a rank that joins its first sum while another still sets up would
    //! otherwise wait on it with the GPU busy.

    use super::Collective;
    use crate::error::{Error, Result};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::nccl::{group_end, group_start, Comm, ReduceOp};
    use candle_core::{CpuStorage, CudaStorage, Device, InplaceOp1, Layout};

    /// A communicator on its way to its rank's thread.
    pub(crate) struct NcclEnd(Comm);

    // SAFETY: an NCCL communicator may be used from any thread, one at a time; each end is
    // moved to one rank's thread and used there only.
    unsafe impl Send for NcclEnd {}

    impl NcclEnd {
        pub(crate) fn into_collective(self) -> Collective {
            Collective::Nccl(NcclSum { comm: self.0 })
        }
    }

    /// One end per device of `devs` (rank k on `devs[k]`), connected.
    pub(crate) fn connect_all(devs: &[Device]) -> Result<Vec<NcclEnd>> {
        let failed = |what: &str, e: &dyn std::fmt::Debug| {
            Error::Device(format!("NCCL over {} GPUs: {what}: {e:?}", devs.len()))
        };
        let streams = devs
            .iter()
            .map(|d| match d {
                Device::Cuda(c) => Ok(c.cuda_stream()),
                _ => Err(Error::Device("NCCL ranks need CUDA devices".into())),
            })
            .collect::<Result<Vec<_>>>()?;
        let comms = Comm::from_devices(streams.clone()).map_err(|e| failed("init", &e))?;
        // The first sum sets up the connections between the GPUs: all ranks in one group.
        let mut ones = streams
            .iter()
            .map(|s| s.alloc_zeros::<f32>(1))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| failed("alloc", &e))?;
        group_start().map_err(|e| failed("group", &e))?;
        for (comm, buf) in comms.iter().zip(ones.iter_mut()) {
            comm.all_reduce_in_place(buf, &ReduceOp::Sum)
                .map_err(|e| failed("first sum", &e))?;
        }
        group_end().map_err(|e| failed("group", &e))?;
        for s in &streams {
            s.synchronize().map_err(|e| failed("first sum", &e))?;
        }
        Ok(comms.into_iter().map(NcclEnd).collect())
    }

    pub(crate) struct NcclSum {
        comm: Comm,
    }

    impl NcclSum {
        /// Waits for the sum where the stream runs op by op (a captured step has no host
        /// copies between its sums). The driver passes copies from pageable host memory
        /// through staging buffers it shares between threads: a rank's copy queued behind a
        /// sum that waits for another rank could hold them while that rank waits to copy
        /// before joining the sum, and the two would wait for each other.
        fn settle(&self) -> candle_core::Result<()> {
            use candle_core::cuda_backend::cudarc::driver::sys::CUstreamCaptureStatus;
            let stream = self.comm.stream();
            let status = stream.capture_status().map_err(candle_core::Error::wrap)?;
            if status == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                stream.synchronize().map_err(candle_core::Error::wrap)?;
            }
            Ok(())
        }
    }

    impl InplaceOp1 for NcclSum {
        fn name(&self) -> &'static str {
            "nccl-sum"
        }

        fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
            candle_core::bail!("NCCL sums take CUDA tensors")
        }

        fn cuda_fwd(&self, storage: &mut CudaStorage, layout: &Layout) -> candle_core::Result<()> {
            let range = layout.start_offset()..layout.start_offset() + layout.shape().elem_count();
            let failed = |e| candle_core::Error::Msg(format!("NCCL all-reduce: {e:?}"));
            match storage.dtype() {
                candle_core::DType::F64 => {
                    let mut view = storage.as_cuda_slice_mut::<f64>()?.slice_mut(range);
                    self.comm
                        .all_reduce_in_place(&mut view, &ReduceOp::Sum)
                        .map_err(failed)?;
                }
                candle_core::DType::F32 => {
                    let mut view = storage.as_cuda_slice_mut::<f32>()?.slice_mut(range);
                    self.comm
                        .all_reduce_in_place(&mut view, &ReduceOp::Sum)
                        .map_err(failed)?;
                }
                other => candle_core::bail!("NCCL sums take f32 or f64, not {other:?}"),
            }
            self.settle()
        }
    }
}
