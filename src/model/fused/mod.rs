//! PaiNN energies and forces with fused kernels and an explicit adjoint pass.
//!
//! A call runs as the plan says (`crate::plan`): one launch for feature splits on CUDA (the
//! atom split or the feature split), else a kernel per layer ([`pass`]): the forward keeps what
//! the adjoint needs and the adjoint is written out by hand, so a call is a few tens of
//! launches instead of the ~1,000 of candle's backprop, which would also add a zeros + add pair
//! for every input of every op and compute weight gradients that inference never uses. Below
//! the tuning's filter-rows threshold no [E, F]-sized tensor exists at all (the filter is
//! formed inside the interaction kernels); from there each block's filter rows W(r) [E, 3F]
//! are one cuBLAS product, kept for the adjoint up to the tuning's bytes. On CUDA the filter is
//! formed in the tiled kernels again: in f32 at every size they take (on tensor cores, their
//! adjoint summing dL/d(basis) itself), in f64 from the tuning's edge count (on CUDA cores,
//! their adjoint leaving dL/dw as rows). The weights are read once (`FusedPainn::new`);
//! training makes a fused form every step ([`FusedPainn::used_once`]) and takes the weights'
//! gradients from the same adjoint (`grads`, [`FusedPainn::weight_gradients`]).
//!
//! The first block runs as sums per sending element (`ops::element_sums`): its context is its
//! sender's element's and its vector features are zero, so per-atom sums of basis rows times
//! precomputed weights (one cuBLAS product) give its messages exactly, and its adjoint ends in
//! the forces in one kernel, with no per-edge, per-feature work at all.
//!
//! State tensors are component-major [4N, F] (s, then v_x, v_y, v_z), so that s and v are
//! contiguous row ranges that cuBLAS takes without copies.

mod grads;
mod layered;
mod pass;
mod shells;
mod weights;

pub use layered::LayeredPass;
pub use pass::FusedForward;
pub use shells::ShellCall;

use super::painn::{Painn, PainnInputs};
use crate::ops::{atom_split, feature_split, AtomSplitPlan, FeatureSplitPlan};
use crate::plan::{LayerPlan, Plan, SystemSize, Target};
use crate::tuning::Tuning;
use candle_core::{DType, Device, Result, Tensor};
use std::sync::OnceLock;
use weights::{Block, Dense, FirstBlockSums, Mlp};

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
    /// The readout's scale [1] (in its output weights here; the weight gradients take it out).
    readout_scale: Tensor,
    /// What the plan picks paths from.
    tuning: Tuning,
    /// Run the CUDA paths' CPU twins on the CPU (tests).
    cpu_twins: bool,
    /// The weights serve one call (training builds this every step): no path that packs them
    /// on the host first.
    used_once: bool,
    /// The weights packed for the one-launch paths, input-major and output-major, on first use.
    packed: OnceLock<Tensor>,
    packed_out_major: OnceLock<Tensor>,
    /// The first block's φ (before its output bias) per element, on first use.
    first_phi: OnceLock<Tensor>,
    /// The first block's messages by sums per sending element ([`FirstBlockSums`]).
    first_sums: OnceLock<FirstBlockSums>,
}

impl FusedPainn {
    /// The fused form of `model`, its paths picked under `tuning`.
    pub fn new(model: &Painn, tuning: &Tuning) -> Result<Self> {
        let cfg = model.config();
        let (f, r) = (cfg.hidden, cfg.n_rbf);
        if r > crate::ops::FUSED_MAX_RBF {
            candle_core::bail!(
                "the model has {r} radial functions; the fused kernels (--backend fused, the \
                 default) take at most {}: run it with --backend autograd, or train with n_rbf \
                 <= {}",
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
            readout_scale: scale,
            tuning: tuning.clone(),
            cpu_twins: false,
            used_once: false,
            packed: std::sync::OnceLock::new(),
            packed_out_major: std::sync::OnceLock::new(),
            first_phi: std::sync::OnceLock::new(),
            first_sums: std::sync::OnceLock::new(),
        })
    }

    /// The same weights with paths picked under `tuning` (every path gives the same forces).
    pub fn with_tuning(mut self, tuning: Tuning) -> Self {
        self.tuning = tuning;
        self
    }

