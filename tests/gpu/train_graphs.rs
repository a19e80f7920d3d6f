//! Training steps replayed as CUDA graphs (`mlff train --graphs`) against the same steps op by
//! op.

use crate::common::*;
use crate::cuda;
use candle_core::{DType, Device, Tensor};
use mlff_distiller::device::with_own_stream;
use mlff_distiller::graph::Graphs;
use mlff_distiller::train::{Dataset, TrainConfig, Trainer};

/// Eleven molecules of 5 to 11 atoms, labelled by a random teacher: batches of 4 (and the
/// last of 3) come in several sizes, so steps run on graphs of their exact size and on graphs
/// for 64 atoms, padded.
fn dataset() -> Dataset {
    let frames = (0..11)
        .map(|k| random_molecule(5 + (k * 5) % 7, 100 + k as u64))
        .collect();
    let frames = labelled(&small_config(), frames);
    Dataset::from_frames(std::path::Path::new("mem"), frames).unwrap()
}

#[test]
fn replayed_training_steps_equal_steps_op_by_op() {
    let dev = with_own_stream(&cuda()).unwrap();
    let ds = dataset();
    let tc = TrainConfig {
        batch_size: 4,
        epochs: 3,
        ..TrainConfig::default()
    };
    // f64: the two differ by the pass at x (one launch op by op, separate kernels replayed),
    // ~1e-15 of each force, which the directional gradient's 1/h takes to ~1e-10 (measured
    // 1.7e-12 in the weights on an H200); f32: ~1e-6 of the forces, ~1e-3 of the gradients
    // (as the directional gradient's own f32 rounding), so after 9 Adam steps of lr 1e-3 the
    // weights differ by a few hundredths of a step (measured 2.0e-5).
    for (dtype, tol) in [(DType::F64, 1e-9), (DType::F32, 1e-4)] {
        let run = |graphs: Graphs| {
            let mut t = Trainer::new(&small_config(), &tc, &ds, &ds, &dev, dtype, None)
                .unwrap()
                .with_graphs(graphs);
            let mut losses = Vec::new();
            for _ in 0..3 {
                t.train_epoch(|_, loss| losses.push(loss)).unwrap();
            }
            let weights: Vec<Tensor> = t
                .optimizer()
                .vars()
                .iter()
                .map(|(_, v)| {
                    v.as_tensor()
                        .to_dtype(DType::F64)
                        .unwrap()
                        .to_device(&Device::Cpu)
                        .unwrap()
                })
                .collect();
            (losses, weights, t.ema_model().is_ok())
        };
        let (l_eager, w_eager, _) = run(Graphs::Off);
        let (l_graph, w_graph, ema_ok) = run(Graphs::On);
        assert!(ema_ok);
        assert_eq!(l_eager.len(), 9);
        for (k, (a, b)) in l_eager.iter().zip(&l_graph).enumerate() {
            assert!(
                (a - b).abs() <= 1e3 * tol * a.abs(),
                "{dtype:?} step {k}: loss {a} vs {b}"
            );
        }
        let mut worst: f64 = 0.0;
        for (a, b) in w_eager.iter().zip(&w_graph) {
            worst = worst.max(max_abs_diff(a, b));
        }
        println!("{dtype:?}: largest weight difference after 9 steps {worst:.2e}");
        assert!(worst <= tol, "{dtype:?}: weights differ by {worst}");
    }
}
