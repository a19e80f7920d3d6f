//! MD integrator steps as single kernels (kernels/integrator.cu): the kick, the step up to the
//! force call (kick + drift, or Langevin A O A) and the Verlet displacement check, each one
//! launch instead of 2-9 and 6 candle ops (at molecule size an eager MD step is mostly
//! launches). f64; the CPU twin does the candle ops' arithmetic in their order, so CPU results
//! are what those ops gave, and CUDA equals the CPU bit for bit (no fused multiply-adds).

use crate::ops::launch::{kernel_source, launch, launch_in_place, Init, Kernel, Real};
use candle_core::{bail, DType, Result, Tensor};

struct Kick {
    n: usize,
}

impl Kernel for Kick {
    kernel_source!("md_kick", "integrator");
    fn work(&self) -> usize {
        3 * self.n
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.n]
    }
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        let (v, f, hk) = (x[0], x[1], x[2]);
        for (t, o) in out.iter_mut().enumerate() {
            *o = v[t] + f[t] * hk[t / 3];
        }
    }
}

struct Advance {
    n: usize,
    langevin: bool,
    dt: f64,
    c1: f64,
}

impl Kernel for Advance {
    kernel_source!("md_advance", "integrator");
    fn work(&self) -> usize {
        3 * self.n
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.n, usize::from(self.langevin)]
    }
    fn reals(&self) -> Vec<f64> {
        vec![self.dt, self.c1]
    }
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        let [pos, v, f, hk, xi, scale] = [x[0], x[1], x[2], x[3], x[4], x[5]];
        let (dt, c1, half) = (T::of(self.dt), T::of(self.c1), T::of(0.5 * self.dt));
        let m = 3 * self.n;
        for t in 0..m {
            let a = t / 3;
            let v1 = v[t] + f[t] * hk[a];
            if self.langevin {
                let x1 = pos[t] + v1 * half;
                let v2 = v1 * c1 + xi[t] * scale[a];
                out[t] = x1 + v2 * half;
                out[m + t] = v2;
            } else {
                out[t] = pos[t] + v1 * dt;
                out[m + t] = v1;
            }
        }
    }
}

struct Finish {
    n: usize,
    s: usize,
}

impl Kernel for Finish {
    kernel_source!("md_finish", "integrator");
    fn work(&self) -> usize {
        9 * self.n + self.s
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.n, self.s]
    }
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        let [pos, v, f, hk, e] = [x[0], x[1], x[2], x[3], x[4]];
        let m = 3 * self.n;
        out[..m].copy_from_slice(pos);
        for t in 0..m {
            out[m + t] = v[t] + f[t] * hk[t / 3];
        }
        out[2 * m..3 * m].copy_from_slice(f);
        out[3 * m..].copy_from_slice(e);
    }
}

struct Displacement2 {
    n: usize,
}

impl Kernel for Displacement2 {
    kernel_source!("md_displacement2", "integrator");
    fn work(&self) -> usize {
        self.n.max(1)
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.n]
    }
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        let (mut sum, mut max) = (T::zero(), T::zero());
        for (p, r) in x[0].chunks_exact(3).zip(x[1].chunks_exact(3)) {
            let d2 = (0..3).fold(T::zero(), |acc, c| acc + (p[c] - r[c]) * (p[c] - r[c]));
            sum += d2;
            if d2 > max || d2.is_nan() {
                max = d2;
            }
        }
        out[0] = sum;
        out[1] = max;
    }
    /// One block: a few thousand atoms at most in the MD this serves per launch.
    #[cfg(feature = "cuda")]
    fn launch_config(
        &self,
        _elem_bytes: usize,
    ) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        candle_core::cuda_backend::cudarc::driver::LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// Checks that every tensor is f64 with `n` × `width` elements.
fn check(op: &str, n: usize, tensors: &[(&str, &Tensor, usize)]) -> Result<()> {
    for (name, t, width) in tensors {
        if t.dtype() != DType::F64 || t.elem_count() != n * width {
            bail!(
                "{op}: {name} must be f64 with {} values, got {:?} {:?}",
                n * width,
                t.dtype(),
                t.dims()
            )
        }
    }
    Ok(())
}

/// The kick v + f · half_kick (per atom, [N, 1] or \[N\]) for v, f [N, 3]: [N, 3].
pub fn md_kick(v: &Tensor, f: &Tensor, half_kick: &Tensor) -> Result<Tensor> {
    let n = v.dim(0)?;
    check(
        "md_kick",
        n,
        &[("v", v, 3), ("f", f, 3), ("half_kick", half_kick, 1)],
    )?;
    launch(Kick { n }, &[v, f, half_kick], &[], (n, 3), Init::Uninit)
}

