//! PaiNN energies and forces with fused kernels and an explicit adjoint pass.
//!
//! The forward keeps what the adjoint needs (a tape of per-atom tensors) and the adjoint is
//! written out by hand: edge basis → (φ MLP, interaction, mixing, context MLP, combine) × blocks
//! → readout, then back. candle's backprop would add a zeros + add pair for every input of every
//! op and compute weight gradients that inference never uses; here a call is 40 launches
//! (64 aspirins on a GPU; 22 from 2,000 atoms, where the update block is one launch each way)
//! instead of ~1,000. Below [`FILTER_ROWS_FROM_EDGES`] edges no [E, F]-sized tensor exists at
//! all (the filter is formed inside the interaction kernels); from there on each block's filter
//! rows W(r) [E, 3F] are one cuBLAS product, kept for the adjoint up to
//! [`FILTER_ROWS_KEEP_BYTES`] for all blocks together and made again beyond. On CUDA the
//! filter is formed in the tiled kernels again: in f32 at every size they take (no rows at
//! all), on tensor cores, their adjoint summing dL/d(basis) itself; in f64 from
//! [`FILTER_ROWS_UNTIL_EDGES`], on CUDA cores, their adjoint leaving dL/dw as rows for one
//! product per block. Forces only: the weights are read once (`FusedPainn::new`), so this path
//! is for inference; training differentiates the graph of `Painn::atom_energies`.
//!
//! The first block runs as sums per sending element ([`FirstBlockSums`], `ops::element_sums`):
//! its context is its sender's element's and its vector features are zero, so per-atom sums of
//! basis rows times precomputed weights (one cuBLAS product) give its messages exactly, and its
//! adjoint ends in the forces in one kernel, with no per-edge, per-feature work at all
//! (`MLFF_FIRST_BLOCK_SUMS=0` or [`FusedPainn::with_first_block_sums`] runs it per edge).
//!
//! State tensors are component-major [4N, F] (s, then v_x, v_y, v_z), so that s and v are
//! contiguous row ranges that cuBLAS takes without copies.

use super::painn::{Painn, PainnInputs};
use crate::device::{env_usize, env_usize_set};
use crate::ops::{
    act_grad, atom_split, bias_silu, bias_silu_adjoint, dense, dense_on_tensor_cores, dense_silu,
    dense_silu_adjoint, dense_tc, dense_tc_adding, dense_tc_fits, edge_basis, edge_basis_adjoint,
    element_sums, element_sums_position_adjoint, gather, initial_state, interaction,
    interaction_adjoint, mlp_tc, mlp_tc_adjoint, readout_tc, small_system, tc_weights,
    update_combine, update_combine_adjoint, update_context, update_context_adjoint, update_tc,
    update_tc_adjoint, AtomSplitPlan, EdgeFilter, InteractionInputs, SmallSystemModel,
    SmallSystemPlan, StateGrad, TcWeights, UpdateOutputs, ATOM_SPLIT_MAX_ATOMS_CUDA_CORES,
    DENSE_MAX_WIDTH, ELEMENT_SUMS_MAX_ELEMENTS, UPDATE_TC_FEATURES,
};
use candle_core::{Result, Tensor};
use candle_nn::Linear;
use std::sync::OnceLock;

/// A linear layer as (weight [out, in], bias [out]).
#[derive(Clone)]
struct Dense {
    weight: Tensor,
    bias: Tensor,
}

impl Dense {
    fn of(l: &Linear) -> Result<Self> {
        let bias = match l.bias() {
            Some(b) => b.detach(),
            None => Tensor::zeros(l.weight().dim(0)?, l.weight().dtype(), l.weight().device())?,
        };
        Ok(Self {
            weight: l.weight().detach(),
            bias,
        })
    }

    /// x Wᵀ without the bias (the next fused kernel adds it).
    fn product(&self, x: &Tensor) -> Result<Tensor> {
        x.matmul(&self.weight.t()?)
    }

    /// dL/dx of [`product`](Self::product) for dL/d(output) `g`.
    fn product_adjoint(&self, g: &Tensor) -> Result<Tensor> {
        g.matmul(&self.weight)
    }
}

/// Two linear layers with SiLU between them, out(silu(hidden(x))); the output's bias is left to
/// the kernel that consumes it.
#[derive(Clone)]
struct Mlp {
    hidden: Dense,
    out: Dense,
    /// The weights transposed, [in, H] and [H, out], for the dense kernels.
    hidden_t: Tensor,
    out_t: Tensor,
    /// hidden, out, out_t and hidden_t as the tensor-core kernels read them, on first use.
    tc: OnceLock<[TcWeights; 4]>,
}

/// `weights` as `ops::tc_weights` makes them, made once into `cell` (on first use, which a
/// CUDA graph's warm-up calls make before its capture: no allocation inside it).
fn tc_once<'a, const K: usize>(
    cell: &'a OnceLock<[TcWeights; K]>,
    weights: [&Tensor; K],
) -> Result<&'a [TcWeights; K]> {
    if let Some(s) = cell.get() {
        return Ok(s);
    }
    let mut parts = Vec::with_capacity(K);
    for w in weights {
        parts.push(tc_weights(w)?);
    }
    let made: [TcWeights; K] = parts
        .try_into()
        .map_err(|_| candle_core::Error::Msg("tensor-core weights: weight count".into()))?;
    Ok(cell.get_or_init(|| made))
}

impl Mlp {
    fn new(hidden: Dense, out: Dense) -> Result<Self> {
        Ok(Self {
            hidden_t: hidden.weight.t()?.contiguous()?,
            out_t: out.weight.t()?.contiguous()?,
            hidden,
            out,
            tc: OnceLock::new(),
        })
    }

    fn tc(&self) -> Result<&[TcWeights; 4]> {
        let ws = [
            &self.hidden.weight,
            &self.out.weight,
            &self.out_t,
            &self.hidden_t,
        ];
        tc_once(&self.tc, ws)
    }

    /// Whether both layers of the forward (`adjoint` false) or of the adjoint, which reduces
    /// over the outputs, fit the tensor-core kernels.
    fn fits_tensor_cores(&self, adjoint: bool) -> Result<bool> {
        let (h, k) = self.hidden.weight.dims2()?;
        let j = self.out.weight.dim(0)?;
        Ok(match adjoint {
            false => dense_tc_fits(k, h) && dense_tc_fits(h, j),
            true => dense_tc_fits(j, h) && dense_tc_fits(h, k),
        })
    }

    /// (pre-activation x W₁ᵀ, output before its bias): our dense kernels (two launches), the
    /// tensor-core MLP (one), or cuBLAS and the bias+SiLU kernel (three).
    fn forward(&self, x: &Tensor, path: DensePath) -> Result<(Tensor, Tensor)> {
        match path {
            DensePath::Small => {
                let n = x.dim(0)?;
                let packed = dense_silu(x, &self.hidden_t, &self.hidden.bias)?;
                let out = dense(&packed.narrow(0, n, n)?, &self.out_t)?;
                Ok((packed.narrow(0, 0, n)?, out))
            }
            DensePath::TensorCores if self.fits_tensor_cores(false)? => {
                let [w1, w2, ..] = self.tc()?;
                mlp_tc(x, w1, &self.hidden.bias, w2)
            }
            _ => {
                let pre = self.hidden.product(x)?;
                let out = self.out.product(&bias_silu(&pre, &self.hidden.bias)?)?;
                Ok((pre, out))
            }
        }
    }

