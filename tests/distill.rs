//! `mlff distill`: its config checks, and the whole loop on a toy teacher (the bridge's
//! analytic Morse potential) through the same teacher processes as any other teacher (whose
//! own tests are in distill_teachers.rs; the selection pieces' in distill_select.rs).

mod common;

use mlff_distiller::calculator::Calculator;
use mlff_distiller::distill::{
    most_disputed, most_disputed_overall, relative_to_goals, DistillConfig,
};
use mlff_distiller::io::read_extxyz;
use mlff_distiller::structure::{Batch, Structure};
use mlff_distiller::PainnCalculator;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn bad_configs_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            r#"{"teacher": {"name": "gfn2"}, "seeds": []}"#,
            "seeds is empty",
        ),
        (
            r#"{"teacher": {"name": "gfn2"}, "seeds": [{"name": "a", "smiles": "C", "file": "a.xyz"}]}"#,
            "seeds[0] (a): give exactly one of smiles, cluster, file",
        ),
        (
            r#"{"teacher": {"name": "gfn2"}, "seeds": [{"name": "a", "smiles": "C"}], "selection": {"share": "disputed", "per_molecule": 5, "min_per_molecule": 6}}"#,
            "selection.min_per_molecule (6) must not exceed per_molecule (5)",
        ),
        (
            r#"{"teacher": {"name": "gfn2"}, "seeds": [{"name": "w", "cluster": "O:4", "wall_radius": 0}]}"#,
            "seeds[0] (w): wall_radius must be positive",
        ),
        (
            r#"{"teacher": {"name": "gfn2"}, "seeds": [{"name": "a", "smiles": "C"}], "committee": 1}"#,
            "committee is 1",
        ),
        (
            r#"{"teacher": {"name": "gfn2"}, "seeds": [{"name": "a", "smiles": "C"}], "teacher_md": {"val_seeds": [0]}}"#,
            "must all differ",
        ),
        (
            r#"{"teacher": {"name": "gfn2"}, "seeds": [{"name": "a", "smiles": "C"}], "stability": {"bond_limit": 0}}"#,
            "stability.bond_limit must be positive",
        ),
        (
            r#"{"teacher": {"name": "gfn2"}, "seeds": [{"name": "a", "smiles": "C"}], "temperatures": [300, 600], "selection": {"force_goals": [0.015]}}"#,
            "selection.force_goals has 1 entries for 2 temperatures",
        ),
        (
            r#"{"teacher": {"name": "gfn2"}, "seeds": [{"name": "a", "smiles": "C"}], "temperatures": [300, 600], "selection": {"force_goals": [0.015, 0]}}"#,
            "selection.force_goals: 0 is not a positive force error",
        ),
        (
            r#"{"teacher": {"name": "gfn2"}, "seeds": [{"name": "a", "smiles": "C"}], "unknown": 1}"#,
            "unknown field `unknown`",
        ),
    ];
    for (k, (json, want)) in cases.iter().enumerate() {
        let p = dir.path().join(format!("c{k}.json"));
        std::fs::write(&p, json).unwrap();
        let err = DistillConfig::from_file(&p).unwrap_err().to_string();
        assert!(err.contains(want), "{json}: {err}");
        assert!(err.contains(&p.display().to_string()), "{err}");
        let out = dir.path().join(format!("run{k}"));
        let o = distill(Some(&p), &out).output().unwrap();
        assert_eq!(o.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&o.stderr).contains(want));
        assert!(!out.join("state.json").exists());
    }
}

#[test]
fn a_seed_the_student_cannot_hold_is_refused_before_the_teacher_runs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("si2.xyz"),
        "2\nProperties=species:S:1:pos:R:3\nSi 0 0 0\nSi 2.35 0 0\n",
    )
    .unwrap();
    let p = dir.path().join("c.json");
    std::fs::write(
        &p,
        r#"{"teacher": {"name": "morse"}, "seeds": [{"name": "si2", "file": "si2.xyz"}]}"#,
    )
    .unwrap();
    let out = dir.path().join("run");
    let o = distill(Some(&p), &out).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("seed `si2` holds Si (Z=14)") && err.contains("`model`"),
        "{err}"
    );
    assert!(!out.join("state.json").exists() && !out.join("data").exists());
    // With a student for silicon the same seed is taken.
    std::fs::write(dir.path().join("si.json"), r#"{"elements": [14]}"#).unwrap();
    std::fs::write(
        &p,
        r#"{"teacher": {"name": "morse", "sample_command": ["false"]},
            "seeds": [{"name": "si2", "file": "si2.xyz"}], "model": "si.json"}"#,
    )
    .unwrap();
    let o = distill(Some(&p), &dir.path().join("run2"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("holds Si"), "{err}");
    assert!(err.contains("the teacher command `false"), "{err}");
}

