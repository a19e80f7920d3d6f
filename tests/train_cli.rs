//! `mlff train` end to end on the CPU with a tiny model: outputs, a run stopped by its time
//! limit and resumed, the provenance, both force gradients, `mlff eval` on the result, and the
//! errors of bad flags.

mod common;

use common::{config_file, mlff, root};
use std::path::Path;

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn log_lines(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("log.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `mlff train` of a tiny model (its config written into `dir`) on the ten aspirin frames,
/// validating on the same, on the CPU, into `out`, with `args` (epochs, batch size, ...).
fn train_tiny(dir: &Path, out: &Path, args: &[&str]) -> std::process::Output {
    let config = config_file(
        dir,
        r#"{"hidden": 8, "n_blocks": 2, "n_rbf": 6, "cutoff": 4.0, "elements": [1, 6, 7, 8]}"#,
    );
    let frames = root().join("data/aspirin_rmd17_10frames.extxyz");
    let (frames, config) = (frames.to_str().unwrap(), config.to_str().unwrap());
    let mut all = vec![
        "train", "--train", frames, "--val", frames, "--config", config, "--device", "cpu", "--out",
    ];
    all.push(out.to_str().unwrap());
    all.extend_from_slice(args);
    mlff(&all)
}

#[test]
fn train_resume_and_eval_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let frames = root().join("data/aspirin_rmd17_10frames.extxyz");
    let frames = frames.to_str().unwrap();
    let out = dir.path().join("run");
    let train = |out: &Path, extra: &[&str]| {
        let args = [&["--epochs", "3", "--batch-size", "4"], extra].concat();
        train_tiny(dir.path(), out, &args)
    };

    // A negative or non-finite time limit is refused naming the flag, before any output.
    for bad in ["-1", "nan", "inf"] {
        let o = train(&out, &["--max-minutes", bad]);
        assert_eq!(o.status.code(), Some(2), "{bad}");
        assert!(stderr(&o).contains("--max-minutes"), "{}", stderr(&o));
        assert!(
            !out.exists(),
            "--max-minutes {bad} created the output folder"
        );
    }

    // A limit already passed stops the run after its first epoch, with everything saved.
    let o = train(&out, &["--max-minutes", "0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--max-minutes 0 reached"),
        "{}",
        stderr(&o)
    );
    for f in ["best", "last", "state"] {
        assert!(out.join(format!("{f}.safetensors")).exists(), "{f}");
    }
    assert_eq!(log_lines(&out).len(), 1);

    // The same command again would overwrite the run: refused, pointing at --resume.
    let o = train(&out, &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--resume"), "{}", stderr(&o));

    // Resumed, it finishes the schedule it started.
    let o = train(&out, &["--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("resuming at epoch 1"), "{}", stderr(&o));
    let log = log_lines(&out);
    assert_eq!(log.len(), 3);
    assert_eq!(log[2]["epoch"], 3);
    assert!(log[2]["val_force_mae"].as_f64().unwrap().is_finite());
    // Throughput and peak memory, per epoch and for the run.
    for line in &log {
        assert!(line["structures_per_s"].as_f64().unwrap() > 0.0, "{line}");
        assert!(line["memory_peak_mb"].as_f64().unwrap() > 1.0, "{line}");
    }
    assert!(
        stderr(&o).contains("structures/s, peak memory"),
        "{}",
        stderr(&o)
    );

    // The checkpoint says how it was trained: `auto` is the fused gradient.
    let o = mlff(&["info", out.join("last.safetensors").to_str().unwrap()]);
    let info = String::from_utf8_lossy(&o.stdout);
    assert!(info.contains(r#""force_gradient": "fused""#), "{info}");
    assert!(info.contains(r#""backend": "autograd""#), "{info}");

    // The directional gradient trains on the CPU too, and says so.
    let directional = dir.path().join("directional");
    let o = train(&directional, &["--force-gradient", "directional"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = mlff(&[
        "info",
        directional.join("last.safetensors").to_str().unwrap(),
    ]);
    let info = String::from_utf8_lossy(&o.stdout);
    assert!(
        info.contains(r#""force_gradient": "directional""#),
        "{info}"
    );

    // The result evaluates like any checkpoint.
    let last = out.join("last.safetensors");
    let o = mlff(&["eval", last.to_str().unwrap(), frames, "--device", "cpu"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("F MAE"));

    // A bad choice names what is accepted.
    let o = train(&dir.path().join("bad"), &["--force-gradient", "exact"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("double-backward"), "{}", stderr(&o));
}

/// `--stress-weight` on boxes with stress labels: trains, logs the validation stress error;
/// with the fused force gradient (no stress term) refused by name before any output.
#[test]
fn train_fits_stress_labels_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let (config, data) = common::stress_boxes(dir.path(), 40);
    let train = |out: &Path, extra: &[&str]| {
        let mut args = vec![
            "train",
            "--train",
            common::s(&data),
            "--val",
            common::s(&data),
        ];
        args.extend(["--config", config.to_str().unwrap(), "--epochs", "2"]);
        args.extend([
            "--batch-size",
            "3",
            "--device",
            "cpu",
            "--out",
            common::s(out),
        ]);
        args.extend_from_slice(extra);
        mlff(&args)
    };
    let out = dir.path().join("run");
    let o = train(&out, &["--stress-weight", "1e4"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("GPa"), "{}", stderr(&o));
    let lines = log_lines(&out);
    assert!(
        lines.iter().all(|l| l["val_stress_mae"].as_f64().is_some()),
        "{lines:?}"
    );

    let refused = dir.path().join("refused");
    let o = train(
        &refused,
        &[
            "--stress-weight",
            "1",
            "--force-gradient",
            "fused",
            "--force-weight",
            "0",
        ],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("stress_weight needs force_gradient double-backward"),
        "{}",
        stderr(&o)
    );
    assert!(!refused.join("log.jsonl").exists());
}

#[test]
fn patience_stops_training_on_a_validation_plateau() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // A learning rate too small to matter: the validation loss only wanders at the level of
    // rounding, so a run of epochs without a better loss comes within a few. (A high one
    // made the plateau hang on whether f32 rounding tipped the run into divergence.)
    let plateau = [
        "--epochs",
        "40",
        "--batch-size",
        "2",
        "--lr",
        "1e-12",
        "--lr-min",
        "0",
        "--warmup-steps",
        "0",
        "--patience",
        "3",
    ];
    let o = train_tiny(dir.path(), &out, &plateau);
    assert!(o.status.success(), "{}", stderr(&o));
    let log = log_lines(&out);
    // It stops at the first epoch that ends 3 epochs in a row without a better loss.
    let mut since = 0;
    let mut expected = 40;
    for (k, line) in log.iter().enumerate() {
        since = if line["best"].as_bool().unwrap() {
            0
        } else {
            since + 1
        };
        if since == 3 {
            expected = k + 1;
            break;
        }
    }
    assert!(
        expected < 40,
        "no plateau in 40 epochs: the test shows nothing"
    );
    assert_eq!(log.len(), expected);
    assert!(stderr(&o).contains("patience 3"), "{}", stderr(&o));
}

#[test]
fn val_every_validates_and_saves_every_k_epochs_and_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let run = |epochs: &str, extra: &[&str]| {
        let cadence = ["--epochs", epochs, "--batch-size", "4", "--val-every", "3"];
        train_tiny(dir.path(), &out, &[&cadence[..], extra].concat())
    };
    let epochs = || -> Vec<u64> {
        let lines = log_lines(&out);
        lines.iter().map(|l| l["epoch"].as_u64().unwrap()).collect()
    };
    // A time limit validates and saves the epoch it stops after, whatever the cadence.
    let o = run("7", &["--max-minutes", "0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(epochs(), [1]);
    let o = run("7", &["--resume"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("resuming at epoch 1"), "{}", stderr(&o));
    assert_eq!(epochs(), [1, 3, 6, 7]);
}

/// `--devices` takes CUDA devices, each once, and not beside `--device`; a refused run writes
/// nothing.
#[test]
fn devices_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let frames = root().join("data/aspirin_rmd17_10frames.extxyz");
    let (frames, o) = (frames.to_str().unwrap(), out.to_str().unwrap());
    let base = ["train", "--train", frames, "--val", frames, "--out", o];
    let cases: [(&[&str], &str); 4] = [
        (&["--devices", "cpu"], "--devices takes CUDA devices"),
        (
            &["--devices", "cuda:0,cuda:0"],
            "--devices names cuda:0 twice",
        ),
        (
            &["--devices", "cuda:x"],
            "--devices: unknown device `cuda:x`",
        ),
        (
            &["--devices", "cuda:0", "--device", "cpu"],
            "cannot be used with",
        ),
    ];
    for (args, why) in cases {
        let o = mlff(&[&base[..], args].concat());
        assert!(!o.status.success());
        assert!(stderr(&o).contains(why), "{args:?}: {}", stderr(&o));
        assert!(!out.exists(), "{args:?} wrote {}", out.display());
    }
}
