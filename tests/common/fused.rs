//! Random inputs for the fused kernels, the kernels' outputs (forward and adjoint) on any
//! device, and the same quantities from candle's stock ops and backprop (the reference).
#![allow(dead_code)]

use candle_core::{DType, Device, Result, Tensor, Var};
use mlff_distiller::model::PainnInputs;
use mlff_distiller::model::{cosine_cutoff, gaussian_rbf};
use mlff_distiller::ops::{self, EdgeFilter, FeatureSplitPlan, InteractionInputs, StateGrad};
use mlff_distiller::{Batch, PainnCalculator, Structure, Tuning};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Sizes of one case: atoms, edges, features, Gaussians.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub n: usize,
    pub e: usize,
    pub f: usize,
    pub r: usize,
}

/// A shape of `n` atoms, `e` edges, `f` features and `r` basis functions.
pub const fn shape(n: usize, e: usize, f: usize, r: usize) -> Shape {
    Shape { n, e, f, r }
}

/// Zero edges, one edge, isolated atoms (more atoms than edges reach), F below and at a
/// multiple of the warp size (the CUDA adjoint's two reduction paths).
pub const SHAPES: [Shape; 4] = [
    shape(3, 0, 4, 5),
    shape(2, 1, 6, 4),
    shape(40, 25, 12, 6),
    shape(30, 200, 32, 8),
];

pub const CUTOFF: f64 = 4.0;

/// Inputs on the CPU; every float tensor is in `dtype`.
pub struct Inputs {
    pub shape: Shape,
    /// Every edge's reverse is in the list (`Inputs::symmetric`), as the interaction's
    /// `symmetric_edges` then says.
    pub symmetric: bool,
    pub positions: Tensor,
    pub offsets: Tensor,
    pub centers: Tensor,
    pub neighbors: Tensor,
    pub phi: Tensor,
    pub phi_bias: Tensor,
    pub filter: Tensor,
    pub state: Tensor,
    pub mixed: Tensor,
    pub act: Tensor,
    pub act_bias: Tensor,
    /// Upstream gradients: of the state [4N, F], vector rows [3N, F] (twice), s rows [N, F],
    /// the basis [E, R + 4], the context [N, 2F], an activation [N, F].
    pub g_state: Tensor,
    pub g_rows: Tensor,
    pub g_rows2: Tensor,
    pub g_s: Tensor,
    pub g_basis: Tensor,
    pub g_ctx: Tensor,
    /// Weights of a dense layer F → 3F, as [F, 3F].
    pub dense_w: Tensor,
}

/// A tensor of `shape` with values uniform in (−scale, scale), made on the CPU.
pub fn random(rng: &mut ChaCha8Rng, shape: &[usize], scale: f64, dtype: DType) -> Tensor {
    let len = shape.iter().product();
    let v: Vec<f64> = (0..len)
        .map(|_| scale * rng.random_range(-1.0..1.0))
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu)
        .and_then(|t| t.to_dtype(dtype))
        .unwrap()
}

pub fn inputs(shape: Shape, dtype: DType, seed: u64) -> Inputs {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let Shape { n, e, f, r } = shape;
    let mut ci = Vec::with_capacity(e);
    let mut nj = Vec::with_capacity(e);
    for _ in 0..e {
        let i = rng.random_range(0..n as u32);
        // j != i, so that no edge has length zero (offsets are small).
        let j = (i + 1 + rng.random_range(0..(n as u32 - 1).max(1))) % n as u32;
        ci.push(i);
        nj.push(j);
    }
    let mut g = |s: &[usize], scale: f64| random(&mut rng, s, scale, dtype);
    Inputs {
        shape,
        symmetric: false,
        // Distances from ~0 to ~8 Å: both sides of the 4 Å cutoff.
        positions: g(&[n, 3], 2.5),
        offsets: g(&[e, 3], 0.3),
        centers: Tensor::new(ci, &Device::Cpu).unwrap(),
        neighbors: Tensor::new(nj, &Device::Cpu).unwrap(),
        phi: g(&[n, 3 * f], 1.0),
        phi_bias: g(&[3 * f], 0.5),
        filter: g(&[r + 1, 3 * f], 1.0),
        state: g(&[4 * n, f], 1.0),
        mixed: g(&[3 * n, 2 * f], 1.0),
        act: g(&[n, 3 * f], 1.0),
        act_bias: g(&[3 * f], 0.5),
        g_state: g(&[4 * n, f], 1.0),
        g_rows: g(&[3 * n, f], 1.0),
        g_rows2: g(&[3 * n, f], 1.0),
        g_s: g(&[n, f], 1.0),
        g_basis: g(&[e, r + 4], 1.0),
        g_ctx: g(&[n, 2 * f], 1.0),
        dense_w: g(&[f, 3 * f], 0.5),
    }
}

