//! The fused PaiNN message: gather the neighbour's context φ(s_j) and vector features v_j,
//! multiply by the edge filter and direction, and sum onto the receiving atom — in one pass, with
//! no [E, 3F] or [E, 3, F] intermediate. For each edge e = (i ← j), features k < F:
//!
//! ```text
//! x_s, x_d, x_v = φ_j ⊙ W_e            (the three F-wide parts)
//! Δs[i]    += x_s
//! Δv[i, c] += x_d · r̂_e[c] + x_v · v_j[c]     (c = x, y, z)
//! ```
//!
//! The CPU loop here is the oracle for the CUDA kernel (kernels/layers/message.cu, one thread per edge
//! and feature with atomic adds). The backward is composed of our differentiable gather and
//! scatter, so the force loss can be differentiated again in training; a fused backward kernel
//! is the next step.

use crate::ops::edges::gather::gather;
use crate::ops::edges::rows::contiguous;
use crate::ops::edges::scatter_add::scatter_add;
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, D};

#[cfg(feature = "cuda")]
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/message.ptx"));

/// The fused message op for `hidden` features into `n_atoms` rows; use [`message`].
pub struct Message {
    pub hidden: usize,
    pub n_atoms: usize,
    pub centers: Tensor,
    pub neighbors: Tensor,
}

/// Δs and Δv of one message block, packed as [N, 4F] (Δs | Δv_x | Δv_y | Δv_z).
///
/// `phi` is φ(s) [N, 3F]; `v` the vector features [N, 3, F]; `filter` W(r)·f_cut [E, 3F];
/// `directions` r̂ [E, 3]; `centers`/`neighbors` the u32 atoms i and j of each edge.
/// Differentiable (to any order) with respect to `phi`, `v`, `filter` and `directions`.
pub fn message(
    phi: &Tensor,
    v: &Tensor,
    filter: &Tensor,
    directions: &Tensor,
    centers: &Tensor,
    neighbors: &Tensor,
) -> Result<Tensor> {
    let (n, f3) = phi.dims2()?;
    let (e, wf) = filter.dims2()?;
    if f3 % 3 != 0 || wf != f3 || v.dims() != [n, 3, f3 / 3] || directions.dims() != [e, 3] {
        bail!(
            "mlff-message: shapes phi {:?}, v {:?}, filter {:?}, directions {:?} do not fit \
             [N, 3F], [N, 3, F], [E, 3F], [E, 3]",
            phi.dims(),
            v.dims(),
            filter.dims(),
            directions.dims()
        )
    }
    if centers.dims() != [e] || neighbors.dims() != [e] {
        bail!(
            "mlff-message: index shapes {:?} / {:?} do not match the {e} edges",
            centers.dims(),
            neighbors.dims()
        )
    }
    let op = Message {
        hidden: f3 / 3,
        n_atoms: n,
        centers: centers.contiguous()?,
        neighbors: neighbors.contiguous()?,
    };
    // Filter and directions travel as one [E, 3F + 3] input (a custom op takes three).
    let edge = Tensor::cat(&[filter, directions], D::Minus1)?;
    phi.contiguous()?
        .apply_op3(&v.reshape((n, f3))?.contiguous()?, &edge.contiguous()?, op)
}

/// The forward loop over edges (any float type).
#[allow(clippy::too_many_arguments)]
fn message_cpu<T>(
    phi: &[T],
    v: &[T],
    edge: &[T],
    ci: &[u32],
    nj: &[u32],
    f: usize,
    n: usize,
) -> Vec<T>
where
    T: Copy + Default + std::ops::Add<Output = T> + std::ops::Mul<Output = T> + std::ops::AddAssign,
{
    let mut out = vec![T::default(); n * 4 * f];
    let ew = 3 * f + 3;
    for (e, (&i, &j)) in ci.iter().zip(nj).enumerate() {
        let (i, j) = (i as usize, j as usize);
        let w = &edge[e * ew..(e + 1) * ew];
        let dir = &w[3 * f..];
        let p = &phi[j * 3 * f..(j + 1) * 3 * f];
        let vj = &v[j * 3 * f..(j + 1) * 3 * f];
        let o = &mut out[i * 4 * f..(i + 1) * 4 * f];
        for k in 0..f {
            let xs = p[k] * w[k];
            let xd = p[f + k] * w[f + k];
            let xv = p[2 * f + k] * w[2 * f + k];
            o[k] += xs;
            for c in 0..3 {
                o[f + c * f + k] += xd * dir[c] + xv * vj[c * f + k];
            }
        }
    }
    out
}

