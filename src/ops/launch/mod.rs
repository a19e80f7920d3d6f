//! One launcher for the fused kernels: a [`Kernel`] names its CUDA function and its CPU twin,
//! and [`launch`] runs whichever the tensors' device needs, into a fresh output tensor.
//!
//! CUDA functions follow one signature convention: the float inputs, the u32 index inputs, the
//! output pointer, then the `sizes` (size_t) and the `reals` (double), each in the order the
//! kernel lists them; `{NAME}_f32` and `{NAME}_f64` are the two instantiations. A launch is a
//! grid-stride loop over `work` items in blocks of [`BLOCK`] threads unless the kernel chooses
//! its own shape (`Kernel::launch_config`, as the dense kernels do).
//!
//! The outputs carry no autograd history: these kernels serve the explicit adjoint of
//! `model::fused`, which does its own backward pass.

mod checks;
mod cooperative;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod overlap;

use candle_core::{
    bail, CpuStorage, CustomOp1, DType, InplaceOp1, Layout, Result, Shape, Storage, Tensor,
};
pub use checks::{check_edges, check_elements};
#[cfg(feature = "cuda")]
pub(crate) use cooperative::cooperative_grid;
pub(crate) use cooperative::{barrier_counters, device_limits};
#[cfg(feature = "cuda")]
pub(crate) use cuda::{cached_function, cuda_view, kernel_function, launch_with_sizes};

/// Threads per block of every fused kernel (a multiple of the warp size, which the per-edge
/// warp reductions rely on).
pub const BLOCK: u32 = 256;

/// Float element types the kernels are instantiated for.
pub trait Real:
    num_traits::Float + std::ops::AddAssign + std::ops::SubAssign + candle_core::WithDType + Send + Sync
{
    fn of(x: f64) -> Self;
}

impl Real for f32 {
    fn of(x: f64) -> Self {
        x as f32
    }
}

impl Real for f64 {
    fn of(x: f64) -> Self {
        x
    }
}

/// A kernel of kernels/ with its CPU twin.
pub trait Kernel: Send + Sync {
    /// Function stem in the PTX module (`{NAME}_f32`, `{NAME}_f64`).
    const NAME: &'static str;
    /// The stem of this launch's function where the kernel is compiled in variants
    /// (`{NAME}_{variant}`, e.g. per feature count), else [`NAME`](Self::NAME).
    fn function(&self) -> &'static str {
        Self::NAME
    }
    /// The PTX module, i.e. the .cu file's stem.
    const MODULE: &'static str;
    /// Its compiled image ([`kernel_image!`]).
    #[cfg(feature = "cuda")]
    const IMAGE: &'static [u8];
    /// Number of work items (of the default grid-stride loop; none skips the launch).
    fn work(&self) -> usize;
    /// size_t arguments after the output pointer.
    fn sizes(&self) -> Vec<usize>;
    /// double arguments after the sizes.
    fn reals(&self) -> Vec<f64> {
        Vec::new()
    }
    /// The CPU twin: same inputs, writing (or adding into) `out`, which starts as [`Init`] says.
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]);
    /// Launch shape on CUDA for elements of `elem_bytes`; by default a grid-stride loop over
    /// [`work`](Self::work) items without shared memory.
    #[cfg(feature = "cuda")]
    fn launch_config(
        &self,
        _elem_bytes: usize,
    ) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        grid_stride(self.work())
    }
    /// Whether the launch must be cooperative (all blocks resident at once, as a kernel that
    /// waits on barriers among its blocks needs).
    #[cfg(feature = "cuda")]
    fn cooperative(&self) -> bool {
        false
    }
    /// Whether the kernel may start before the previous kernel on its stream has finished
    /// ([`overlap`]): it then calls `wait_for_previous_kernel` (kernels/include/common.cuh)
    /// before it reads anything another kernel wrote and before it writes anything.
    #[cfg(feature = "cuda")]
    fn overlaps_previous(&self) -> bool {
        false
    }
}

/// The compiled image of kernels/`$module`.cu (build.rs): machine code for the GPU the build
/// targets (CUDA_COMPUTE_CAP) and PTX, which the driver compiles for any other. Loading the
/// machine code spares the first launch on a machine the driver's compilation of the PTX (the
/// one kernel's took minutes: docs/bench-log/19-md-single-launch.md). The small gather, scatter
/// and message modules are still loaded as PTX through candle (ops::rows, ops::message).
#[cfg(feature = "cuda")]
macro_rules! kernel_image {
    ($module:literal) => {
        include_bytes!(concat!(env!("OUT_DIR"), "/", $module, ".fatbin"))
    };
}
#[cfg(feature = "cuda")]
pub(crate) use kernel_image;

