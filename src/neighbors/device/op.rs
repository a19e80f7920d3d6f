//! The candle op that runs one step: the CPU twin on the host, the CUDA kernels on a GPU.

use super::cpu;
#[cfg(feature = "cuda")]
use super::cuda;
use super::step::{Step, StepOp};
use candle_core::DType;

impl StepOp {
    /// The bins, their scan and the placed atoms of a binned count or fill (inputs 2-4).
    fn placed(&self) -> candle_core::Result<cpu::Placed> {
        let u32s = |k: usize| self.inputs[k].flatten_all()?.to_vec1::<u32>();
        Ok(cpu::Placed {
            bin: u32s(2)?,
            scan: u32s(3)?,
            atoms: u32s(4)?,
        })
    }
}

impl candle_core::CustomOp1 for StepOp {
    fn name(&self) -> &'static str {
        self.step.kernel()
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        use candle_core::CpuStorage;
        let f64s = |k: usize| self.inputs[k].flatten_all()?.to_vec1::<f64>();
        let u32s = |k: usize| self.inputs[k].flatten_all()?.to_vec1::<u32>();
        let spans = match &self.spans {
            Some(t) => Some(t.flatten_all()?.to_vec1::<u32>()?),
            None => None,
        };
        let twin = cpu::Twin {
            g: &self.host_geometry,
            n: self.atoms,
            periodic: self.periodic,
            cut2: self.cut2,
            spans: spans.as_deref(),
        };
        let out = match self.step {
            Step::Wrap => CpuStorage::F64(twin.wrap(&f64s(0)?)),
            Step::Count => CpuStorage::U32(twin.count(&f64s(0)?)),
            Step::Scan { capacity } => CpuStorage::U32(cpu::scan(&u32s(0)?, capacity)),
            Step::Fill { capacity } => CpuStorage::U32(twin.fill(&f64s(0)?, &u32s(1)?, capacity)),
            Step::BinOf => CpuStorage::U32(twin.bin_of(&f64s(0)?, &f64s(1)?)),
            Step::BinCount { bins } => CpuStorage::U32(cpu::bin_count(&u32s(0)?, bins)),
            Step::BinPlace { bins } => CpuStorage::U32(cpu::bin_place(&u32s(0)?, &u32s(1)?, bins)),
            Step::CountBinned => {
                let placed = self.placed()?;
                CpuStorage::U32(twin.count_binned(&f64s(0)?, &f64s(1)?, &placed))
            }
            Step::FillBinned { capacity } => {
                let (x, grid, placed) = (f64s(0)?, f64s(1)?, self.placed()?);
                CpuStorage::U32(twin.fill_binned(&x, &grid, &placed, &u32s(5)?, capacity))
            }
            Step::PruneCount { .. } => {
                let off = self.inputs[3].flatten_all()?.to_dtype(DType::F64)?;
                let kept = twin.kept(&f64s(0)?, &u32s(1)?, &u32s(2)?, &off.to_vec1()?);
                CpuStorage::U32(kept.iter().map(|k| k.len() as u32).collect())
            }
            Step::PruneFill { edges, .. } => {
                let off = self.inputs[3].flatten_all()?.to_dtype(DType::F64)?;
                let kept = twin.kept(&f64s(0)?, &u32s(1)?, &u32s(2)?, &off.to_vec1()?);
                CpuStorage::U32(cpu::prune_fill(&kept, &u32s(2)?, &u32s(4)?, edges))
            }
            Step::Offsets { capacity } => {
                let o = twin.offsets(&f64s(0)?, &u32s(1)?, &u32s(2)?, capacity, self.pad);
                match self.dtype {
                    DType::F32 => CpuStorage::F32(o.iter().map(|&v| v as f32).collect()),
                    _ => CpuStorage::F64(o),
                }
            }
        };
        Ok((out, self.shape.clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        _: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> {
        cuda::launch(self, &s.device)
    }
}
