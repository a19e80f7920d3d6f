//! CUDA vs CPU agreement. Runs only with `--features cuda` on a machine with a GPU
//! (../shared/gpu/README.md); each check compares a CUDA result against its CPU twin.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use mlff_distiller::checkpoint;
use mlff_distiller::model::Backend;
use mlff_distiller::ops::{gather, scatter_add, SmallSystemPlan, GROUPS};
use mlff_distiller::systems::{aspirin, water_box};
use mlff_distiller::{Batch, Calculator, PainnCalculator, Prediction, Tuning};

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

fn shipped_calculator(dev: &Device, dtype: DType, ops: Backend) -> PainnCalculator {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/painn-gfn2.safetensors");
    let ck = checkpoint::load(&path).unwrap();
    PainnCalculator::new(
        ck.model(dev, dtype).unwrap().with_backend(ops),
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
/// our ops, candle's stock ops and the fused kernels (F = 128: the warp-reduction path).
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

/// The device-resident MD loop on CUDA follows the CPU trajectory: NVE and Langevin (same host
/// noise stream), f64, a molecule and a periodic water box (wrapping, neighbour rebuilds). On
/// CUDA the list checks are deferred (read back per run of steps), on the CPU checked per step.
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
                    summary.deferred_steps,
                )
            };
            let (x_cpu, e_cpu, builds, _) = run(&Device::Cpu);
            let (x_gpu, e_gpu, builds_gpu, deferred) = run(&gpu);
            println!("{} atoms: {builds} builds on the CPU, {builds_gpu} on CUDA, {deferred} steps deferred", s.len());
            assert!(
                deferred > 50,
                "only {deferred} of 100 steps deferred on CUDA"
            );
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

/// Every fused kernel (forward and adjoint) on CUDA equals its CPU twin: the test shapes (zero
/// edges, one edge, isolated atoms, F below and at a multiple of 32) and three large ones, which
/// take the tiled interaction kernels (from 8,192 edges): F = 128 (one feature chunk), F = 40
/// (threads past F idle) and F = 160 (a second, partial chunk of 128 features); the first with
/// its edges sorted by receiving atom as neighbour lists are, the others in random order; and
/// symmetric lists (every edge with its reverse, sorted) at F = 128, 40 and 160, whose adjoint
/// sums each atom's sending gradients over its own run of edges (in f32 on tensor cores). In
/// f32 the forward also runs as receiver sums (`ops::interaction_receiver_sums`) on every
/// shape, with a sparse sorted list (a quarter of the atoms receive nothing); a list with 25
/// basis rows takes the tensor-core tiles' forward, which the sums do not cover.
#[test]
fn cuda_fused_kernels_match_cpu() {
    use common::fused::{fused_outputs, inputs, shape, SHAPES};
    let gpu = cuda();
    let large = shape(2_000, 60_000, 128, 20);
    let odd = shape(500, 10_000, 40, 9);
    let wide = shape(400, 9_000, 160, 6);
    // F not a multiple of 4: the tensor-core tiles stage their weights value by value.
    let unaligned = shape(400, 9_000, 38, 7);
    let sparse = shape(6_000, 8_000, 128, 20);
    let deep = shape(1_000, 12_000, 128, 24);
    // F = 64: the tensor-core kernels' chunks of 64 features with F known at compile time (F =
    // 40 and 38 above take them with F at run time).
    let narrow = shape(800, 16_000, 64, 20);
    // Every tensor-core entry family (F = 128, 64, below 64, chunks of 128) at each of its
    // (swizzle, k steps) entries: 6, 12 and 17 radial functions take 1-3 k steps unswizzled,
    // 22 and 26 take 3 and 4 at stride 32, swizzled.
    let ks_shapes: Vec<_> = [128, 64, 40, 160]
        .iter()
        .flat_map(|&f| [6, 12, 17, 22, 26].map(|r| shape(300, 6_000, f, r)))
        .collect();
    // Every edge with its reverse: the adjoint that sums each atom's sending gradients over its
    // own run of edges (`symmetric_edges`), 60,000 edges.
    let half = shape(2_000, 30_000, 128, 20);
    for (dtype, tol) in [(DType::F32, 2e-5), (DType::F64, 1e-12)] {
        let mut cases: Vec<_> = SHAPES
            .iter()
            .chain([&odd, &wide, &unaligned])
            .enumerate()
            .map(|(k, shape)| inputs(*shape, dtype, 300 + k as u64))
            .collect();
        // The F = 128 shapes in neighbour-list order, the others in random order.
        cases.push(inputs(large, dtype, 310).sorted_by_receiver());
        // Sorted, with runs of 0-8 edges: a quarter of the atoms receive none (the receiver
        // sums' empty and partial runs); 25 basis rows, more than the receiver sums take (in
        // f32 the tensor-core tiles' forward).
        cases.push(inputs(sparse, dtype, 314).sorted_by_receiver());
        cases.push(inputs(deep, dtype, 315).sorted_by_receiver());
        cases.push(inputs(narrow, dtype, 318).sorted_by_receiver());
        cases.push(inputs(half, dtype, 311).symmetric());
        // F = 128 with another basis: the symmetric adjoint's generic entry at F = 128.
        cases.push(inputs(deep, dtype, 317).symmetric());
        // Symmetric lists of the other widths: in f32 the tensor-core adjoint with F not a
        // compile-time 128: in one chunk of 64 features with threads past F (40, 38), with two
        // chunks of 128 adding into dL/d(basis) (160), and at F = 64.
        cases.push(inputs(odd, dtype, 312).symmetric());
        cases.push(inputs(wide, dtype, 313).symmetric());
        cases.push(inputs(unaligned, dtype, 316).symmetric());
        cases.push(inputs(narrow, dtype, 319).symmetric());
        for (k, shape) in ks_shapes.iter().enumerate() {
            cases.push(inputs(*shape, dtype, 400 + k as u64).sorted_by_receiver());
            cases.push(inputs(*shape, dtype, 500 + k as u64).symmetric());
        }
        for x in &cases {
            let cpu = fused_outputs(x, &Device::Cpu).unwrap();
            let cuda = fused_outputs(x, &gpu).unwrap();
            for ((name, a), (_, b)) in cuda.iter().zip(&cpu) {
                let scale = max_abs_tensor(b).max(1.0);
                let d = max_abs_diff(a, b);
                assert!(
                    d <= tol * scale,
                    "{dtype:?} {:?} symmetric {} {name}: {d} (scale {scale})",
                    x.shape,
                    x.symmetric
                );
            }
        }
    }
}

