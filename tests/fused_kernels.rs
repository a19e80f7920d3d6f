//! The fused kernels and the model's fused path (`--backend fused`) on the CPU, against candle's
//! stock ops and backprop: every kernel's forward and adjoint on shapes with zero edges, one
//! edge and isolated atoms; the whole model's energies and forces on molecules, a batch with a
//! lone atom and a periodic box; forces = −dE/dx by finite differences; rotation equivariance.

mod common;

use candle_core::{DType, Device, Tensor};
use common::fused::{fused_outputs, inputs, reference_outputs, SHAPES};
use common::{max_abs, max_abs_diff, max_force_diff};
use mlff_distiller::model::Backend;
use mlff_distiller::{Batch, Calculator, Structure, Tuning};

fn scale(t: &Tensor) -> f64 {
    common::max_abs_tensor(t).max(1.0)
}

#[test]
fn each_kernel_matches_stock_ops_and_backprop() {
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
        for (k, shape) in SHAPES.iter().enumerate() {
            let x = inputs(*shape, dtype, 100 + k as u64);
            let got = fused_outputs(&x, &Device::Cpu).unwrap();
            let want = reference_outputs(&x).unwrap();
            assert_eq!(got.len(), want.len());
            for ((name, a), (name_b, b)) in got.iter().zip(&want) {
                assert_eq!(name, name_b);
                let d = max_abs_diff(a, b);
                assert!(
                    d <= tol * scale(b),
                    "{dtype:?} {shape:?} {name}: max |Δ| {d} (scale {})",
                    scale(b)
                );
            }
        }
    }
}

/// A one-atom structure (no edges) beside a molecule whose atoms include one out of range.
fn batch() -> Batch {
    let mut far = common::random_molecule(7, 41);
    far.positions.push([40.0, 0.0, 0.0]);
    far.numbers.push(8);
    Batch::new(vec![
        far,
        Structure::molecule(vec![6], vec![[0.0; 3]]),
        common::random_molecule(12, 42),
        common::random_box(40, 0.3, 43),
    ])
    .unwrap()
}

#[test]
fn fused_model_matches_autograd_model() {
    let batch = batch();
    for (dtype, tol) in [(DType::F64, 1e-11), (DType::F32, 2e-4)] {
        let plain = common::calculator(dtype, &Device::Cpu)
            .compute(&batch)
            .unwrap();
        let fused = common::calculator(dtype, &Device::Cpu)
            .with_backend(Backend::Fused)
            .compute(&batch)
            .unwrap();
        for k in 0..batch.n_structures() {
            let de = (plain.energies[k] - fused.energies[k]).abs();
            assert!(
                de <= tol * plain.energies[k].abs().max(1.0),
                "{dtype:?} {k}: ΔE {de}"
            );
            let df = max_force_diff(&plain.forces[k], &fused.forces[k]);
            let fmax = max_abs(&plain.forces[k]).max(1.0);
            assert!(df <= tol * fmax, "{dtype:?} {k}: ΔF {df} of {fmax}");
        }
        // The lone atom feels no force; the far atom neither.
        assert_eq!(fused.forces[1], vec![[0.0; 3]]);
        assert_eq!(fused.forces[0][7], [0.0; 3]);
    }
}