    /// dL/dx for dL/d(hidden activation) `g_h` ([N, H] or one row for all).
    fn adjoint_from_hidden(&self, pre: &Tensor, g_h: &Tensor, path: DensePath) -> Result<Tensor> {
        if path == DensePath::Small {
            return dense_silu_adjoint(g_h, pre, &self.hidden.bias, &self.hidden.weight);
        }
        self.hidden
            .product_adjoint(&bias_silu_adjoint(pre, &self.hidden.bias, g_h)?)
    }

    /// dL/dx for dL/d(output) `g_out`.
    fn adjoint(&self, pre: &Tensor, g_out: &Tensor, path: DensePath) -> Result<Tensor> {
        let g_h = match path {
            DensePath::Small => dense(g_out, &self.out.weight)?,
            DensePath::TensorCores if self.fits_tensor_cores(true)? => {
                let [_, _, w2t, w1t] = self.tc()?;
                return mlp_tc_adjoint(g_out, pre, &self.hidden.bias, w2t, w1t);
            }
            _ => self.out.product_adjoint(g_out)?,
        };
        self.adjoint_from_hidden(pre, &g_h, path)
    }
}

/// How the dense layers of a pass run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DensePath {
    /// Our row-block kernels (kernels/dense.cu), for molecule-sized inputs.
    Small,
    /// Tensor cores (kernels/dense_tc.cu), an MLP in one launch; layers whose shapes the
    /// kernels do not take (the readout's single output) run as `Matmul`.
    TensorCores,
    /// candle's matmul (cuBLAS on CUDA) and the bias+SiLU kernels.
    Matmul,
}

/// Rows up to which the dense layers run as our single kernels on CUDA (on an H100 they were
/// faster up to ~1,000 rows for 16 aspirins and slower at 1,000-4,000: BENCHMARKS.md); above it
/// cuBLAS, and always candle's matmul on the CPU, whose gemm beats the kernels' CPU twins. The
/// environment variable MLFF_DENSE_KERNEL_ROWS overrides it (0: off, for comparisons).
pub const DENSE_KERNEL_MAX_ROWS: usize = 512;

/// Rows from which, and up to which, the dense layers run on tensor cores (`ops::dense_tc`: f32
/// on CUDA, an MLP in one launch) instead of cuBLAS, where their shapes fit. On an H100 they
/// beat cuBLAS with the bias+SiLU kernels at 1,000-4,000 rows; with weights split in the
/// kernels (2026-11-24) also at 10,000 atoms, whose mixing layer has 29,997 rows (replayed 6.02
/// against 6.12-6.15 ms); more rows were not measured (BENCHMARKS.md).
/// MLFF_DENSE_TC_FROM_ROWS and MLFF_DENSE_TC_UNTIL_ROWS change them; MLFF_DENSE_TENSOR_CORES=0
/// turns them off.
pub const DENSE_TENSOR_CORES_FROM_ROWS: usize = DENSE_KERNEL_MAX_ROWS + 1;
pub const DENSE_TENSOR_CORES_UNTIL_ROWS: usize = 30_000;

/// Atoms from which the update block runs in one launch on CUDA (forward and adjoint,
/// `ops::update_tc`) instead of four. On an H200 (BENCHMARKS.md) one launch took a 10,000-atom
/// call 3.83-3.84 → 3.59-3.64 ms and water-3000 1.27 → 1.19-1.22 ms; at 64 aspirins (1,344
/// atoms) and water-1000 the replayed calls measured the same and the eager ones slower in three
/// of four alternations (by 19-64 µs; not explained). Sizes between 1,344 and 3,000 atoms were
/// not measured.
pub const UPDATE_IN_ONE_LAUNCH_FROM_ATOMS: usize = 2_000;

/// Atoms up to which a system on CUDA runs as one kernel (`ops::small_system`) when its layer
/// inputs fit in shared memory. On an H100 the one kernel (aspirin 0.196 ms per eager call at
/// 64 thread blocks) beats the separate kernels launched one by one (0.47-0.54 ms) and their
/// CUDA-graph replay (0.25 ms); graphs ([`crate::graph`]) still capture the separate kernels
/// (see `graph::Parts::step`), eager calls take the one kernel (BENCHMARKS.md).
/// MLFF_ONE_KERNEL_ATOMS or [`FusedPainn::with_one_kernel_up_to`] change the limit (0: never).
pub const ONE_KERNEL_MAX_ATOMS: usize = 64;

/// Atoms from which, and up to which, a system on CUDA runs as the atom-split kernel
/// (`ops::atom_split`: atoms split over the blocks, 4 barriers instead of the feature split's
/// 30) where it fits (up to two atoms per multiprocessor on CUDA cores; more only with tensor
/// cores asked for, MLFF_ATOM_SPLIT_TENSOR_CORES=1), before the feature-split one kernel is
/// considered. On an H100 it beats the feature split from trialanine (42 atoms: 0.232 ms
/// against 0.35) and the separate kernels at 84-252 atoms, but not on smaller molecules
/// (aspirin 0.204-0.207 against 0.199; BENCHMARKS.md, "Atoms split, second kernel" and "up to
/// 16 atoms per block").
/// MLFF_ATOM_SPLIT_MIN_ATOMS, MLFF_ATOM_SPLIT_ATOMS or [`FusedPainn::with_atom_split`] change
/// them (a maximum of 0: never).
pub const ATOM_SPLIT_MIN_ATOMS: usize = 32;
pub const ATOM_SPLIT_MAX_ATOMS: usize = usize::MAX;

/// Thread blocks the one kernel is split over where the device has the multiprocessors and
/// the split fits its shared memory (fewer otherwise: [`SmallSystemPlan::fit_widest`]). More
/// blocks each own fewer features, so the per-block work shrinks while the barriers stay:
/// aspirin on an H100 278 µs at 16 and 206 at 64 back to back (commit 8a97677), 128 slower
/// than 64 (BENCHMARKS.md). MLFF_ONE_KERNEL_BLOCKS changes it.
pub const ONE_KERNEL_MAX_BLOCKS: usize = 64;

/// Edge count from which the filter rows are a matrix product instead of being formed per
/// edge and feature inside the interaction kernels, for an [E, 3F] buffer per block kept for
/// the adjoint. On an H100 (BENCHMARKS.md), against the untiled kernels: 12-15% faster at
/// 54,000-541,000 edges when the rows were made again in the adjoint; kept, also ~21% at
/// 17,000-19,000 edges (64 aspirins, 300 waters) and within the noise at 4,700.
/// `MLFF_FILTER_ROWS_FROM_EDGES` changes it.
pub const FILTER_ROWS_FROM_EDGES: usize = 8192;

