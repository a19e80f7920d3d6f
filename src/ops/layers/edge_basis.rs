//! Edge basis of the filter network, fused: from positions, image offsets and the edge list to
//! `[rbf_0 f_c, ..., rbf_{R-1} f_c, f_c, r̂]` per edge (R + 4 columns) in one kernel, and the
//! adjoint back to positions in another (kernels/layers/edge_basis.cu). The same Gaussians and cosine
//! cutoff as `model::radial`; the filter network's bias multiplies the `f_c` column.

use crate::ops::launch::{
    check_edges, kernel_source, launch, overlaps_previous, Init, Kernel, Real,
};
use candle_core::bail;
use candle_core::{Result, Tensor};

/// Basis columns per edge for `n_rbf` Gaussians.
pub fn basis_width(n_rbf: usize) -> usize {
    n_rbf + 4
}

pub(crate) struct Geometry {
    pub(crate) n_edges: usize,
    pub(crate) n_rbf: usize,
    pub(crate) cutoff: f64,
}

impl Geometry {
    /// r_ij = x_j − x_i + offset, |r_ij|.
    fn edge<T: Real>(&self, pos: &[T], off: &[T], i: usize, j: usize, e: usize) -> ([T; 3], T) {
        let mut r = [T::zero(); 3];
        let mut d2 = T::zero();
        for a in 0..3 {
            r[a] = pos[3 * j + a] - pos[3 * i + a] + off[3 * e + a];
            d2 += r[a] * r[a];
        }
        (r, d2.sqrt())
    }

    /// Gaussian k at distance d, and the cutoff f_c and its derivative.
    fn radial<T: Real>(&self, d: T) -> (T, T, T) {
        let rc = T::of(self.cutoff);
        let w = rc / T::of((self.n_rbf - 1) as f64);
        let pi = T::of(std::f64::consts::PI);
        let half = T::of(0.5);
        if d < rc {
            let fc = half * ((pi * d / rc).cos() + T::one());
            let dfc = -half * pi / rc * (pi * d / rc).sin();
            (w, fc, dfc)
        } else {
            (w, T::zero(), T::zero())
        }
    }

    /// Basis of edge e = (i ← j) into `o` (R + 4 values).
    pub(crate) fn basis<T: Real>(
        &self,
        pos: &[T],
        off: &[T],
        (i, j, e): (usize, usize, usize),
        o: &mut [T],
    ) {
        let (r, d) = self.edge(pos, off, i, j, e);
        let (w, fc, _) = self.radial(d);
        for (k, o) in o[..self.n_rbf].iter_mut().enumerate() {
            let z = (d - T::of(k as f64) * w) / w;
            *o = (T::of(-0.5) * z * z).exp() * fc;
        }
        o[self.n_rbf] = fc;
        for a in 0..3 {
            o[self.n_rbf + 1 + a] = r[a] / d;
        }
    }

    /// dL/dr of edge e = (i ← j) for its basis gradient `ge` (R + 4 values).
    pub(crate) fn grad<T: Real>(
        &self,
        pos: &[T],
        off: &[T],
        (i, j, e): (usize, usize, usize),
        ge: &[T],
    ) -> [T; 3] {
        let (r, d) = self.edge(pos, off, i, j, e);
        let (w, fc, dfc) = self.radial(d);
        let mut gd = ge[self.n_rbf] * dfc;
        for (k, &gk) in ge[..self.n_rbf].iter().enumerate() {
            let z = (d - T::of(k as f64) * w) / w;
            let rbf = (T::of(-0.5) * z * z).exp();
            gd += gk * (rbf * dfc - rbf * z / w * fc);
        }
        let u = [r[0] / d, r[1] / d, r[2] / d];
        let gu = &ge[self.n_rbf + 1..];
        let gu_u = gu[0] * u[0] + gu[1] * u[1] + gu[2] * u[2];
        std::array::from_fn(|a| gd * u[a] + (gu[a] - gu_u * u[a]) / d)
    }
}

struct Forward(Geometry);

impl Kernel for Forward {
    overlaps_previous!();
    kernel_source!("edge_basis_fwd", "edge_basis");
    fn work(&self) -> usize {
        self.0.n_edges
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.0.n_edges, self.0.n_rbf]
    }
    fn reals(&self) -> Vec<f64> {
        vec![self.0.cutoff]
    }
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        let (g, bw) = (&self.0, basis_width(self.0.n_rbf));
        for (e, (&i, &j)) in idx[0].iter().zip(idx[1]).enumerate() {
            let o = &mut out[e * bw..(e + 1) * bw];
            g.basis(x[0], x[1], (i as usize, j as usize, e), o);
        }
    }
    /// The default grid-stride loop, with a block's rows staged in shared memory.
    #[cfg(feature = "cuda")]
    fn launch_config(
        &self,
        elem_bytes: usize,
    ) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        let mut cfg = crate::ops::launch::grid_stride(self.work());
        cfg.shared_mem_bytes =
            (cfg.block_dim.0 as usize * basis_width(self.0.n_rbf) * elem_bytes) as u32;
        cfg
    }
}

/// The adjoint to the atoms [N, 3], or (`virial`) to the atoms and their virials after them:
/// [4N, 3].
struct Adjoint {
    geometry: Geometry,
    virial: bool,
    atoms: usize,
}

