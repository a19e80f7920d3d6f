//! AdamW with decoupled weight decay (as PyTorch's), with state that can be saved and resumed
//! (candle's own optimiser keeps its moments private).
//!
//! Moments and the update live in flat vectors of all trainable weights: one step is a few
//! dozen launches on the GPU (a gather of the gradients, the update, a copy into each
//! variable) instead of about a dozen per variable. The moments keep their buffers (they are
//! `Var`s, written in place), so that a captured training step (`step_graph`) updates them.

use crate::error::Result;
use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use std::collections::BTreeMap;

pub struct AdamW {
    /// Trainable variables by name.
    vars: Vec<(String, Var)>,
    /// Where each variable starts in the flat vectors.
    starts: Vec<usize>,
    m: Var,
    v: Var,
    pub step: u64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdamW {
    pub fn new(vars: Vec<(String, Var)>, weight_decay: f64) -> Result<Self> {
        let mut starts = Vec::with_capacity(vars.len());
        let mut total = 0;
        for (_, v) in &vars {
            starts.push(total);
            total += v.elem_count();
        }
        let (dtype, device) = match vars.first() {
            Some((_, v)) => (v.dtype(), v.device().clone()),
            None => (candle_core::DType::F32, candle_core::Device::Cpu),
        };
        let m = Var::zeros(total, dtype, &device)?;
        let v = Var::zeros(total, dtype, &device)?;
        Ok(Self {
            vars,
            starts,
            m,
            v,
            step: 0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
        })
    }

    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// One flat vector from a tensor per variable, in the variables' order.
    pub fn flatten(&self, part: impl Fn(usize, &Var) -> Result<Tensor>) -> Result<Tensor> {
        let parts = self
            .vars
            .iter()
            .enumerate()
            .map(|(k, (_, v))| Ok(part(k, v)?.flatten_all()?))
            .collect::<Result<Vec<_>>>()?;
        Ok(Tensor::cat(&parts, 0)?)
    }

    /// Views of a flat vector shaped like each variable, in the variables' order.
    pub fn unflatten(&self, flat: &Tensor) -> Result<Vec<Tensor>> {
        self.vars
            .iter()
            .zip(&self.starts)
            .map(|((_, v), &s)| Ok(flat.narrow(0, s, v.elem_count())?.reshape(v.shape())?))
            .collect()
    }

    /// The gradients of the trainable variables as one flat vector (zero for a variable the
    /// loss does not depend on).
    pub fn flat_grads(&self, grads: &GradStore) -> Result<Tensor> {
        self.flatten(|_, v| {
            Ok(match grads.get(v.as_tensor()) {
                Some(g) => g.detach(),
                None => v.as_tensor().zeros_like()?,
            })
        })
    }

    /// The current weights as one flat vector.
    pub fn flat_weights(&self) -> Result<Tensor> {
        self.flatten(|_, v| Ok(v.as_tensor().detach()))
    }

    /// The next step's hyper-parameters: learning rate `lr`, the gradient norm clipped to
    /// `clip` (0: none), EMA decay `decay` (0: the EMA is the weights).
    pub fn next_step(&self, lr: f64, clip: f64, decay: f64) -> crate::ops::AdamWStep {
        let t = (self.step + 1) as i32;
        crate::ops::AdamWStep {
            lr,
            beta1: self.beta1,
            beta2: self.beta2,
            c1: 1.0 - self.beta1.powi(t),
            c2: 1.0 - self.beta2.powi(t),
            eps: self.eps,
            weight_decay: self.weight_decay,
            clip,
            decay,
        }
    }

    /// One AdamW update from the flat gradient `g` (see [`flat_grads`](Self::flat_grads)) as
    /// `step` says, its learning rate, bias corrections and decay read from `values`
    /// ([`AdamWStep::values`](crate::ops::AdamWStep::values)), the EMA `ema` updated with it,
    /// all in one kernel ([`crate::ops::adamw_ema`]); the moments, the variables and `ema` are
    /// written in place. Device work only (the step count is the caller's to advance).
    pub fn update(
        &self,
        g: &Tensor,
        step: crate::ops::AdamWStep,
        values: &Tensor,
        ema: &Var,
    ) -> Result<()> {
        let theta = self.flat_weights()?;
        let (m, v, theta, e) =
            crate::ops::adamw_ema(g, &self.m, &self.v, &theta, ema, step, values)?;
        self.m.set(&m)?;
        self.v.set(&v)?;
        ema.set(&e)?;
        for ((_, var), value) in self.vars.iter().zip(self.unflatten(&theta)?) {
            var.set(&value)?;
        }
        Ok(())
    }

    /// Copies of the moments and the weights, for [`restore`](Self::restore).
    pub(super) fn snapshot(&self) -> Result<[Tensor; 3]> {
        Ok([
            self.m.as_tensor().copy()?,
            self.v.as_tensor().copy()?,
            self.flat_weights()?,
        ])
    }

    /// Puts back the moments and weights of a [`snapshot`](Self::snapshot), in place.
    pub(super) fn restore(&self, [m, v, theta]: &[Tensor; 3]) -> Result<()> {
        self.m.set(m)?;
        self.v.set(v)?;
        for ((_, var), value) in self.vars.iter().zip(self.unflatten(theta)?) {
            var.set(&value)?;
        }
        Ok(())
    }

    /// Moments as named tensors (`m.NAME`, `v.NAME`), for a resumable training state.
    pub fn state(&self) -> Result<BTreeMap<String, Tensor>> {
        let mut out = BTreeMap::new();
        let (m, v) = (self.unflatten(&self.m)?, self.unflatten(&self.v)?);
        for (((name, _), m), v) in self.vars.iter().zip(m).zip(v) {
            out.insert(format!("m.{name}"), m.copy()?);
            out.insert(format!("v.{name}"), v.copy()?);
        }
        Ok(out)
    }

    /// Restores moments saved by [`state`](Self::state); every variable must be present.
    pub fn load_state(&mut self, state: &BTreeMap<String, Tensor>, step: u64) -> Result<()> {
        let named = |prefix: &str| {
            self.flatten(|k, var| {
                let name = &self.vars[k].0;
                let key = format!("{prefix}.{name}");
                let t = state
                    .get(&key)
                    .ok_or_else(|| crate::Error::Train(format!("optimiser state lacks `{key}`")))?;
                Ok(t.to_device(var.device())?
                    .to_dtype(var.dtype())?
                    .reshape(var.shape())?)
            })
        };
        let (m, v) = (named("m")?, named("v")?);
        self.m.set(&m)?;
        self.v.set(&v)?;
        self.step = step;
        Ok(())
    }
}