impl Inputs {
    /// The same edges in the order neighbour lists give them, sorted by receiving atom (the
    /// tiled kernels sum runs of edges per receiver in registers); `inputs` leaves them random.
    pub fn sorted_by_receiver(self) -> Self {
        let ci = self.centers.to_vec1::<u32>().unwrap();
        let mut order: Vec<u32> = (0..ci.len() as u32).collect();
        order.sort_by_key(|&e| ci[e as usize]);
        let order = Tensor::new(order, &Device::Cpu).unwrap();
        let take = |t: &Tensor| t.index_select(&order, 0).unwrap();
        Inputs {
            offsets: take(&self.offsets),
            centers: take(&self.centers),
            neighbors: take(&self.neighbors),
            g_basis: take(&self.g_basis),
            ..self
        }
    }

    /// The same inputs with every float tensor in `dtype` (f32 inputs as exact f64 ones, for a
    /// reference of the f32 kernels).
    pub fn to_dtype(&self, dtype: DType) -> Self {
        let c = |t: &Tensor| t.to_dtype(dtype).unwrap();
        Inputs {
            shape: self.shape,
            symmetric: self.symmetric,
            positions: c(&self.positions),
            offsets: c(&self.offsets),
            centers: self.centers.clone(),
            neighbors: self.neighbors.clone(),
            phi: c(&self.phi),
            phi_bias: c(&self.phi_bias),
            filter: c(&self.filter),
            state: c(&self.state),
            mixed: c(&self.mixed),
            act: c(&self.act),
            act_bias: c(&self.act_bias),
            g_state: c(&self.g_state),
            g_rows: c(&self.g_rows),
            g_rows2: c(&self.g_rows2),
            g_s: c(&self.g_s),
            g_basis: c(&self.g_basis),
            g_ctx: c(&self.g_ctx),
            dense_w: c(&self.dense_w),
        }
    }

    /// The list with every edge's reverse added (j <- i with the offset negated; the upstream
    /// basis gradient repeated), sorted by receiving atom as neighbour lists are.
    pub fn symmetric(self) -> Self {
        let both = |a: &Tensor, b: &Tensor| Tensor::cat(&[a, b], 0).unwrap();
        Inputs {
            offsets: both(&self.offsets, &self.offsets.neg().unwrap()),
            centers: both(&self.centers, &self.neighbors),
            neighbors: both(&self.neighbors, &self.centers),
            g_basis: both(&self.g_basis, &self.g_basis),
            symmetric: true,
            shape: Shape {
                e: 2 * self.shape.e,
                ..self.shape
            },
            ..self
        }
        .sorted_by_receiver()
    }
}

/// The interaction's output gradient (on the CPU): dL/ds (g_state's scalar rows) and the whole
/// dL/dv (g_state's vector rows plus g_rows).
fn output_grad(x: &Inputs) -> Result<(Tensor, Tensor)> {
    let n = x.shape.n;
    let v = (x.g_state.narrow(0, n, 3 * n)? + &x.g_rows)?;
    Ok((x.g_state.narrow(0, 0, n)?, v))
}

