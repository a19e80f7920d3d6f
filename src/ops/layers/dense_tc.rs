//! Dense layers on tensor cores (kernels/layers/dense_tc.cu) for the separate-kernel path in f32
//! on CUDA: one layer, or a whole two-layer MLP with its SiLU in one launch, where cuBLAS took
//! two products and a bias+SiLU kernel (the largest share of a 64-aspirin call:
//! docs/bench-log/25-dense-tensor-cores.md). The products are in split half precision
//! (kernels/include/f16_split.cuh: each row of inputs and of weights scaled by a power of two,
//! each value held as two f16 to ~2^-22 of itself, summed in f32).
//!
//! Every weight is given output-major, [outputs, reduction] (a linear layer's own weight for
//! its forward, the transpose for its adjoint), made once into [`TcWeights`] by [`tc_weights`]:
//! padded on the CPU, scaled, split and packed on CUDA. The CPU twins are plain loops in either
//! precision (the tests' oracle); on CUDA only f32 runs.

pub(crate) use super::dense_tc_weights::arranged;
pub use super::dense_tc_weights::{tc_weights, TcWeights};
use crate::ops::launch::{
    check_elements, kernel_source, launch, overlaps_previous, Init, Kernel, Real,
};
use crate::ops::layers::dense::silu_and_slope;
use candle_core::{bail, DType, Result, Tensor};

/// Threads per CUDA block (dense_tc::THREADS; also the update block's, ops::update_tc).
#[cfg(feature = "cuda")]
pub(crate) const THREADS: u32 = 256;

/// Output columns per pass of a block (CHUNK in kernels/layers/dense_tc.cu): the weights are padded
/// with zero rows to a multiple of it.
pub(crate) const CHUNK: usize = 128;

/// Longest reduction (and hidden width) the kernels take: a block stages its inputs and an
/// MLP's hidden layer in shared memory, split in two (PaiNN's widest is 3F).
pub const DENSE_TC_MAX_WIDTH: usize = 384;

/// Whether the dense layers of `dtype` can run on tensor cores on CUDA where they fit (f32:
/// the kernels' split-f16 products hold f32's precision, not f64's).
pub fn dense_on_tensor_cores(dtype: DType) -> bool {
    dtype == DType::F32
}

/// Whether a layer reducing over `k` values into `j` outputs fits the kernels (reductions in
/// steps of 16, outputs in tiles of 8).
pub fn dense_tc_fits(k: usize, j: usize) -> bool {
    k.is_multiple_of(16) && j.is_multiple_of(8) && k > 0 && j > 0 && k <= DENSE_TC_MAX_WIDTH
}

/// Rows per block (BM in kernels/layers/dense_tc.cu). (With split TF32, blocks of 32 rows from
/// 4,096 rows and inputs up to 256 wide had been the faster; with split f16, 16 everywhere
/// measured as fast or faster: docs/bench-log/39-dense-split-f16.md, "Rows per block".)
#[cfg(feature = "cuda")]
const BLOCK_ROWS: usize = 16;

/// (width known at compile time, function) of a kernel's instantiations in
/// kernels/layers/dense_tc.cu (blocks of [`BLOCK_ROWS`]); width 0 takes any.
type Variants = &'static [(usize, &'static str)];

macro_rules! variants {
    ($stem:literal: $($width:literal),*) => {
        &[$(($width, concat!($stem, "_16_", $width)),)*]
    };
}

const DENSE_VARIANTS: Variants = variants!("dense_tc": 0, 128, 256);
const DENSE_ADD_VARIANTS: Variants = variants!("dense_tc_add": 0, 256);
const READOUT_VARIANTS: Variants = variants!("readout_tc": 0, 128);
const FORWARD_VARIANTS: Variants = variants!("mlp_tc_fwd": 0, 128, 256);
const ADJOINT_VARIANTS: Variants = variants!("mlp_tc_adj": 0, 384);