/// Edge count from which CUDA goes back to the filter formed in the kernels, there the tiled
/// kernels (`ops::interaction`, kernels/interaction_tile.cu: no forward product, no rows kept,
/// half the memory), where those form their filters on CUDA cores (f64, or
/// `MLFF_INTERACTION_TILE_TC=0`). On an H100 (BENCHMARKS.md, replayed): rows faster up to
/// 81,000 edges (water-1500 2.04-2.06 against 2.11-2.12 ms, water-1000 1.38-1.40 against
/// 1.44-1.46), tiled from 162,000 (water-3000 3.27-3.28 against 3.51-3.52, water-10000
/// 9.06-9.10 against 10.84-10.85, before the symmetric adjoint); 100,000 itself not measured.
/// In f32 the tiled kernels form their filters on tensor cores and beat the rows at every size
/// measured (64 aspirins 0.71 against 0.81 ms, water-1000 0.97-0.98 against 1.38, replayed):
/// there the rows are not made at all (the tiles run from [`crate::ops::TILE_TC_FROM_EDGES`]).
/// `MLFF_FILTER_ROWS_UNTIL_EDGES` sets the edge count for every precision. The CPU keeps the
/// rows at any size.
pub const FILTER_ROWS_UNTIL_EDGES: usize = 100_000;

/// Largest filter-rows buffer made (bytes); beyond it the kernels form the filter themselves,
/// so that very large systems keep the O(N·F + E·R) memory of that path.
pub const FILTER_ROWS_MAX_BYTES: usize = 2 << 30;

/// Filter rows of all blocks together up to this many bytes are kept from the forward pass
/// for the adjoint instead of being made again (one product per block less; 2.5 GB at 10,000
/// atoms of water). `MLFF_FILTER_ROWS_KEEP_BYTES` changes it (0: always made again).
pub const FILTER_ROWS_KEEP_BYTES: usize = 3 << 30;

#[derive(Clone)]
struct Block {
    /// Filter weights transposed, bias as last row: [R + 1, 3F].
    filter: Tensor,
    /// The same with three zero rows for the unit-vector columns of the basis, [R + 4, 3F]:
    /// basis · this = the filter rows.
    filter_basis: Tensor,
    /// φ: F → F → 3F.
    phi: Mlp,
    /// W_mix [2F, F] (no bias), and transposed.
    mix: Tensor,
    mix_t: Tensor,
    /// Both as the tensor-core kernels read them, on first use.
    mix_tc: OnceLock<[TcWeights; 2]>,
    /// The update's context network: 2F → F → 3F.
    ctx: Mlp,
}

impl Block {
    /// W_mix and its transpose as the tensor-core kernels read them (made on first use).
    fn mix_tc(&self) -> Result<&[TcWeights; 2]> {
        tc_once(&self.mix_tc, [&self.mix, &self.mix_t])
    }
}

/// The weights of a [`Painn`] arranged for the fused kernels.
#[derive(Clone)]
pub struct FusedPainn {
    hidden: usize,
    n_rbf: usize,
    cutoff: f64,
    embedding: Tensor,
    blocks: Vec<Block>,
    /// Readout F → F/2 → 1, its output weights times the scale (its bias is in
    /// `atom_constant`).
    readout: Mlp,
    /// Minus the readout's output weights [1, F/2]: the gradient of −E at its hidden layer,
    /// whose adjoint (linear in it) ends in the forces with no negation after.
    readout_force_seed: Tensor,
    /// Per element: atom reference + output bias × scale + shift, [n_elements].
    atom_constant: Tensor,
    /// Filter rows by a matrix product from this many edges on.
    rows_from_edges: usize,
    /// ... and on CUDA up to (excluding) this many; None: [`FILTER_ROWS_UNTIL_EDGES`], or
    /// none at all where the tiled kernels run on tensor cores.
    rows_until_edges: Option<usize>,
    /// Filter rows of all blocks up to this many bytes are kept for the adjoint.
    keep_rows_bytes: usize,
    /// Our dense kernels for layers of at most this many rows (CUDA, and the CPU when set).
    dense_kernel_rows: usize,
    dense_on_cpu: bool,
    /// Tensor-core dense layers for these row counts (f32 on CUDA; their CPU twins where
    /// `tensor_cores_on_cpu`, for tests).
    tensor_core_rows: std::ops::RangeInclusive<usize>,
    tensor_cores_on_cpu: bool,
    /// Systems of up to this many atoms run as one kernel on CUDA (0: never).
    one_kernel_atoms: usize,
    /// Thread blocks the one kernel is split over at most.
    one_kernel_blocks: usize,
    /// Systems of this many atoms run as the atom-split kernel on CUDA where it fits.
    atom_split_atoms: std::ops::RangeInclusive<usize>,
    /// Tensor cores for the atom split's dense layers: None (the default) takes the atom split
    /// only up to `ops::ATOM_SPLIT_MAX_ATOMS_CUDA_CORES` atoms per block, on CUDA cores; Some
    /// (MLFF_ATOM_SPLIT_TENSOR_CORES=0|1) forces them off or on, on forcing them on at up to
    /// `ops::ATOM_SPLIT_MAX_ATOMS_PER_BLOCK` atoms per block (slower than the other paths where
    /// measured, BENCHMARKS.md; for measurements).
    atom_split_tensor_cores: Option<bool>,
    /// The weights packed for the one-kernel paths, input-major and output-major, on first use.
    packed: std::sync::OnceLock<Tensor>,
    packed_out_major: std::sync::OnceLock<Tensor>,
    /// The first block's φ (before its output bias) per element, on first use.
    first_phi: std::sync::OnceLock<Tensor>,
    /// The first block's messages by sums per sending element ([`FirstBlockSums`]).
    first_block_sums: bool,
    first_sums: std::sync::OnceLock<FirstBlockSums>,
}

/// The first interaction block as sums per sending element (`ops::element_sums`): its context
/// φ_j + b is the element's and its vector features are zero, so its messaged state is the
/// per-atom sums of basis rows [4, N, K + elements] times these, made once: the filter
/// weights' scalar (s) and direction (d) parts times each element's context, [K = elements
/// (R + 1), F] (row z (R + 1) + r: W[r, part] ⊙ ctx_z[part]), and for the sums' one-hot
/// columns the embedding (s) or zeros (v), so that the initial state is added in the product.
#[derive(Clone)]
struct FirstBlockSums {
    /// [4, K + elements, F]: the s part for the plain sums, the d part for each unit-vector
    /// component.
    product: Tensor,
    /// The s and d parts transposed, [F, K] each (the adjoint's products).
    scalar_t: Tensor,
    direction_t: Tensor,
}