/// The `NAME`, `MODULE` and `IMAGE` items of a [`Kernel`] impl for function stem `$name` of
/// kernels/`$module`.cu.
macro_rules! kernel_source {
    ($name:literal, $module:literal) => {
        const NAME: &'static str = $name;
        const MODULE: &'static str = $module;
        #[cfg(feature = "cuda")]
        const IMAGE: &'static [u8] = $crate::ops::launch::kernel_image!($module);
    };
}
pub(crate) use kernel_source;

/// [`Kernel::overlaps_previous`] answering yes, for kernels that call
/// `wait_for_previous_kernel` before touching what other kernels write.
macro_rules! overlaps_previous {
    () => {
        #[cfg(feature = "cuda")]
        fn overlaps_previous(&self) -> bool {
            true
        }
    };
}
pub(crate) use overlaps_previous;

/// What the output holds before the kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// Nothing: the kernel writes every element.
    Uninit,
    /// Zeros: the kernel accumulates.
    Zero,
    /// A copy of float input `k` (same length): the kernel adds to it.
    Copy(usize),
    /// Zeros in the first `len` elements (accumulated), nothing after (written).
    ZeroPrefix(usize),
}

/// Runs `kernel` on `inputs` (f32 or f64, contiguous, one dtype) and the u32 `index` tensors,
/// into a new tensor of `shape`.
pub fn launch<K: Kernel>(
    kernel: K,
    inputs: &[&Tensor],
    index: &[&Tensor],
    shape: impl Into<Shape>,
    init: Init,
) -> Result<Tensor> {
    let op = checked_launch(kernel, inputs, index, shape.into(), init)?;
    op.inputs[0].apply_op1_no_bwd(&op)
}

/// Runs `kernel` on `inputs` and `index` (as [`launch`]) with `target`'s own elements as its
/// output, which it reads and updates in place (its CPU twin gets them as `out`): for an
/// adjoint that changes a few parts of a large packed gradient, instead of copying the rest
/// into a new tensor. `target` must be contiguous, of the inputs' dtype and device, and hold
/// nothing that another tensor still needs unchanged.
pub fn launch_in_place<K: Kernel>(
    kernel: K,
    target: &Tensor,
    inputs: &[&Tensor],
    index: &[&Tensor],
) -> Result<()> {
    let op = checked_launch(kernel, inputs, index, target.shape().clone(), Init::Uninit)?;
    if target.dtype() != op.dtype || !target.device().same_device(op.inputs[0].device()) {
        bail!(
            "{}: the target is {:?} on {:?}, expected {:?} on {:?}",
            K::NAME,
            target.dtype(),
            target.device().location(),
            op.dtype,
            op.inputs[0].device().location()
        )
    }
    // (A target that is not contiguous is refused by InPlace, which needs its offsets.)
    // The launch reads the inputs while it holds the target's storage for writing.
    if let Some(k) = inputs.iter().position(|t| shares_storage(t, target)) {
        bail!("{}: float input {k} shares the target's storage", K::NAME)
    }
    target.inplace_op1(&InPlace(op))
}

/// Whether two tensors are views of one storage (its lock taken for one at a time: a second
/// read of a lock this thread holds can wait forever behind another thread's write).
fn shares_storage(a: &Tensor, b: &Tensor) -> bool {
    let of_a: *const Storage = &*a.storage_and_layout().0;
    std::ptr::eq(of_a, &*b.storage_and_layout().0)
}

/// The launch of `kernel` as a candle op, its inputs checked.
fn checked_launch<K: Kernel>(
    kernel: K,
    inputs: &[&Tensor],
    index: &[&Tensor],
    shape: Shape,
    init: Init,
) -> Result<Launch<K>> {
    let Some(first) = inputs.first() else {
        bail!("{}: a kernel needs at least one float input", K::NAME)
    };
    let dtype = first.dtype();
    if !matches!(dtype, DType::F32 | DType::F64) {
        bail!("{}: dtype {dtype:?} is not supported (f32, f64)", K::NAME)
    }
    for (k, t) in inputs.iter().enumerate() {
        if t.dtype() != dtype || !t.device().same_device(first.device()) {
            bail!(
                "{}: float input {k} is {:?} on {:?}, expected {dtype:?} on {:?}",
                K::NAME,
                t.dtype(),
                t.device().location(),
                first.device().location()
            )
        }
    }
    for (k, t) in index.iter().enumerate() {
        if t.dtype() != DType::U32 || t.rank() != 1 {
            bail!(
                "{}: index input {k} must be 1-D u32, got {:?} {:?}",
                K::NAME,
                t.dtype(),
                t.dims()
            )
        }
    }
    match init {
        Init::Copy(k) if inputs.get(k).map(|t| t.elem_count()) != Some(shape.elem_count()) => {
            bail!("{}: cannot start the output from input {k}", K::NAME)
        }
        Init::ZeroPrefix(n) if n > shape.elem_count() => {
            bail!("{}: zeroed prefix {n} is longer than the output", K::NAME)
        }
        _ => {}
    }
    Ok(Launch {
        kernel,
        inputs: inputs
            .iter()
            .map(|t| t.contiguous())
            .collect::<Result<_>>()?,
        index: index
            .iter()
            .map(|t| t.contiguous())
            .collect::<Result<_>>()?,
        shape,
        init,
        dtype,
    })
}

