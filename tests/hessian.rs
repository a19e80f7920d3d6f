//! Hessian-informed training: the student's Hessian-vector products by central differences
//! of its fused forces equal autograd's (f64), the loss term and its gradients, the
//! validation metric, and the labels' checks.

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use mlff_distiller::model::PainnConfig;
use mlff_distiller::train::{
    hessian_vector_products, Dataset, ForceGradient, TrainConfig, Trainer,
};
use mlff_distiller::{Batch, PainnCalculator, Structure};
use std::path::Path;

fn tiny_config() -> PainnConfig {
    PainnConfig {
        cutoff: 3.5,
        ..small_config()
    }
}

/// H·v by autograd: the gradient of (∇E · v) with respect to the positions.
fn autograd_hvp(calc: &PainnCalculator, s: &Structure, v: &[[f64; 3]]) -> Vec<[f64; 3]> {
    let batch = Batch::from_one(s.clone()).unwrap();
    let (inputs, x) = calc.prepare(&batch).unwrap();
    let e = calc.model().energies(&inputs).unwrap().sum_all().unwrap();
    let g = e.backward().unwrap().get(x.as_tensor()).unwrap().clone();
    let flat: Vec<f64> = v.iter().flatten().copied().collect();
    let v = Tensor::from_vec(flat, (s.len(), 3), &Device::Cpu).unwrap();
    let gv = (g * v).unwrap().sum_all().unwrap();
    let hv = gv.backward().unwrap().get(x.as_tensor()).unwrap().clone();
    hv.to_vec2::<f64>()
        .unwrap()
        .into_iter()
        .map(|r| [r[0], r[1], r[2]])
        .collect()
}

#[test]
fn students_hessian_vector_products_equal_autograds() {
    second_order();
    let calc = PainnCalculator::new(
        model(&tiny_config(), 7, DType::F64, &Device::Cpu),
        Device::Cpu,
        DType::F64,
    );
    let frames: Vec<Structure> = (0..3)
        .map(|k| random_molecule(5 + k, 40 + k as u64))
        .collect();
    let dirs: Vec<_> = frames
        .iter()
        .enumerate()
        .map(|(k, s)| direction(s.len(), k as u64))
        .collect();
    let fd = hessian_vector_products(&calc, &frames, &dirs, 1e-5).unwrap();
    for (k, s) in frames.iter().enumerate() {
        let exact = autograd_hvp(&calc, s, &dirs[k]);
        let scale = exact.iter().flatten().map(|x| x.abs()).fold(0.0, f64::max);
        assert!(scale > 1e-2, "frame {k}: H·v {scale} too small to test");
        for (a, b) in fd[k].iter().flatten().zip(exact.iter().flatten()) {
            assert!(
                (a - b).abs() < 1e-6 * scale,
                "frame {k}: fd {a} vs autograd {b}"
            );
        }
    }
}

/// Molecules labelled by the random teacher, with its H·v along a seeded direction; every
/// third frame without.
fn teacher_frames(n: usize) -> Vec<Structure> {
    let frames: Vec<Structure> = (0..n)
        .map(|k| {
            let mut s = random_molecule(4 + k % 3, 300 + k as u64);
            s.info.push(("trajectory".into(), format!("t{k}")));
            s
        })
        .collect();
    let mut frames = hvp_labelled(&tiny_config(), frames);
    for s in frames.iter_mut().skip(2).step_by(3) {
        s.arrays.retain(|a| !a.name.starts_with("hvp"));
    }
    frames
}

fn dataset(frames: Vec<Structure>) -> Dataset {
    Dataset::from_frames(Path::new("test.extxyz"), frames).unwrap()
}

fn config(w: f64) -> TrainConfig {
    TrainConfig {
        epochs: 2,
        batch_size: 4,
        warmup_steps: 0,
        energy_weight: 1.0,
        force_weight: 10.0,
        hessian_weight: w,
        force_gradient: ForceGradient::Auto,
        ..TrainConfig::default()
    }
}

