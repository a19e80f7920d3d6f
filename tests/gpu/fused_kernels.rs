//! The per-layer fused kernels on CUDA against their CPU twins: the interaction forward and
//! adjoint, the first block's element sums, the tensor-core dense layers, the update block in
//! one launch, and the split-f16 paths' per-row and per-edge precision.

use crate::common;
use crate::common::*;
use crate::cuda;
use candle_core::{DType, Device, Tensor};

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

/// The tensor-core dense layers (`ops::dense_tc`, split f16) against their CPU twins in f32:
/// one layer, the two-layer MLP with SiLU and its adjoint, from one row to 10,000 (rows past
/// the last block), the model's widths (128 → 128 → 384, the context MLP's
/// 256 inputs, its adjoint's 384-wide reduction: the compile-time variants) and others (the
/// kernels for any width; outputs padded within a chunk, a second chunk); the layer with an
/// addend (`dense_tc_adding`); the readout with the forces' seed (`readout_tc`) at 1-5,000 rows.
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
fn cuda_update_block_matches_cpu_and_by_layers() {
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
