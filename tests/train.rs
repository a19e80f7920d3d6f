//! Training: fitted statistics, loss decreases, second-order force-loss gradients against
//! finite differences, resume = uninterrupted, splits by trajectory, bad data.

mod common;

use candle_core::{DType, Device};
use common::*;
use mlff_distiller::model::PainnConfig;
use mlff_distiller::train::{
    fit_reference_energies, split_by_trajectory, Dataset, ForceGradient, Schedule, TrainConfig,
    Trainer,
};
use mlff_distiller::{Error, Structure};
use std::path::Path;

fn tiny_config() -> PainnConfig {
    PainnConfig {
        hidden: 8,
        n_blocks: 2,
        n_rbf: 6,
        cutoff: 3.5,
        elements: vec![1, 6, 8],
    }
}

/// Frames labelled by a random "teacher" PaiNN (seed 99) of the same architecture.
fn teacher_data(n: usize, seed: u64) -> Vec<Structure> {
    let frames: Vec<Structure> = (0..n)
        .map(|k| {
            let mut s = random_molecule(4 + k % 4, seed * 1000 + k as u64);
            for z in &mut s.numbers {
                if *z == 7 {
                    *z = 6;
                }
            }
            s.info.push(("trajectory".into(), format!("t{}", k % 4)));
            s
        })
        .collect();
    labelled(&tiny_config(), frames)
}

fn dataset(frames: Vec<Structure>) -> Dataset {
    Dataset::from_frames(Path::new("test.extxyz"), frames).unwrap()
}

fn train_config() -> TrainConfig {
    TrainConfig {
        epochs: 30,
        batch_size: 4,
        lr: 5e-3,
        lr_min: 1e-4,
        warmup_steps: 5,
        schedule: Schedule::Cosine,
        ema_decay: 0.9,
        force_weight: 10.0,
        ..TrainConfig::default()
    }
}

/// A trainer of the tiny model on `frames` (also its validation set) with these loss weights
/// and force gradient.
fn trainer(frames: &Dataset, mode: ForceGradient, weights: (f64, f64), dtype: DType) -> Trainer {
    let cfg = TrainConfig {
        energy_weight: weights.0,
        force_weight: weights.1,
        force_gradient: mode,
        ..train_config()
    };
    tiny_trainer(&cfg, frames, frames, dtype)
}

/// A trainer of the tiny model on the CPU.
fn tiny_trainer(cfg: &TrainConfig, train: &Dataset, val: &Dataset, dtype: DType) -> Trainer {
    Trainer::new(&tiny_config(), cfg, train, val, &Device::Cpu, dtype, None).unwrap()
}

#[test]
fn reference_energies_recover_known_values() {
    let elements = [1u8, 6, 7, 8];
    let truth = [-13.6, -1029.8, -1484.2, -2041.5];
    let frames: Vec<Structure> = (0..12)
        .map(|k| {
            let s = random_molecule(3 + k % 9, k as u64);
            let e: f64 = s
                .numbers
                .iter()
                .map(|z| truth[elements.iter().position(|x| x == z).unwrap()])
                .sum();
            Structure {
                energy: Some(e),
                ..s
            }
        })
        .collect();
    let fit = fit_reference_energies(&frames, &elements);
    for (f, t) in fit.iter().zip(truth) {
        assert!((f - t).abs() < 1e-6, "fitted {fit:?} vs {truth:?}");
    }
    // One composition only (like rMD17): underdetermined, but the fit still reproduces the
    // mean energy and stays finite.
    let same: Vec<Structure> = (0..5)
        .map(|k| Structure {
            energy: Some(-100.0 - k as f64),
            ..frames[0].clone()
        })
        .collect();
    let fit = fit_reference_energies(&same, &elements);
    let counts = mlff_distiller::train::composition(&same[0], &elements);
    let e: f64 = counts.iter().zip(&fit).map(|(c, e)| c * e).sum();
    assert!(
        fit.iter().all(|x| x.is_finite()) && (e + 102.0).abs() < 1e-6,
        "{fit:?}: {e}"
    );
}

