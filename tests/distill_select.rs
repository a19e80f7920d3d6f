//! `mlff distill`'s selection pieces: the committee's disagreement, the budget per molecule
//! and over all molecules, goals per temperature, close contacts.

use mlff_distiller::calculator::{Calculator, Prediction};
use mlff_distiller::distill::{
    close_contact, disagreement, most_disputed, most_disputed_molecule, most_disputed_overall,
    relative_to_goals, selected_groups, SelectedGroup,
};
use mlff_distiller::structure::{Batch, Structure};

/// Forces of a fixed pattern times `scale`: committees whose spread is known.
struct Scaled(f64);

impl Calculator for Scaled {
    fn compute(&self, batch: &Batch) -> mlff_distiller::Result<Prediction> {
        let forces = batch
            .structures
            .iter()
            .map(|s| {
                s.positions
                    .iter()
                    .map(|p| [self.0 * p[0], self.0 * 2.0 * p[1], 0.0])
                    .collect()
            })
            .collect();
        Ok(Prediction {
            energies: vec![0.0; batch.structures.len()],
            forces,
        })
    }
    fn cutoff(&self) -> f64 {
        5.0
    }
}

fn molecule(positions: Vec<[f64; 3]>) -> Structure {
    Structure::molecule(vec![6; positions.len()], positions)
}

#[test]
fn disagreement_is_the_rms_spread_of_the_committee() {
    let s = molecule(vec![[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]);
    let (a, b) = (Scaled(1.0), Scaled(3.0));
    let same: Vec<&dyn Calculator> = vec![&a, &a];
    assert_eq!(
        disagreement(&same, std::slice::from_ref(&s), 8).unwrap(),
        vec![0.0]
    );
    // Members 1 and 3 times the pattern: each component deviates by 1x the pattern from the
    // mean; the atoms' squared patterns are 1 and 4, so the RMS over atoms is sqrt(5/2).
    let pair: Vec<&dyn Calculator> = vec![&a, &b];
    let d = disagreement(&pair, &[s.clone(), s], 1).unwrap();
    for x in d {
        approx::assert_relative_eq!(x, (2.5f64).sqrt(), epsilon = 1e-12);
    }
}

#[test]
fn the_most_disputed_frames_are_picked_per_molecule_within_the_budget() {
    let scores = [0.1, 0.9, 0.5, 0.7, 0.2, 0.8, 0.3];
    let mol = |k: usize| if k.is_multiple_of(2) { "even" } else { "odd" }.to_string();
    // even: 0.1 0.5 0.2 0.3 -> 2 (0.5), 6 (0.3); odd: 0.9 0.7 0.8 -> 1, 5.
    assert_eq!(most_disputed(&scores, mol, 2), vec![1, 2, 5, 6]);
    assert_eq!(most_disputed(&scores, |_| "one".into(), 10).len(), 7);
}

#[test]
fn a_shared_budget_goes_to_the_most_disputed_molecule_above_a_floor() {
    let scores = [0.1, 0.9, 0.5, 0.7, 0.2, 0.8, 0.3];
    let mol = |k: usize| if k.is_multiple_of(2) { "even" } else { "odd" }.to_string();
    // Floor 1: even 2 (0.5), odd 1 (0.9); then the best of the rest anywhere: 5, 3.
    assert_eq!(most_disputed_overall(&scores, mol, 4, 1), vec![1, 2, 3, 5]);
    // Floor 2 takes the whole budget as the even split does.
    assert_eq!(
        most_disputed_overall(&scores, mol, 4, 2),
        most_disputed(&scores, mol, 2)
    );
    assert_eq!(most_disputed_overall(&scores, mol, 100, 0).len(), 7);
    // odd's frames average 0.8, even's 0.275; over the even frames alone, even is the worst.
    let (m, d) = most_disputed_molecule(&scores, mol, 0..7).unwrap();
    assert_eq!(m, "odd");
    approx::assert_relative_eq!(d, 0.8, epsilon = 1e-12);
    assert_eq!(
        most_disputed_molecule(&scores, mol, [0, 2].into_iter())
            .unwrap()
            .0,
        "even"
    );
    assert!(most_disputed_molecule(&scores, mol, std::iter::empty()).is_none());
}

#[test]
fn close_contacts_are_found_across_periodic_boundaries() {
    let mut s = molecule(vec![[0.1, 5.0, 5.0], [9.8, 5.0, 5.0]]);
    assert!(close_contact(&s, 0.5).unwrap().is_none(), "9.7 Å apart");
    s.cell = Some([[10.0, 0.0, 0.0], [0.0, 10.0, 0.0], [0.0, 0.0, 10.0]]);
    s.pbc = [true; 3];
    let (i, j, r) = close_contact(&s, 0.5)
        .unwrap()
        .expect("0.3 Å through the boundary");
    assert_eq!((i, j), (0, 1));
    approx::assert_relative_eq!(r, 0.3, epsilon = 1e-9);
    assert!(close_contact(&s, 0.25).unwrap().is_none());
}

#[test]
fn goals_per_temperature_move_the_budget_to_the_frames_furthest_from_theirs() {
    // Two cold frames disputed less in eV/Å than two hot ones, but further from their goal.
    let scores = [0.012, 0.020, 0.018, 0.030];
    let t = [Some(300.0), Some(600.0), Some(310.0), Some(590.0)];
    let (temps, goals) = ([300.0, 600.0], [0.010, 0.025]);
    let ranked = relative_to_goals(&scores, |k| t[k], &temps, &goals);
    for (r, want) in ranked.iter().zip([1.2, 0.8, 1.8, 1.2]) {
        approx::assert_relative_eq!(*r, want, epsilon = 1e-12);
    }
    let one = |_: usize| "m".to_string();
    assert_eq!(most_disputed(&scores, one, 2), vec![1, 3]);
    assert_eq!(most_disputed(&ranked, one, 2), vec![0, 2]);
    // Without goals nothing changes; a frame without a temperature gets the strictest goal.
    assert_eq!(relative_to_goals(&scores, |k| t[k], &temps, &[]), scores);
    let r = relative_to_goals(&[0.02], |_| None, &temps, &goals);
    approx::assert_relative_eq!(r[0], 2.0, epsilon = 1e-12);
}

#[test]
fn the_selection_is_counted_per_molecule_and_temperature() {
    let mol = ["b", "a", "a", "b", "a", "a"];
    let t = [
        Some(600.0),
        Some(600.0),
        Some(300.0),
        Some(600.0),
        None,
        Some(300.0),
    ];
    let g = |m: &str, t: Option<f64>, frames| SelectedGroup {
        molecule: m.into(),
        temperature_k: t,
        frames,
    };
    assert_eq!(
        selected_groups(&[0, 1, 2, 3, 4, 5], |k| mol[k].into(), |k| t[k]),
        vec![
            g("a", Some(300.0), 2),
            g("a", Some(600.0), 1),
            g("a", None, 1),
            g("b", Some(600.0), 2),
        ]
    );
    assert!(selected_groups(&[], |k| mol[k].into(), |k| t[k]).is_empty());
}
