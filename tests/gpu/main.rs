//! CUDA vs CPU agreement. Runs only with `--features cuda` on a machine with a GPU
//! (benches/gpu/README.md); each check compares a CUDA result against its CPU twin.
#![cfg(feature = "cuda")]

#[path = "../common/mod.rs"]
mod common;

mod fused_kernels;
mod hessian;
mod md;
mod md_batch;
mod model;
mod neighbors;
mod npt;
mod one_launch;
mod optimizer;
mod stress;
mod train_graphs;
mod weight_grads;

use candle_core::{DType, Device};
use common::*;
use mlff_distiller::checkpoint;
use mlff_distiller::model::Backend;
use mlff_distiller::{PainnCalculator, Prediction};

fn cuda() -> Device {
    Device::new_cuda(0).expect("a CUDA device (these tests run on the GPU machine)")
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