struct Launch<K> {
    kernel: K,
    inputs: Vec<Tensor>,
    index: Vec<Tensor>,
    shape: Shape,
    init: Init,
    dtype: DType,
}

/// The element range of a contiguous tensor's storage.
fn range(t: &Tensor, what: &str) -> Result<(usize, usize)> {
    match t.layout().contiguous_offsets() {
        Some(r) => Ok(r),
        None => bail!("{what} must be contiguous"),
    }
}

impl<K: Kernel> Launch<K> {
    fn run_cpu<T: Real>(&self) -> Result<Vec<T>> {
        self.with_cpu_inputs(|x, idx| {
            let mut out = match self.init {
                Init::Copy(k) => x[k].to_vec(),
                Init::Zero | Init::Uninit | Init::ZeroPrefix(_) => {
                    vec![T::zero(); self.shape.elem_count()]
                }
            };
            self.kernel.cpu(x, idx, &mut out);
            out
        })
    }

    /// The kernel on the CPU, adding into (or overwriting) `out` in place.
    fn run_cpu_into<T: Real>(&self, out: &mut [T]) -> Result<()> {
        self.with_cpu_inputs(|x, idx| self.kernel.cpu(x, idx, out))
    }

    /// `f` of the inputs' and indices' elements on the CPU.
    fn with_cpu_inputs<T: Real, R>(&self, f: impl FnOnce(&[&[T]], &[&[u32]]) -> R) -> Result<R> {
        let guards: Vec<_> = self.inputs.iter().map(|t| t.storage_and_layout()).collect();
        let mut x = Vec::with_capacity(guards.len());
        for (t, (g, _)) in self.inputs.iter().zip(&guards) {
            let (a, b) = range(t, K::NAME)?;
            match &**g {
                Storage::Cpu(s) => x.push(&s.as_slice::<T>()?[a..b]),
                _ => bail!("{}: inputs must all be on the CPU", K::NAME),
            }
        }
        let iguards: Vec<_> = self.index.iter().map(|t| t.storage_and_layout()).collect();
        let mut idx = Vec::with_capacity(iguards.len());
        for (t, (g, _)) in self.index.iter().zip(&iguards) {
            let (a, b) = range(t, K::NAME)?;
            match &**g {
                Storage::Cpu(s) => idx.push(&s.as_slice::<u32>()?[a..b]),
                _ => bail!("{}: indices must be on the CPU", K::NAME),
            }
        }
        Ok(f(&x, &idx))
    }

    #[cfg(feature = "cuda")]
    fn run_cuda<T>(
        &self,
        dev: &candle_core::CudaDevice,
    ) -> Result<candle_core::cuda_backend::cudarc::driver::CudaSlice<T>>
    where
        T: candle_core::cuda_backend::CudaDType
            + candle_core::WithDType
            + candle_core::cuda_backend::cudarc::driver::DeviceRepr
            + candle_core::cuda_backend::cudarc::driver::ValidAsZeroBits,
    {
        let len = self.shape.elem_count();
        let mut out = match self.init {
            Init::Zero => dev.alloc_zeros::<T>(len)?,
            // SAFETY: Uninit kernels write every element; Copy and ZeroPrefix fill it right
            // below, up to the part their kernels write.
            Init::Uninit | Init::Copy(_) | Init::ZeroPrefix(_) => unsafe { dev.alloc::<T>(len)? },
        };
        match self.init {
            Init::Copy(k) => {
                let (g, _) = self.inputs[k].storage_and_layout();
                dev.memcpy_dtod(
                    &cuda_view::<T>(&g, &self.inputs[k], K::NAME, "inputs")?,
                    &mut out,
                )?
            }
            Init::ZeroPrefix(n) if n > 0 => {
                let mut head = out.slice_mut(0..n.min(len));
                dev.cuda_stream()
                    .memset_zeros(&mut head)
                    .map_err(|e| candle_core::Error::Cuda(Box::new(e)))?;
            }
            _ => {}
        }
        self.launch_cuda(dev, &mut out.slice_mut(0..len))?;
        Ok(out)
    }