/// The filter-rows path (a matrix product per block, used for large systems) and the dense
/// kernels (used for small ones on CUDA) give the same energies and forces as forming the
/// filter inside the kernels with candle matmuls, and as candle's backprop.
#[test]
fn filter_rows_and_dense_kernel_paths_match() {
    use mlff_distiller::calculator::forces_from;
    let batch = batch();
    let calc = common::calculator(DType::F64, &Device::Cpu).with_backend(Backend::Fused);
    let (inputs, positions) = calc.prepare(&batch).unwrap();
    let fused = calc.fused().unwrap();
    let run_with = |edges: usize,
                    dense_rows: usize,
                    keep: usize,
                    tensor_core_rows: std::ops::RangeInclusive<usize>| {
        let tuning = Tuning {
            filter_rows_from_edges: Some(edges),
            filter_rows_keep_bytes: keep,
            dense_kernel_max_rows: dense_rows,
            dense_tensor_cores_from_rows: *tensor_core_rows.start(),
            dense_tensor_cores_until_rows: *tensor_core_rows.end(),
            ..Tuning::default()
        };
        let model = fused.clone().with_tuning(tuning).with_cpu_twins(true);
        let pass = model.forward(&inputs).unwrap();
        (pass.atom_energies.clone(), pass.forces().unwrap())
    };
    // No layer has usize::MAX rows: tensor cores off.
    let off = usize::MAX..=usize::MAX;
    let run = |edges, dense_rows, keep| run_with(edges, dense_rows, keep, off.clone());
    let (e_in, f_in) = run(usize::MAX, 0, 0);
    let (e_rows, f_rows) = run(0, 0, 0);
    let (e_kept, f_kept) = run(0, 0, usize::MAX);
    let (e_dense, f_dense) = run(usize::MAX, usize::MAX, 0);
    // Every layer of a shape they take (all but the readout's single output) on the
    // tensor-core kernels' twins.
    let (e_tc, f_tc) = run_with(usize::MAX, 0, 0, 0..=usize::MAX);
    // The first block per edge like the others instead of by sums per element (the default).
    let per_edge = fused.clone().with_tuning(Tuning {
        first_block_sums: false,
        ..Tuning::default()
    });
    let pass = per_edge.forward(&inputs).unwrap();
    let (e_edges, f_edges) = (pass.atom_energies.clone(), pass.forces().unwrap());
    let graph = common::calculator(DType::F64, &Device::Cpu);
    let e_graph = graph.model().atom_energies(&inputs).unwrap();
    let f_graph = forces_from(&e_graph.sum_all().unwrap(), &positions).unwrap();
    for (what, e, f) in [
        ("in kernel", &e_in, &f_in),
        ("rows", &e_rows, &f_rows),
        ("rows kept for the adjoint", &e_kept, &f_kept),
        ("dense kernels", &e_dense, &f_dense),
        ("tensor-core layers", &e_tc, &f_tc),
        ("first block per edge", &e_edges, &f_edges),
    ] {
        assert!(max_abs_diff(e, &e_graph) < 1e-10, "{what}: energies");
        assert!(max_abs_diff(f, &f_graph) < 1e-10, "{what}: forces");
    }
    assert!(max_abs_diff(&f_in, &f_rows) < 1e-12);
    assert!(max_abs_diff(&f_in, &f_edges) < 1e-12);
    // Kept rows are the very rows the adjoint would make again.
    assert_eq!(
        f_kept.to_vec2::<f64>().unwrap(),
        f_rows.to_vec2::<f64>().unwrap()
    );
}

#[test]
fn fused_forces_are_minus_the_energy_gradient() {
    let calc = common::calculator(DType::F64, &Device::Cpu).with_backend(Backend::Fused);
    let s = common::random_box(24, 0.2, 51);
    let forces = calc
        .compute(&Batch::new(vec![s.clone()]).unwrap())
        .unwrap()
        .forces[0]
        .clone();
    let h = 1e-5;
    for atom in [0, 7, 23] {
        for (a, &f) in forces[atom].iter().enumerate() {
            let energy = |d: f64| {
                let mut t = s.clone();
                t.positions[atom][a] += d;
                calc.compute(&Batch::new(vec![t]).unwrap())
                    .unwrap()
                    .energies[0]
            };
            let fd = -(energy(h) - energy(-h)) / (2.0 * h);
            assert!(
                (fd - f).abs() < 1e-6 * f.abs().max(1.0),
                "atom {atom} {a}: {f} vs {fd}"
            );
        }
    }
}

#[test]
fn fused_forces_rotate_with_the_molecule() {
    let calc = common::calculator(DType::F64, &Device::Cpu).with_backend(Backend::Fused);
    let s = common::random_molecule(15, 61);
    let rot = common::random_rotation(62);
    let mut t = s.clone();
    t.positions = s
        .positions
        .iter()
        .map(|p| common::rotate(&rot, p))
        .collect();
    let p = calc.compute(&Batch::new(vec![s, t]).unwrap()).unwrap();
    assert!((p.energies[0] - p.energies[1]).abs() < 1e-10 * p.energies[0].abs());
    let rotated: Vec<[f64; 3]> = p.forces[0]
        .iter()
        .map(|f| common::rotate(&rot, f))
        .collect();
    assert!(max_force_diff(&rotated, &p.forces[1]) < 1e-10);
}

