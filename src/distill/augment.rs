//! Rattle-and-relax children of labelled frames (after Gardner et al. 2025): every coordinate
//! displaced by Gaussian noise, then a few steepest-descent steps on the student, so that the
//! candidates cover distorted geometries near the sampled ones that MD would rarely visit.

use crate::calculator::Calculator;
use crate::error::Result;
use crate::structure::{Batch, Structure};
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, StandardNormal};

/// How to rattle and relax.
#[derive(Clone, Copy, Debug)]
pub struct Rattle {
    /// Standard deviation of each coordinate's displacement, Å.
    pub sigma: f64,
    pub relax_steps: usize,
    /// Largest displacement of any atom in one relaxation step, Å.
    pub max_step: f64,
    pub seed: u64,
}

/// `count` children, each of a parent drawn (seeded) from `parents`, unlabelled, with the
/// info keys of its parent and `source=rattle`.
pub fn rattle_and_relax(
    parents: &[&Structure],
    count: usize,
    how: Rattle,
    student: &dyn Calculator,
) -> Result<Vec<Structure>> {
    if parents.is_empty() || count == 0 {
        return Ok(Vec::new());
    }
    let mut rng = ChaCha8Rng::seed_from_u64(how.seed);
    let mut children: Vec<Structure> = (0..count)
        .map(|_| {
            let parent = parents[rng.random_range(0..parents.len())];
            let mut s = unlabelled(parent);
            for p in &mut s.positions {
                for x in p.iter_mut() {
                    let z: f64 = StandardNormal.sample(&mut rng);
                    *x += how.sigma * z;
                }
            }
            set_info(&mut s, "source", "rattle");
            s
        })
        .collect();
    for _ in 0..how.relax_steps {
        let pred = student.compute(&Batch::new(children.clone())?)?;
        pred.check_finite()?;
        for (s, forces) in children.iter_mut().zip(&pred.forces) {
            // Steepest descent scaled so that the most pushed atom moves `max_step`.
            let fmax = forces
                .iter()
                .map(|f| (f[0] * f[0] + f[1] * f[1] + f[2] * f[2]).sqrt())
                .fold(0.0, f64::max);
            if fmax <= 0.0 {
                continue;
            }
            let scale = how.max_step / fmax;
            for (p, f) in s.positions.iter_mut().zip(forces) {
                for d in 0..3 {
                    p[d] += scale * f[d];
                }
            }
        }
    }
    Ok(children)
}

/// `s` without energy, forces or any per-atom column but the positions (what a teacher must
/// label afresh), its info kept.
pub fn unlabelled(s: &Structure) -> Structure {
    Structure {
        numbers: s.numbers.clone(),
        positions: s.positions.clone(),
        cell: s.cell,
        pbc: s.pbc,
        energy: None,
        forces: None,
        info: s.info.clone(),
        arrays: Vec::new(),
    }
}

/// Sets (or replaces) an info key.
pub fn set_info(s: &mut Structure, key: &str, value: &str) {
    match s.info.iter_mut().find(|(k, _)| k == key) {
        Some(kv) => kv.1 = value.to_string(),
        None => s.info.push((key.to_string(), value.to_string())),
    }
}
