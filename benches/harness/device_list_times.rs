//! What one build of the device neighbour list costs, testing all pairs against binning the
//! atoms first (`Tuning::device_list_bins_from_atoms` rests on it), on periodic water boxes
//! (`systems::water_box`) with MD's list cutoff (5 Å and a 1 Å skin), and the host cell list
//! beside them on all the process's cores. Each build is timed to its status read (which
//! waits for the device); minimum and median ms over the calls after an untimed one.
//!
//!     cargo bench --features cuda --bench device_list_times [-- WATERS... [--reps N]]
//!
//! Defaults: 1,000, 4,000, 32,768 and 314,432 waters (3,000 to 943,296 atoms), 5 calls; all
//! pairs are skipped above 400,000 atoms (minutes a build). Without a GPU it runs the CPU twin.

use anyhow::Result;
use candle_core::{DType, Tensor};
use mlff_distiller::device::{select, DeviceSpec};
use mlff_distiller::neighbors::{neighbor_list, DeviceListBuilder};
use mlff_distiller::systems::water_box;

#[path = "timing.rs"]
mod timing;
use timing::time;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let (mut waters, mut reps) = (Vec::new(), 5);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--reps" => reps = args.next().unwrap_or_default().parse()?,
            w => waters.push(w.parse::<usize>()?),
        }
    }
    if waters.is_empty() {
        waters = vec![1_000, 4_000, 32_768, 314_432];
    }
    let dev = select(DeviceSpec::Auto)?.device;
    let cutoff = 6.0;
    println!("device {dev:?}, list cutoff {cutoff} Å, {reps} calls");
    println!(
        "| atoms | edges | bins | all pairs ms (min / median) | binned ms | host cell list ms |"
    );
    println!("|---:|---:|---|---:|---:|---:|");
    for w in waters {
        let s = water_box(w, 1);
        let n = s.len();
        let b = DeviceListBuilder::new(cutoff, s.cell.as_ref(), s.pbc, &dev)?;
        let flat: Vec<f64> = s.positions.iter().flatten().copied().collect();
        let x = b.wrap(&Tensor::from_vec(flat, (n, 3), &dev)?)?;
        let host = s.positions.clone();
        let (_, host_s, nl) = time(reps, || {
            Ok(neighbor_list(&host, s.cell.as_ref(), s.pbc, cutoff)?)
        })?;
        let capacity = nl.len() + 64;
        let grid = b.bin_grid(n, None)?;
        let (bmin, bmed, st) = time(reps, || {
            Ok(b.build_binned(&x, &grid, capacity, DType::F32)?.status()?)
        })?;
        assert_eq!(st.edges, nl.len(), "binned edges");
        let pairs = match n <= 400_000 {
            true => {
                let (pmin, pmed, st) =
                    time(reps, || Ok(b.build(&x, capacity, DType::F32)?.status()?))?;
                assert_eq!(st.edges, nl.len(), "all-pairs edges");
                format!("{:.2} / {:.2}", 1e3 * pmin, 1e3 * pmed)
            }
            false => "-".into(),
        };
        println!(
            "| {n} | {} | {:?} | {pairs} | {:.2} / {:.2} | {:.1} |",
            nl.len(),
            grid.shape(),
            1e3 * bmin,
            1e3 * bmed,
            1e3 * host_s
        );
    }
    Ok(())
}
