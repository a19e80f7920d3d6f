//! The PaiNN interaction (message) block with the filter network inside the kernel: for each
//! edge the filter W·[rbf f_c, f_c] is formed on the fly from the edge basis, multiplied with
//! the neighbour's context φ_j and direction or vector features, and summed onto the receiving
//! atom — no [E, 3F] tensor exists, forward or adjoint (kernels/interaction.cu). State tensors
//! are component-major [4N, F]: s, then v_x, v_y, v_z.

use super::edge_basis::basis_width;
use super::kernel::{kernel_source, launch, Init, Kernel, Real};

/// Basis columns the CUDA adjoint keeps per lane in registers (MAX_BASIS in
/// kernels/interaction.cu).
const MAX_BASIS: usize = 32;
use candle_core::{bail, Result, Tensor};

#[derive(Clone, Copy)]
struct Sizes {
    n_edges: usize,
    hidden: usize,
    n_atoms: usize,
    n_rbf: usize,
}

impl Sizes {
    fn list(&self) -> Vec<usize> {
        vec![self.n_edges, self.hidden, self.n_atoms, self.n_rbf]
    }

    /// The edge's filter row W·b, [3F], for basis row b and weights wt [R + 1, 3F] (row by
    /// row, so that the CPU loop runs over contiguous memory).
    fn filter<T: Real>(&self, b: &[T], wt: &[T], w: &mut [T]) {
        let len = w.len();
        w.fill(T::zero());
        for (r, &br) in b[..self.n_rbf + 1].iter().enumerate() {
            for (w, &x) in w.iter_mut().zip(&wt[r * len..(r + 1) * len]) {
                *w += br * x;
            }
        }
    }

    /// φ_j + bias for the three parts of feature c.
    fn context<T: Real>(&self, phi: &[T], pb: &[T], j: usize, c: usize) -> [T; 3] {
        let f = self.hidden;
        [0, 1, 2].map(|p| phi[j * 3 * f + p * f + c] + pb[p * f + c])
    }
}

struct Forward(Sizes);

impl Kernel for Forward {
    kernel_source!("interaction_fwd", "interaction");
    /// One thread per (edge, feature).
    fn work(&self) -> usize {
        self.0.n_edges * self.0.hidden
    }
    fn sizes(&self) -> Vec<usize> {
        self.0.list()
    }
    /// x = [phi, phi_bias, wt, basis, sv]; out starts as sv.
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        let z = self.0;
        let (f, n, bw, nb) = (z.hidden, z.n_atoms, basis_width(z.n_rbf), z.n_rbf + 1);
        let sv = x[4];
        let mut w = vec![T::zero(); 3 * f];
        for (e, (&i, &j)) in idx[0].iter().zip(idx[1]).enumerate() {
            let (i, j) = (i as usize, j as usize);
            let b = &x[3][e * bw..(e + 1) * bw];
            z.filter(b, x[2], &mut w);
            for c in 0..f {
                let (ws, wd, wv) = (w[c], w[f + c], w[2 * f + c]);
                let [ps, pd, pv] = z.context(x[0], x[1], j, c);
                let (xd, xv) = (pd * wd, pv * wv);
                out[i * f + c] += ps * ws;
                for a in 0..3 {
                    let row = (1 + a) * n;
                    out[(row + i) * f + c] += xd * b[nb + a] + xv * sv[(row + j) * f + c];
                }
            }
        }
    }
}

struct Adjoint(Sizes);

impl Kernel for Adjoint {
    kernel_source!("interaction_adj", "interaction");
    /// One warp per edge.
    fn work(&self) -> usize {
        self.0.n_edges * 32
    }
    fn sizes(&self) -> Vec<usize> {
        self.0.list()
    }
    /// x = [phi, phi_bias, wt, basis, sv, gm, gve]; out (zeroed) = [g_v | g_phi | g_basis].
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        let z = self.0;
        let (f, n, bw, nb) = (z.hidden, z.n_atoms, basis_width(z.n_rbf), z.n_rbf + 1);
        let (sv, gm, gve) = (x[4], x[5], x[6]);
        let (gv, rest) = out.split_at_mut(3 * n * f);
        let (gphi, gb) = rest.split_at_mut(3 * n * f);
        let (mut w, mut gw) = (vec![T::zero(); 3 * f], vec![T::zero(); 3 * f]);
        for (e, (&i, &j)) in idx[0].iter().zip(idx[1]).enumerate() {
            let (i, j) = (i as usize, j as usize);
            let b = &x[3][e * bw..(e + 1) * bw];
            let gbe = &mut gb[e * bw..(e + 1) * bw];
            z.filter(b, x[2], &mut w);
            for c in 0..f {
                let (ws, wd, wv) = (w[c], w[f + c], w[2 * f + c]);
                let [ps, pd, pv] = z.context(x[0], x[1], j, c);
                let gs = gm[i * f + c];
                let (mut g, mut gxd, mut gxv) = ([T::zero(); 3], T::zero(), T::zero());
                for a in 0..3 {
                    g[a] = gm[((1 + a) * n + i) * f + c] + gve[(a * n + i) * f + c];
                    gxd += g[a] * b[nb + a];
                    gxv += g[a] * sv[((1 + a) * n + j) * f + c];
                }
                gphi[j * 3 * f + c] += gs * ws;
                gphi[j * 3 * f + f + c] += gxd * wd;
                gphi[j * 3 * f + 2 * f + c] += gxv * wv;
                let (xd, xv) = (pd * wd, pv * wv);
                for a in 0..3 {
                    gv[(a * n + j) * f + c] += g[a] * xv;
                    gbe[nb + a] += g[a] * xd;
                }
                (gw[c], gw[f + c], gw[2 * f + c]) = (gs * ps, gxd * pd, gxv * pv);
            }
            // dL/db_r = Σ_c dL/dw_c · Wt[r, c], a dot product per basis column.
            for (r, gbr) in gbe[..nb].iter_mut().enumerate() {
                let row = &x[2][r * 3 * f..(r + 1) * 3 * f];
                *gbr += row
                    .iter()
                    .zip(&gw)
                    .fold(T::zero(), |acc, (&a, &b)| acc + a * b);
            }
        }
    }
}