/// The tensor-core dense layers (`ops::dense_tc`, split f16) against their CPU twins in f32:
/// one layer, the two-layer MLP with SiLU and its adjoint, from one row to 10,000 (rows past
/// the last block), the model's widths (128 → 128 → 384, the context MLP's
/// 256 inputs, its adjoint's 384-wide reduction: the compile-time variants) and others (the
/// kernels for any width; outputs padded within a chunk, a second chunk); the layer with an
/// addend (`dense_tc_adding`); the readout with the forces' seed (`readout_tc`) at 1-5,000 rows.
/// The first block's sums per sending element (`ops::element_sums`) and their adjoint on CUDA
/// against their CPU twins, f32 and f64: zero edges, an isolated atom, unsorted edges, 32
/// elements, 28 radial functions, and a water-sized list (10,000 atoms, 540,000 edges sorted
/// by receiver); the adjoint with and without the later blocks' rows. The sums' order
/// (atomics) moves the last bits in f32.
#[test]
fn cuda_element_sums_match_cpu() {
    use common::element_sums::SumsCase;
    let gpu = cuda();
    let cases = [
        (9, 60, 3, 5, true, false),
        (13, 200, 4, 20, false, true),
        (4, 0, 2, 20, true, true),
        (40, 3_000, 32, 3, true, false),
        (7, 500, 2, 28, false, false),
        (10_000, 540_000, 4, 20, true, false),
    ];
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
        for (k, &(n, e, z, r, sorted, isolated)) in cases.iter().enumerate() {
            let cpu = SumsCase::new(n, e, z, r, sorted, isolated, dtype, 90 + k as u64);
            let cuda = cpu.to(&gpu);
            let what = format!("{dtype:?} case {k} ({n} atoms, {e} edges)");
            let want = cpu.sums().unwrap();
            let got = cuda.sums().unwrap().to_device(&Device::Cpu).unwrap();
            let d = max_abs_diff(&got, &want);
            assert!(
                d <= tol * max_abs_tensor(&want).max(1.0),
                "{what}: sums off by {d}"
            );
            for with_prev in [false, true] {
                let want = cpu.adjoint(with_prev).unwrap();
                let got = cuda
                    .adjoint(with_prev)
                    .unwrap()
                    .to_device(&Device::Cpu)
                    .unwrap();
                let d = max_abs_diff(&got, &want);
                let s = max_abs_tensor(&want).max(1.0);
                assert!(
                    d <= tol * s,
                    "{what} (prev {with_prev}): adjoint off by {d}"
                );
            }
        }
    }
}

#[test]
fn cuda_dense_tensor_cores_match_cpu() {
    use common::dense::{layer_inputs, layer_outputs, layers, readout_inputs, readout_outputs};
    let gpu = cuda();
    let cases = [
        layers(1, 16, 16, 16),
        layers(37, 128, 128, 384),
        layers(1_344, 128, 128, 384),
        layers(1_344, 256, 128, 384),
        layers(4_500, 128, 128, 256),
        layers(500, 160, 32, 160),
        layers(8_200, 48, 32, 96),
        layers(10_000, 128, 128, 384),
    ];
    let check = |what: String, cuda: &[(&str, Tensor)], cpu: &[(&str, Tensor)]| {
        for ((name, a), (_, b)) in cuda.iter().zip(cpu) {
            let scale = max_abs_tensor(b).max(1.0);
            let d = max_abs_diff(a, b);
            assert!(d <= 1e-5 * scale, "{what} {name}: {d} (scale {scale})");
            println!("{what} {name}: max |Δ| / scale = {:.1e}", d / scale);
        }
    };
    for (seed, c) in cases.iter().enumerate() {
        let x = layer_inputs(*c, DType::F32, 700 + seed as u64);
        let cpu = layer_outputs(&x, &Device::Cpu).unwrap();
        check(format!("{c:?}"), &layer_outputs(&x, &gpu).unwrap(), &cpu);
    }
    // The readout with the forces' seed: the shipped widths at 1-5,000 rows, others.
    let readouts = [
        (1, 128, 64),
        (37, 128, 64),
        (1_344, 128, 64),
        (5_000, 128, 64),
        (500, 32, 48),
    ];
    for (seed, (n, k, h)) in readouts.into_iter().enumerate() {
        let x = readout_inputs(n, k, h, DType::F32, 800 + seed as u64);
        let cpu = readout_outputs(&x, &Device::Cpu).unwrap();
        check(
            format!("readout n {n} k {k} h {h}"),
            &readout_outputs(&x, &gpu).unwrap(),
            &cpu,
        );
    }
}