/// Both force gradients train: 30 epochs halve the validation loss.
#[test]
fn training_lowers_the_validation_loss() {
    second_order();
    let train = dataset(teacher_data(24, 1));
    let val = dataset(teacher_data(8, 2));
    for mode in [
        ForceGradient::DoubleBackward,
        ForceGradient::Directional,
        ForceGradient::Fused,
    ] {
        let cfg = TrainConfig {
            force_gradient: mode,
            ..train_config()
        };
        let mut t = tiny_trainer(&cfg, &train, &val, DType::F32);
        let before = t.validate().unwrap();
        for _ in 0..30 {
            t.train_epoch(|_, _| {}).unwrap();
        }
        let after = t.validate().unwrap();
        assert!(
            after.loss < 0.5 * before.loss && after.force_mae < 0.8 * before.force_mae,
            "{mode:?}: validation loss {} -> {}, force MAE {} -> {}",
            before.loss,
            after.loss,
            before.force_mae,
            after.force_mae
        );
    }
}

/// d(loss)/d(parameter) from the double backward equals a central finite difference, for the
/// force term alone (purely second order) and for energy + forces.
#[test]
fn force_loss_gradients_match_finite_differences() {
    second_order();
    let train = dataset(teacher_data(6, 3));
    let modes = [
        ForceGradient::DoubleBackward,
        ForceGradient::Directional,
        ForceGradient::Fused,
    ];
    for (mode, (ew, fw)) in modes
        .into_iter()
        .flat_map(|m| [(m, (0.0, 1.0)), (m, (1.0, 10.0))])
    {
        let t = trainer(&train, mode, (ew, fw), DType::F64);
        let idx = [0usize, 2, 5];
        let probes = [
            ("filter.weight", 3, 2),
            ("blocks.0.message.context1.weight", 1, 4),
            ("blocks.1.update.mix.weight", 5, 2),
            ("blocks.1.update.context2.bias", 0, 7),
            ("embedding.weight", 1, 3),
        ];
        let label = format!("{mode:?} w_E={ew} w_F={fw}");
        assert_gradients_match_differences(&t, &idx, &probes, &label);
    }
}

/// The loss of frames `idx` and the gradient of every weight, flattened, by name.
fn loss_and_flat_grads(t: &Trainer, idx: &[usize]) -> (f64, Vec<(String, Vec<f64>)>) {
    let (loss, g) = t.loss_and_grads(idx).unwrap();
    let flat = (t.optimizer().vars().iter())
        .map(|(name, var)| {
            let v = g.get(var.as_tensor()).unwrap();
            let v = v.to_dtype(DType::F64).unwrap().flatten_all().unwrap();
            (name.clone(), v.to_vec1::<f64>().unwrap())
        })
        .collect();
    (loss, flat)
}

/// The directional force gradient (one first-order pass over x ± h·u, through autograd or the
/// fused kernels) equals the double backward's gradient for every weight: to 1e-7 of the
/// largest in f64, and to the f32 level that training sees; with and without forces.
#[test]
fn directional_force_gradient_equals_double_backward() {
    second_order();
    let train = dataset(teacher_data(6, 5));
    let cases = [
        (DType::F64, 1e-7, ForceGradient::Directional, 10.0),
        (DType::F32, 2e-3, ForceGradient::Directional, 10.0),
        (DType::F64, 1e-7, ForceGradient::Fused, 10.0),
        (DType::F32, 2e-3, ForceGradient::Fused, 10.0),
        (DType::F64, 1e-10, ForceGradient::Fused, 0.0),
    ];
    for (dtype, tol, mode, force_weight) in cases {
        let grads = |mode| {
            loss_and_flat_grads(
                &trainer(&train, mode, (1.0, force_weight), dtype),
                &[0, 1, 3, 4],
            )
        };
        let (loss_exact, exact) = grads(ForceGradient::DoubleBackward);
        let (loss_dir, directional) = grads(mode);
        assert!(
            (loss_exact - loss_dir).abs() <= 1e-5 * loss_exact,
            "{dtype:?} {mode:?}: loss {loss_exact} vs {loss_dir}"
        );
        let largest = exact
            .iter()
            .flat_map(|(_, g)| g.iter().map(|x| x.abs()))
            .fold(0.0, f64::max);
        assert!(largest > 0.0);
        for ((name, a), (_, b)) in exact.iter().zip(&directional) {
            for (k, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(
                    (x - y).abs() <= tol * largest,
                    "{dtype:?} {mode:?} w_F {force_weight} {name}[{k}]: double backward {x} vs \
                     {y} (largest {largest})"
                );
            }
        }
    }
}

