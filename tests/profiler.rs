//! The profiler: transparent (a profiled calculator or MD run gives exactly the unprofiled
//! results), complete (every call and phase recorded), and its reports round-trip through JSON.

mod common;

use candle_core::{DType, Device};
use mlff_distiller::md::{Ensemble, MdSettings, PainnForces, Simulation};
use mlff_distiller::profiler::{Phase, ProfileReport, Profiled, ProfiledForces, Profiler};
use mlff_distiller::{Batch, Calculator};

#[test]
fn profiled_calculator_returns_exactly_the_unprofiled_results() {
    let calc = common::calculator(DType::F32, &Device::Cpu);
    let batch = Batch::new(vec![
        common::random_molecule(7, 1),
        common::random_box(20, 0.1, 2),
    ])
    .unwrap();
    let plain = calc.compute(&batch).unwrap();
    let profiled = Profiled::new(
        common::calculator(DType::F32, &Device::Cpu),
        Profiler::new(&Device::Cpu, 2).unwrap(),
    );
    for _ in 0..5 {
        assert_eq!(profiled.compute(&batch).unwrap(), plain);
    }
    let report = profiled.profiler().report("test", 1e9);
    assert_eq!(report.calls, 5);
    assert_eq!(report.records[0].structures, 2);
    assert_eq!(report.records[0].atoms, 27);
    let phases: Vec<Phase> = report.phases.iter().map(|p| p.phase).collect();
    assert_eq!(
        phases,
        [
            Phase::NeighborList,
            Phase::Upload,
            Phase::Forward,
            Phase::Backward,
            Phase::Download
        ]
    );
    let shares: f64 = report.phases.iter().map(|p| p.share).sum();
    assert!((shares - 1.0).abs() < 1e-9, "{shares}");
    for r in &report.records {
        let sum: f64 = r.segment.phases.iter().map(|p| p.1).sum();
        assert!((sum - r.segment.total_us).abs() < 1e-6 && sum > 0.0);
    }
    // Memory every 2 calls: after calls 0, 2, 4.
    assert_eq!(report.memory.len(), 3);
    assert!(report.memory[0].rss_bytes.is_some());
    assert!(report.latency_us.unwrap().min > 0.0);
}

#[test]
fn profiled_md_follows_the_same_trajectory_and_times_each_step() {
    let calc = common::calculator(DType::F64, &Device::Cpu);
    let s = common::random_molecule(8, 6);
    let settings = MdSettings {
        steps: 30,
        log_every: 1,
        traj_every: 0,
        ensemble: Ensemble::Nvt {
            temperature: 300.0,
            friction: 5.0,
        },
        stop_when_unstable: false,
        ..Default::default()
    };
    let run = |profile: bool| {
        let forces = PainnForces::new(&calc, &s, 0.3).unwrap();
        if profile {
            let f = ProfiledForces::new(forces, Profiler::new(&Device::Cpu, 10).unwrap(), s.len());
            let mut sim =
                Simulation::new(f, &s, settings.clone(), serde_json::Value::Null).unwrap();
            sim.run(&mut |_| {}).unwrap();
            (sim.records().to_vec(), Some(sim_report(&sim)))
        } else {
            let mut sim =
                Simulation::new(forces, &s, settings.clone(), serde_json::Value::Null).unwrap();
            sim.run(&mut |_| {}).unwrap();
            (sim.records().to_vec(), None)
        }
    };
    let (plain, _) = run(false);
    let (profiled, report) = run(true);
    assert_eq!(plain, profiled);
    let report = report.unwrap();
    // One record per force call: the start plus 30 steps; every step after the first has an
    // integrator phase.
    assert_eq!(report.calls, 31);
    assert!(report.records[1..]
        .iter()
        .all(|r| r.segment.phases[0].0 == Phase::Integrate));
}

fn sim_report<F: mlff_distiller::md::ForceProvider>(
    sim: &Simulation<ProfiledForces<F>>,
) -> ProfileReport {
    sim.forces().profiler().report("md", 1e9)
}

#[test]
fn reports_round_trip_through_json_and_trace() {
    let profiled = Profiled::new(
        common::calculator(DType::F32, &Device::Cpu),
        Profiler::new(&Device::Cpu, 1).unwrap(),
    );
    let batch = Batch::from_one(common::random_molecule(5, 3)).unwrap();
    for _ in 0..4 {
        profiled.compute(&batch).unwrap();
    }
    let report = profiled.profiler().report("round trip", 1e9);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("profile.json");
    report.save(&path).unwrap();
    assert_eq!(ProfileReport::load(&path).unwrap(), report);
    let trace = report.chrome_trace();
    let events = trace["traceEvents"].as_array().unwrap();
    // Per call: the call slice and its five phases.
    assert_eq!(events.len(), 4 * 6);
    assert!(report.markdown().contains("| whole call |"));
    // A molecule's passes on the CPU get the CPU's advice, not the GPU's.
    let passes: Vec<_> = report
        .hotspots
        .iter()
        .filter(|h| matches!(h.phase, Phase::Forward | Phase::Backward))
        .collect();
    assert!(!passes.is_empty(), "{:?}", report.hotspots);
    for h in passes {
        assert!(
            h.advice.contains("on the CPU") && !h.advice.contains("GPU"),
            "{}",
            h.advice
        );
    }
    let err = ProfileReport::load(&dir.path().join("missing.json")).unwrap_err();
    assert!(err.to_string().contains("missing.json"));
}
