//! CUDA vs CPU agreement. Runs only with `--features cuda` on a machine with a GPU
//! (../shared/gpu/README.md); each check compares a CUDA result against its CPU twin.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use mlff_distiller::checkpoint;
use mlff_distiller::ops::{gather, scatter_add, EdgeOps};
use mlff_distiller::systems::{aspirin, water_box};
use mlff_distiller::{Batch, Calculator, PainnCalculator, Prediction};

fn cuda() -> Device {
    Device::new_cuda(0).expect("a CUDA device (these tests run on the GPU machine)")
}

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

fn shipped_calculator(dev: &Device, dtype: DType, ops: EdgeOps) -> PainnCalculator {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/painn-gfn2.safetensors");
    let ck = checkpoint::load(&path).unwrap();
    PainnCalculator::new(
        ck.model(dev, dtype).unwrap().with_ops(ops),
        dev.clone(),
        dtype,
    )
}

fn assert_agree(label: &str, a: &Prediction, b: &Prediction, e_rel: f64, f_rel: f64) {
    for (k, (ea, eb)) in a.energies.iter().zip(&b.energies).enumerate() {
        assert!(
            (ea - eb).abs() <= e_rel * ea.abs().max(1.0),
            "{label}: structure {k} E {ea} vs {eb}"
        );
    }
    let scale = max_abs(&a.forces.concat()).max(1e-3);
    let df = max_force_diff(&a.forces.concat(), &b.forces.concat());
    assert!(
        df <= f_rel * scale,
        "{label}: max |ΔF| {df} (max |F| {scale})"
    );
    println!("{label}: max |ΔF| / max |F| = {:.2e}", df / scale);
}

/// The shipped default-size model gives the same energies and forces on CUDA as on the CPU:
/// aspirin, a batch of 64 different molecules, a 5,000-atom periodic water box; f32 and f64;
/// our ops and candle's stock ops.
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
            let cpu = shipped_calculator(&Device::Cpu, dtype, EdgeOps::Custom)
                .compute(&batch)
                .unwrap();
            for ops in [EdgeOps::Custom, EdgeOps::Stock] {
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

/// The device-resident MD loop on CUDA follows the CPU trajectory: NVE and Langevin (same host
/// noise stream), f64, a molecule and a periodic water box (wrapping, neighbour rebuilds).
#[test]
fn cuda_md_matches_cpu_md() {
    use mlff_distiller::md::{
        host_positions, Ensemble, MdSettings, PainnForces, Simulation, StopReason,
    };
    let gpu = cuda();
    let ensembles = [
        Ensemble::Nve,
        Ensemble::Nvt {
            temperature: 300.0,
            friction: 10.0,
        },
    ];
    for s in [aspirin(), water_box(27, 3)] {
        for ensemble in ensembles {
            let settings = MdSettings {
                steps: 100,
                ensemble,
                skin: 0.2,
                traj_every: 0,
                stop_when_unstable: false,
                ..Default::default()
            };
            let run = |dev: &Device| {
                let calc = calculator(DType::F64, dev);
                let f = PainnForces::new(&calc, &s, settings.skin).unwrap();
                let mut sim =
                    Simulation::new(f, &s, settings.clone(), serde_json::Value::Null).unwrap();
                let summary = sim.run(&mut |_| {}).unwrap();
                assert_eq!(summary.stop, StopReason::Completed);
                (
                    host_positions(&sim.state().positions).unwrap(),
                    sim.records().last().unwrap().e_tot,
                    summary.neighbor_list_builds,
                )
            };
            let (x_cpu, e_cpu, builds) = run(&Device::Cpu);
            let (x_gpu, e_gpu, _) = run(&gpu);
            let dx = max_force_diff(&x_cpu, &x_gpu);
            let what = format!("{} atoms {}", s.len(), ensemble.name());
            assert!(
                dx < 1e-8,
                "{what}: positions differ by {dx} Å after 100 steps"
            );
            assert!(
                (e_cpu - e_gpu).abs() < 1e-8,
                "{what}: E_tot {e_cpu} vs {e_gpu}"
            );
            assert!(builds > 1, "{what}: the list was never rebuilt");
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