/// Validation (fused inference, host sums) reports the same loss that training minimises, for
/// the same frames and weights (before any step the EMA weights are the weights).
#[test]
fn validation_loss_is_the_training_loss() {
    second_order();
    let frames = dataset(teacher_data(6, 7));
    for mode in [
        ForceGradient::DoubleBackward,
        ForceGradient::Directional,
        ForceGradient::Fused,
    ] {
        let t = trainer(&frames, mode, (3.0, 10.0), DType::F64);
        let (train_loss, _) = t.loss_and_grads(&[0, 1, 2, 3, 4, 5]).unwrap();
        let val = t.validate().unwrap();
        assert!(
            (train_loss - val.loss).abs() <= 1e-10 * train_loss,
            "{mode:?}: training loss {train_loss} vs validation loss {}",
            val.loss
        );
    }
}

#[test]
fn resume_continues_exactly() {
    second_order();
    let train = dataset(teacher_data(12, 4));
    let val = dataset(teacher_data(4, 5));
    let cfg = TrainConfig {
        epochs: 3,
        ..train_config()
    };
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.safetensors");
    for mode in [
        ForceGradient::DoubleBackward,
        ForceGradient::Directional,
        ForceGradient::Fused,
    ] {
        let cfg = TrainConfig {
            force_gradient: mode,
            ..cfg.clone()
        };
        let make = || tiny_trainer(&cfg, &train, &val, DType::F32);
        let mut straight = make();
        for _ in 0..3 {
            straight.train_epoch(|_, _| {}).unwrap();
        }
        let mut first = make();
        first.train_epoch(|_, _| {}).unwrap();
        first.save_state(&state).unwrap();
        drop(first);
        let mut resumed = make();
        resumed.load_state(&state).unwrap();
        assert_eq!(resumed.epoch, 1);
        for _ in 1..3 {
            resumed.train_epoch(|_, _| {}).unwrap();
        }
        assert_eq!(resumed.step(), straight.step());
        for ((n, a), (_, b)) in straight
            .optimizer()
            .vars()
            .iter()
            .zip(resumed.optimizer().vars())
        {
            assert_eq!(
                max_abs_diff(a.as_tensor(), b.as_tensor()),
                0.0,
                "{mode:?}: {n} differs after resume"
            );
        }
        // The EMA weights (what validation and checkpoints use) too.
        let (a, b) = (straight.validate().unwrap(), resumed.validate().unwrap());
        assert_eq!(a.loss, b.loss, "{mode:?}: EMA differs after resume");
    }
    // A state from other settings is refused with a reason.
    let other = TrainConfig {
        lr: 1e-2,
        ..cfg.clone()
    };
    let mut t = Trainer::new(
        &tiny_config(),
        &other,
        &train,
        &val,
        &Device::Cpu,
        DType::F32,
        None,
    )
    .unwrap();
    let err = t.load_state(&state).unwrap_err().to_string();
    assert!(err.contains("lr 0.005 there, 0.01 now"), "{err}");
}

#[test]
fn split_is_by_trajectory() {
    let ds = dataset(teacher_data(20, 6));
    let (train, val) = split_by_trajectory(&ds, 0.25, 7).unwrap();
    assert_eq!(train.frames.len() + val.frames.len(), 20);
    let traj = |s: &Structure| {
        s.info
            .iter()
            .find(|(k, _)| k == "trajectory")
            .unwrap()
            .1
            .clone()
    };
    for v in &val.frames {
        assert!(
            train.frames.iter().all(|t| traj(t) != traj(v)),
            "trajectory {} on both sides",
            traj(v)
        );
    }
    let mut no_traj = teacher_data(4, 8);
    no_traj[2].info.clear();
    let err = split_by_trajectory(&dataset(no_traj), 0.25, 7)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("frame 2") && err.contains("trajectory"),
        "{err}"
    );
}

