//! The phases of an iteration: each reads what earlier phases wrote into the run's folder,
//! writes its own files whole (a killed phase is simply run again) and records its numbers in
//! the state.

use super::training::{committee, mlff, s};
use super::Run;
use crate::calculator::{Calculator, PainnCalculator};
use crate::distill::{self as d, GroupErrors, HeldOut, Phase, RunState, StabilityRow};
use crate::eval::{evaluate, molecule_name};
use crate::io::{read_extxyz, write_extxyz};
use crate::structure::Structure;
use anyhow::{bail, Context, Result};
use candle_core::DType;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

const BATCH: usize = 32;

pub(super) fn run_phase(
    run: &Run,
    state: &mut RunState,
    i: usize,
    phase: Phase,
) -> Result<ExitCode> {
    let dir = run.iter_dir(i);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    match phase {
        Phase::TeacherMd => teacher_md(run, state),
        Phase::Sample => return sample(run, state, i),
        Phase::Select => select(run, state, i),
        Phase::Label => label(run, state, i),
        Phase::Train => return committee(run, state, &labelled_files(run, state, i + 1), i),
        Phase::Evaluate => return evaluate_student(run, state, i),
    }?;
    Ok(ExitCode::SUCCESS)
}

/// The seed structures in order, as the bridge's `sample` takes them.
fn teacher_starts(run: &Run) -> Vec<d::TeacherStart> {
    run.cfg
        .seeds
        .iter()
        .map(|seed| {
            let args = if let Some(f) = &seed.file {
                vec![s(&run.out.join(f))]
            } else if let Some(smiles) = &seed.smiles {
                vec!["--smiles".into(), format!("{}={smiles}", seed.name)]
            } else if let Some(spec) = &seed.cluster {
                vec!["--cluster".into(), format!("{}={spec}", seed.name)]
            } else {
                vec![]
            };
            d::TeacherStart {
                name: seed.name.clone(),
                args,
                wall_radius: seed.wall_radius,
            }
        })
        .collect()
}

fn tagged(mut frames: Vec<Structure>, key: &str, value: &str) -> Vec<Structure> {
    for f in &mut frames {
        d::set_info(f, key, value);
    }
    frames
}

/// Iteration 0: the teacher's MD from every seed at every temperature, one trajectory per
/// seed of teacher_md; split by seed into training, validation and test frames.
fn teacher_md(run: &Run, state: &mut RunState) -> Result<()> {
    let md = &run.cfg.teacher_md;
    let seeds: Vec<u64> = [&md.train_seeds, &md.val_seeds, &md.test_seeds]
        .into_iter()
        .flatten()
        .copied()
        .collect();
    let out_dir = run.data("teacher-md");
    let start_dir = run.data("start-geometries");
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", s(&out_dir)))?;
    let summary = run.data("teacher-md.summary.json");
    d::teacher_md(&d::TeacherMdJob {
        teacher: &run.cfg.teacher,
        starts: teacher_starts(run),
        temperatures: &run.cfg.temperatures,
        seeds,
        md,
        out_dir: out_dir.clone(),
        start_dir: start_dir.clone(),
        summary: summary.clone(),
    })?;
    let (mut train, mut val, mut test, mut starts) = (vec![], vec![], vec![], vec![]);
    for seed in &run.cfg.seeds {
        let name = &seed.name;
        let frames = tagged(
            read_extxyz(&out_dir.join(format!("{name}.extxyz")))?,
            "molecule",
            name,
        );
        for f in frames {
            let traj = f.info_value("trajectory").unwrap_or_default().to_string();
            let k: Option<u64> = traj.rsplit_once("_s").and_then(|(_, k)| k.parse().ok());
            match k {
                Some(k) if md.train_seeds.contains(&k) => train.push(f),
                Some(k) if md.val_seeds.contains(&k) => val.push(f),
                Some(k) if md.test_seeds.contains(&k) => test.push(f),
                _ => bail!(
                    "{}: frame of trajectory `{traj}` names no seed of teacher_md",
                    s(&out_dir.join(format!("{name}.extxyz")))
                ),
            }
        }
        let start = read_extxyz(&start_dir.join(format!("{name}.extxyz")))?;
        starts.extend(tagged(
            start.into_iter().take(1).collect(),
            "molecule",
            name,
        ));
    }
    let labelled = run.iter_dir(0).join("labelled.extxyz");
    write_extxyz(&labelled, &train)?;
    write_extxyz(&run.data("val.extxyz"), &val)?;
    write_extxyz(&run.data("test.extxyz"), &test)?;
    write_extxyz(&run.data("start.extxyz"), &starts)?;
    // The teacher's time is every call (relaxations and MD steps), not only the kept frames'.
    let v: serde_json::Value = crate::fsutil::read_json(&summary, "a teacher sample summary")?;
    let teacher_s: f64 = v["molecules"]
        .as_object()
        .map(|m| {
            m.values()
                .map(|x| x["teacher_s"].as_f64().unwrap_or(0.0))
                .sum()
        })
        .unwrap_or(0.0);
    let it = state.iteration(0);
    it.new_frames = train.len();
    it.total_frames = train.len();
    it.teacher_s = teacher_s;
    it.teacher_s_total = teacher_s;
    eprintln!(
        "   teacher MD: {} training, {} validation, {} test frames; {:.1} s of teacher time",
        train.len(),
        val.len(),
        test.len(),
        teacher_s
    );
    Ok(())
}

