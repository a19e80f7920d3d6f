//! The teacher as processes for `mlff distill`: its MD in many processes against one, failures
//! named with their logs, the teacher's time, the scratch folders of dead labelling runs.

mod common;

use mlff_distiller::io::read_extxyz;
use mlff_distiller::structure::Structure;
use serde_json::Value;
use std::process::{Command, Stdio};

fn molecule(positions: Vec<[f64; 3]>) -> Structure {
    Structure::molecule(vec![6; positions.len()], positions)
}

/// Frames without the teacher's wall time (which differs from run to run).
fn untimed(mut frames: Vec<Structure>) -> Vec<Structure> {
    for f in &mut frames {
        f.info.retain(|(k, _)| k != "teacher_time_s");
    }
    frames
}

#[test]
fn teacher_md_in_many_processes_equals_one_process_and_keeps_finished_trajectories() {
    if !common::bridge_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("c7.xyz"), common::C7_XYZ).unwrap();
    std::fs::write(
        d.join("c4.xyz"),
        "4\nProperties=species:S:1:pos:R:3\nC 0.0 0.0 0.0\nC 1.6 0.0 0.0\nC 0.8 1.386 0.0\n\
         C 0.8 0.462 1.306\n",
    )
    .unwrap();
    let script = common::root()
        .join("teachers/sample.py")
        .display()
        .to_string();
    let teacher = mlff_distiller::distill::TeacherConfig {
        name: "morse".into(),
        sample_command: vec!["python3".into(), script.clone()],
        workers: 3,
        ..Default::default()
    };
    let md = mlff_distiller::distill::TeacherMd {
        equil_steps: 20,
        steps: 60,
        every: 10,
        ..Default::default()
    };
    let start = |name: &str, wall_radius| mlff_distiller::distill::TeacherStart {
        name: name.into(),
        args: vec![d.join(format!("{name}.xyz")).display().to_string()],
        wall_radius,
    };
    let out = d.join("md");
    let job = mlff_distiller::distill::TeacherMdJob {
        teacher: &teacher,
        starts: vec![start("c4", None), start("c7", Some(2.5))],
        temperatures: &[300.0, 600.0],
        seeds: vec![0, 1, 2],
        md: &md,
        out_dir: out.clone(),
        start_dir: d.join("starts"),
        summary: d.join("summary.json"),
    };
    mlff_distiller::distill::teacher_md(&job).unwrap();
    let merged = |name: &str| read_extxyz(&out.join(format!("{name}.extxyz"))).unwrap();
    let c7 = merged("c7");
    assert_eq!(c7.len(), 2 * 3 * 6);
    assert!(c7
        .iter()
        .all(|f| f.info_value("wall_radius_A") == Some("2.5")));
    assert!(merged("c4")
        .iter()
        .all(|f| f.info_value("wall_radius_A").is_none()));
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(d.join("summary.json")).unwrap()).unwrap();
    let c7s = &summary["molecules"]["c7"];
    // Per trajectory: the first call, then one per step.
    assert_eq!(c7s["md_steps"].as_f64(), Some(6.0 * 81.0), "{summary}");
    assert!(c7s["teacher_s"].as_f64().unwrap() > 0.0, "{summary}");

    // One process over every temperature and seed, from the same relaxed starts.
    for name in ["c4", "c7"] {
        let serial = d.join("serial");
        let mut cmd = Command::new("python3");
        cmd.arg(&script)
            .arg(d.join("starts").join(format!("{name}.extxyz")))
            .args([
                "--teacher",
                "morse",
                "--no-optimize",
                "--temperatures",
                "300",
                "600",
            ])
            .args([
                "--seeds",
                "0",
                "1",
                "2",
                "--friction",
                "0.01",
                "--equil-steps",
                "20",
            ])
            .args(["--steps", "60", "--every", "10", "--overwrite", "-o"])
            .arg(&serial);
        if name == "c7" {
            cmd.args(["--wall-radius", "2.5"]);
        }
        assert!(cmd.stdout(Stdio::null()).status().unwrap().success());
        let one = read_extxyz(&serial.join(format!("{name}.extxyz"))).unwrap();
        assert_eq!(untimed(one), untimed(merged(name)), "{name}");
    }

    // A second attempt keeps what finished (a marked file stays) and redoes what did not.
    let jobs = out.join("jobs");
    let kept = jobs.join("c7_300K_s0/c7.extxyz");
    let mut marked = read_extxyz(&kept).unwrap();
    marked[0].info.push(("kept".into(), "yes".into()));
    mlff_distiller::io::write_extxyz(&kept, &marked).unwrap();
    std::fs::remove_file(jobs.join("c7_600K_s1.json")).unwrap();
    std::fs::remove_file(jobs.join("c7_600K_s1/c7.extxyz")).unwrap();
    mlff_distiller::distill::teacher_md(&job).unwrap();
    let again = merged("c7");
    assert_eq!(again[0].info_value("kept"), Some("yes"));
    assert_eq!(untimed(again[1..].to_vec()), untimed(c7[1..].to_vec()));
}