/// Every fused output, by name, computed on `dev`.
pub fn fused_outputs(x: &Inputs, dev: &Device) -> Result<Vec<(&'static str, Tensor)>> {
    let d = |t: &Tensor| t.to_device(dev);
    let Shape { n, f, r, .. } = x.shape;
    let (pos, off, ci, nj) = (
        d(&x.positions)?,
        d(&x.offsets)?,
        d(&x.centers)?,
        d(&x.neighbors)?,
    );
    let basis = ops::edge_basis(&pos, &off, &ci, &nj, r, CUTOFF)?;
    let g_pos = ops::edge_basis_adjoint(&pos, &off, &d(&x.g_basis)?, &ci, &nj, r, CUTOFF)?;
    let (phi, pb, filter, state) = (d(&x.phi)?, d(&x.phi_bias)?, d(&x.filter)?, d(&x.state)?);
    // The interaction uses the reference's basis, so its check does not depend on edge_basis.
    let ref_basis = d(&reference_basis(x)?)?;
    let inter = InteractionInputs {
        phi: &phi,
        phi_bias: &pb,
        filter: EdgeFilter::Weights(&filter),
        basis: &ref_basis,
        state: &state,
        centers: &ci,
        neighbors: &nj,
        symmetric_edges: x.symmetric,
        tuning: &Tuning::default(),
    };
    let messaged = ops::interaction(&inter)?;
    // The output gradient as the adjoint takes it: dL/ds, and the whole dL/dv (g_state's
    // vector rows plus g_rows), with the later blocks' dL/d(basis) (here g_basis) to add.
    let (g_out_s, g_out_v) = output_grad(x)?;
    let (g_out_s, g_out_v, g_after) = (d(&g_out_s)?, d(&g_out_v)?, d(&x.g_basis)?);
    let grads = ops::interaction_adjoint(&inter, &g_out_s, &g_out_v, Some(&g_after))?;
    // The same with precomputed filter rows: basis · [weights; 0] (the unit-vector columns
    // of the basis have zero weights), and dL/d(basis) completed from dL/d(rows).
    let filter_basis = Tensor::cat(&[&filter, &filter.zeros_like()?.narrow(0, 0, 3)?], 0)?;
    // Complete whether the adjoint summed it or left dL/dw as rows (tiled, on CUDA).
    let g_basis = grads.complete_basis(&filter_basis)?;
    let filter_rows = ref_basis.matmul(&filter_basis)?;
    let with_rows = InteractionInputs {
        filter: EdgeFilter::Rows(&filter_rows),
        ..inter
    };
    let messaged_rows = ops::interaction(&with_rows)?;
    let rows = ops::interaction_adjoint(&with_rows, &g_out_s, &g_out_v, None)?;
    let g_b_rows = rows.complete_basis(&filter_basis)?;
    let (mixed, act, ab) = (d(&x.mixed)?, d(&x.act)?, d(&x.act_bias)?);
    let ctx = ops::update_context(&state, &mixed)?;
    let combined = ops::update_combine(&state, &mixed, &act, &ab)?;
    let (g_s, g_state, g_rows, g_rows2) =
        (d(&x.g_s)?, d(&x.g_state)?, d(&x.g_rows)?, d(&x.g_rows2)?);
    let grad = StateGrad {
        gx: &g_s,
        next: Some((&g_state, &g_rows, &g_rows2)),
    };
    let packed = ops::update_combine_adjoint(&mixed, &act, &ab, &grad)?;
    let last = ops::update_combine_adjoint(
        &mixed,
        &act,
        &ab,
        &StateGrad {
            gx: &g_s,
            next: None,
        },
    )?;
    // In place: on a copy, `packed` is an output of its own.
    let (g_ctx_state, g_ctx_mixed) =
        ops::update_context_adjoint(&mixed, &d(&x.g_ctx)?, packed.copy()?)?;
    let pre = d(&x.phi)?.narrow(1, 0, f)?;
    let bias = d(&x.phi_bias)?.narrow(0, 0, f)?;
    let silu = ops::bias_silu(&pre, &bias)?;
    let g_silu = ops::bias_silu_adjoint(&pre, &bias, &g_s)?;
    let g_silu_row = ops::bias_silu_adjoint(&pre, &bias, &g_s.narrow(0, 0, 1.min(n))?)?;
    // Dense layers: x [N, F] times w [F, 3F]; the adjoint takes the layer's weight wᵀ [3F, F].
    let (xd, dense_w, dense_wt) = (
        d(&x.g_s)?,
        d(&x.dense_w)?,
        d(&x.dense_w.t()?.contiguous()?)?,
    );
    let dense_out = ops::dense(&xd, &dense_w)?;
    let dense_silu = ops::dense_silu(&xd, &dense_w, &pb)?;
    let pre = dense_silu.narrow(0, 0, n)?;
    let g3 = d(&x.act)?;
    let dense_adj = ops::dense_silu_adjoint(&g3, &pre, &pb, &dense_wt)?;
    let dense_adj_row = ops::dense_silu_adjoint(&g3.narrow(0, 0, 1)?, &pre, &pb, &dense_wt)?;
    Ok(vec![
        ("edge basis", basis),
        ("edge basis adjoint", g_pos),
        ("interaction", messaged),
        ("interaction adjoint v", grads.v),
        ("interaction adjoint phi", grads.phi),
        ("interaction adjoint basis", g_basis),
        ("interaction, filter rows", messaged_rows),
        ("interaction adjoint v, filter rows", rows.v),
        ("interaction adjoint phi, filter rows", rows.phi),
        ("interaction adjoint basis, filter rows", g_b_rows),
        ("update context", ctx),
        ("update combine", combined),
        ("update combine adjoint", packed),
        ("update combine adjoint (last block)", last),
        ("update context adjoint state", g_ctx_state),
        ("update context adjoint mixed", g_ctx_mixed),
        ("bias silu", silu),
        ("bias silu adjoint", g_silu),
        ("bias silu adjoint (row)", g_silu_row),
        ("dense", dense_out),
        ("dense silu", dense_silu),
        ("dense silu adjoint", dense_adj),
        ("dense silu adjoint (row)", dense_adj_row),
        // The PaiNN initial state, here φ's rows at every edge's sender.
        ("initial state", ops::initial_state(&phi, &nj)?),
    ])
}