/// NVT of the student from every start (`replicas` copies each) in one batched `mlff md`.
struct StudentMd<'a> {
    model: &'a Path,
    replicas: u64,
    temperature: f64,
    friction_per_ps: f64,
    timestep: f64,
    steps: u64,
    seed: u64,
    /// The trajectory and its frame interval.
    traj: Option<(&'a Path, u64)>,
    summary: &'a Path,
}

/// Runs `md`; `Some(status)` where the run ended other than completed or unstable (status 4:
/// a system went unstable, which the caller reads from the summary).
fn student_md(run: &Run, md: &StudentMd) -> Result<Option<ExitCode>> {
    let mut args: Vec<String> = vec!["md".into(), "--model".into(), s(md.model)];
    let pairs = [
        ("--structure", s(&run.data("start.extxyz"))),
        ("--replicas", md.replicas.to_string()),
        ("--ensemble", "nvt".into()),
        ("--temperature", md.temperature.to_string()),
        ("--friction", md.friction_per_ps.to_string()),
        ("--dt", md.timestep.to_string()),
        ("--steps", md.steps.to_string()),
        ("--seed", md.seed.to_string()),
        ("--summary-json", s(md.summary)),
        // In the run's folder: by default a run without --traj claims mlff-md.restart.json
        // in the working directory, where two loops (or a user's own md) would collide.
        (
            "--restart-file",
            s(&md.summary.with_extension("restart.json")),
        ),
        ("--bond-limit", run.cfg.stability.bond_limit.to_string()),
    ];
    for (flag, v) in pairs {
        args.extend([flag.to_string(), v]);
    }
    args.extend(run.device_flags());
    if let Some((traj, every)) = md.traj {
        args.extend([
            "--traj".into(),
            s(traj),
            "--traj-every".into(),
            every.to_string(),
        ]);
    }
    args.extend(["--all-frames".into(), "--overwrite".into()]);
    let code = mlff(args)?;
    let unstable = ExitCode::from(super::super::md::EXIT_UNSTABLE);
    Ok((code != ExitCode::SUCCESS && code != unstable).then_some(code))
}

/// The molecule of each system of a batch run from data/start.extxyz with `replicas` copies.
fn start_molecules(run: &Run) -> Result<Vec<String>> {
    Ok(read_extxyz(&run.data("start.extxyz"))?
        .iter()
        .map(molecule_name)
        .collect())
}

fn calculator(run: &Run, path: &Path) -> Result<PainnCalculator> {
    Ok(PainnCalculator::from_checkpoint(
        path,
        &run.dev,
        DType::F32,
    )?)
}

