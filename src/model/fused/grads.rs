//! Weight gradients by the fused path: ∂(Σᵢ cᵢ Eᵢ)/∂θ for per-atom seeds cᵢ, by the same
//! hand-written adjoint as the forces. Each dense layer's gradient is one product of its saved
//! input with the adjoint at its output (cuBLAS), the filter's is summed over the edges inside
//! the interaction's adjoint kernel on CUDA (`interaction_weight_adjoint`: each edge's dL/dw
//! times its basis row, no [E, 3F] rows) and is one product of the basis with dL/d(rows) on the
//! CPU, where the plan keeps filter rows; the first block's φ, computed per element, takes its
//! atoms' adjoints summed per element. What training's fused force gradient
//! (`train::ForceGradient::Fused`) runs over a batch's displaced copies.
//!
//! The forward keeps what this needs besides the forces' tape (each block's messaged state),
//! so it runs the per-layer kernels whose adjoints expose every layer's output gradient:
//! per-edge blocks (with the filter formed in the kernel on CUDA), the update block as separate
//! layers.
//! Its dense layers take cuBLAS where inference would take the tensor-core kernels: those
//! read weights packed on the host once per model, and training changes them every step.

use super::pass::{FusedForward, ReadoutTape};
use super::weights::Mlp;
use super::FusedPainn;
use crate::model::PainnInputs;
use crate::ops::{
    act_grad, bias_silu, bias_silu_adjoint, interaction_adjoint, interaction_weight_adjoint,
    scatter_add, update_combine_adjoint, update_context, update_context_adjoint, EdgeFilter,
    InteractionInputs, StateGrad,
};
use candle_core::{bail, Result, Tensor};

/// The gradients of a two-layer MLP's weights and biases.
struct MlpGrads {
    hidden_weight: Tensor,
    hidden_bias: Tensor,
    out_weight: Tensor,
    out_bias: Tensor,
}

impl MlpGrads {
    /// The four as (variable name, gradient) under `prefix` (`prefix.context1.weight`, ...).
    fn named(self, prefix: &str, names: [&str; 2]) -> [(String, Tensor); 4] {
        let [hidden, out] = names;
        [
            (format!("{prefix}.{hidden}.weight"), self.hidden_weight),
            (format!("{prefix}.{hidden}.bias"), self.hidden_bias),
            (format!("{prefix}.{out}.weight"), self.out_weight),
            (format!("{prefix}.{out}.bias"), self.out_bias),
        ]
    }
}

/// dL/dx of `mlp` and its weights' gradients, for dL/d(output before its bias) `g_out`
/// [M, J], from its input `x` [M, K] and pre-activation `pre` [M, H] (without the hidden
/// bias, as the forward keeps it).
fn mlp_backward(mlp: &Mlp, x: &Tensor, pre: &Tensor, g_out: &Tensor) -> Result<(Tensor, MlpGrads)> {
    let hidden = bias_silu(pre, &mlp.hidden.bias)?;
    let g_hidden = g_out.matmul(&mlp.out.weight)?;
    let g_pre = bias_silu_adjoint(pre, &mlp.hidden.bias, &g_hidden)?;
    let grads = MlpGrads {
        out_weight: g_out.t()?.matmul(&hidden)?,
        out_bias: g_out.sum(0)?,
        hidden_weight: g_pre.t()?.matmul(x)?,
        hidden_bias: g_pre.sum(0)?,
    };
    Ok((g_pre.matmul(&mlp.hidden.weight)?, grads))
}

impl FusedPainn {
    /// ∂(Σᵢ seedᵢ Eᵢ)/∂θ for the per-atom seeds `seed` \[N\], Eᵢ the atom energies, by the
    /// name of each of [`Painn`](crate::model::Painn)'s variables (the readout's fitted
    /// statistics, `readout.atom_ref`, `scale` and `shift`, left out: training keeps them).
    pub fn weight_gradients(
        &self,
        x: &PainnInputs,
        seed: &Tensor,
    ) -> Result<Vec<(String, Tensor)>> {
        let cuda = x.species.device().is_cuda();
        let plan = self.layer_plan(x)?.for_weight_gradients(cuda);
        self.forward_planned(x, plan, true)?.weight_gradients(seed)
    }
}