/// What one block's adjoint reads from its forward.
struct Tape {
    /// The block's input state; None where the block ran as sums per element.
    state: Option<Tensor>,
    /// φ's pre-activation, except in the first block (gathered per element, no adjoint).
    phi_pre: Option<Tensor>,
    /// φ's output; None where the block ran as sums per element ([`FirstBlockSums`]).
    phi: Option<Tensor>,
    mixed: Tensor,
    ctx_pre: Tensor,
    act: Tensor,
    /// The block's filter rows, when kept for the adjoint.
    rows: Option<Tensor>,
}

/// What the forces' adjoint takes from the readout: its pre-activation, or (on tensor cores,
/// where one launch gives both) the gradient of −E at its input already.
enum ReadoutTape {
    Pre(Tensor),
    Seed(Tensor),
}

impl FusedPainn {
    pub fn new(model: &Painn) -> Result<Self> {
        let cfg = model.config();
        let (f, r) = (cfg.hidden, cfg.n_rbf);
        if r > crate::ops::FUSED_MAX_RBF {
            candle_core::bail!(
                "the model has {r} radial functions; the fused kernels (--ops fused, the default) \
                 take at most {}: run it with --ops custom, or train with n_rbf <= {}",
                crate::ops::FUSED_MAX_RBF,
                crate::ops::FUSED_MAX_RBF
            )
        }
        let filter = Dense::of(&model.filter)?;
        let mut blocks = Vec::with_capacity(cfg.n_blocks);
        for (k, (m, u)) in model.messages.iter().zip(&model.updates).enumerate() {
            let w = filter.weight.narrow(0, 3 * f * k, 3 * f)?; // [3F, R]
            let b = filter.bias.narrow(0, 3 * f * k, 3 * f)?.unsqueeze(0)?;
            let filter = Tensor::cat(&[&w.t()?, &b], 0)?.contiguous()?;
            let zeros = Tensor::zeros((3, 3 * f), filter.dtype(), filter.device())?;
            blocks.push(Block {
                filter_basis: Tensor::cat(&[&filter, &zeros], 0)?.contiguous()?,
                filter,
                phi: Mlp::new(Dense::of(&m.context1)?, Dense::of(&m.context2)?)?,
                mix: u.mix.weight().detach(),
                mix_t: u.mix.weight().t()?.contiguous()?,
                mix_tc: OnceLock::new(),
                ctx: Mlp::new(Dense::of(&u.context1)?, Dense::of(&u.context2)?)?,
            });
        }
        let ro = &model.readout;
        let out = Dense::of(&ro.out)?;
        let scale = ro.scale.detach();
        let readout_out = Dense {
            weight: out.weight.broadcast_mul(&scale)?.contiguous()?,
            bias: out.bias.zeros_like()?,
        };
        let constant = ((&out.bias * &scale)? + ro.shift.detach())?;
        let atom_constant = ro.atom_ref.detach().broadcast_add(&constant)?;
        Ok(Self {
            hidden: f,
            n_rbf: r,
            cutoff: cfg.cutoff,
            embedding: model.embedding.detach(),
            blocks,
            readout_force_seed: readout_out.weight.neg()?,
            readout: Mlp::new(Dense::of(&ro.hidden)?, readout_out)?,
            atom_constant,
            rows_from_edges: env_usize("MLFF_FILTER_ROWS_FROM_EDGES", FILTER_ROWS_FROM_EDGES),
            rows_until_edges: env_usize_set("MLFF_FILTER_ROWS_UNTIL_EDGES"),
            keep_rows_bytes: env_usize("MLFF_FILTER_ROWS_KEEP_BYTES", FILTER_ROWS_KEEP_BYTES),
            dense_kernel_rows: env_usize("MLFF_DENSE_KERNEL_ROWS", DENSE_KERNEL_MAX_ROWS),
            dense_on_cpu: false,
            tensor_core_rows: env_usize("MLFF_DENSE_TC_FROM_ROWS", DENSE_TENSOR_CORES_FROM_ROWS)
                ..=env_usize("MLFF_DENSE_TC_UNTIL_ROWS", DENSE_TENSOR_CORES_UNTIL_ROWS),
            tensor_cores_on_cpu: false,
            one_kernel_atoms: env_usize("MLFF_ONE_KERNEL_ATOMS", ONE_KERNEL_MAX_ATOMS),
            one_kernel_blocks: env_usize("MLFF_ONE_KERNEL_BLOCKS", ONE_KERNEL_MAX_BLOCKS),
            atom_split_atoms: env_usize("MLFF_ATOM_SPLIT_MIN_ATOMS", ATOM_SPLIT_MIN_ATOMS)
                ..=env_usize("MLFF_ATOM_SPLIT_ATOMS", ATOM_SPLIT_MAX_ATOMS),
            atom_split_tensor_cores: std::env::var("MLFF_ATOM_SPLIT_TENSOR_CORES")
                .ok()
                .map(|v| v.trim() != "0"),
            packed: std::sync::OnceLock::new(),
            packed_out_major: std::sync::OnceLock::new(),
            first_phi: std::sync::OnceLock::new(),
            first_block_sums: std::env::var("MLFF_FIRST_BLOCK_SUMS")
                .map_or(true, |v| v.trim() != "0"),
            first_sums: std::sync::OnceLock::new(),
        })
    }

    /// Runs the first interaction block as sums per sending element (the default; both ways
    /// give the same forces) or per edge like the others.
    pub fn with_first_block_sums(mut self, on: bool) -> Self {
        self.first_block_sums = on;
        self
    }

    /// Runs systems of up to `atoms` atoms as one kernel on CUDA where they fit (0: never; the
    /// default is [`ONE_KERNEL_MAX_ATOMS`]); both ways give the same forces.
    pub fn with_one_kernel_up_to(mut self, atoms: usize) -> Self {
        self.one_kernel_atoms = atoms;
        self
    }

    /// Runs systems of `atoms` atoms as the atom-split kernel on CUDA where it fits (an empty
    /// range: never; the default is [`ATOM_SPLIT_MIN_ATOMS`]..=[`ATOM_SPLIT_MAX_ATOMS`]); all
    /// paths give the same forces.
    pub fn with_atom_split(mut self, atoms: std::ops::RangeInclusive<usize>) -> Self {
        self.atom_split_atoms = atoms;
        self
    }

    /// The sizes the packed weights describe.
    pub fn small_system_model(&self) -> Result<SmallSystemModel> {
        Ok(SmallSystemModel {
            hidden: self.hidden,
            n_rbf: self.n_rbf,
            blocks: self.blocks.len(),
            elements: self.embedding.dim(0)?,
            cutoff: self.cutoff,
        })
    }

    /// All weights in one buffer, laid out as [`SmallSystemModel::packed_len`] says.
    pub fn packed_weights(&self) -> Result<&Tensor> {
        if let Some(p) = self.packed.get() {
            return Ok(p);
        }
        let packed = self.pack(false)?;
        Ok(self.packed.get_or_init(|| packed))
    }