/// The edge basis from candle's stock ops and `model::radial`.
fn composed_basis(x: &Inputs, positions: &Tensor) -> Result<Tensor> {
    let r_ij = ((positions.index_select(&x.neighbors, 0)?
        - positions.index_select(&x.centers, 0)?)?
        + &x.offsets)?;
    let d = r_ij.sqr()?.sum(1)?.sqrt()?;
    let fc = cosine_cutoff(&d, CUTOFF)?.unsqueeze(1)?;
    let rbf = gaussian_rbf(&d, x.shape.r, CUTOFF)?.broadcast_mul(&fc)?;
    Tensor::cat(&[&rbf, &fc, &r_ij.broadcast_div(&d.unsqueeze(1)?)?], 1)
}

fn reference_basis(x: &Inputs) -> Result<Tensor> {
    if x.shape.e == 0 {
        return Tensor::zeros((0, x.shape.r + 4), x.positions.dtype(), &Device::Cpu);
    }
    composed_basis(x, &x.positions)
}

/// Gradient of `loss` for `v`, zeros when `v` does not reach it.
fn grad(loss: &Tensor, v: &Var) -> Result<Tensor> {
    match loss.backward()?.get(v.as_tensor()) {
        Some(g) => Ok(g.clone()),
        None => v.as_tensor().zeros_like(),
    }
}

/// Σ out ⊙ g, or 0 for empty tensors (candle's CPU reductions dislike empty rows).
fn dot(out: &Tensor, g: &Tensor) -> Result<Tensor> {
    (out * g)?.sum_all()
}

/// The state's s rows and three vector rows.
fn split(state: &Tensor, n: usize) -> Result<(Tensor, [Tensor; 3])> {
    Ok((
        state.narrow(0, 0, n)?,
        [1, 2, 3].map(|a| state.narrow(0, a * n, n).unwrap()),
    ))
}