/// Student MD at every temperature and rattle-and-relax children, unlabelled, without close
/// contacts: the candidates of iteration `i`.
fn sample(run: &Run, state: &mut RunState, i: usize) -> Result<ExitCode> {
    let smp = &run.cfg.sampling;
    let student = run.student(i - 1, 0);
    let molecules = start_molecules(run)?;
    let md_dir = run.iter_dir(i).join("md");
    std::fs::create_dir_all(&md_dir).with_context(|| format!("creating {}", s(&md_dir)))?;
    let mut candidates = Vec::new();
    for (ti, t) in run.cfg.temperatures.iter().enumerate() {
        let traj = md_dir.join(format!("T{t}.extxyz"));
        let md = StudentMd {
            model: &student,
            replicas: smp.replicas,
            temperature: *t,
            friction_per_ps: smp.friction_per_ps,
            timestep: smp.timestep,
            steps: smp.steps,
            seed: (1000 * i + ti) as u64,
            traj: Some((&traj, smp.every)),
            summary: &md_dir.join(format!("T{t}.summary.json")),
        };
        if let Some(code) = student_md(run, &md)? {
            return Ok(code);
        }
        // A system that went unstable left its frames up to then: the most telling ones.
        for f in read_extxyz(&traj)? {
            if f.info_value("step") == Some("0") {
                continue;
            }
            let system: usize = f
                .info_value("system")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let mut c = d::unlabelled(&f);
            c.info.clear();
            let mol = &molecules[(system / smp.replicas as usize).min(molecules.len() - 1)];
            d::set_info(&mut c, "molecule", mol);
            d::set_info(&mut c, "source", "md");
            d::set_info(&mut c, "temperature_K", &t.to_string());
            candidates.push(c);
        }
    }
    if smp.rattle_per_molecule > 0 {
        let calc = calculator(run, &student)?;
        let labelled = labelled_so_far(run, state, i)?;
        let mut by_mol: BTreeMap<String, Vec<&Structure>> = BTreeMap::new();
        for f in &labelled {
            by_mol.entry(molecule_name(f)).or_default().push(f);
        }
        for (m, (_, parents)) in by_mol.iter().enumerate() {
            let how = d::Rattle {
                sigma: smp.rattle_sigma,
                relax_steps: smp.relax_steps,
                max_step: smp.relax_max_step,
                seed: (i as u64) << 20 | m as u64,
            };
            candidates.extend(d::rattle_and_relax(
                parents,
                smp.rattle_per_molecule,
                how,
                &calc,
            )?);
        }
    }
    let limit = run.cfg.selection.min_distance;
    let before = candidates.len();
    let mut kept = Vec::with_capacity(before);
    for c in candidates {
        if d::close_contact(&c, limit)?.is_none() {
            kept.push(c);
        }
    }
    write_extxyz(&run.iter_dir(i).join("candidates.extxyz"), &kept)?;
    let it = state.iteration(i);
    it.candidates = kept.len();
    it.rejected_close = before - kept.len();
    eprintln!(
        "   {} candidates ({} dropped: atoms closer than {limit} Å)",
        kept.len(),
        before - kept.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// Every frame labelled up to (not including) iteration `i`.
fn labelled_so_far(run: &Run, state: &RunState, i: usize) -> Result<Vec<Structure>> {
    let mut out = Vec::new();
    for p in labelled_files(run, state, i) {
        out.extend(read_extxyz(&p)?);
    }
    Ok(out)
}

/// The labelled files of iterations before `i` (those whose label phase ran).
pub(super) fn labelled_files(run: &Run, state: &RunState, i: usize) -> Vec<PathBuf> {
    (0..i)
        .filter(|&j| {
            let it = &state.iterations[j];
            j == 0 || it.is_done(Phase::Label)
        })
        .map(|j| run.iter_dir(j).join("labelled.extxyz"))
        .filter(|p| p.exists())
        .collect()
}

/// The committee's disagreement on every candidate; the most disputed per molecule, or over
/// all molecules (`selection.share`).
fn select(run: &Run, state: &mut RunState, i: usize) -> Result<()> {
    let dir = run.iter_dir(i);
    let candidates = read_extxyz(&dir.join("candidates.extxyz"))?;
    let calcs = (0..run.cfg.committee)
        .map(|k| calculator(run, &run.student(i - 1, k)))
        .collect::<Result<Vec<_>>>()?;
    let refs: Vec<&dyn Calculator> = calcs.iter().map(|c| c as &dyn Calculator).collect();
    let scores = d::disagreement(&refs, &candidates, BATCH)
        .with_context(|| format!("scoring {}", s(&dir.join("candidates.extxyz"))))?;
    let sel = &run.cfg.selection;
    let molecule_of = |k: usize| molecule_name(&candidates[k]);
    let temperature_of =
        |k: usize| -> Option<f64> { candidates[k].info_value("temperature_K")?.parse().ok() };
    let ranked = d::relative_to_goals(
        &scores,
        temperature_of,
        &run.cfg.temperatures,
        &sel.force_goals,
    );
    let picked = match sel.share {
        d::Share::Even => d::most_disputed(&ranked, molecule_of, sel.per_molecule),
        d::Share::Disputed => {
            let molecules: std::collections::BTreeSet<String> =
                (0..candidates.len()).map(molecule_of).collect();
            let total = sel.per_molecule * molecules.len();
            d::most_disputed_overall(&ranked, molecule_of, total, sel.min_per_molecule)
        }
    };
    let mean = |ks: &mut dyn Iterator<Item = usize>| {
        let v: Vec<f64> = ks.map(|k| scores[k]).collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let mut selected = Vec::with_capacity(picked.len());
    for &k in &picked {
        let mut f = candidates[k].clone();
        d::set_info(&mut f, "disagreement", &format!("{:.6e}", scores[k]));
        selected.push(f);
    }
    write_extxyz(&dir.join("selected.extxyz"), &selected)?;
    crate::fsutil::write_json(&dir.join("scores.json"), &scores)?;
    let md = (0..candidates.len()).filter(|&k| candidates[k].info_value("source") == Some("md"));
    let worst = d::most_disputed_molecule(&scores, molecule_of, md.clone());
    let it = state.iteration(i);
    it.disagreement_md_worst = worst;
    it.disagreement_mean = mean(&mut (0..scores.len()));
    it.disagreement_md_mean = mean(&mut md.into_iter());
    it.disagreement_selected_mean = mean(&mut picked.iter().copied());
    it.selected = picked.len();
    eprintln!(
        "   disagreement: candidates {:.1} meV/Å (student MD {:.1}), selected {:.1} meV/Å \
         ({} frames)",
        it.disagreement_mean.unwrap_or(f64::NAN) * 1e3,
        it.disagreement_md_mean.unwrap_or(f64::NAN) * 1e3,
        it.disagreement_selected_mean.unwrap_or(f64::NAN) * 1e3,
        picked.len()
    );
    it.selected_groups = d::selected_groups(&picked, molecule_of, temperature_of);
    let mut per_t: Vec<(Option<f64>, usize)> = Vec::new();
    for g in &it.selected_groups {
        match per_t.iter_mut().find(|(t, _)| *t == g.temperature_k) {
            Some((_, n)) => *n += g.frames,
            None => per_t.push((g.temperature_k, g.frames)),
        }
    }
    let per_t: Vec<String> = per_t
        .iter()
        .map(|(t, n)| match t {
            Some(t) => format!("{n} at {t} K"),
            None => format!("{n} without a temperature"),
        })
        .collect();
    eprintln!("   selected by temperature: {}", per_t.join(", "));
    Ok(())
}

/// The teacher on the selected frames, in parallel workers.
fn label(run: &Run, state: &mut RunState, i: usize) -> Result<()> {
    let dir = run.iter_dir(i);
    let selected = read_extxyz(&dir.join("selected.extxyz"))?;
    let started = Instant::now();
    // Per process: workers a killed run left behind cannot write into this attempt's files;
    // the folders of attempts whose process is gone are removed.
    d::clean_stale_work(&dir, "label-work-");
    let work = dir.join(format!("label-work-{}", std::process::id()));
    let labelled = d::label(&run.cfg.teacher, &selected, &work, i as u64)?;
    write_extxyz(&dir.join("labelled.extxyz"), &labelled)?;
    let teacher_s = d::teacher_seconds(&labelled);
    let total_before: usize = state.iterations[..i].iter().map(|x| x.new_frames).sum();
    let teacher_before: f64 = state.iterations[..i].iter().map(|x| x.teacher_s).sum();
    let it = state.iteration(i);
    it.new_frames = labelled.len();
    it.total_frames = total_before + labelled.len();
    it.teacher_s = teacher_s;
    it.teacher_s_total = teacher_before + teacher_s;
    eprintln!(
        "   teacher labelled {} of {} frames in {:.1} s wall ({:.1} s teacher time){}",
        labelled.len(),
        selected.len(),
        started.elapsed().as_secs_f64(),
        teacher_s,
        match selected.len() - labelled.len() {
            0 => String::new(),
            n => format!("; {n} failed and were dropped"),
        }
    );
    Ok(())
}

/// Student 0 on the held-out frames (per molecule and temperature) and its NVT stability.
fn evaluate_student(run: &Run, state: &mut RunState, i: usize) -> Result<ExitCode> {
    let summary = run.iter_dir(i).join("stability.json");
    let (test, stability) = match assess(run, &run.student(i, 0), &summary)? {
        Ok(scores) => scores,
        Err(code) => return Ok(code),
    };
    let it = state.iteration(i);
    it.test = Some(test);
    it.stability = stability;
    Ok(ExitCode::SUCCESS)
}

/// `student` on the held-out frames (per molecule and temperature) and its NVT stability run
/// (summary in `summary`); the status where that run ended other than completed or unstable.
pub(super) fn assess(
    run: &Run,
    student: &Path,
    summary: &Path,
) -> Result<std::result::Result<(HeldOut, Vec<StabilityRow>), ExitCode>> {
    let calc = calculator(run, student)?;
    let test = read_extxyz(&run.data("test.extxyz"))?;
    let (overall, _) = evaluate(&calc, &test, BATCH)?;
    let test_file = run.data("test.extxyz");
    let frame = |k: usize| format!("{}: frame {k}", s(&test_file));
    let stress = crate::eval::stress_errors(&calc, &test, BATCH, &frame)?;
    let mut groups: BTreeMap<(String, String), Vec<Structure>> = BTreeMap::new();
    for f in test {
        let t = f.info_value("temperature_K").unwrap_or("").to_string();
        groups.entry((molecule_name(&f), t)).or_default().push(f);
    }
    let mut rows = Vec::new();
    for ((molecule, t), frames) in groups {
        let (r, _) = evaluate(&calc, &frames, BATCH)?;
        rows.push(GroupErrors {
            molecule,
            temperature_k: t.parse().ok(),
            errors: r.overall,
        });
    }
    rows.sort_by(|a, b| {
        (&a.molecule, a.temperature_k.unwrap_or(0.0))
            .partial_cmp(&(&b.molecule, b.temperature_k.unwrap_or(0.0)))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let mut stability = Vec::new();
    let st = &run.cfg.stability;
    if st.steps > 0 {
        let md = StudentMd {
            model: student,
            replicas: 1,
            temperature: run.cfg.stability_temperature(),
            friction_per_ps: run.cfg.sampling.friction_per_ps,
            timestep: st.timestep,
            steps: st.steps,
            seed: 0,
            traj: None,
            summary,
        };
        if let Some(code) = student_md(run, &md)? {
            return Ok(Err(code));
        }
        let v: serde_json::Value = crate::fsutil::read_json(summary, "an mlff md summary")?;
        let molecules = start_molecules(run)?;
        for (k, row) in v["systems"].as_array().into_iter().flatten().enumerate() {
            stability.push(StabilityRow {
                molecule: molecules.get(k).cloned().unwrap_or_default(),
                steps: row["last_step"].as_u64().unwrap_or(0),
                stable: row["stable"].as_bool().unwrap_or(false),
                max_bond_deviation: row["max_bond_deviation"].as_f64().unwrap_or(f64::NAN),
            });
        }
    }
    eprintln!(
        "   held-out: F MAE {:.2} meV/Å, E MAE {:.3} meV/atom; stable {}/{}",
        overall.overall.force_mae * 1e3,
        overall.overall.energy_per_atom_mae * 1e3,
        stability.iter().filter(|r| r.stable).count(),
        stability.len()
    );
    let test = HeldOut {
        overall: overall.overall,
        groups: rows,
        stress_mae: stress.map(|e| e.mae),
    };
    Ok(Ok((test, stability)))
}
