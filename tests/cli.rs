//! The `mlff` binary end to end: init-model, info, predict (output read back), check, errors.

mod common;

use common::{config_file, mlff, root};

#[test]
fn predict_shipped_model_on_shipped_frames() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pred.extxyz");
    let model = root().join("models/painn-gfn2.safetensors");
    let frames = root().join("data/aspirin_rmd17_10frames.extxyz");
    let o = mlff(&[
        "predict",
        model.to_str().unwrap(),
        frames.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--device",
        "cpu",
        "--batch-size",
        "4",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("energy MAE vs reference"), "{stdout}");
    let written = mlff_distiller::io::read_extxyz(&out).unwrap();
    let input = mlff_distiller::io::read_extxyz(&frames).unwrap();
    assert_eq!(written.len(), 10);
    // The same prediction through the library, in batches of a different size.
    let calc = mlff_distiller::PainnCalculator::from_checkpoint(
        &model,
        &candle_core::Device::Cpu,
        candle_core::DType::F32,
    )
    .unwrap();
    use mlff_distiller::Calculator;
    let pred = calc
        .compute(&mlff_distiller::Batch::new(input.clone()).unwrap())
        .unwrap();
    for (k, (w, i)) in written.iter().zip(&input).enumerate() {
        assert_eq!(w.positions, i.positions);
        assert!(
            (w.energy.unwrap() - pred.energies[k]).abs() < 1e-4,
            "frame {k}"
        );
        let ref_e = w
            .info
            .iter()
            .find(|(k, _)| k == "ref_energy")
            .unwrap()
            .1
            .parse::<f64>()
            .unwrap();
        assert_eq!(ref_e, i.energy.unwrap(), "input label kept as ref_energy");
        let f = w.forces.as_ref().unwrap();
        for (a, b) in f.iter().flatten().zip(pred.forces[k].iter().flatten()) {
            assert!((a - b).abs() < 1e-4);
        }
    }
}