/// MD with the fused kernels conserves energy exactly as MD through candle's backprop: the
/// same NVE trajectory, step for step.
#[test]
fn md_with_fused_kernels_follows_the_autograd_trajectory() {
    use mlff_distiller::md::{Ensemble, MdSettings, PainnForces, Simulation};
    let s = common::random_molecule(10, 31);
    let settings = MdSettings {
        steps: 100,
        ensemble: Ensemble::Nve,
        log_every: 5,
        traj_every: 0,
        skin: 0.3,
        stop_when_unstable: false,
        ..Default::default()
    };
    let run = |ops: Backend| {
        let calc = common::calculator(DType::F64, &Device::Cpu).with_backend(ops);
        let f = PainnForces::new(&calc, &s, settings.skin).unwrap();
        let mut sim = Simulation::new(f, &s, settings.clone(), serde_json::Value::Null).unwrap();
        sim.run(&mut |_| {}).unwrap();
        sim.records().to_vec()
    };
    let (plain, fused) = (run(Backend::Autograd), run(Backend::Fused));
    assert_eq!(plain.len(), 21);
    let spread = |r: &[mlff_distiller::md::LogRecord]| {
        let e: Vec<f64> = r.iter().map(|x| x.e_tot).collect();
        e.iter().cloned().fold(f64::MIN, f64::max) - e.iter().cloned().fold(f64::MAX, f64::min)
    };
    for (a, b) in plain.iter().zip(&fused) {
        assert!(
            (a.e_tot - b.e_tot).abs() < 1e-9,
            "step {}: {} vs {}",
            a.step,
            a.e_tot,
            b.e_tot
        );
    }
    assert!((spread(&plain) - spread(&fused)).abs() < 1e-9);
}

/// Bad edge lists and shapes are errors that name the tensor and the edge, not panics.
#[test]
fn bad_inputs_are_named() {
    use mlff_distiller::ops::{
        edge_basis, edge_basis_adjoint, interaction, EdgeFilter, InteractionInputs,
    };
    let x = inputs(SHAPES[2], DType::F64, 7);
    let bad = Tensor::new(vec![x.shape.n as u32; x.shape.e], &Device::Cpu).unwrap();
    let err = edge_basis(&x.positions, &x.offsets, &x.centers, &bad, x.shape.r, 4.0).unwrap_err();
    assert!(
        err.to_string()
            .contains("edge basis: neighbors[0] = 40 is out of range for 40 atoms"),
        "{err}"
    );
    // The adjoint names itself.
    let grad = Tensor::zeros((x.shape.e, x.shape.r + 4), DType::F64, &Device::Cpu).unwrap();
    let err = edge_basis_adjoint(
        &x.positions,
        &x.offsets,
        &grad,
        &x.centers,
        &bad,
        x.shape.r,
        4.0,
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("edge basis adjoint: neighbors[0] = 40 is out of range for 40 atoms"),
        "{err}"
    );
    let err = edge_basis(
        &x.positions,
        &x.positions,
        &x.centers,
        &x.neighbors,
        x.shape.r,
        4.0,
    )
    .unwrap_err();
    assert!(err.to_string().contains("offsets [40, 3]"), "{err}");
    let basis = edge_basis(
        &x.positions,
        &x.offsets,
        &x.centers,
        &x.neighbors,
        x.shape.r,
        4.0,
    )
    .unwrap();
    let tuning = Tuning::default();
    let args = |centers| InteractionInputs {
        phi: &x.phi,
        phi_bias: &x.phi_bias,
        filter: EdgeFilter::Weights(&x.filter),
        basis: &basis,
        state: &x.state,
        centers,
        neighbors: &x.neighbors,
        symmetric_edges: false,
        tuning: &tuning,
    };
    let err = interaction(&args(&bad)).unwrap_err();
    assert!(
        err.to_string().contains("interaction: centers[0] = 40"),
        "{err}"
    );
    assert!(interaction(&args(&x.centers)).is_ok());
}

/// The context adjoint adds into the packed gradient in place: it refuses a context gradient
/// that is itself a view of that gradient (its launch would read what it writes), naming the
/// input, and leaves the gradient as it was.
#[test]
fn in_place_context_adjoint_refuses_a_view_of_its_target() {
    use mlff_distiller::ops::update_context_adjoint;
    let (n, f) = (5, 4);
    let mixed = Tensor::randn(0f32, 1.0, (3 * n, 2 * f), &Device::Cpu).unwrap();
    let packed = Tensor::randn(0f32, 1.0, 13 * n * f, &Device::Cpu).unwrap();
    let before = packed.to_vec1::<f32>().unwrap();
    let g_ctx = packed
        .narrow(0, 0, 2 * n * f)
        .unwrap()
        .reshape((n, 2 * f))
        .unwrap();
    let err = update_context_adjoint(&mixed, &g_ctx, packed.clone()).unwrap_err();
    assert!(
        err.to_string()
            .contains("float input 1 shares the target's storage"),
        "{err}"
    );
    assert_eq!(packed.to_vec1::<f32>().unwrap(), before);
    // A target that is not contiguous (every second value of a longer one) is refused too.
    let strided = Tensor::randn(0f32, 1.0, (13 * n * f, 2), &Device::Cpu)
        .unwrap()
        .narrow(1, 0, 1)
        .unwrap()
        .squeeze(1)
        .unwrap();
    let g_own = g_ctx.copy().unwrap();
    let err = update_context_adjoint(&mixed, &g_own, strided).unwrap_err();
    assert!(err.to_string().contains("must be contiguous"), "{err}");
    // A context gradient of its own is added in place: the s rows change, the v rows do not.
    let g_ctx = g_ctx.copy().unwrap();
    let (g_state, _) = update_context_adjoint(&mixed, &g_ctx, packed.clone()).unwrap();
    let after = packed.to_vec1::<f32>().unwrap();
    assert_eq!(
        g_state.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        after[..4 * n * f]
    );
    assert_ne!(after[..n * f], before[..n * f]);
    assert_eq!(after[n * f..4 * n * f], before[n * f..4 * n * f]);
}

