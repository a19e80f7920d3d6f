//! Runs that meet each other or a signal: a second writer of an output is refused while the
//! first completes its file, and SIGINT/SIGTERM make `md` write its restart file and summary
//! and `train` its checkpoint before exiting with 128 + the signal.
#![cfg(unix)]

mod common;

use common::{root, s};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn spawn(dir: &Path, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_mlff"))
        .current_dir(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits (up to a minute) until `ready` holds.
fn wait_for(what: &str, ready: impl Fn() -> bool) {
    let t = Instant::now();
    while !ready() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn lines(p: &Path) -> usize {
    std::fs::read_to_string(p).map_or(0, |t| t.lines().count())
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: sends a signal to our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
}

/// The shipped student and ethanol's start.
fn shipped() -> (PathBuf, PathBuf) {
    (
        root().join("models/painn-gfn2.safetensors"),
        root().join("data/gfn2/start/ethanol.extxyz"),
    )
}

fn md_args<'a>(model: &'a Path, structure: &'a Path, steps: &'a str) -> Vec<&'a str> {
    let mut a = vec!["md", "--model", s(model), "--structure", s(structure)];
    a.extend_from_slice(&["--device", "cpu", "--steps", steps]);
    a
}

#[test]
fn a_second_writer_is_refused_while_the_first_completes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (model, start) = shipped();
    let mut first = md_args(&model, &start, "600");
    first.extend_from_slice(&["--traj", "c.extxyz", "--traj-every", "50"]);
    let first = spawn(d, &first);
    wait_for("the first run's lock", || d.join(".c.extxyz.lock").exists());
    let mut second = md_args(&model, &start, "10");
    second.extend_from_slice(&["--traj", "c.extxyz", "--overwrite"]);
    let o = spawn(d, &second).wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    let holder = format!("being written by another run (pid {}", first.id());
    assert!(err.contains(&holder), "{err}");
    let o = first.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let frames = mlff_distiller::io::read_extxyz(&d.join("c.extxyz")).unwrap();
    assert_eq!(frames.len(), 13, "frames at steps 0, 50, ..., 600");
    assert!(
        !d.join(".c.extxyz.lock").exists(),
        "the lock file is removed at the end"
    );
}

#[test]
fn sigint_stops_md_with_a_restart_and_a_summary() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (model, start) = shipped();
    let mut args = md_args(&model, &start, "1000000");
    args.extend_from_slice(&["--traj", "t.extxyz", "--log", "l.jsonl"]);
    args.extend_from_slice(&["--summary-json", "s.json"]);
    let child = spawn(d, &args);
    wait_for("three log lines", || lines(&d.join("l.jsonl")) >= 3);
    signal(&child, libc::SIGINT);
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("s.json")).unwrap()).unwrap();
    assert_eq!(summary["stop"]["kind"], "interrupted");
    assert_eq!(summary["stop"]["signal"], 2);
    let step = summary["last_step"].as_u64().unwrap();
    // The restart file (written although --restart-every was not given) continues the run.
    let restart = d.join("t.extxyz.restart.json");
    let r = mlff_distiller::md::Restart::load(&restart).unwrap();
    assert_eq!(r.step, step);
    let to = (step + 20).to_string();
    let o = Command::new(env!("CARGO_BIN_EXE_mlff"))
        .args([
            "md",
            "--resume",
            s(&restart),
            "--steps",
            &to,
            "--device",
            "cpu",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let log = mlff_distiller::md::read_log(&d.join("l.jsonl"), u64::MAX).unwrap();
    assert_eq!(log.last().unwrap().step, step + 20);
}

#[test]
fn sigterm_stops_training_with_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let config = common::config_file(
        d,
        r#"{"hidden": 8, "n_blocks": 1, "n_rbf": 4, "cutoff": 4.0, "elements": [1, 6, 7, 8]}"#,
    );
    let data = root().join("data/aspirin_rmd17_10frames.extxyz");
    let mut args = vec!["train", "--train", s(&data), "--val", s(&data), "--config"];
    args.extend_from_slice(&[s(&config), "--epochs", "100000", "--batch-size", "2"]);
    args.extend_from_slice(&["--device", "cpu", "--out", "run"]);
    let child = spawn(d, &args);
    wait_for("an epoch", || lines(&d.join("run/log.jsonl")) >= 1);
    signal(&child, libc::SIGTERM);
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(143),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let ck = mlff_distiller::checkpoint::load(&d.join("run/last.safetensors")).unwrap();
    assert_eq!(ck.provenance["interrupted"]["signal"], 15);
    // The state of the last whole epoch continues the run (one more epoch here).
    let logged = lines(&d.join("run/log.jsonl"));
    let mut again = args.clone();
    again.extend_from_slice(&["--resume", "--max-minutes", "0"]);
    let o = Command::new(env!("CARGO_BIN_EXE_mlff"))
        .current_dir(d)
        .args(&again)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(lines(&d.join("run/log.jsonl")), logged + 1);
}