/// The function whose widths the kernel knows at compile time where `width` is one of its
/// variants' (the model's), else the one for any.
fn function(variants: Variants, width: usize) -> &'static str {
    let pick = |w: usize| variants.iter().find(|v| v.0 == w);
    pick(width)
        .or_else(|| pick(0))
        .map_or(variants[0].1, |v| v.1)
}

/// Shapes of one launch: rows, first reduction, hidden width (MLPs), outputs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dims {
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) h: usize,
    pub(crate) j: usize,
}

impl Dims {
    /// Launch shape: blocks of [`BLOCK_ROWS`] rows, with kernels/layers/dense_tc.cu's `Smem` in shared
    /// memory (32-bit words): the staged rows (two f16 planes, [`staged_stride`] words a pair of
    /// rows) and their inverse scales, and for an MLP its hidden layer staged the same way and in
    /// f32 (h + 8 words a row).
    #[cfg(feature = "cuda")]
    fn config(&self, hidden: bool) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        let rows = BLOCK_ROWS;
        let mut words = rows * (staged_stride(self.k) + 1);
        if hidden {
            words += rows * (staged_stride(self.h) + self.h + 8 + 1);
        }
        candle_core::cuda_backend::cudarc::driver::LaunchConfig {
            grid_dim: (self.n.div_ceil(rows) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: (4 * words) as u32,
        }
    }
}

/// 32-bit words of a staged pair of rows `width` wide (kernels/include/dense_tc.cuh staged_stride).
/// (Plain arithmetic, compiled without CUDA too: ops::update_tc's shared-memory sizes and
/// their test use it.)
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn staged_stride(width: usize) -> usize {
    width + if width.is_multiple_of(32) { 16 } else { 0 }
}

/// Σ_k a[k] b[k].
fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    a.iter().zip(b).fold(T::zero(), |s, (&x, &y)| s + x * y)
}

/// y[r] = W x[r] for rows of width `k` and the first `j` rows of W (output-major).
fn rows_times<T: Real>(x: &[T], w: &[T], k: usize, j: usize, y: &mut [T]) {
    for (xr, yr) in x.chunks_exact(k).zip(y.chunks_exact_mut(j)) {
        for (o, v) in yr.iter_mut().enumerate() {
            *v = dot(xr, &w[o * k..(o + 1) * k]);
        }
    }
}

/// One layer; `adding`: plus a third input [N, J].
pub(crate) struct Layer {
    pub(crate) dims: Dims,
    pub(crate) adding: bool,
}

impl Kernel for Layer {
    overlaps_previous!();
    kernel_source!("dense_tc", "dense_tc");
    fn function(&self) -> &'static str {
        let variants = match self.adding {
            true => DENSE_ADD_VARIANTS,
            false => DENSE_VARIANTS,
        };
        function(variants, self.dims.k)
    }
    fn work(&self) -> usize {
        self.dims.n * self.dims.j
    }
    #[cfg(feature = "cuda")]
    fn launch_config(&self, _: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        self.dims.config(false)
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.dims.n, self.dims.k, self.dims.j]
    }
    /// x = [x, w] or [x, add, w].
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        rows_times(x[0], x[x.len() - 1], self.dims.k, self.dims.j, out);
        if self.adding {
            out.iter_mut().zip(x[1]).for_each(|(y, &a)| *y += a);
        }
    }
}

/// The forward's launch.
pub(crate) struct MlpForward(pub(crate) Dims);

