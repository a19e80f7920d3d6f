//! The fused weight gradients (`FusedPainn::weight_gradients`) on CUDA against the CPU, with
//! the shipped GFN2 model on batches that take each per-layer path (our small dense kernels,
//! the tensor-core layers, cuBLAS).

use crate::common::*;
use crate::cuda;
use candle_core::{DType, Device, Tensor};
use mlff_distiller::checkpoint;
use mlff_distiller::model::FusedPainn;
use mlff_distiller::systems::{aspirin, water_box};
use mlff_distiller::{Batch, PainnCalculator, Tuning};

fn grads_on(batch: &Batch, dev: &Device, dtype: DType) -> Vec<(String, Tensor)> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/painn-gfn2.safetensors");
    let ck = checkpoint::load(&path).unwrap();
    let calc = PainnCalculator::new(ck.model(dev, dtype).unwrap(), dev.clone(), dtype);
    let (inputs, _) = calc.prepare(batch).unwrap();
    let n = batch.n_atoms();
    let seed: Vec<f64> = (0..n).map(|i| ((i * 7 % 13) as f64 - 5.0) / 6.0).collect();
    let seed = Tensor::from_vec(seed, n, dev)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let fused = FusedPainn::new(calc.model(), &Tuning::default()).unwrap();
    let grads = fused.weight_gradients(&inputs, &seed).unwrap();
    grads
        .into_iter()
        .map(|(k, g)| (k, g.to_device(&Device::Cpu).unwrap()))
        .collect()
}

#[test]
fn fused_weight_gradients_match_the_cpu() {
    let gpu = cuda();
    // 8 aspirins: 168 rows (dense kernels); 64: 1,344 (tensor cores in f32); a 1,500-atom
    // water box: cuBLAS for the vector rows.
    let cases = [
        ("8 aspirins", Batch::new(vec![aspirin(); 8]).unwrap()),
        ("64 aspirins", Batch::new(vec![aspirin(); 64]).unwrap()),
        ("water box", Batch::new(vec![water_box(500, 1)]).unwrap()),
    ];
    for (what, batch) in &cases {
        let want = grads_on(batch, &Device::Cpu, DType::F64);
        for (dtype, tol) in [(DType::F64, 1e-10), (DType::F32, 1e-3)] {
            let got = grads_on(batch, &gpu, dtype);
            let mut worst: f64 = 0.0;
            for ((name, a), (_, b)) in want.iter().zip(&got) {
                let scale = max_abs_tensor(a).max(1e-12);
                let d = max_abs_diff(
                    &a.to_dtype(DType::F64).unwrap(),
                    &b.to_dtype(DType::F64).unwrap(),
                );
                worst = worst.max(d / scale);
                assert!(
                    d <= tol * scale,
                    "{what} {dtype:?} {name}: differs by {d} of {scale}"
                );
            }
            println!("{what} {dtype:?}: worst weight gradient |Δ| / max = {worst:.2e}");
        }
    }
}
