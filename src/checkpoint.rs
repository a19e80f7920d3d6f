//! Checkpoints: safetensors files whose header metadata carries the format version, the model
//! config, the element list, units and provenance. Loading checks every tensor name and shape
//! against the config and says exactly what is missing, extra or mis-shaped.

use crate::error::{CheckpointError, Error, Result};
use crate::model::{Painn, PainnConfig};
use candle_core::safetensors::Load;
use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Value of the `format` metadata key.
pub const FORMAT: &str = "mlff-distiller";
/// The checkpoint layout this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Units of every checkpoint (ASE's).
pub const UNITS: &str = r#"{"length":"Å","energy":"eV","forces":"eV/Å"}"#;

/// A loaded checkpoint: config, metadata and the tensors on the CPU in their stored dtype.
#[derive(Debug)]
pub struct Checkpoint {
    pub path: PathBuf,
    pub config: PainnConfig,
    pub format_version: u32,
    pub units: serde_json::Value,
    /// Free-form JSON: how the model was made (tool version, seed, data, teacher, ...).
    pub provenance: serde_json::Value,
    pub tensors: BTreeMap<String, Tensor>,
}

impl Checkpoint {
    /// Builds the model on `dev` in `dtype` (tensors are converted from their stored dtype).
    pub fn model(&self, dev: &Device, dtype: DType) -> Result<Painn> {
        let map: HashMap<String, Tensor> = self
            .tensors
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Ok(Painn::new(
            &self.config,
            VarBuilder::from_tensors(map, dtype, dev),
        )?)
    }

    /// Number of scalar parameters.
    pub fn n_parameters(&self) -> usize {
        self.tensors.values().map(|t| t.elem_count()).sum()
    }
}

/// Name → shape of every tensor a model with `cfg` has, derived by building one.
pub fn expected_shapes(cfg: &PainnConfig) -> Result<BTreeMap<String, Vec<usize>>> {
    let varmap = VarMap::new();
    Painn::new(
        cfg,
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
    )?;
    let data = varmap.data().lock().expect("varmap lock");
    Ok(data
        .iter()
        .map(|(k, v)| (k.clone(), v.dims().to_vec()))
        .collect())
}

/// Writes a checkpoint atomically (temporary file, then rename), so an existing file is
/// never left half-written.
pub fn save(
    path: &Path,
    cfg: &PainnConfig,
    tensors: &BTreeMap<String, Tensor>,
    provenance: &serde_json::Value,
) -> Result<()> {
    let err = |kind| Error::Checkpoint {
        path: path.into(),
        kind,
    };
    cfg.validate()?;
    check_tensors(cfg, tensors.iter().map(|(k, v)| (k.as_str(), v.dims()))).map_err(err)?;
    let metadata = HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("format_version".to_string(), FORMAT_VERSION.to_string()),
        ("model".to_string(), "painn".to_string()),
        ("config".to_string(), cfg.to_json()),
        (
            "elements".to_string(),
            serde_json::to_string(&cfg.elements).expect("elements serialise"),
        ),
        ("units".to_string(), UNITS.to_string()),
        ("provenance".to_string(), provenance.to_string()),
    ]);
    let cpu: Vec<(String, Tensor)> = tensors
        .iter()
        .map(|(k, v)| Ok((k.clone(), v.to_device(&Device::Cpu)?)))
        .collect::<Result<_>>()?;
    let bytes = safetensors::serialize(cpu, Some(metadata))
        .map_err(|e| err(CheckpointError::NotSafetensors(e.to_string())))?;
    crate::fsutil::write_atomic(path, &bytes)
}

/// Saves the variables of a training VarMap.
pub fn save_varmap(
    path: &Path,
    cfg: &PainnConfig,
    varmap: &VarMap,
    provenance: &serde_json::Value,
) -> Result<()> {
    let data = varmap.data().lock().expect("varmap lock");
    let tensors = data
        .iter()
        .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
        .collect();
    drop(data);
    save(path, cfg, &tensors, provenance)
}

/// Reads and verifies a checkpoint.
pub fn load(path: &Path) -> Result<Checkpoint> {
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.into(),
        cause: source,
    })?;
    parse(path, &bytes)
}