    /// [`packed_weights`](Self::packed_weights) with every matrix output-major ([out, in]),
    /// at the same offsets: what the atom-split kernel's forward reads.
    pub fn packed_weights_out_major(&self) -> Result<&Tensor> {
        if let Some(p) = self.packed_out_major.get() {
            return Ok(p);
        }
        let packed = self.pack(true)?;
        Ok(self.packed_out_major.get_or_init(|| packed))
    }

    fn pack(&self, out_major: bool) -> Result<Tensor> {
        fn pick(mlp: &Mlp, out_major: bool) -> [&Tensor; 2] {
            match out_major {
                true => [&mlp.hidden.weight, &mlp.out.weight],
                false => [&mlp.hidden_t, &mlp.out_t],
            }
        }
        let ro = &self.readout;
        let mut parts = vec![
            self.embedding.flatten_all()?,
            self.atom_constant.flatten_all()?,
            pick(ro, out_major)[0].flatten_all()?,
            ro.hidden.bias.flatten_all()?,
            ro.out.weight.flatten_all()?,
        ];
        for b in &self.blocks {
            let [phi_hidden, phi_out] = pick(&b.phi, out_major);
            let [ctx_hidden, ctx_out] = pick(&b.ctx, out_major);
            let mix = if out_major { &b.mix } else { &b.mix_t };
            for t in [
                &b.filter,
                phi_hidden,
                &b.phi.hidden.bias,
                phi_out,
                &b.phi.out.bias,
                mix,
                ctx_hidden,
                &b.ctx.hidden.bias,
                ctx_out,
                &b.ctx.out.bias,
            ] {
                parts.push(t.contiguous()?.flatten_all()?);
            }
        }
        let phi = self
            .first_phi()?
            .broadcast_add(&self.blocks[0].phi.out.bias)?;
        parts.push(phi.flatten_all()?);
        Tensor::cat(&parts, 0)
    }

    /// The first block's φ per element [elements, 3F], before its output bias: its input, the
    /// embedding, depends on nothing else, so a call gathers it instead of running the MLP on
    /// every atom. Made on first use (a CUDA graph's warm-up calls make it before capture).
    fn first_phi(&self) -> Result<&Tensor> {
        if let Some(t) = self.first_phi.get() {
            return Ok(t);
        }
        let first = &self.blocks[0].phi;
        let hidden = (self.embedding.matmul(&first.hidden_t)?).broadcast_add(&first.hidden.bias)?;
        let phi = hidden.silu()?.matmul(&first.out_t)?;
        Ok(self.first_phi.get_or_init(|| phi))
    }

    /// Whether this call's first block runs as sums per element: switched on, and no more
    /// elements than the kernels take.
    fn first_block_by_sums(&self) -> Result<bool> {
        Ok(self.first_block_sums
            && !self.blocks.is_empty()
            && self.embedding.dim(0)? <= ELEMENT_SUMS_MAX_ELEMENTS)
    }

    /// The first block's weights for its sums ([`FirstBlockSums`]), made on first use.
    fn first_sums(&self) -> Result<&FirstBlockSums> {
        if let Some(t) = self.first_sums.get() {
            return Ok(t);
        }
        let (f, b) = (self.hidden, &self.blocks[0]);
        let elements = self.embedding.dim(0)?;
        let ctx = self.first_phi()?.broadcast_add(&b.phi.out.bias)?; // [Z, 3F]
        let part = |p: usize| -> Result<Tensor> {
            let w = b.filter.narrow(1, p * f, f)?.unsqueeze(0)?; // [1, R + 1, F]
            let c = ctx.narrow(1, p * f, f)?.unsqueeze(1)?; // [Z, 1, F]
            w.broadcast_mul(&c)?
                .reshape((elements * (self.n_rbf + 1), f))
        };
        let (scalar, direction) = (part(0)?, part(1)?);
        // The sums' one-hot columns: the embedding into s, nothing into v.
        let scalar_state = Tensor::cat(&[&scalar, &self.embedding], 0)?;
        let direction_state = Tensor::cat(&[&direction, &self.embedding.zeros_like()?], 0)?;
        let v = &direction_state;
        let sums = FirstBlockSums {
            product: Tensor::stack(&[&scalar_state, v, v, v], 0)?,
            scalar_t: scalar.t()?.contiguous()?,
            direction_t: direction.t()?.contiguous()?,
        };
        Ok(self.first_sums.get_or_init(|| sums))
    }

    /// The atom-split launch for `x`, where it applies (for [`atom_split`](Self::atom_split)).
    pub fn atom_split_plan(&self, x: &PainnInputs) -> Result<Option<AtomSplitPlan>> {
        let (n, e) = (x.positions.dim(0)?, x.centers.dim(0)?);
        let dev = x.positions.device();
        if !dev.is_cuda() || !self.atom_split_atoms.contains(&n) {
            return Ok(None);
        }
        let model = self.small_system_model()?;
        let Ok(plan) = AtomSplitPlan::fit(model, n, e, dev, x.positions.dtype()) else {
            return Ok(None);
        };
        Ok(match self.atom_split_tensor_cores {
            Some(on) => plan.with_tensor_cores(on).ok(),
            None => (plan.atoms_per_block() <= ATOM_SPLIT_MAX_ATOMS_CUDA_CORES).then_some(plan),
        })
    }

    /// Per-atom energies \[N\] and forces [N, 3] as the atom-split kernel launched by `plan`.
    pub fn atom_split(&self, plan: &AtomSplitPlan, x: &PainnInputs) -> Result<(Tensor, Tensor)> {
        atom_split(
            plan,
            self.packed_weights()?,
            self.packed_weights_out_major()?,
            &x.positions.detach(),
            &x.offsets,
            &x.species,
            &x.centers,
            &x.neighbors,
        )
    }

    /// The one-kernel launch for `x`, where it applies (for [`one_kernel`](Self::one_kernel)).
    pub fn one_kernel_plan(&self, x: &PainnInputs) -> Result<Option<SmallSystemPlan>> {
        let (n, e) = (x.positions.dim(0)?, x.centers.dim(0)?);
        self.one_kernel_plan_for(n, e, x.positions.device(), x.positions.dtype())
    }

    /// The one-kernel launch for `n` atoms and `e` edges on `dev` in `dtype`, where it applies.
    pub fn one_kernel_plan_for(
        &self,
        n: usize,
        e: usize,
        dev: &candle_core::Device,
        dtype: candle_core::DType,
    ) -> Result<Option<SmallSystemPlan>> {
        if !dev.is_cuda() || n > self.one_kernel_atoms {
            return Ok(None);
        }
        let plan = SmallSystemPlan::new(self.small_system_model()?, n, e);
        // Also where the edge geometry is formed again chunk by chunk: at 16 blocks that was
        // slower than the separate kernels (trialanine 0.59 against 0.52-0.54 ms on an H100),
        // at 64 it is faster (332 µs back to back against 0.47-0.64 ms eager).
        Ok(plan
            .ok()
            .and_then(|p| p.fit_widest(dev, dtype, self.one_kernel_blocks).ok()))
    }

