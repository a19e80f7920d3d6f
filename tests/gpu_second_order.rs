//! Second-order gradients through the CUDA ops equal the CPU ones. A test binary of its own:
//! it sets CANDLE_GRAD_DO_NOT_DETACH, which candle reads once per thread, and that must not
//! leak into the first-order tests (kept gradient graphs hold every intermediate tensor).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor, Var};
use common::{max_abs_diff, random_index};
use mlff_distiller::ops::{gather, scatter_add};

/// First and second derivatives through the CUDA ops equal the CPU ones.
#[test]
fn cuda_ops_second_order_matches_cpu() {
    std::env::set_var("CANDLE_GRAD_DO_NOT_DETACH", "1");
    let run = |dev: &Device| {
        let x = Var::from_tensor(
            &Tensor::arange(0u32, 40, &Device::Cpu)
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .affine(0.05, -1.0)
                .unwrap()
                .reshape((10, 4))
                .unwrap()
                .to_device(dev)
                .unwrap(),
        )
        .unwrap();
        let g = Tensor::new(random_index(300, 10, 3), dev).unwrap();
        let s = Tensor::new(random_index(300, 6, 4), dev).unwrap();
        let y = scatter_add(
            &gather(x.as_tensor(), &g).unwrap().powf(3.0).unwrap(),
            &s,
            6,
        )
        .unwrap();
        let loss = y.sqr().unwrap().sum_all().unwrap();
        let grad = loss.backward().unwrap().get(x.as_tensor()).unwrap().clone();
        let loss2 = grad.sqr().unwrap().sum_all().unwrap();
        let hess = loss2
            .backward()
            .unwrap()
            .get(x.as_tensor())
            .unwrap()
            .clone();
        (
            grad.to_device(&Device::Cpu).unwrap(),
            hess.to_device(&Device::Cpu).unwrap(),
        )
    };
    let (g_cpu, h_cpu) = run(&Device::Cpu);
    let (g_gpu, h_gpu) = run(&Device::new_cuda(0).expect("a CUDA device"));
    let scale = |t: &Tensor| {
        t.abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    };
    assert!(max_abs_diff(&g_cpu, &g_gpu) <= 1e-12 * scale(&g_cpu));
    assert!(max_abs_diff(&h_cpu, &h_gpu) <= 1e-12 * scale(&h_cpu));
}
