//! What a domain session's host-side list rebuild costs (issue 47), on a periodic water box
//! (`systems::water_box`: random orientations on a cubic grid at liquid density), through the
//! pieces a rebuild runs on the host: the cell list at `cutoff + skin` (`neighbor_list`), the
//! image offsets the device inputs take (`flat_image_offsets`, fresh in f64, and into the last
//! build's f32 buffer as a session does), the Verlet list's rebuild (the same search, into the
//! memory of the list it replaces), and the displacement check every call makes. Thread counts
//! follow the CPUs the process may use, so pin it to compare:
//!
//!     taskset -c 0   cargo bench --bench neighbor_list_times [-- WATERS [REPS [CUTOFF]]]
//!     taskset -c 0,1 cargo bench --bench neighbor_list_times
//!
//! Defaults: 32768 waters (98,304 atoms), 5 timed calls, cutoff 6 Å (5 Å and a 1 Å skin).
//! With `--session MODEL` it also times one `DomainSession::compute` on the CPU with and
//! without a rebuild (the difference is the rebuild's share; slow for large boxes).
//! The printed checksum of the list lets a change to the search be checked for the same edges.

use anyhow::{bail, Context, Result};
use mlff_distiller::domain::DomainSession;
use mlff_distiller::model::Backend;
use mlff_distiller::neighbors::{
    flat_image_offsets, flat_image_offsets_into, neighbor_list, NeighborList, VerletList,
};
use mlff_distiller::systems::water_box;
use mlff_distiller::PainnCalculator;
use std::time::Instant;

#[path = "timing.rs"]
mod timing;
use timing::time;

/// FNV-1a over the edges, in order: equal lists give equal sums.
fn checksum(nl: &NeighborList) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325_u64;
    let mut eat = |x: u32| {
        for b in x.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    };
    for e in 0..nl.len() {
        eat(nl.centers[e]);
        eat(nl.neighbors[e]);
        nl.shifts[e].iter().for_each(|&s| eat(s as u32));
    }
    h
}

fn main() -> Result<()> {
    // `cargo bench` appends --bench; the rest are ours.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let session = args.iter().position(|a| a == "--session");
    let model = match session {
        Some(k) => Some(
            args.get(k + 1)
                .context("--session needs a model path")?
                .clone(),
        ),
        None => None,
    };
    let plain: Vec<&String> = (args.iter().enumerate())
        .filter(|&(k, _)| session.is_none_or(|s| k != s && k != s + 1))
        .map(|(_, a)| a)
        .collect();
    let num = |k: usize, default: f64| -> Result<f64> {
        plain.get(k).map_or(Ok(default), |a| {
            a.parse().with_context(|| format!("argument {a}"))
        })
    };
    let waters = num(0, 32768.0)? as usize;
    let reps = (num(1, 5.0)? as usize).max(1);
    let cutoff = num(2, 6.0)?;
    if waters == 0 || cutoff.is_nan() || cutoff <= 0.0 {
        bail!("need at least one water and a positive cutoff");
    }
    let water = water_box(waters, 0);
    let (numbers, positions) = (&water.numbers, &water.positions);
    let cell = water.cell.context("the water box has a cell")?;
    let pbc = water.pbc;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "{} atoms, cubic cell {:.2} Å, cutoff {cutoff} Å, {threads} CPUs, {reps} reps \
         (min / median)",
        positions.len(),
        cell[0][0]
    );

    let (lo, med, nl) = time(reps, || {
        Ok(neighbor_list(positions, Some(&cell), pbc, cutoff)?)
    })?;
    let e = nl.len() as f64;
    let ns = |t: f64| t / e * 1e9;
    println!(
        "  neighbor_list       {:8.1} / {:8.1} ms  {:6.1} / {:6.1} ns/edge  \
         ({} edges, checksum {:016x})",
        lo * 1e3,
        med * 1e3,
        ns(lo),
        ns(med),
        nl.len(),
        checksum(&nl)
    );
    let (lo, med, _) = time(reps, || Ok(flat_image_offsets(&nl.shifts, Some(&cell))))?;
    println!(
        "  flat_image_offsets  {:8.1} / {:8.1} ms  {:6.1} / {:6.1} ns/edge  (fresh f64)",
        lo * 1e3,
        med * 1e3,
        ns(lo),
        ns(med)
    );
    // What a session's rebuild runs: f32 offsets into the buffer of the last build.
    let mut staging: Vec<f32> = Vec::new();
    let (lo, med, _) = time(reps, || {
        flat_image_offsets_into(&nl.shifts, Some(&cell), &mut staging);
        Ok(())
    })?;
    println!(
        "  offsets, reused f32 {:8.1} / {:8.1} ms  {:6.1} / {:6.1} ns/edge",
        lo * 1e3,
        med * 1e3,
        ns(lo),
        ns(med)
    );
    // What a session's rebuild runs: the Verlet list rebuilt (at cutoff - 1 Å + a 1 Å skin).
    let mut verlet = VerletList::new(cutoff - 1.0, 1.0);
    let (lo, med, _) = time(reps, || {
        verlet.invalidate();
        Ok(verlet.update(positions, Some(&cell), pbc)?)
    })?;
    println!(
        "  Verlet rebuild      {:8.1} / {:8.1} ms  {:6.1} / {:6.1} ns/edge",
        lo * 1e3,
        med * 1e3,
        ns(lo),
        ns(med)
    );
    let (lo, med, rebuilt) = time(reps, || Ok(verlet.update(positions, Some(&cell), pbc)?))?;
    println!(
        "  Verlet check        {:8.3} / {:8.3} ms  (rebuilt: {rebuilt})",
        lo * 1e3,
        med * 1e3
    );

    if let Some(model) = model {
        let dtype = candle_core::DType::F32;
        let calc =
            PainnCalculator::from_checkpoint(model.as_ref(), &candle_core::Device::Cpu, dtype)?
                .with_backend(Backend::Fused);
        let n = positions.len();
        let box_ = Some((&cell, pbc));
        let mut s = DomainSession::new(&calc, 1.0);
        let mut moved = positions.clone();
        let t0 = Instant::now();
        s.compute(&calc, numbers, &moved, n, box_)?;
        let first = t0.elapsed().as_secs_f64();
        let t0 = Instant::now();
        s.compute(&calc, numbers, &moved, n, box_)?;
        let reuse = t0.elapsed().as_secs_f64();
        // Past half the skin: the next call rebuilds.
        moved[0][0] += 0.6;
        let t0 = Instant::now();
        s.compute(&calc, numbers, &moved, n, box_)?;
        let rebuild = t0.elapsed().as_secs_f64();
        println!(
            "  DomainSession::compute: first {:.1} ms, reusing the list {:.1} ms, \
             rebuilding {:.1} ms ({} builds)",
            first * 1e3,
            reuse * 1e3,
            rebuild * 1e3,
            s.builds()
        );
    }
    Ok(())
}
