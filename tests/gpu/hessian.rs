//! Hessian-informed training on CUDA against the CPU: the students' H·v from fused forces, and
//! the loss's H·v term (double backward at x ± h·v) with a weight gradient (f64).

use crate::common::*;
use crate::{assert_same_loss, cuda, loss_and_gradient};
use candle_core::{DType, Device};
use mlff_distiller::train::{hessian_vector_products, Dataset, ForceGradient, TrainConfig};
use mlff_distiller::PainnCalculator;

#[test]
fn cuda_hessian_vector_products_match_cpu() {
    let cfg = small_config();
    let frames: Vec<_> = (0..3)
        .map(|k| random_molecule(6 + k, 70 + k as u64))
        .collect();
    let dirs: Vec<_> = (0..3)
        .map(|k| direction(frames[k].len(), k as u64))
        .collect();
    let run = |dev: &Device| {
        let calc = PainnCalculator::new(model(&cfg, 5, DType::F64, dev), dev.clone(), DType::F64);
        hessian_vector_products(&calc, &frames, &dirs, 1e-4).unwrap()
    };
    let (cpu, gpu) = (run(&Device::Cpu), run(&cuda()));
    let scale = cpu
        .iter()
        .flatten()
        .flatten()
        .fold(0.0f64, |m, x| m.max(x.abs()));
    for (x, y) in cpu
        .iter()
        .flatten()
        .flatten()
        .zip(gpu.iter().flatten().flatten())
    {
        assert!((x - y).abs() < 1e-7 * scale, "H·v {y} vs {x}");
    }
}

#[test]
fn cuda_hessian_loss_matches_cpu() {
    // Before the labels' backward passes: candle reads it at a thread's first backward.
    second_order();
    let cfg = small_config();
    let frames: Vec<_> = (0..4)
        .map(|k| random_molecule(5 + k, 80 + k as u64))
        .collect();
    let data = Dataset::from_frames(
        std::path::Path::new("hvp.extxyz"),
        hvp_labelled(&cfg, frames),
    )
    .unwrap();
    let train = TrainConfig {
        hessian_weight: 1.0,
        force_gradient: ForceGradient::DoubleBackward,
        ..TrainConfig::default()
    };
    let run = |dev: &Device| {
        let (t, loss, g) = loss_and_gradient(&cfg, &train, &data, dev);
        (loss, g, t.validate().unwrap().hvp_mae.unwrap())
    };
    let ((l_cpu, g_cpu, v_cpu), (l_gpu, g_gpu, v_gpu)) = (run(&Device::Cpu), run(&cuda()));
    assert_same_loss((l_cpu, &g_cpu), (l_gpu, &g_gpu));
    assert!(
        (v_cpu - v_gpu).abs() < 1e-7 * v_cpu,
        "validation H·v MAE {v_gpu} vs {v_cpu}"
    );
}