    /// The CUDA kernel with `out` as its output (as it is: any start was made before).
    #[cfg(feature = "cuda")]
    fn launch_cuda<T>(
        &self,
        dev: &candle_core::CudaDevice,
        out: &mut candle_core::cuda_backend::cudarc::driver::CudaViewMut<'_, T>,
    ) -> Result<()>
    where
        T: candle_core::cuda_backend::CudaDType
            + candle_core::WithDType
            + candle_core::cuda_backend::cudarc::driver::DeviceRepr,
    {
        use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
        if self.kernel.work() == 0 || out.is_empty() {
            return Ok(());
        }
        let guards: Vec<_> = self.inputs.iter().map(|t| t.storage_and_layout()).collect();
        let x = (self.inputs.iter().zip(&guards))
            .map(|(t, (g, _))| cuda_view::<T>(g, t, K::NAME, "inputs"))
            .collect::<Result<Vec<_>>>()?;
        let iguards: Vec<_> = self.index.iter().map(|t| t.storage_and_layout()).collect();
        let idx = (self.index.iter().zip(&iguards))
            .map(|(t, (g, _))| cuda_view::<u32>(g, t, K::NAME, "indices"))
            .collect::<Result<Vec<_>>>()?;
        let (func, cfg) = kernel_function(&self.kernel, dev, T::DTYPE)?;
        let stream = dev.cuda_stream();
        let (sizes, reals) = (self.kernel.sizes(), self.kernel.reals());
        if self.kernel.overlaps_previous() && !self.kernel.cooperative() {
            return overlap::launch(&func, cfg, &stream, &x, &idx, out, &sizes, &reals);
        }
        let mut b = stream.launch_builder(&func);
        for v in &x {
            b.arg(v);
        }
        for v in &idx {
            b.arg(v);
        }
        b.arg(out);
        launch_with_sizes(&self.kernel, b, &sizes, &reals, cfg)
    }
}

/// A launch whose output is its target's own elements ([`launch_in_place`]).
struct InPlace<K>(Launch<K>);

impl<K: Kernel> InplaceOp1 for InPlace<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        let Some((a, b)) = l.contiguous_offsets() else {
            bail!("{}: the target must be contiguous", K::NAME)
        };
        match s {
            CpuStorage::F32(out) => self.0.run_cpu_into(&mut out[a..b]),
            CpuStorage::F64(out) => self.0.run_cpu_into(&mut out[a..b]),
            _ => bail!("{}: the target must be f32 or f64", K::NAME),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &mut candle_core::CudaStorage, l: &Layout) -> Result<()> {
        let Some((a, b)) = l.contiguous_offsets() else {
            bail!("{}: the target must be contiguous", K::NAME)
        };
        let dev = s.device.clone();
        match self.0.dtype {
            DType::F32 => {
                let mut out = s.as_cuda_slice_mut::<f32>()?.slice_mut(a..b);
                self.0.launch_cuda(&dev, &mut out)
            }
            _ => {
                let mut out = s.as_cuda_slice_mut::<f64>()?.slice_mut(a..b);
                self.0.launch_cuda(&dev, &mut out)
            }
        }
    }
}

/// Launch shape for a grid-stride loop over `work` items.
#[cfg(feature = "cuda")]
pub fn grid_stride(work: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
    let blocks = work.div_ceil(BLOCK as usize).clamp(1, 65535 * 8) as u32;
    candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl<K: Kernel> CustomOp1 for Launch<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }

    fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
        let out = match self.dtype {
            DType::F32 => CpuStorage::F32(self.run_cpu::<f32>()?),
            _ => CpuStorage::F64(self.run_cpu::<f64>()?),
        };
        Ok((out, self.shape.clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::CudaStorage;
        let dev = s.device.clone();
        let out = match self.dtype {
            DType::F32 => CudaStorage::wrap_cuda_slice(self.run_cuda::<f32>(&dev)?, dev),
            _ => CudaStorage::wrap_cuda_slice(self.run_cuda::<f64>(&dev)?, dev),
        };
        Ok((out, self.shape.clone()))
    }
}