impl Kernel for MlpForward {
    overlaps_previous!();
    kernel_source!("mlp_tc_fwd", "dense_tc");
    fn function(&self) -> &'static str {
        // The compile-time variants are the model's, whose hidden width is 128.
        let known = self.0.k * (self.0.h == 128) as usize;
        function(FORWARD_VARIANTS, known)
    }
    fn work(&self) -> usize {
        self.0.n * self.0.j
    }
    #[cfg(feature = "cuda")]
    fn launch_config(&self, _: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        self.0.config(true)
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.0.n, self.0.k, self.0.h, self.0.j]
    }
    /// x = [x, b1, w1, w2] → [pre (N H) | y (N J)].
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        let Dims { n, k, h, j } = self.0;
        let (pre, y) = out.split_at_mut(n * h);
        let (w1, w2) = (x[2], x[3]);
        rows_times(x[0], w1, k, h, pre);
        let mut act = vec![T::zero(); h];
        for (p, yr) in pre.chunks_exact(h).zip(y.chunks_exact_mut(j)) {
            for ((a, &v), &b) in act.iter_mut().zip(p).zip(x[1]) {
                *a = silu_and_slope(v + b).0;
            }
            rows_times(&act, w2, h, j, yr);
        }
    }
}

/// The adjoint's launch stages g [N, J] (its first layer reduces over the MLP's outputs), and
/// makes the k inputs' gradients.
pub(crate) struct MlpAdjoint(pub(crate) Dims);

impl MlpAdjoint {
    #[cfg(feature = "cuda")]
    fn staged(&self) -> Dims {
        let Dims { n, k, h, j } = self.0;
        Dims { n, k: j, h, j: k }
    }
}

impl Kernel for MlpAdjoint {
    overlaps_previous!();
    kernel_source!("mlp_tc_adj", "dense_tc");
    fn function(&self) -> &'static str {
        let known = self.0.j * (self.0.h == 128) as usize;
        function(ADJOINT_VARIANTS, known)
    }
    fn work(&self) -> usize {
        self.0.n * self.0.k
    }
    #[cfg(feature = "cuda")]
    fn launch_config(&self, _: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        self.staged().config(true)
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.0.n, self.0.j, self.0.h, self.0.k]
    }
    /// x = [g, pre, b1, w2t [h, j], w1t [k, h]] → dL/dx [N, K].
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        let Dims { k, h, j, .. } = self.0;
        let mut g_pre = vec![T::zero(); h];
        let (w2t, w1t) = (x[3], x[4]);
        let rows = x[0].chunks_exact(j).zip(x[1].chunks_exact(h));
        for ((g, pre), gx) in rows.zip(out.chunks_exact_mut(k)) {
            rows_times(g, w2t, j, h, &mut g_pre);
            for ((v, &p), &b) in g_pre.iter_mut().zip(pre).zip(x[2]) {
                *v *= silu_and_slope(p + b).1;
            }
            rows_times(&g_pre, w1t, h, k, gx);
        }
    }
}

/// The readout and its forces' seed ([`readout_tc`]); `dims.h` is the hidden width.
struct Readout {
    dims: Dims,
}

impl Kernel for Readout {
    overlaps_previous!();
    kernel_source!("readout_tc", "dense_tc");
    fn function(&self) -> &'static str {
        function(READOUT_VARIANTS, self.dims.k)
    }
    fn work(&self) -> usize {
        self.dims.n * self.dims.k
    }
    /// As an MLP's, plus one energy per row.
    #[cfg(feature = "cuda")]
    fn launch_config(&self, _: usize) -> candle_core::cuda_backend::cudarc::driver::LaunchConfig {
        let mut cfg = self.dims.config(true);
        cfg.shared_mem_bytes += 4 * BLOCK_ROWS as u32;
        cfg
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.dims.n, self.dims.k, self.dims.h]
    }
    /// x = [x, b1, w, constant, w1, w1t], idx = [species] (checked by [`readout_tc`] on the
    /// CPU) → [gx (N K) | energy (N)].
    fn cpu<T: Real>(&self, x: &[&[T]], idx: &[&[u32]], out: &mut [T]) {
        let Dims { n, k, h, .. } = self.dims;
        let (w1, w1t) = (x[4], x[5]);
        let (gx, energy) = out.split_at_mut(n * k);
        let (mut pre, mut seed) = (vec![T::zero(); h], vec![T::zero(); h]);
        let rows = x[0].chunks_exact(k).zip(gx.chunks_exact_mut(k));
        for (r, (xr, gr)) in rows.enumerate() {
            rows_times(xr, w1, k, h, &mut pre);
            let mut e = x[3][idx[0][r] as usize];
            for ((p, g), (&b, &w)) in pre.iter().zip(&mut seed).zip(x[1].iter().zip(x[2])) {
                let (silu, slope) = silu_and_slope(*p + b);
                e += silu * w;
                *g = -(w * slope);
            }
            energy[r] = e;
            rows_times(&seed, w1t, h, k, gr);
        }
    }
}

