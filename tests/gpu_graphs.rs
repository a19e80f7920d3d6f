//! CUDA graphs of the fused energy+forces call against the same call launched kernel by kernel.
//! Runs only with `--features cuda` on a machine with a GPU (../shared/gpu/README.md).
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use mlff_distiller::calculator::{edge_offsets, PainnCalculator};
use mlff_distiller::device::{select, DeviceSpec};
use mlff_distiller::graph::{
    edge_capacity, CachePolicy, CacheStats, ForceGraph, GraphCalculator, GraphEdges, Graphs,
    HostEdges,
};
use mlff_distiller::md::{
    device_positions, host_positions, Ensemble, ForceProvider, ListSite, MdSettings, PainnForces,
    Simulation, StopReason,
};
use mlff_distiller::model::Backend;
use mlff_distiller::neighbors::batch_neighbor_list;
use mlff_distiller::profiler::{leak_check, sample, MemorySample};
use mlff_distiller::systems::{aspirin, water_box};
use mlff_distiller::{Batch, Calculator, Structure};

/// These tests check device memory for leaks and share one GPU: each holds this lock, so that
/// a leak check never counts another test's allocations (they ran in parallel threads).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn cuda() -> Device {
    select(DeviceSpec::Cuda(0))
        .expect("a CUDA device (these tests run on the GPU machine)")
        .device
}

fn shipped(dtype: DType, dev: &Device) -> PainnCalculator {
    PainnCalculator::from_checkpoint(&root().join("models/painn-gfn2.safetensors"), dev, dtype)
        .unwrap()
        .with_backend(Backend::Fused)
}

/// Tolerances for graph vs eager: the same kernels, but atomic adds may sum in another order.
fn tolerances(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F32 => (2e-6, 2e-5),
        _ => (1e-12, 1e-10),
    }
}