/// The update block in one launch, forward and adjoint (`ops::update_tc`,
/// `ops::update_tc_adjoint`, F = 128), against their f64 CPU twins and against the separate
/// CUDA kernels they replace, every output within 1e-5 of its largest value: from one atom to
/// 10,000 (atoms past the last block of 16), the adjoint with and without the next block's
/// gradients.
#[test]
fn cuda_update_block_matches_cpu_and_separate_kernels() {
    use common::dense::{
        update_adjoint_outputs, update_grads, update_inputs, update_outputs, UpdateInputs,
    };
    let gpu = cuda();
    let check = |what: String, runs: [Vec<(&str, Tensor)>; 3]| {
        let [one, cpu, apart] = runs;
        for ((name, a), ((_, b), (_, c))) in one.iter().zip(cpu.iter().zip(&apart)) {
            let scale = max_abs_tensor(b).max(1.0);
            let (to_cpu, to_apart) = (max_abs_diff(a, b), max_abs_diff(a, c));
            println!(
                "{what} {name}: max |Δ| / scale {:.1e} (f64 twin), {:.1e} (separate kernels)",
                to_cpu / scale,
                to_apart / scale
            );
            assert!(
                to_cpu <= 1e-5 * scale,
                "{what} {name}: {to_cpu} (scale {scale})"
            );
            assert!(
                to_apart <= 1e-5 * scale,
                "{what} {name}: {to_apart} (separate kernels)"
            );
        }
    };
    for (seed, n) in [1, 37, 1_344, 10_000].into_iter().enumerate() {
        let seed = 950 + seed as u64;
        let inputs = |dtype| update_inputs(n, 128, dtype, seed);
        let (x, x64): (UpdateInputs, UpdateInputs) = (inputs(DType::F32), inputs(DType::F64));
        check(
            format!("n {n}"),
            [
                update_outputs(&x, &gpu, true).unwrap(),
                update_outputs(&x64, &Device::Cpu, true).unwrap(),
                update_outputs(&x, &gpu, false).unwrap(),
            ],
        );
        let (g, g64) = (
            update_grads(n, 128, DType::F32, seed),
            update_grads(n, 128, DType::F64, seed),
        );
        for has_next in [false, true] {
            check(
                format!("n {n} next {has_next}"),
                [
                    update_adjoint_outputs(&x, &g, has_next, &gpu, true).unwrap(),
                    update_adjoint_outputs(&x64, &g64, has_next, &Device::Cpu, true).unwrap(),
                    update_adjoint_outputs(&x, &g, has_next, &gpu, false).unwrap(),
                ],
            );
        }
    }
}

/// The dense layer on tensor cores scales each row of inputs and of weights by a power of two
/// before it splits the values into f16 parts: rows of magnitudes from 1e-12 to 1e12 (and
/// weight rows from 1e-6 to 1e6) each keep their own precision. Every output against the f64
/// CPU twin, within 1e-5 of Σ_k |x_rk| |w_jk| (the scale of its own terms).
#[test]
fn cuda_dense_tensor_cores_keep_each_rows_precision() {
    use common::fused::random;
    use mlff_distiller::ops::{dense_tc, tc_weights};
    use rand::SeedableRng;
    let gpu = cuda();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(901);
    let (n, k, j) = (97, 128, 136);
    let decades = |count: usize, top: f64| {
        let v: Vec<f32> = (0..count)
            .map(|r| 10f64.powf(-top + 2.0 * top * r as f64 / (count - 1) as f64) as f32)
            .collect();
        Tensor::from_vec(v, (count, 1), &Device::Cpu).unwrap()
    };
    let x = random(&mut rng, &[n, k], 1.0, DType::F32)
        .broadcast_mul(&decades(n, 12.0))
        .unwrap();
    let w = random(&mut rng, &[j, k], 1.0, DType::F32)
        .broadcast_mul(&decades(j, 6.0))
        .unwrap();
    let f64_of = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
    let want = dense_tc(&f64_of(&x), &tc_weights(&f64_of(&w)).unwrap()).unwrap();
    let got = dense_tc(
        &x.to_device(&gpu).unwrap(),
        &tc_weights(&w.to_device(&gpu).unwrap()).unwrap(),
    )
    .unwrap();
    let scale = f64_of(&x)
        .abs()
        .unwrap()
        .matmul(&f64_of(&w).abs().unwrap().t().unwrap())
        .unwrap();
    let err = (f64_of(&got.to_device(&Device::Cpu).unwrap()) - &want)
        .unwrap()
        .abs()
        .unwrap()
        .div(&scale)
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    println!("largest error over its terms' scale: {err:.1e}");
    assert!(err <= 1e-5, "{err}");
}

/// The symmetric adjoint at the shipped shape (F = 128, 20 radial functions) sums dL/d(basis)
/// in split f16, each edge's dL/dw scaled by the power of two of its own largest value
/// (`TcTile<.., HALF>`): with the atoms' output gradients spread from 1e-6 to 1e6, so that
/// the edges of one tile differ by up to 1e12, every edge's dL/d(basis) row must stay within
/// 1e-5 of that row's largest value against the f64 CPU twin on the same inputs. One scale
/// for a tile's edges would leave the small ones nothing but rounding.
#[test]
fn cuda_symmetric_adjoint_keeps_each_edges_precision() {
    use common::fused::{fused_outputs, inputs, shape, Inputs};
    let gpu = cuda();
    let x = inputs(shape(2_000, 30_000, 128, 20), DType::F32, 331).symmetric();
    let n = x.shape.n;
    // Atom a's output-gradient rows times 10^(a mod 13 - 6); no later blocks' dL/d(basis).
    let spread = |rows: usize| {
        let v: Vec<f32> = (0..rows)
            .map(|r| 10f32.powi((r % n % 13) as i32 - 6))
            .collect();
        Tensor::from_vec(v, (rows, 1), &Device::Cpu).unwrap()
    };
    let x = Inputs {
        g_state: x.g_state.broadcast_mul(&spread(4 * n)).unwrap(),
        g_rows: x.g_rows.broadcast_mul(&spread(3 * n)).unwrap(),
        g_basis: x.g_basis.zeros_like().unwrap(),
        ..x
    };
    let basis_grads = |x: &Inputs, dev: &Device| {
        let out = fused_outputs(x, dev).unwrap();
        let (_, g) = out
            .into_iter()
            .find(|(name, _)| *name == "interaction adjoint basis")
            .unwrap();
        g.to_dtype(DType::F64)
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap()
            .to_vec2::<f64>()
            .unwrap()
    };
    let want = basis_grads(&x.to_dtype(DType::F64), &Device::Cpu);
    let got = basis_grads(&x, &gpu);
    let (mut worst, mut smallest) = (0f64, f64::MAX);
    for (e, (a, b)) in got.iter().zip(&want).enumerate() {
        let row = b.iter().fold(0f64, |m, v| m.max(v.abs()));
        let err = a.iter().zip(b).fold(0f64, |m, (p, q)| m.max((p - q).abs()));
        assert!(err <= 1e-5 * row, "edge {e}: error {err} in a row of {row}");
        worst = worst.max(err / row);
        smallest = smallest.min(row);
    }
    println!(
        "largest error over its row's largest value: {worst:.1e} (rows down to {smallest:.1e})"
    );
}