/// The readout of rows x [N, K] (the last state's s) and the start of the forces' adjoint, in
/// one launch: per-atom energies silu(x W1ᵀ + b1) · w + constant[species] [N] and the gradient
/// of minus their sum, −∂E/∂x = (−w ⊙ silu'(x W1ᵀ + b1)) W1 [N, K]; w1 [H, K] and its
/// transpose w1t [K, H] (as [`tc_weights`] makes them), b1 and the output weights `w` [H], per-element constants and
/// u32 element indices [N]. Returns (energies, −∂E/∂x). On the CPU every index is checked.
pub fn readout_tc(
    x: &Tensor,
    w1: &TcWeights,
    b1: &Tensor,
    w: &Tensor,
    w1t: &TcWeights,
    constant: &Tensor,
    species: &Tensor,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "readout_tc";
    let (n, k) = x.dims2()?;
    let h = check_weights(OP, "the hidden weight", w1, k)?;
    if check_weights(OP, "the transposed hidden weight", w1t, h)? != k {
        bail!(
            "{OP}: the transposed hidden weight has {} outputs, expected {k}",
            w1t.outputs()
        )
    }
    fit(OP, "hidden bias", b1, &[h])?;
    fit(OP, "output weights", w, &[h])?;
    fit(OP, "element indices", species, &[n])?;
    check_elements(species, constant.dims1()?, OP)?;
    let (inputs, index) = arranged(&[x, b1, w, constant], &[w1, w1t], &[species]);
    check_inputs(OP, &inputs)?;
    let dims = Dims { n, k, h, j: 1 };
    let out = launch(Readout { dims }, &inputs, &index, n * (k + 1), Init::Uninit)?;
    Ok((
        out.narrow(0, n * k, n)?,
        out.narrow(0, 0, n * k)?.reshape((n, k))?,
    ))
}

/// Checks that float inputs start on 16 bytes (the kernels read the weights as float4s, rows
/// and pre-activations as float2s) and that CUDA runs them in f32 only.
pub(crate) fn check_inputs(op: &str, inputs: &[&Tensor]) -> Result<()> {
    for t in inputs {
        if t.device().is_cuda() && t.dtype() != DType::F32 {
            bail!(
                "{op}: tensor-core layers run in f32 on CUDA, got {:?}",
                t.dtype()
            )
        }
        if t.layout().start_offset() % 4 != 0 {
            bail!(
                "{op}: an input starts at element {}, not a multiple of 4",
                t.layout().start_offset()
            )
        }
    }
    Ok(())
}

pub(crate) fn fit(op: &str, what: &str, t: &Tensor, want: &[usize]) -> Result<()> {
    if t.dims() != want {
        bail!("{op}: {what} is {:?}, expected {want:?}", t.dims())
    }
    Ok(())
}

/// Checks that `w`'s reduction is `k` (naming it `what`) and that it fits the kernels.
pub(crate) fn check_weights(op: &str, what: &str, w: &TcWeights, k: usize) -> Result<usize> {
    let j = w.outputs();
    if w.inputs() != k {
        bail!("{op}: {what} takes {} inputs, expected {k}", w.inputs())
    }
    if !dense_tc_fits(k, j) {
        bail!(
            "{op}: {what}, {k} inputs and {j} outputs, does not fit the tensor-core kernels \
             (inputs a multiple of 16 up to {DENSE_TC_MAX_WIDTH}, outputs of 8)"
        )
    }
    Ok(j)
}