    /// Whether [`energies_and_forces`](Self::energies_and_forces) runs `x` as one kernel.
    pub fn runs_as_one_kernel(&self, x: &PainnInputs) -> Result<bool> {
        Ok(self.one_kernel_plan(x)?.is_some())
    }

    /// Per-atom energies \[N\] and forces [N, 3]: one kernel for small systems on CUDA
    /// ([`with_one_kernel_up_to`](Self::with_one_kernel_up_to)), else the separate kernels
    /// ([`separate_kernels`](Self::separate_kernels)).
    pub fn energies_and_forces(&self, x: &PainnInputs) -> Result<(Tensor, Tensor)> {
        match self.one_launch(x)? {
            Some(out) => Ok(out),
            None => self.separate_kernels(x),
        }
    }

    /// Per-atom energies \[N\] and forces [N, 3] in one launch where a one-kernel path takes
    /// `x`: the atom-split kernel ([`with_atom_split`](Self::with_atom_split)),
    /// else the feature-split one ([`with_one_kernel_up_to`](Self::with_one_kernel_up_to)).
    pub fn one_launch(&self, x: &PainnInputs) -> Result<Option<(Tensor, Tensor)>> {
        if let Some(plan) = self.atom_split_plan(x)? {
            return self.atom_split(&plan, x).map(Some);
        }
        match self.one_kernel_plan(x)? {
            Some(plan) => self.one_kernel(&plan, x).map(Some),
            None => Ok(None),
        }
    }

    /// Per-atom energies \[N\] and forces [N, 3] as one kernel launched by `plan`.
    pub fn one_kernel(&self, plan: &SmallSystemPlan, x: &PainnInputs) -> Result<(Tensor, Tensor)> {
        small_system(
            plan,
            self.packed_weights()?,
            &x.positions.detach(),
            &x.offsets,
            &x.species,
            &x.centers,
            &x.neighbors,
        )
    }

    /// Per-atom energies \[N\] and forces [N, 3] by [`forward`](Self::forward) and its adjoint,
    /// ~75 kernels: what CUDA graphs capture, as their replay beats the one kernel.
    pub fn separate_kernels(&self, x: &PainnInputs) -> Result<(Tensor, Tensor)> {
        let pass = self.forward(x)?;
        Ok((pass.atom_energies.clone(), pass.forces()?))
    }

    /// Runs dense layers of at most `rows` rows with our kernels, on any device (0: never);
    /// by default `DENSE_KERNEL_MAX_ROWS` on CUDA and never on the CPU. Both ways give the
    /// same forces.
    pub fn with_dense_kernels_up_to(mut self, rows: usize) -> Self {
        self.dense_kernel_rows = rows;
        self.dense_on_cpu = true;
        self
    }

    /// Runs dense layers of `rows` rows on tensor cores (their CPU twins on the CPU, in any
    /// precision; on CUDA in f32 unless MLFF_DENSE_TENSOR_CORES=0); by default
    /// [`DENSE_TENSOR_CORES_FROM_ROWS`]..=[`DENSE_TENSOR_CORES_UNTIL_ROWS`] on CUDA and never on
    /// the CPU. All ways give the same forces.
    pub fn with_tensor_core_layers(mut self, rows: std::ops::RangeInclusive<usize>) -> Self {
        self.tensor_core_rows = rows;
        self.tensor_cores_on_cpu = true;
        self
    }

    /// How layers of `rows` rows of `x`'s device and precision run (the widest reduction of
    /// the small kernels is the adjoint of a 3F-wide output layer).
    fn dense_path(&self, rows: usize, x: &Tensor) -> DensePath {
        let dev = x.device();
        let tensor_cores = match dev.is_cuda() {
            true => dense_on_tensor_cores(x.dtype()),
            false => self.tensor_cores_on_cpu,
        };
        if tensor_cores && self.tensor_core_rows.contains(&rows) {
            DensePath::TensorCores
        } else if (dev.is_cuda() || self.dense_on_cpu)
            && rows <= self.dense_kernel_rows
            && 3 * self.hidden <= DENSE_MAX_WIDTH
        {
            DensePath::Small
        } else {
            DensePath::Matmul
        }
    }

    /// Per-atom energies [N] from the last state's s rows, and the readout's tape: on tensor
    /// cores (`ops::readout_tc`) one launch that also gives −∂E/∂s, else the MLP (its output
    /// bias is in the per-element constants) and a gather of those.
    fn readout(
        &self,
        s: &Tensor,
        species: &Tensor,
        path: DensePath,
    ) -> Result<(Tensor, ReadoutTape)> {
        let ro = &self.readout;
        let (h, f) = ro.hidden.weight.dims2()?;
        if path == DensePath::TensorCores && dense_tc_fits(f, h) && dense_tc_fits(h, f) {
            let [w1, _, _, w1t] = ro.tc()?;
            let w = ro.out.weight.flatten_all()?;
            let (energies, seed) = readout_tc(
                s,
                w1,
                &ro.hidden.bias,
                &w,
                w1t,
                &self.atom_constant,
                species,
            )?;
            return Ok((energies, ReadoutTape::Seed(seed)));
        }
        let (pre, out) = ro.forward(s, path)?;
        let energies = (out.squeeze(1)? + gather(&self.atom_constant, species)?)?;
        Ok((energies, ReadoutTape::Pre(pre)))
    }

    /// mixed = v W_mixᵀ [3N, 2F].
    fn mix(&self, b: &Block, v: &Tensor) -> Result<Tensor> {
        let f = self.hidden;
        match self.dense_path(v.dim(0)?, v) {
            DensePath::Small => dense(v, &b.mix_t),
            DensePath::TensorCores if dense_tc_fits(f, 2 * f) => dense_tc(v, &b.mix_tc()?[0]),
            _ => v.matmul(&b.mix.t()?),
        }
    }

    /// Whether block `b`'s update (forward and adjoint) runs in one launch each
    /// (`ops::update_tc`, `ops::update_tc_adjoint`) for `n` atoms with tensors like `x`: where
    /// the dense layers run on tensor cores and the shape is the kernels' (F = 128 on CUDA, the
    /// context MLP's hidden width F), on CUDA from [`UPDATE_IN_ONE_LAUNCH_FROM_ATOMS`] atoms.
    /// `MLFF_UPDATE_TC=0` turns it off; `MLFF_UPDATE_TC_FROM_ATOMS` moves the threshold.
    fn update_in_one_launch(
        &self,
        b: &Block,
        n: usize,
        x: &Tensor,
        path: DensePath,
    ) -> Result<bool> {
        static ON: OnceLock<(bool, usize)> = OnceLock::new();
        let (on, from) = *ON.get_or_init(|| {
            let on = env_usize("MLFF_UPDATE_TC", 1) != 0;
            (
                on,
                env_usize("MLFF_UPDATE_TC_FROM_ATOMS", UPDATE_IN_ONE_LAUNCH_FROM_ATOMS),
            )
        });
        let f = self.hidden;
        let cuda = x.device().is_cuda();
        Ok(on
            && path == DensePath::TensorCores
            && (!cuda || (f == UPDATE_TC_FEATURES && n >= from))
            && b.ctx.hidden.weight.dim(0)? == f
            && b.ctx.fits_tensor_cores(false)?
            && b.ctx.fits_tensor_cores(true)?
            && dense_tc_fits(f, 2 * f)
            && dense_tc_fits(2 * f, f))
    }

