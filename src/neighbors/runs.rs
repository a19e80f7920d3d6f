//! Work over runs of centers on several threads, appended to one list in the runs' order.

use super::NeighborList;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};

/// `fill(items, part)` for `0..n` in runs of `per_run` items on `threads` threads that take
/// runs in turn, each run's part appended to `out` in the runs' order: the result is what one
/// thread filling `out` with all of `0..n` gives. A run's part stays small (in the thread's
/// cache until appended), and the list is written once, with no second full-size copy alive.
pub(super) fn fill_in_order(
    n: usize,
    per_run: usize,
    threads: usize,
    out: &mut NeighborList,
    fill: impl Fn(Range<usize>, &mut NeighborList) + Sync,
) {
    let per_run = per_run.max(1);
    let runs = n.div_ceil(per_run);
    if threads <= 1 || runs <= 1 {
        return fill(0..n, out);
    }
    let next = AtomicUsize::new(0);
    let turn = Turn {
        state: Mutex::new(TurnState {
            next: 0,
            aborted: false,
            out,
        }),
        changed: Condvar::new(),
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads.min(runs))
            .map(|_| {
                scope.spawn(|| {
                    // Wakes the others if this thread panics, so that none waits forever.
                    let _guard = AbortOnPanic(&turn);
                    let mut part = NeighborList::default();
                    loop {
                        let r = next.fetch_add(1, Ordering::Relaxed);
                        if r >= runs {
                            return;
                        }
                        part.centers.clear();
                        part.neighbors.clear();
                        part.shifts.clear();
                        fill(r * per_run..((r + 1) * per_run).min(n), &mut part);
                        if !turn.append(r, &part) {
                            return;
                        }
                    }
                })
            })
            .collect();
        // A worker only panics on a bug; carry the panic on.
        for h in handles {
            h.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
        }
    });
}

/// Whose turn it is to append a run to the list.
struct Turn<'a> {
    state: Mutex<TurnState<'a>>,
    changed: Condvar,
}

struct TurnState<'a> {
    /// The run to append next.
    next: usize,
    /// A search thread panicked: stop.
    aborted: bool,
    out: &'a mut NeighborList,
}

impl Turn<'_> {
    /// Waits for run `r`'s turn and appends `part`; false when the search was aborted.
    fn append(&self, r: usize, part: &NeighborList) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while state.next != r && !state.aborted {
            state = (self.changed.wait(state)).unwrap_or_else(PoisonError::into_inner);
        }
        if state.aborted {
            return false;
        }
        state.out.centers.extend_from_slice(&part.centers);
        state.out.neighbors.extend_from_slice(&part.neighbors);
        state.out.shifts.extend_from_slice(&part.shifts);
        state.next += 1;
        drop(state);
        self.changed.notify_all();
        true
    }
}

/// Marks the search aborted when dropped during a panic.
struct AbortOnPanic<'a, 'b>(&'a Turn<'b>);

impl Drop for AbortOnPanic<'_, '_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut state = (self.0.state.lock()).unwrap_or_else(PoisonError::into_inner);
            state.aborted = true;
            drop(state);
            self.0.changed.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run r's part: one edge per item, tagged with the item.
    fn fill(items: Range<usize>, part: &mut NeighborList) {
        for i in items {
            part.centers.push(i as u32);
            part.neighbors.push((i * 7 % 11) as u32);
            part.shifts.push([i as i32, 0, -1]);
        }
    }

    #[test]
    fn parts_are_appended_in_run_order_on_any_thread_count() {
        let mut one = NeighborList::default();
        fill(0..1000, &mut one);
        for (threads, per_run) in [(1, 10), (2, 1), (3, 7), (8, 33), (4, 5000)] {
            let mut out = NeighborList::default();
            fill_in_order(1000, per_run, threads, &mut out, fill);
            assert_eq!(out, one, "{threads} threads, {per_run} per run");
        }
    }

    #[test]
    fn a_panicking_worker_panics_the_caller_and_stops_the_others() {
        let result = std::panic::catch_unwind(|| {
            let mut out = NeighborList::default();
            fill_in_order(100, 3, 4, &mut out, |items, part| {
                if items.contains(&50) {
                    panic!("run with item 50");
                }
                fill(items, part)
            });
        });
        assert!(result.is_err());
    }
}
