//! The frames held on the device (`resident`) give, gathered by `ops::gather_frames`, the
//! batch the host assembles (`Trainer::step_inputs`), bit for bit. A module of its own: it
//! reads the trainer, which holds the frames' place (a test inside `resident` would make the
//! two import each other).

use super::fused_step::tests::small_config;
use super::labels::Norms;
use super::resident::FrameStore;
use super::step_graph::StepPadding;
use super::trainer::Trainer;
use crate::structure::Structure;
use crate::train::{Dataset, TrainConfig};
use candle_core::Device;
use candle_core::{DType, Tensor};

/// Molecules, periodic water boxes (edges to images) and a lone atom (no edges),
/// labelled arbitrarily.
fn dataset() -> Dataset {
    let mut frames = vec![
        crate::systems::aspirin(),
        crate::systems::water_box(4, 1),
        Structure::molecule(vec![1], vec![[0.0; 3]]),
        crate::systems::water_box(5, 2),
    ];
    frames.push(frames[0].clone());
    frames[4].positions[3][1] += 0.2;
    for (k, s) in frames.iter_mut().enumerate() {
        s.energy = Some(-10.0 * k as f64 - 0.5);
        let n = s.len();
        s.forces = Some((0..n).map(|i| [0.1 * i as f64, -0.3, k as f64]).collect());
    }
    Dataset::from_frames(std::path::Path::new("mem"), frames).unwrap()
}

fn bits(t: &Tensor) -> Vec<u64> {
    match t.dtype() {
        DType::U32 => t
            .to_vec1::<u32>()
            .unwrap()
            .into_iter()
            .map(u64::from)
            .collect(),
        DType::F32 => (t.flatten_all().unwrap().to_vec1::<f32>().unwrap())
            .into_iter()
            .map(|x| u64::from(x.to_bits()))
            .collect(),
        _ => (t.flatten_all().unwrap().to_vec1::<f64>().unwrap())
            .into_iter()
            .map(f64::to_bits)
            .collect(),
    }
}

/// A batch gathered from the frames held on the device is, bit for bit, the batch the host
/// assembles and uploads: every input and label, padding included.
#[test]
fn gathered_batches_are_the_uploaded_ones() {
    let cfg = small_config();
    let ds = dataset();
    let dev = Device::Cpu;
    for dtype in [DType::F64, DType::F32] {
        let t = Trainer::new(&cfg, &TrainConfig::default(), &ds, &ds, &dev, dtype, None).unwrap();
        let frames = t.train.iter().map(|f| (&f.structure, &f.edges));
        let store = FrameStore::new(frames, &cfg, &dev).unwrap();
        let step = t.opt.next_step(1e-3, 10.0, 0.9);
        let values = step.values(dtype, &dev).unwrap();
        for idx in [vec![0, 2], vec![3, 1, 4, 2], vec![2], vec![1], vec![4, 0]] {
            let (batch, nl) = Trainer::batch(&t.train, &idx).unwrap();
            let norms = Norms {
                structures: idx.len() + 3,
                atoms: batch.n_atoms() + 11,
            };
            let padded = StepPadding {
                atoms: batch.n_atoms() + 7,
                structures: idx.len() + 2,
                capacity: nl.len() + 40,
            };
            let host = t.step_inputs(&batch, &nl, padded, norms, &step).unwrap();
            let table = store.table(&idx, padded, norms, &dev).unwrap();
            let got = store.gather(&table, padded, dtype, &values).unwrap();
            let (a, b) = (&host.x, &got.x);
            assert_eq!(a.n_structures, b.n_structures);
            if idx == [1] {
                let real = a.offsets.narrow(0, 0, nl.len()).unwrap();
                let far = real.abs().unwrap().max_all().unwrap();
                let far = far
                    .to_dtype(DType::F64)
                    .unwrap()
                    .to_scalar::<f64>()
                    .unwrap();
                assert!(far > 1.0, "a box's edges reach images: {far}");
            }
            for (name, x, y) in [
                ("species", &a.species, &b.species),
                ("positions", &a.positions, &b.positions),
                ("centers", &a.centers, &b.centers),
                ("neighbors", &a.neighbors, &b.neighbors),
                ("offsets", &a.offsets, &b.offsets),
                ("structure", &a.atom_structure, &b.atom_structure),
                ("labels", &host.labels, &got.labels),
            ] {
                assert_eq!(x.dtype(), y.dtype(), "{name}");
                assert_eq!(x.dims(), y.dims(), "{name}");
                assert_eq!(bits(x), bits(y), "{dtype:?} {idx:?}: {name}");
            }
            // A shape too small for the batch, or a frame that is not there, is refused.
            let tight = StepPadding {
                capacity: nl.len() - usize::from(!nl.is_empty()),
                ..padded
            };
            assert_eq!(
                store.table(&idx, tight, norms, &dev).is_err(),
                !nl.is_empty()
            );
            let few = StepPadding {
                structures: idx.len(),
                ..padded
            };
            assert!(store.table(&idx, few, norms, &dev).is_err());
            assert!(store.table(&[5], padded, norms, &dev).is_err());
        }
    }
}
