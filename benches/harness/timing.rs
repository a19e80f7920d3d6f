//! The timing loop the harnesses share (each includes it with `#[path]`).

use anyhow::Result;
use std::time::Instant;

/// Minimum and median seconds of `reps` calls of `f` (after one untimed call), and its last
/// value.
pub fn time<T>(reps: usize, mut f: impl FnMut() -> Result<T>) -> Result<(f64, f64, T)> {
    let mut last = f()?;
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t0 = Instant::now();
        last = f()?;
        t.push(t0.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok((t[0], t[t.len() / 2], last))
}