#[test]
fn bad_data_is_named() {
    let good = teacher_data(3, 9);
    let check = |frames: Vec<Structure>, want: &[&str]| {
        let err = match Dataset::from_frames(Path::new("d.extxyz"), frames) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted bad data"),
        };
        for w in want {
            assert!(err.contains(w), "`{err}` lacks `{w}`");
        }
    };
    let mut f = good.clone();
    f[1].forces = None;
    check(f, &["d.extxyz", "frame 1", "forces"]);
    let mut f = good.clone();
    f[2].energy = Some(f64::NAN);
    check(f, &["frame 2", "energy label is NaN"]);
    let mut f = good.clone();
    f[0].forces.as_mut().unwrap()[1][2] = f64::INFINITY;
    check(f, &["frame 0", "atom 1", "non-finite force"]);
    let mut f = good.clone();
    f[1].forces.as_mut().unwrap().pop();
    check(f, &["frame 1", "force rows"]);
    // Stress labels: unreadable, or on a molecule.
    let mut f = good.clone();
    f[1].info.push(("stress".into(), "1 2 x".into()));
    check(f, &["frame 1", "stress"]);
    let mut f = good.clone();
    f[0].info
        .push(("stress".into(), "0 0 0 0 0 0 0 0 0".into()));
    check(f, &["frame 0", "without a cell periodic"]);
    // An element the model does not know.
    let mut f = good.clone();
    f[2].numbers[0] = 16;
    let ds = Dataset::from_frames(Path::new("d.extxyz"), f).unwrap();
    let err = ds.check_elements(&tiny_config()).unwrap_err();
    assert!(matches!(err, Error::Data { frame: 2, .. }), "{err}");
    assert!(err.to_string().contains("atom 0 is element Z=16"), "{err}");
}

#[test]
fn several_files_are_one_dataset_and_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.extxyz"), dir.path().join("b.extxyz"));
    let frames = teacher_data(8, 11);
    mlff_distiller::io::write_extxyz(&a, &frames[..3]).unwrap();
    let mut second = frames[3..].to_vec();
    second[1].numbers[0] = 16; // Z=16 is not among the model's elements
    mlff_distiller::io::write_extxyz(&b, &second).unwrap();
    let ds = Dataset::load_all(&[a.clone(), b.clone()]).unwrap();
    assert_eq!(ds.frames.len(), 8);
    let files: Vec<_> = ds.sources.iter().map(|s| (&s.path, s.frames)).collect();
    assert_eq!(files, [(&a, 3), (&b, 5)]);
    assert!(ds.sources.iter().all(|s| s.sha256.len() == 64));
    // Frame 4 of the set is frame 1 of b.extxyz, also after a split reorders the frames.
    for part in [ds.select(&[4]), ds.select(&[7, 4, 0])] {
        match part.check_elements(&tiny_config()).unwrap_err() {
            Error::Data { path, frame, .. } => assert_eq!((path, frame), (b.clone(), 1)),
            e => panic!("{e}"),
        }
    }
    // A bad label in the second file is reported with that file's own frame index.
    second[1].numbers[0] = 6;
    second[2].forces = None;
    mlff_distiller::io::write_extxyz(&b, &second).unwrap();
    let err = Dataset::load_all(&[a, b]).unwrap_err().to_string();
    assert!(err.contains("b.extxyz") && err.contains("frame 2"), "{err}");
}

/// Settings that would train nothing are refused before any output: 0 epochs (the CLI used to
/// print "done" naming checkpoints it never wrote), and the other bad settings name theirs.
#[test]
fn settings_that_train_nothing_are_refused() {
    let refused = |cfg: TrainConfig, what: &str| {
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains(what), "{err}");
    };
    refused(
        TrainConfig {
            epochs: 0,
            ..train_config()
        },
        "epochs",
    );
    refused(
        TrainConfig {
            batch_size: 0,
            ..train_config()
        },
        "batch_size",
    );
    // The strain that carries the stress term is scaled by the force term.
    refused(
        TrainConfig {
            stress_weight: 1.0,
            force_weight: 0.0,
            energy_weight: 1.0,
            force_gradient: ForceGradient::Fused,
            ..train_config()
        },
        "stress_weight needs force_gradient double-backward",
    );
    assert!(train_config().validate().is_ok());
}