/// The one-kernel path (`ops::small_system`, a cooperative launch with barriers among its
/// blocks) on CUDA against its CPU twin, f32 and f64: the small test model (one feature per
/// block), the shipped model on aspirin and on 64 atoms (the largest the default takes; in f64
/// its shared memory does not fit, so the fused kernels run instead), an F = 64 model on
/// aspirin (its own entry at 64 blocks), a lone atom and a far atom, each with its features
/// split over every number of blocks that fits (1 to 128, at most 32 features each; 3 launches
/// each, which agree: the barrier counter starts from zero each time). The fused model's
/// choice of the one kernel (up to 64 atoms, wherever it fits) gives the separate kernels'
/// forces.
#[test]
fn cuda_one_kernel_matches_cpu_twin() {
    use common::fused::{one_kernel_split, one_kernel_systems};
    let gpu = cuda();
    let big = Batch::new(vec![random_molecule(64, 9)]).unwrap();
    let asp = Batch::new(vec![aspirin()]).unwrap();
    // F = 64 with the shipped basis: its own entry at one feature a block (64 blocks).
    let narrow = |dtype, dev: &Device| {
        let cfg = mlff_distiller::model::PainnConfig {
            hidden: 64,
            ..Default::default()
        };
        PainnCalculator::new(model(&cfg, 11, dtype, dev), dev.clone(), dtype)
            .with_backend(Backend::Fused)
    };
    for dtype in [DType::F32, DType::F64] {
        let tol = if dtype == DType::F32 { 3e-5 } else { 1e-10 };
        let cases = [
            (
                "small model",
                calculator(dtype, &Device::Cpu),
                calculator(dtype, &gpu),
                one_kernel_systems(),
            ),
            (
                "aspirin",
                shipped_calculator(&Device::Cpu, dtype, Backend::Fused),
                shipped_calculator(&gpu, dtype, Backend::Fused),
                asp.clone(),
            ),
            (
                "64 atoms",
                shipped_calculator(&Device::Cpu, dtype, Backend::Fused),
                shipped_calculator(&gpu, dtype, Backend::Fused),
                big.clone(),
            ),
            (
                "F = 64 aspirin",
                narrow(dtype, &Device::Cpu),
                narrow(dtype, &gpu),
                asp.clone(),
            ),
        ];
        for (what, cpu_calc, gpu_calc, batch) in cases {
            let (x_cpu, _) = cpu_calc.prepare(&batch).unwrap();
            let (x_gpu, _) = gpu_calc.prepare(&batch).unwrap();
            let fused = gpu_calc
                .model()
                .fused()
                .unwrap()
                .clone()
                .with_tuning(Tuning {
                    feature_split_max_atoms: 64,
                    ..Tuning::default()
                });
            // The kernel runs wherever its plan fits the device (64 atoms in f64 does not), and
            // the model takes it there, with the edge geometry resident or in chunks.
            let (n, e) = (
                x_gpu.positions.dim(0).unwrap(),
                x_gpu.centers.dim(0).unwrap(),
            );
            let fitted = SmallSystemPlan::new(fused.shape().unwrap(), n, e).and_then(|p| {
                p.fit_widest(&gpu, dtype, Tuning::default().feature_split_max_blocks)
            });
            assert_eq!(
                fitted.is_ok(),
                !(what == "64 atoms" && dtype == DType::F64),
                "{what} {dtype:?}"
            );
            let one = fused
                .feature_split_plan(n, e, &gpu, dtype)
                .unwrap()
                .is_some();
            let resident = fitted.as_ref().is_ok_and(|p| p.edges_resident());
            assert_eq!(one, fitted.is_ok(), "{what} {dtype:?}");
            println!(
                "{what} {dtype:?}: {e} edges, fits {}, resident {resident}",
                fitted.is_ok()
            );
            let (e_ref, f_ref) = one_kernel_split(&cpu_calc, &x_cpu, GROUPS).unwrap();
            let scale_f = max_abs_tensor(&f_ref).max(1.0);
            let scale_e = max_abs_tensor(&e_ref).max(1.0);
            // Every split of the features over the blocks that the model has (one feature per
            // block up to 32), each three times.
            let hidden = fused.shape().unwrap().hidden;
            let splits = (0..8)
                .map(|k| 1 << k)
                .filter(|g| hidden / g <= 32 && *g <= hidden);
            for groups in splits {
                let mut first: Option<Tensor> = None;
                for call in 0..3 {
                    let Some((e, f)) = one_kernel_split(&gpu_calc, &x_gpu, groups) else {
                        println!("{what} {dtype:?}: {groups} blocks do not fit");
                        break;
                    };
                    let (e, f) = (
                        e.to_device(&Device::Cpu).unwrap(),
                        f.to_device(&Device::Cpu).unwrap(),
                    );
                    let (de, df) = (max_abs_diff(&e, &e_ref), max_abs_diff(&f, &f_ref));
                    println!(
                        "{what} {dtype:?} {groups} blocks, call {call}: ΔE {de:.2e} ΔF {df:.2e} \
                         of {scale_f:.2}"
                    );
                    assert!(de <= tol * scale_e, "{what} {dtype:?} {groups}: ΔE {de}");
                    assert!(df <= tol * scale_f, "{what} {dtype:?} {groups}: ΔF {df}");
                    if let Some(f0) = &first {
                        assert!(
                            max_abs_diff(&f, f0) <= tol * scale_f,
                            "{what}: launches differ"
                        );
                    }
                    first = Some(f);
                }
            }
            // The calculator's path (one kernel where it applies) = the fused kernels.
            let (e, f) = fused.energies_and_forces(&x_gpu).unwrap();
            let many = fused.clone().with_tuning(Tuning {
                feature_split_max_atoms: 0,
                ..Tuning::default()
            });
            assert!(many
                .feature_split_plan(n, e, &gpu, dtype)
                .unwrap()
                .is_none());
            let (e2, f2) = many.energies_and_forces(&x_gpu).unwrap();
            let (de, df) = (max_abs_diff(&e, &e2), max_abs_diff(&f, &f2));
            assert!(
                de <= tol * scale_e && df <= tol * scale_f,
                "{what} {dtype:?}: ΔE {de} ΔF {df}"
            );
        }
    }
}

