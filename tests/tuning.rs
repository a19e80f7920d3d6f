//! The tuning is the only door to the engine's thresholds: no other file reads the
//! environment, the CLI reads `--tuning FILE` and `MLFF_TUNING`, the plan follows them, and
//! reports record both.

mod common;

use candle_core::{DType, Device};
use mlff_distiller::model::Backend;
use mlff_distiller::plan::{FilterSource, Plan, SystemSize};
use mlff_distiller::systems::water_box;
use mlff_distiller::{Batch, PainnCalculator, Tuning};
use std::path::Path;
use std::process::Command;

/// Every source file under `dir` (recursively) with the given extensions.
fn sources(dir: &Path, exts: &[&str], out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, exts, out);
        } else if path
            .extension()
            .is_some_and(|e| exts.iter().any(|x| e == *x))
        {
            out.push(path);
        }
    }
}

/// `grep -rn 'MLFF_' src kernels` finds the tuning module only, besides the build-time commit
/// name that build.rs sets; and no file but the tuning module reads an environment variable at
/// run time.
#[test]
fn only_the_tuning_module_reads_the_environment() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &["rs"], &mut files);
    sources(&root.join("kernels"), &["cu", "cuh"], &mut files);
    assert!(files.len() > 50, "found only {} files", files.len());
    let tuning = root.join("src/tuning.rs");
    let mut offenders = Vec::new();
    for file in &files {
        if *file == tuning {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        for (k, line) in text.lines().enumerate() {
            let build_time = line.contains(r#"env!("MLFF_GIT_COMMIT")"#);
            let reads_env = line.contains("env::var") || line.contains("env::vars");
            if (line.contains("MLFF_") && !build_time) || reads_env {
                offenders.push(format!("{}:{}: {}", file.display(), k + 1, line.trim()));
            }
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
    let own = std::fs::read_to_string(&tuning).unwrap();
    assert!(own.contains("std::env::var(TUNING_VARIABLE)"));
}

/// The fused model follows its tuning: a water box runs filter rows kept, not kept, or not at
/// all as the tuning says, with the same energies and forces every way; on the CPU even a
/// molecule takes the rows by default.
#[test]
fn the_plan_follows_the_tuning_and_results_do_not() {
    let model = common::root().join("models/painn-gfn2.safetensors");
    let calc = PainnCalculator::from_checkpoint(&model, &Device::Cpu, DType::F32)
        .unwrap()
        .with_backend(Backend::Fused);
    let batch = Batch::new(vec![water_box(100, 0)]).unwrap();
    let (inputs, _) = calc.prepare(&batch).unwrap();
    let fused = calc.fused().unwrap().clone();
    let variants = [
        (Tuning::default(), FilterSource::Rows { kept: true }),
        (
            Tuning {
                filter_rows_keep_bytes: 0,
                ..Tuning::default()
            },
            FilterSource::Rows { kept: false },
        ),
        (
            Tuning {
                filter_rows_from_edges: Some(usize::MAX),
                first_block_sums: false,
                ..Tuning::default()
            },
            FilterSource::InKernel,
        ),
    ];
    let (e0, f0) = fused.energies_and_forces(&inputs).unwrap();
    for (tuning, want) in variants {
        let model = fused.clone().with_tuning(tuning.clone());
        let Plan::Layers(layers) = model.plan(&inputs).unwrap() else {
            panic!("the CPU runs the layers")
        };
        assert_eq!(layers.filter, want, "{:?}", tuning.changes());
        assert_eq!(layers.first_block_sums, tuning.first_block_sums);
        let (e, f) = model.energies_and_forces(&inputs).unwrap();
        let de = (e - &e0).unwrap().abs().unwrap().max_all().unwrap();
        let df = (f - &f0).unwrap().abs().unwrap().max_all().unwrap();
        let (de, df) = (
            de.to_scalar::<f32>().unwrap(),
            df.to_scalar::<f32>().unwrap(),
        );
        assert!(
            de < 1e-4 && df < 1e-4,
            "{:?}: ΔE {de} ΔF {df}",
            tuning.changes()
        );
    }
    // The CPU never takes the one-launch kernels, whatever the tuning says.
    let size = SystemSize {
        atoms: 21,
        edges: 300,
    };
    let plan = fused.plan_for(size, &Device::Cpu, DType::F32).unwrap();
    assert_eq!(plan.name(), "layers");
    let Plan::Layers(layers) = plan else {
        unreachable!()
    };
    assert_eq!(layers.filter, FilterSource::Rows { kept: true });
}

/// `--tuning FILE` and `MLFF_TUNING` reach the command; a bad key is refused naming the file
/// or the variable and the key, before any output is written.
#[test]
fn the_cli_reads_the_tuning_file_and_variable() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.json");
    std::fs::write(&good, r#"{"filter_rows_from_edges": 0}"#).unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"filter_rows_from_edge": 0}"#).unwrap();
    let json = dir.path().join("bench.json");
    let bench = |tuning: &Path, var: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mlff"));
        cmd.args(["bench", "--systems", "benzene", "--backend", "fused"])
            .args([
                "--warmup",
                "0",
                "--repeats",
                "1",
                "--device",
                "cpu",
                "--graphs",
                "off",
            ])
            .arg("--tuning")
            .arg(tuning)
            .arg("--json")
            .arg(&json)
            .env_remove("MLFF_TUNING");
        if let Some(v) = var {
            cmd.env("MLFF_TUNING", v);
        }
        cmd.output().unwrap()
    };
    let out = bench(&good, Some("prune_from_edges=7"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["tuning"]["filter_rows_from_edges"], 0);
    assert_eq!(report["tuning"]["prune_from_edges"], 7);
    assert_eq!(
        report["tuning"].as_object().unwrap().len(),
        Tuning::reasons().len()
    );
    let plan = &report["cases"][0]["plan"];
    assert_eq!(plan["path"], "layers", "{report}");
    assert_eq!(plan["filter"]["rows"]["kept"], true, "{plan}");
    std::fs::remove_file(&json).unwrap();
    let out = bench(&bad, None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("bad.json") && err.contains("filter_rows_from_edge"),
        "{err}"
    );
    let out = bench(&good, Some("no_such_key=1"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("MLFF_TUNING") && err.contains("no_such_key"),
        "{err}"
    );
    assert!(!json.exists(), "a refused tuning must write nothing");
}
