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
    let scale = common::max_abs_tensor;
    assert!(max_abs_diff(&g_cpu, &g_gpu) <= 1e-12 * scale(&g_cpu));
    assert!(max_abs_diff(&h_cpu, &h_gpu) <= 1e-12 * scale(&h_cpu));
}

/// One training step's loss and gradients agree between CUDA and the CPU, in f64, with either
/// force gradient (the double backward, and the directional one whose forces at x come from
/// the fused kernels).
#[test]
fn cuda_training_gradients_match_cpu() {
    use mlff_distiller::train::{Dataset, ForceGradient, TrainConfig};
    std::env::set_var("CANDLE_GRAD_DO_NOT_DETACH", "1");
    let cfg = common::small_config();
    let frames = (0..6)
        .map(|k| common::random_molecule(5 + k, k as u64))
        .collect();
    let frames = common::labelled(&cfg, frames);
    let ds = Dataset::from_frames(std::path::Path::new("mem"), frames).unwrap();
    for mode in [
        ForceGradient::DoubleBackward,
        ForceGradient::Directional,
        ForceGradient::Fused,
    ] {
        let tc = TrainConfig {
            force_gradient: mode,
            ..TrainConfig::default()
        };
        training_gradients_agree(&cfg, &tc, &ds);
    }
}

fn training_gradients_agree(
    cfg: &mlff_distiller::model::PainnConfig,
    tc: &mlff_distiller::train::TrainConfig,
    ds: &mlff_distiller::train::Dataset,
) {
    use mlff_distiller::train::Trainer;
    let grads_on = |dev: &Device| {
        let t = Trainer::new(cfg, tc, ds, ds, dev, DType::F64, None).unwrap();
        let (loss, g) = t.loss_and_grads(&[0, 1, 2, 3, 4, 5]).unwrap();
        let grads: Vec<Tensor> = t
            .optimizer()
            .vars()
            .iter()
            .map(|(_, v)| {
                g.get(v.as_tensor())
                    .unwrap()
                    .to_device(&Device::Cpu)
                    .unwrap()
            })
            .collect();
        (loss, grads)
    };
    let (l_cpu, g_cpu) = grads_on(&Device::Cpu);
    let (l_gpu, g_gpu) = grads_on(&Device::new_cuda(0).unwrap());
    assert!(
        (l_cpu - l_gpu).abs() <= 1e-10 * l_cpu.abs(),
        "{:?}: {l_cpu} vs {l_gpu}",
        tc.force_gradient
    );
    // The directional gradient divides the displaced copies' energy difference by 2h (h·u has
    // 1e-5 Å RMS in f64), so the devices' different summation orders (atomic adds on CUDA),
    // ~1e-16 of each energy, reach its weight gradients amplified by ~1/h: 1e-8 of the largest
    // gradient there (measured 1.7e-9 on an H100), 1e-9 for the exact double backward.
    let bound = match tc.force_gradient {
        mlff_distiller::train::ForceGradient::Directional
        | mlff_distiller::train::ForceGradient::Fused => 1e-8,
        _ => 1e-9,
    };
    for (a, b) in g_cpu.iter().zip(&g_gpu) {
        let scale = common::max_abs_tensor(a);
        assert!(
            max_abs_diff(a, b) <= bound * scale.max(1e-6),
            "{:?}: {} vs scale {scale}",
            tc.force_gradient,
            max_abs_diff(a, b)
        );
    }
}
