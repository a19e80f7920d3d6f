//! Data safety end to end: outputs never replace inputs or each other, existing outputs need
//! --overwrite or --append, stale restart files are refused (or branched), temporary files of
//! killed runs are cleaned, non-finite results are errors, far-out periodic positions keep
//! their digits, and messages name the frame, the atom and the flag.

mod common;

use common::{mlff, poisoned_model, root, s};
use std::path::{Path, PathBuf};
use std::process::Output;

fn model() -> PathBuf {
    root().join("models/painn-gfn2.safetensors")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `mlff md` on the shipped student from `structure`, on the CPU, with `extra`, run in `dir`.
fn md(dir: &Path, model: &Path, structure: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["md", "--model", s(model), "--structure", s(structure)];
    args.extend_from_slice(&["--device", "cpu"]);
    args.extend_from_slice(extra);
    std::process::Command::new(env!("CARGO_BIN_EXE_mlff"))
        .current_dir(dir)
        .args(&args)
        .output()
        .unwrap()
}

/// A copy of ethanol's start and of the shipped model in `dir`.
fn inputs(dir: &Path) -> (PathBuf, PathBuf) {
    let (st, m) = (dir.join("s.extxyz"), dir.join("m.safetensors"));
    std::fs::copy(root().join("data/gfn2/start/ethanol.extxyz"), &st).unwrap();
    std::fs::copy(model(), &m).unwrap();
    (st, m)
}

fn frames(p: &Path) -> usize {
    mlff_distiller::io::read_extxyz(p).unwrap().len()
}

#[test]
fn outputs_never_replace_inputs_or_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (st, m) = inputs(d);
    std::fs::create_dir(d.join("sub")).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(&st, d.join("link.extxyz")).unwrap();
    let (st_bytes, m_bytes) = (std::fs::read(&st).unwrap(), std::fs::read(&m).unwrap());
    let mut cases: Vec<Vec<&str>> = vec![
        vec!["--traj", "s.extxyz"],
        vec!["--traj", "m.safetensors"],
        vec!["--log", "s.extxyz"],
        vec!["--traj", "sub/../s.extxyz"],
        vec!["--log", "t.jsonl", "--traj", "t.jsonl"],
        vec!["--traj", "t.extxyz", "--summary-json", "t.extxyz"],
        vec!["--restart-every", "5", "--restart-file", "s.extxyz"],
    ];
    #[cfg(unix)]
    cases.push(vec!["--log", "link.extxyz"]);
    for case in cases {
        for overwrite in [false, true] {
            let mut args = vec!["--steps", "5"];
            args.extend(&case);
            if overwrite {
                args.push("--overwrite");
            }
            let o = md(d, &m, &st, &args);
            assert_eq!(o.status.code(), Some(1), "{case:?}");
            assert!(stderr(&o).contains("is the same file as"), "{}", stderr(&o));
            assert_eq!(std::fs::read(&st).unwrap(), st_bytes, "{case:?}");
            assert_eq!(std::fs::read(&m).unwrap(), m_bytes, "{case:?}");
            assert!(!d.join("t.jsonl").exists() && !d.join("t.extxyz").exists());
        }
    }
    let mut targets = vec![st.clone(), m.clone(), d.join("sub/../s.extxyz")];
    if cfg!(unix) {
        targets.push(d.join("link.extxyz"));
    }
    for target in targets {
        let o = mlff(&[
            "predict",
            s(&m),
            s(&st),
            "-o",
            s(&target),
            "--overwrite",
            "--device",
            "cpu",
        ]);
        assert_eq!(o.status.code(), Some(1), "{}", target.display());
        assert!(stderr(&o).contains("is the same file as"), "{}", stderr(&o));
        assert_eq!(std::fs::read(&st).unwrap(), st_bytes);
        assert_eq!(std::fs::read(&m).unwrap(), m_bytes);
    }
}

