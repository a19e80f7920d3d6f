//! The optimiser step over flat parameter buffers as one kernel (kernels/optimizer.cu):
//! gradient clipping with the norm read on the device, AdamW, and the EMA of the weights,
//! instead of a dozen candle ops and a host read of the gradient norm per training step. The
//! values that change every step (learning rate, bias corrections, EMA decay) are read from a
//! device tensor ([`AdamWStep::values`]), so that a captured training step replays with new
//! ones.

use crate::ops::launch::{kernel_source, launch, Init, Kernel, Real};
use candle_core::{bail, DType, Device, Result, Tensor};

/// The AdamW hyper-parameters of one step; `c1`, `c2` are the bias corrections 1 − βᵗ.
#[derive(Clone, Copy, Debug)]
pub struct AdamWStep {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub c1: f64,
    pub c2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Clip the gradient norm to this (0: no clipping).
    pub clip: f64,
    /// EMA decay of this step (0: the EMA is the new weights).
    pub decay: f64,
}

struct AdamWEma {
    n: usize,
    s: AdamWStep,
}

impl Kernel for AdamWEma {
    kernel_source!("adamw_ema", "optimizer");
    fn work(&self) -> usize {
        self.n.max(1)
    }
    fn sizes(&self) -> Vec<usize> {
        vec![self.n]
    }
    fn reals(&self) -> Vec<f64> {
        let s = &self.s;
        vec![s.beta1, s.beta2, s.eps, s.weight_decay, s.clip]
    }
    fn cpu<T: Real>(&self, x: &[&[T]], _: &[&[u32]], out: &mut [T]) {
        let [g, m, v, theta, ema, sq] = [x[0], x[1], x[2], x[3], x[4], x[5]];
        let f = |k: usize| candle_core::WithDType::to_f64(x[6][k]);
        let s = AdamWStep {
            lr: f(0),
            c1: f(1),
            c2: f(2),
            decay: f(3),
            ..self.s
        };
        let n = self.n;
        let norm = candle_core::WithDType::to_f64(sq[0]).sqrt();
        if !norm.is_finite() {
            // A gradient that is not finite leaves everything as it was (see the kernel).
            for (k, part) in [m, v, theta, ema].into_iter().enumerate() {
                out[k * n..(k + 1) * n].copy_from_slice(&part[..n]);
            }
            return;
        }
        let scale = T::of(if s.clip > 0.0 && norm > s.clip {
            s.clip / norm
        } else {
            1.0
        });
        let (b1, b2) = (T::of(s.beta1), T::of(s.beta2));
        let (nb1, nb2) = (T::of(1.0 - s.beta1), T::of(1.0 - s.beta2));
        let (c1, c2, eps, lr) = (T::of(s.c1), T::of(s.c2), T::of(s.eps), T::of(s.lr));
        let keep = T::of(1.0 - s.lr * s.weight_decay);
        let (d, nd) = (T::of(s.decay), T::of(1.0 - s.decay));
        for t in 0..n {
            let gs = g[t] * scale;
            let m1 = m[t] * b1 + gs * nb1;
            let v1 = v[t] * b2 + (gs * gs) * nb2;
            let update = (m1 / c1) / ((v1 / c2).sqrt() + eps);
            let th = theta[t] * keep - update * lr;
            out[t] = m1;
            out[n + t] = v1;
            out[2 * n + t] = th;
            out[3 * n + t] = if s.decay == 0.0 {
                th
            } else {
                ema[t] * d + th * nd
            };
        }
    }
}

impl AdamWStep {
    /// The values that change from step to step, [lr, c1, c2, decay], as the kernel reads
    /// them (`dtype` on `dev`).
    pub fn values(&self, dtype: DType, dev: &Device) -> Result<Tensor> {
        Tensor::new(&[self.lr, self.c1, self.c2, self.decay], dev)?.to_dtype(dtype)
    }
}