/// For a list holding every edge's reverse, the adjoint that sums each atom's sending gradients
/// over its own run of edges (`symmetric_edges`, from the tuning's tile threshold on any device;
/// here its CPU twins: in f64 the CUDA-core kernel's, leaving dL/dw as rows, in f32 the
/// tensor-core kernel's, summing dL/d(basis) itself) gives the standard adjoint's dL/dv and
/// dL/dφ and, through the edge basis, the same position gradients, although it spreads
/// dL/d(basis) differently over each edge and its reverse.
#[test]
fn symmetric_adjoint_gives_the_standard_position_gradients() {
    use common::fused::{shape, CUTOFF};
    use mlff_distiller::ops::{
        edge_basis, edge_basis_adjoint, interaction_adjoint, EdgeFilter, InteractionGrads,
        InteractionInputs,
    };
    let tuning = Tuning::default();
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
        let x = inputs(shape(300, 4_500, 16, 6), dtype, 77).symmetric();
        assert!(x.shape.e >= tuning.tile_from(false));
        let (pos, off, ci, nj, r) = (
            &x.positions,
            &x.offsets,
            &x.centers,
            &x.neighbors,
            x.shape.r,
        );
        let basis = edge_basis(pos, off, ci, nj, r, CUTOFF).unwrap();
        let grads_adding = |symmetric_edges, after: Option<&Tensor>| {
            let inputs = InteractionInputs {
                phi: &x.phi,
                phi_bias: &x.phi_bias,
                filter: EdgeFilter::Weights(&x.filter),
                basis: &basis,
                state: &x.state,
                centers: ci,
                neighbors: nj,
                symmetric_edges,
                tuning: &tuning,
            };
            let n = x.shape.n;
            let g_v = (x.g_state.narrow(0, n, 3 * n).unwrap() + &x.g_rows).unwrap();
            interaction_adjoint(&inputs, &x.g_state.narrow(0, 0, n).unwrap(), &g_v, after)
        };
        let grads = |symmetric_edges| grads_adding(symmetric_edges, None).unwrap();
        let (plain, sym) = (grads(false), grads(true));
        // dL/dw rows from the CUDA-core twin (f64) only.
        assert!(plain.filter_rows.is_none());
        assert_eq!(sym.filter_rows.is_some(), dtype == DType::F64);
        // basis · filter_basis = the filter rows (zero weights for the unit-vector columns).
        let zeros = x.filter.zeros_like().unwrap().narrow(0, 0, 3).unwrap();
        let filter_basis = Tensor::cat(&[&x.filter, &zeros], 0).unwrap();
        let complete = |g: &InteractionGrads| g.complete_basis(&filter_basis).unwrap();
        let to_positions =
            |g: &InteractionGrads| edge_basis_adjoint(pos, off, &complete(g), ci, nj, r, CUTOFF);
        let (p_plain, p_sym) = (to_positions(&plain).unwrap(), to_positions(&sym).unwrap());
        for (what, a, b) in [
            ("dL/dv", &plain.v, &sym.v),
            ("dL/dphi", &plain.phi, &sym.phi),
            ("dL/dx", &p_plain, &p_sym),
        ] {
            let d = max_abs_diff(a, b);
            assert!(d <= tol * scale(a), "{dtype:?} {what}: {d}");
        }
        // The two spread dL/d(basis) differently: equal position gradients are not trivial.
        assert!(max_abs_diff(&complete(&plain), &complete(&sym)) > 1e-3);
        // The later blocks' dL/d(basis) is added: by the symmetric adjoint's twin, after the
        // other.
        for (symmetric_edges, alone) in [(true, &sym), (false, &plain)] {
            let added = grads_adding(symmetric_edges, Some(&x.g_basis)).unwrap();
            let want = (complete(alone) + &x.g_basis).unwrap();
            let d = max_abs_diff(&complete(&added), &want);
            assert!(
                d <= tol * scale(&want),
                "{dtype:?} symmetric {symmetric_edges}: {d}"
            );
        }
        let short = x.g_basis.narrow(1, 0, 3).unwrap();
        let err = grads_adding(true, Some(&short)).err().unwrap().to_string();
        assert!(err.contains("does not fit [E, R + 4]"), "{err}");
    }
}