/// The loss gains exactly w_H · mean((H·v − Ĥ·v)²) over the labelled frames' components (the
/// student's H·v from its fused forces), validation reports and counts it, and its gradient
/// (through the forces at x ± h·v) matches finite differences.
#[test]
fn hessian_loss_and_its_gradients() {
    second_order();
    let train = dataset(teacher_frames(6));
    let trainer = |w: f64| {
        Trainer::new(
            &tiny_config(),
            &config(w),
            &train,
            &train,
            &Device::Cpu,
            DType::F64,
            None,
        )
        .unwrap()
    };
    let (with, without) = (trainer(0.5), trainer(0.0));
    assert_eq!(
        with.cfg.gradient_mode(&Device::Cpu),
        ForceGradient::DoubleBackward
    );
    let idx: Vec<usize> = (0..6).collect();
    let (l1, _) = with.loss_and_grads(&idx).unwrap();
    let (l0, _) = without.loss_and_grads(&idx).unwrap();
    let student = PainnCalculator::new(with.ema_model().unwrap(), Device::Cpu, DType::F64);
    let (mut sq, mut n) = (0.0, 0);
    for s in &train.frames {
        if let Some((v, label)) = mlff_distiller::train::hvp_label(s).unwrap() {
            let h = with.cfg.hessian_step;
            let hv = hessian_vector_products(&student, std::slice::from_ref(s), &[v], h).unwrap();
            for (a, b) in hv[0].iter().flatten().zip(label.iter().flatten()) {
                sq += (a - b) * (a - b);
                n += 1;
            }
        }
    }
    assert_eq!(n, 3 * (4 + 5 + 4 + 5), "frames 0, 1, 3, 4 are labelled");
    let term = 0.5 * sq / n as f64;
    assert!(term > 1e-3 * l0, "the H·v term {term} is too small to test");
    assert!(
        ((l1 - l0) - term).abs() < 1e-8 * l1,
        "loss {l1} - {l0} vs the H·v term {term}"
    );
    let v = with.validate().unwrap();
    let v0 = without.validate().unwrap();
    assert!(v.hvp_mae.is_some() && v0.hvp_mae.is_none());
    assert!(
        ((v.loss - v0.loss) - term).abs() < 1e-8 * v.loss,
        "validation counts it"
    );

    let probes = [
        ("filter.weight", 3, 2),
        ("blocks.1.update.mix.weight", 5, 2),
    ];
    assert_gradients_match_differences(&with, &idx, &probes, "H·v term:");
}

#[test]
fn bad_hessian_labels_and_settings_are_refused_by_name() {
    let good = teacher_frames(3);
    let mut lone = good.clone();
    lone[1].arrays.retain(|a| a.name != "hvp_direction");
    let mut long = good.clone();
    for a in &mut long[0].arrays {
        if a.name == "hvp_direction" {
            a.values = a
                .values
                .iter()
                .map(|t| format!("{}", 2.0 * t.parse::<f64>().unwrap()))
                .collect();
        }
    }
    for (frames, frame, want) in [(lone, 1, "one of them is missing"), (long, 0, "not 1")] {
        let err = Dataset::from_frames(Path::new("h.extxyz"), frames)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("h.extxyz") && err.contains(&format!("frame {frame}")),
            "{err}"
        );
        assert!(err.contains(want), "{err}");
    }
    let fused = TrainConfig {
        force_gradient: ForceGradient::Fused,
        ..config(1.0)
    };
    let err = fused.validate().unwrap_err().to_string();
    assert!(
        err.contains("hessian_weight needs force_gradient double-backward"),
        "{err}"
    );
    let zero_step = TrainConfig {
        hessian_step: 0.0,
        ..config(1.0)
    };
    assert!(zero_step
        .validate()
        .unwrap_err()
        .to_string()
        .contains("hessian_step"));
}

#[test]
fn train_fits_hessian_labels_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("h.extxyz");
    mlff_distiller::io::write_extxyz(&data, &teacher_frames(6)).unwrap();
    let config = config_file(
        dir.path(),
        r#"{"hidden": 8, "n_blocks": 2, "n_rbf": 6, "cutoff": 3.5, "elements": [1, 6, 7, 8]}"#,
    );
    let out = dir.path().join("run");
    let args = |extra: &[&str]| {
        let mut a = vec![
            "train",
            "--train",
            data.to_str().unwrap(),
            "--val",
            data.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
            "--epochs",
            "2",
            "--device",
            "cpu",
            "--hessian-weight",
            "0.5",
            "--out",
            out.to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        mlff(&a)
    };
    let o = args(&["--force-gradient", "fused"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("hessian_weight needs force_gradient double-backward"),
        "{err}"
    );
    let o = args(&[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let log = std::fs::read_to_string(out.join("log.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert!(last["val_hvp_mae"].as_f64().unwrap() > 0.0, "{last}");
}