/// The block's inputs that forward and adjoint share.
pub struct InteractionInputs<'a> {
    /// φ(s) before its last bias, [N, 3F].
    pub phi: &'a Tensor,
    /// That bias, [3F].
    pub phi_bias: &'a Tensor,
    /// Filter weights of this block, transposed with the bias as last row: [R + 1, 3F].
    pub filter: &'a Tensor,
    /// Edge basis [E, R + 4] (`edge_basis`).
    pub basis: &'a Tensor,
    /// State entering the block, [4N, F].
    pub state: &'a Tensor,
    pub centers: &'a Tensor,
    pub neighbors: &'a Tensor,
}

impl InteractionInputs<'_> {
    fn sizes(&self) -> Result<Sizes> {
        let (n4, f) = self.state.dims2()?;
        let (e, bw) = self.basis.dims2()?;
        let n = n4 / 4;
        let n_rbf = bw.saturating_sub(4);
        if n4 % 4 != 0
            || self.phi.dims() != [n, 3 * f]
            || self.phi_bias.dims() != [3 * f]
            || self.filter.dims() != [n_rbf + 1, 3 * f]
            || bw < 5
            || self.centers.dims() != [e]
            || self.neighbors.dims() != [e]
        {
            bail!(
                "interaction: shapes state {:?}, phi {:?}, phi bias {:?}, filter {:?}, basis \
                 {:?}, edges {:?}/{:?} do not fit [4N, F], [N, 3F], [3F], [R+1, 3F], [E, R+4], [E]",
                self.state.dims(),
                self.phi.dims(),
                self.phi_bias.dims(),
                self.filter.dims(),
                self.basis.dims(),
                self.centers.dims(),
                self.neighbors.dims()
            )
        }
        if bw > MAX_BASIS {
            bail!(
                "interaction: {n_rbf} radial functions; the fused kernels take at most {}",
                MAX_BASIS - 4
            )
        }
        Ok(Sizes {
            n_edges: e,
            hidden: f,
            n_atoms: n,
            n_rbf,
        })
    }
}

/// The state after the block's messages: `state` + Σ_j messages, [4N, F].
pub fn interaction(x: &InteractionInputs) -> Result<Tensor> {
    let z = x.sizes()?;
    launch(
        Forward(z),
        &[x.phi, x.phi_bias, x.filter, x.basis, x.state],
        &[x.centers, x.neighbors],
        x.state.shape(),
        Init::Copy(4),
    )
}

/// Adjoint of [`interaction`] for the output gradient `gm` [4N, F] plus `gve` [3N, F] on its
/// vector rows. Returns (dL/dv through the messages [3N, F] — the identity part is not
/// included —, dL/dφ [N, 3F], dL/d(basis) [E, R + 4]).
pub fn interaction_adjoint(
    x: &InteractionInputs,
    gm: &Tensor,
    gve: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let z = x.sizes()?;
    let (n, f, e) = (z.n_atoms, z.hidden, z.n_edges);
    if gm.dims() != [4 * n, f] || gve.dims() != [3 * n, f] {
        bail!(
            "interaction adjoint: gradients {:?} and {:?} do not fit [4N, F] and [3N, F]",
            gm.dims(),
            gve.dims()
        )
    }
    let bw = basis_width(z.n_rbf);
    let nf = n * f;
    let out = launch(
        Adjoint(z),
        &[x.phi, x.phi_bias, x.filter, x.basis, x.state, gm, gve],
        &[x.centers, x.neighbors],
        6 * nf + e * bw,
        Init::Zero,
    )?;
    Ok((
        out.narrow(0, 0, 3 * nf)?.reshape((3 * n, f))?,
        out.narrow(0, 3 * nf, 3 * nf)?.reshape((n, 3 * f))?,
        out.narrow(0, 6 * nf, e * bw)?.reshape((e, bw))?,
    ))
}