impl FusedForward<'_> {
    /// See [`FusedPainn::weight_gradients`]; the pass must have kept what it needs.
    fn weight_gradients(&self, seed: &Tensor) -> Result<Vec<(String, Tensor)>> {
        let (m, x, plan) = (self.model, self.inputs, &self.plan);
        let (n, f, r) = (x.species.dim(0)?, m.hidden, m.n_rbf);
        if seed.dims() != [n] {
            bail!("weight gradients: seeds {:?} do not fit [{n}]", seed.dims())
        }
        let ReadoutTape::Pre(pre) = &self.readout else {
            bail!("weight gradients: the forward kept no readout pre-activation")
        };
        // The readout: its output weights are the model's times the scale, its bias is in the
        // per-element constants.
        let (mut gx, ro) = mlp_backward(&m.readout, &self.last_s, pre, &seed.unsqueeze(1)?)?;
        let scale = &m.readout_scale;
        let mut named = vec![
            ("readout.hidden.weight".to_string(), ro.hidden_weight),
            ("readout.hidden.bias".to_string(), ro.hidden_bias),
            (
                "readout.out.weight".to_string(),
                ro.out_weight.broadcast_mul(scale)?,
            ),
            (
                "readout.out.bias".to_string(),
                (seed.sum_keepdim(0)? * scale)?,
            ),
        ];
        let mut next: Option<(Tensor, Tensor, Tensor)> = None;
        let mut filter = Vec::with_capacity(m.blocks.len());
        let mut embedding = None;
        for (k, (b, t)) in m.blocks.iter().zip(&self.tape).enumerate().rev() {
            let (Some(messaged), Some(phi), Some(state)) = (&t.messaged, &t.phi, &t.state) else {
                bail!("weight gradients: block {k}'s forward kept no messaged state")
            };
            let grad = StateGrad {
                gx: &gx,
                next: next.as_ref().map(|(a, b, c)| (a, b, c)),
            };
            // The update block, layer by layer.
            let combined = update_combine_adjoint(&t.mixed, &t.act, &b.ctx.out.bias, &grad)?;
            let context = update_context(messaged, &t.mixed)?;
            let g_act = act_grad(&combined, n, f)?;
            let (g_ctx, ctx) = mlp_backward(&b.ctx, &context, &t.ctx_pre, &g_act)?;
            let (g_messaged, g_mixed) = update_context_adjoint(&t.mixed, &g_ctx, combined)?;
            let mix = g_mixed.t()?.matmul(&messaged.narrow(0, n, 3 * n)?)?;
            let g_v = m.mix_adjoint_adding(b, &g_mixed, &g_messaged.narrow(0, n, 3 * n)?, plan)?;
            let g_s = g_messaged.narrow(0, 0, n)?;
            // The interaction: its filter's gradient from the dL/dw rows.
            let mut rows = t.rows.clone();
            let inputs = InteractionInputs {
                phi,
                phi_bias: &b.phi.out.bias,
                filter: m.filter(b, &self.basis, &mut rows, plan)?,
                basis: &self.basis,
                state,
                centers: &x.centers,
                neighbors: &x.neighbors,
                symmetric_edges: true,
                tuning: &m.tuning,
            };
            let grads = match inputs.filter {
                EdgeFilter::Weights(_) => interaction_weight_adjoint(&inputs, &g_s, &g_v)?,
                // dL/dW = basis[:, ..R + 1]ᵀ · dL/d(rows): the rows are basis · W.
                EdgeFilter::Rows(_) => {
                    let mut g = interaction_adjoint(&inputs, &g_s, &g_v, None)?;
                    let Some(rows) = g.filter_rows.take() else {
                        bail!("weight gradients: the interaction adjoint left no dL/d(rows)")
                    };
                    let basis = self.basis.narrow(1, 0, r + 1)?;
                    g.filter_weights = Some(basis.t()?.matmul(&rows)?);
                    g
                }
            };
            let Some(g_weights) = grads.filter_weights else {
                bail!("weight gradients: the interaction adjoint left no filter gradient")
            };
            filter.push(g_weights); // [R + 1, 3F]
            let phi_grads = match &t.phi_pre {
                Some(pre) => {
                    let s_in = state.narrow(0, 0, n)?;
                    let (g_in, g) = mlp_backward(&b.phi, &s_in, pre, &grads.phi)?;
                    gx = g_in;
                    next = Some((g_s, g_v, grads.v));
                    g
                }
                None => {
                    // The first block: φ of each element's embedding row, and the state the
                    // embedding itself.
                    let z = m.embedding.dim(0)?;
                    let g_phi = scatter_add(&grads.phi, &x.species, z)?;
                    let pre = m.embedding.matmul(&b.phi.hidden_t)?;
                    let (g_in, g) = mlp_backward(&b.phi, &m.embedding, &pre, &g_phi)?;
                    embedding = Some((scatter_add(&g_s, &x.species, z)? + g_in)?);
                    g
                }
            };
            let block = format!("blocks.{k}");
            named.extend(phi_grads.named(&format!("{block}.message"), ["context1", "context2"]));
            named.extend(ctx.named(&format!("{block}.update"), ["context1", "context2"]));
            named.push((format!("{block}.update.mix.weight"), mix));
        }
        let Some(embedding) = embedding else {
            bail!("weight gradients: the model has no interaction blocks")
        };
        named.push(("embedding.weight".to_string(), embedding));
        // The filter network's rows of each block, in block order: weights [3F, R], bias.
        filter.reverse();
        let weights = filter
            .iter()
            .map(|g| g.narrow(0, 0, r)?.t())
            .collect::<Result<Vec<_>>>()?;
        let biases = filter
            .iter()
            .map(|g| g.get(r))
            .collect::<Result<Vec<_>>>()?;
        named.push(("filter.weight".to_string(), Tensor::cat(&weights, 0)?));
        named.push(("filter.bias".to_string(), Tensor::cat(&biases, 0)?));
        Ok(named)
    }
}