/// The device neighbour list built by kernels/neighbors.cu against the host cell list, edge
/// for edge (and its CPU twin, in f32 too): molecules, a 5,001-atom water box with MD's list
/// cutoff (model cutoff + 1 Å skin), a triclinic box and a slab with atoms outside the cell;
/// padding, an exact fit and overflow.
#[test]
fn cuda_device_list_matches_host_list() {
    use common::device_list::check_against_host;
    use mlff_distiller::neighbors::DeviceListBuilder;
    let dev = cuda();
    use common::device_list::scattered;
    let mut slab = random_box(300, 0.25, 5);
    slab.pbc = [true, true, false];
    let cases = [
        (aspirin(), 5.0, 600),
        (random_molecule(64, 2), 6.0, 4096),
        (water_box(1667, 1), 6.0, 600_000),
        (scattered(&random_box(300, 0.3, 6)), 4.0, 40_000),
        (scattered(&slab), 4.0, 40_000),
    ];
    for (s, cutoff, capacity) in &cases {
        let (list, st) = check_against_host(s, *cutoff, *capacity, &dev);
        assert!(st.edges > 0 && !st.overflowed, "{} atoms: {st:?}", s.len());
        let (_, exact) = check_against_host(s, *cutoff, st.edges, &dev);
        assert!(!exact.overflowed);
        let (_, over) = check_against_host(s, *cutoff, st.edges - 1, &dev);
        assert!(over.overflowed);
        // The CPU twin gives the same slots; f32 offsets are the f64 ones rounded.
        let (twin, _) = check_against_host(s, *cutoff, *capacity, &Device::Cpu);
        let cpu_centers: Vec<u32> = twin.centers.to_vec1().unwrap();
        assert_eq!(list.centers.to_vec1::<u32>().unwrap(), cpu_centers);
        let b = DeviceListBuilder::new(*cutoff, s.cell.as_ref(), s.pbc, &dev).unwrap();
        let flat: Vec<f64> = s.positions.iter().flatten().copied().collect();
        let x = b
            .wrap(&Tensor::from_vec(flat, (s.len(), 3), &dev).unwrap())
            .unwrap();
        let f32_list = b.build(&x, *capacity, DType::F32).unwrap();
        let want: Vec<f32> = (list
            .offsets
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap())
        .iter()
        .map(|&v| v as f32)
        .collect();
        assert_eq!(
            f32_list
                .offsets
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap(),
            want
        );
    }
}

/// Pruning a device list to a smaller cutoff after the atoms moved: CUDA equals the CPU twin
/// (f32 and f64 offsets), a 5,001-atom water box and a molecule.
#[test]
fn cuda_prune_matches_cpu_twin() {
    use mlff_distiller::neighbors::DeviceListBuilder;
    let dev = cuda();
    for s in [water_box(1667, 2), random_molecule(64, 3)] {
        // Every atom moved by up to 0.2 Å along each axis.
        let shift: Vec<f64> = (0..3 * s.len())
            .map(|k| 0.4 * ((k * 7 % 11) as f64 / 11.0 - 0.5))
            .collect();
        let flat: Vec<f64> = s.positions.iter().flatten().copied().collect();
        for dtype in [DType::F32, DType::F64] {
            let pruned = |d: &Device| {
                let b = DeviceListBuilder::new(6.0, s.cell.as_ref(), s.pbc, d).unwrap();
                let x = Tensor::from_vec(flat.clone(), (s.len(), 3), d).unwrap();
                let x = b.wrap(&x).unwrap();
                let list = b.build(&x, 600_000, dtype).unwrap();
                let edges = list.status().unwrap().edges;
                let moved =
                    (&x + Tensor::from_vec(shift.clone(), (s.len(), 3), d).unwrap()).unwrap();
                let (c, n, o) = b.prune(&moved, &list, edges, 5.0).unwrap();
                let o = o.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
                let c: Vec<u32> = c.to_vec1().unwrap();
                let n: Vec<u32> = n.to_vec1().unwrap();
                (c, n, o.to_vec1::<f64>().unwrap(), edges)
            };
            let (gc, gn, go, ge) = pruned(&dev);
            let (cc, cn, co, ce) = pruned(&Device::Cpu);
            assert_eq!(ge, ce);
            assert!(gc.len() < ge && !gc.is_empty(), "{} of {ge}", gc.len());
            assert_eq!((gc, gn), (cc, cn), "{} atoms {dtype:?}", s.len());
            assert_eq!(go, co);
        }
    }
}

/// The integrator's kernels on CUDA equal their CPU twins bit for bit (kick, NVE and Langevin
/// steps; the check's max), the check's sum to rounding, for a 5,001-atom box's worth of atoms.
#[test]
fn cuda_integrator_kernels_match_cpu() {
    use mlff_distiller::ops::{md_advance, md_displacement2, md_kick, LangevinNoise};
    let dev = cuda();
    let n = 5001;
    let on = |d: &Device, seed: f64, width: usize| {
        let v: Vec<f64> = (0..width * n)
            .map(|k| ((k as f64 + seed) * 0.37).sin() + 0.02)
            .collect();
        Tensor::from_vec(v, (n, width), d).unwrap()
    };
    let run = |d: &Device| {
        let (x, v, f, xi) = (on(d, 1.0, 3), on(d, 2.0, 3), on(d, 3.0, 3), on(d, 4.0, 3));
        let (hk, scale) = (on(d, 5.0, 1).abs().unwrap(), on(d, 6.0, 1).abs().unwrap());
        let noise = LangevinNoise {
            xi: &xi,
            scale: &scale,
            c1: 0.93,
        };
        let (x1, v1) = md_advance(&x, &v, &f, &hk, 0.049, None).unwrap();
        let (x2, v2) = md_advance(&x, &v, &f, &hk, 0.049, Some(noise)).unwrap();
        let k = md_kick(&v, &f, &hk).unwrap();
        let d2 = md_displacement2(&x2, &x).unwrap().to_vec1::<f64>().unwrap();
        let host = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f64>().unwrap();
        ([host(&x1), host(&v1), host(&x2), host(&v2), host(&k)], d2)
    };
    let (gpu, gd) = run(&dev);
    let (cpu, cd) = run(&Device::Cpu);
    for (k, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
        assert_eq!(g, c, "output {k}");
    }
    assert_eq!(gd[1], cd[1], "max");
    assert!(
        (gd[0] - cd[0]).abs() <= 1e-12 * cd[0],
        "sum {} vs {}",
        gd[0],
        cd[0]
    );
}

