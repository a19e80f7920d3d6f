//! The PaiNN interaction (message) block: for each edge the filter W·[rbf f_c, f_c] is
//! multiplied with the neighbour's context φ_j and direction or vector features and summed onto
//! the receiving atom (kernels/layers/interaction.cu). The filter is either formed inside the kernel
//! from the edge basis ([`EdgeFilter::Weights`]: no [E, 3F] tensor; on CUDA from
//! [`Tuning::tile_from`] edges the tiled kernels of `interaction_tile`, on tensor cores in f32,
//! on CUDA cores in f64, whose adjoint leaves dL/dw as rows) or read from rows a matrix product
//! made ([`EdgeFilter::Rows`]: fewer instructions per edge). State tensors are component-major
//! [4N, F]: s, then v_x, v_y, v_z.

use crate::ops::launch::{check_edges, launch, Init, Kernel, Real};
use crate::ops::layers::edge_basis::basis_width;
use crate::ops::layers::interaction_tile::{symmetric, tiled, TileAdjoint, TileForward};
use crate::tuning::Tuning;

use candle_core::{bail, Result, Tensor};

/// Basis columns the CUDA adjoint keeps per lane in registers (MAX_BASIS in
/// kernels/layers/interaction.cu).
const MAX_BASIS: usize = 32;

/// Most radial functions the fused kernels take ([`MAX_BASIS`] less the cutoff's and unit
/// vector's columns); the custom and stock paths take any.
pub const FUSED_MAX_RBF: usize = MAX_BASIS - 4;

/// Edges per thread of the filter-rows forward kernel (ROWS_EDGES_PER_THREAD in
/// kernels/layers/interaction.cu).
const ROWS_EDGES_PER_THREAD: usize = 8;

#[derive(Clone, Copy)]
pub(crate) struct Sizes {
    pub(crate) n_edges: usize,
    pub(crate) hidden: usize,
    pub(crate) n_atoms: usize,
    pub(crate) n_rbf: usize,
}

impl Sizes {
    pub(crate) fn list(&self) -> Vec<usize> {
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

    /// Edge e's filter row [3F]: row e of `x2` when it holds rows, else formed from the basis
    /// row `b` and the weights `x2` into `formed`.
    fn filter_row<'a, T: Real>(
        &self,
        rows: bool,
        x2: &'a [T],
        b: &[T],
        e: usize,
        formed: &'a mut [T],
    ) -> &'a [T] {
        let len = formed.len();
        if rows {
            return &x2[e * len..(e + 1) * len];
        }
        self.filter(b, x2, formed);
        formed
    }

    /// φ_j + bias for the three parts of feature c.
    fn context<T: Real>(&self, phi: &[T], pb: &[T], j: usize, c: usize) -> [T; 3] {
        let f = self.hidden;
        [0, 1, 2].map(|p| phi[j * 3 * f + p * f + c] + pb[p * f + c])
    }
}

