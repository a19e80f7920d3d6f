//! CUDA vs CPU agreement. Runs only with `--features cuda` on a machine with a GPU
//! (benches/gpu/README.md); each check compares a CUDA result against its CPU twin.
#![cfg(feature = "cuda")]

#[path = "../common/mod.rs"]
mod common;

mod domain;
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
#[cfg(feature = "nccl")]
mod train_devices;
mod train_graphs;
mod weight_grads;

use candle_core::{DType, Device};
use common::*;
use mlff_distiller::checkpoint;
use mlff_distiller::model::Backend;
use mlff_distiller::{PainnCalculator, Prediction};

/// Device 0 opened as the library opens it (its own stream, released under the capture lock:
/// candle's own `Device::new_cuda` devices, dropped as other tests end, would invalidate the
/// graphs tests capture meanwhile).
fn cuda() -> Device {
    mlff_distiller::device::select(mlff_distiller::device::DeviceSpec::Cuda(0))
        .expect("a CUDA device (these tests run on the GPU machine)")
        .device
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

/// A trainer (f64, on `dev`) of `data`, its loss on the first four frames and that loss's
/// gradient for `filter.weight`: what the CUDA-vs-CPU checks of a loss term compare.
fn loss_and_gradient(
    cfg: &mlff_distiller::model::PainnConfig,
    train: &mlff_distiller::train::TrainConfig,
    data: &mlff_distiller::train::Dataset,
    dev: &Device,
) -> (mlff_distiller::train::Trainer, f64, Vec<f64>) {
    second_order();
    let t =
        mlff_distiller::train::Trainer::new(cfg, train, data, data, dev, DType::F64, None).unwrap();
    let (loss, grads) = t.loss_and_grads(&[0, 1, 2, 3]).unwrap();
    let vars = t.optimizer().vars();
    let var = vars.iter().find(|(n, _)| n == "filter.weight").unwrap();
    let g = grads.get(var.1.as_tensor()).unwrap();
    let g = g.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    (t, loss, g)
}

/// CUDA's loss within 1e-9 of the CPU's, its gradient within 1e-8 of the largest component.
fn assert_same_loss(cpu: (f64, &[f64]), cuda: (f64, &[f64])) {
    let ((l_cpu, g_cpu), (l_gpu, g_gpu)) = (cpu, cuda);
    assert!(
        (l_cpu - l_gpu).abs() < 1e-9 * l_cpu.abs(),
        "{l_gpu} vs {l_cpu}"
    );
    let scale = g_cpu.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    for (x, y) in g_cpu.iter().zip(g_gpu) {
        assert!((x - y).abs() < 1e-8 * scale, "gradient {y} vs {x}");
    }
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