/// The MD step as one launch (kernels/small_system.cu with its MD slots) against its CPU twin
/// (the same step op by op: md_advance, the one kernel's CPU twin, md_kick, md_displacement2):
/// f32 and f64, NVE and Langevin, the shipped model on aspirin and the small model on a random
/// molecule. Advanced positions and the largest displacement equal bit for bit; forces,
/// energies and velocities within the one kernel's tolerance; launches interleaved with plain
/// calls (the barrier counters are shared) repeat.
#[test]
fn cuda_single_launch_step_matches_cpu_twin() {
    use mlff_distiller::ops::{small_system, small_system_step, LangevinNoise, MdStepInputs};
    let gpu = cuda();
    let asp = Batch::new(vec![aspirin()]).unwrap();
    let mol = Batch::new(vec![random_molecule(30, 4)]).unwrap();
    for dtype in [DType::F32, DType::F64] {
        let tol = if dtype == DType::F32 { 3e-5 } else { 1e-10 };
        let cases = [
            (
                "aspirin",
                shipped_calculator(&Device::Cpu, dtype, Backend::Fused),
                shipped_calculator(&gpu, dtype, Backend::Fused),
                asp.clone(),
            ),
            (
                "small model",
                calculator(dtype, &Device::Cpu).with_backend(Backend::Fused),
                calculator(dtype, &gpu).with_backend(Backend::Fused),
                mol.clone(),
            ),
        ];
        for (what, cpu_calc, gpu_calc, batch) in cases {
            let (x_cpu, _) = cpu_calc.prepare(&batch).unwrap();
            let (x_gpu, _) = gpu_calc.prepare(&batch).unwrap();
            let fused = gpu_calc.model().fused().unwrap();
            let n = x_gpu.positions.dim(0).unwrap();
            let e = x_gpu.centers.dim(0).unwrap();
            let plan = fused
                .feature_split_plan(n, e, &gpu, dtype)
                .unwrap()
                .expect("one kernel");
            let column = |seed: f64, width: usize, size: f64| -> Vec<f64> {
                (0..width * n)
                    .map(|k| size * ((k as f64 + seed) * 0.37).sin())
                    .collect()
            };
            let x0 = x_cpu.positions.to_dtype(DType::F64).unwrap();
            let x0 = x0.flatten_all().unwrap().to_vec1::<f64>().unwrap();
            let reference: Vec<f64> = (x0.iter().zip(column(7.0, 3, 0.05)))
                .map(|(x, d)| x + d)
                .collect();
            let hk: Vec<f64> = column(5.0, 1, 0.01)
                .iter()
                .map(|h| h.abs() + 0.001)
                .collect();
            let scale: Vec<f64> = column(6.0, 1, 0.02).iter().map(|s| s.abs()).collect();
            let inputs = [
                x0,
                column(1.0, 3, 0.05),
                column(2.0, 3, 1.0),
                column(3.0, 3, 1.0),
            ];
            let step = |dev: &Device,
                        calc: &PainnCalculator,
                        x: &mlff_distiller::model::PainnInputs,
                        langevin: bool| {
                let t = |v: &[f64], w: usize| Tensor::from_slice(v, (n, w), dev).unwrap();
                let [pos, vel, frc, xi] = [0, 1, 2, 3].map(|k| t(&inputs[k], 3));
                let (hk, scale, reference) = (t(&hk, 1), t(&scale, 1), t(&reference, 3));
                let md = MdStepInputs {
                    positions: &pos,
                    velocities: &vel,
                    forces: &frc,
                    half_kick: &hk,
                    dt: 0.049,
                    noise: langevin.then_some(LangevinNoise {
                        xi: &xi,
                        scale: &scale,
                        c1: 0.93,
                    }),
                    reference: &reference,
                };
                let fused = calc.model().fused().unwrap();
                let index = [&x.species, &x.centers, &x.neighbors];
                let w = fused.packed_weights().unwrap();
                let out = small_system_step(&plan, w, &x.offsets, index, &md).unwrap();
                let host = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f64>().unwrap();
                [
                    host(&out.positions),
                    host(&out.velocities),
                    host(&out.forces),
                    vec![out.energy.to_scalar::<f64>().unwrap()],
                    host(&out.displacement2),
                ]
            };
            for langevin in [false, true] {
                let label = format!("{what} {dtype:?} langevin {langevin}");
                let want = step(&Device::Cpu, &cpu_calc, &x_cpu, langevin);
                let scale_f = want[2].iter().fold(1.0f64, |m, f| m.max(f.abs()));
                let max_hk = hk.iter().fold(0.0f64, |m, h| m.max(*h));
                let diff = |a: &[f64], b: &[f64]| {
                    a.iter()
                        .zip(b)
                        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()))
                };
                for call in 0..3 {
                    // A plain call between steps: both share the barrier counters.
                    let w = fused.packed_weights().unwrap();
                    let index = (&x_gpu.species, &x_gpu.centers, &x_gpu.neighbors);
                    small_system(
                        &plan,
                        w,
                        &x_gpu.positions,
                        &x_gpu.offsets,
                        index.0,
                        index.1,
                        index.2,
                    )
                    .unwrap();
                    let got = step(&gpu, &gpu_calc, &x_gpu, langevin);
                    let (df, dv) = (diff(&got[2], &want[2]), diff(&got[1], &want[1]));
                    let de = (got[3][0] - want[3][0]).abs();
                    println!("{label} call {call}: ΔF {df:.2e} of {scale_f:.2}, Δv {dv:.2e}, ΔE {de:.2e}");
                    assert_eq!(got[0], want[0], "{label}: advanced positions");
                    assert_eq!(got[4][1], want[4][1], "{label}: largest displacement");
                    assert!(
                        (got[4][0] - want[4][0]).abs() <= 1e-12 * want[4][0],
                        "{label}: displacement sum {} vs {}",
                        got[4][0],
                        want[4][0]
                    );
                    assert!(df <= tol * scale_f, "{label}: ΔF {df}");
                    assert!(dv <= tol * scale_f * max_hk * 1.01, "{label}: Δv {dv}");
                    assert!(
                        de <= tol * n as f64 * want[3][0].abs().max(1.0),
                        "{label}: ΔE {de}"
                    );
                }
            }
        }
    }
}

