//! AdamW with decoupled weight decay (as PyTorch's), with state that can be saved and resumed
//! (candle's own optimiser keeps its moments private).

use crate::error::Result;
use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use std::collections::BTreeMap;

pub struct AdamW {
    /// Trainable variables by name.
    vars: Vec<(String, Var)>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    pub step: u64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdamW {
    pub fn new(vars: Vec<(String, Var)>, weight_decay: f64) -> Result<Self> {
        let m = vars
            .iter()
            .map(|(_, v)| v.as_tensor().zeros_like())
            .collect::<candle_core::Result<Vec<_>>>()?;
        let v = m.clone();
        Ok(Self {
            vars,
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

    /// Global L2 norm of the gradients of the trainable variables (summed on the device, so
    /// the host waits once, not once per variable).
    pub fn grad_norm(&self, grads: &GradStore) -> Result<f64> {
        let mut total: Option<Tensor> = None;
        for (_, var) in &self.vars {
            if let Some(g) = grads.get(var.as_tensor()) {
                let sq = g.sqr()?.sum_all()?.to_dtype(candle_core::DType::F64)?;
                total = Some(match total {
                    None => sq,
                    Some(t) => (t + sq)?,
                });
            }
        }
        Ok(match total {
            Some(t) => t.to_scalar::<f64>()?.sqrt(),
            None => 0.0,
        })
    }

    /// One update with learning rate `lr`; gradients are multiplied by `grad_scale` first
    /// (gradient clipping). Variables without a gradient are left alone.
    pub fn step(&mut self, grads: &GradStore, lr: f64, grad_scale: f64) -> Result<()> {
        self.step += 1;
        let t = self.step as i32;
        let (b1, b2) = (self.beta1, self.beta2);
        let c1 = 1.0 - b1.powi(t);
        let c2 = 1.0 - b2.powi(t);
        for (k, (_, var)) in self.vars.iter().enumerate() {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            let g = (g.detach() * grad_scale)?;
            self.m[k] = ((&self.m[k] * b1)? + (&g * (1.0 - b1))?)?;
            self.v[k] = ((&self.v[k] * b2)? + (g.sqr()? * (1.0 - b2))?)?;
            let update = ((&self.m[k] / c1)? / ((&self.v[k] / c2)?.sqrt()? + self.eps)?)?;
            let theta = var.as_tensor().detach();
            let decayed = (&theta * (1.0 - lr * self.weight_decay))?;
            var.set(&(decayed - (update * lr)?)?)?;
        }
        Ok(())
    }

    /// Moments as named tensors (`m.NAME`, `v.NAME`), for a resumable training state.
    pub fn state(&self) -> BTreeMap<String, Tensor> {
        let mut out = BTreeMap::new();
        for (k, (name, _)) in self.vars.iter().enumerate() {
            out.insert(format!("m.{name}"), self.m[k].clone());
            out.insert(format!("v.{name}"), self.v[k].clone());
        }
        out
    }

    /// Restores moments saved by [`state`](Self::state); every variable must be present.
    pub fn load_state(&mut self, state: &BTreeMap<String, Tensor>, step: u64) -> Result<()> {
        for (k, (name, var)) in self.vars.iter().enumerate() {
            for (prefix, slot) in [("m", &mut self.m[k]), ("v", &mut self.v[k])] {
                let key = format!("{prefix}.{name}");
                let t = state
                    .get(&key)
                    .ok_or_else(|| crate::Error::Train(format!("optimiser state lacks `{key}`")))?;
                *slot = t
                    .to_device(var.device())?
                    .to_dtype(var.dtype())?
                    .reshape(var.shape())?;
            }
        }
        self.step = step;
        Ok(())
    }
}