#[test]
fn existing_outputs_need_overwrite_or_append() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (st, m) = inputs(d);
    let run = |extra: &[&str]| {
        let mut args = vec!["--steps", "20", "--traj", "t.extxyz", "--traj-every", "10"];
        args.extend_from_slice(&["--log", "l.jsonl", "--log-every", "10"]);
        args.extend_from_slice(extra);
        md(d, &m, &st, &args)
    };
    let o = run(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (traj, log) = (d.join("t.extxyz"), d.join("l.jsonl"));
    assert_eq!(frames(&traj), 3);
    let before = std::fs::read(&traj).unwrap();

    let o = run(&[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("--traj t.extxyz: exists already"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("--append"), "{}", stderr(&o));
    // A bad setting is found before any output is opened, and named by its flag.
    let o = run(&["--overwrite", "--dt", "0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).starts_with("error: --dt 0"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("s.extxyz"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&traj).unwrap(), before);

    let o = run(&["--append"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("appending"), "{}", stderr(&o));
    assert_eq!(frames(&traj), 6, "appended, not replaced");
    assert!(std::fs::read(&traj).unwrap().starts_with(&before));
    assert_eq!(
        mlff_distiller::md::read_log(&log, u64::MAX).unwrap().len(),
        6
    );
    let o = run(&["--overwrite"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(frames(&traj), 3);

    let pred = d.join("p.extxyz");
    let predict = |extra: &[&str]| {
        let mut args = vec!["predict", s(&m), s(&st), "-o", s(&pred), "--device", "cpu"];
        args.extend_from_slice(extra);
        mlff(&args)
    };
    assert!(predict(&[]).status.success());
    let o = predict(&[]);
    assert!(stderr(&o).contains("exists already"), "{}", stderr(&o));
    assert!(predict(&["--overwrite"]).status.success());

    // Report folders: their reports are refused too.
    let reports = d.join("bench");
    let bench = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "--systems",
            "ethanol",
            "--repeats",
            "3",
            "--warmup",
            "0",
        ];
        args.extend_from_slice(&["--device", "cpu", "--out", s(&reports)]);
        args.extend_from_slice(extra);
        mlff(&args)
    };
    assert!(bench(&[]).status.success());
    let o = bench(&[]);
    assert!(
        stderr(&o).contains("report.json: exists already"),
        "{}",
        stderr(&o)
    );
    assert!(bench(&["--overwrite"]).status.success());
}

/// Copies the files (not folders) of `from` into a new folder `to`.
fn copy_folder(from: &Path, to: &Path) {
    std::fs::create_dir(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn a_stale_restart_is_refused_and_can_branch_into_new_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("run");
    std::fs::create_dir(&d).unwrap();
    let (st, m) = inputs(&d);
    let o = md(
        &d,
        &m,
        &st,
        &[
            "--steps",
            "20",
            "--traj",
            "t.extxyz",
            "--traj-every",
            "10",
            "--log",
            "l.jsonl",
            "--log-every",
            "10",
            "--restart-every",
            "20",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let restart = d.join("t.extxyz.restart.json");
    let old = d.join("old.json");
    std::fs::copy(&restart, &old).unwrap();
    // A copy of the whole folder continues in the copy (paths are relative to the restart).
    let copy = dir.path().join("copy");
    copy_folder(&d, &copy);
    let resume = |file: &Path, extra: &[&str]| {
        let mut args = vec!["md", "--resume", s(file), "--device", "cpu"];
        args.extend_from_slice(extra);
        mlff(&args)
    };
    let o = resume(&restart, &["--steps", "60"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (traj, log) = (d.join("t.extxyz"), d.join("l.jsonl"));
    let live = (std::fs::read(&traj).unwrap(), std::fs::read(&log).unwrap());
    assert_eq!(frames(&traj), 7);
    let unchanged = || {
        assert_eq!(
            std::fs::read(&traj).unwrap(),
            live.0,
            "the live trajectory changed"
        );
        assert_eq!(std::fs::read(&log).unwrap(), live.1, "the live log changed");
    };

    // A resume from `file` refused as stale, saying `why`, with the live files unchanged.
    let refused_as_stale = |file: &Path, why: &str| {
        let o = resume(file, &["--steps", "80"]);
        assert_eq!(o.status.code(), Some(1));
        let err = stderr(&o);
        assert!(err.contains("is stale") && err.contains(why), "{err}");
        unchanged();
    };
    // An older copy beside the live restart file.
    refused_as_stale(&old, "at step 60");
    // The older copy put back in place of the live one: the outputs went on past it.
    std::fs::copy(&old, &restart).unwrap();
    refused_as_stale(&restart, "goes on to step 60");

    // Branching continues the old state in new files; the original run stays as it is.
    let branch = dir.path().join("branch");
    std::fs::create_dir(&branch).unwrap();
    let o = resume(&old, &["--steps", "30", "--branch", s(&branch)]);
    assert!(o.status.success(), "{}", stderr(&o));
    unchanged();
    let steps = |p: &Path| -> Vec<String> {
        (mlff_distiller::io::read_extxyz(p).unwrap().iter())
            .map(|f| f.info_value("step").unwrap().to_string())
            .collect()
    };
    assert_eq!(steps(&branch.join("t.extxyz")), ["0", "10", "20", "30"]);
    assert!(branch.join("t.extxyz.restart.json").exists());

    let o = resume(&copy.join("t.extxyz.restart.json"), &["--steps", "40"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(frames(&copy.join("t.extxyz")), 5);
    unchanged();

    // An output whose recorded last frame was rewritten is refused too.
    let tampered = std::fs::read_to_string(copy.join("t.extxyz")).unwrap();
    let at = tampered.rfind("step=40").unwrap();
    let mut bytes = tampered.into_bytes();
    bytes[at + 5] = b'5';
    std::fs::write(copy.join("t.extxyz"), &bytes).unwrap();
    let o = resume(&copy.join("t.extxyz.restart.json"), &["--steps", "50"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("rewritten"), "{}", stderr(&o));
    assert_eq!(std::fs::read(copy.join("t.extxyz")).unwrap(), bytes);
}

#[test]
fn temporary_files_of_killed_runs_are_removed_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (st, m) = inputs(d);
    // A process id above any kernel's pid_max: that process has ended.
    let dead = d.join(".p.extxyz.999999999.tmp");
    let alive = d.join(format!(".p.extxyz.{}.tmp", std::process::id()));
    let other = d.join(".notes.txt.tmp");
    for f in [&dead, &alive, &other] {
        std::fs::write(f, "partial").unwrap();
    }
    let o = mlff(&[
        "predict",
        s(&m),
        s(&st),
        "-o",
        s(&d.join("p.extxyz")),
        "--device",
        "cpu",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("left by a run that was killed"),
        "{}",
        stderr(&o)
    );
    assert!(!dead.exists());
    assert!(
        alive.exists() && other.exists(),
        "only ended processes' files go"
    );
}

#[test]
fn non_finite_results_are_errors_naming_the_frame() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let poisoned = poisoned_model(d);
    let data = root().join("data/aspirin_rmd17_10frames.extxyz");
    let json = d.join("e.json");
    let o = mlff(&[
        "eval",
        s(&poisoned),
        s(&data),
        "--json",
        s(&json),
        "--device",
        "cpu",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("aspirin_rmd17_10frames.extxyz: frame 0") && err.contains("not finite"),
        "{err}"
    );
    assert!(!json.exists());

    let o = mlff(&[
        "bench",
        "--model",
        s(&poisoned),
        "--systems",
        "ethanol",
        "--repeats",
        "3",
        "--warmup",
        "0",
        "--device",
        "cpu",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("not finite"), "{}", stderr(&o));
}

/// A periodic box whose atoms lie 1e5 cell lengths out gives the forces of the box as given,
/// to f32 rounding: positions are wrapped in f64 before the model's f32 cast.
#[test]
fn far_out_periodic_positions_give_the_same_forces() {
    use mlff_distiller::Calculator;
    let dev = candle_core::Device::Cpu;
    let calc = common::calculator(candle_core::DType::F32, &dev);
    let inside = common::random_box(24, 0.2, 5);
    let cell = inside.cell.unwrap();
    let mut far = inside.clone();
    for (i, x) in far.positions.iter_mut().enumerate() {
        let n = [1e5, -1e5, 3e4].map(|v| if i % 2 == 0 { v } else { -v });
        for d in 0..3 {
            x[d] += (0..3).map(|k| n[k] * cell[k][d]).sum::<f64>();
        }
    }
    let run = |s: &mlff_distiller::Structure| {
        calc.compute(&mlff_distiller::Batch::new(vec![s.clone()]).unwrap())
            .unwrap()
    };
    let (a, b) = (run(&inside), run(&far));
    let scale = common::max_abs(&a.forces[0]).max(1.0);
    let diff = common::max_force_diff(&a.forces[0], &b.forces[0]);
    assert!(
        diff < 1e-4 * scale,
        "forces moved by {diff} (scale {scale})"
    );
    assert!((a.energies[0] - b.energies[0]).abs() < 1e-4 * a.energies[0].abs().max(1.0));
}

#[test]
fn messages_number_frames_in_the_file_and_name_flags() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // 40 frames; frame 37 holds chlorine, which the model does not know.
    let mut text = String::new();
    for k in 0..40 {
        let el = if k == 37 { "Cl" } else { "H" };
        text.push_str(&format!(
            "2\nProperties=species:S:1:pos:R:3\nO 0 0 0\n{el} 0 0 0.97\n"
        ));
    }
    let file = d.join("f.extxyz");
    std::fs::write(&file, text).unwrap();
    let o = mlff(&[
        "predict",
        s(&model()),
        s(&file),
        "--batch-size",
        "16",
        "--device",
        "cpu",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("f.extxyz: frame 37: atom 1: element Z=17"),
        "{err}"
    );

    let o = mlff(&[
        "predict",
        s(&model()),
        s(&d.join("missing.extxyz")),
        "--device",
        "cpu",
    ]);
    let err = stderr(&o);
    assert_eq!(err.matches("os error 2").count(), 1, "{err}");

    // A resume with another setting names it.
    let config = common::config_file(
        d,
        r#"{"hidden": 8, "n_blocks": 1, "n_rbf": 4, "cutoff": 4.0, "elements": [1, 6, 7, 8]}"#,
    );
    let data = root().join("data/aspirin_rmd17_10frames.extxyz");
    let out = d.join("run");
    let train = |extra: &[&str]| {
        let mut args = vec!["train", "--train", s(&data), "--val", s(&data), "--config"];
        args.extend_from_slice(&[s(&config), "--epochs", "1", "--batch-size", "5"]);
        args.extend_from_slice(&["--device", "cpu", "--out", s(&out)]);
        args.extend_from_slice(extra);
        mlff(&args)
    };
    assert!(train(&[]).status.success());
    let o = train(&["--resume", "--lr", "0.123"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("lr 0.001 there, 0.123 now"),
        "{}",
        stderr(&o)
    );
    let o = train(&[]);
    assert!(
        stderr(&o).contains("--overwrite to start over"),
        "{}",
        stderr(&o)
    );
    assert!(train(&["--overwrite"]).status.success());
}