/// The fused model on a periodic box of more edges than the tiles' threshold with the filter
/// formed in the kernels takes the symmetric-list adjoint (on the CPU its twin: in f32 the
/// tensor-core kernel's): its forces equal the autograd model's.
#[test]
fn fused_forces_with_the_symmetric_adjoint_match_autograd() {
    use mlff_distiller::calculator::forces_from;
    let tuning = Tuning {
        filter_rows_from_edges: Some(usize::MAX),
        ..Tuning::default()
    };
    let batch = Batch::new(vec![mlff_distiller::systems::water_box(128, 5)]).unwrap();
    for (dtype, e_tol, f_tol) in [(DType::F64, 1e-10, 1e-10), (DType::F32, 1e-3, 2e-4)] {
        let calc = common::calculator(dtype, &Device::Cpu).with_backend(Backend::Fused);
        let (inputs, positions) = calc.prepare(&batch).unwrap();
        assert!(inputs.centers.dim(0).unwrap() >= tuning.tile_from(false));
        let fused = calc.fused().unwrap().clone();
        let pass = fused.with_tuning(tuning.clone());
        let pass = pass.forward(&inputs).unwrap();
        let graph = common::calculator(dtype, &Device::Cpu);
        let e_graph = graph.model().atom_energies(&inputs).unwrap();
        let f_graph = forces_from(&e_graph.sum_all().unwrap(), &positions).unwrap();
        let d = max_abs_diff(&pass.atom_energies, &e_graph);
        assert!(d < e_tol, "{dtype:?} energies: {d}");
        let d = max_abs_diff(&pass.forces().unwrap(), &f_graph);
        assert!(d < f_tol * scale(&f_graph), "{dtype:?} forces: {d}");
    }
}

/// The tensor-core dense layers' CPU twins (the GPU test's oracle) against candle's matmul and
/// backprop: one layer, the two-layer MLP with SiLU, and its adjoint; shapes the model does
/// not use included. Shapes the kernels do not take are refused with the layer named.
#[test]
fn tensor_core_layer_twins_match_matmul_and_backprop() {
    use candle_core::Var;
    use common::dense::{layer_inputs, layer_outputs, layers};
    use mlff_distiller::ops::{dense_tc, dense_tc_adding, mlp_tc, tc_weights};
    let cases = [
        layers(1, 16, 16, 16),
        layers(37, 32, 48, 96),
        layers(5, 128, 128, 384),
    ];
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
        for (seed, c) in cases.iter().enumerate() {
            let x = layer_inputs(*c, dtype, 500 + seed as u64);
            let got = layer_outputs(&x, &Device::Cpu).unwrap();
            let input = Var::from_tensor(&x.x).unwrap();
            let pre = input.matmul(&x.w1.t().unwrap()).unwrap();
            let hidden = pre.broadcast_add(&x.b1).unwrap().silu().unwrap();
            let y = hidden.matmul(&x.w2.t().unwrap()).unwrap();
            let loss = (&y * &x.g).unwrap().sum_all().unwrap();
            let gx = loss.backward().unwrap().remove(&input).unwrap();
            let single = x.x.matmul(&x.wide.t().unwrap()).unwrap();
            let adding = (&single + &x.g).unwrap();
            assert_eq!(got.len(), 5);
            for ((name, a), b) in got.iter().zip([&single, &adding, &pre, &y, &gx]) {
                let d = max_abs_diff(a, b);
                assert!(d <= tol * scale(b), "{dtype:?} {c:?} {name}: {d}");
            }
        }
    }
    let x = layer_inputs(layers(4, 20, 16, 16), DType::F32, 9);
    let err = dense_tc(&x.x, &tc_weights(&x.wide).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("20 inputs"), "{err}");
    let x = layer_inputs(layers(4, 16, 16, 16), DType::F32, 9);
    let w = tc_weights(&x.wide).unwrap();
    let err = dense_tc_adding(&x.x, &w, &x.x.narrow(0, 0, 3).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("addend"), "{err}");
    let x = layer_inputs(layers(4, 16, 16, 16), DType::F32, 9);
    let (w1, w2) = (tc_weights(&x.w1).unwrap(), tc_weights(&x.w2).unwrap());
    let err = mlp_tc(&x.x, &w1, &x.w2, &w2).unwrap_err().to_string();
    assert!(err.contains("hidden bias"), "{err}");
}