/// A short training with the fused weight gradients reaches the validation errors of the
/// exact double backward from the same seeds: their difference, averaged over three seeds, is
/// within the spread that the seed alone gives the exact runs (in f32).
#[test]
fn fused_and_autograd_training_reach_the_same_errors() {
    second_order();
    let train = dataset(teacher_data(24, 11));
    let val = dataset(teacher_data(8, 12));
    let run = |mode, seed| {
        let cfg = TrainConfig {
            force_gradient: mode,
            seed,
            ..train_config()
        };
        let mut t = tiny_trainer(&cfg, &train, &val, DType::F32);
        for _ in 0..30 {
            t.train_epoch(|_, _| {}).unwrap();
        }
        let v = t.validate().unwrap();
        [v.loss, v.force_mae, v.energy_mae]
    };
    let seeds = [1u64, 2, 3];
    let exact: Vec<[f64; 3]> = seeds
        .iter()
        .map(|&s| run(ForceGradient::DoubleBackward, s))
        .collect();
    let fused: Vec<[f64; 3]> = seeds
        .iter()
        .map(|&s| run(ForceGradient::Fused, s))
        .collect();
    for (k, what) in ["loss", "force MAE", "energy MAE"].iter().enumerate() {
        let mean = |runs: &[[f64; 3]]| runs.iter().map(|r| r[k]).sum::<f64>() / 3.0;
        let spread = exact.iter().map(|r| r[k]).fold(f64::MIN, f64::max)
            - exact.iter().map(|r| r[k]).fold(f64::MAX, f64::min);
        let (a, b) = (mean(&fused), mean(&exact));
        eprintln!("{what}: fused {a}, double backward {b}, spread over seeds {spread}");
        assert!(
            (a - b).abs() <= spread,
            "{what}: fused {a} vs double backward {b}; the seeds spread {spread}"
        );
    }
}

/// `--graphs on` where steps cannot replay (the CPU) is an error naming why; auto runs op by op.
#[test]
fn graphs_on_the_cpu_are_refused_and_auto_runs_without() {
    use mlff_distiller::graph::Graphs;
    let frames = dataset(teacher_data(4, 13));
    let cfg = TrainConfig {
        force_gradient: ForceGradient::Fused,
        ..train_config()
    };
    let mut on = tiny_trainer(&cfg, &frames, &frames, DType::F32).with_graphs(Graphs::On);
    let err = on.train_epoch(|_, _| {}).unwrap_err().to_string();
    assert!(err.contains("--graphs on") && err.contains("CUDA"), "{err}");
    let mut auto = tiny_trainer(&cfg, &frames, &frames, DType::F32).with_graphs(Graphs::Auto);
    assert!(auto.train_epoch(|_, _| {}).unwrap().is_finite());
}

/// Periodic boxes labelled by the random teacher (energy, forces, and its stress as the
/// `stress` info key); every third frame has no stress label.
fn teacher_boxes(n: usize, seed: u64) -> Vec<Structure> {
    let frames: Vec<Structure> = (0..n)
        .map(|k| {
            let mut s = random_box(6 + k % 3, 0.2 * (k % 2) as f64, seed * 100 + k as u64);
            s.info.push(("trajectory".into(), format!("b{k}")));
            s
        })
        .collect();
    let mut frames = stress_labelled(&tiny_config(), frames);
    for s in frames.iter_mut().skip(2).step_by(3) {
        s.info.retain(|(k, _)| k != "stress");
    }
    frames
}