    /// The update block of the state after the messages [4N, F]: its new state and the
    /// adjoint's tape, in one launch ([`update_in_one_launch`](Self::update_in_one_launch)) or
    /// as the mixing layer, the context, the context MLP and the combination in turn.
    fn update(&self, b: &Block, messaged: &Tensor, path: DensePath) -> Result<UpdateOutputs> {
        let n = messaged.dim(0)? / 4;
        if self.update_in_one_launch(b, n, messaged, path)? {
            let [w1, w2, ..] = b.ctx.tc()?;
            let (bias1, bias2) = (&b.ctx.hidden.bias, &b.ctx.out.bias);
            return update_tc(messaged, &b.mix_tc()?[0], w1, bias1, w2, bias2);
        }
        let mixed = self.mix(b, &messaged.narrow(0, n, 3 * n)?)?;
        let (ctx_pre, act) = b.ctx.forward(&update_context(messaged, &mixed)?, path)?;
        let next = update_combine(messaged, &mixed, &act, &b.ctx.out.bias)?;
        Ok(UpdateOutputs {
            next,
            mixed,
            ctx_pre,
            act,
        })
    }

    /// (dL/ds [N, F], dL/dv [3N, F]) of the state after block `b`'s messages for the gradient
    /// `grad` at its output, from its tape `t`: in one launch where the forward took one, else
    /// the combination's, the context MLP's, the context's and the mixing layer's adjoints.
    fn update_adjoint(
        &self,
        b: &Block,
        t: &Tape,
        grad: &StateGrad,
        path: DensePath,
    ) -> Result<(Tensor, Tensor)> {
        let (n, f) = (t.ctx_pre.dim(0)?, self.hidden);
        let (b1, act_bias) = (&b.ctx.hidden.bias, &b.ctx.out.bias);
        if self.update_in_one_launch(b, n, &t.mixed, path)? {
            let [_, _, w2t, w1t] = b.ctx.tc()?;
            let mix_t = &b.mix_tc()?[1];
            return update_tc_adjoint(
                &t.mixed, &t.act, act_bias, &t.ctx_pre, b1, grad, w2t, w1t, mix_t,
            );
        }
        let combined = update_combine_adjoint(&t.mixed, &t.act, act_bias, grad)?;
        let g_ctx = b
            .ctx
            .adjoint(&t.ctx_pre, &act_grad(&combined, n, f)?, path)?;
        let (g_messaged, g_mixed) = update_context_adjoint(&t.mixed, &g_ctx, combined)?;
        // dL/dv of the messaged state: its own rows' and the mixing's, summed.
        let g_v = self.mix_adjoint_adding(b, &g_mixed, &g_messaged.narrow(0, n, 3 * n)?)?;
        Ok((g_messaged.narrow(0, 0, n)?, g_v))
    }

    /// dL/dv [3N, F] of [`mix`](Self::mix) for dL/d(mixed) `g`, plus `add` [3N, F]: in one
    /// launch on tensor cores, where they run at this size or (unless
    /// `MLFF_MIX_ADJOINT_TC_ABOVE=0`) where the layers take cuBLAS above their rows, there
    /// instead of cuBLAS and an add; else the product, then the add.
    fn mix_adjoint_adding(&self, b: &Block, g: &Tensor, add: &Tensor) -> Result<Tensor> {
        static ABOVE: OnceLock<bool> = OnceLock::new();
        let above = *ABOVE.get_or_init(|| env_usize("MLFF_MIX_ADJOINT_TC_ABOVE", 1) != 0);
        let f = self.hidden;
        let rows = g.dim(0)?;
        let path = self.dense_path(rows, g);
        let tensor_cores = match path {
            DensePath::TensorCores => true,
            DensePath::Matmul => {
                above
                    && g.device().is_cuda()
                    && dense_on_tensor_cores(g.dtype())
                    && rows > *self.tensor_core_rows.end()
            }
            DensePath::Small => false,
        };
        if tensor_cores && dense_tc_fits(2 * f, f) {
            return dense_tc_adding(g, &b.mix_tc()?[1], add);
        }
        let product = match path {
            DensePath::Small => dense(g, &b.mix)?,
            _ => g.matmul(&b.mix)?,
        };
        product + add
    }

    /// Uses filter rows (a matrix product) from `edges` edges on instead of
    /// [`FILTER_ROWS_FROM_EDGES`] (0: always, `usize::MAX`: never), up to
    /// [`FILTER_ROWS_MAX_BYTES`]; both paths give the same forces.
    pub fn with_filter_rows_from(mut self, edges: usize) -> Self {
        self.rows_from_edges = edges;
        self
    }

    /// On CUDA, goes back to the filter formed in the kernels from `edges` edges on instead of
    /// `FILTER_ROWS_UNTIL_EDGES` (`usize::MAX`: never); both paths give the same forces.
    pub fn with_filter_rows_until(mut self, edges: usize) -> Self {
        self.rows_until_edges = Some(edges);
        self
    }

    /// Keeps the filter rows of all blocks for the adjoint up to `bytes` in total
    /// (`FILTER_ROWS_KEEP_BYTES` by default; 0: made again in the adjoint). Both give the
    /// same forces.
    pub fn with_filter_rows_kept_up_to(mut self, bytes: usize) -> Self {
        self.keep_rows_bytes = bytes;
        self
    }

