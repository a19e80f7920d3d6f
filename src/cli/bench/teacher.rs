//! The student's speed against its own teacher: `mlff bench --teacher-data FILE`.
//!
//! Labelled frames carry the teacher's wall time per call (`teacher_time_s`, written by
//! teachers/label.py and teachers/sample.py). For each molecule in the files, the student is
//! timed on the same kind of call: one structure in, energy and forces out on the host,
//! neighbour list and transfers included.

use crate::eval::molecule_name;
use crate::io::read_extxyz;
use crate::{Batch, Calculator, Structure};
use anyhow::{bail, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Serialize)]
pub struct TeacherCase {
    pub molecule: String,
    pub atoms: usize,
    pub teacher: String,
    /// Median teacher wall time per structure over the molecule's frames, ms.
    pub teacher_ms: f64,
    pub teacher_frames: usize,
    /// Median student wall time per structure (whole call, host to host), ms.
    pub student_ms: f64,
    pub speedup: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times `calc` on the first frame of every molecule in `files` against the recorded teacher
/// times of all its frames.
pub fn compare(
    calc: &dyn Calculator,
    files: &[PathBuf],
    warmup: usize,
    repeats: usize,
) -> Result<Vec<TeacherCase>> {
    let mut groups: BTreeMap<String, (Structure, String, Vec<f64>)> = BTreeMap::new();
    for path in files {
        for (k, s) in read_extxyz(path)?.into_iter().enumerate() {
            let Some(t) = s.info_value("teacher_time_s") else {
                bail!(
                    "{} frame {k}: no `teacher_time_s` (label the frames with teachers/label.py)",
                    path.display()
                );
            };
            let t: f64 = t.parse().map_err(|_| {
                anyhow::anyhow!(
                    "{} frame {k}: teacher_time_s = `{t}` is not a number",
                    path.display()
                )
            })?;
            let teacher = s.info_value("teacher").unwrap_or("unknown").to_string();
            groups
                .entry(molecule_name(&s))
                .or_insert_with(|| (s, teacher, Vec::new()))
                .2
                .push(t);
        }
    }
    let mut cases = Vec::new();
    for (molecule, (s, teacher, times)) in groups {
        let batch = Batch::new(vec![s])?;
        let mut student = Vec::with_capacity(repeats);
        for k in 0..warmup + repeats {
            let t = Instant::now();
            calc.compute(&batch)?;
            if k >= warmup {
                student.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        let (teacher_ms, student_ms) = (median(times.clone()) * 1e3, median(student));
        cases.push(TeacherCase {
            molecule,
            atoms: batch.n_atoms(),
            teacher,
            teacher_ms,
            teacher_frames: times.len(),
            student_ms,
            speedup: teacher_ms / student_ms,
        });
    }
    Ok(cases)
}

/// The comparison as a markdown table.
pub fn print(cases: &[TeacherCase]) {
    println!("\nstudent vs its teacher (teacher times as recorded in the labels):");
    println!("| molecule | atoms | teacher | teacher ms/structure (median, frames) | student ms/structure | speedup |");
    println!("|---|---:|---|---:|---:|---:|");
    for c in cases {
        println!(
            "| {} | {} | {} | {:.2} ({}) | {:.3} | {:.2}x |",
            c.molecule, c.atoms, c.teacher, c.teacher_ms, c.teacher_frames, c.student_ms, c.speedup
        );
    }
}