/// MD with single-launch steps (the default on CUDA where the force call is one kernel)
/// follows the op-by-op trajectory: the shipped model on aspirin, NVE and Langevin, a skin
/// small enough that the list is due every ~20 steps, with deferred and with per-step list
/// checks (a step whose list no longer held is thrown away and run op by op); f64 against the
/// CPU, f32 against CUDA op by op.
#[test]
fn cuda_single_launch_md_matches_op_by_op() {
    use mlff_distiller::md::{
        host_positions, Ensemble, MdSettings, PainnForces, Simulation, StopReason,
    };
    let gpu = cuda();
    let s = aspirin();
    for ensemble in [
        Ensemble::Nve,
        Ensemble::Nvt {
            temperature: 300.0,
            friction: 10.0,
        },
    ] {
        let settings = MdSettings {
            steps: 150,
            ensemble,
            skin: 0.1,
            traj_every: 0,
            log_every: 25,
            stop_when_unstable: false,
            ..Default::default()
        };
        for dtype in [DType::F64, DType::F32] {
            let run = |dev: &Device, single: bool, defer: bool| {
                let calc = shipped_calculator(dev, dtype, Backend::Fused);
                let f = PainnForces::new(&calc, &s, settings.skin)
                    .unwrap()
                    .with_single_launch_steps(single)
                    .with_deferred_checks(defer);
                let mut sim =
                    Simulation::new(f, &s, settings.clone(), serde_json::Value::Null).unwrap();
                let summary = sim.run(&mut |_| {}).unwrap();
                assert_eq!(summary.stop, StopReason::Completed);
                let e: Vec<f64> = sim.records().iter().map(|r| r.e_tot).collect();
                (host_positions(&sim.state().positions).unwrap(), e, summary)
            };
            let label = |what: &str| format!("{} {dtype:?} {what}", ensemble.name());
            let (x_ref, e_ref, s_ref) = match dtype {
                DType::F64 => run(&Device::Cpu, false, false),
                _ => run(&gpu, false, true),
            };
            assert_eq!(s_ref.single_launch_steps, 0);
            assert!(s_ref.neighbor_list_builds > 3, "the list is rebuilt");
            let tol = if dtype == DType::F64 { 1e-8 } else { 1e-4 };
            for defer in [true, false] {
                let what = label(if defer { "deferred" } else { "checked" });
                let (x, e, summary) = run(&gpu, true, defer);
                println!(
                    "{what}: {} single-launch steps, {} deferred, {} redone, {} list builds \
                     (reference {})",
                    summary.single_launch_steps,
                    summary.deferred_steps,
                    summary.redone_steps,
                    summary.neighbor_list_builds,
                    s_ref.neighbor_list_builds
                );
                // Checking each step, every step runs as one launch but those whose list was
                // due (thrown away, run op by op with a rebuild); deferred, also those redone.
                let due = summary.neighbor_list_builds as u64 - 1;
                let single = summary.single_launch_steps;
                match defer {
                    true => assert!(single + due >= 150, "{what}: {single} single-launch steps"),
                    false => assert_eq!(single + due, 150, "{what}: {single} single-launch steps"),
                }
                if dtype == DType::F64 {
                    assert_eq!(
                        summary.neighbor_list_builds, s_ref.neighbor_list_builds,
                        "{what}"
                    );
                }
                let dx = max_force_diff(&x, &x_ref);
                assert!(dx < tol, "{what}: positions differ by {dx} Å");
                let de = e
                    .iter()
                    .zip(&e_ref)
                    .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
                assert!(
                    e.len() == e_ref.len() && de < 100.0 * tol,
                    "{what}: E_tot differs by {de}"
                );
            }
        }
    }
}

