//! The teacher's own MD (a run's first data) as many processes: one per start to relax it,
//! then one per start, temperature and seed number to run its trajectory, up to the
//! teacher's worker count at once, the largest starts first. A trajectory that finished is
//! kept by a later attempt of the same phase; the files are merged in the order one `sample`
//! process over everything would write them.

use super::config::{TeacherConfig, TeacherMd};
use super::teacher::{finish, option_flags, spawn, workers};
use crate::error::{Error, Result};
use crate::io::{read_extxyz, write_extxyz};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

/// One seed structure as the bridge's `sample` takes it.
#[derive(Clone, Debug)]
pub struct TeacherStart {
    pub name: String,
    /// A file, `--smiles NAME=SMILES` or `--cluster NAME=SMILES:N`.
    pub args: Vec<String>,
    /// Flat-bottom wall (Å) of this start's MD, if any.
    pub wall_radius: Option<f64>,
}

/// What the teacher's MD makes: `out_dir/NAME.extxyz` per start (every temperature and seed),
/// the relaxed starts in `start_dir`, and `summary` (per start: atoms, frames, MD steps, the
/// teacher's seconds). Scratch files live in `out_dir/jobs`.
pub struct TeacherMdJob<'a> {
    pub teacher: &'a TeacherConfig,
    pub starts: Vec<TeacherStart>,
    pub temperatures: &'a [f64],
    pub seeds: Vec<u64>,
    pub md: &'a TeacherMd,
    pub out_dir: PathBuf,
    pub start_dir: PathBuf,
    pub summary: PathBuf,
}

/// A process to run: its command line, its log and the summary it writes last (its mark of
/// being done).
struct Task {
    argv: Vec<String>,
    log: PathBuf,
    summary: PathBuf,
}

impl Task {
    /// A summary that parses: the process ended (it writes its summary last).
    fn done(&self) -> Option<Value> {
        let text = std::fs::read_to_string(&self.summary).ok()?;
        serde_json::from_str(&text).ok()
    }
}

