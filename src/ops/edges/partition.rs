//! A stable partition of an edge list into classes by the smaller of each edge's two atoms
//! (kernels/edges/partition.cu): class(e) is how many of the ascending `bounds` are at most
//! min(center, neighbour). The classes follow one another, each in the list's order. With the
//! atoms ordered by depth and the bounds at the depth changes, every prefix of whole classes is
//! a list holding each of its edges' reverse (an edge and its reverse share their smaller atom):
//! a domain's shell call runs each block over such a prefix, with the symmetric adjoint.

use crate::ops::edges::rows::{cpu_index, host_u32s};
use candle_core::{bail, CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

/// Most classes (bounds + 1): PT_CLASSES in kernels/edges/partition.cu.
pub const PARTITION_MAX_CLASSES: usize = 8;
/// Edges per tile of the CUDA kernels (PT_TILE).
#[cfg(feature = "cuda")]
const TILE: usize = 1024;

/// An edge list in class order.
pub struct EdgeClasses {
    pub centers: Tensor,
    pub neighbors: Tensor,
    /// Each place's edge in the list given (u32): the rows to gather per-edge values from.
    pub order: Tensor,
    /// Edges of each class, `bounds.len() + 1` of them.
    pub counts: Vec<usize>,
}

/// `centers` and `neighbors` (u32, [E], on one device) in class order for ascending `bounds`
/// (at most [`PARTITION_MAX_CLASSES`] − 1).
pub fn partition_edges(
    centers: &Tensor,
    neighbors: &Tensor,
    bounds: &[usize],
) -> Result<EdgeClasses> {
    if bounds.len() >= PARTITION_MAX_CLASSES || bounds.windows(2).any(|w| w[1] < w[0]) {
        bail!(
            "edge partition: bounds {bounds:?} must ascend, at most {} of them",
            PARTITION_MAX_CLASSES - 1
        )
    }
    if bounds.iter().any(|&b| b > u32::MAX as usize) {
        bail!("edge partition: bounds {bounds:?} past u32")
    }
    let e = centers.dim(0)?;
    if centers.dims() != [e] || neighbors.dims() != [e] {
        bail!(
            "edge partition: centers {:?} and neighbours {:?} must be one list",
            centers.dims(),
            neighbors.dims()
        )
    }
    let mut t = [u32::MAX; PARTITION_MAX_CLASSES - 1];
    for (t, &b) in t.iter_mut().zip(bounds) {
        *t = b as u32;
    }
    let out = centers
        .contiguous()?
        .apply_op2_no_bwd(&neighbors.contiguous()?, &Partition { bounds: t })?;
    let totals = host_u32s(&out.narrow(0, 3 * e, PARTITION_MAX_CLASSES)?)?;
    Ok(EdgeClasses {
        centers: out.narrow(0, 0, e)?,
        neighbors: out.narrow(0, e, e)?,
        order: out.narrow(0, 2 * e, e)?,
        counts: totals[..=bounds.len()]
            .iter()
            .map(|&c| c as usize)
            .collect(),
    })
}

/// The op: out = [centers | neighbours | places' edges | class totals (8)], u32.
struct Partition {
    bounds: [u32; PARTITION_MAX_CLASSES - 1],
}

impl Partition {
    fn class(&self, c: u32, n: u32) -> usize {
        let m = c.min(n);
        self.bounds.iter().filter(|&&t| m >= t).count()
    }

    /// The CPU twin.
    fn cpu(&self, ci: &[u32], nj: &[u32]) -> Vec<u32> {
        let e = ci.len();
        let mut totals = [0usize; PARTITION_MAX_CLASSES];
        for (&c, &n) in ci.iter().zip(nj) {
            totals[self.class(c, n)] += 1;
        }
        let mut next = [0usize; PARTITION_MAX_CLASSES];
        for k in 1..PARTITION_MAX_CLASSES {
            next[k] = next[k - 1] + totals[k - 1];
        }
        let mut out = vec![0u32; 3 * e + PARTITION_MAX_CLASSES];
        for (k, (&c, &n)) in ci.iter().zip(nj).enumerate() {
            let place = &mut next[self.class(c, n)];
            (out[*place], out[e + *place], out[2 * e + *place]) = (c, n, k as u32);
            *place += 1;
        }
        for (o, &t) in out[3 * e..].iter_mut().zip(&totals) {
            *o = t as u32;
        }
        out
    }
}

impl CustomOp2 for Partition {
    fn name(&self) -> &'static str {
        "mlff-edge-partition"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let ci = cpu_index(s1, l1, u32::MAX as usize, self.name())?;
        let nj = cpu_index(s2, l2, u32::MAX as usize, self.name())?;
        let out = self.cpu(ci, nj);
        let len = out.len();
        Ok((CpuStorage::U32(out), Shape::from(len)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use crate::ops::edges::rows::contiguous;
        use crate::ops::launch::cached_function;
        use candle_core::backend::BackendStorage;
        use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
        use candle_core::cuda_backend::{CudaStorage, CudaStorageSlice};
        use candle_core::DType;
        const IMAGE: &[u8] = crate::ops::launch::kernel_image!("partition");
        let dev = s1.device().clone();
        let ((a1, b1), (a2, b2)) = (
            contiguous(l1, self.name(), "centers")?,
            contiguous(l2, self.name(), "neighbours")?,
        );
        let (CudaStorageSlice::U32(c), CudaStorageSlice::U32(n)) = (&s1.slice, &s2.slice) else {
            bail!("{}: centers and neighbours must be u32", self.name())
        };
        let (ci, nj) = (c.slice(a1..b1), n.slice(a2..b2));
        let e = b1 - a1;
        let tiles = e.div_ceil(TILE);
        let len = 3 * e + PARTITION_MAX_CLASSES;
        // SAFETY: the fill writes each of the 3E places once (every edge has one place), the
        // scan the class totals.
        let mut out = unsafe { dev.alloc::<u32>(len)? };
        let counts_len = PARTITION_MAX_CLASSES * tiles.max(1);
        // SAFETY: the count kernel writes every class of every tile.
        let mut counts = unsafe { dev.alloc::<u32>(counts_len)? };
        let stream = dev.cuda_stream();
        let cuda = |e: candle_core::cuda_backend::cudarc::driver::DriverError| {
            candle_core::Error::Cuda(Box::new(e))
        };
        let blocks = |n: usize| LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (TILE as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let t = self.bounds;
        let f = |name| cached_function(&dev, name, "partition", IMAGE, DType::F64, 0);
        if tiles > 0 {
            let count = f("partition_count")?;
            let mut b = stream.launch_builder(&count);
            b.arg(&ci).arg(&nj).arg(&mut counts).arg(&e).arg(&tiles);
            for v in &t {
                b.arg(v);
            }
            // SAFETY: the arguments follow partition_count's signature.
            unsafe { b.launch(blocks(tiles)) }.map_err(cuda)?;
        }
        {
            let scan = f("partition_scan")?;
            let mut b = stream.launch_builder(&scan);
            let mut totals = out.slice_mut(3 * e..);
            b.arg(&mut counts).arg(&mut totals).arg(&e).arg(&tiles);
            // SAFETY: the arguments follow partition_scan's signature.
            unsafe { b.launch(blocks(1)) }.map_err(cuda)?;
        }
        if tiles > 0 {
            let fill = f("partition_fill")?;
            let mut b = stream.launch_builder(&fill);
            b.arg(&ci)
                .arg(&nj)
                .arg(&counts)
                .arg(&mut out)
                .arg(&e)
                .arg(&tiles);
            for v in &t {
                b.arg(v);
            }
            // SAFETY: the arguments follow partition_fill's signature.
            unsafe { b.launch(blocks(tiles)) }.map_err(cuda)?;
        }
        Ok((CudaStorage::wrap_cuda_slice(out, dev), Shape::from(len)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Classes in order, each in the list's order, by the smaller atom of each edge.
    #[test]
    fn classes_follow_each_other_in_list_order() -> Result<()> {
        let ci = [0u32, 0, 1, 2, 2, 3, 4, 4, 5];
        let nj = [1u32, 4, 0, 0, 5, 4, 0, 3, 2];
        let dev = Device::Cpu;
        let (c, n) = (Tensor::new(&ci, &dev)?, Tensor::new(&nj, &dev)?);
        let p = partition_edges(&c, &n, &[1, 3])?;
        // min: 0 0 0 0 2 3 0 3 2 -> classes 0 0 0 0 1 2 0 2 1.
        assert_eq!(p.counts, vec![5, 2, 2]);
        assert_eq!(p.order.to_vec1::<u32>()?, vec![0, 1, 2, 3, 6, 4, 8, 5, 7]);
        assert_eq!(p.centers.to_vec1::<u32>()?, vec![0, 0, 1, 2, 4, 2, 5, 3, 4]);
        assert_eq!(
            p.neighbors.to_vec1::<u32>()?,
            vec![1, 4, 0, 0, 0, 5, 2, 4, 3]
        );
        let empty = Tensor::zeros(0, candle_core::DType::U32, &dev)?;
        assert_eq!(partition_edges(&empty, &empty, &[2])?.counts, vec![0, 0]);
        assert!(partition_edges(&c, &n, &[3, 1]).is_err());
        Ok(())
    }
}
