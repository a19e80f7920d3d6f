//! Stress on CUDA against the CPU: the strain derivative through the model's autograd graph,
//! every backend, a batch of boxes (orthorhombic, triclinic) and a molecule.

use crate::common::*;
use crate::{cuda, shipped_calculator};
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