/// The same outputs as [`fused_outputs`] from candle's stock ops (forward) and candle's
/// backprop of Σ output ⊙ upstream gradient (adjoints), on the CPU.
pub fn reference_outputs(x: &Inputs) -> Result<Vec<(&'static str, Tensor)>> {
    let Shape { n, e, f, r } = x.shape;
    let dtype = x.positions.dtype();
    let mut out = Vec::new();

    // Edge basis and its adjoint.
    let pos = Var::from_tensor(&x.positions)?;
    let basis = reference_basis(x)?;
    let g_pos = if e == 0 {
        x.positions.zeros_like()?
    } else {
        grad(
            &dot(&composed_basis(x, pos.as_tensor())?, &x.g_basis)?,
            &pos,
        )?
    };
    out.push(("edge basis", basis.clone()));
    out.push(("edge basis adjoint", g_pos));

    // Interaction: filter = basis[:, :R+1] · filter, messages gathered at j, summed at i.
    let phi = Var::from_tensor(&x.phi)?;
    let state = Var::from_tensor(&x.state)?;
    let bvar = Var::from_tensor(&basis)?;
    let (s, v) = split(state.as_tensor(), n)?;
    let messaged = if e == 0 {
        x.state.clone()
    } else {
        let b = bvar.as_tensor();
        let w = b.narrow(1, 0, r + 1)?.matmul(&x.filter)?;
        let xs = (phi
            .as_tensor()
            .broadcast_add(&x.phi_bias)?
            .index_select(&x.neighbors, 0)?
            * w)?;
        let part = |p: usize| xs.narrow(1, p * f, f);
        let scatter = |t: &Tensor| {
            Tensor::zeros((n, f), dtype, &Device::Cpu)?.index_add(&x.centers, &t.contiguous()?, 0)
        };
        let mut rows = vec![(s + scatter(&part(0)?)?)?];
        for (a, va) in v.iter().enumerate() {
            let dir = b.narrow(1, r + 1 + a, 1)?;
            let m = (part(1)?.broadcast_mul(&dir)?
                + (part(2)? * va.index_select(&x.neighbors, 0)?)?)?;
            rows.push((va + scatter(&m)?)?);
        }
        Tensor::cat(&rows, 0)?
    };
    out.push(("interaction", messaged.clone()));
    let (g_out_s, g_out_v) = output_grad(x)?;
    let g_total = Tensor::cat(&[&g_out_s, &g_out_v], 0)?;
    let (g_v, g_phi, g_basis) = if e == 0 {
        (
            x.g_rows.zeros_like()?,
            x.phi.zeros_like()?,
            basis.zeros_like()?,
        )
    } else {
        let loss = dot(&messaged, &g_total)?;
        let grads = loss.backward()?;
        let g = |v: &Var| grads.get(v.as_tensor()).cloned().unwrap();
        // The adjoint leaves out the identity path of the vector rows.
        let g_v = (g(&state).narrow(0, n, 3 * n)? - g_total.narrow(0, n, 3 * n)?)?;
        (g_v, g(&phi), g(&bvar))
    };
    out.push(("interaction adjoint v", g_v.clone()));
    out.push(("interaction adjoint phi", g_phi.clone()));
    // The fused adjoint adds the later blocks' dL/d(basis) (here x.g_basis).
    out.push(("interaction adjoint basis", (&g_basis + &x.g_basis)?));
    // The filter-rows path computes the same four quantities (adding nothing to the basis'):
    out.push(("interaction, filter rows", messaged.clone()));
    out.push(("interaction adjoint v, filter rows", g_v));
    out.push(("interaction adjoint phi, filter rows", g_phi));
    out.push(("interaction adjoint basis, filter rows", g_basis));

    // Update: context [s, ‖Vv‖] and combine, with their adjoints.
    let mixed = Var::from_tensor(&x.mixed)?;
    let act = Var::from_tensor(&x.act)?;
    let state = Var::from_tensor(&x.state)?;
    let (s, v) = split(state.as_tensor(), n)?;
    let uv = |a: usize, p: usize| mixed.as_tensor().narrow(0, a * n, n)?.narrow(1, p * f, f);
    let norm = ((uv(0, 1)?.sqr()? + uv(1, 1)?.sqr()?)? + uv(2, 1)?.sqr()?)?;
    let norm = (norm + ops_norm_eps())?.sqrt()?;
    let ctx = Tensor::cat(&[&s, &norm], 1)?;
    out.push(("update context", ctx.clone()));
    let a = act.as_tensor().broadcast_add(&x.act_bias)?;
    let ap = |p: usize| a.narrow(1, p * f, f);
    let dot_uv =
        (((uv(0, 0)? * uv(0, 1)?)? + (uv(1, 0)? * uv(1, 1)?)?)? + (uv(2, 0)? * uv(2, 1)?)?)?;
    let mut rows = vec![((&s + ap(0)?)? + (ap(2)? * dot_uv)?)?];
    for (k, va) in v.iter().enumerate() {
        rows.push((va + (uv(k, 0)? * ap(1)?)?)?);
    }
    let combined = Tensor::cat(&rows, 0)?;
    out.push(("update combine", combined.clone()));
    let packed = |g: &Tensor| -> Result<(Tensor, Tensor, Tensor)> {
        let grads = dot(&combined, g)?.backward()?;
        let get = |v: &Var| grads.get(v.as_tensor()).cloned().unwrap();
        Ok((get(&state), get(&mixed), get(&act)))
    };
    let g_next = Tensor::cat(
        &[
            &(&x.g_s + x.g_state.narrow(0, 0, n)?)?,
            &(&x.g_rows + &x.g_rows2)?,
        ],
        0,
    )?;
    let flat = |(a, b, c): (Tensor, Tensor, Tensor)| -> Result<Tensor> {
        Tensor::cat(&[a.flatten_all()?, b.flatten_all()?, c.flatten_all()?], 0)
    };
    let with_next = packed(&g_next)?;
    out.push(("update combine adjoint", flat(with_next.clone())?));
    let g_last = Tensor::cat(
        &[&x.g_s, &Tensor::zeros((3 * n, f), dtype, &Device::Cpu)?],
        0,
    )?;
    out.push((
        "update combine adjoint (last block)",
        flat(packed(&g_last)?)?,
    ));
    let grads = dot(&ctx, &x.g_ctx)?.backward()?;
    let g_state_ctx = grads.get(state.as_tensor()).cloned().unwrap();
    let g_mixed_ctx = grads.get(mixed.as_tensor()).cloned().unwrap();
    out.push(("update context adjoint state", (with_next.0 + g_state_ctx)?));
    out.push(("update context adjoint mixed", (with_next.1 + g_mixed_ctx)?));

    // silu(x + b).
    let pre = Var::from_tensor(&x.phi.narrow(1, 0, f)?.contiguous()?)?;
    let bias = x.phi_bias.narrow(0, 0, f)?;
    let silu = pre.as_tensor().broadcast_add(&bias)?.silu()?;
    out.push(("bias silu", silu.clone()));
    out.push(("bias silu adjoint", grad(&dot(&silu, &x.g_s)?, &pre)?));
    let row = x.g_s.narrow(0, 0, 1.min(n))?;
    out.push((
        "bias silu adjoint (row)",
        grad(&silu.broadcast_mul(&row)?.sum_all()?, &pre)?,
    ));
    // Dense layers: candle's matmul, silu and backprop of Σ silu(x w + b) ⊙ g for x.
    let xv = Var::from_tensor(&x.g_s)?;
    let pre = xv.as_tensor().matmul(&x.dense_w)?;
    let act = pre.broadcast_add(&x.phi_bias)?.silu()?;
    out.push(("dense", pre.clone()));
    out.push(("dense silu", Tensor::cat(&[&pre, &act], 0)?));
    out.push(("dense silu adjoint", grad(&dot(&act, &x.act)?, &xv)?));
    let row = x.act.narrow(0, 0, 1)?;
    out.push((
        "dense silu adjoint (row)",
        grad(&act.broadcast_mul(&row)?.sum_all()?, &xv)?,
    ));
    let s0 = x.phi.index_select(&x.neighbors, 0)?;
    let v0 = Tensor::zeros((3 * e, 3 * f), dtype, &Device::Cpu)?;
    out.push(("initial state", Tensor::cat(&[&s0, &v0], 0)?));
    Ok(out)
}