#[test]
fn init_model_info_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config_file(
        dir.path(),
        r#"{"hidden": 8, "n_blocks": 1, "n_rbf": 4, "cutoff": 3.0, "elements": [1, 8]}"#,
    );
    let model = dir.path().join("m.safetensors");
    let o = mlff(&[
        "init-model",
        "--config",
        cfg.to_str().unwrap(),
        "-o",
        model.to_str().unwrap(),
        "--seed",
        "3",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = mlff(&["info", model.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("hidden 8, 1 blocks") && text.contains("H O"),
        "{text}"
    );

    // An element the model does not know: the error names structure and atom.
    let xyz = dir.path().join("c.xyz");
    std::fs::write(&xyz, "2\n\nO 0 0 0\nC 0 0 1.2\n").unwrap();
    let o = mlff(&[
        "predict",
        model.to_str().unwrap(),
        xyz.to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("Z=6") && err.contains("atom 1"),
        "{err}"
    );

    // A malformed file: the error names file and line.
    std::fs::write(&xyz, "2\n\nO 0 0 0\nH 0 zero 1.2\n").unwrap();
    let o = mlff(&[
        "predict",
        model.to_str().unwrap(),
        xyz.to_str().unwrap(),
        "--device",
        "cpu",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("c.xyz") && err.contains("line 4"),
        "{err}"
    );

    // A bad config names the field.
    std::fs::write(&cfg, r#"{"hidden": 7}"#).unwrap();
    let o = mlff(&[
        "init-model",
        "--config",
        cfg.to_str().unwrap(),
        "-o",
        model.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("hidden must be even"),
        "{err}"
    );

    // An unknown device string.
    let o = mlff(&["check", "--device", "tpu"]);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("unknown device `tpu`")
    );
}

#[test]
fn check_writes_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("check.json");
    let o = mlff(&["check", "--json", json.to_str().unwrap(), "--device", "cpu"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["cuda_feature"], cfg!(feature = "cuda"));
    assert!(v["cpu_threads"].as_u64().unwrap() >= 1);
    assert_eq!(v["selected_device"], "cpu");
    assert!(v["warm_up_ms"].as_f64().unwrap() > 0.0);
}

#[cfg(not(feature = "cuda"))]
#[test]
fn explicit_cuda_without_the_feature_is_a_clear_error() {
    let o = mlff(&["check", "--device", "cuda"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--features cuda"),
        "{err}"
    );
    let o = mlff(&["check", "--device", "auto"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("using the CPU"));
}

#[test]
fn bench_compares_the_student_with_its_teachers_recorded_time() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let data = root().join("data/gfn2/ethanol_test.extxyz");
    let o = mlff(&[
        "bench",
        "--systems",
        "none",
        "--teacher-data",
        data.to_str().unwrap(),
        "--warmup",
        "0",
        "--repeats",
        "3",
        "--device",
        "cpu",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let cases = v["teacher"].as_array().unwrap();
    assert_eq!(cases.len(), 1);
    let c = &cases[0];
    assert_eq!(c["molecule"], "C2H6O");
    assert_eq!(c["teacher"], "gfn2");
    assert_eq!(c["teacher_frames"], 50);
    // The median of the file's own teacher_time_s values.
    let mut t: Vec<f64> = mlff_distiller::io::read_extxyz(&data)
        .unwrap()
        .iter()
        .map(|s| {
            let (_, v) = s.info.iter().find(|(k, _)| k == "teacher_time_s").unwrap();
            v.parse::<f64>().unwrap() * 1e3
        })
        .collect();
    t.sort_by(f64::total_cmp);
    assert_eq!(c["teacher_ms"].as_f64().unwrap(), t[25]);
    let (student, speedup) = (
        c["student_ms"].as_f64().unwrap(),
        c["speedup"].as_f64().unwrap(),
    );
    assert!(student > 0.0 && (speedup - t[25] / student).abs() < 1e-9 * speedup);
    // Frames without teacher timings are refused with the file and frame named.
    let bare = root().join("data/aspirin_rmd17_10frames.extxyz");
    let o = mlff(&[
        "bench",
        "--systems",
        "none",
        "--teacher-data",
        bare.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("aspirin_rmd17_10frames.extxyz frame 0") && err.contains("teacher_time_s"),
        "{err}"
    );
}

/// Predictions that would not be finite are errors naming the frame and atoms, and write no
/// output: overlapping atoms are refused up front (as `mlff md` refuses them), and a
/// checkpoint holding a NaN weight is refused at the first non-finite energy or force.
#[test]
fn predict_refuses_overlapping_atoms_and_non_finite_results() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pred.extxyz");
    let model = root().join("models/painn-gfn2.safetensors");
    let predict = |model: &std::path::Path, frames: &std::path::Path| {
        mlff(&[
            "predict",
            model.to_str().unwrap(),
            frames.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
            "--device",
            "cpu",
        ])
    };
    let overlapping = dir.path().join("overlap.extxyz");
    let frame =
        |z: f64| format!("3\nProperties=species:S:1:pos:R:3\nO 0 0 0\nH 0 0 {z}\nH 0 0.96 0\n");
    std::fs::write(&overlapping, format!("{}{}", frame(0.96), frame(0.0))).unwrap();
    // Refused with an error holding `words`, and no output written.
    let refused = |o: std::process::Output, words: &[&str]| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success());
        assert!(words.iter().all(|w| err.contains(w)), "{err}");
        assert!(!out.exists(), "a refused prediction wrote its output");
    };
    refused(predict(&model, &overlapping), &["frame 1", "atoms 0 and 1"]);

    let poisoned = common::poisoned_model(dir.path());
    let frames = root().join("data/aspirin_rmd17_10frames.extxyz");
    refused(predict(&poisoned, &frames), &["frame 0", "not finite"]);
}

#[test]
fn predict_energies_writes_each_atoms_energy() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("pred.extxyz");
    let model = root().join("models/painn-gfn2.safetensors");
    let frames = root().join("data/aspirin_rmd17_10frames.extxyz");
    let args = ["predict", model.to_str().unwrap(), frames.to_str().unwrap()];
    let o = mlff(&[&args[..], &["-o", out.to_str().unwrap(), "--device", "cpu"]].concat());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let plain = mlff_distiller::io::read_extxyz(&out).unwrap();
    assert!(plain[0].arrays.iter().all(|a| a.name != "energies"));
    let flags = ["--energies", "--dtype", "f64", "--overwrite"];
    let o = mlff(
        &[
            &args[..],
            &["-o", out.to_str().unwrap(), "--device", "cpu"],
            &flags,
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let calc = mlff_distiller::PainnCalculator::from_checkpoint(
        &model,
        &candle_core::Device::Cpu,
        candle_core::DType::F64,
    )
    .unwrap();
    for (k, s) in mlff_distiller::io::read_extxyz(&out)
        .unwrap()
        .iter()
        .enumerate()
    {
        let column = s.arrays.iter().find(|a| a.name == "energies").unwrap();
        let e: Vec<f64> = column.values.iter().map(|v| v.parse().unwrap()).collect();
        assert_eq!(e.len(), s.len());
        let sum: f64 = e.iter().sum();
        assert!(
            (sum - s.energy.unwrap()).abs() < 1e-9 * sum.abs(),
            "frame {k}"
        );
        // The same terms by the other route that gives them: a domain of local atoms only.
        let dom = calc
            .compute_domain(&s.numbers, &s.positions, s.len(), None)
            .unwrap();
        for (i, (a, b)) in e.iter().zip(&dom.atom_energies).enumerate() {
            assert!(
                (a - b).abs() < 1e-10 * b.abs(),
                "frame {k}, atom {i}: {a} vs {b}"
            );
        }
    }
}