    /// Block `b`'s filter for `basis`: the weights, or the rows in `rows` (made there when
    /// it holds none).
    fn filter<'a>(
        &self,
        b: &'a Block,
        basis: &Tensor,
        rows: &'a mut Option<Tensor>,
    ) -> Result<EdgeFilter<'a>> {
        let e = basis.dim(0)?;
        let bytes = e * b.filter.dim(1)? * basis.dtype().size_in_bytes();
        let until = self.rows_until_edges.unwrap_or(
            match crate::ops::tiles_on_tensor_cores(basis.dtype()) {
                true => 0,
                false => FILTER_ROWS_UNTIL_EDGES,
            },
        );
        let tiled = basis.device().is_cuda() && e >= until;
        if e < self.rows_from_edges || bytes > FILTER_ROWS_MAX_BYTES || tiled {
            return Ok(EdgeFilter::Weights(&b.filter));
        }
        let made = match rows.take() {
            Some(r) => r,
            None => basis.matmul(&b.filter_basis)?,
        };
        Ok(EdgeFilter::Rows(rows.insert(made)))
    }

    /// Whether the filter rows of all blocks for `basis` are kept for the adjoint.
    fn keeps_rows(&self, basis: &Tensor) -> Result<bool> {
        let bytes = basis.dim(0)? * 3 * self.hidden * basis.dtype().size_in_bytes();
        Ok(bytes * self.blocks.len() <= self.keep_rows_bytes)
    }

    /// The first block's messaged state [4N, F]: the per-element sums times their weights
    /// ([`FirstBlockSums`]), which add the initial state too.
    fn first_block_messages(&self, basis: &Tensor, x: &PainnInputs) -> Result<Tensor> {
        let n = x.species.dim(0)?;
        let sums = element_sums(
            basis,
            &x.centers,
            &x.neighbors,
            &x.species,
            self.embedding.dim(0)?,
            self.n_rbf,
        )?;
        let k = sums.dim(1)?;
        let product = &self.first_sums()?.product;
        let messaged = sums.reshape((4, n, k))?.matmul(product)?;
        messaged.reshape((4 * n, self.hidden))
    }

    /// The forward pass: per-atom energies (eV) and what `FusedForward::forces` needs.
    pub fn forward<'a>(&'a self, x: &'a PainnInputs) -> Result<FusedForward<'a>> {
        let n = x.positions.dim(0)?;
        let positions = x.positions.detach();
        let basis = edge_basis(
            &positions,
            &x.offsets,
            &x.centers,
            &x.neighbors,
            self.n_rbf,
            self.cutoff,
        )?;
        let by_sums = self.first_block_by_sums()?;
        // (None: the first block's sums add the initial state themselves.)
        let mut state = match by_sums {
            true => None,
            false => Some(initial_state(&self.embedding, &x.species)?),
        };
        let mut tape = Vec::with_capacity(self.blocks.len());
        let path = self.dense_path(n, &x.positions);
        let keep_rows = self.keeps_rows(&basis)?;
        for (k, b) in self.blocks.iter().enumerate() {
            // The block's messaged state, and what its adjoint needs of the interaction.
            let (messaged, phi_pre, phi, rows) = match &state {
                None => (self.first_block_messages(&basis, x)?, None, None, None),
                Some(state_in) => {
                    let (phi_pre, phi) = match k {
                        0 => (None, gather(self.first_phi()?, &x.species)?),
                        _ => {
                            let (pre, phi) = b.phi.forward(&state_in.narrow(0, 0, n)?, path)?;
                            (Some(pre), phi)
                        }
                    };
                    let mut rows = None;
                    let messaged = interaction(&InteractionInputs {
                        phi: &phi,
                        phi_bias: &b.phi.out.bias,
                        filter: self.filter(b, &basis, &mut rows)?,
                        basis: &basis,
                        state: state_in,
                        centers: &x.centers,
                        neighbors: &x.neighbors,
                        symmetric_edges: true,
                    })?;
                    let rows = if keep_rows { rows } else { None };
                    (messaged, phi_pre, Some(phi), rows)
                }
            };
            let UpdateOutputs {
                next,
                mixed,
                ctx_pre,
                act,
            } = self.update(b, &messaged, path)?;
            tape.push(Tape {
                state: state.take(),
                phi_pre,
                phi,
                mixed,
                ctx_pre,
                act,
                rows,
            });
            state = Some(next);
        }
        let Some(state) = state else {
            candle_core::bail!("the model has no interaction blocks")
        };
        let (atom_energies, readout) = self.readout(&state.narrow(0, 0, n)?, &x.species, path)?;
        Ok(FusedForward {
            model: self,
            inputs: x,
            positions,
            basis,
            tape,
            readout,
            atom_energies,
        })
    }
}

/// A fused forward pass, ready for its adjoint.
pub struct FusedForward<'a> {
    model: &'a FusedPainn,
    inputs: &'a PainnInputs,
    positions: Tensor,
    basis: Tensor,
    tape: Vec<Tape>,
    readout: ReadoutTape,
    /// Energy of each atom [N], eV.
    pub atom_energies: Tensor,
}

impl FusedForward<'_> {
    /// Forces [N, 3] in eV/Å: −∂(Σ atom energies)/∂x by the explicit adjoint.
    pub fn forces(&self) -> Result<Tensor> {
        let (m, x, basis) = (self.model, self.inputs, &self.basis);
        let n = self.positions.dim(0)?;
        // Every atom energy has gradient −1: the adjoint carries −E's, so it ends in the forces.
        let path = m.dense_path(n, &self.positions);
        let mut gx = match &self.readout {
            ReadoutTape::Seed(g) => g.clone(),
            ReadoutTape::Pre(pre) => {
                let g_hidden = &m.readout_force_seed; // one row, for every atom
                m.readout.adjoint_from_hidden(pre, g_hidden, path)?
            }
        };
        let mut next: Option<(Tensor, Tensor, Tensor)> = None;
        let mut g_basis: Option<Tensor> = None;
        for (b, t) in m.blocks.iter().zip(&self.tape).rev() {
            let grad = StateGrad {
                gx: &gx,
                next: next.as_ref().map(|(a, b, c)| (a, b, c)),
            };
            let (g_s, g_v) = m.update_adjoint(b, t, &grad, path)?;
            let (Some(phi), Some(state)) = (&t.phi, &t.state) else {
                // The first block by sums per element (last here): its adjoint ends in the
                // forces, through the basis rows of every block.
                let sums = m.first_sums()?;
                return element_sums_position_adjoint(
                    &self.positions,
                    &x.offsets,
                    g_basis.as_ref(),
                    &g_s.matmul(&sums.scalar_t)?,
                    &g_v.matmul(&sums.direction_t)?,
                    (&x.centers, &x.neighbors),
                    &x.species,
                    m.embedding.dim(0)?,
                    (m.n_rbf, m.cutoff),
                );
            };
            let mut rows = t.rows.clone();
            let inputs = InteractionInputs {
                phi,
                phi_bias: &b.phi.out.bias,
                filter: m.filter(b, basis, &mut rows)?,
                basis,
                state,
                centers: &x.centers,
                neighbors: &x.neighbors,
                // Model inputs hold both directions of every edge (`PainnInputs`).
                symmetric_edges: true,
            };
            // dL/d(basis) summed over the blocks as it goes (in the kernel where it can).
            let grads = interaction_adjoint(&inputs, &g_s, &g_v, g_basis.as_ref())?;
            g_basis = Some(grads.complete_basis(&b.filter_basis)?);
            let (g_v_in, g_phi) = (grads.v, grads.phi);
            // The first block's state is the embedding: nothing upstream needs its gradient.
            if let Some(phi_pre) = &t.phi_pre {
                gx = b.phi.adjoint(phi_pre, &g_phi, path)?;
                next = Some((g_s, g_v, g_v_in));
            }
        }
        match g_basis {
            Some(g) => edge_basis_adjoint(
                &self.positions,
                &x.offsets,
                &g,
                &x.centers,
                &x.neighbors,
                m.n_rbf,
                m.cutoff,
            ),
            None => self.positions.zeros_like(),
        }
    }
}