/// Host copy of an f64 device tensor.
fn host(t: &Tensor) -> Vec<f64> {
    t.flatten_all().unwrap().to_vec1::<f64>().unwrap()
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// Moves every atom by up to `amount` Å (deterministic).
fn jiggle(s: &Structure, amount: f64, seed: u64) -> Structure {
    let idx = random_index(3 * s.len(), 1000, seed);
    let mut out = s.clone();
    for (k, p) in out.positions.iter_mut().enumerate() {
        for a in 0..3 {
            p[a] += amount * (idx[3 * k + a] as f64 / 500.0 - 1.0);
        }
    }
    out
}

/// Graph replays equal eager calls: at the capture positions, after moving the atoms (same
/// list, padded), and with a new list put into the graph; molecules, a batch of four, and
/// periodic boxes on both filter paths (17,000 and 162,000 edges); f32 and f64.
#[test]
fn cuda_graph_replay_matches_eager_calls() {
    let _gpu = exclusive();
    let gpu = cuda();
    let systems: Vec<(&str, Vec<Structure>)> = vec![
        ("aspirin", vec![aspirin()]),
        (
            "4 molecules",
            vec![aspirin(), water_box(2, 1), aspirin(), aspirin()],
        ),
        ("water-300", vec![water_box(100, 2)]),
        ("water-3000", vec![water_box(1000, 3)]),
    ];
    for dtype in [DType::F32, DType::F64] {
        let calc = shipped(dtype, &gpu);
        let cutoff = calc.model().config().cutoff;
        let (tol_e, tol_f) = tolerances(dtype);
        for (name, structures) in &systems {
            println!("{dtype:?} {name}");
            let batch = Batch::new(structures.clone()).unwrap();
            let nl = batch_neighbor_list(&batch, cutoff).unwrap();
            let offsets = edge_offsets(&batch, &nl);
            let edges = HostEdges {
                centers: &nl.centers,
                neighbors: &nl.neighbors,
                offsets: &offsets,
            };
            let (inputs, positions) = calc.prepare_with(&batch, &nl).unwrap();
            let graph = ForceGraph::capture(
                &calc,
                &inputs.species,
                &inputs.atom_structure,
                inputs.n_structures,
                &positions,
                GraphEdges::Host(edges, edge_capacity(nl.len())),
            )
            .unwrap();
            let check = |batch: &Batch, what: &str| {
                let nl = batch_neighbor_list(batch, cutoff).unwrap();
                let (x, pos) = calc.prepare_with(batch, &nl).unwrap();
                let want = calc.compute_device(&x, &pos).unwrap();
                let (e, f) = graph.replay(&pos).unwrap();
                let e_want = host(&want.energies.to_dtype(DType::F64).unwrap());
                let f_want = host(&want.forces.to_dtype(DType::F64).unwrap());
                let scale_e = e_want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
                let scale_f = f_want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
                let (de, df) = (max_diff(&host(&e), &e_want), max_diff(&host(&f), &f_want));
                let what = format!("{name} {dtype:?} {what}");
                assert!(de <= tol_e * scale_e, "{what}: energies differ by {de}");
                assert!(df <= tol_f * scale_f, "{what}: forces differ by {df}");
                println!("{what}: max dE {de:.2e} eV, max dF {df:.2e} eV/Å");
            };
            check(&batch, "at capture");
            let moved = Batch::new(
                structures
                    .iter()
                    .enumerate()
                    .map(|(k, s)| jiggle(s, 0.05, k as u64))
                    .collect(),
            )
            .unwrap();
            // A new list for the moved atoms, put into the graph.
            let nl2 = batch_neighbor_list(&moved, cutoff).unwrap();
            let off2 = edge_offsets(&moved, &nl2);
            assert!(graph.fits(moved.n_atoms(), nl2.len()), "{name}: capacity");
            graph
                .set_edges(HostEdges {
                    centers: &nl2.centers,
                    neighbors: &nl2.neighbors,
                    offsets: &off2,
                })
                .unwrap();
            check(&moved, "moved, new list");
            check(&moved, "replayed again");
        }
    }
}

/// `n` copies of aspirin, each moved a little (seeded by `seed`), scaled about the origin.
fn aspirins(n: usize, seed: u64, scale: f64) -> Batch {
    let copies = (0..n as u64).map(|k| {
        let mut s = jiggle(&aspirin(), 0.05, seed * 100 + k);
        s.positions.iter_mut().flatten().for_each(|x| *x *= scale);
        s
    });
    Batch::new(copies.collect()).unwrap()
}

/// The graph calculator (`mlff predict`/`eval`) gives the eager call's energies and forces
/// for a sequence of batches of recurring shapes: a shape is captured at its second call and
/// replayed from then on, the least recently used graph goes beyond the cache's two, a list
/// longer than a graph's capacity is captured again for the same atoms (and a shorter one then
/// takes the smaller graph); f32 and f64.
#[test]
fn cuda_graph_cache_replays_recurring_batch_shapes() {
    let _gpu = exclusive();
    let gpu = cuda();
    for dtype in [DType::F32, DType::F64] {
        let calc = shipped(dtype, &gpu);
        let (tol_e, tol_f) = tolerances(dtype);
        let policy = CachePolicy {
            max_graphs: 2,
            ..CachePolicy::default()
        };
        let graphs = GraphCalculator::with_policy(&calc, Graphs::Auto, policy).unwrap();
        let water = |seed| Batch::new(vec![jiggle(&water_box(27, 4), 0.05, seed)]).unwrap();
        // (batch, replayed?, captures so far)
        let calls = [
            ("A1", aspirins(4, 1, 1.0), false, 0),
            ("A2", aspirins(4, 2, 1.0), true, 1),
            ("B1", aspirins(3, 3, 1.0), false, 1),
            ("A3", aspirins(4, 4, 1.0), true, 1),
            ("B2", aspirins(3, 5, 1.0), true, 2),
            ("B3", aspirins(3, 6, 1.0), true, 2),
            ("C1", water(7), false, 2),
            ("C2", water(8), true, 3), // A, the least recently used, goes
            ("A4", aspirins(4, 9, 1.0), true, 4), // seen before: captured at once; B goes
            ("A compressed", aspirins(4, 10, 0.6), true, 5), // outgrows A's capacity
            ("A5", aspirins(4, 11, 1.0), true, 5),
        ];
        for (name, batch, replayed, captures) in &calls {
            let before = graphs.stats();
            let got = graphs.compute(batch).unwrap();
            let want = calc.compute(batch).unwrap();
            let stats = graphs.stats();
            let what = format!("{dtype:?} {name}");
            assert_eq!(
                stats.replays - before.replays,
                *replayed as u64,
                "{what}: replayed"
            );
            assert_eq!(stats.captures, *captures, "{what}: captures");
            let scale_e = want.energies.iter().fold(1.0f64, |m, x| m.max(x.abs()));
            let de = max_diff(&got.energies, &want.energies);
            let flat = |p: &mlff_distiller::Prediction| -> Vec<f64> {
                p.forces.iter().flatten().flatten().copied().collect()
            };
            let (f_got, f_want) = (flat(&got), flat(&want));
            let scale_f = f_want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
            let df = max_diff(&f_got, &f_want);
            assert!(de <= tol_e * scale_e, "{what}: energies differ by {de}");
            assert!(df <= tol_f * scale_f, "{what}: forces differ by {df}");
            println!("{what}: max dE {de:.2e} eV, max dF {df:.2e} eV/Å");
        }
        let stats = graphs.stats();
        let expected = CacheStats {
            captures: 5,
            replays: 8,
            eager: 3,
            evictions: 3,
        };
        assert_eq!(stats, expected, "{dtype:?}");
        // The compressed batch's graph and the smaller one both hold 84 atoms in 4 structures.
        let mut kept: Vec<_> = graphs.cached_shapes();
        kept.sort_by_key(|s| s.edge_capacity);
        assert!(
            kept.len() == 2 && kept.iter().all(|s| (s.atoms, s.structures) == (84, 4)),
            "{kept:?}"
        );
        assert!(graphs.failure().is_none());
    }
}

/// MD with graph replays (the whole step captured) follows MD without them over 1,000 NVE
/// and NVT steps (f64, the same Langevin noise), with neighbour-list rebuilds (a small skin)
/// put into the graph.
#[test]
fn cuda_graph_md_follows_eager_md() {
    let _gpu = exclusive();
    let gpu = cuda();
    let calc = shipped(DType::F64, &gpu);
    let nvt = Ensemble::Nvt {
        temperature: 300.0,
        friction: 10.0,
    };
    for s in [aspirin(), water_box(64, 3)] {
        for ensemble in [Ensemble::Nve, nvt] {
            let settings = MdSettings {
                steps: 1000,
                ensemble,
                skin: 0.2,
                traj_every: 0,
                stop_when_unstable: false,
                ..Default::default()
            };
            let run = |graphs: bool, site: ListSite| {
                let f = PainnForces::new(&calc, &s, settings.skin)
                    .unwrap()
                    .with_list_site(site)
                    .unwrap()
                    .with_graphs(if graphs { Graphs::On } else { Graphs::Off })
                    .unwrap();
                assert_eq!(f.list_on_device(), site == ListSite::Device);
                let mut sim =
                    Simulation::new(f, &s, settings.clone(), serde_json::Value::Null).unwrap();
                let summary = sim.run(&mut |_| {}).unwrap();
                assert_eq!(summary.stop, StopReason::Completed);
                let f = sim.forces();
                (
                    host_positions(&sim.state().positions).unwrap(),
                    sim.records().last().unwrap().e_tot,
                    summary.neighbor_list_builds,
                    (f.graph_captures(), f.replayed_steps(), f.queued_steps()),
                )
            };
            // The reference: eager, the host cell list. Eager with the device list first.
            let (x0, e0, builds0, _) = run(false, ListSite::Host);
            let (xd, ed, buildsd, _) = run(false, ListSite::Device);
            let what = format!("{} atoms {}", s.len(), ensemble.name());
            let dxd = max_force_diff(&x0, &xd);
            println!("{what}: device list, eager: dx {dxd:.2e} Å, {buildsd} builds");
            assert!(dxd < 1e-6, "{what}: device list moved the atoms by {dxd} Å");
            assert!(
                (e0 - ed).abs() < 1e-6 && buildsd == builds0,
                "{what}: {ed} {buildsd}"
            );
            for site in [ListSite::Device, ListSite::Host] {
                let what = format!("{what}, {site:?} list");
                let (x1, e1, builds1, (captures, replayed, queued)) = run(true, site);
                let dx = max_force_diff(&x0, &x1);
                println!(
                "{what}: dx {dx:.2e} Å, dE_tot {:.2e} eV, {builds1} builds, {captures} captures, \
                 {replayed} steps replayed, queued {queued:?} (used, thrown)",
                (e0 - e1).abs()
            );
                // Between log steps (every 10th) each step's successor was queued.
                assert!(queued.0 > 250, "{what}: only {queued:?} queued steps used");
                assert!(
                    dx < 1e-6,
                    "{what}: positions differ by {dx} Å after 1,000 steps"
                );
                assert!((e0 - e1).abs() < 1e-6, "{what}: E_tot {e0} vs {e1}");
                assert!(
                    builds1 > 2 && builds1 == builds0,
                    "{what}: builds {builds0} vs {builds1}"
                );
                assert!(
                    captures >= 1 && captures < builds1,
                    "{what}: {captures} captures"
                );
                // Every step but the first, those that rebuilt the list and (in a periodic
                // cell, whose log rows have the pressure) the logging steps ran as a replay.
                let logging = if s.cell.is_some() { 1000 / 10 } else { 0 };
                assert!(
                    replayed + builds1 as u64 + logging >= 1000 - 1,
                    "{what}: only {replayed} of 1,000 steps replayed ({builds1} builds)"
                );
            }
        }
    }
}

/// A neighbour list that outgrows the graph's capacity makes a new capture, whose results
/// equal an eager call; a shorter list afterwards fits the larger graph.
/// With the device list, the overflow flag of its build sends it to a larger capacity.
#[test]
fn cuda_graph_overflow_recaptures() {
    let _gpu = exclusive();
    overflow_recaptures(ListSite::Device);
    overflow_recaptures(ListSite::Host);
}

fn overflow_recaptures(site: ListSite) {
    let gpu = cuda();
    let calc = shipped(DType::F64, &gpu);
    let s = water_box(64, 5);
    let mut graphed = PainnForces::new(&calc, &s, 0.5)
        .unwrap()
        .with_list_site(site)
        .unwrap()
        .with_graphs(Graphs::On)
        .unwrap();
    let mut eager = PainnForces::new(&calc, &s, 0.5).unwrap();
    let mut compare = |s: &Structure| {
        let (mut a, mut b) = (
            device_positions(&s.positions, &gpu).unwrap(),
            device_positions(&s.positions, &gpu).unwrap(),
        );
        let got = graphed.evaluate(&mut a).unwrap();
        let want = eager.evaluate(&mut b).unwrap();
        let f_want = host(&want.forces);
        let scale = f_want.iter().fold(1.0f64, |m, x| m.max(x.abs()));
        let df = max_diff(&host(&got.forces), &f_want);
        let (e, e0) = (
            got.energy.to_scalar::<f64>().unwrap(),
            want.energy.to_scalar::<f64>().unwrap(),
        );
        assert!(
            df <= 1e-10 * scale,
            "forces differ by {df} (max |F| {scale})"
        );
        assert!(
            (e - e0).abs() <= 1e-10 * e0.abs().max(1.0),
            "energy {e} vs {e0}"
        );
        graphed.graph_captures()
    };
    assert_eq!(compare(&s), 1);
    // Every atom pulled 30% toward the box centre: far more pairs within the cutoff than the
    // first list's capacity allows.
    let centre = s.cell.unwrap().iter().fold([0.0; 3], |c, r| {
        [c[0] + r[0] / 2.0, c[1] + r[1] / 2.0, c[2] + r[2] / 2.0]
    });
    let mut closer = s.clone();
    for p in &mut closer.positions {
        for a in 0..3 {
            p[a] = centre[a] + 0.7 * (p[a] - centre[a]);
        }
    }
    assert_eq!(
        compare(&closer),
        2,
        "no new capture after the list outgrew the graph"
    );
    assert_eq!(compare(&s), 2, "a shorter list should fit the larger graph");
}

/// Device memory stays flat over 100,000 replays (the profiler's leak check on the pool and
/// on the device's used memory).
#[test]
fn cuda_graph_replays_do_not_leak() {
    let _gpu = exclusive();
    let gpu = cuda();
    let calc = shipped(DType::F32, &gpu);
    let batch = Batch::from_one(aspirin()).unwrap();
    let nl = batch_neighbor_list(&batch, calc.model().config().cutoff).unwrap();
    let offsets = edge_offsets(&batch, &nl);
    let (x, pos) = calc.prepare_with(&batch, &nl).unwrap();
    let graph = ForceGraph::capture(
        &calc,
        &x.species,
        &x.atom_structure,
        1,
        &pos,
        GraphEdges::Host(
            HostEdges {
                centers: &nl.centers,
                neighbors: &nl.neighbors,
                offsets: &offsets,
            },
            edge_capacity(nl.len()),
        ),
    )
    .unwrap();
    let mut pool = Vec::new();
    let mut used = Vec::new();
    for call in 0..100_000 {
        graph.launch(&pos).unwrap();
        if call % 5_000 == 4_999 {
            gpu.synchronize().unwrap();
            let m = sample(&gpu, call);
            let device_used = m.device_total_bytes.unwrap() - m.device_free_bytes.unwrap();
            used.push(MemorySample {
                pool_used_bytes: Some(device_used),
                ..m
            });
            pool.push(m);
        }
    }
    for (what, samples) in [("pool", &pool), ("device", &used)] {
        let check = leak_check(&samples[1..], 1048576.0).unwrap();
        println!("{what}: {check:?}");
        assert!(!check.leaking, "{what}: {check:?}");
    }
}

/// Device memory stays flat over 30,000 MD steps run as whole-step replays (with the list
/// rebuilds and eager steps between them).
#[test]
fn cuda_graph_md_does_not_leak() {
    let _gpu = exclusive();
    let gpu = cuda();
    let calc = shipped(DType::F32, &gpu);
    let s = aspirin();
    let settings = MdSettings {
        steps: 30_000,
        log_every: 1_000,
        traj_every: 0,
        stop_when_unstable: false,
        ..Default::default()
    };
    let f = PainnForces::new(&calc, &s, settings.skin)
        .unwrap()
        .with_graphs(Graphs::On)
        .unwrap();
    let mut sim = Simulation::new(f, &s, settings, serde_json::Value::Null).unwrap();
    let mut pool = Vec::new();
    let mut used = Vec::new();
    sim.run(&mut |p| {
        let m = sample(&gpu, p.step as usize);
        let device_used = m.device_total_bytes.unwrap() - m.device_free_bytes.unwrap();
        used.push(MemorySample {
            pool_used_bytes: Some(device_used),
            ..m
        });
        pool.push(m);
    })
    .unwrap();
    assert!(sim.forces().replayed_steps() > 25_000, "too few replays");
    for (what, samples) in [("pool", &pool), ("device", &used)] {
        let check = leak_check(&samples[2..], 1048576.0).unwrap();
        println!("{what}: {check:?}");
        assert!(!check.leaking, "{what}: {check:?}");
    }
}

/// A capture that fails (here: a device whose buffers carry cudarc's events, which capture
/// refuses) ends `--graphs auto` graphs for the run, which goes on op by op and says why;
/// `--graphs on` makes it an error.
#[test]
fn cuda_graph_capture_failure_falls_back_with_auto() {
    let _gpu = exclusive();
    let tracked = Device::new_cuda(0).unwrap(); // candle's default: events on
    let calc = shipped(DType::F64, &tracked);
    // More than 64 atoms: `auto` captures (a molecule that runs as one kernel would not).
    let s = water_box(27, 3);
    let settings = MdSettings {
        steps: 50,
        traj_every: 0,
        ..Default::default()
    };
    let run = |graphs: Graphs| {
        let f = PainnForces::new(&calc, &s, settings.skin)
            .unwrap()
            .with_graphs(graphs)
            .unwrap();
        let mut sim = Simulation::new(f, &s, settings.clone(), serde_json::Value::Null)?;
        sim.run(&mut |_| {})?;
        let why = sim.forces().graph_failure().map(str::to_owned);
        Ok::<_, mlff_distiller::Error>((host_positions(&sim.state().positions)?, why))
    };
    let (x_auto, why) = run(Graphs::Auto).unwrap();
    let (x_off, none) = run(Graphs::Off).unwrap();
    let why = why.expect("the failed capture is reported");
    assert!(why.contains("event tracking"), "{why}");
    assert!(none.is_none());
    assert!(max_force_diff(&x_auto, &x_off) < 1e-9);
    let err = run(Graphs::On).expect_err("--graphs on must fail");
    assert!(err.to_string().contains("event tracking"), "{err}");
}

/// `--graphs auto` captures no graph for a molecule whose eager call is one kernel with its
/// edge geometry in shared memory (the faster path there) and does for a larger system; the
/// trajectories follow `off`'s.
#[test]
fn cuda_auto_graphs_leave_feature_split_molecules_eager() {
    let _gpu = exclusive();
    let gpu = cuda();
    // f32, as `mlff md` runs: in f64 a molecule's edge geometry may not fit shared memory.
    let calc = shipped(DType::F32, &gpu);
    let settings = MdSettings {
        steps: 100,
        traj_every: 0,
        ..Default::default()
    };
    for (s, captured) in [(aspirin(), false), (water_box(27, 3), true)] {
        let run = |graphs: Graphs| {
            let f = PainnForces::new(&calc, &s, settings.skin)
                .unwrap()
                .with_graphs(graphs)
                .unwrap();
            let mut sim =
                Simulation::new(f, &s, settings.clone(), serde_json::Value::Null).unwrap();
            sim.run(&mut |_| {}).unwrap();
            let captures = sim.forces().graph_captures();
            (host_positions(&sim.state().positions).unwrap(), captures)
        };
        let (x_auto, captures) = run(Graphs::Auto);
        let (x_off, _) = run(Graphs::Off);
        assert_eq!(
            captures > 0,
            captured,
            "{} atoms: {captures} captures",
            s.len()
        );
        // f32 with atomic adds: the two runs part in the last bits.
        let dx = max_force_diff(&x_auto, &x_off);
        assert!(dx < 1e-4, "{} atoms: {dx} Å", s.len());
    }
}