    /// Runs the CUDA paths' CPU twins (our dense kernels, tensor-core layers) on the CPU where
    /// the tuning would take them on CUDA: for tests of those twins; slower than candle's gemm.
    pub fn with_cpu_twins(mut self, on: bool) -> Self {
        self.cpu_twins = on;
        self
    }

    /// Weights for one call (`on`): the plan then leaves out the tensor-core layers, whose
    /// weights are packed on the host first
    /// ([`LayerPlan::without_packed_weights`](crate::plan::LayerPlan::without_packed_weights)).
    pub fn used_once(mut self, on: bool) -> Self {
        self.used_once = on;
        self
    }

    /// The tuning the plan picks paths from.
    pub fn tuning(&self) -> &Tuning {
        &self.tuning
    }

    fn target<'a>(&self, device: &'a Device, dtype: DType) -> Target<'a> {
        Target {
            device,
            dtype,
            cpu_twins: self.cpu_twins,
        }
    }

    /// How a call on `x` runs.
    pub fn plan(&self, x: &PainnInputs) -> Result<Plan> {
        let size = size_of(x)?;
        let target = self.target(x.positions.device(), x.positions.dtype());
        crate::plan::plan(&self.tuning, &self.shape()?, size, target)
    }

    /// How a call of `size` on `device` in `dtype` runs.
    pub fn plan_for(&self, size: SystemSize, device: &Device, dtype: DType) -> Result<Plan> {
        let target = self.target(device, dtype);
        crate::plan::plan(&self.tuning, &self.shape()?, size, target)
    }

    /// The per-layer choices for `x` (what [`forward`](Self::forward) follows).
    fn layer_plan(&self, x: &PainnInputs) -> Result<LayerPlan> {
        let target = self.target(x.positions.device(), x.positions.dtype());
        let plan = crate::plan::layers(&self.tuning, &self.shape()?, size_of(x)?, target);
        Ok(match self.used_once {
            true => plan.without_packed_weights(),
            false => plan,
        })
    }

    /// The feature-split launch for `n` atoms and `e` edges on `dev` in `dtype`, where the
    /// tuning takes it (whatever the atom split would do): the launch MD steps fold their
    /// integrator into.
    pub fn feature_split_plan(
        &self,
        n: usize,
        e: usize,
        dev: &Device,
        dtype: DType,
    ) -> Result<Option<FeatureSplitPlan>> {
        let size = SystemSize { atoms: n, edges: e };
        let target = self.target(dev, dtype);
        Ok(crate::plan::feature_split(
            &self.tuning,
            &self.shape()?,
            size,
            target,
        ))
    }

    /// Per-atom energies \[N\] and forces [N, 3] as the plan says.
    pub fn energies_and_forces(&self, x: &PainnInputs) -> Result<(Tensor, Tensor)> {
        match self.one_launch(x)? {
            Some(out) => Ok(out),
            None => self.by_layers(x),
        }
    }

    /// Per-atom energies \[N\] and forces [N, 3] in one launch where the plan takes one.
    pub fn one_launch(&self, x: &PainnInputs) -> Result<Option<(Tensor, Tensor)>> {
        match self.plan(x)? {
            Plan::AtomSplit(p) => self.atom_split(&p, x).map(Some),
            Plan::FeatureSplit(p) => self.feature_split(&p, x).map(Some),
            Plan::Layers(_) => Ok(None),
        }
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

    /// Per-atom energies \[N\] and forces [N, 3] as the feature-split kernel launched by
    /// `plan`.
    pub fn feature_split(
        &self,
        plan: &FeatureSplitPlan,
        x: &PainnInputs,
    ) -> Result<(Tensor, Tensor)> {
        feature_split(
            plan,
            self.packed_weights()?,
            &x.positions.detach(),
            &x.offsets,
            &x.species,
            &x.centers,
            &x.neighbors,
        )
    }

    /// Per-atom energies \[N\] and forces [N, 3] by [`forward`](Self::forward) and its
    /// adjoint, a kernel per layer: what CUDA graphs capture, as their replay beats the
    /// one-launch kernels there.
    pub fn by_layers(&self, x: &PainnInputs) -> Result<(Tensor, Tensor)> {
        let pass = self.forward(x)?;
        Ok((pass.atom_energies.clone(), pass.forces()?))
    }
}

/// The atoms and edges of `x`.
fn size_of(x: &PainnInputs) -> Result<SystemSize> {
    Ok(SystemSize {
        atoms: x.positions.dim(0)?,
        edges: x.centers.dim(0)?,
    })
}
