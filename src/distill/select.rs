//! Which candidate frames go to the teacher: those the committee of students disputes most,
//! per molecule, within a budget; frames with atoms on top of each other never.

use crate::calculator::Calculator;
use crate::distill::state::SelectedGroup;
use crate::error::Result;
use crate::neighbors::structure_neighbor_list;
use crate::structure::{Batch, Structure};
use std::collections::BTreeMap;

/// The closest pair of atoms (minimum image in periodic cells) if it is closer than `limit`.
pub fn close_contact(s: &Structure, limit: f64) -> Result<Option<(usize, usize, f64)>> {
    if limit <= 0.0 || s.len() < 2 {
        return Ok(None);
    }
    let nl = structure_neighbor_list(s, limit)?;
    let mut closest: Option<(usize, usize, f64)> = None;
    for e in 0..nl.len() {
        let (i, j) = (nl.centers[e] as usize, nl.neighbors[e] as usize);
        let shift = nl.shifts[e];
        let mut d = [0.0; 3];
        for (c, dc) in d.iter_mut().enumerate() {
            let mut off = 0.0;
            if let Some(cell) = &s.cell {
                for (a, row) in cell.iter().enumerate() {
                    off += shift[a] as f64 * row[c];
                }
            }
            *dc = s.positions[j][c] + off - s.positions[i][c];
        }
        let r = (d[0] * d[0] + d[1] * d[1] + d[2] * d[2]).sqrt();
        if r < limit && closest.is_none_or(|c| r < c.2) {
            closest = Some((i.min(j), i.max(j), r));
        }
    }
    Ok(closest)
}

/// The committee's force disagreement on each frame, eV/Å: the root mean square over atoms
/// of the spread of the members' force vectors about their mean
/// (`sqrt(mean_atoms mean_members |F_k - F_mean|^2)`).
pub fn disagreement(
    committee: &[&dyn Calculator],
    frames: &[Structure],
    batch_size: usize,
) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(frames.len());
    let size = batch_size.max(1);
    for (c, chunk) in frames.chunks(size).enumerate() {
        let batch = Batch::new(chunk.to_vec()).map_err(|e| e.shifted(c * size))?;
        let preds = committee
            .iter()
            .map(|calc| {
                calc.compute(&batch)
                    .and_then(|p| p.check_finite().map(|_| p))
                    .map_err(|e| e.shifted(c * size))
            })
            .collect::<Result<Vec<_>>>()?;
        for (f, frame) in chunk.iter().enumerate() {
            let n = frame.len();
            let k = preds.len() as f64;
            let mut sum = 0.0;
            for a in 0..n {
                for d in 0..3 {
                    let mean = preds.iter().map(|p| p.forces[f][a][d]).sum::<f64>() / k;
                    sum += preds
                        .iter()
                        .map(|p| (p.forces[f][a][d] - mean).powi(2))
                        .sum::<f64>()
                        / k;
                }
            }
            out.push((sum / n.max(1) as f64).sqrt());
        }
    }
    Ok(out)
}

/// `scores` over the force goal of each frame's temperature (`temperature_of`; the goal of the
/// nearest of `temperatures`, which `goals` parallels): how far each frame's disagreement is
/// from what the student must reach there. A frame without a temperature gets the strictest
/// goal. Unchanged when `goals` is empty.
pub fn relative_to_goals(
    scores: &[f64],
    temperature_of: impl Fn(usize) -> Option<f64>,
    temperatures: &[f64],
    goals: &[f64],
) -> Vec<f64> {
    if goals.is_empty() {
        return scores.to_vec();
    }
    let strictest = goals.iter().copied().fold(f64::INFINITY, f64::min);
    let goal_at = |t: f64| {
        temperatures
            .iter()
            .zip(goals)
            .min_by(|a, b| (a.0 - t).abs().total_cmp(&(b.0 - t).abs()))
            .map_or(strictest, |(_, g)| *g)
    };
    scores
        .iter()
        .enumerate()
        .map(|(k, s)| s / temperature_of(k).map_or(strictest, goal_at))
        .collect()
}

/// Indices of the frames to label: per molecule (as `molecule_of` names them), the
/// `per_molecule` highest scores, in the order of `scores` (ties: the earlier frame).
pub fn most_disputed(
    scores: &[f64],
    molecule_of: impl Fn(usize) -> String,
    per_molecule: usize,
) -> Vec<usize> {
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for k in 0..scores.len() {
        groups.entry(molecule_of(k)).or_default().push(k);
    }
    let mut picked = Vec::new();
    for (_, mut ks) in groups {
        ks.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        picked.extend(ks.into_iter().take(per_molecule));
    }
    picked.sort_unstable();
    picked
}

/// Indices of the frames to label when the budget follows the committee: every molecule's
/// `floor` highest scores, then the highest of the rest over all molecules up to `total` in
/// all; in the order of `scores` (ties: the earlier frame).
pub fn most_disputed_overall(
    scores: &[f64],
    molecule_of: impl Fn(usize) -> String,
    total: usize,
    floor: usize,
) -> Vec<usize> {
    let mut picked = most_disputed(scores, &molecule_of, floor);
    let mut taken = vec![false; scores.len()];
    for &k in &picked {
        taken[k] = true;
    }
    let mut rest: Vec<usize> = (0..scores.len()).filter(|&k| !taken[k]).collect();
    rest.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    picked.extend(rest.into_iter().take(total.saturating_sub(picked.len())));
    picked.sort_unstable();
    picked
}

/// The molecule with the highest mean score over the frames `ks`, and that mean.
pub fn most_disputed_molecule(
    scores: &[f64],
    molecule_of: impl Fn(usize) -> String,
    ks: impl Iterator<Item = usize>,
) -> Option<(String, f64)> {
    let mut per: BTreeMap<String, (f64, usize)> = BTreeMap::new();
    for k in ks {
        let e = per.entry(molecule_of(k)).or_default();
        *e = (e.0 + scores[k], e.1 + 1);
    }
    per.into_iter()
        .map(|(m, (sum, n))| (m, sum / n as f64))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// How many of the frames `picked` each molecule got at each temperature, by molecule and then
/// temperature (frames without one last).
pub fn selected_groups(
    picked: &[usize],
    molecule_of: impl Fn(usize) -> String,
    temperature_of: impl Fn(usize) -> Option<f64>,
) -> Vec<SelectedGroup> {
    let mut groups: Vec<SelectedGroup> = Vec::new();
    for &k in picked {
        let (molecule, temperature_k) = (molecule_of(k), temperature_of(k));
        match groups
            .iter_mut()
            .find(|g| g.molecule == molecule && g.temperature_k == temperature_k)
        {
            Some(g) => g.frames += 1,
            None => groups.push(SelectedGroup {
                molecule,
                temperature_k,
                frames: 1,
            }),
        }
    }
    groups.sort_by(|a, b| {
        let t = |g: &SelectedGroup| g.temperature_k.unwrap_or(f64::INFINITY);
        a.molecule.cmp(&b.molecule).then(t(a).total_cmp(&t(b)))
    });
    groups
}