/// `mlff distill --device cpu --out OUT`, from `config` (a new run) or `--resume`.
fn distill(config: Option<&Path>, out: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mlff"));
    c.args(["distill", "--device", "cpu", "--out"]).arg(out);
    match config {
        Some(config) => c.arg("--config").arg(config),
        None => c.arg("--resume"),
    };
    c
}

/// A 7-atom carbon cluster, a tiny student and a loop sized for a debug build.
fn toy_run(dir: &Path) -> PathBuf {
    let root = common::root();
    std::fs::write(dir.join("c7.xyz"), common::C7_XYZ).unwrap();
    std::fs::write(
        dir.join("model.json"),
        r#"{"hidden": 16, "n_blocks": 2, "n_rbf": 8, "cutoff": 4.5, "elements": [6]}"#,
    )
    .unwrap();
    let script = |s: &str| root.join("teachers").join(s).display().to_string();
    let cfg = serde_json::json!({
        "teacher": {"name": "morse", "workers": 2,
                    "label_command": ["python3", script("label.py")],
                    "sample_command": ["python3", script("sample.py")]},
        "seeds": [{"name": "c7", "file": "c7.xyz"}],
        "temperatures": [300, 600],
        "model": "model.json",
        "committee": 2,
        "train": {"epochs": 40, "batch_size": 8, "lr": 3e-3, "warmup_steps": 10},
        "teacher_md": {"equil_steps": 50, "steps": 300, "every": 10},
        "sampling": {"replicas": 2, "steps": 400, "every": 10, "rattle_per_molecule": 10},
        "selection": {"per_molecule": 20},
        "stop": {"max_iterations": 1, "disagreement": 0.0},
        "stability": {"steps": 200}
    });
    let p = dir.join("distill.json");
    std::fs::write(&p, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    p
}

/// [`toy_run`] with the quickest settings that still run every phase, and `overrides` (top-level
/// keys of the config) on top.
fn quick_toy_run(dir: &Path, overrides: Value) -> PathBuf {
    let config = toy_run(dir);
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    cfg["train"]["epochs"] = 3.into();
    cfg["teacher_md"] = serde_json::json!({"equil_steps": 10, "steps": 60, "every": 10});
    cfg["sampling"] = serde_json::json!({"replicas": 1, "steps": 60, "every": 10});
    cfg["stability"] = serde_json::json!({"steps": 0});
    for (key, value) in overrides.as_object().unwrap() {
        cfg[key] = value.clone();
    }
    std::fs::write(&config, cfg.to_string()).unwrap();
    config
}

fn state(out: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(out.join("state.json")).ok()?;
    serde_json::from_str(&text).ok()
}

fn done(state: &Value, i: usize) -> Vec<String> {
    state["iterations"][i]["done"]
        .as_array()
        .map(|a| a.iter().map(|p| p.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// Mean force error of `calc` on each labelled frame, eV/Å.
fn frame_errors(calc: &PainnCalculator, frames: &[Structure]) -> Vec<f64> {
    frames
        .iter()
        .map(|f| {
            let p = calc.compute(&Batch::from_one(f.clone()).unwrap()).unwrap();
            let refs = f.forces.as_ref().unwrap();
            let sum: f64 = p.forces[0]
                .iter()
                .zip(refs)
                .flat_map(|(a, b)| (0..3).map(move |d| (a[d] - b[d]).abs()))
                .sum();
            sum / (3 * f.len()) as f64
        })
        .collect()
}

#[test]
fn the_loop_selects_what_the_student_gets_wrong_learns_from_it_and_resumes_after_a_kill() {
    if !common::bridge_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = toy_run(dir.path());
    let out = dir.path().join("run");
    // Killed (SIGKILL: nothing saved on the way out) once iteration 1 has trained its first
    // student and saved an epoch of its second.
    let mut child = distill(Some(&config), &out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        let trained = |s: &Value| s["iterations"][1]["members_trained"] == serde_json::json!([0]);
        let second = out.join("iter-001/student-1/state.safetensors");
        if second.exists() && state(&out).is_some_and(|s| trained(&s)) {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before iteration 1 trained its first student"
        );
        assert!(started.elapsed() < Duration::from_secs(600), "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let first = std::fs::read(out.join("iter-000/student-0/best.safetensors")).unwrap();
    let first_data = std::fs::read(out.join("iter-000/labelled.extxyz")).unwrap();
    // Seeded training rewrites the same bytes: the file's time tells whether it was redone.
    let written = |p: &str| std::fs::metadata(out.join(p)).unwrap().modified().unwrap();
    let member = written("iter-001/student-0/best.safetensors");

    let o = distill(None, &out).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("resuming"), "{err}");
    assert!(
        !err.contains("iteration 0: "),
        "iteration 0 ran again: {err}"
    );
    assert!(
        err.contains("resuming at epoch"),
        "the second student started over: {err}"
    );
    // Iteration 0 was not redone.
    assert_eq!(
        std::fs::read(out.join("iter-000/student-0/best.safetensors")).unwrap(),
        first
    );
    assert_eq!(
        std::fs::read(out.join("iter-000/labelled.extxyz")).unwrap(),
        first_data
    );
    // Nor was the student iteration 1 had finished.
    assert_eq!(written("iter-001/student-0/best.safetensors"), member);
    let s = state(&out).unwrap();
    assert_eq!(
        s["iterations"][1]["members_trained"],
        serde_json::json!([0, 1])
    );
    assert_eq!(s["iterations"][1]["epochs"], serde_json::json!([40, 40]));
    assert_eq!(
        done(&s, 1),
        ["sample", "select", "label", "train", "evaluate"]
    );
    assert!(s["finished"].as_str().unwrap().contains("max_iterations"));
    assert_eq!(s["iterations"].as_array().unwrap().len(), 2);
    assert!(out.join("student.safetensors").exists());
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("| c7 | 600 |"), "{report}");

    // The second iteration lowers the held-out error (teacher frames of seeds never trained
    // on).
    let f = |i: usize| {
        s["iterations"][i]["test"]["overall"]["force_mae"]
            .as_f64()
            .unwrap()
    };
    assert!(f(1) < f(0), "held-out force MAE {} -> {}", f(0), f(1));

    // Disagreement finds the frames the student gets wrong: the teacher's labels of every
    // candidate show the selected ones with a larger error of iteration 0's student than
    // the candidates as a whole.
    let it1 = out.join("iter-001");
    let all = dir.path().join("all.extxyz");
    let status = Command::new("python3")
        .arg(common::root().join("teachers/label.py"))
        .arg(it1.join("candidates.extxyz"))
        .arg("-o")
        .arg(&all)
        .args(["--teacher", "morse", "--quiet"])
        .status()
        .unwrap();
    assert!(status.success());
    let labelled = read_extxyz(&all).unwrap();
    let student = PainnCalculator::from_checkpoint(
        &out.join("iter-000/student-0/best.safetensors"),
        &candle_core::Device::Cpu,
        candle_core::DType::F64,
    )
    .unwrap();
    let errors = frame_errors(&student, &labelled);
    let scores: Vec<f64> =
        serde_json::from_str(&std::fs::read_to_string(it1.join("scores.json")).unwrap()).unwrap();
    assert_eq!(scores.len(), errors.len());
    let picked = most_disputed(&scores, |_| "c7".into(), 20);
    let mean = |v: &mut dyn Iterator<Item = f64>| {
        let v: Vec<f64> = v.collect();
        v.iter().sum::<f64>() / v.len() as f64
    };
    let selected = mean(&mut picked.iter().map(|&k| errors[k]));
    let everyone = mean(&mut errors.iter().copied());
    eprintln!(
        "force error: selected {selected:.4}, all candidates {everyone:.4} eV/Å; held-out \
         {:.4} -> {:.4} eV/Å",
        f(0),
        f(1)
    );
    assert!(
        selected > 1.2 * everyone,
        "selected frames' force error {selected} vs all candidates' {everyone}"
    );
}

/// The `init` a checkpoint was trained from, as its provenance names it.
fn trained_from(path: &Path) -> String {
    let ck = mlff_distiller::checkpoint::load(path).unwrap();
    ck.provenance["init"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_second_stage_refines_the_last_student_and_is_the_one_shipped() {
    if !common::bridge_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = toy_run(dir.path());
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    cfg["refine"] = serde_json::json!({"epochs": 8, "batch_size": 8, "lr": 1e-3,
                                       "energy_weight": 100.0, "val_every": 4});
    cfg["stability"] = serde_json::json!({"steps": 50, "bond_limit": 0.7});
    cfg["selection"] = serde_json::json!({"per_molecule": 20, "share": "disputed",
                                          "min_per_molecule": 5, "force_goals": [0.05, 0.2]});
    std::fs::write(&config, cfg.to_string()).unwrap();
    let out = dir.path().join("run");
    // Another run holds the working directory's default md restart file: the loop's own MD
    // keeps its restart files in the run folder and does not collide with it.
    let held = dir.path().join("mlff-md.restart.json");
    let _lock = mlff_distiller::fsutil::OutputLock::acquire("--restart-file", &held, "a test");
    let o = (distill(Some(&config), &out)
        .current_dir(dir.path())
        .output())
    .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let refined = |out: &Path| state(out).unwrap()["refined"].clone();
    assert_eq!(refined(&out)["from_iteration"], 1, "{err}");
    assert_eq!(refined(&out)["epochs"], 8);
    assert!(
        refined(&out)["test"]["overall"]["force_mae"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    // The stability setting's bond limit judged every student MD: sampling and stability runs.
    for summary in [
        "iter-001/md/T600.summary.json",
        "iter-001/stability.json",
        "refine.stability.json",
    ] {
        let v: Value = serde_json::from_slice(&std::fs::read(out.join(summary)).unwrap()).unwrap();
        assert_eq!(v["bond_limit"].as_f64(), Some(0.7), "{summary}");
    }
    // The frames chosen are the most disputed relative to their temperature's goal.
    let it = out.join("iter-001");
    let cands = read_extxyz(&it.join("candidates.extxyz")).unwrap();
    let scores: Vec<f64> =
        serde_json::from_slice(&std::fs::read(it.join("scores.json")).unwrap()).unwrap();
    let t = |k: usize| cands[k].info_value("temperature_K")?.parse().ok();
    let ranked = relative_to_goals(&scores, t, &[300.0, 600.0], &[0.05, 0.2]);
    let mol = |k: usize| cands[k].info_value("molecule").unwrap().to_string();
    let molecules: std::collections::BTreeSet<String> = (0..cands.len()).map(mol).collect();
    let mut want: Vec<f64> = most_disputed_overall(&ranked, mol, 20 * molecules.len(), 5)
        .iter()
        .map(|&k| scores[k])
        .collect();
    let mut got: Vec<f64> = read_extxyz(&it.join("selected.extxyz"))
        .unwrap()
        .iter()
        .map(|f| f.info_value("disagreement").unwrap().parse().unwrap())
        .collect();
    for v in [&mut want, &mut got] {
        v.sort_by(f64::total_cmp);
    }
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        approx::assert_relative_eq!(*g, *w, max_relative = 1e-5);
    }
    assert!(err.contains("selected by temperature: "), "{err}");
    // The state counts them per molecule and temperature, as the frames say; the report too.
    let mut counted = std::collections::BTreeMap::new();
    for g in state(&out).unwrap()["iterations"][1]["selected_groups"]
        .as_array()
        .unwrap()
    {
        let molecule = g["molecule"].as_str().unwrap().to_string();
        let key = (molecule, g["temperature_k"].as_f64().unwrap() as i64);
        counted.insert(key, g["frames"].as_u64().unwrap() as usize);
    }
    let mut want = std::collections::BTreeMap::new();
    for f in read_extxyz(&it.join("selected.extxyz")).unwrap() {
        let t: f64 = f.info_value("temperature_K").unwrap().parse().unwrap();
        let key = (f.info_value("molecule").unwrap().to_string(), t as i64);
        *want.entry(key).or_insert(0) += 1;
    }
    assert_eq!(counted, want);
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("## Frames chosen per molecule and temperature"));
    let best = out.join("refine/best.safetensors");
    assert!(trained_from(&best).ends_with("iter-001/student-0/best.safetensors"));
    let shipped = std::fs::read(out.join("student.safetensors")).unwrap();
    assert_eq!(shipped, std::fs::read(&best).unwrap());
    assert!(std::fs::read_to_string(out.join("report.md"))
        .unwrap()
        .contains("Second stage"));

    // Resumed as it is: nothing to do, the stage is not run again.
    let written = std::fs::metadata(&best).unwrap().modified().unwrap();
    let o = distill(None, &out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        std::fs::metadata(&best).unwrap().modified().unwrap(),
        written
    );

    // A loop that goes on refines its newer student.
    let o = distill(None, &out)
        .args(["--max-iterations", "2"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(refined(&out)["from_iteration"], 2);
    assert!(trained_from(&best).ends_with("iter-002/student-0/best.safetensors"));
    assert_eq!(
        std::fs::read(out.join("student.safetensors")).unwrap(),
        std::fs::read(&best).unwrap()
    );
}

#[test]
fn the_shipped_example_configs_load() {
    let dir = common::root().join("examples/distill");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "json") {
            let c = DistillConfig::from_file(&p).unwrap();
            assert!(!c.seeds.is_empty());
            n += 1;
        }
    }
    assert!(n > 0, "no configs in {}", dir.display());
}

#[test]
fn sigint_ends_the_loop_after_the_phase_it_arrives_in() {
    if !common::bridge_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = toy_run(dir.path());
    let out = dir.path().join("run");
    let child = distill(Some(&config), &out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The teacher's MD has started (its log exists): the signal reaches `mlff` alone, the
    // teacher finishes and the loop stops before training.
    let started = Instant::now();
    while !out.join("data/teacher-md/jobs/c7.relax.log").exists() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no teacher MD"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // SAFETY: sends a signal to our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{err}");
    assert!(
        err.contains("stopped by signal 2") && err.contains("--resume"),
        "{err}"
    );
    assert_eq!(done(&state(&out).unwrap(), 0), ["teacher-md"]);
}

#[test]
fn the_loop_runs_on_a_periodic_cell_with_its_stress() {
    if !common::bridge_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = common::root();
    // A simple-cubic carbon box of 27 atoms, 1.65 Å apart, periodic along all three axes.
    let a = 1.65;
    let mut text = format!(
        "27\nLattice=\"{l} 0 0 0 {l} 0 0 0 {l}\" Properties=species:S:1:pos:R:3 pbc=\"T T T\"\n",
        l = 3.0 * a
    );
    for k in 0..27 {
        let (i, j, m) = (k / 9, (k / 3) % 3, k % 3);
        text += &format!("C {} {} {}\n", i as f64 * a, j as f64 * a, m as f64 * a);
    }
    std::fs::write(dir.path().join("box.extxyz"), text).unwrap();
    let script = |s: &str| root.join("teachers").join(s).display().to_string();
    let cfg = serde_json::json!({
        "teacher": {"name": "morse", "workers": 2,
                    "label_command": ["python3", script("label.py")],
                    "sample_command": ["python3", script("sample.py")]},
        "seeds": [{"name": "box", "file": "box.extxyz"}],
        "temperatures": [300],
        "model": "model.json",
        "committee": 2,
        "train": {"epochs": 5, "batch_size": 8, "warmup_steps": 5},
        "teacher_md": {"equil_steps": 10, "steps": 60, "every": 10},
        "sampling": {"replicas": 1, "steps": 60, "every": 10, "rattle_per_molecule": 2},
        "selection": {"per_molecule": 4},
        "stop": {"max_iterations": 1, "disagreement": 0.0},
        "stability": {"steps": 20}
    });
    std::fs::write(
        dir.path().join("model.json"),
        r#"{"hidden": 16, "n_blocks": 1, "n_rbf": 6, "cutoff": 4.5, "elements": [6]}"#,
    )
    .unwrap();
    let config = dir.path().join("distill.json");
    std::fs::write(&config, cfg.to_string()).unwrap();
    let out = dir.path().join("run");
    let o = distill(Some(&config), &out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The teacher's frames carry its stress, the candidates their cell, and the student is
    // scored on the held-out stress.
    for file in [
        "data/test.extxyz",
        "iter-000/labelled.extxyz",
        "iter-001/labelled.extxyz",
    ] {
        let frames = read_extxyz(&out.join(file)).unwrap();
        assert!(!frames.is_empty(), "{file}");
        for f in &frames {
            assert!(
                f.is_periodic() && f.info_value("stress").is_some(),
                "{file}"
            );
        }
    }
    let s = state(&out).unwrap();
    assert!(s["iterations"][1]["test"]["stress_mae"].as_f64().unwrap() > 0.0);
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("Held-out stress MAE"), "{report}");
}

/// The run in `out` finished converged, iteration 1 having only sampled and selected.
fn converged_at_selection(out: &Path) {
    let s = state(out).unwrap();
    assert!(
        s["finished"].as_str().unwrap().starts_with("converged"),
        "{s}"
    );
    assert_eq!(done(&s, 1), ["sample", "select"]);
}

#[test]
fn a_converged_run_stays_converged_when_resumed() {
    if !common::bridge_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A threshold any committee meets: the loop ends at iteration 1's selection, before the
    // teacher labels anything.
    let config = quick_toy_run(
        dir.path(),
        serde_json::json!({"stop": {"max_iterations": 3, "disagreement": 10.0}}),
    );
    let out = dir.path().join("run");
    // A tuning file is read before anything runs, and its trainings and MD get it too.
    let tuning = dir.path().join("tuning.json");
    let with_tuning = |json: &str| {
        std::fs::write(&tuning, json).unwrap();
        let o = distill(Some(&config), &out)
            .arg("--tuning")
            .arg(&tuning)
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (ok, err) = with_tuning(r#"{"committee_side_by_side": "yes"}"#);
    assert!(!ok && err.contains("tuning.json"), "{err}");
    assert!(!out.join("distill.json").exists() && state(&out).is_none());
    let (ok, err) = with_tuning(r#"{"committee_side_by_side": false}"#);
    assert!(ok, "{err}");
    let passed = format!("--tuning {}", tuning.display());
    for command in ["mlff train ", "mlff md "] {
        let lines: Vec<_> = err.lines().filter(|l| l.contains(command)).collect();
        assert!(!lines.is_empty(), "no `{command}` in {err}");
        assert!(lines.iter().all(|l| l.contains(&passed)), "{lines:?}");
    }
    converged_at_selection(&out);
    let o = distill(None, &out).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("iteration 1: Label"), "{err}");
    converged_at_selection(&out);
}

/// The teacher elsewhere: `--stop-before label` ends the run with its frames selected, a
/// `--resume --stop-before train` where the teacher is labels them and ends, and a `--resume`
/// back without the teacher trains on them. Here "elsewhere" is a label command that works;
/// the other legs get one that cannot run.
#[test]
fn the_teacher_can_label_on_another_machine() {
    if !common::bridge_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = quick_toy_run(
        dir.path(),
        serde_json::json!({"selection": {"per_molecule": 4}}),
    );
    let cfg: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    let teacher = cfg["teacher"]["label_command"].clone();
    let out = dir.path().join("run");
    let set_label_command = |command: Value| {
        let p = out.join("distill.json");
        let mut run: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        run["teacher"]["label_command"] = command;
        std::fs::write(&p, run.to_string()).unwrap();
    };
    let leg = |c: &mut Command, stop_before: Option<&str>| {
        if let Some(phase) = stop_before {
            c.args(["--stop-before", phase]);
        }
        let o = c.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{err}");
        err
    };
    let err = leg(&mut distill(Some(&config), &out), Some("label"));
    assert!(err.contains("stopped before iteration 1's Label"), "{err}");
    let s = state(&out).unwrap();
    assert!(s["finished"].is_null(), "{s}");
    assert_eq!(done(&s, 1), ["sample", "select"]);
    let selected = read_extxyz(&out.join("iter-001/selected.extxyz")).unwrap();
    assert!(!out.join("iter-001/labelled.extxyz").exists());

    set_label_command(serde_json::json!(["no-such-teacher-command"]));
    let o = distill(None, &out).output().unwrap();
    assert!(
        !o.status.success(),
        "a teacher that cannot run must fail the label phase"
    );
    set_label_command(teacher);
    leg(&mut distill(None, &out), Some("train"));
    let s = state(&out).unwrap();
    assert_eq!(done(&s, 1), ["sample", "select", "label"]);
    let labelled = read_extxyz(&out.join("iter-001/labelled.extxyz")).unwrap();
    assert_eq!(labelled.len(), selected.len());
    assert!(labelled.iter().all(|f| f.forces.is_some()));

    set_label_command(serde_json::json!(["no-such-teacher-command"]));
    leg(&mut distill(None, &out), None);
    let s = state(&out).unwrap();
    assert_eq!(
        done(&s, 1),
        ["sample", "select", "label", "train", "evaluate"]
    );
    assert!(
        s["finished"].as_str().unwrap().contains("max_iterations"),
        "{s}"
    );
    assert!(out.join("student.safetensors").exists());
}
