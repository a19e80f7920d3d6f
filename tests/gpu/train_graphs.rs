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

/// Molecules and periodic triclinic boxes (edges to images): batches of 4 mix them.
fn mixed_dataset() -> Dataset {
    let frames = (0..10)
        .map(|k| match k % 3 {
            2 => random_box(6 + k % 4, 0.2, 200 + k as u64),
            _ => random_molecule(5 + (k * 5) % 7, 200 + k as u64),
        })
        .collect();
    let frames = labelled(&small_config(), frames);
    Dataset::from_frames(std::path::Path::new("mem"), frames).unwrap()
}

/// The batch gathered on the device (`ops::gather_frames`, CUDA) is its CPU twin's, bit for
/// bit: three frames taken out of order, padded in atoms, structures and edges.
#[test]
fn frames_gathered_on_the_device_equal_the_cpu_twin() {
    use mlff_distiller::ops::{gather_frames, FrameTensors, GatherShape};
    let gathered = |dev: &Device| {
        let f = |v: Vec<f64>| Tensor::new(v, dev).unwrap();
        let u = |v: Vec<u32>| Tensor::new(v, dev).unwrap();
        // Frames of 2, 3 and 1 atoms with 2, 4 and 0 edges.
        let frames = FrameTensors {
            positions: f((0..18).map(|k| 0.37 * k as f64 - 1.0).collect()),
            forces: f((0..18).map(|k| (k as f64).sin()).collect()),
            energy: f(vec![-1.5, -2.25, -0.125]),
            offsets: f((0..18).map(|k| (k % 5) as f64 * 0.5).collect()),
            atom_begin: u(vec![0, 2, 5, 6]),
            edge_begin: u(vec![0, 2, 6, 6]),
            species: u(vec![0, 1, 2, 0, 1, 3]),
            centers: u(vec![0, 1, 0, 1, 2, 2]),
            neighbors: u(vec![1, 0, 2, 2, 0, 1]),
        };
        let shape = GatherShape {
            structures: 5,
            atoms: 9,
            capacity: 11,
            far: 12.5,
        };
        // Frames 1, 0, 2 (6 atoms, 6 edges), averaged over 7 structures and 40 atoms.
        let mut table = vec![3, 7, 40, 1, 0, 2, 0, 0];
        table.extend([0, 3, 5, 6, 6, 6, 0, 4, 6, 6, 6, 6]);
        gather_frames(&frames, &u(table), shape)
            .unwrap()
            .to_device(&Device::Cpu)
            .unwrap()
            .to_vec1::<f64>()
            .unwrap()
    };
    let (cpu, gpu) = (gathered(&Device::Cpu), gathered(&cuda()));
    let (cpu_bits, gpu_bits): (Vec<u64>, Vec<u64>) = (
        cpu.iter().map(|x| x.to_bits()).collect(),
        gpu.iter().map(|x| x.to_bits()).collect(),
    );
    assert_eq!(cpu_bits, gpu_bits);
    // Frame 1's first atom opens the batch: its position, then frame 0's edges shifted by 3.
    let (s, n) = (5, 9);
    let positions = 2 * s + 4 * n + 2;
    let first: Vec<f64> = (6..9).map(|k| 0.37 * k as f64 - 1.0).collect();
    assert_eq!(&cpu[positions..positions + 3], &first[..]);
    let centers = positions + 3 * n + 3 * 11 + 2 * n;
    assert_eq!(&cpu[centers..centers + 6], &[0.0, 1.0, 2.0, 2.0, 3.0, 4.0]);
}

/// Training with the frames held on the device (each batch gathered inside the replayed step)
/// takes the steps of training that uploads each batch: the gathered inputs are the same bits
/// (the test above and `train::resident`'s), so the runs differ only by the order of the
/// kernels' atomic sums (f64 ~1e-15 of a gradient, ~1e-10 after the directional 1/h).
#[test]
fn frames_on_the_device_train_as_uploaded_batches() {
    let dev = with_own_stream(&cuda()).unwrap();
    let ds = mixed_dataset();
    let tc = TrainConfig {
        batch_size: 4,
        epochs: 3,
        ..TrainConfig::default()
    };
    let run = |on_device: bool| {
        let mut t = Trainer::new(&small_config(), &tc, &ds, &ds, &dev, DType::F64, None)
            .unwrap()
            .with_graphs(Graphs::On)
            .with_frames_on_device(on_device);
        let mut losses = Vec::new();
        for _ in 0..3 {
            t.train_epoch(|_, loss| losses.push(loss)).unwrap();
        }
        let weights: Vec<Tensor> = (t.optimizer().vars().iter())
            .map(|(_, v)| v.as_tensor().to_device(&Device::Cpu).unwrap())
            .collect();
        (losses, weights)
    };
    let (l_host, w_host) = run(false);
    let (l_dev, w_dev) = run(true);
    assert_eq!(l_host.len(), 9);
    for (k, (a, b)) in l_host.iter().zip(&l_dev).enumerate() {
        assert!(
            (a - b).abs() <= 1e-12 * a.abs(),
            "step {k}: loss {a} vs {b}"
        );
    }
    let worst = (w_host.iter().zip(&w_dev))
        .map(|(a, b)| max_abs_diff(a, b))
        .fold(0.0, f64::max);
    println!("frames on the device vs uploaded: weights {worst:.2e} apart after 9 steps");
    assert!(worst <= 1e-9, "weights differ by {worst}");
}