impl CustomOp3 for Message {
    fn name(&self) -> &'static str {
        "mlff-message"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (f, n) = (self.hidden, self.n_atoms);
        let cpu =
            |t: &Tensor| -> Result<Vec<u32>> { t.to_device(&candle_core::Device::Cpu)?.to_vec1() };
        let (ci, nj) = (cpu(&self.centers)?, cpu(&self.neighbors)?);
        for (what, idx) in [("centers", &ci), ("neighbors", &nj)] {
            if let Some(e) = idx.iter().position(|&i| i as usize >= n) {
                bail!(
                    "mlff-message: {what}[{e}] = {} is out of range for {n} atoms",
                    idx[e]
                )
            }
        }
        let (pa, pb) = contiguous(l1, self.name(), "phi")?;
        let (va, vb) = contiguous(l2, self.name(), "v")?;
        let (wa, wb) = contiguous(l3, self.name(), "edge data")?;
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(p), CpuStorage::F32(v), CpuStorage::F32(w)) => CpuStorage::F32(
                message_cpu(&p[pa..pb], &v[va..vb], &w[wa..wb], &ci, &nj, f, n),
            ),
            (CpuStorage::F64(p), CpuStorage::F64(v), CpuStorage::F64(w)) => CpuStorage::F64(
                message_cpu(&p[pa..pb], &v[va..vb], &w[wa..wb], &ci, &nj, f, n),
            ),
            _ => bail!(
                "mlff-message: dtypes {:?}, {:?}, {:?}: expected all f32 or all f64",
                s1.dtype(),
                s2.dtype(),
                s3.dtype()
            ),
        };
        Ok((out, Shape::from((n, 4 * f))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
        use candle_core::cuda_backend::{CudaStorage, CudaStorageSlice};
        use candle_core::{DType, Storage};
        let (f, n) = (self.hidden, self.n_atoms);
        let dev = s1.device.clone();
        let (ci_g, ci_l) = self.centers.storage_and_layout();
        let (nj_g, nj_l) = self.neighbors.storage_and_layout();
        fn index<'a>(
            g: &'a Storage,
            l: &Layout,
            what: &str,
        ) -> Result<candle_core::cuda_backend::cudarc::driver::CudaView<'a, u32>> {
            let (a, b) = contiguous(l, "mlff-message", what)?;
            match g {
                Storage::Cuda(CudaStorage {
                    slice: CudaStorageSlice::U32(s),
                    ..
                }) => Ok(s.slice(a..b)),
                _ => bail!("mlff-message: {what} must be u32 on the same CUDA device"),
            }
        }
        let ci = index(&ci_g, ci_l, "centers")?;
        let nj = index(&nj_g, nj_l, "neighbors")?;
        let n_edges = self.centers.dim(0)?;
        let (pa, pb) = contiguous(l1, self.name(), "phi")?;
        let (va, vb) = contiguous(l2, self.name(), "v")?;
        let (wa, wb) = contiguous(l3, self.name(), "edge data")?;
        let threads = n_edges * f;
        let cfg = crate::ops::launch::grid_stride(threads);
        macro_rules! run {
            ($t:ty, $variant:ident, $kernel:literal) => {{
                let (
                    CudaStorageSlice::$variant(p),
                    CudaStorageSlice::$variant(v),
                    CudaStorageSlice::$variant(w),
                ) = (&s1.slice, &s2.slice, &s3.slice)
                else {
                    bail!("mlff-message: inputs must share one dtype")
                };
                let (p, v, w) = (p.slice(pa..pb), v.slice(va..vb), w.slice(wa..wb));
                let out = dev.alloc_zeros::<$t>(n * 4 * f)?;
                if threads > 0 {
                    let func = dev.get_or_load_custom_func($kernel, "mlff_message", PTX)?;
                    let mut b = func.builder();
                    b.arg(&p).arg(&v).arg(&w).arg(&ci).arg(&nj).arg(&out);
                    b.arg(&n_edges).arg(&f).arg(&n);
                    // SAFETY: argument types match the kernel's signature.
                    unsafe { b.launch(cfg) }.map_err(|e| candle_core::Error::Cuda(Box::new(e)))?;
                }
                CudaStorage::wrap_cuda_slice(out, dev.clone())
            }};
        }
        let out = match s1.dtype() {
            DType::F32 => run!(f32, F32, "message_f32"),
            DType::F64 => run!(f64, F64, "message_f64"),
            d => bail!("mlff-message: dtype {d:?} is not supported (f32, f64)"),
        };
        Ok((out, Shape::from((n, 4 * f))))
    }

    /// Composed of differentiable ops, so it can be differentiated again (training on forces).
    fn bwd(
        &self,
        phi: &Tensor,
        v: &Tensor,
        edge: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (f, n) = (self.hidden, self.n_atoms);
        let e = edge.dim(0)?;
        if e == 0 {
            // Nothing depends on the inputs (and candle's CPU reductions panic on empty rows).
            return Ok((
                Some(phi.zeros_like()?),
                Some(v.zeros_like()?),
                Some(edge.zeros_like()?),
            ));
        }
        let w = edge.narrow(1, 0, 3 * f)?;
        let dir = edge.narrow(1, 3 * f, 3)?;
        let g_i = gather(grad, &self.centers)?; // [E, 4F]
        let g_s = g_i.narrow(1, 0, f)?;
        let g_v = g_i.narrow(1, f, 3 * f)?.reshape((e, 3, f))?;
        let phi_j = gather(phi, &self.neighbors)?; // [E, 3F]
        let v_j = gather(v, &self.neighbors)?.reshape((e, 3, f))?;
        // ∂L/∂x for the three parts, [E, F] each.
        let gx_d = g_v.broadcast_mul(&dir.unsqueeze(2)?)?.sum(1)?;
        let gx_v = (&g_v * &v_j)?.sum(1)?;
        let gx = Tensor::cat(&[&g_s, &gx_d, &gx_v], 1)?;
        let d_phi = scatter_add(&(&gx * &w)?, &self.neighbors, n)?;
        let d_w = (&gx * &phi_j)?;
        let x = (&phi_j * &w)?;
        let x_d = x.narrow(1, f, f)?;
        let x_v = x.narrow(1, 2 * f, f)?;
        let d_dir = g_v.broadcast_mul(&x_d.unsqueeze(1)?)?.sum(2)?; // [E, 3]
        let d_v = scatter_add(
            &g_v.broadcast_mul(&x_v.unsqueeze(1)?)?.reshape((e, 3 * f))?,
            &self.neighbors,
            n,
        )?;
        let d_edge = Tensor::cat(&[&d_w, &d_dir], 1)?;
        Ok((Some(d_phi), Some(d_v), Some(d_edge)))
    }
}