/// The atom-split one kernel (`ops::atom_split`: atoms split over the blocks, barriers only
/// where atoms mix) on CUDA against the one-kernel CPU twin, f32 and f64: the shipped model on
/// aspirin and on 4 aspirins, and random models of 32 features with two interaction blocks and
/// with one (no barrier in the forward) on molecules, a lone atom, a far atom and a periodic
/// box, and 16 aspirins; 1 atom per block up to the kernel's most (16 with tensor cores: the
/// shipped model in f32; 2 otherwise), the dense layers on tensor cores and on CUDA cores where
/// each can run, own edges listed once per call and (512 at once) again in every pass, the tape
/// in shared memory or (where it does not fit) in the scratch; three launches each (the barrier counters start from zero each
/// time). The model's choice of it gives the separate kernels' forces.
#[test]
fn cuda_atom_split_matches_cpu_twin() {
    use common::fused::one_kernel_systems;
    use mlff_distiller::ops::{atom_split, AtomSplitPlan, ATOM_SPLIT_MAX_ATOMS_PER_BLOCK};
    use mlff_distiller::plan::Plan;
    let gpu = cuda();
    let small = |blocks: usize, dtype: DType, dev: &Device| {
        let cfg = mlff_distiller::model::PainnConfig {
            hidden: 32,
            n_blocks: blocks,
            ..small_config()
        };
        PainnCalculator::new(model(&cfg, 11, dtype, dev), dev.clone(), dtype)
    };
    let aspirins = |k: usize| Batch::new(vec![aspirin(); k]).unwrap();
    for dtype in [DType::F32, DType::F64] {
        let tol = if dtype == DType::F32 { 3e-5 } else { 1e-10 };
        let cases = [
            (
                "aspirin",
                shipped_calculator(&Device::Cpu, dtype, Backend::Fused),
                shipped_calculator(&gpu, dtype, Backend::Fused),
                aspirins(1),
            ),
            (
                "4 aspirins",
                shipped_calculator(&Device::Cpu, dtype, Backend::Fused),
                shipped_calculator(&gpu, dtype, Backend::Fused),
                aspirins(4),
            ),
            (
                "16 aspirins",
                shipped_calculator(&Device::Cpu, dtype, Backend::Fused),
                shipped_calculator(&gpu, dtype, Backend::Fused),
                aspirins(16),
            ),
            (
                "F 32, 2 blocks",
                small(2, dtype, &Device::Cpu),
                small(2, dtype, &gpu),
                one_kernel_systems(),
            ),
            (
                "F 32, 1 block",
                small(1, dtype, &Device::Cpu),
                small(1, dtype, &gpu),
                one_kernel_systems(),
            ),
        ];
        for (what, cpu_calc, gpu_calc, batch) in cases {
            let (x_cpu, _) = cpu_calc.prepare(&batch).unwrap();
            let (x_gpu, _) = gpu_calc.prepare(&batch).unwrap();
            let fused = gpu_calc.model().fused().unwrap().clone();
            let cpu_fused = cpu_calc.model().fused().unwrap();
            let model = fused.shape().unwrap();
            let (n, e) = (
                x_gpu.positions.dim(0).unwrap(),
                x_gpu.centers.dim(0).unwrap(),
            );
            let (eb, limit) = (dtype.size_in_bytes(), 227 * 1024);
            let run = |f: &mlff_distiller::model::FusedPainn,
                       x: &mlff_distiller::model::PainnInputs,
                       plan: &AtomSplitPlan| {
                atom_split(
                    plan,
                    f.packed_weights().unwrap(),
                    f.packed_weights_out_major().unwrap(),
                    &x.positions,
                    &x.offsets,
                    &x.species,
                    &x.centers,
                    &x.neighbors,
                )
                .unwrap()
            };
            let cpu_plan = AtomSplitPlan::new(model, n, e, 1, eb, usize::MAX).unwrap();
            let (e_ref, f_ref) = run(cpu_fused, &x_cpu, &cpu_plan);
            let scale_f = max_abs_tensor(&f_ref).max(1.0);
            let scale_e = max_abs_tensor(&e_ref).max(1.0);
            // Up to the kernel's most atoms per block (a last block with fewer), within the
            // H100's shared memory; own edges listed once per call, and (fewest listed at once)
            // again in every pass.
            let per_blocks = [1, ATOM_SPLIT_MAX_ATOMS_PER_BLOCK];
            let choices = per_blocks
                .into_iter()
                .flat_map(|k| [(k, None), (k, Some(512))]);
            let mut ran = Vec::new();
            for (per_block, own_edges) in choices {
                let plan = AtomSplitPlan::new(model, n, e, per_block, eb, limit)
                    .and_then(|p| match own_edges {
                        Some(k) => p.with_own_edges(k, limit),
                        None => Ok(p),
                    })
                    .and_then(|p| p.fits_device(&gpu).map(|_| p));
                let Ok(plan) = plan else { continue };
                for call in 0..3 {
                    let (en, fo) = run(&fused, &x_gpu, &plan);
                    let (de, df) = (max_abs_diff(&en, &e_ref), max_abs_diff(&fo, &f_ref));
                    println!(
                        "{what} {dtype:?} {per_block} atoms per block, own edges {own_edges:?}, \
                         stage {} values, tape shared {}, \
                         call {call}: {e} edges, ΔE {de:.2e} ΔF {df:.2e} of {scale_f:.2}",
                        plan.stage_values(),
                        plan.tape_in_shared_memory()
                    );
                    assert!(de <= tol * scale_e, "{what} {dtype:?} {per_block}: ΔE {de}");
                    assert!(df <= tol * scale_f, "{what} {dtype:?} {per_block}: ΔF {df}");
                }
                ran.push(per_block);
            }
            // Every model and real ran at one and two atoms per block wherever the blocks fit
            // at once (132 multiprocessors on the H100 and H200 these run on).
            let expected: Vec<usize> = per_blocks
                .into_iter()
                .filter(|&k| k <= n && n.div_ceil(k) <= 132)
                .collect();
            for want in expected {
                assert!(
                    ran.contains(&want),
                    "{what} {dtype:?}: {want:?} did not run"
                );
            }
            // The model takes it where allowed and it fits (up to two atoms per
            // multiprocessor), with the separate kernels' forces.
            let atom_split_of = |f: &mlff_distiller::model::FusedPainn| {
                matches!(f.plan(&x_gpu).unwrap(), Plan::AtomSplit(_))
            };
            let chosen = fused.clone().with_tuning(Tuning {
                atom_split_min_atoms: 0,
                atom_split_max_atoms: None,
                ..Tuning::default()
            });
            let fits = atom_split_of(&chosen);
            let on_cuda_cores = n <= 2 * 132;
            assert!(
                fits == on_cuda_cores || dtype == DType::F64,
                "{what} {dtype:?}: atom split {fits}"
            );
            let (en, fo) = chosen.energies_and_forces(&x_gpu).unwrap();
            let (e_sep, f_sep) = fused.separate_kernels(&x_gpu).unwrap();
            let (de, df) = (max_abs_diff(&en, &e_sep), max_abs_diff(&fo, &f_sep));
            println!("{what} {dtype:?} model (atom split {fits}): ΔE {de:.2e} ΔF {df:.2e}");
            // By default it takes the systems of the tuning's atom_split_min_atoms and more.
            let by_default = atom_split_of(&fused);
            assert_eq!(
                by_default,
                fits && n >= Tuning::default().atom_split_min_atoms,
                "{what} {dtype:?}"
            );
            assert!(
                de <= tol * scale_e && df <= tol * scale_f,
                "{what} {dtype:?}"
            );
        }
    }
}
