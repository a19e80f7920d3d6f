//! The fused path's weight gradients (`FusedPainn::weight_gradients`) against candle's
//! backprop of the same weighted sum of atom energies, on every per-layer kernel path the plan
//! can pick (CPU twins).

mod common;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use common::max_abs_tensor;
use mlff_distiller::model::{init_varmap, FusedPainn, Painn};
use mlff_distiller::{Batch, PainnCalculator, Structure, Tuning};

/// A lone atom (no edges), a molecule with one atom out of reach, a periodic box.
fn batch() -> Batch {
    let mut far = common::random_molecule(7, 51);
    far.positions.push([40.0, 0.0, 0.0]);
    far.numbers.push(8);
    Batch::new(vec![
        far,
        Structure::molecule(vec![6], vec![[0.0; 3]]),
        common::random_molecule(9, 52),
        common::random_box(24, 0.3, 53),
    ])
    .unwrap()
}

/// A model whose every variable, the readout's scale and shift included, is a random `Var`.
fn model(dtype: DType) -> (VarMap, Painn) {
    let cfg = common::small_config();
    let vm = init_varmap(&cfg, 5, dtype, &Device::Cpu).unwrap();
    {
        let data = vm.data().lock().unwrap();
        let set = |name: &str, v: f64| {
            let t = Tensor::new(&[v], &Device::Cpu).unwrap().to_dtype(dtype);
            data[name].set(&t.unwrap()).unwrap();
        };
        set("readout.scale", 1.7);
        set("readout.shift", -0.3);
    }
    let painn = Painn::new(&cfg, VarBuilder::from_varmap(&vm, dtype, &Device::Cpu)).unwrap();
    (vm, painn)
}

/// Tunings that send the layers down each per-layer path: candle's matmuls, our small dense
/// kernels, and where inference would take the tensor-core layers (the weight gradients take
/// cuBLAS there); the filter as rows (the CPU's default: dL/dW from dL/d(rows)) and formed in
/// the kernel (CUDA's, whose adjoint sums dL/dW over the edges).
fn tunings() -> Vec<(&'static str, Tuning, bool)> {
    let matmul = Tuning {
        dense_kernel_max_rows: 0,
        dense_tensor_cores_from_rows: usize::MAX,
        dense_tensor_cores_until_rows: usize::MAX,
        ..Tuning::default()
    };
    let small = Tuning {
        dense_kernel_max_rows: usize::MAX,
        ..matmul.clone()
    };
    let tensor_cores = Tuning {
        dense_tensor_cores_from_rows: 0,
        ..matmul.clone()
    };
    let in_kernel = Tuning {
        filter_rows_from_edges: Some(usize::MAX),
        ..Tuning::default()
    };
    vec![
        ("default", Tuning::default(), false),
        ("filter in the kernel", in_kernel, false),
        ("matmul", matmul, false),
        ("dense kernels", small, true),
        ("tensor-core layers", tensor_cores, true),
    ]
}

#[test]
fn fused_weight_gradients_equal_backprop() {
    let batch = batch();
    for (dtype, tol) in [(DType::F64, 1e-10), (DType::F32, 1e-4)] {
        let (vm, painn) = model(dtype);
        let calc = PainnCalculator::new(painn, Device::Cpu, dtype);
        let (inputs, _) = calc.prepare(&batch).unwrap();
        let n = batch.n_atoms();
        // Seeds of both signs and different sizes, as training's displaced copies give.
        let seed: Vec<f64> = (0..n).map(|i| ((i * 7 % 11) as f64 - 5.0) / 3.0).collect();
        let seed = Tensor::from_vec(seed, n, &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let energies = calc.model().atom_energies(&inputs).unwrap();
        let backprop = (energies * &seed)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        let vars = vm.data().lock().unwrap().clone();
        for (what, tuning, twins) in tunings() {
            let fused = FusedPainn::new(calc.model(), &tuning)
                .unwrap()
                .with_cpu_twins(twins);
            let grads = fused.weight_gradients(&inputs, &seed).unwrap();
            let fixed = ["readout.atom_ref", "readout.scale", "readout.shift"];
            let mut wanted: Vec<&String> = vars
                .keys()
                .filter(|k| !fixed.contains(&k.as_str()))
                .collect();
            wanted.sort();
            let mut got: Vec<&String> = grads.iter().map(|(k, _)| k).collect();
            got.sort();
            assert_eq!(got, wanted, "{what}: variables");
            for (name, g) in &grads {
                let want = backprop.get(vars[name].as_tensor()).unwrap();
                assert_eq!(g.dims(), want.dims(), "{what} {name}: shape");
                let scale = max_abs_tensor(want);
                let diff = common::max_abs_diff(g, want);
                assert!(
                    scale > 0.0 && diff <= tol * scale,
                    "{dtype:?} {what} {name}: differs by {diff} of {scale}"
                );
            }
        }
    }
}

/// Seeds of zero give zero gradients, and the gradients are linear in the seeds: what the
/// trainer's surrogate (a weighted sum of the displaced copies' energies) relies on.
#[test]
fn fused_weight_gradients_are_linear_in_the_seeds() {
    let batch = batch();
    let (_, painn) = model(DType::F64);
    let calc = PainnCalculator::new(painn, Device::Cpu, DType::F64);
    let (inputs, _) = calc.prepare(&batch).unwrap();
    let n = batch.n_atoms();
    let fused = FusedPainn::new(calc.model(), &Tuning::default()).unwrap();
    let a = Tensor::from_vec((0..n).map(|i| (i % 3) as f64).collect(), n, &Device::Cpu).unwrap();
    let b = Tensor::from_vec(
        (0..n).map(|i| 1.0 - (i % 5) as f64).collect(),
        n,
        &Device::Cpu,
    )
    .unwrap();
    let ga = fused.weight_gradients(&inputs, &a).unwrap();
    let gb = fused.weight_gradients(&inputs, &b).unwrap();
    let gab = fused
        .weight_gradients(&inputs, &((&a * 2.0).unwrap() + &b).unwrap())
        .unwrap();
    let zero = fused
        .weight_gradients(&inputs, &a.zeros_like().unwrap())
        .unwrap();
    for (((name, x), (_, y)), ((_, z), (_, o))) in ga.iter().zip(&gb).zip(gab.iter().zip(&zero)) {
        let sum = ((x * 2.0).unwrap() + y).unwrap();
        let scale = max_abs_tensor(&sum).max(1e-12);
        assert!(common::max_abs_diff(&sum, z) <= 1e-12 * scale, "{name}");
        assert_eq!(max_abs_tensor(o), 0.0, "{name}");
    }
}
