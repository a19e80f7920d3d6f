//! The model and its ops on CUDA against the CPU: scatter/gather, the shipped model with each
//! backend, overlapping launches, the profiler and the fused message op.

use crate::common::*;
use crate::{assert_agree, cuda, shipped_calculator};
use candle_core::{DType, Device, Tensor};
use mlff_distiller::model::Backend;
use mlff_distiller::ops::{gather, scatter_add};
use mlff_distiller::systems::{aspirin, water_box};
use mlff_distiller::{Batch, Calculator};

/// Our CUDA scatter and gather against candle's CPU index_add / index_select, f32 and f64,
/// from zero edges up to 200k edges with 384-wide rows (PaiNN's vector messages).
#[test]
fn cuda_ops_match_cpu_candle() {
    let gpu = cuda();
    for dtype in [DType::F32, DType::F64] {
        for &(n_edges, n_atoms, row) in &[
            (0usize, 5usize, 3usize),
            (1, 1, 1),
            (1000, 37, 7),
            (200_000, 5_000, 384),
        ] {
            let src = Tensor::randn(0f32, 1.0, (n_edges, row), &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let idx = Tensor::new(random_index(n_edges, n_atoms, 1), &Device::Cpu).unwrap();
            let want = Tensor::zeros((n_atoms, row), dtype, &Device::Cpu)
                .unwrap()
                .index_add(&idx, &src, 0)
                .unwrap();
            let got = scatter_add(
                &src.to_device(&gpu).unwrap(),
                &idx.to_device(&gpu).unwrap(),
                n_atoms,
            )
            .unwrap();
            let tol = if dtype == DType::F32 { 1e-3 } else { 1e-10 };
            let d = max_abs_diff(&got, &want);
            assert!(d <= tol, "{dtype:?} scatter E={n_edges}: {d}");
            let table = want;
            let gi = Tensor::new(random_index(n_edges, n_atoms, 2), &Device::Cpu).unwrap();
            let want = table.index_select(&gi, 0).unwrap();
            let got = gather(
                &table.to_device(&gpu).unwrap(),
                &gi.to_device(&gpu).unwrap(),
            )
            .unwrap();
            assert_eq!(
                max_abs_diff(&got, &want),
                0.0,
                "{dtype:?} gather E={n_edges}"
            );
        }
    }
}

/// The shipped default-size model gives the same energies and forces on CUDA as on the CPU:
/// aspirin, a batch of 64 different molecules, a 5,000-atom periodic water box; f32 and f64;
/// our ops, candle's stock ops and the fused kernels (F = 128: the warp-reduction path). On
/// the box, f64 takes the fused path only: autograd's and the stock ops' saved edge tensors
/// there take tens of GB in f64, which ran the GPU out of memory beside this binary's other
/// tests (bench-log 80); their kernels are checked on the box in f32 and on the molecules in f64.
#[test]
fn cuda_model_matches_cpu() {
    let gpu = cuda();
    let molecules: Vec<_> = (0..64)
        .map(|k| random_molecule(5 + (k % 20) as usize, k))
        .collect();
    let cases = [
        ("aspirin", vec![aspirin()]),
        ("64 molecules", molecules),
        ("water box 5001 atoms", vec![water_box(1667, 0)]),
    ];
    for (label, structures) in cases {
        let batch = Batch::new(structures).unwrap();
        for (dtype, e_rel, f_rel) in [(DType::F32, 2e-5, 2e-4), (DType::F64, 1e-11, 1e-10)] {
            let cpu = shipped_calculator(&Device::Cpu, dtype, Backend::Autograd)
                .compute(&batch)
                .unwrap();
            for ops in [Backend::Autograd, Backend::Stock, Backend::Fused] {
                if label.starts_with("water box") && dtype == DType::F64 && ops != Backend::Fused {
                    continue;
                }
                let got = shipped_calculator(&gpu, dtype, ops)
                    .compute(&batch)
                    .unwrap();
                assert_agree(
                    &format!("{label} {dtype:?} {ops:?}"),
                    &cpu,
                    &got,
                    e_rel,
                    f_rel,
                );
            }
        }
    }
}

/// Kernels launched to overlap the previous one on their stream (`ops::overlap`) wait for
/// their predecessor before reading its output: the fused model in f32 on 64 aspirins and
/// water boxes of 999 and 3,000 atoms, whose calls launch the tensor-core dense layers, the
/// tiled interaction, the update (in one launch each way from 2,000 atoms), edge-basis and
/// initial-state kernels that way, twenty calls in a row against the CPU's. The sums' order
/// (atomics) moves the last bits; a kernel reading its predecessor's output early would be far
/// off.
#[test]
fn cuda_overlapping_launches_match_the_cpu() {
    let gpu = cuda();
    let calc = shipped_calculator(&gpu, DType::F32, Backend::Fused);
    let cpu = shipped_calculator(&Device::Cpu, DType::F32, Backend::Fused);
    let cases = [
        ("64 aspirins", vec![aspirin(); 64]),
        ("water box 999 atoms", vec![water_box(333, 5)]),
        ("water box 3,000 atoms", vec![water_box(1000, 6)]),
    ];
    for (label, structures) in cases {
        let batch = Batch::new(structures).unwrap();
        let want = cpu.compute(&batch).unwrap();
        for call in 0..20 {
            let got = calc.compute(&batch).unwrap();
            assert_agree(&format!("{label}, call {call}"), &want, &got, 2e-5, 2e-4);
        }
    }
}

/// The profiler on CUDA (events, memory pool queries) changes nothing in the results and
/// records every phase with device times.
#[test]
fn cuda_profiled_calculator_is_transparent() {
    use mlff_distiller::profiler::{Profiled, Profiler};
    let gpu = cuda();
    let batch = Batch::new(vec![aspirin(), water_box(100, 1)]).unwrap();
    let calc = calculator(DType::F32, &gpu);
    let plain = calc.compute(&batch).unwrap();
    let profiled = Profiled::new(
        calculator(DType::F32, &gpu),
        Profiler::new(&gpu, 1).unwrap(),
    );
    for _ in 0..3 {
        // Atomic scatters may add in another order from call to call: f32 round-off only.
        let p = profiled.compute(&batch).unwrap();
        for k in 0..2 {
            let (e, e0) = (p.energies[k], plain.energies[k]);
            assert!((e - e0).abs() <= 1e-6 * e0.abs(), "energy {e} vs {e0}");
            let scale = max_abs(&plain.forces[k]).max(1.0);
            let df = max_force_diff(&p.forces[k], &plain.forces[k]);
            assert!(
                df <= 1e-5 * scale,
                "forces differ by {df} (max |F| {scale})"
            );
        }
    }
    let r = profiled.profiler().report("gpu", 64.0 * 1048576.0);
    assert_eq!((r.calls, r.phases.len()), (3, 5));
    assert!(r.phases.iter().all(|p| p.stats.min > 0.0), "{:?}", r.phases);
    let m = r.memory[0];
    assert!(
        m.pool_used_bytes.is_some() && m.device_total_bytes.is_some(),
        "{m:?}"
    );
}

/// The fused message op on CUDA against its CPU twin (forward and every input's gradient), and
/// the whole model with it, f32 and f64.
#[test]
fn cuda_fused_message_matches_cpu() {
    use mlff_distiller::ops::message;
    let gpu = cuda();
    for dtype in [DType::F32, DType::F64] {
        for &(n, e, f) in &[(5usize, 0usize, 4usize), (13, 40, 8), (2_000, 60_000, 128)] {
            let r = |shape: &[usize]| {
                Tensor::randn(0f32, 1.0, shape, &Device::Cpu)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
            };
            let (phi, v, w, dir) = (r(&[n, 3 * f]), r(&[n, 3, f]), r(&[e, 3 * f]), r(&[e, 3]));
            let ci = Tensor::new(random_index(e, n, 1), &Device::Cpu).unwrap();
            let nj = Tensor::new(random_index(e, n, 2), &Device::Cpu).unwrap();
            let weights = r(&[n, 4 * f]);
            let run = |dev: &Device| {
                let vars: Vec<candle_core::Var> = [&phi, &v, &w, &dir]
                    .iter()
                    .map(|t| candle_core::Var::from_tensor(&t.to_device(dev).unwrap()).unwrap())
                    .collect();
                let out = message(
                    vars[0].as_tensor(),
                    vars[1].as_tensor(),
                    vars[2].as_tensor(),
                    vars[3].as_tensor(),
                    &ci.to_device(dev).unwrap(),
                    &nj.to_device(dev).unwrap(),
                )
                .unwrap();
                let loss = (&out * weights.to_device(dev).unwrap())
                    .unwrap()
                    .sum_all()
                    .unwrap();
                let g = loss.backward().unwrap();
                let grads: Vec<Tensor> = vars
                    .iter()
                    .map(|x| {
                        g.get(x.as_tensor())
                            .cloned()
                            .unwrap_or_else(|| x.as_tensor().zeros_like().unwrap())
                    })
                    .collect();
                (out, grads)
            };
            let (out_c, g_c) = run(&Device::Cpu);
            let (out_g, g_g) = run(&gpu);
            let scale = |t: &Tensor| max_abs_tensor(t).max(1.0);
            let tol = if dtype == DType::F32 { 2e-5 } else { 1e-12 };
            let what = format!("{dtype:?} N={n} E={e} F={f}");
            let d = max_abs_diff(&out_g, &out_c);
            assert!(d <= tol * scale(&out_c), "{what} forward: {d}");
            for (k, (a, b)) in g_g.iter().zip(&g_c).enumerate() {
                let d = max_abs_diff(a, b);
                assert!(d <= tol * scale(b), "{what} gradient {k}: {d}");
            }
        }
        // The whole model with the fused message, CUDA against CPU.
        let batch = Batch::new(vec![aspirin(), water_box(300, 4)]).unwrap();
        let cpu = calculator(dtype, &Device::Cpu)
            .with_backend(Backend::Fused)
            .compute(&batch)
            .unwrap();
        let cuda = calculator(dtype, &gpu)
            .with_backend(Backend::Fused)
            .compute(&batch)
            .unwrap();
        for k in 0..2 {
            let tol = if dtype == DType::F32 { 2e-5 } else { 1e-12 };
            let df = max_force_diff(&cuda.forces[k], &cpu.forces[k]);
            assert!(
                df <= tol * max_abs(&cpu.forces[k]).max(1.0),
                "{dtype:?} model forces {k}: {df}"
            );
            let de = (cuda.energies[k] - cpu.energies[k]).abs();
            assert!(
                de <= tol * cpu.energies[k].abs().max(1.0),
                "{dtype:?} model energy {k}: {de}"
            );
        }
    }
}
