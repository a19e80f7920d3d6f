//! A whole MD step around the one-kernel force call: the step up to the force call (kick, then
//! drift or Langevin A O A), the model's energies and forces, the closing kick, the total
//! energy and the Verlet displacement check, from and to f64 state. On CUDA it is one launch
//! of kernels/whole/feature_split.cu with its MD slots filled, instead of the force kernel and ~8
//! small kernels around it (casts, energy sum, kicks, drift, check), which at molecule size
//! hold a sizeable share of a step (BENCHMARKS.md, "Tuning defaults": `one_launch_steps`;
//! docs/bench-log/18-one-kernel-floor.md and 19-md-single-launch.md). On the CPU it is the
//! same step op by op ([`md_advance`], the one kernel's CPU twin, [`md_kick`],
//! [`md_displacement2`]): its test oracle. Every product and sum of the integrator is rounded
//! as in those ops, so the state agrees bit for bit where the forces do.

use crate::ops::integrator::{md_advance, md_displacement2, md_kick, LangevinNoise};
use crate::ops::whole::feature_split::{check_inputs, feature_split, FeatureSplitPlan};
use candle_core::{bail, DType, Result, Tensor};

/// One step's f64 inputs: positions, velocities and forces [N, 3], the half kick dt / 2m
/// [N, 1], the Langevin noise (none for NVE) and the positions of the last list build [N, 3].
pub struct MdStepInputs<'a> {
    pub positions: &'a Tensor,
    pub velocities: &'a Tensor,
    pub forces: &'a Tensor,
    pub half_kick: &'a Tensor,
    pub dt: f64,
    pub noise: Option<LangevinNoise<'a>>,
    pub reference: &'a Tensor,
}

/// The state after the step (f64): positions, velocities, forces [N, 3], the potential energy
/// (scalar), and [Σ, max] over atoms of |positions − reference|² (\[2\], as
/// [`md_displacement2`]).
pub struct MdStepOutputs {
    pub positions: Tensor,
    pub velocities: Tensor,
    pub forces: Tensor,
    pub energy: Tensor,
    pub displacement2: Tensor,
}

/// One MD step of the system `plan` describes (`weights`, `offsets` in the model's dtype;
/// u32 `species`, `centers`, `neighbors`, as for [`feature_split`]).
pub fn feature_split_step(
    plan: &FeatureSplitPlan,
    weights: &Tensor,
    offsets: &Tensor,
    [species, centers, neighbors]: [&Tensor; 3],
    md: &MdStepInputs,
) -> Result<MdStepOutputs> {
    let n = species.dim(0)?;
    check(md, n)?;
    check_inputs(
        plan,
        weights,
        md.positions.dims(),
        offsets,
        [species, centers, neighbors],
    )?;
    if !md.positions.device().is_cuda() {
        let (x, v) = md_advance(
            md.positions,
            md.velocities,
            md.forces,
            md.half_kick,
            md.dt,
            md.noise,
        )?;
        let model_x = x.to_dtype(weights.dtype())?;
        let (energies, forces) = feature_split(
            plan, weights, &model_x, offsets, species, centers, neighbors,
        )?;
        let forces = forces.to_dtype(DType::F64)?;
        return Ok(MdStepOutputs {
            velocities: md_kick(&v, &forces, md.half_kick)?,
            displacement2: md_displacement2(&x, md.reference)?,
            energy: energies.to_dtype(DType::F64)?.sum_all()?,
            positions: x,
            forces,
        });
    }
    let out = cuda::launch(plan, weights, offsets, [species, centers, neighbors], md)?;
    let part = |k: usize| out.narrow(0, 3 * n * k, 3 * n)?.reshape((n, 3));
    Ok(MdStepOutputs {
        positions: part(0)?,
        velocities: part(1)?,
        forces: part(2)?,
        energy: out.narrow(0, 9 * n, 1)?.squeeze(0)?,
        displacement2: out.narrow(0, 9 * n + 1, 2)?,
    })
}

