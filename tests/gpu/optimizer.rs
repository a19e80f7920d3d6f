//! The optimiser kernel (AdamW, clipping, EMA over flat buffers) on CUDA against its CPU twin.

use super::cuda;
use candle_core::{DType, Device, Tensor};
use mlff_distiller::ops::{adamw_ema, AdamWStep};

#[test]
fn adamw_ema_cuda_equals_cpu() {
    let n = 200_003;
    for (dtype, tol) in [(DType::F64, 1e-14), (DType::F32, 2e-6)] {
        let r = |seed: u64, dev: &Device| {
            let v: Vec<f64> = (0..n)
                .map(|k| ((k as f64 + seed as f64) * 0.37).sin())
                .collect();
            Tensor::new(v, dev).unwrap().to_dtype(dtype).unwrap()
        };
        // (The last gradient holds a NaN: both must leave everything as it was.)
        for (clip, decay, nan) in [(0.0, 0.0, false), (1.0, 0.99, false), (1.0, 0.99, true)] {
            let s = AdamWStep {
                lr: 1e-3,
                beta1: 0.9,
                beta2: 0.999,
                c1: 0.271,
                c2: 0.002997,
                eps: 1e-8,
                weight_decay: 0.01,
                clip,
                decay,
            };
            let run = |dev: &Device| {
                let v = r(3, dev).sqr().unwrap();
                let values = s.values(dtype, dev).unwrap();
                let mut g = r(1, dev);
                if nan {
                    let mut host = g.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap();
                    host[n / 2] = f64::NAN;
                    g = Tensor::new(host, dev).unwrap().to_dtype(dtype).unwrap();
                }
                let (a, b, c, d) =
                    adamw_ema(&g, &r(2, dev), &v, &r(4, dev), &r(5, dev), s, &values).unwrap();
                [a, b, c, d].map(|t| {
                    t.to_dtype(DType::F64)
                        .unwrap()
                        .to_device(&Device::Cpu)
                        .unwrap()
                        .to_vec1::<f64>()
                        .unwrap()
                })
            };
            let (gpu, cpu) = (run(&cuda()), run(&Device::Cpu));
            for (k, (x, y)) in gpu.iter().zip(&cpu).enumerate() {
                let scale = y.iter().fold(0.0f64, |m, v| m.max(v.abs()));
                let diff = x
                    .iter()
                    .zip(y)
                    .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
                assert!(
                    diff <= tol * scale,
                    "{dtype:?} clip {clip} NaN {nan} output {k}: {diff} of {scale}"
                );
            }
        }
    }
}