fn parse(path: &Path, bytes: &[u8]) -> Result<Checkpoint> {
    let err = |kind| Error::Checkpoint {
        path: path.into(),
        kind,
    };
    let not_st =
        |e: safetensors::SafeTensorError| err(CheckpointError::NotSafetensors(e.to_string()));
    let (_, header) = safetensors::SafeTensors::read_metadata(bytes).map_err(not_st)?;
    let meta = header.metadata().clone().unwrap_or_default();
    let get = |key: &'static str| {
        meta.get(key)
            .map(String::as_str)
            .ok_or(CheckpointError::MissingMetadata(key))
    };
    let check_meta = || -> std::result::Result<_, CheckpointError> {
        if get("format")? != FORMAT {
            return Err(CheckpointError::BadMetadata {
                key: "format",
                msg: format!("`{}` is not `{FORMAT}`", get("format")?),
            });
        }
        let version = get("format_version")?;
        let format_version = match version.parse::<u32>() {
            Ok(v) if v == FORMAT_VERSION => v,
            _ => {
                return Err(CheckpointError::UnsupportedVersion {
                    found: version.into(),
                    supported: FORMAT_VERSION,
                })
            }
        };
        if get("model")? != "painn" {
            return Err(CheckpointError::BadMetadata {
                key: "model",
                msg: format!("unknown model `{}`", get("model")?),
            });
        }
        let config =
            PainnConfig::from_json(get("config")?).map_err(|e| CheckpointError::BadMetadata {
                key: "config",
                msg: e.to_string(),
            })?;
        let json = |key: &'static str| {
            serde_json::from_str::<serde_json::Value>(get(key)?).map_err(|e| {
                CheckpointError::BadMetadata {
                    key,
                    msg: e.to_string(),
                }
            })
        };
        let elements: Vec<u8> = serde_json::from_value(json("elements")?).map_err(|e| {
            CheckpointError::BadMetadata {
                key: "elements",
                msg: e.to_string(),
            }
        })?;
        if elements != config.elements {
            return Err(CheckpointError::BadMetadata {
                key: "elements",
                msg: format!(
                    "{elements:?} differs from the config's {:?}",
                    config.elements
                ),
            });
        }
        Ok((format_version, config, json("units")?, json("provenance")?))
    };
    let (format_version, config, units, provenance) = check_meta().map_err(err)?;
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(not_st)?;
    let views = st.tensors();
    check_tensors(&config, views.iter().map(|(k, v)| (k.as_str(), v.shape()))).map_err(err)?;
    let mut tensors = BTreeMap::new();
    for (name, view) in views {
        if !matches!(
            view.dtype(),
            safetensors::Dtype::F32 | safetensors::Dtype::F64
        ) {
            return Err(err(CheckpointError::BadDtype {
                name,
                found: format!("{:?}", view.dtype()),
            }));
        }
        tensors.insert(name, view.load(&Device::Cpu)?);
    }
    Ok(Checkpoint {
        path: path.into(),
        config,
        format_version,
        units,
        provenance,
        tensors,
    })
}

/// Compares names and shapes with what `cfg` needs; names every difference.
fn check_tensors<'a>(
    cfg: &PainnConfig,
    found: impl Iterator<Item = (&'a str, &'a [usize])>,
) -> std::result::Result<(), CheckpointError> {
    let want = expected_shapes(cfg).map_err(|e| CheckpointError::BadMetadata {
        key: "config",
        msg: e.to_string(),
    })?;
    let found: BTreeMap<&str, &[usize]> = found.collect();
    let missing: Vec<String> = want
        .keys()
        .filter(|k| !found.contains_key(k.as_str()))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(CheckpointError::MissingTensors(missing));
    }
    let extra: Vec<String> = found
        .keys()
        .filter(|k| !want.contains_key(**k))
        .map(|k| k.to_string())
        .collect();
    if !extra.is_empty() {
        return Err(CheckpointError::ExtraTensors(extra));
    }
    let wrong: Vec<_> = want
        .iter()
        .filter(|(k, shape)| found[k.as_str()] != shape.as_slice())
        .map(|(k, shape)| (k.clone(), found[k.as_str()].to_vec(), shape.clone()))
        .collect();
    if !wrong.is_empty() {
        return Err(CheckpointError::ShapeMismatch(wrong));
    }
    Ok(())
}