/// The per-edge loops of the CPU twins; `rows` says whether x[2] holds filter rows [E, 3F]
/// (else the weights [R + 1, 3F], the filter formed per edge).
pub(crate) fn forward_cpu<T: Real>(
    z: Sizes,
    rows: bool,
    x: &[&[T]],
    idx: &[&[u32]],
    out: &mut [T],
) {
    let (f, n, bw, nb) = (z.hidden, z.n_atoms, basis_width(z.n_rbf), z.n_rbf + 1);
    let sv = x[4];
    let mut formed = vec![T::zero(); 3 * f];
    for (e, (&i, &j)) in idx[0].iter().zip(idx[1]).enumerate() {
        let (i, j) = (i as usize, j as usize);
        let b = &x[3][e * bw..(e + 1) * bw];
        let w = z.filter_row(rows, x[2], b, e, &mut formed);
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

/// What an adjoint kernel reads and writes.
#[derive(Clone, Copy)]
pub(crate) struct AdjointMode {
    /// x[2] holds filter rows [E, 3F] (else the weights, the filter formed per edge).
    pub rows: bool,
    /// dL/dw is written as rows after g_basis, which then only holds its unit-vector columns.
    pub grad_rows: bool,
    /// dL/dW [R + 1, 3F] (the filter weights' gradient: Σ over the edges of each edge's basis
    /// row times its dL/dw) is written after g_basis, which then only holds its unit-vector
    /// columns (the weights' gradient needs no position gradient).
    pub grad_weights: bool,
    /// Each edge computes the terms of its reverse edge (symmetric lists, `tile_sym_adj`):
    /// the output gradient of the edge's sending atom, sums into its receiving atom, and the
    /// reverse edge's dL/du (its u is minus this edge's) with the sign flipped. (Every adjoint
    /// takes x[5] = dL/ds [N, F] and x[6] = the whole dL/dv [3N, F].)
    pub symmetric: bool,
    /// x[7] (the later blocks' dL/d(basis), [E, R + 4]) is added to g_basis.
    pub accumulate: bool,
}

/// out (zeroed) = [g_v | g_phi | g_basis] and, with `mode.grad_rows`, then g_w [E, 3F]
/// (`mode.grad_weights`: then dL/dW [R + 1, 3F]).
pub(crate) fn adjoint_cpu<T: Real>(
    z: Sizes,
    mode: AdjointMode,
    x: &[&[T]],
    idx: &[&[u32]],
    out: &mut [T],
) {
    let (f, n, bw, nb) = (z.hidden, z.n_atoms, basis_width(z.n_rbf), z.n_rbf + 1);
    let (sv, gm, gve) = (x[4], x[5], x[6]);
    let (gv, rest) = out.split_at_mut(3 * n * f);
    let (gphi, rest) = rest.split_at_mut(3 * n * f);
    let (gb, g_rows) = rest.split_at_mut(z.n_edges * bw);
    if mode.accumulate {
        gb.copy_from_slice(x[7]);
    }
    let (mut formed, mut gw) = (vec![T::zero(); 3 * f], vec![T::zero(); 3 * f]);
    // The terms of the message i <- j, u its unit vector (u_sign times the edge's).
    let u_sign = if mode.symmetric { -T::one() } else { T::one() };
    for (e, (&ci, &nj)) in idx[0].iter().zip(idx[1]).enumerate() {
        let (i, j) = match mode.symmetric {
            false => (ci as usize, nj as usize),
            true => (nj as usize, ci as usize),
        };
        let b = &x[3][e * bw..(e + 1) * bw];
        let gbe = &mut gb[e * bw..(e + 1) * bw];
        let w = z.filter_row(mode.rows, x[2], b, e, &mut formed);
        for c in 0..f {
            let (ws, wd, wv) = (w[c], w[f + c], w[2 * f + c]);
            let [ps, pd, pv] = z.context(x[0], x[1], j, c);
            let gs = gm[i * f + c];
            let (mut g, mut gxd, mut gxv) = ([T::zero(); 3], T::zero(), T::zero());
            for a in 0..3 {
                g[a] = gve[(a * n + i) * f + c];
                gxd += g[a] * b[nb + a] * u_sign;
                gxv += g[a] * sv[((1 + a) * n + j) * f + c];
            }
            gphi[j * 3 * f + c] += gs * ws;
            gphi[j * 3 * f + f + c] += gxd * wd;
            gphi[j * 3 * f + 2 * f + c] += gxv * wv;
            let (xd, xv) = (pd * wd, pv * wv);
            for a in 0..3 {
                gv[(a * n + j) * f + c] += g[a] * xv;
                gbe[nb + a] += g[a] * xd * u_sign;
            }
            (gw[c], gw[f + c], gw[2 * f + c]) = (gs * ps, gxd * pd, gxv * pv);
        }
        if mode.grad_rows {
            g_rows[e * 3 * f..(e + 1) * 3 * f].copy_from_slice(&gw);
            continue;
        }
        if mode.grad_weights {
            for (r, &br) in b[..nb].iter().enumerate() {
                let row = &mut g_rows[r * 3 * f..(r + 1) * 3 * f];
                for (acc, &g) in row.iter_mut().zip(&gw) {
                    *acc += br * g;
                }
            }
            continue;
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

/// The forward and adjoint kernels for either filter source (`ROWS`).
struct Forward<const ROWS: bool>(Sizes);
/// The adjoint also carries the chunks of 32 features each warp takes (1, or all of an edge's
/// from [`Tuning::adjoint_warp_per_edge_from_edges`] edges).
struct Adjoint<const ROWS: bool>(Sizes, usize);

impl<const ROWS: bool> Adjoint<ROWS> {
    fn new(z: Sizes, tuning: &Tuning) -> Self {
        let chunks = match z.n_edges >= tuning.adjoint_warp_per_edge_from_edges {
            true => z.hidden.div_ceil(32),
            false => 1,
        };
        Self(z, chunks)
    }

    /// Chunks of 32 features per warp (the in-kernel adjoint; the rows kernel ignores it):
    /// with few edges one warp per edge leaves multiprocessors idle, with many the extra
    /// warps only add reductions and atomics.
    fn chunks_per_warp(&self) -> usize {
        self.1
    }
}

impl<const ROWS: bool> Kernel for Forward<ROWS> {
    const NAME: &'static str = if ROWS {
        "interaction_rows_fwd"
    } else {
        "interaction_fwd"
    };
    const MODULE: &'static str = "interaction";
    #[cfg(feature = "cuda")]
    const IMAGE: &'static [u8] = crate::ops::launch::kernel_image!("interaction");
    /// One thread per (edge, feature); with rows, per (8 consecutive edges, feature).
    fn work(&self) -> usize {
        match ROWS {
            true => self.0.n_edges.div_ceil(ROWS_EDGES_PER_THREAD) * self.0.hidden,
            false => self.0.n_edges * self.0.hidden,
        }
    }
    fn sizes(&self) -> Vec<usize> {
        self.0.list()
    }
    /// x = [phi, phi_bias, weights or rows, basis, sv]; out starts as sv.
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        forward_cpu(self.0, ROWS, x, idx, out)
    }
}

impl<const ROWS: bool> Kernel for Adjoint<ROWS> {
    const NAME: &'static str = if ROWS {
        "interaction_rows_adj"
    } else {
        "interaction_adj"
    };
    const MODULE: &'static str = "interaction";
    #[cfg(feature = "cuda")]
    const IMAGE: &'static [u8] = crate::ops::launch::kernel_image!("interaction");
    /// One thread per (edge, feature) with rows; without, one warp per edge and group of
    /// [`chunks_per_warp`](Self::chunks_per_warp) chunks of 32 features.
    fn work(&self) -> usize {
        self.0.n_edges
            * match ROWS {
                true => self.0.hidden,
                false => self.0.hidden.div_ceil(32).div_ceil(self.chunks_per_warp()) * 32,
            }
    }
    fn sizes(&self) -> Vec<usize> {
        let mut s = self.0.list();
        s.push(self.chunks_per_warp());
        s
    }
    /// x = [phi, phi_bias, weights or rows, basis, sv, g_s, g_v]; out = [g_v | g_phi | g_basis]
    /// and, with rows, g_w after it (g_basis then holds the unit-vector columns only).
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        let mode = AdjointMode {
            rows: ROWS,
            grad_rows: ROWS,
            grad_weights: false,
            symmetric: false,
            accumulate: false,
        };
        adjoint_cpu(self.0, mode, x, idx, out)
    }
}

/// Where the interaction takes each edge's filter W(r_e) \[3F\] from.
#[derive(Clone, Copy)]
pub enum EdgeFilter<'a> {
    /// The block's filter weights transposed, bias as last row, [R + 1, 3F]: the kernels form
    /// W(r_e) from the edge basis themselves.
    Weights(&'a Tensor),
    /// Precomputed rows [E, 3F] (basis · weights, a cuBLAS product).
    Rows(&'a Tensor),
}

/// The block's inputs that forward and adjoint share.
pub struct InteractionInputs<'a> {
    /// φ(s) before its last bias, [N, 3F].
    pub phi: &'a Tensor,
    /// That bias, \[3F\].
    pub phi_bias: &'a Tensor,
    /// The block's filter, as weights or precomputed rows.
    pub filter: EdgeFilter<'a>,
    /// Edge basis [E, R + 4] (`edge_basis`).
    pub basis: &'a Tensor,
    /// State entering the block, [4N, F].
    pub state: &'a Tensor,
    pub centers: &'a Tensor,
    pub neighbors: &'a Tensor,
    /// Every edge i <- j with offset o has its reverse j <- i with offset -o in the list (as
    /// neighbour lists hold them). Where the tiled kernels run (`interaction_tile`), the
    /// adjoint then sums each atom's sending gradients over its own run of edges instead
    /// of adding them edge by edge (`interaction_tile`), which leaves dL/d(basis) spread
    /// differently over each edge and its reverse (the same position gradients).
    pub symmetric_edges: bool,
    /// The thresholds that pick the kernels (tiles, warps per edge).
    pub tuning: &'a Tuning,
}

impl InteractionInputs<'_> {
    fn filter_tensor(&self) -> &Tensor {
        match self.filter {
            EdgeFilter::Weights(t) | EdgeFilter::Rows(t) => t,
        }
    }

    fn filter_dims(&self, e: usize, n_rbf: usize, f: usize) -> [usize; 2] {
        match self.filter {
            EdgeFilter::Weights(_) => [n_rbf + 1, 3 * f],
            EdgeFilter::Rows(_) => [e, 3 * f],
        }
    }

    fn sizes(&self) -> Result<Sizes> {
        let (n4, f) = self.state.dims2()?;
        let (e, bw) = self.basis.dims2()?;
        let n = n4 / 4;
        let n_rbf = bw.saturating_sub(4);
        if n4 % 4 != 0
            || self.phi.dims() != [n, 3 * f]
            || self.phi_bias.dims() != [3 * f]
            || self.filter_tensor().dims() != self.filter_dims(e, n_rbf, f)
            || bw < 5
            || self.centers.dims() != [e]
            || self.neighbors.dims() != [e]
        {
            bail!(
                "interaction: shapes state {:?}, phi {:?}, phi bias {:?}, filter {:?}, basis \
                 {:?}, edges {:?}/{:?} do not fit [4N, F], [N, 3F], [3F], [R+1 or E, 3F], [E, R+4], [E]",
                self.state.dims(),
                self.phi.dims(),
                self.phi_bias.dims(),
                self.filter_tensor().dims(),
                self.basis.dims(),
                self.centers.dims(),
                self.neighbors.dims()
            )
        }
        check_edges(self.centers, self.neighbors, n, "interaction")?;
        if bw > MAX_BASIS {
            bail!(
                "interaction: {n_rbf} radial functions; the fused kernels take at most \
                 {FUSED_MAX_RBF}"
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
    forward(x)
}

/// The forward's launch: the tiled kernels where [`tiled`] says, else one thread per edge and
/// feature (the filter formed in the kernel, or read from rows).
fn forward(x: &InteractionInputs) -> Result<Tensor> {
    let z = x.sizes()?;
    let inputs = [x.phi, x.phi_bias, x.filter_tensor(), x.basis, x.state];
    let (idx, shape) = ([x.centers, x.neighbors], x.state.shape());
    match x.filter {
        EdgeFilter::Weights(_) if tiled(&z, x, false) => launch(
            TileForward::new(z, x.state),
            &inputs,
            &idx,
            shape,
            Init::Copy(4),
        ),
        EdgeFilter::Weights(_) => launch(Forward::<false>(z), &inputs, &idx, shape, Init::Copy(4)),
        EdgeFilter::Rows(_) => launch(Forward::<true>(z), &inputs, &idx, shape, Init::Copy(4)),
    }
}

/// What [`interaction_adjoint`] returns.
pub struct InteractionGrads {
    /// dL/dv through the messages, [3N, F] (the identity part is not included).
    pub v: Tensor,
    /// dL/dφ, [N, 3F].
    pub phi: Tensor,
    /// dL/d(basis), [E, R + 4], plus the later blocks' where given: complete when
    /// `filter_rows` is None; else without `filter_rows` · Wtᵀ (which `complete_basis` adds).
    pub basis: Tensor,
    /// dL/d(filter rows) [E, 3F]: for [`EdgeFilter::Rows`], and for [`EdgeFilter::Weights`]
    /// where the tiled adjoint runs on CUDA cores (f64, or a list not said symmetric; on CUDA
    /// from [`Tuning::tile_from`] edges up to
    /// [`TILE_GRAD_ROWS_MAX_BYTES`](crate::ops::TILE_GRAD_ROWS_MAX_BYTES)); the tensor-core
    /// adjoint sums dL/d(basis) itself.
    pub filter_rows: Option<Tensor>,
    /// dL/d(filter weights) [R + 1, 3F], summed over the edges in the kernel
    /// ([`interaction_weight_adjoint`]).
    pub filter_weights: Option<Tensor>,
}

impl InteractionGrads {
    /// dL/d(basis) complete: `basis`, plus the product of the dL/dw rows (when the adjoint
    /// left them) with `filter_basis` [R + 4, 3F] transposed (the filter weights with zero rows
    /// for the unit-vector columns: basis · filter_basis = the filter rows).
    pub fn complete_basis(&self, filter_basis: &Tensor) -> Result<Tensor> {
        match &self.filter_rows {
            Some(g) => self.basis.add(&g.matmul(&filter_basis.t()?)?),
            None => Ok(self.basis.clone()),
        }
    }
}

/// Adjoint of [`interaction`] for the gradient of its output state: `g_s` [N, F] on its
/// scalar rows and `g_v` [3N, F] on its vector rows (whatever reaches them: the next layers'
/// and the mixing's); `g_basis_after` [E, R + 4] (the later blocks' dL/d(basis)), where given,
/// is added to the result's (in the kernel where it can: the symmetric-list adjoint).
pub fn interaction_adjoint(
    x: &InteractionInputs,
    g_s: &Tensor,
    g_v: &Tensor,
    g_basis_after: Option<&Tensor>,
) -> Result<InteractionGrads> {
    let z = x.sizes()?;
    let (n, f, e) = (z.n_atoms, z.hidden, z.n_edges);
    if g_s.dims() != [n, f] || g_v.dims() != [3 * n, f] {
        bail!(
            "interaction adjoint: gradients {:?} and {:?} do not fit [N, F] and [3N, F]",
            g_s.dims(),
            g_v.dims()
        )
    }
    let bw = basis_width(z.n_rbf);
    if let Some(g) = g_basis_after {
        if g.dims() != [e, bw] {
            bail!(
                "interaction adjoint: the later blocks' dL/d(basis) {:?} does not fit [E, R + 4] = [{e}, {bw}]",
                g.dims()
            )
        }
    }
    // Where the kernel did not add g_basis_after.
    let mut add_after = g_basis_after;
    let nf = n * f;
    let inputs = [
        x.phi,
        x.phi_bias,
        x.filter_tensor(),
        x.basis,
        x.state,
        g_s,
        g_v,
    ];
    let idx = [x.centers, x.neighbors];
    let zeroed = 6 * nf + e * bw;
    let (with_rows, init) = (zeroed + 3 * e * f, Init::ZeroPrefix(zeroed));
    let tile = tiled(&z, x, true);
    let (out, grad_rows) = match x.filter {
        EdgeFilter::Weights(_) if symmetric(&z, x) => {
            let [phi, pb, w, basis, state, ..] = inputs;
            // x.basis stands in (not read) where there is nothing to add.
            let after = add_after.take();
            let inputs = [phi, pb, w, basis, state, g_s, g_v, after.unwrap_or(x.basis)];
            let kernel = TileAdjoint::<true>::new(z, x.state).accumulating(after.is_some());
            match kernel.grad_rows() {
                true => (launch(kernel, &inputs, &idx, with_rows, init)?, true),
                false => (launch(kernel, &inputs, &idx, zeroed, Init::Zero)?, false),
            }
        }
        EdgeFilter::Weights(_) if tile => {
            let kernel = TileAdjoint::<false>::new(z, x.state);
            (launch(kernel, &inputs, &idx, with_rows, init)?, true)
        }
        EdgeFilter::Weights(_) => (
            launch(
                Adjoint::<false>::new(z, x.tuning),
                &inputs,
                &idx,
                zeroed,
                Init::Zero,
            )?,
            false,
        ),
        EdgeFilter::Rows(_) => (
            launch(
                Adjoint::<true>::new(z, x.tuning),
                &inputs,
                &idx,
                with_rows,
                init,
            )?,
            true,
        ),
    };
    let filter_rows = match grad_rows {
        true => Some(out.narrow(0, zeroed, 3 * e * f)?.reshape((e, 3 * f))?),
        false => None,
    };
    let basis = out.narrow(0, 6 * nf, e * bw)?.reshape((e, bw))?;
    Ok(InteractionGrads {
        v: out.narrow(0, 0, 3 * nf)?.reshape((3 * n, f))?,
        phi: out.narrow(0, 3 * nf, 3 * nf)?.reshape((n, 3 * f))?,
        basis: match add_after {
            Some(g) => (basis + g)?,
            None => basis,
        },
        filter_rows,
        filter_weights: None,
    })
}

/// [`interaction_adjoint`] for the weights' gradient of a block whose filter is formed from
/// its weights (`x.filter` [`EdgeFilter::Weights`]) over a list holding every edge's reverse:
/// dL/dW [R + 1, 3F] summed over the edges inside the kernel (the symmetric tiled adjoint on
/// CUDA cores; no [E, 3F] rows are made), dL/dφ and dL/dv as [`interaction_adjoint`] gives
/// them; dL/d(basis) holds its unit-vector columns only (there is no position gradient).
pub fn interaction_weight_adjoint(
    x: &InteractionInputs,
    g_s: &Tensor,
    g_v: &Tensor,
) -> Result<InteractionGrads> {
    let z = x.sizes()?;
    let (n, f, e, nb) = (z.n_atoms, z.hidden, z.n_edges, z.n_rbf + 1);
    if g_s.dims() != [n, f] || g_v.dims() != [3 * n, f] {
        bail!(
            "interaction weight adjoint: gradients {:?} and {:?} do not fit [N, F] and [3N, F]",
            g_s.dims(),
            g_v.dims()
        )
    }
    let EdgeFilter::Weights(w) = x.filter else {
        bail!("interaction weight adjoint: the filter must be formed from its weights")
    };
    if !x.symmetric_edges {
        bail!("interaction weight adjoint: the edge list must hold every edge's reverse")
    }
    let bw = basis_width(z.n_rbf);
    let (nf, gb_len) = (n * f, e * bw);
    // x.basis stands in for the later blocks' dL/d(basis), not read.
    let inputs = [x.phi, x.phi_bias, w, x.basis, x.state, g_s, g_v, x.basis];
    let idx = [x.centers, x.neighbors];
    let kernel = TileAdjoint::<true>::new(z, x.state).reducing_weights();
    let len = 6 * nf + gb_len + nb * 3 * f;
    let out = launch(kernel, &inputs, &idx, len, Init::Zero)?;
    Ok(InteractionGrads {
        v: out.narrow(0, 0, 3 * nf)?.reshape((3 * n, f))?,
        phi: out.narrow(0, 3 * nf, 3 * nf)?.reshape((n, 3 * f))?,
        basis: out.narrow(0, 6 * nf, gb_len)?.reshape((e, bw))?,
        filter_rows: None,
        filter_weights: Some(
            out.narrow(0, 6 * nf + gb_len, nb * 3 * f)?
                .reshape((nb, 3 * f))?,
        ),
    })
}