impl Kernel for Adjoint {
    overlaps_previous!();
    kernel_source!("edge_basis_adj", "edge_basis");
    fn function(&self) -> &'static str {
        match self.virial {
            true => "edge_basis_virial_adj",
            false => Self::NAME,
        }
    }
    fn work(&self) -> usize {
        self.geometry.n_edges
    }
    fn sizes(&self) -> Vec<usize> {
        let g = &self.geometry;
        let mut sizes = vec![g.n_edges, g.n_rbf];
        // The virial variant takes the atom count, where the virials' rows start.
        sizes.extend(self.virial.then_some(self.atoms));
        sizes
    }
    fn reals(&self) -> Vec<f64> {
        vec![self.geometry.cutoff]
    }
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        let (g, bw) = (&self.geometry, basis_width(self.geometry.n_rbf));
        let virials = self.virial.then_some(self.atoms);
        for (e, (&i, &j)) in idx[0].iter().zip(idx[1]).enumerate() {
            let (i, j) = (i as usize, j as usize);
            let gr = g.grad(x[0], x[1], (i, j, e), &x[2][e * bw..(e + 1) * bw]);
            add_edge_grad(out, (x[0], x[1]), (i, j, e), gr, virials);
        }
    }
}

/// Edge i ← j's gradient dL/dr (r = x_j − x_i + offset, from `pos` and `off`) into the atoms'
/// gradients and, given where the N atoms' virials start (`virials`: N, the rows after the
/// gradients), r ⊗ dL/dr into centre i's virial (row-major 3x3).
pub(crate) fn add_edge_grad<T: Real>(
    out: &mut [T],
    (pos, off): (&[T], &[T]),
    (i, j, e): (usize, usize, usize),
    gr: [T; 3],
    virials: Option<usize>,
) {
    for a in 0..3 {
        out[3 * j + a] += gr[a];
        out[3 * i + a] -= gr[a];
    }
    if let Some(n) = virials {
        let w = &mut out[3 * n + 9 * i..][..9];
        for a in 0..3 {
            let r = pos[3 * j + a] - pos[3 * i + a] + off[3 * e + a];
            for b in 0..3 {
                w[3 * a + b] += r * gr[b];
            }
        }
    }
}

/// Edge basis [E, R + 4] of edges i ← j (`centers`, `neighbors`, u32) with image `offsets`
/// [E, 3] from `positions` [N, 3].
pub fn edge_basis(
    positions: &Tensor,
    offsets: &Tensor,
    centers: &Tensor,
    neighbors: &Tensor,
    n_rbf: usize,
    cutoff: f64,
) -> Result<Tensor> {
    let n_edges = check_geometry(positions, offsets, centers, neighbors, n_rbf, "edge basis")?;
    let k = Forward(Geometry {
        n_edges,
        n_rbf,
        cutoff,
    });
    launch(
        k,
        &[positions, offsets],
        &[centers, neighbors],
        (n_edges, basis_width(n_rbf)),
        Init::Uninit,
    )
}

/// Checks shapes and indices; returns the number of edges.
pub(crate) fn check_geometry(
    positions: &Tensor,
    offsets: &Tensor,
    centers: &Tensor,
    neighbors: &Tensor,
    n_rbf: usize,
    op: &str,
) -> Result<usize> {
    let n = positions.dim(0)?;
    check_edges(centers, neighbors, n, op)?;
    let e = centers.dim(0)?;
    if positions.dims() != [n, 3] || offsets.dims() != [e, 3] || n_rbf < 2 {
        bail!(
            "{op}: positions {:?}, offsets {:?} and {n_rbf} radial functions do not fit \
             [N, 3], [E, 3] with E = {e}, n_rbf >= 2",
            positions.dims(),
            offsets.dims()
        )
    }
    Ok(e)
}

/// dL/d(positions) [N, 3] from dL/d(basis) `grad` [E, R + 4].
pub fn edge_basis_adjoint(
    positions: &Tensor,
    offsets: &Tensor,
    grad: &Tensor,
    centers: &Tensor,
    neighbors: &Tensor,
    n_rbf: usize,
    cutoff: f64,
) -> Result<Tensor> {
    basis_adjoint(
        positions,
        offsets,
        grad,
        (centers, neighbors),
        (n_rbf, cutoff),
        false,
    )
}

/// [`edge_basis_adjoint`] and (`virial`) each atom's virial Σ_{e: i ← j} r_e ⊗ dL/dr_e
/// (r = x_j − x_i + offset) in 3 rows after the atoms' gradients: [4N, 3], for the stress.
pub(crate) fn basis_adjoint(
    positions: &Tensor,
    offsets: &Tensor,
    grad: &Tensor,
    (centers, neighbors): (&Tensor, &Tensor),
    (n_rbf, cutoff): (usize, f64),
    virial: bool,
) -> Result<Tensor> {
    let n_edges = check_geometry(
        positions,
        offsets,
        centers,
        neighbors,
        n_rbf,
        "edge basis adjoint",
    )?;
    if grad.dims() != [n_edges, basis_width(n_rbf)] {
        bail!(
            "edge basis adjoint: gradient {:?} is not [E, R + 4]",
            grad.dims()
        )
    }
    let k = Adjoint {
        geometry: Geometry {
            n_edges,
            n_rbf,
            cutoff,
        },
        virial,
        atoms: positions.dim(0)?,
    };
    let shape = match virial {
        true => (4 * positions.dim(0)?, 3).into(),
        false => positions.shape().clone(),
    };
    launch(
        k,
        &[positions, offsets, grad],
        &[centers, neighbors],
        &shape,
        Init::Zero,
    )
}
