//! The first interaction block by sums per sending element (kernels/layers/element_sums.cu, whose
//! comment gives the maths). In the first block the context φ_j + b depends only on atom j's
//! element and the vector features are zero, so the block's messages are one product of
//! per-atom sums of basis rows per sending element, [4N, elements (R + 1)], with the filter
//! weights times each element's context (and of one-hot columns of the atom's own element with
//! the embedding, which adds the initial state): no per-edge, per-feature work at all. [`element_sums`] makes the sums,
//! [`element_sums_position_adjoint`] takes their gradient back through the edges' basis rows to
//! the positions.

use crate::ops::launch::{check_edges, check_elements, kernel_source, launch, overlaps_previous};
use crate::ops::launch::{Init, Kernel, Real};
use crate::ops::layers::edge_basis::{add_edge_grad, basis_width, check_geometry, Geometry};
use candle_core::{bail, Result, Tensor};

/// Most elements the kernels take (a bit per element marks a run's elements).
pub const ELEMENT_SUMS_MAX_ELEMENTS: usize = 32;

/// Shared memory one block's warps may hold for their sums (the default limit, no opt-in).
#[cfg(feature = "cuda")]
const SMEM_BYTES: usize = 48 << 10;

#[derive(Clone, Copy)]
struct Sizes {
    n_edges: usize,
    n_atoms: usize,
    elements: usize,
    n_rbf: usize,
}

impl Sizes {
    fn list(&self) -> Vec<usize> {
        vec![self.n_edges, self.n_atoms, self.elements, self.n_rbf]
    }

    /// Columns of a sums gradient row: elements × (R + 1).
    fn width(&self) -> usize {
        self.elements * (self.n_rbf + 1)
    }

    /// Columns of a sums row: the gradient's, then the atom's own element one-hot.
    fn width_with_element(&self) -> usize {
        self.width() + self.elements
    }

    /// Edge e's receiver, its sending atom's element, and its basis row.
    fn edge<'a, T>(&self, e: usize, basis: &'a [T], idx: &[&[u32]]) -> (usize, usize, &'a [T]) {
        let bw = basis_width(self.n_rbf);
        let (i, j) = (idx[0][e] as usize, idx[1][e] as usize);
        (i, idx[2][j] as usize, &basis[e * bw..(e + 1) * bw])
    }

    /// Warps of 32 edges each: blocks of up to 8 warps, as many as the sums' shared memory
    /// (elements × 4 × 32 values a warp) leaves room for.
    #[cfg(feature = "cuda")]
    fn config(
        &self,
        smem_per_warp: usize,
    ) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        let warps = (SMEM_BYTES / smem_per_warp.max(1)).clamp(1, 8);
        let blocks = self.n_edges.div_ceil(32 * warps).clamp(1, 65535 * 8);
        candle_core::cuda_backend::cudarc::driver::LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (32 * warps as u32, 1, 1),
            shared_mem_bytes: (warps * smem_per_warp) as u32,
        }
    }
}

struct Forward(Sizes);

impl Kernel for Forward {
    overlaps_previous!();
    kernel_source!("element_sums_fwd", "element_sums");
    /// (Every atom, edges or none, gets its element's one-hot.)
    fn work(&self) -> usize {
        self.0.n_edges.max(self.0.n_atoms)
    }
    fn sizes(&self) -> Vec<usize> {
        self.0.list()
    }
    /// x = [basis]; idx = [centers, neighbors, species] → [4N, elements (R + 2)] (zeroed).
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        let (z, nb) = (self.0, self.0.n_rbf + 1);
        let (n, k) = (z.n_atoms, z.width_with_element());
        for (i, &el) in idx[2].iter().enumerate() {
            out[i * k + z.width() + el as usize] = T::one();
        }
        for e in 0..z.n_edges {
            let (i, el, b) = z.edge(e, x[0], idx);
            for p in 0..4 {
                let row = &mut out[(p * n + i) * k + el * nb..][..nb];
                let times = if p == 0 { T::one() } else { b[nb + p - 1] };
                for (o, &br) in row.iter_mut().zip(b) {
                    *o += br * times;
                }
            }
        }
    }
    #[cfg(feature = "cuda")]
    fn launch_config(
        &self,
        elem_bytes: usize,
    ) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        self.0.config(self.0.elements * 4 * 32 * elem_bytes)
    }
}