fn ops_norm_eps() -> f64 {
    mlff_distiller::ops::NORM_EPS
}

/// Per-atom energies and forces of `x` by the one-kernel path (`ops::feature_split`), on
/// whatever device `x` lives.
pub fn feature_split_call(calc: &PainnCalculator, x: &PainnInputs) -> (Tensor, Tensor) {
    feature_split_blocks(calc, x, ops::GROUPS).unwrap()
}

/// [`feature_split_call`] split over `groups` thread blocks; `None` where that split does not fit
/// the device.
pub fn feature_split_blocks(
    calc: &PainnCalculator,
    x: &PainnInputs,
    groups: usize,
) -> Option<(Tensor, Tensor)> {
    let fused = calc.fused().unwrap();
    let (n, e) = (x.positions.dim(0).unwrap(), x.centers.dim(0).unwrap());
    let mut plan = FeatureSplitPlan::new(fused.shape().unwrap(), n, e)
        .and_then(|p| p.with_groups(groups))
        .unwrap();
    if x.positions.device().is_cuda() {
        plan = plan.fit(x.positions.device(), x.positions.dtype()).ok()?;
    }
    Some(fused.feature_split(&plan, x).unwrap())
}

/// Molecules, a lone atom, an atom beyond the cutoff of all others, and a periodic box (image
/// offsets), flattened into one system as the kernel takes them.
pub fn feature_split_systems() -> Batch {
    let mut far = super::random_molecule(6, 51);
    far.positions.push([30.0, 0.0, 0.0]);
    far.numbers.push(7);
    Batch::new(vec![
        far,
        Structure::molecule(vec![1], vec![[0.0; 3]]),
        super::random_box(20, 0.2, 52),
    ])
    .unwrap()
}
