//! The run's report: a markdown page of every iteration (frames, teacher and training time,
//! held-out errors per molecule and temperature, MD stability) and the plot of held-out error
//! against the teacher's time.

use super::state::{HeldOut, RunState, StabilityRow};
use crate::error::Result;
use crate::plot::{lines_png, Line};
use std::fmt::Write;
use std::path::Path;

fn opt(v: Option<f64>, scale: f64, digits: usize) -> String {
    v.map_or("–".into(), |x| format!("{:.*}", digits, x * scale))
}

/// The markdown report of `state`.
pub fn markdown(state: &RunState, teacher: &str) -> String {
    let mut m = String::new();
    let _ = writeln!(m, "# mlff distill: teacher `{teacher}`\n");
    if let Some(why) = &state.finished {
        let _ = writeln!(m, "Finished: {why}.\n");
    }
    let _ = writeln!(
        m,
        "Held-out errors are student 0's on teacher-MD frames of seeds never trained on; \
         disagreement is the committee's force spread (RMS over atoms) on that iteration's \
         candidates, which the previous iteration's student sampled; the loop stops when the \
         worst molecule's is below stop.disagreement.\n"
    );
    let _ = writeln!(
        m,
        "| iteration | new frames | frames | teacher s (total) | train s (total) | \
         disagreement MD meV/Å (worst molecule) | selected meV/Å | test F MAE meV/Å | \
         test E MAE meV/atom | stable |"
    );
    let _ = writeln!(
        m,
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for it in state.iterations.iter().filter(|it| !it.done.is_empty()) {
        let test = it.test.as_ref().map(|t| &t.overall);
        let stable = it.stability.iter().filter(|r| r.stable).count();
        let _ = writeln!(
            m,
            "| {} | {} | {} | {:.1} ({:.1}) | {:.1} ({:.1}) | {} | {} | {} | {} | {} |",
            it.index,
            it.new_frames,
            it.total_frames,
            it.teacher_s,
            it.teacher_s_total,
            it.train_s,
            it.train_s_total,
            match &it.disagreement_md_worst {
                Some((m, d)) => format!(
                    "{} ({m} {:.1})",
                    opt(it.disagreement_md_mean, 1e3, 1),
                    d * 1e3
                ),
                None => opt(it.disagreement_md_mean, 1e3, 1),
            },
            opt(it.disagreement_selected_mean, 1e3, 1),
            opt(test.map(|e| e.force_mae), 1e3, 2),
            opt(test.map(|e| e.energy_per_atom_mae), 1e3, 3),
            match it.stability.len() {
                0 => "–".to_string(),
                n => format!("{stable}/{n}"),
            }
        );
    }
    let refined = state
        .refined
        .as_ref()
        .and_then(|r| Some((r, r.test.as_ref()?)));
    if let Some((r, test)) = refined {
        let stable = r.stability.iter().filter(|x| x.stable).count();
        let _ = writeln!(
            m,
            "\nSecond stage (`refine`): student 0 of iteration {} trained {} more epochs on \
             every labelled frame in {:.1} s: test F MAE {:.2} meV/Å, E MAE {:.3} meV/atom, \
             stable {stable}/{}. It is the run's student.",
            r.from_iteration,
            r.epochs,
            r.train_s,
            test.overall.force_mae * 1e3,
            test.overall.energy_per_atom_mae * 1e3,
            r.stability.len()
        );
    }
    let last = state.iterations.iter().rev().find_map(|i| {
        Some((
            format!("Iteration {}", i.index),
            i.test.as_ref()?,
            &i.stability,
        ))
    });
    let shown = refined
        .map(|(r, t)| ("Second stage".to_string(), t, &r.stability))
        .or(last);
    if let Some((title, test, stability)) = shown {
        groups_table(&mut m, &title, test, stability);
        if let Some(mae) = test.stress_mae {
            let gpa = mae * crate::units::BAR_PER_EV_A3 * 1e-4;
            let _ = writeln!(m, "\nHeld-out stress MAE: {gpa:.4} GPa ({mae:.3e} eV/Å³).");
        }
    }
    selection_table(&mut m, state);
    m
}

/// The frames each iteration chose, per molecule and temperature.
fn selection_table(m: &mut String, state: &RunState) {
    let its: Vec<_> = (state.iterations.iter())
        .filter(|it| !it.selected_groups.is_empty())
        .collect();
    let mut rows: Vec<(&str, Option<f64>)> = Vec::new();
    for g in its.iter().flat_map(|it| &it.selected_groups) {
        if !rows.contains(&(&g.molecule, g.temperature_k)) {
            rows.push((&g.molecule, g.temperature_k));
        }
    }
    if rows.is_empty() {
        return;
    }
    let t = |r: &(&str, Option<f64>)| r.1.unwrap_or(f64::INFINITY);
    rows.sort_by(|a, b| a.0.cmp(b.0).then(t(a).total_cmp(&t(b))));
    let _ = writeln!(m, "\n## Frames chosen per molecule and temperature\n");
    let heads: Vec<String> = its
        .iter()
        .map(|it| format!("iteration {}", it.index))
        .collect();
    let _ = writeln!(m, "| molecule | T K | {} | all |", heads.join(" | "));
    let _ = writeln!(m, "| --- | ---: |{} ---: |", " ---: |".repeat(its.len()));
    for (molecule, temperature) in rows {
        let counts: Vec<usize> = (its.iter())
            .map(|it| {
                (it.selected_groups.iter())
                    .find(|g| g.molecule == molecule && g.temperature_k == temperature)
                    .map_or(0, |g| g.frames)
            })
            .collect();
        let cells: Vec<String> = counts.iter().map(usize::to_string).collect();
        let _ = writeln!(
            m,
            "| {molecule} | {} | {} | {} |",
            opt(temperature, 1.0, 0),
            cells.join(" | "),
            counts.iter().sum::<usize>()
        );
    }
}

fn groups_table(m: &mut String, title: &str, test: &HeldOut, stability: &[StabilityRow]) {
    let _ = writeln!(
        m,
        "\n## {title}: held-out errors per molecule and temperature\n"
    );
    let _ = writeln!(
        m,
        "| molecule | T K | frames | E MAE meV/atom | F MAE meV/Å | F RMSE meV/Å |"
    );
    let _ = writeln!(m, "| --- | ---: | ---: | ---: | ---: | ---: |");
    for g in &test.groups {
        let _ = writeln!(
            m,
            "| {} | {} | {} | {:.3} | {:.2} | {:.2} |",
            g.molecule,
            opt(g.temperature_k, 1.0, 0),
            g.errors.frames,
            g.errors.energy_per_atom_mae * 1e3,
            g.errors.force_mae * 1e3,
            g.errors.force_rmse * 1e3
        );
    }
    if !stability.is_empty() {
        let _ = writeln!(m, "\n## {title}: MD stability (NVT)\n");
        let _ = writeln!(m, "| molecule | steps | stable | max bond deviation Å |");
        let _ = writeln!(m, "| --- | ---: | --- | ---: |");
        for r in stability {
            let _ = writeln!(
                m,
                "| {} | {} | {} | {:.3} |",
                r.molecule,
                r.steps,
                if r.stable { "yes" } else { "no" },
                r.max_bond_deviation
            );
        }
    }
}

/// Held-out force MAE (meV/Å) against the teacher's time (hours), overall and per molecule.
pub fn budget_plot(state: &RunState, path: &Path) -> Result<()> {
    let mut overall = Line {
        label: "all".into(),
        points: Vec::new(),
    };
    let mut per: std::collections::BTreeMap<String, Vec<(f64, f64)>> = Default::default();
    for it in &state.iterations {
        let Some(test) = &it.test else { continue };
        let hours = it.teacher_s_total / 3600.0;
        overall.points.push((hours, test.overall.force_mae * 1e3));
        let mut sums: std::collections::BTreeMap<&str, (f64, usize)> = Default::default();
        for g in &test.groups {
            let e = sums.entry(&g.molecule).or_default();
            e.0 += g.errors.force_mae * g.errors.atoms as f64;
            e.1 += g.errors.atoms;
        }
        for (mol, (sum, atoms)) in sums {
            per.entry(mol.to_string())
                .or_default()
                .push((hours, 1e3 * sum / atoms.max(1) as f64));
        }
    }
    if overall.points.is_empty() {
        return Ok(());
    }
    let mut lines = vec![overall];
    lines.extend(
        per.into_iter()
            .map(|(label, points)| Line { label, points }),
    );
    lines_png(
        path,
        "held-out force error against teacher time",
        "teacher wall time, hours (summed over frames)",
        "force MAE, meV/Å",
        &lines,
    )
}