/// A Langevin step's noise: standard normals [N, 3] and their per-atom scale, and c1.
#[derive(Clone, Copy)]
pub struct LangevinNoise<'a> {
    pub xi: &'a Tensor,
    pub scale: &'a Tensor,
    pub c1: f64,
}

/// The step up to the force call for positions x and velocities v with forces f ([N, 3]):
/// v1 = v + f · half_kick, then x + v1 dt (NVE) or, with `noise`, A O A. Returns (x', v').
pub fn md_advance(
    x: &Tensor,
    v: &Tensor,
    f: &Tensor,
    half_kick: &Tensor,
    dt: f64,
    noise: Option<LangevinNoise>,
) -> Result<(Tensor, Tensor)> {
    let n = x.dim(0)?;
    let (op, inputs) = advance(x, v, f, half_kick, dt, noise.as_ref())?;
    let out = launch(op, &inputs, &[], (2 * n, 3), Init::Uninit)?;
    Ok((out.narrow(0, 0, n)?, out.narrow(0, n, n)?))
}

/// [`md_advance`] into `target` ([2N, 3] or 6N f64, contiguous: x' then v'), in place.
pub fn md_advance_into(
    target: &Tensor,
    x: &Tensor,
    v: &Tensor,
    f: &Tensor,
    half_kick: &Tensor,
    dt: f64,
    noise: Option<LangevinNoise>,
) -> Result<()> {
    let (op, inputs) = advance(x, v, f, half_kick, dt, noise.as_ref())?;
    check("md_advance", op.n, &[("target", target, 6)])?;
    launch_in_place(op, target, &inputs, &[])
}

/// Checks the state of a step (x, v, f [N, 3] and half_kick [N, 1], f64) and returns N.
fn check_step(op: &str, x: &Tensor, v: &Tensor, f: &Tensor, half_kick: &Tensor) -> Result<usize> {
    let n = x.dim(0)?;
    let parts = [
        ("x", x, 3),
        ("v", v, 3),
        ("f", f, 3),
        ("half_kick", half_kick, 1),
    ];
    check(op, n, &parts)?;
    Ok(n)
}

/// The checked launch of [`md_advance`] and its inputs.
fn advance<'a>(
    x: &'a Tensor,
    v: &'a Tensor,
    f: &'a Tensor,
    half_kick: &'a Tensor,
    dt: f64,
    noise: Option<&LangevinNoise<'a>>,
) -> Result<(Advance, [&'a Tensor; 6])> {
    let n = check_step("md_advance", x, v, f, half_kick)?;
    let (xi, scale, c1) = match noise {
        Some(l) => {
            check(
                "md_advance",
                n,
                &[("noise", l.xi, 3), ("scale", l.scale, 1)],
            )?;
            (l.xi, l.scale, l.c1)
        }
        // Unread without noise; any f64 tensors of the right length do.
        None => (x, half_kick, 1.0),
    };
    let op = Advance {
        n,
        langevin: noise.is_some(),
        dt,
        c1,
    };
    Ok((op, [x, v, f, half_kick, xi, scale]))
}

/// The step after the force call into one packed state `target` (9N + S f64, contiguous):
/// positions x, the kick v + f · half_kick, forces f ([N, 3] each) and the energies e \[S\].
pub fn md_finish_into(
    target: &Tensor,
    x: &Tensor,
    v: &Tensor,
    f: &Tensor,
    half_kick: &Tensor,
    e: &Tensor,
) -> Result<()> {
    let (n, s) = (check_step("md_finish", x, v, f, half_kick)?, e.elem_count());
    check(
        "md_finish",
        1,
        &[("e", e, s), ("target", target, 9 * n + s)],
    )?;
    launch_in_place(Finish { n, s }, target, &[x, v, f, half_kick, e], &[])
}

/// [`md_displacement2`] into `target` (\[2\] f64), in place.
pub fn md_displacement2_into(target: &Tensor, x: &Tensor, reference: &Tensor) -> Result<()> {
    let n = x.dim(0)?;
    check(
        "md_displacement2",
        n,
        &[("x", x, 3), ("reference", reference, 3)],
    )?;
    check("md_displacement2", 1, &[("target", target, 2)])?;
    launch_in_place(Displacement2 { n }, target, &[x, reference], &[])
}

/// [Σ, max] over atoms of |x − reference|² ([N, 3] each), a \[2\] tensor: the Verlet check in
/// one launch (the sum carries a NaN that the max may skip).
pub fn md_displacement2(x: &Tensor, reference: &Tensor) -> Result<Tensor> {
    let n = x.dim(0)?;
    check(
        "md_displacement2",
        n,
        &[("x", x, 3), ("reference", reference, 3)],
    )?;
    launch(Displacement2 { n }, &[x, reference], &[], 2, Init::Uninit)
}