/// The update block in one op, forward and adjoint (`ops::update_tc`, `ops::update_tc_adjoint`;
/// their CPU twins are the CUDA kernels' oracle), against the update written out in candle
/// ops (mixing, ‖Vv‖, the context MLP, the combination) and candle's backprop through them:
/// every output of the forward (the new state and the adjoint's tape), and dL/d(state) for a
/// gradient at the output with and without the next block's part. Also its refusals, which
/// name the weight, bias or gradient that does not fit.
#[test]
fn update_block_twins_match_candle_ops_and_backprop() {
    use candle_core::Var;
    use common::dense::{update_adjoint_outputs, update_grads, update_inputs, update_outputs};
    use mlff_distiller::ops::{
        tc_weights, update_tc, update_tc_adjoint, StateGrad, TcWeights, NORM_EPS,
    };
    for (n, f, seed) in [(1, 16, 31), (37, 32, 32), (5, 128, 33)] {
        let x = update_inputs(n, f, DType::F64, seed);
        let got = update_outputs(&x, &Device::Cpu, true).unwrap();
        let state = Var::from_tensor(&x.state).unwrap();
        let rows = |t: &Tensor, k: usize, count: usize| t.narrow(0, k * n, count * n).unwrap();
        let (s, v) = (rows(&state, 0, 1), rows(&state, 1, 3));
        let mixed = v.matmul(&x.mix.t().unwrap()).unwrap();
        let (uv, vv) = (
            mixed.narrow(1, 0, f).unwrap(),
            mixed.narrow(1, f, f).unwrap(),
        );
        let sum3 = |g: &dyn Fn(usize) -> Tensor| (g(0) + g(1)).unwrap().add(&g(2)).unwrap();
        let sq = sum3(&|k| rows(&vv, k, 1).sqr().unwrap());
        let norm = (sq + NORM_EPS).unwrap().sqrt().unwrap();
        let ctx = Tensor::cat(&[&s, &norm], 1).unwrap();
        let pre = ctx.matmul(&x.w1.t().unwrap()).unwrap();
        let hidden = pre.broadcast_add(&x.b1).unwrap().silu().unwrap();
        let act = hidden.matmul(&x.w2.t().unwrap()).unwrap();
        let a = act.broadcast_add(&x.act_bias).unwrap();
        let part = |p: usize| a.narrow(1, p * f, f).unwrap();
        let dot = sum3(&|k| (rows(&uv, k, 1) * rows(&vv, k, 1)).unwrap());
        let mut next = vec![((&s + part(0)).unwrap() + (part(2) * &dot).unwrap()).unwrap()];
        for k in 0..3 {
            next.push((rows(&v, k, 1) + (rows(&uv, k, 1) * part(1)).unwrap()).unwrap());
        }
        let next = Tensor::cat(&next, 0).unwrap();
        for ((name, got), want) in got.iter().zip([&next, &mixed, &pre, &act]) {
            let d = max_abs_diff(got, want);
            assert!(d <= 1e-12 * scale(want), "n {n} f {f} {name}: {d}");
        }
        let g = update_grads(n, f, DType::F64, seed + 100);
        for has_next in [false, true] {
            let got = update_adjoint_outputs(&x, &g, has_next, &Device::Cpu, true).unwrap();
            let (g_s, g_v) = match has_next {
                true => ((&g.gx + &g.gm).unwrap(), (&g.gve + &g.gvj).unwrap()),
                false => (g.gx.clone(), g.gve.zeros_like().unwrap()),
            };
            let seed = Tensor::cat(&[&g_s, &g_v], 0).unwrap();
            let loss = (&next * &seed).unwrap().sum_all().unwrap();
            let want = loss.backward().unwrap().remove(&state).unwrap();
            let want = [rows(&want, 0, 1), rows(&want, 1, 3)];
            for ((name, got), want) in got.iter().zip(&want) {
                let d = max_abs_diff(got, want);
                assert!(
                    d <= 1e-12 * scale(want),
                    "n {n} f {f} next {has_next} {name}: {d}"
                );
            }
        }
    }
    let x = update_inputs(4, 16, DType::F32, 9);
    let tc = |t: &Tensor| tc_weights(t).unwrap();
    let (mix, w1, w2) = (tc(&x.mix), tc(&x.w1), tc(&x.w2));
    let run = |mix, w1, w2, b1: &Tensor, act_bias: &Tensor| {
        update_tc(&x.state, mix, w1, b1, w2, act_bias)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let err = run(&w1, &w1, &w2, &x.b1, &x.act_bias);
    assert!(err.contains("mixing weight"), "{err}");
    let err = run(&mix, &w1, &mix, &x.b1, &x.act_bias);
    assert!(err.contains("context output weight"), "{err}");
    let err = run(&mix, &w1, &w2, &x.act_bias, &x.act_bias);
    assert!(err.contains("context hidden bias"), "{err}");
    let tape = update_tc(&x.state, &mix, &w1, &x.b1, &w2, &x.act_bias).unwrap();
    let t = |w: &Tensor| tc(&w.t().unwrap().contiguous().unwrap());
    let (w2t, w1t, mix_t) = (t(&x.w2), t(&x.w1), t(&x.mix));
    let (mixed, act, pre) = (&tape.mixed, &tape.act, &tape.ctx_pre);
    let adjoint_error = |gx_rows: usize, w2t: &TcWeights| {
        let gx = x.state.narrow(0, 0, gx_rows).unwrap();
        let grad = StateGrad {
            gx: &gx,
            next: None,
        };
        update_tc_adjoint(
            mixed,
            act,
            &x.act_bias,
            pre,
            &x.b1,
            &grad,
            w2t,
            &w1t,
            &mix_t,
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
    };
    let err = adjoint_error(3, &w2t);
    assert!(err.contains("gradient on s"), "{err}");
    let err = adjoint_error(4, &w1t);
    assert!(err.contains("transposed context output weight"), "{err}");
}

/// (energies, forces) of a random molecule of `atoms` atoms under a model of `cfg` (f64, CPU,
/// fused path) with the tensor-core layers' twins off, then on at every size, then by candle's
/// backprop through the stock model.
fn with_and_without_tensor_cores(
    cfg: &mlff_distiller::model::PainnConfig,
    seed: u64,
    atoms: usize,
) -> [(Tensor, Tensor); 3] {
    use mlff_distiller::calculator::forces_from;
    use mlff_distiller::PainnCalculator;
    let model = common::model(cfg, seed, DType::F64, &Device::Cpu);
    let calc = PainnCalculator::new(model, Device::Cpu, DType::F64).with_backend(Backend::Fused);
    let batch = Batch::new(vec![common::random_molecule(atoms, seed + 2)]).unwrap();
    let (inputs, positions) = calc.prepare(&batch).unwrap();
    let fused = calc.fused().unwrap();
    let run = |rows: std::ops::RangeInclusive<usize>| {
        let tuning = Tuning {
            dense_kernel_max_rows: 0,
            dense_tensor_cores_from_rows: *rows.start(),
            dense_tensor_cores_until_rows: *rows.end(),
            ..Tuning::default()
        };
        let model = fused.clone().with_tuning(tuning).with_cpu_twins(true);
        let pass = model.forward(&inputs).unwrap();
        (pass.atom_energies.clone(), pass.forces().unwrap())
    };
    let e_graph = calc.model().atom_energies(&inputs).unwrap();
    let f_graph = forces_from(&e_graph.sum_all().unwrap(), &positions).unwrap();
    [
        run(usize::MAX..=usize::MAX),
        run(0..=usize::MAX),
        (e_graph, f_graph),
    ]
}

/// A width (F = 144) whose forward layers fit the tensor-core kernels but whose 3F-wide adjoint
/// reduction (432) does not: the forward runs on the kernels' twins, that adjoint on matmul, and
/// energies and forces match the path without them.
#[test]
fn tensor_core_layers_fall_back_where_a_width_does_not_fit() {
    let cfg = mlff_distiller::model::PainnConfig {
        hidden: 144,
        n_blocks: 1,
        ..common::small_config()
    };
    let [(e_off, f_off), (e_on, f_on), _] = with_and_without_tensor_cores(&cfg, 3, 6);
    assert!(max_abs_diff(&e_on, &e_off) < 1e-10, "energies");
    assert!(max_abs_diff(&f_on, &f_off) < 1e-10, "forces");
}

/// The initial state refuses an element index past the embedding, naming the atom.
#[test]
fn initial_state_names_a_bad_element_index() {
    let table = Tensor::zeros((3, 4), DType::F64, &Device::Cpu).unwrap();
    let species = Tensor::new(&[0u32, 2, 3], &Device::Cpu).unwrap();
    let err = mlff_distiller::ops::initial_state(&table, &species)
        .unwrap_err()
        .to_string();
    assert!(err.contains("atom 2 has element index 3"), "{err}");
}

/// The tensor-core readout's CPU twin (`ops::readout_tc`: energies and −∂E/∂x in one launch)
/// against candle's silu, matmul and backprop, f64 and f32, at the shipped widths (128 → 64)
/// and others; a bad element index and mis-shaped output weights are refused, named.
#[test]
fn tensor_core_readout_twin_matches_backprop() {
    use candle_core::Var;
    use common::dense::{readout_inputs, readout_outputs};
    use mlff_distiller::ops::{readout_tc, tc_weights};
    for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
        for (seed, (n, k, h)) in [(1, 16, 16), (37, 128, 64), (9, 32, 48)]
            .into_iter()
            .enumerate()
        {
            let x = readout_inputs(n, k, h, dtype, 60 + seed as u64);
            let got = readout_outputs(&x, &Device::Cpu).unwrap();
            let input = Var::from_tensor(&x.x).unwrap();
            let pre = input.matmul(&x.w1.t().unwrap()).unwrap();
            let hidden = pre.broadcast_add(&x.b1).unwrap().silu().unwrap();
            let w = x.w.reshape((h, 1)).unwrap();
            let constants = x.constant.index_select(&x.species, 0).unwrap();
            let e = (hidden.matmul(&w).unwrap().squeeze(1).unwrap() + constants).unwrap();
            let grads = e.sum_all().unwrap().backward().unwrap();
            let minus_grad = grads.get(&input).unwrap().neg().unwrap();
            for ((name, a), b) in got.iter().zip([&e, &minus_grad]) {
                let d = max_abs_diff(a, b);
                assert!(
                    d <= tol * scale(b),
                    "{dtype:?} n {n} k {k} h {h} {name}: {d}"
                );
            }
        }
    }
    let x = readout_inputs(3, 16, 16, DType::F32, 5);
    let (w1, w1t) = (
        tc_weights(&x.w1).unwrap(),
        tc_weights(&x.w1.t().unwrap()).unwrap(),
    );
    let run = |w: &Tensor, species: &Tensor| {
        readout_tc(&x.x, &w1, &x.b1, w, &w1t, &x.constant, species)
            .unwrap_err()
            .to_string()
    };
    let bad = Tensor::new(&[0u32, 4, 1], &Device::Cpu).unwrap();
    let err = run(&x.w, &bad);
    assert!(err.contains("atom 1 has element index 4"), "{err}");
    let err = run(&x.w.narrow(0, 0, 8).unwrap(), &x.species);
    assert!(err.contains("output weights"), "{err}");
}

/// A model of the shipped widths (F = 128, two blocks) with every dense layer on the
/// tensor-core twins, so that its readout runs as `ops::readout_tc`: the same energies and
/// forces as without them and as candle's backprop through the stock model.
#[test]
fn tensor_core_readout_runs_in_the_model() {
    let cfg = mlff_distiller::model::PainnConfig {
        hidden: 128,
        ..common::small_config()
    };
    let [off, on, (e_graph, f_graph)] = with_and_without_tensor_cores(&cfg, 11, 7);
    assert!(
        common::max_abs_tensor(&f_graph) > 1e-3,
        "forces should not vanish"
    );
    for (what, (e, f)) in [("tensor cores", on), ("matmul", off)] {
        assert!(max_abs_diff(&e, &e_graph) < 1e-10, "{what}: energies");
        assert!(max_abs_diff(&f, &f_graph) < 1e-10, "{what}: forces");
    }
}

/// A model with more radial functions than the fused kernels take is refused by the fused path
/// before any call, naming the count and the way out; the custom path runs it.
#[test]
fn too_many_radial_functions_are_refused_up_front() {
    use mlff_distiller::ops::FUSED_MAX_RBF;
    let cfg = mlff_distiller::model::PainnConfig {
        n_rbf: FUSED_MAX_RBF + 1,
        ..common::small_config()
    };
    assert!(cfg.fused_note().is_some());
    assert!(common::small_config().fused_note().is_none());
    let model = common::model(&cfg, 3, DType::F64, &Device::Cpu);
    let calc = mlff_distiller::PainnCalculator::new(model, Device::Cpu, DType::F64);
    let err = calc
        .with_backend(Backend::Fused)
        .check_ops()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("{} radial functions", FUSED_MAX_RBF + 1))
            && err.contains("--backend autograd"),
        "{err}"
    );
    let model = common::model(&cfg, 3, DType::F64, &Device::Cpu);
    let calc = mlff_distiller::PainnCalculator::new(model, Device::Cpu, DType::F64);
    let calc = calc.with_backend(Backend::Autograd);
    calc.check_ops().unwrap();
    let p = calc.compute(&batch()).unwrap();
    let forces = p.forces.iter().flatten().flatten();
    assert!(p.energies.iter().chain(forces).all(|v| v.is_finite()));
}