#[test]
fn a_failing_teacher_md_is_named_with_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let md = mlff_distiller::distill::TeacherMd::default();
    let run = |command: &[&str]| {
        let teacher = mlff_distiller::distill::TeacherConfig {
            sample_command: command.iter().map(|s| s.to_string()).collect(),
            workers: 2,
            ..Default::default()
        };
        let start = |name: &str| mlff_distiller::distill::TeacherStart {
            name: name.into(),
            args: vec![format!("{name}.xyz")],
            wall_radius: None,
        };
        let job = mlff_distiller::distill::TeacherMdJob {
            teacher: &teacher,
            starts: vec![start("a"), start("b"), start("c")],
            temperatures: &[300.0],
            seeds: vec![0],
            md: &md,
            out_dir: dir.path().join("md"),
            start_dir: dir.path().join("starts"),
            summary: dir.path().join("summary.json"),
        };
        mlff_distiller::distill::teacher_md(&job)
            .unwrap_err()
            .to_string()
    };
    let err = run(&["sh", "-c", "echo no teacher here; exit 3", "sh"]);
    assert!(
        err.contains("exit status: 3") && err.contains("no teacher here"),
        "{err}"
    );
    assert!(err.contains(".relax.log"), "{err}");
    let err = run(&["/nonexistent/teacher"]);
    assert!(err.contains("could not start the teacher command"), "{err}");
}

#[test]
fn a_failing_teacher_is_named_with_its_log_and_gets_its_threads() {
    let dir = tempfile::tempdir().unwrap();
    let teacher = mlff_distiller::distill::TeacherConfig {
        label_command: ["sh", "-c", "echo threads=$OMP_NUM_THREADS; exit 3", "sh"]
            .map(String::from)
            .to_vec(),
        threads: 3,
        workers: 1,
        ..Default::default()
    };
    let frames = vec![molecule(vec![[0.0; 3], [1.5, 0.0, 0.0]])];
    let err = mlff_distiller::distill::label(&teacher, &frames, &dir.path().join("w"), 0)
        .unwrap_err()
        .to_string();
    assert!(err.contains("sh -c"), "{err}");
    assert!(err.contains("exit status: 3"), "{err}");
    assert!(err.contains("threads=3"), "{err}");
    assert!(err.contains("part-0.log"), "{err}");
}

#[test]
fn the_teachers_time_counts_its_hessian_vector_calls() {
    let mut a = molecule(vec![[0.0; 3]]);
    a.info.push(("teacher_time_s".into(), "0.25".into()));
    let mut b = a.clone();
    b.info.push(("hvp_time_s".into(), "0.5".into()));
    let c = molecule(vec![[0.0; 3]]);
    assert_eq!(mlff_distiller::distill::teacher_seconds(&[a, b, c]), 1.0);
}

#[test]
fn scratch_folders_of_dead_labelling_runs_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let own = std::process::id();
    for name in [
        format!("label-work-{dead}"),
        format!("label-work-{own}"),
        "student-0".into(),
    ] {
        std::fs::create_dir(dir.path().join(name)).unwrap();
    }
    mlff_distiller::distill::clean_stale_work(dir.path(), "label-work-");
    assert!(!dir.path().join(format!("label-work-{dead}")).exists());
    assert!(dir.path().join(format!("label-work-{own}")).exists());
    assert!(dir.path().join("student-0").exists());
}
