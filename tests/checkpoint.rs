//! Checkpoint round trip and one distinct error per kind of bad checkpoint.

mod common;

use candle_core::{DType, Device, Tensor};
use mlff_distiller::checkpoint::{self, FORMAT_VERSION};
use mlff_distiller::error::{CheckpointError, Error};
use mlff_distiller::model::init_varmap;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

fn tensors_of(seed: u64) -> BTreeMap<String, Tensor> {
    let vm = init_varmap(&common::small_config(), seed, DType::F32, &Device::Cpu).unwrap();
    let data = vm.data().lock().unwrap();
    data.iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
        .collect()
}

fn bytes(t: &Tensor) -> Vec<u8> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect()
}

/// The metadata a valid checkpoint has, to be spoiled one key at a time.
fn good_metadata() -> HashMap<String, String> {
    let cfg = common::small_config();
    HashMap::from([
        ("format".into(), "mlff-distiller".into()),
        ("format_version".into(), FORMAT_VERSION.to_string()),
        ("model".into(), "painn".into()),
        ("config".into(), cfg.to_json()),
        ("elements".into(), "[1,6,7,8]".into()),
        ("units".into(), checkpoint::UNITS.into()),
        ("provenance".into(), "{}".into()),
    ])
}

fn write_raw(path: &Path, tensors: &BTreeMap<String, Tensor>, meta: HashMap<String, String>) {
    let bytes = safetensors::serialize(tensors.clone(), Some(meta)).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn load_err(path: &Path) -> CheckpointError {
    match checkpoint::load(path) {
        Err(Error::Checkpoint { kind, .. }) => kind,
        other => panic!("expected a checkpoint error, got {other:?}"),
    }
}

#[test]
fn round_trip_is_bitwise() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let cfg = common::small_config();
    let tensors = tensors_of(5);
    let prov = serde_json::json!({"seed": 5, "note": "test"});
    checkpoint::save(&path, &cfg, &tensors, &prov).unwrap();
    let ck = checkpoint::load(&path).unwrap();
    assert_eq!(ck.config, cfg);
    assert_eq!(ck.provenance, prov);
    assert_eq!(ck.format_version, FORMAT_VERSION);
    assert_eq!(ck.units["energy"], "eV");
    assert_eq!(ck.tensors.len(), tensors.len());
    for (name, t) in &tensors {
        assert_eq!(bytes(&ck.tensors[name]), bytes(t), "tensor {name} changed");
    }
    // The model built from the checkpoint gives the same energies as from the originals.
    let model = ck.model(&Device::Cpu, DType::F32).unwrap();
    assert_eq!(model.config(), &cfg);
}

#[test]
fn each_defect_has_its_own_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.safetensors");
    let good = tensors_of(1);

    std::fs::write(&path, b"definitely not safetensors").unwrap();
    assert!(matches!(
        load_err(&path),
        CheckpointError::NotSafetensors(_)
    ));

    let mut m = good_metadata();
    m.remove("config");
    write_raw(&path, &good, m);
    assert!(matches!(
        load_err(&path),
        CheckpointError::MissingMetadata("config")
    ));

    let mut m = good_metadata();
    m.insert("format_version".into(), "99".into());
    write_raw(&path, &good, m);
    let e = load_err(&path);
    assert!(matches!(&e, CheckpointError::UnsupportedVersion { found, .. } if found == "99"));
    assert!(
        e.to_string().contains("unsupported format version `99`"),
        "{e}"
    );

    let mut m = good_metadata();
    m.insert("config".into(), "{\"hidden\": 16, \"bogus\": 1}".into());
    write_raw(&path, &good, m);
    assert!(matches!(
        load_err(&path),
        CheckpointError::BadMetadata { key: "config", .. }
    ));

    let mut m = good_metadata();
    m.insert("elements".into(), "[1,6]".into());
    write_raw(&path, &good, m);
    assert!(matches!(
        load_err(&path),
        CheckpointError::BadMetadata {
            key: "elements",
            ..
        }
    ));

    let mut t = good.clone();
    t.remove("blocks.1.update.mix.weight");
    write_raw(&path, &t, good_metadata());
    let e = load_err(&path);
    assert!(
        matches!(&e, CheckpointError::MissingTensors(v) if v == &["blocks.1.update.mix.weight"])
    );

    let mut t = good.clone();
    t.insert(
        "blocks.9.extra".into(),
        Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap(),
    );
    write_raw(&path, &t, good_metadata());
    assert!(matches!(load_err(&path), CheckpointError::ExtraTensors(v) if v == ["blocks.9.extra"]));

    let mut t = good.clone();
    t.insert(
        "filter.bias".into(),
        Tensor::zeros(5, DType::F32, &Device::Cpu).unwrap(),
    );
    write_raw(&path, &t, good_metadata());
    let e = load_err(&path);
    assert!(
        e.to_string()
            .contains("`filter.bias` is [5], expected [96]"),
        "{e}"
    );
    assert!(matches!(e, CheckpointError::ShapeMismatch(_)));

    let mut t = good.clone();
    t.insert(
        "readout.scale".into(),
        Tensor::new(&[1i64], &Device::Cpu).unwrap(),
    );
    write_raw(&path, &t, good_metadata());
    assert!(
        matches!(load_err(&path), CheckpointError::BadDtype { name, .. } if name == "readout.scale")
    );

    match checkpoint::load(&dir.path().join("missing.safetensors")) {
        Err(Error::Io { path, .. }) => assert!(path.ends_with("missing.safetensors")),
        other => panic!("expected an I/O error, got {other:?}"),
    }
}

#[test]
fn failed_save_keeps_the_old_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let cfg = common::small_config();
    checkpoint::save(&path, &cfg, &tensors_of(1), &serde_json::json!({})).unwrap();
    let before = std::fs::read(&path).unwrap();
    let mut broken = tensors_of(2);
    broken.remove("filter.weight");
    assert!(checkpoint::save(&path, &cfg, &broken, &serde_json::json!({})).is_err());
    assert_eq!(std::fs::read(&path).unwrap(), before);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "no temporary left"
    );
}