struct PositionAdjoint {
    sizes: Sizes,
    cutoff: f64,
    /// The later blocks' dL/d(basis) rows come as input 2.
    accumulate: bool,
    /// The atoms' virials after their gradients, [4N, 3] ([`add_edge_grad`]).
    virial: bool,
}

impl Kernel for PositionAdjoint {
    overlaps_previous!();
    kernel_source!("element_sums_position_adj", "element_sums");
    fn function(&self) -> &'static str {
        match (self.accumulate, self.virial) {
            (true, false) => "element_sums_position_adj_acc",
            (false, false) => Self::NAME,
            (true, true) => "element_sums_virial_adj_acc",
            (false, true) => "element_sums_virial_adj",
        }
    }
    fn work(&self) -> usize {
        self.sizes.n_edges
    }
    fn sizes(&self) -> Vec<usize> {
        self.sizes.list()
    }
    fn reals(&self) -> Vec<f64> {
        vec![self.cutoff]
    }
    /// x = [positions, offsets, (later rows [E, R + 4]), dL/dS [N, K], dL/dU [3N, K]] →
    /// dL/d(positions) [N, 3] (zeroed): each edge's basis gradient row, as the sums give it,
    /// through [`Geometry::grad`].
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        let z = self.sizes;
        let (nb, bw) = (z.n_rbf + 1, basis_width(z.n_rbf));
        let (n, k) = (z.n_atoms, z.width());
        let geometry = Geometry {
            n_edges: z.n_edges,
            n_rbf: z.n_rbf,
            cutoff: self.cutoff,
        };
        let grads = &x[x.len() - 2..];
        let (mut b, mut row) = (vec![T::zero(); bw], vec![T::zero(); bw]);
        for e in 0..z.n_edges {
            let (i, j) = (idx[0][e] as usize, idx[1][e] as usize);
            let col = idx[2][j] as usize * nb;
            geometry.basis(x[0], x[1], (i, j, e), &mut b);
            match self.accumulate {
                true => row.copy_from_slice(&x[2][e * bw..(e + 1) * bw]),
                false => row.fill(T::zero()),
            }
            let plain = &grads[0][i * k + col..][..nb];
            let unit: [&[T]; 3] = std::array::from_fn(|a| &grads[1][(a * n + i) * k + col..][..nb]);
            for r in 0..nb {
                row[r] += plain[r];
                for a in 0..3 {
                    row[r] += b[nb + a] * unit[a][r];
                    row[nb + a] += b[r] * unit[a][r];
                }
            }
            let gr = geometry.grad(x[0], x[1], (i, j, e), &row);
            add_edge_grad(out, (x[0], x[1]), (i, j, e), gr, self.virial.then_some(n));
        }
    }
}

/// Checks what both directions take beyond the edge list (which each checks against its atom
/// count once): the element count, the basis width, the atoms' element indices; the sizes.
fn sizes(
    n_edges: usize,
    species: &Tensor,
    elements: usize,
    n_rbf: usize,
    op: &str,
) -> Result<Sizes> {
    let n_atoms = species.dims1()?;
    if elements == 0 || elements > ELEMENT_SUMS_MAX_ELEMENTS {
        bail!("{op}: {elements} elements (1 to {ELEMENT_SUMS_MAX_ELEMENTS})")
    }
    if n_rbf + 4 > 32 {
        bail!("{op}: {n_rbf} radial functions (a warp holds R + 4 <= 32 columns)")
    }
    check_elements(species, elements, op)?;
    Ok(Sizes {
        n_edges,
        n_atoms,
        elements,
        n_rbf,
    })
}