/// A fresh model's weights are the seed's on every device (made on the host, then moved), and
/// devices opened and dropped while another thread captures training steps on the same GPU
/// leave both working. Opening a device synchronises its context and releasing one its GPU,
/// which invalidated the other thread's capture (seen when this suite's training tests ran
/// side by side); the library now does neither during a capture (`device::capture_lock`).
#[test]
fn devices_opened_beside_graph_captures_init_as_the_cpu() {
    use mlff_distiller::model::init_varmap;
    let gpu = cuda();
    let cfg = small_config();
    let values = |dev: &Device| {
        let vm = init_varmap(&cfg, 11, DType::F64, dev).unwrap();
        let data = vm.data().lock().unwrap();
        let mut named: Vec<(String, Vec<f64>)> = (data.iter())
            .map(|(n, v)| {
                let t = v.as_tensor().to_device(&Device::Cpu).unwrap();
                (
                    n.clone(),
                    t.flatten_all().unwrap().to_vec1::<f64>().unwrap(),
                )
            })
            .collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        named
    };
    let want = values(&Device::Cpu);
    let ds = dataset();
    let tc = TrainConfig {
        batch_size: 4,
        epochs: 1,
        ..TrainConfig::default()
    };
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        // Another thread keeps capturing training steps (each new trainer captures anew).
        let capturing = s.spawn(|| {
            let dev = with_own_stream(&gpu).unwrap();
            let mut captured = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || captured == 0 {
                let mut t = Trainer::new(&small_config(), &tc, &ds, &ds, &dev, DType::F32, None)
                    .unwrap()
                    .with_graphs(Graphs::On);
                t.train_epoch(|_, _| {}).unwrap();
                captured += 1;
            }
            captured
        });
        for _ in 0..30 {
            assert_eq!(values(&with_own_stream(&gpu).unwrap()), want);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(capturing.join().unwrap() > 0);
    });
}

/// `mlff distill`'s committee on one GPU: trainers on threads of their own, each with its own
/// stream, capturing and replaying their step graphs side by side, train as each does alone
/// (f64; only the order of atomic sums may differ).
#[test]
fn trainers_side_by_side_on_one_gpu_train_as_alone() {
    let ds = dataset();
    let run = |seed: u64| {
        let tc = TrainConfig {
            batch_size: 4,
            epochs: 3,
            seed,
            ..TrainConfig::default()
        };
        let dev = cuda();
        let mut t = Trainer::new(&small_config(), &tc, &ds, &ds, &dev, DType::F64, None)
            .unwrap()
            .with_graphs(Graphs::On);
        let mut losses = Vec::new();
        for _ in 0..3 {
            t.train_epoch(|_, loss| losses.push(loss)).unwrap();
        }
        let weights: Vec<Vec<f64>> = t
            .optimizer()
            .vars()
            .iter()
            .map(|(_, v)| {
                let w = v.as_tensor().flatten_all().unwrap();
                w.to_device(&Device::Cpu).unwrap().to_vec1::<f64>().unwrap()
            })
            .collect();
        (losses, weights)
    };
    let seeds = [0u64, 1, 2];
    let alone: Vec<_> = seeds.iter().map(|&s| run(s)).collect();
    let together: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = seeds.iter().map(|&s| scope.spawn(move || run(s))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_ne!(
        alone[0].0, alone[1].0,
        "seeds must give different trainings"
    );
    for (k, ((la, wa), (lt, wt))) in alone.iter().zip(&together).enumerate() {
        assert_eq!(la.len(), 9);
        for (a, b) in la.iter().zip(lt) {
            assert!(
                (a - b).abs() <= 1e-9 * a.abs(),
                "trainer {k}: loss {a} vs {b}"
            );
        }
        let worst = wa
            .iter()
            .flatten()
            .zip(wt.iter().flatten())
            .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst <= 1e-9, "trainer {k}: weights differ by {worst}");
    }
}
