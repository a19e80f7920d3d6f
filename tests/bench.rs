//! `mlff bench` reports: regression checks against a baseline (library and CLI exit status),
//! JSON round trip, plots.

mod common;

use common::mlff;
use mlff_distiller::bench::{BenchCase, BenchReport};
use mlff_distiller::profiler::Stats;

fn case(system: &str, path: &str, median_ms: f64) -> BenchCase {
    BenchCase {
        system: system.into(),
        batch: 1,
        atoms: 21,
        edges: 292,
        path: path.into(),
        latency_ms: Stats::of(&[median_ms * 0.99, median_ms, median_ms * 1.01]).unwrap(),
        structures_per_s: 1e3 / median_ms,
        atom_steps_per_s: 21e3 / median_ms,
        prepare_ms: 1.0,
        peak_memory_bytes: Some(1 << 20),
        max_de: 0.0,
        max_df: 0.0,
        plan: serde_json::Value::Null,
    }
}

fn report(cases: Vec<BenchCase>) -> BenchReport {
    BenchReport {
        device: "test".into(),
        dtype: "F32".into(),
        tuning: serde_json::Value::Null,
        cases,
        teacher: serde_json::Value::Null,
    }
}

#[test]
fn ten_percent_slower_is_a_regression_two_percent_is_not() {
    let baseline = report(vec![
        case("aspirin", "custom", 10.0),
        case("aspirin", "stock", 10.0),
        case("water-1000", "custom", 30.0),
    ]);
    // (The baseline names autograd by its old name, custom.)
    let current = report(vec![
        case("aspirin", "autograd", 11.0),
        case("aspirin", "stock", 10.2),
        case("water-1000", "autograd", 20.0),
        case("benzene", "autograd", 99.0),
    ]);
    let r = current.regressions(&baseline, 0.05);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(
        (r[0].system.as_str(), r[0].path.as_str()),
        ("aspirin", "autograd")
    );
    assert!((r[0].ratio - 1.1).abs() < 1e-12);
    assert!(current.regressions(&baseline, 0.15).is_empty());
}

#[test]
fn bench_cli_writes_reports_and_fails_on_regression() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bench");
    let args = |extra: &[&str]| {
        let mut v = vec![
            "bench",
            "--systems",
            "ethanol,ethanol-x2",
            "--backend",
            "autograd,stock",
            "--warmup",
            "1",
            "--repeats",
            "3",
            "--device",
            "cpu",
            // Each run below rewrites the first one's reports.
            "--overwrite",
            "--out",
        ];
        v.push(out.to_str().unwrap());
        v.extend_from_slice(extra);
        v.iter().map(|s| s.to_string()).collect::<Vec<String>>()
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        mlff(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let o = run(&[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let first = BenchReport::load(&out.join("report.json")).unwrap();
    assert_eq!(first.cases.len(), 4);
    let c = &first.cases[2];
    assert_eq!((c.system.as_str(), c.batch, c.atoms), ("ethanol-x2", 2, 18));
    assert!((c.structures_per_s - 2.0 * 1e3 / c.latency_ms.median).abs() < 1e-9);
    // The stock path agrees with ours.
    assert!(first.cases[1].max_df < 1e-4 && first.cases[1].max_de < 1e-3);
    for png in [
        "latency_vs_atoms.png",
        "throughput_vs_batch.png",
        "memory_vs_atoms.png",
    ] {
        assert!(out.join(png).exists(), "{png}");
    }

    // A baseline ten times as fast as the first run: every case regressed. (Twice as fast
    // failed once in CI: a later run of a case can be 2x faster than the first, cold one.)
    let mut fast = first.clone();
    fast.cases.iter_mut().for_each(|c| {
        c.latency_ms.median /= 10.0;
    });
    let fast_path = dir.path().join("fast.json");
    fast.save(&fast_path).unwrap();
    let o = run(&[
        "--baseline",
        fast_path.to_str().unwrap(),
        "--fail-on-regression",
    ]);
    assert_eq!(o.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&o.stdout).contains("REGRESSION ethanol autograd"));
    // Without --fail-on-regression it reports and succeeds; a slow baseline passes.
    let o = run(&["--baseline", fast_path.to_str().unwrap()]);
    assert!(o.status.success());
    let mut slow = first;
    slow.cases
        .iter_mut()
        .for_each(|c| c.latency_ms.median *= 100.0);
    let slow_path = dir.path().join("slow.json");
    slow.save(&slow_path).unwrap();
    let o = run(&[
        "--baseline",
        slow_path.to_str().unwrap(),
        "--fail-on-regression",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
}

/// `--export` writes, beside the model inputs, each structure's cell, periodicity and masses
/// (for the PyTorch MD reference): the water box's cell is the one its edges' image shifts are
/// multiples of, a molecule has none, and the masses are its elements'.
#[test]
fn bench_export_holds_cells_periodicity_and_masses() {
    use candle_core::{DType, Device};
    let dir = tempfile::tempdir().unwrap();
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/models/painn-gfn2.safetensors");
    let export = dir.path().join("export");
    let o = mlff(&[
        "bench",
        "--model",
        model,
        "--systems",
        "ethanol,water-60",
        "--backend",
        "fused",
        "--warmup",
        "0",
        "--repeats",
        "1",
        "--device",
        "cpu",
        "--out",
        dir.path().join("bench").to_str().unwrap(),
        "--export",
        export.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let load = |name: &str| {
        candle_core::safetensors::load(export.join(format!("{name}.safetensors")), &Device::Cpu)
            .unwrap()
    };
    let f64s = |t: &candle_core::Tensor| {
        t.to_dtype(DType::F64)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap()
    };

    let ethanol = load("ethanol");
    assert!(f64s(&ethanol["cells"]).iter().all(|&x| x == 0.0));
    assert_eq!(ethanol["pbc"].dims(), &[1, 3]);
    assert!(f64s(&ethanol["pbc"]).iter().all(|&x| x == 0.0));
    let masses: f64 = f64s(&ethanol["masses"]).iter().sum();
    let c2h6o = 2.0 * 12.011 + 6.0 * 1.008 + 15.999;
    assert!(
        (masses - c2h6o).abs() < 1e-9,
        "ethanol's masses sum to {masses}"
    );

    let water = load("water-60");
    let box20 = mlff_distiller::systems::water_box(20, 0);
    let cell = box20.cell.unwrap();
    assert_eq!(water["cells"].dims(), &[1, 3, 3]);
    assert_eq!(f64s(&water["cells"]), cell.concat());
    assert!(f64s(&water["pbc"]).iter().all(|&x| x == 1.0));
    let masses = f64s(&water["masses"]);
    assert_eq!(masses.len(), 60);
    assert!(masses.chunks(3).all(|m| m == [15.999, 1.008, 1.008]));
    // Every image shift is a whole multiple of the cell's rows (the cell is diagonal here).
    let offsets = f64s(&water["offsets"]);
    assert!(
        offsets.iter().any(|&x| x != 0.0),
        "the box has edges across its faces"
    );
    for shift in offsets.chunks(3) {
        for (a, s) in shift.iter().enumerate() {
            let n = s / cell[a][a];
            assert!(
                (n - n.round()).abs() < 1e-5,
                "shift {shift:?} is not of the cell {cell:?}"
            );
        }
    }
}
