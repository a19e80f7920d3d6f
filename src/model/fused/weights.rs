//! The model's weights as the fused kernels read them: layers with their transposes and
//! tensor-core forms (made on first use), the first block's per-element products, and the
//! packed buffers of the one-launch kernels.

use super::FusedPainn;
use crate::ops::{
    bias_silu, bias_silu_adjoint, dense, dense_silu, dense_silu_adjoint, dense_tc_fits, mlp_tc,
    mlp_tc_adjoint, tc_weights, TcWeights,
};
use crate::plan::{DensePath, ModelShape};
use candle_core::{Result, Tensor};
use candle_nn::Linear;
use std::sync::OnceLock;

/// A linear layer as (weight [out, in], bias [out]).
#[derive(Clone)]
pub(super) struct Dense {
    pub(super) weight: Tensor,
    pub(super) bias: Tensor,
}

impl Dense {
    pub(super) fn of(l: &Linear) -> Result<Self> {
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
    pub(super) fn product(&self, x: &Tensor) -> Result<Tensor> {
        x.matmul(&self.weight.t()?)
    }

    /// dL/dx of [`product`](Self::product) for dL/d(output) `g`.
    pub(super) fn product_adjoint(&self, g: &Tensor) -> Result<Tensor> {
        g.matmul(&self.weight)
    }
}

/// Two linear layers with SiLU between them, out(silu(hidden(x))); the output's bias is left to
/// the kernel that consumes it.
#[derive(Clone)]
pub(super) struct Mlp {
    pub(super) hidden: Dense,
    pub(super) out: Dense,
    /// The weights transposed, [in, H] and [H, out], for the dense kernels.
    pub(super) hidden_t: Tensor,
    pub(super) out_t: Tensor,
    /// hidden, out, out_t and hidden_t as the tensor-core kernels read them, on first use.
    tc: OnceLock<[TcWeights; 4]>,
}

/// `weights` as `ops::tc_weights` makes them, made once into `cell` (on first use, which a
/// CUDA graph's warm-up calls make before its capture: no allocation inside it).
pub(super) fn tc_once<'a, const K: usize>(
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
    pub(super) fn new(hidden: Dense, out: Dense) -> Result<Self> {
        Ok(Self {
            hidden_t: hidden.weight.t()?.contiguous()?,
            out_t: out.weight.t()?.contiguous()?,
            hidden,
            out,
            tc: OnceLock::new(),
        })
    }

    pub(super) fn tc(&self) -> Result<&[TcWeights; 4]> {
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
    pub(super) fn fits_tensor_cores(&self, adjoint: bool) -> Result<bool> {
        let (h, k) = self.hidden.weight.dims2()?;
        let j = self.out.weight.dim(0)?;
        Ok(match adjoint {
            false => dense_tc_fits(k, h) && dense_tc_fits(h, j),
            true => dense_tc_fits(j, h) && dense_tc_fits(h, k),
        })
    }

    /// (pre-activation x W₁ᵀ, output before its bias): our dense kernels (two launches), the
    /// tensor-core MLP (one), or cuBLAS and the bias+SiLU kernel (three).
    pub(super) fn forward(&self, x: &Tensor, path: DensePath) -> Result<(Tensor, Tensor)> {
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
    pub(super) fn adjoint_from_hidden(
        &self,
        pre: &Tensor,
        g_h: &Tensor,
        path: DensePath,
    ) -> Result<Tensor> {
        if path == DensePath::Small {
            return dense_silu_adjoint(g_h, pre, &self.hidden.bias, &self.hidden.weight);
        }
        self.hidden
            .product_adjoint(&bias_silu_adjoint(pre, &self.hidden.bias, g_h)?)
    }

    /// dL/dx for dL/d(output) `g_out`.
    pub(super) fn adjoint(&self, pre: &Tensor, g_out: &Tensor, path: DensePath) -> Result<Tensor> {
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

#[derive(Clone)]
pub(super) struct Block {
    /// Filter weights transposed, bias as last row: [R + 1, 3F].
    pub(super) filter: Tensor,
    /// The same with three zero rows for the unit-vector columns of the basis, [R + 4, 3F]:
    /// basis · this = the filter rows.
    pub(super) filter_basis: Tensor,
    /// φ: F → F → 3F.
    pub(super) phi: Mlp,
    /// W_mix [2F, F] (no bias), and transposed.
    pub(super) mix: Tensor,
    pub(super) mix_t: Tensor,
    /// Both as the tensor-core kernels read them, on first use.
    pub(super) mix_tc: OnceLock<[TcWeights; 2]>,
    /// The update's context network: 2F → F → 3F.
    pub(super) ctx: Mlp,
}

impl Block {
    /// W_mix and its transpose as the tensor-core kernels read them (made on first use).
    pub(super) fn mix_tc(&self) -> Result<&[TcWeights; 2]> {
        tc_once(&self.mix_tc, [&self.mix, &self.mix_t])
    }
}

/// The first interaction block as sums per sending element (`ops::element_sums`): its context
/// φ_j + b is the element's and its vector features are zero, so its messaged state is the
/// per-atom sums of basis rows [4, N, K + elements] times these, made once: the filter
/// weights' scalar (s) and direction (d) parts times each element's context, [K = elements
/// (R + 1), F] (row z (R + 1) + r: W[r, part] ⊙ ctx_z[part]), and for the sums' one-hot
/// columns the embedding (s) or zeros (v), so that the initial state is added in the product.
#[derive(Clone)]
pub(super) struct FirstBlockSums {
    /// [4, K + elements, F]: the s part for the plain sums, the d part for each unit-vector
    /// component.
    pub(super) product: Tensor,
    /// The s and d parts transposed, [F, K] each (the adjoint's products).
    pub(super) scalar_t: Tensor,
    pub(super) direction_t: Tensor,
}

impl FusedPainn {
    /// The model's sizes (what the plan and the packed weights describe).
    pub fn shape(&self) -> Result<ModelShape> {
        Ok(ModelShape {
            hidden: self.hidden,
            n_rbf: self.n_rbf,
            blocks: self.blocks.len(),
            elements: self.embedding.dim(0)?,
            cutoff: self.cutoff,
        })
    }

    /// All weights in one buffer, laid out as [`ModelShape::packed_len`] says.
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
    pub(super) fn first_phi(&self) -> Result<&Tensor> {
        if let Some(t) = self.first_phi.get() {
            return Ok(t);
        }
        let first = &self.blocks[0].phi;
        let hidden = (self.embedding.matmul(&first.hidden_t)?).broadcast_add(&first.hidden.bias)?;
        let phi = hidden.silu()?.matmul(&first.out_t)?;
        Ok(self.first_phi.get_or_init(|| phi))
    }

    /// The first block's weights for its sums ([`FirstBlockSums`]), made on first use.
    pub(super) fn first_sums(&self) -> Result<&FirstBlockSums> {
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
}
