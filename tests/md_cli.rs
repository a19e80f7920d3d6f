//! `mlff md` end to end with the shipped student: outputs, summary, resume, ASE reading the
//! trajectory back with the same kinetic energy as our log, clean errors.

mod common;

use common::{ase_available, mlff, root};
use mlff_distiller::md::read_log;
use std::path::Path;

fn md(extra: &[&str]) -> std::process::Output {
    let model = root().join("models/painn-gfn2.safetensors");
    let start = root().join("data/gfn2/start/ethanol.extxyz");
    let mut args = vec![
        "md",
        "--model",
        model.to_str().unwrap(),
        "--structure",
        start.to_str().unwrap(),
        "--device",
        "cpu",
    ];
    args.extend_from_slice(extra);
    mlff(&args)
}

#[test]
fn md_writes_log_trajectory_restart_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_owned();
    let (traj, log, summary) = (p("t.extxyz"), p("l.jsonl"), p("s.json"));
    let o = md(&[
        "--steps",
        "40",
        "--traj",
        &traj,
        "--traj-every",
        "20",
        "--log",
        &log,
        "--restart-every",
        "20",
        "--summary-json",
        &summary,
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    for want in [
        "energy drift",
        "temperature",
        "stability",
        "stable",
        "steps/s",
    ] {
        assert!(stdout.contains(want), "summary lacks `{want}`:\n{stdout}");
    }
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert_eq!(s["last_step"], 40);
    assert_eq!(s["atoms"], 9);
    assert_eq!(s["bonds"], 8, "ethanol has 8 bonds");
    assert!(s["energy_drift_mev_per_atom_ps"].is_f64());

    // Continue to step 60 from the restart written at step 40.
    let restart = format!("{traj}.restart.json");
    let o = mlff(&[
        "md", "--resume", &restart, "--steps", "60", "--device", "cpu",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let records = read_log(Path::new(&log), u64::MAX).unwrap();
    let steps: Vec<u64> = records.iter().map(|r| r.step).collect();
    assert_eq!(steps, (0..=60).step_by(10).collect::<Vec<u64>>());
    let frames = mlff_distiller::io::read_extxyz(Path::new(&traj)).unwrap();
    assert_eq!(frames.len(), 4, "frames at steps 0, 20, 40, 60");

    // Run settings cannot change on resume.
    let o = mlff(&["md", "--resume", &restart, "--dt", "1.0"]);
    assert!(!o.status.success());

    if ase_available() {
        // ASE's kinetic energy from our momenta equals the logged one: same units.
        let script = "import sys, json; from ase.io import read\n\
            fr = read(sys.argv[1], ':')\n\
            print(json.dumps([[int(a.info['step']), a.get_kinetic_energy(), \
            a.get_potential_energy()] for a in fr]))";
        let out = std::process::Command::new("python3")
            .args(["-c", script, &traj])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows: Vec<(u64, f64, f64)> = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(rows.len(), 4);
        for (step, e_kin, e_pot) in rows {
            let r = records.iter().find(|r| r.step == step).unwrap();
            assert!(
                (e_kin - r.e_kin).abs() < 1e-9 * r.e_kin.abs().max(1.0),
                "step {step}"
            );
            assert!(
                (e_pot - r.e_pot).abs() < 1e-9 * r.e_pot.abs(),
                "step {step}"
            );
        }
    }
}

#[test]
fn md_errors_name_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_owned();
    let bad = dir.path().join("no-such-dir/t.extxyz");
    let o = md(&["--steps", "5", "--traj", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no-such-dir/t.extxyz"), "{err}");

    let o = md(&["--steps", "5", "--frame", "3"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("has 1 frames, no frame 3"), "{err}");

    let o = md(&["--ensemble", "nvt", "--friction", "0"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("friction"), "{err}");

    // An output in a missing folder is refused naming its flag, before the run, not after it.
    let missing = dir.path().join("missing/s.json");
    let o = md(&[
        "--steps",
        "5",
        "--summary-json",
        missing.to_str().unwrap(),
        "--log",
        &p("l"),
    ]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--summary-json") && err.contains("missing"),
        "{err}"
    );
    assert!(!dir.path().join("l").exists(), "the run started");

    // Intervals of 0 steps would write nothing: refused naming the flag, before any output.
    let traj = dir.path().join("t.extxyz");
    for flag in ["--traj-every", "--log-every"] {
        let o = md(&["--steps", "5", "--traj", traj.to_str().unwrap(), flag, "0"]);
        assert_eq!(o.status.code(), Some(2), "{flag}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(flag) && err.contains("'0'"), "{err}");
        assert!(!traj.exists(), "{flag} 0 opened the trajectory");
    }

    // CUDA graphs on the CPU: refused with the reason, before any step.
    let o = md(&["--steps", "5", "--graphs", "on"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--graphs on:"), "{err}");
}

#[test]
fn validate_md_compares_code_paths_in_one_report() {
    let dir = tempfile::tempdir().unwrap();
    let model = root().join("models/painn-gfn2.safetensors");
    let out = dir.path().join("report");
    let report = |out: &Path, args: &[&str]| {
        let mut all = vec!["validate-md", "--model", model.to_str().unwrap()];
        all.extend_from_slice(args);
        all.extend([
            "--traj-every",
            "0",
            "--device",
            "cpu",
            "--out",
            out.to_str().unwrap(),
        ]);
        let o = mlff(&all);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
        json
    };
    let json = report(
        &out,
        &[
            "--backend",
            "stock,fused",
            "--systems",
            "ethanol,water8",
            "--jobs",
            "2",
            "--nve-steps",
            "10,20",
            "--nvt-steps",
            "10",
        ],
    );
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    let rows: Vec<&str> = md
        .lines()
        .filter(|l| l.starts_with("| ethanol |"))
        .collect();
    // Two variants × (NVE over 10 and 20 steps, NVT over 10).
    assert_eq!(rows.len(), 6, "{md}");
    assert!(rows
        .iter()
        .any(|r| r.contains("painn-gfn2/stock") && r.contains("20/20")));
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 8);
    // Same model, same seed: the two code paths agree on the trajectory's energies.
    let drift = |k: usize| {
        runs[k]["windows"][1]["energy_std_mev_per_atom"]
            .as_f64()
            .unwrap()
    };
    assert!((drift(0) - drift(2)).abs() < 0.05 * drift(0).abs().max(1e-3));
    assert!(out.join("etot_ethanol.png").exists());
    assert!(out.join("runs/ethanol_painn-gfn2-fused_nve.jsonl").exists());
    assert_eq!(json["settings"]["neighbor_list"], "auto");

    // --batched: every system in one run per variant and ensemble, the same report and files.
    let batched_out = dir.path().join("batched");
    let batched = report(
        &batched_out,
        &[
            "--backend",
            "stock,fused",
            "--systems",
            "ethanol,water8",
            "--batched",
            "--nve-steps",
            "10,20",
            "--nvt-steps",
            "10",
        ],
    );
    let batched_runs = batched["runs"].as_array().unwrap();
    assert_eq!(batched_runs.len(), runs.len());
    for (a, b) in runs.iter().zip(batched_runs) {
        for key in ["system", "variant", "ensemble"] {
            assert_eq!(a[key], b[key]);
        }
        // The same seed per system: the same trajectory, to the batched call's rounding.
        let e = |r: &serde_json::Value| r["windows"][0]["temperature_mean"].as_f64().unwrap();
        assert!((e(a) - e(b)).abs() < 1e-3 * e(a), "{} vs {}", e(a), e(b));
    }
    let log = "runs/water8_painn-gfn2-fused_nvt.jsonl";
    let lines = |d: &Path| {
        std::fs::read_to_string(d.join(log))
            .unwrap()
            .lines()
            .count()
    };
    assert_eq!(lines(&batched_out), lines(&out));
    assert!(!batched_out.join("runs").read_dir().unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(".batch")
    }));

    // The device list (its CPU twin here), as `mlff md --neighbor-list device`.
    let device_out = dir.path().join("device-list");
    let json = report(
        &device_out,
        &[
            "--backend",
            "fused",
            "--systems",
            "ethanol",
            "--nve-steps",
            "20",
            "--nvt-steps",
            "0",
            "--neighbor-list",
            "device",
        ],
    );
    assert_eq!(json["settings"]["neighbor_list"], "device");
    // Same trajectory as the host list's run above (the lists hold the same edges).
    // The 20-step NVE window: the host run's second, the device run's only one.
    let e =
        |run: &serde_json::Value, w: usize| run["windows"][w]["energy_std_mev_per_atom"].as_f64();
    let host_fused = runs
        .iter()
        .find(|r| {
            r["system"] == "ethanol" && r["variant"] == "painn-gfn2/fused" && r["ensemble"] == "nve"
        })
        .unwrap();
    assert_eq!(e(&json["runs"][0], 0), e(host_fused, 1));

    let o = mlff(&[
        "validate-md",
        "--systems",
        "unobtainium",
        "--out",
        out.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("unobtainium") && err.contains("ethanol"),
        "{err}"
    );
}

#[test]
fn profile_writes_its_report_plots_and_trace() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("profile");
    let trace = dir.path().join("trace.json");
    let model = root().join("models/painn-gfn2.safetensors");
    let start = root().join("data/gfn2/start/ethanol.extxyz");
    let o = mlff(&[
        "profile",
        model.to_str().unwrap(),
        start.to_str().unwrap(),
        "--steps",
        "20",
        "--warmup",
        "2",
        "--memory-every",
        "5",
        "--device",
        "cpu",
        "--out",
        out.to_str().unwrap(),
        "--trace",
        trace.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    for want in [
        "whole call",
        "backward",
        "Hotspots",
        "own host time",
        "End to end",
        "no leak",
    ] {
        assert!(stdout.contains(want), "`{want}` missing:\n{stdout}");
    }
    let report = mlff_distiller::profiler::ProfileReport::load(&out.join("profile.json")).unwrap();
    assert_eq!(report.calls, 21, "the starting forces and 20 steps");
    assert_eq!(report.memory.len(), 5, "steps 0, 5, .., 20");
    for f in ["report.md", "latency_histogram.png", "memory.png"] {
        assert!(out.join(f).exists(), "{f}");
    }
    let t: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    assert!(t["traceEvents"].as_array().unwrap().len() > 21 * 4);
}

/// Ethanol and benzene, one frame each.
fn two_molecules(dir: &Path) -> std::path::PathBuf {
    let start = root().join("data/gfn2/start");
    let mut text = std::fs::read_to_string(start.join("ethanol.extxyz")).unwrap();
    text += &std::fs::read_to_string(start.join("benzene.extxyz")).unwrap();
    let path = dir.join("two.extxyz");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn md_runs_many_systems_with_one_trajectory_each_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_owned();
    let structure = two_molecules(dir.path());
    let model = root().join("models/painn-gfn2.safetensors");
    let (traj, log, summary) = (format!("{}/", p("runs")), p("l.jsonl"), p("s.json"));
    let args = |extra: &[&str]| {
        let mut v: Vec<String> = [
            "md",
            "--model",
            model.to_str().unwrap(),
            "--structure",
            structure.to_str().unwrap(),
            "--device",
            "cpu",
            "--ensemble",
            "nvt",
        ]
        .map(String::from)
        .to_vec();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let run = |v: Vec<String>| mlff(&v.iter().map(String::as_str).collect::<Vec<_>>());
    let o = run(args(&[
        "--all-frames",
        "--replicas",
        "2",
        "--steps",
        "20",
        "--traj",
        &traj,
        "--traj-every",
        "10",
        "--log",
        &log,
        "--restart-every",
        "10",
        "--summary-json",
        &summary,
    ]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        stdout.contains("atom-steps/s") && stdout.contains("4 of 4 systems stable"),
        "{stdout}"
    );
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    let atoms: Vec<u64> = (0..4)
        .map(|k| s["systems"][k]["atoms"].as_u64().unwrap())
        .collect();
    assert_eq!(atoms, [9, 9, 12, 12], "ethanol twice, then benzene twice");
    for k in 0..4 {
        let t = mlff_distiller::md::system_traj(Path::new(&traj), k);
        let frames = mlff_distiller::io::read_extxyz(&t).unwrap();
        assert_eq!(frames.len(), 3, "system {k}: frames at 0, 10, 20");
        assert_eq!(frames[2].info_value("system"), Some(k.to_string().as_str()));
    }
    // Replicas of one molecule start from different velocities (seeds --seed + k).
    let rows: Vec<mlff_distiller::md::BatchLogRecord> =
        mlff_distiller::md::read_log_as(Path::new(&log), u64::MAX).unwrap();
    assert_eq!(rows.len(), 4 * 3);
    assert_ne!(rows[0].record.e_kin, rows[1].record.e_kin);

    let restart = format!("{traj}restart.json");
    let o = mlff(&[
        "md", "--resume", &restart, "--steps", "30", "--device", "cpu",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows: Vec<mlff_distiller::md::BatchLogRecord> =
        mlff_distiller::md::read_log_as(Path::new(&log), u64::MAX).unwrap();
    assert_eq!(rows.len(), 4 * 4);
    assert!(rows[12..].iter().all(|r| r.record.step == 30));

    // One shared trajectory, frames keyed by system; an existing one is refused.
    let shared = p("shared.extxyz");
    let o = run(args(&[
        "--replicas",
        "3",
        "--steps",
        "10",
        "--traj",
        &shared,
        "--traj-every",
        "10",
    ]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let frames = mlff_distiller::io::read_extxyz(Path::new(&shared)).unwrap();
    let keys: Vec<&str> = frames
        .iter()
        .map(|f| f.info_value("system").unwrap())
        .collect();
    assert_eq!(keys, ["0", "1", "2", "0", "1", "2"]);
    let o = run(args(&[
        "--replicas",
        "3",
        "--steps",
        "10",
        "--traj",
        &shared,
    ]));
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--traj"));
    assert_eq!(
        mlff_distiller::io::read_extxyz(Path::new(&shared))
            .unwrap()
            .len(),
        6
    );

    for (bad, why) in [
        (vec!["--replicas", "0"], "--replicas"),
        (vec!["--all-frames", "--frame", "1"], "--frame"),
    ] {
        let o = run(args(&bad));
        assert!(!o.status.success(), "{bad:?} was accepted");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(why), "{bad:?}: {err}");
    }
}

/// The shipped water cluster in a periodic box.
fn water_box(dir: &Path) -> std::path::PathBuf {
    let water = mlff_distiller::io::read_extxyz(&root().join("data/gfn2/start/water8.extxyz"))
        .unwrap()
        .remove(0);
    let boxed = mlff_distiller::Structure {
        cell: Some([[14.0, 0.0, 0.0], [0.0, 14.0, 0.0], [0.0, 0.0, 14.0]]),
        pbc: [true; 3],
        ..water
    };
    let path = dir.join("water_box.extxyz");
    mlff_distiller::io::write_extxyz(&path, &[boxed]).unwrap();
    path
}

/// `--ensemble npt`: the log gains volume, density, pressure and the effective energy, the
/// frames carry the moving cell, the summary the volume; a molecule or a bad barostat flag
/// is refused by name, before anything is written.
#[test]
fn md_runs_at_constant_pressure() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_owned();
    let model = root().join("models/painn-gfn2.safetensors");
    let start = water_box(dir.path());
    let (traj, log, summary) = (p("t.extxyz"), p("l.jsonl"), p("s.json"));
    let npt = |extra: &[&str], structure: &str| {
        let mut args = vec![
            "md",
            "--model",
            model.to_str().unwrap(),
            "--structure",
            structure,
            "--device",
            "cpu",
            "--ensemble",
            "npt",
            "--temperature",
            "300",
            "--steps",
            "20",
        ];
        args.extend_from_slice(extra);
        mlff(&args)
    };
    let o = npt(
        &[
            "--pressure",
            "2000",
            "--barostat-time",
            "100",
            "--compressibility",
            "1e-3",
            "--traj",
            &traj,
            "--traj-every",
            "10",
            "--log",
            &log,
            "--log-every",
            "5",
            "--summary-json",
            &summary,
        ],
        start.to_str().unwrap(),
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains("NPT (300 K Langevin, 2000 bar") && stdout.contains("volume:"),
        "{stdout}\n{stderr}"
    );
    let rows = read_log(Path::new(&log), u64::MAX).unwrap();
    assert_eq!(rows.len(), 5);
    for r in &rows {
        let (v, rho) = (r.volume.unwrap(), r.density.unwrap());
        // 8 waters: 144.12 amu.
        assert!((rho - 144.12 * 1.660_539 / v).abs() < 1e-3 * rho, "{r:?}");
        assert!(r.pressure_bar.is_some() && r.e_eff.is_some(), "{r:?}");
    }
    assert_eq!(rows[0].volume, Some(14f64.powi(3)));
    assert_ne!(rows[4].volume, rows[0].volume, "the cell never moved");
    let frames = mlff_distiller::io::read_extxyz(Path::new(&traj)).unwrap();
    let v_last = mlff_distiller::structure::volume(&frames[2].cell.unwrap());
    assert!((v_last - rows[4].volume.unwrap()).abs() < 1e-6, "{v_last}");
    let s: serde_json::Value = serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert_eq!(s["ensemble"], "npt");
    assert!(s["volume_mean_a3"].as_f64().is_some(), "{s}");

    let ethanol = root().join("data/gfn2/start/ethanol.extxyz");
    let o = npt(&["--log", &p("m.jsonl")], ethanol.to_str().unwrap());
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("constant pressure needs a cell periodic"),
        "{err}"
    );
    let o = npt(
        &["--barostat-time", "0", "--log", &p("m.jsonl")],
        start.to_str().unwrap(),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--barostat-time 0"), "{err}");
    let o = npt(
        &["--graphs", "on", "--log", &p("m.jsonl")],
        start.to_str().unwrap(),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("constant-pressure steps run op by op"),
        "{err}"
    );
    assert!(!dir.path().join("m.jsonl").exists());
    // Two replicas at constant pressure in one run: each logs its own volume.
    let o = npt(
        &[
            "--replicas",
            "2",
            "--log",
            &p("r.jsonl"),
            "--log-every",
            "10",
        ],
        start.to_str().unwrap(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(p("r.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 6, "{rows:?}");
    let last: Vec<f64> = rows[4..]
        .iter()
        .map(|r| r["volume"].as_f64().unwrap())
        .collect();
    assert!(
        last[0] != last[1] && last.iter().all(|&v| v != 14f64.powi(3)),
        "{rows:?}"
    );
    // The device list serves one cell: a batch whose cells move apart cannot keep it.
    let o = npt(
        &[
            "--replicas",
            "2",
            "--neighbor-list",
            "device",
            "--log",
            &p("d.jsonl"),
        ],
        start.to_str().unwrap(),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--neighbor-list device: the device neighbour list"),
        "{err}"
    );
    assert!(!dir.path().join("d.jsonl").exists());
}

/// `--bond-limit` is the stability criterion: a run stops at the first logged step whose
/// largest bond deviation exceeds it (the same trajectory, seed for seed, as a run under the
/// default limit up to there), in single and batch runs; the summaries say which limit
/// judged them; a limit that is not a positive length is refused before the run.
#[test]
fn the_bond_limit_decides_stability_in_single_and_batch_runs() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n).to_str().unwrap().to_owned();
    let run = |log: &str, summary: &str, extra: &[&str]| {
        let mut args = vec!["--ensemble", "nvt", "--temperature", "600", "--steps", "40"];
        args.extend(["--seed", "3", "--log-every", "1", "--log", log]);
        args.extend(["--summary-json", summary]);
        args.extend_from_slice(extra);
        md(&args)
    };
    let json = |path: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    };
    let o = run(&p("a.jsonl"), &p("a.json"), &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let a = json(&p("a.json"));
    assert_eq!(a["bond_limit"].as_f64(), Some(0.5));
    let worst = a["max_bond_deviation"].as_f64().unwrap();
    assert!(worst > 0.01 && worst < 0.5, "{a}");

    let limit = worst / 2.0;
    let limit_arg = limit.to_string();
    let exits_unstable = |o: &std::process::Output| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(4), "{err}");
    };
    let o = run(&p("b.jsonl"), &p("b.json"), &["--bond-limit", &limit_arg]);
    exits_unstable(&o);
    let b = json(&p("b.json"));
    assert_eq!(b["bond_limit"].as_f64(), Some(limit));
    assert_eq!(b["stable"], false);
    let first_over = read_log(Path::new(&p("a.jsonl")), u64::MAX)
        .unwrap()
        .iter()
        .find(|r| r.bond_deviation > limit)
        .map(|r| r.step)
        .unwrap();
    assert_eq!(b["stop"]["kind"], "unstable", "{b}");
    assert_eq!(b["stop"]["step"].as_u64(), Some(first_over), "{b}");

    // Two replicas of the molecule in one batch: both stop under the limit the single run broke.
    let o = run(
        &p("c.jsonl"),
        &p("c.json"),
        &["--replicas", "2", "--bond-limit", &limit_arg],
    );
    exits_unstable(&o);
    let c = json(&p("c.json"));
    assert_eq!(c["bond_limit"].as_f64(), Some(limit));
    assert_eq!(c["stable_systems"].as_u64(), Some(0), "{c}");

    for bad in ["--bond-limit=0", "--bond-limit=-1", "--bond-limit=nan"] {
        let o = run(&p("d.jsonl"), &p("d.json"), &[bad]);
        assert_eq!(o.status.code(), Some(1), "{bad}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("bond limit"), "{err}");
        assert!(
            !dir.path().join("d.jsonl").exists(),
            "{bad}: the run started"
        );
    }
}