/// The stress term of the loss: its value is w_S · mean((σ − σ̂)²) over the labelled frames'
/// components (σ from the student's strain derivative), the validation loss counts it the same
/// way, and its gradient (a double backward through the strain) matches finite differences.
#[test]
fn stress_loss_and_its_gradients() {
    second_order();
    let train = dataset(teacher_boxes(6, 5));
    let cfg = |w: f64| TrainConfig {
        energy_weight: 1.0,
        force_weight: 10.0,
        stress_weight: w,
        force_gradient: ForceGradient::Auto,
        ..train_config()
    };
    let with = tiny_trainer(&cfg(1e4), &train, &train, DType::F64);
    let without = tiny_trainer(&cfg(0.0), &train, &train, DType::F64);
    // What `auto` takes with a stress term: the fused gradient over strained copies.
    assert_eq!(with.cfg.gradient_mode(&Device::Cpu), ForceGradient::Fused);
    let idx = [0usize, 1, 2, 3, 4, 5];
    let (l1, _) = with.loss_and_grads(&idx).unwrap();
    let (l0, _) = without.loss_and_grads(&idx).unwrap();
    // The student's stress by its own calculator, against the labels.
    let student =
        mlff_distiller::PainnCalculator::new(with.ema_model().unwrap(), Device::Cpu, DType::F64);
    let frames: Vec<Structure> = idx.iter().map(|&k| train.frames[k].clone()).collect();
    let pred = student
        .compute_with_stress(&mlff_distiller::Batch::new(frames.clone()).unwrap())
        .unwrap();
    let (mut sq, mut n) = (0.0, 0);
    for (s, p) in frames.iter().zip(&pred.stresses) {
        if let Some(label) = mlff_distiller::eval::stress_label(s).unwrap() {
            for (a, b) in p.unwrap().iter().flatten().zip(label.iter().flatten()) {
                sq += (a - b) * (a - b);
                n += 1;
            }
        }
    }
    assert_eq!(n, 9 * 4, "four of the six frames are labelled");
    let term = 1e4 * sq / n as f64;
    assert!(
        term > 1e-3 * l0,
        "the stress term {term} is too small to test"
    );
    assert!(
        ((l1 - l0) - term).abs() < 1e-9 * l1,
        "loss {l1} - {l0} vs the stress term {term}"
    );
    let v = with.validate().unwrap();
    assert!(v.stress_mae.is_some());

    let probes = [
        ("filter.weight", 3, 2),
        ("blocks.1.update.mix.weight", 5, 2),
    ];
    assert_gradients_match_differences(&with, &idx, &probes, "stress term:");
}

/// The directional gradient with stress labels (the copies also strained along each labelled
/// structure's stress error) equals the double backward's for every weight, f64 and f32, on
/// boxes of which four in six carry stress, through autograd and through the fused kernels'
/// adjoint; its loss counts the stress term the same way. (The strain moves every atom,
/// farther than the force error's step alone: 1e-6 in f64. Without the strain the difference
/// is of the gradient's own size.)
#[test]
fn directional_gradient_with_stress_equals_double_backward() {
    second_order();
    let train = dataset(teacher_boxes(6, 5));
    let idx = [0usize, 1, 2, 3, 4, 5];
    let cases = [ForceGradient::Directional, ForceGradient::Fused]
        .into_iter()
        .flat_map(|mode| [(mode, DType::F64, 1e-6), (mode, DType::F32, 3e-3)]);
    for (mode, dtype, tol) in cases {
        let grads = |mode| {
            let cfg = TrainConfig {
                energy_weight: 1.0,
                force_weight: 10.0,
                stress_weight: 1e4,
                force_gradient: mode,
                ..train_config()
            };
            loss_and_flat_grads(&tiny_trainer(&cfg, &train, &train, dtype), &idx)
        };
        let (loss_exact, exact) = grads(ForceGradient::DoubleBackward);
        let (loss_dir, directional) = grads(mode);
        assert!(
            (loss_exact - loss_dir).abs() <= 1e-5 * loss_exact,
            "{mode:?} {dtype:?}: loss {loss_exact} vs {loss_dir}"
        );
        let largest = (exact.iter())
            .flat_map(|(_, g)| g.iter().map(|x| x.abs()))
            .fold(0.0, f64::max);
        let worst = exact
            .iter()
            .zip(&directional)
            .flat_map(|((_, a), (_, b))| a.iter().zip(b).map(|(x, y)| (x - y).abs()))
            .fold(0.0, f64::max);
        assert!(
            worst <= tol * largest,
            "{mode:?} {dtype:?}: largest difference {worst} against the largest gradient \
             {largest}"
        );
    }
}