/// One AdamW step with EMA from the flat gradient `g`, moments `m`, `v`, weights `theta` and
/// EMA `ema` (all \[P\], one dtype): returns (m', v', theta', ema'). The step's learning rate,
/// bias corrections and decay come from `values` ([`AdamWStep::values`]), the rest of `step`
/// from its fields.
pub fn adamw_ema(
    g: &Tensor,
    m: &Tensor,
    v: &Tensor,
    theta: &Tensor,
    ema: &Tensor,
    step: AdamWStep,
    values: &Tensor,
) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    let n = g.elem_count();
    if values.dims() != [4] || values.dtype() != g.dtype() {
        bail!(
            "adamw_ema: step values {:?} {:?}, not [4] {:?}",
            values.dims(),
            values.dtype(),
            g.dtype()
        )
    }
    for (name, t) in [("m", m), ("v", v), ("theta", theta), ("ema", ema)] {
        if t.elem_count() != n || t.dtype() != g.dtype() {
            bail!(
                "adamw_ema: {name} is {:?} {:?}, the gradient {:?} {:?}",
                t.dtype(),
                t.dims(),
                g.dtype(),
                g.dims()
            )
        }
    }
    let sq = g.sqr()?.sum_all()?.reshape(1)?;
    let flat = |t: &Tensor| t.flatten_all();
    let (g, m, v, theta, ema) = (flat(g)?, flat(m)?, flat(v)?, flat(theta)?, flat(ema)?);
    let out = launch(
        AdamWEma { n, s: step },
        &[&g, &m, &v, &theta, &ema, &sq, values],
        &[],
        4 * n,
        Init::Uninit,
    )?;
    Ok((
        out.narrow(0, 0, n)?,
        out.narrow(0, n, n)?,
        out.narrow(0, 2 * n, n)?,
        out.narrow(0, 3 * n, n)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The candle ops the kernel replaced (AdamW on flat buffers, clipping by a host-read
    /// norm, the EMA), as the reference.
    fn by_ops(
        g: &Tensor,
        m: &Tensor,
        v: &Tensor,
        th: &Tensor,
        ema: &Tensor,
        s: AdamWStep,
    ) -> Vec<Tensor> {
        let norm = g
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
            .sqrt();
        let scale = if s.clip > 0.0 && norm > s.clip {
            s.clip / norm
        } else {
            1.0
        };
        let g = (g * scale).unwrap();
        let m1 = ((m * s.beta1).unwrap() + (&g * (1.0 - s.beta1)).unwrap()).unwrap();
        let v1 = ((v * s.beta2).unwrap() + (g.sqr().unwrap() * (1.0 - s.beta2)).unwrap()).unwrap();
        let upd = ((&m1 / s.c1).unwrap()
            / ((&v1 / s.c2).unwrap().sqrt().unwrap() + s.eps).unwrap())
        .unwrap();
        let th1 = ((th * (1.0 - s.lr * s.weight_decay)).unwrap() - (upd * s.lr).unwrap()).unwrap();
        let e1 = if s.decay == 0.0 {
            th1.clone()
        } else {
            ((ema * s.decay).unwrap() + (&th1 * (1.0 - s.decay)).unwrap()).unwrap()
        };
        vec![m1, v1, th1, e1]
    }

    #[test]
    fn a_gradient_that_is_not_finite_changes_nothing() {
        let dev = Device::Cpu;
        let r = |k: f64| Tensor::new(&[0.5 * k, -1.0, 2.0 + k], &dev).unwrap();
        let g = Tensor::new(&[1.0, f64::NAN, 0.0], &dev).unwrap();
        let s = AdamWStep {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            c1: 0.1,
            c2: 0.001,
            eps: 1e-8,
            weight_decay: 0.01,
            clip: 10.0,
            decay: 0.9,
        };
        let values = s.values(DType::F64, &dev).unwrap();
        let inputs = [r(1.0), r(2.0).abs().unwrap(), r(3.0), r(4.0)];
        let [m, v, th, ema] = &inputs;
        let (a, b, c, d) = adamw_ema(&g, m, v, th, ema, s, &values).unwrap();
        for (got, want) in [a, b, c, d].iter().zip(&inputs) {
            assert_eq!(
                got.to_vec1::<f64>().unwrap(),
                want.to_vec1::<f64>().unwrap()
            );
        }
    }

    #[test]
    fn the_kernel_twin_equals_the_ops_it_replaced() {
        let dev = Device::Cpu;
        for (dtype, tol) in [(DType::F64, 1e-14), (DType::F32, 1e-6)] {
            let r = |seed: u64| {
                let v: Vec<f64> = (0..1000)
                    .map(|k| ((k as f64 + seed as f64) * 0.7).sin())
                    .collect();
                Tensor::new(v, &dev).unwrap().to_dtype(dtype).unwrap()
            };
            let (g, m, v, th, ema) = (r(1), (r(2) * 0.1).unwrap(), r(3).sqr().unwrap(), r(4), r(5));
            for (clip, decay) in [(0.0, 0.0), (1.0, 0.99), (1e6, 0.5)] {
                let s = AdamWStep {
                    lr: 1e-3,
                    beta1: 0.9,
                    beta2: 0.999,
                    c1: 1.0 - 0.9f64.powi(3),
                    c2: 1.0 - 0.999f64.powi(3),
                    eps: 1e-8,
                    weight_decay: 0.01,
                    clip,
                    decay,
                };
                let values = s.values(dtype, &dev).unwrap();
                let (a, b, c, d) = adamw_ema(&g, &m, &v, &th, &ema, s, &values).unwrap();
                for (got, want) in [a, b, c, d].iter().zip(by_ops(&g, &m, &v, &th, &ema, s)) {
                    let diff = (got - &want).unwrap().abs().unwrap().max_all().unwrap();
                    let scale = want.abs().unwrap().max_all().unwrap();
                    let (diff, scale) = (
                        diff.to_dtype(DType::F64)
                            .unwrap()
                            .to_scalar::<f64>()
                            .unwrap(),
                        scale
                            .to_dtype(DType::F64)
                            .unwrap()
                            .to_scalar::<f64>()
                            .unwrap(),
                    );
                    assert!(
                        diff <= tol * scale.max(1e-30),
                        "{dtype:?} clip {clip}: {diff} of {scale}"
                    );
                }
            }
        }
    }
}
