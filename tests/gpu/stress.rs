//! Stress on CUDA against the CPU: the strain derivative through the model's autograd graph,
//! every backend, a batch of boxes (orthorhombic, triclinic) and a molecule.

use crate::common::*;
use crate::{assert_same_loss, cuda, loss_and_gradient, shipped_calculator};
use candle_core::{DType, Device};
use mlff_distiller::model::Backend;
use mlff_distiller::stress::voigt;
use mlff_distiller::Batch;

#[test]
fn cuda_stress_matches_cpu() {
    let batch = Batch::new(vec![
        random_box(40, 0.0, 1),
        random_molecule(9, 3),
        random_box(30, 0.3, 2),
    ])
    .unwrap();
    for backend in [Backend::Autograd, Backend::Stock, Backend::Fused] {
        let run = |dev: &Device| {
            calculator(DType::F64, dev)
                .with_backend(backend)
                .compute_with_stress(&batch)
                .unwrap()
        };
        let (cpu, gpu) = (run(&Device::Cpu), run(&cuda()));
        assert!(gpu.stresses[1].is_none());
        for k in [0, 2] {
            let (a, b) = (
                voigt(&cpu.stresses[k].unwrap()),
                voigt(&gpu.stresses[k].unwrap()),
            );
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() < 1e-9 * x.abs().max(1e-3),
                    "{backend:?} {k}: {a:?} vs {b:?}"
                );
            }
        }
    }
    // The shipped model in f32 on CUDA against f64 on the CPU.
    let water = Batch::from_one(mlff_distiller::systems::water_box(64, 5)).unwrap();
    let f64_cpu = shipped_calculator(&Device::Cpu, DType::F64, Backend::Fused)
        .compute_with_stress(&water)
        .unwrap();
    let f32_gpu = shipped_calculator(&cuda(), DType::F32, Backend::Fused)
        .compute_with_stress(&water)
        .unwrap();
    let (a, b) = (
        voigt(&f64_cpu.stresses[0].unwrap()),
        voigt(&f32_gpu.stresses[0].unwrap()),
    );
    let scale = a.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    for (x, y) in a.iter().zip(b) {
        assert!(
            (x - y).abs() < 1e-4 * scale,
            "f32 CUDA {b:?} vs f64 CPU {a:?}"
        );
    }
}

/// Per-atom virials from the fused force kernel on CUDA, atom by atom, against the CPU's (f64).
#[test]
fn cuda_atom_virials_match_cpu() {
    let batch = Batch::new(vec![random_box(40, 0.0, 1), random_box(30, 0.3, 2)]).unwrap();
    let run = |dev: &Device| {
        calculator(DType::F64, dev)
            .with_backend(Backend::Fused)
            .compute_with_virials(&batch)
            .unwrap()
            .1
    };
    let (cpu, gpu) = (run(&Device::Cpu), run(&cuda()));
    for (k, (a, b)) in cpu.iter().zip(&gpu).enumerate() {
        for (i, (wa, wb)) in a.iter().zip(b).enumerate() {
            for (x, y) in wa.iter().flatten().zip(wb.iter().flatten()) {
                assert!(
                    (x - y).abs() < 1e-9 * x.abs().max(1e-3),
                    "structure {k} atom {i}: CUDA {wb:?} vs CPU {wa:?}"
                );
            }
        }
    }
}

/// The training loss's stress term on CUDA, by the double backward through the strain and by
/// the strained copies (through autograd and through the fused adjoint): the loss and a weight
/// gradient equal the CPU's (f64).
#[test]
fn cuda_stress_loss_matches_cpu() {
    // Before the labels' backward passes: candle reads it at a thread's first backward.
    second_order();
    use mlff_distiller::train::{Dataset, ForceGradient, TrainConfig};
    let cfg = small_config();
    let frames: Vec<_> = (0..4)
        .map(|k| random_box(8 + k, 0.2, 60 + k as u64))
        .collect();
    let data = Dataset::from_frames(
        std::path::Path::new("boxes.extxyz"),
        stress_labelled(&cfg, frames),
    )
    .unwrap();
    for mode in [
        ForceGradient::DoubleBackward,
        ForceGradient::Directional,
        ForceGradient::Fused,
    ] {
        let train = TrainConfig {
            stress_weight: 1e4,
            force_gradient: mode,
            ..TrainConfig::default()
        };
        let run = |dev: &Device| {
            let (_, loss, g) = loss_and_gradient(&cfg, &train, &data, dev);
            (loss, g)
        };
        let ((l_cpu, g_cpu), (l_gpu, g_gpu)) = (run(&Device::Cpu), run(&cuda()));
        assert_same_loss((l_cpu, &g_cpu), (l_gpu, &g_gpu));
    }
}
