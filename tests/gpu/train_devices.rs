//! Data-parallel training on two GPUs (`mlff train --devices`, NCCL) against one GPU taking
//! the same batches. Needs a build with the `nccl` feature and a machine with two GPUs.

use crate::common::*;
use candle_core::{DType, Device, Tensor};
use mlff_distiller::device::{cuda_device_count, select, DeviceSpec};
use mlff_distiller::graph::Graphs;
use mlff_distiller::train::{Dataset, TrainConfig, Trainer};

/// 21 molecules of 5 to 11 atoms labelled by a random teacher: batches of 8 split 4/4 with
/// shards of different atom counts, and the last batch of 5 splits 3/2.
fn dataset() -> Dataset {
    let frames = (0..21)
        .map(|k| random_molecule(5 + (k * 5) % 7, 300 + k as u64))
        .collect();
    let frames = labelled(&small_config(), frames);
    Dataset::from_frames(std::path::Path::new("mem"), frames).unwrap()
}

fn gpu(k: usize) -> Device {
    select(DeviceSpec::Cuda(k)).unwrap().device
}

/// 21 steps (7 epochs of 3) on `gpus` GPUs: each step's loss and the final weights (f64, host).
fn run(ds: &Dataset, dtype: DType, graphs: Graphs, gpus: usize) -> (Vec<f64>, Vec<Tensor>) {
    let tc = TrainConfig {
        batch_size: 8,
        epochs: 7,
        ..TrainConfig::default()
    };
    let others = (1..gpus).map(gpu).collect();
    let mut t = Trainer::new(&small_config(), &tc, ds, ds, &gpu(0), dtype, None)
        .unwrap()
        .with_graphs(graphs)
        .with_replicas(others)
        .unwrap();
    assert_eq!(t.ranks(), gpus);
    let mut losses = Vec::new();
    for _ in 0..7 {
        t.train_epoch(|_, loss| losses.push(loss)).unwrap();
    }
    let weights = t
        .optimizer()
        .vars()
        .iter()
        .map(|(_, v)| {
            let w = v.as_tensor().to_dtype(DType::F64).unwrap();
            w.to_device(&Device::Cpu).unwrap()
        })
        .collect();
    (losses, weights)
}

/// Two GPUs give one GPU's training, step by step, with steps replayed as graphs (NCCL's sums
/// captured in them) and op by op. f64: only the order of sums differs (~1e-15 of a gradient,
/// which the directional gradient's 1/h takes to ~1e-10); f32: the shards' f32 sums differ
/// from the whole batch's by ~1e-7 of each force error, ~1e-3 of the directional gradient, so
/// after 21 Adam steps of lr 1e-3 the weights differ by a few hundredths of a step.
#[test]
fn two_gpus_train_as_one() {
    assert!(
        cuda_device_count() >= 2,
        "this test needs two GPUs (the GPU service's 2-GPU kind)"
    );
    let ds = dataset();
    for (dtype, tol) in [(DType::F64, 1e-9), (DType::F32, 2e-4)] {
        for graphs in [Graphs::On, Graphs::Off] {
            let (l1, w1) = run(&ds, dtype, graphs, 1);
            let (l2, w2) = run(&ds, dtype, graphs, 2);
            assert_eq!(l1.len(), 21);
            for (k, (a, b)) in l1.iter().zip(&l2).enumerate() {
                assert!(
                    (a - b).abs() <= 1e3 * tol * a.abs(),
                    "{dtype:?} {graphs:?} step {k}: loss {a} on one GPU, {b} on two"
                );
            }
            let worst = w1
                .iter()
                .zip(&w2)
                .fold(0.0f64, |m, (a, b)| m.max(max_abs_diff(a, b)));
            println!("{dtype:?} {graphs:?}: largest weight difference after 21 steps {worst:.2e}");
            assert!(
                worst <= tol,
                "{dtype:?} {graphs:?}: weights differ by {worst}"
            );
        }
    }
}