/// Runs the tasks not yet done, `workers` at once, in the given order. On a failure (a task
/// that fails or cannot start) the running ones are stopped, what finished stays, and the
/// first failure is returned.
fn run_all(tasks: &[Task], workers: usize, threads: usize) -> Result<()> {
    let mut todo = tasks.iter().filter(|t| t.done().is_none());
    let mut running: Vec<(Child, &Task)> = Vec::new();
    let mut failure = None;
    loop {
        while failure.is_none() && running.len() < workers {
            let Some(t) = todo.next() else { break };
            // A summary a killed attempt left half-written must not pass for done.
            let _ = std::fs::remove_file(&t.summary);
            match spawn(&t.argv, &t.log, threads) {
                Ok(child) => running.push((child, t)),
                Err(e) => failure = Some(e),
            }
        }
        if running.is_empty() {
            break;
        }
        let mut k = 0;
        while k < running.len() {
            let ended = match running[k].0.try_wait() {
                Ok(ended) => ended.is_some(),
                Err(cause) => {
                    failure.get_or_insert(Error::Io {
                        path: running[k].1.log.clone(),
                        cause,
                    });
                    true
                }
            };
            if !ended {
                k += 1;
                continue;
            }
            let (child, t) = running.swap_remove(k);
            if let Err(e) = finish(child, &t.argv, &t.log) {
                failure.get_or_insert(e);
            }
        }
        if failure.is_some() {
            for (mut child, _) in running.drain(..) {
                let _ = child.kill();
                let _ = child.wait();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    failure.map_or(Ok(()), Err)
}

/// The teacher's MD of every start at every temperature and seed (see the module's text).
pub fn teacher_md(job: &TeacherMdJob) -> Result<()> {
    let jobs = job.out_dir.join("jobs");
    for d in [&jobs, &job.start_dir] {
        std::fs::create_dir_all(d).map_err(|cause| Error::Io {
            path: d.to_path_buf(),
            cause,
        })?;
    }
    let teacher = job.teacher;
    let base = |extra: &[String]| {
        let mut argv = teacher.sample_command.clone();
        argv.extend(extra.iter().cloned());
        argv.extend(["--teacher".into(), teacher.name.clone()]);
        argv.extend(option_flags(teacher));
        argv
    };
    let s = |p: &Path| p.display().to_string();
    let workers = workers(teacher);

    let relax: Vec<Task> = job
        .starts
        .iter()
        .map(|st| {
            let mut argv = base(&st.args);
            argv.extend(
                [
                    "--relax-only",
                    "--start-dir",
                    &s(&job.start_dir),
                    "-o",
                    &s(&jobs),
                ]
                .map(String::from),
            );
            let summary = jobs.join(format!("{}.relax.json", st.name));
            argv.extend(["--summary-json".into(), s(&summary)]);
            Task {
                argv,
                log: jobs.join(format!("{}.relax.log", st.name)),
                summary,
            }
        })
        .collect();
    run_all(&relax, workers, teacher.threads)?;
    let relaxed: Vec<Value> = relax.iter().map(|t| t.done().unwrap_or_default()).collect();
    let atoms = |k: usize| relaxed[k]["molecules"][&job.starts[k].name]["atoms"].as_u64();

    // Trajectories of the largest starts first: the longest runs do not end the phase alone.
    let mut order: Vec<usize> = (0..job.starts.len()).collect();
    order.sort_by_key(|&k| std::cmp::Reverse(atoms(k).unwrap_or(0)));
    let md = job.md;
    let traj = |st: &TeacherStart, t: f64, seed: u64| format!("{}_{t}K_s{seed}", st.name);
    let mut tasks = Vec::new();
    for &k in &order {
        let st = &job.starts[k];
        for &t in job.temperatures {
            for &seed in &job.seeds {
                let id = traj(st, t, seed);
                let mut argv = base(&[s(&job.start_dir.join(format!("{}.extxyz", st.name)))]);
                for (flag, v) in [
                    ("--temperatures", t.to_string()),
                    ("--seeds", seed.to_string()),
                    ("--timestep", md.timestep.to_string()),
                    // The bridge takes 1/fs.
                    ("--friction", (md.friction_per_ps / 1000.0).to_string()),
                    ("--equil-steps", md.equil_steps.to_string()),
                    ("--steps", md.steps.to_string()),
                    ("--every", md.every.to_string()),
                    ("-o", s(&jobs.join(&id))),
                    ("--summary-json", s(&jobs.join(format!("{id}.json")))),
                ] {
                    argv.extend([flag.to_string(), v]);
                }
                if let Some(r) = st.wall_radius.or(md.wall_radius) {
                    argv.extend(["--wall-radius".into(), r.to_string()]);
                }
                argv.extend(["--no-optimize".into(), "--overwrite".into()]);
                tasks.push(Task {
                    argv,
                    log: jobs.join(format!("{id}.log")),
                    summary: jobs.join(format!("{id}.json")),
                });
            }
        }
    }
    run_all(&tasks, workers, teacher.threads)?;

    // Merged per start, temperature-major then seed, as one process writes them.
    let mut molecules = serde_json::Map::new();
    let mut version = Value::Null;
    for (k, st) in job.starts.iter().enumerate() {
        let (mut frames, mut steps, mut md_s, mut wall) = (Vec::new(), 0.0, 0.0, 0.0);
        for &t in job.temperatures {
            for &seed in &job.seeds {
                let id = traj(st, t, seed);
                let dir = jobs.join(&id);
                frames.extend(read_extxyz(&dir.join(format!("{}.extxyz", st.name)))?);
                let v: Value = crate::fsutil::read_json(
                    &jobs.join(format!("{id}.json")),
                    "a teacher MD summary",
                )?;
                version = v["teacher"].clone();
                let m = &v["molecules"][&st.name];
                let n = m["md_steps"].as_f64().unwrap_or(0.0);
                steps += n;
                md_s += n * m["teacher_s_per_structure_mean"].as_f64().unwrap_or(0.0);
                wall += m["wall_s"].as_f64().unwrap_or(0.0);
            }
        }
        let out = job.out_dir.join(format!("{}.extxyz", st.name));
        write_extxyz(&out, &frames)?;
        let r = &relaxed[k]["molecules"][&st.name];
        let relax_s = r["teacher_s"].as_f64().unwrap_or(0.0);
        molecules.insert(
            st.name.clone(),
            json!({
                "atoms": atoms(k),
                "formula": r["formula"],
                "trajectories": job.temperatures.len() * job.seeds.len(),
                "frames": frames.len(),
                "md_steps": steps,
                "relax_calls": r["relax_calls"],
                "teacher_s": relax_s + md_s,
                "wall_s": wall + r["wall_s"].as_f64().unwrap_or(0.0),
            }),
        );
    }
    crate::fsutil::write_json(
        &job.summary,
        &json!({"teacher": version, "workers": workers, "molecules": molecules}),
    )
}