/// Checks the f64 state tensors against `n` atoms, naming the first that does not fit.
fn check(md: &MdStepInputs, n: usize) -> Result<()> {
    let mut parts = vec![
        ("positions", md.positions, 3),
        ("velocities", md.velocities, 3),
        ("forces", md.forces, 3),
        ("half_kick", md.half_kick, 1),
        ("reference", md.reference, 3),
    ];
    if let Some(l) = &md.noise {
        parts.extend([("noise", l.xi, 3), ("noise scale", l.scale, 1)]);
    }
    for (name, t, width) in parts {
        if t.dtype() != DType::F64 || t.elem_count() != n * width {
            bail!(
                "feature split step: {name} must be f64 with {} values for {n} atoms, got {:?} {:?}",
                n * width,
                t.dtype(),
                t.dims()
            )
        }
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
mod cuda {
    use super::*;

    pub(crate) fn launch(
        _: &FeatureSplitPlan,
        _: &Tensor,
        _: &Tensor,
        _: [&Tensor; 3],
        _: &MdStepInputs,
    ) -> Result<Tensor> {
        bail!("feature split step: built without the cuda feature")
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use crate::ops::launch::barrier_counters;
    use crate::ops::launch::{cuda_view, kernel_function, launch_with_sizes, Kernel};
    use crate::ops::whole::feature_split::{FeatureSplit, MD_SLOTS};
    use candle_core::cuda_backend::cudarc::driver::{
        CudaSlice, DeviceRepr, PushKernelArg, ValidAsZeroBits,
    };
    use candle_core::cuda_backend::CudaDType;
    use candle_core::{CpuStorage, CudaDevice, CudaStorage, CustomOp1, Layout, Shape};

    /// The launch, as a custom op on the positions whose output is the f64 state
    /// [x' | v' | f' (3N each) | energy | Σ, max of the squared displacement].
    struct StepLaunch {
        kernel: FeatureSplit,
        /// The model's offsets and weights, the f64 inputs (positions to reference, as the
        /// kernel's MD slots), and the u32 species, centers, neighbors and barrier counters.
        model: [Tensor; 2],
        state: [Tensor; MD_SLOTS - 1],
        index: [Tensor; 4],
    }

    pub(crate) fn launch(
        plan: &FeatureSplitPlan,
        weights: &Tensor,
        offsets: &Tensor,
        [species, centers, neighbors]: [&Tensor; 3],
        md: &MdStepInputs,
    ) -> Result<Tensor> {
        let (xi, scale, c1) = match &md.noise {
            Some(l) => (l.xi, l.scale, l.c1),
            // Unread without noise.
            None => (md.positions, md.half_kick, 1.0),
        };
        let c = |t: &Tensor| t.contiguous();
        let op = StepLaunch {
            kernel: FeatureSplit {
                plan: *plan,
                stamps: false,
                step: true,
                langevin: md.noise.is_some(),
                dt: md.dt,
                c1,
            },
            model: [c(offsets)?, c(weights)?],
            state: [
                c(md.positions)?,
                c(md.velocities)?,
                c(md.forces)?,
                c(md.half_kick)?,
                c(xi)?,
                c(scale)?,
                c(md.reference)?,
            ],
            index: [
                c(species)?,
                c(centers)?,
                c(neighbors)?,
                barrier_counters(md.positions.device())?,
            ],
        };
        md.positions.apply_op1_no_bwd(&op)
    }

    impl StepLaunch {
        fn run<T>(&self, dev: &CudaDevice) -> Result<CudaSlice<f64>>
        where
            T: CudaDType + candle_core::WithDType + DeviceRepr + ValidAsZeroBits,
        {
            let plan = &self.kernel.plan;
            let n = self.state[0].dim(0)?;
            let all = self.model.iter().chain(&self.state).chain(&self.index);
            let guards: Vec<_> = all.clone().map(|t| t.storage_and_layout()).collect();
            let mut tensors = all.zip(&guards);
            let mut take = |k: usize| tensors.by_ref().take(k).collect::<Vec<_>>();
            let (model_g, state_g, index_g) = (take(2), take(MD_SLOTS - 1), take(4));
            let model = (model_g.iter())
                .map(|(t, (g, _))| cuda_view::<T>(g, t, "feature split step", "inputs"))
                .collect::<Result<Vec<_>>>()?;
            let state = (state_g.iter())
                .map(|(t, (g, _))| cuda_view::<f64>(g, t, "feature split step", "inputs"))
                .collect::<Result<Vec<_>>>()?;
            let index = (index_g.iter())
                .map(|(t, (g, _))| cuda_view::<u32>(g, t, "feature split step", "indices"))
                .collect::<Result<Vec<_>>>()?;
            // SAFETY: the kernel writes all of the state it returns, and the scratch before
            // reading it (as a plain call does); the scratch is freed in stream order.
            let mut out = unsafe { dev.alloc::<f64>(9 * n + 3)? };
            let mut scratch = unsafe { dev.alloc::<T>(plan.out_len())? };
            let (func, cfg) = kernel_function(&self.kernel, dev, T::DTYPE)?;
            let stream = dev.cuda_stream();
            let (sizes, reals) = (self.kernel.sizes(), self.kernel.reals());
            let mut b = stream.launch_builder(&func);
            // The positions slot of a plain call is unread in a step: the offsets fill it; the
            // MD slots follow the float inputs (kernels/whole/feature_split.cu).
            b.arg(&model[0]);
            for v in &model {
                b.arg(v);
            }
            for v in &state {
                b.arg(v);
            }
            b.arg(&mut out);
            for v in &index {
                b.arg(v);
            }
            b.arg(&mut scratch);
            launch_with_sizes(&self.kernel, b, &sizes, &reals, cfg)?;
            Ok(out)
        }
    }

    impl CustomOp1 for StepLaunch {
        fn name(&self) -> &'static str {
            "small-system-step"
        }

        fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
            bail!("feature split step: the launch is CUDA only (the CPU runs the step op by op)")
        }

        fn cuda_fwd(&self, s: &CudaStorage, _: &Layout) -> Result<(CudaStorage, Shape)> {
            let dev = s.device.clone();
            let n = self.state[0].dim(0)?;
            let out = match self.model[1].dtype() {
                DType::F32 => self.run::<f32>(&dev)?,
                DType::F64 => self.run::<f64>(&dev)?,
                other => bail!("feature split step: model dtype {other:?} (f32, f64)"),
            };
            Ok((
                CudaStorage::wrap_cuda_slice(out, dev),
                Shape::from(9 * n + 3),
            ))
        }
    }
}