/// Per receiving atom i and sending element z, the basis rows b of its edges summed, plain and
/// times each component of the edge's unit vector: [4N, elements (R + 2)], row p N + i (p: the
/// plain sum, then x, y, z), columns z (R + 1) + r; the plain row's last `elements` columns are
/// atom i's own element, one-hot (so that one product with the weights also adds the
/// embedding), zero in the other rows. `basis` [E, R + 4] as
/// [`edge_basis`](crate::ops::layers::edge_basis) makes it, the edges i ← j (`centers`, `neighbors`, u32
/// [E]) in any order, `species` the atoms' element indices (u32 [N], below `elements`).
pub fn element_sums(
    basis: &Tensor,
    centers: &Tensor,
    neighbors: &Tensor,
    species: &Tensor,
    elements: usize,
    n_rbf: usize,
) -> Result<Tensor> {
    let op = "element sums";
    check_edges(centers, neighbors, species.dims1()?, op)?;
    let z = sizes(centers.dim(0)?, species, elements, n_rbf, op)?;
    let bw = basis_width(n_rbf);
    if basis.dims() != [z.n_edges, bw] {
        bail!(
            "{op}: basis {:?} must be [E = {}, {bw}]",
            basis.dims(),
            z.n_edges
        )
    }
    let shape = (4 * z.n_atoms, z.width_with_element());
    launch(
        Forward(z),
        &[basis],
        &[centers, neighbors, species],
        shape,
        Init::Zero,
    )
}

/// The sums' gradients through [`element_sums`] and [`edge_basis`](crate::ops::layers::edge_basis) to the
/// positions: dL/d(positions) [N, 3] from the gradients of the plain sums `g_plain` [N,
/// elements (R + 1)] and of the unit-vector sums `g_unit` [3N, elements (R + 1)] (the sums'
/// columns without the one-hot), plus the later blocks' dL/d(basis) `later` [E, R + 4] where
/// given. One kernel: the basis rows are formed again, no gradient row is written.
#[allow(clippy::too_many_arguments)]
pub fn element_sums_position_adjoint(
    positions: &Tensor,
    offsets: &Tensor,
    later: Option<&Tensor>,
    g_plain: &Tensor,
    g_unit: &Tensor,
    edges: (&Tensor, &Tensor),
    species: &Tensor,
    elements: usize,
    (n_rbf, cutoff): (usize, f64),
) -> Result<Tensor> {
    sums_adjoint(
        positions,
        offsets,
        later,
        (g_plain, g_unit),
        edges,
        (species, elements),
        (n_rbf, cutoff),
        false,
    )
}

/// [`element_sums_position_adjoint`] and (`virial`) each atom's virial Σ_{e: i ← j} r_e ⊗
/// dL/dr_e (r = x_j − x_i + offset) in 3 rows after the atoms' gradients: [4N, 3].
#[allow(clippy::too_many_arguments)]
pub(crate) fn sums_adjoint(
    positions: &Tensor,
    offsets: &Tensor,
    later: Option<&Tensor>,
    (g_plain, g_unit): (&Tensor, &Tensor),
    edges: (&Tensor, &Tensor),
    (species, elements): (&Tensor, usize),
    (n_rbf, cutoff): (usize, f64),
    virial: bool,
) -> Result<Tensor> {
    let op = "element sums position adjoint";
    let (centers, neighbors) = edges;
    if positions.dim(0)? != species.dims1()? {
        bail!(
            "{op}: positions {:?} for {} atoms' elements",
            positions.dims(),
            species.dims1()?
        )
    }
    // (The edges are checked against the positions here.)
    let n_edges = check_geometry(positions, offsets, centers, neighbors, n_rbf, op)?;
    let z = sizes(n_edges, species, elements, n_rbf, op)?;
    let (n, k) = (z.n_atoms, z.width());
    for (name, t, rows) in [("dL/dS", g_plain, n), ("dL/dU", g_unit, 3 * n)] {
        if t.dims() != [rows, k] {
            bail!("{op}: {name} {:?} must be [{rows}, {k}]", t.dims())
        }
    }
    let bw = basis_width(n_rbf);
    if let Some(g) = later {
        if g.dims() != [n_edges, bw] {
            bail!(
                "{op}: the later blocks' dL/d(basis) {:?} must be [{n_edges}, {bw}]",
                g.dims()
            )
        }
    }
    let mut inputs = vec![positions, offsets];
    inputs.extend(later);
    inputs.extend([g_plain, g_unit]);
    let kernel = PositionAdjoint {
        sizes: z,
        cutoff,
        accumulate: later.is_some(),
        virial,
    };
    let shape = match virial {
        true => (4 * n, 3).into(),
        false => positions.shape().clone(),
    };
    launch(
        kernel,
        &inputs,
        &[centers, neighbors, species],
        &shape,
        Init::Zero,
    )
}