/// Data-parallel training over three CPU ranks (summing in host memory; on GPUs NCCL does,
/// tests/gpu) follows one-device training of the same batches: 23 frames of 4-7 atoms in
/// batches of 7 give shards of unequal atoms (3/2/2 structures) and a last batch smaller than
/// the ranks (1/1/0), and after 20 steps the weights agree to 1e-10 of their largest.
#[test]
fn three_ranks_train_as_one_device() {
    let data = dataset(teacher_data(23, 5));
    let cfg = TrainConfig {
        batch_size: 7,
        force_gradient: ForceGradient::Fused,
        ..train_config()
    };
    let mut one = tiny_trainer(&cfg, &data, &data, DType::F64);
    let mut three = tiny_trainer(&cfg, &data, &data, DType::F64)
        .with_replicas(vec![Device::Cpu, Device::Cpu])
        .unwrap();
    assert_eq!(three.ranks(), 3);
    for _ in 0..5 {
        let a = one.train_epoch(|_, _| {}).unwrap();
        let b = three.train_epoch(|_, _| {}).unwrap();
        assert!((a - b).abs() <= 1e-10 * a, "epoch loss {a} vs {b}");
    }
    assert_eq!(three.step(), 20);
    let weights = |t: &Trainer| -> Vec<f64> {
        let w = t.optimizer().flat_weights().unwrap();
        w.to_vec1::<f64>().unwrap()
    };
    let (a, b) = (weights(&one), weights(&three));
    let largest = a.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let worst = a
        .iter()
        .zip(&b)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    assert!(worst <= 1e-10 * largest, "{worst} of {largest}");
    let (va, vb) = (one.validate().unwrap(), three.validate().unwrap());
    assert!((va.loss - vb.loss).abs() <= 1e-10 * va.loss);
}

/// Data-parallel training refuses the force gradients it cannot split (they differentiate
/// each rank's loss by autograd, whose mean is not the batch's).
#[test]
fn several_ranks_need_the_fused_gradient() {
    let data = dataset(teacher_data(4, 6));
    for mode in [ForceGradient::Directional, ForceGradient::DoubleBackward] {
        let t = trainer(&data, mode, (1.0, 10.0), DType::F64);
        let e = t.with_replicas(vec![Device::Cpu]).err().unwrap();
        assert!(e.to_string().contains("--force-gradient fused"), "{e}");
    }
    // The fused gradient with a stress term strains its copies on the host, one rank's.
    let boxes = dataset(teacher_boxes(4, 5));
    let cfg = TrainConfig {
        stress_weight: 1.0,
        force_gradient: ForceGradient::Fused,
        ..train_config()
    };
    let t = tiny_trainer(&cfg, &boxes, &boxes, DType::F64);
    let e = t.with_replicas(vec![Device::Cpu]).err().unwrap();
    assert!(e.to_string().contains("no stress"), "{e}");
}

/// A data-parallel run saved after its second epoch and resumed (the other ranks start from
/// the state loaded into rank 0) ends where the uninterrupted run does, bit for bit.
#[test]
fn three_ranks_resume_where_they_stopped() {
    let data = dataset(teacher_data(23, 7));
    let cfg = TrainConfig {
        batch_size: 7,
        epochs: 3,
        force_gradient: ForceGradient::Fused,
        ..train_config()
    };
    let ranks = || vec![Device::Cpu, Device::Cpu];
    let start = || tiny_trainer(&cfg, &data, &data, DType::F64);
    let weights = |t: &Trainer| -> Vec<f64> {
        let w = t.optimizer().flat_weights().unwrap();
        w.to_vec1::<f64>().unwrap()
    };
    let mut whole = start().with_replicas(ranks()).unwrap();
    for _ in 0..3 {
        whole.train_epoch(|_, _| {}).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state.safetensors");
    let mut first = start().with_replicas(ranks()).unwrap();
    for _ in 0..2 {
        first.train_epoch(|_, _| {}).unwrap();
    }
    first.save_state(&state).unwrap();
    drop(first);
    let mut resumed = start();
    resumed.load_state(&state).unwrap();
    let mut resumed = resumed.with_replicas(ranks()).unwrap();
    resumed.train_epoch(|_, _| {}).unwrap();
    assert_eq!(resumed.step(), whole.step());
    assert_eq!(weights(&resumed), weights(&whole));
    let (a, b) = (whole.validate().unwrap(), resumed.validate().unwrap());
    assert_eq!(a.loss, b.loss);
}