/// x Wᵀ [N, J] for x [N, K] and a linear layer's weight [J, K] (no bias), padded.
pub fn dense_tc(x: &Tensor, w: &TcWeights) -> Result<Tensor> {
    layer("dense_tc", x, w, None)
}

/// [`dense_tc`] plus `add` [N, J] in the same launch: x Wᵀ + add.
pub fn dense_tc_adding(x: &Tensor, w: &TcWeights, add: &Tensor) -> Result<Tensor> {
    layer("dense_tc_adding", x, w, Some(add))
}

/// One layer's launch, with `add` where given.
fn layer(op: &str, x: &Tensor, w: &TcWeights, add: Option<&Tensor>) -> Result<Tensor> {
    let (n, k) = x.dims2()?;
    let j = check_weights(op, "the weight", w, k)?;
    let mut floats = vec![x];
    if let Some(add) = add {
        fit(op, "the addend", add, &[n, j])?;
        floats.push(add);
    }
    let (inputs, index) = arranged(&floats, &[w], &[]);
    check_inputs(op, &inputs)?;
    let dims = Dims { n, k, h: 0, j };
    let layer = Layer {
        dims,
        adding: add.is_some(),
    };
    launch(layer, &inputs, &index, (n, j), Init::Uninit)
}

/// Two linear layers with SiLU between, x [N, K] → (pre = x W1ᵀ [N, H], silu(pre + b1) W2ᵀ
/// [N, J]), for w1 [H, K], b1 \[H\], w2 [J, H] (the weights padded); the output layer's bias is
/// left to its consumer.
pub fn mlp_tc(x: &Tensor, w1: &TcWeights, b1: &Tensor, w2: &TcWeights) -> Result<(Tensor, Tensor)> {
    const OP: &str = "mlp_tc";
    let (n, k) = x.dims2()?;
    let h = check_weights(OP, "the hidden weight", w1, k)?;
    let j = check_weights(OP, "the output weight", w2, h)?;
    fit(OP, "hidden bias", b1, &[h])?;
    let (inputs, index) = arranged(&[x, b1], &[w1, w2], &[]);
    check_inputs(OP, &inputs)?;
    let dims = Dims { n, k, h, j };
    let out = launch(MlpForward(dims), &inputs, &index, n * (h + j), Init::Uninit)?;
    Ok((
        out.narrow(0, 0, n * h)?.reshape((n, h))?,
        out.narrow(0, n * h, n * j)?.reshape((n, j))?,
    ))
}

/// dL/dx [N, K] of [`mlp_tc`]'s output for dL/d(output) `g` [N, J], its saved `pre` [N, H], b1,
/// and the transposed weights w2t [H, J] and w1t [K, H] (padded).
pub fn mlp_tc_adjoint(
    g: &Tensor,
    pre: &Tensor,
    b1: &Tensor,
    w2t: &TcWeights,
    w1t: &TcWeights,
) -> Result<Tensor> {
    const OP: &str = "mlp_tc_adjoint";
    let (n, j) = g.dims2()?;
    let h = check_weights(OP, "the transposed output weight", w2t, j)?;
    let k = check_weights(OP, "the transposed hidden weight", w1t, h)?;
    fit(OP, "pre-activation", pre, &[n, h])?;
    fit(OP, "hidden bias", b1, &[h])?;
    let (inputs, index) = arranged(&[g, pre, b1], &[w2t, w1t], &[]);
    check_inputs(OP, &inputs)?;
    let dims = Dims { n, k, h, j };
    launch(MlpAdjoint(dims), &inputs, &index, (n, k), Init::Uninit)
}
