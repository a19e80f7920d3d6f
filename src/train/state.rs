//! Saving and restoring: the EMA weights as a checkpoint, and the whole training state to resume.

use super::config::TrainConfig;
use super::trainer::Trainer;
use super::variables::{set_vars, snapshot, FIXED};
use crate::checkpoint;
use crate::error::{Error, Result};
use candle_core::{DType, Device, Tensor};
use std::collections::{BTreeMap, HashMap};

/// "lr 0.001 there, 0.002 now; seed 1 there, 2 now" for the settings that differ.
fn differences(saved: &TrainConfig, now: &TrainConfig) -> String {
    let as_map = |c: &TrainConfig| match serde_json::to_value(c) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    let (a, b) = (as_map(saved), as_map(now));
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let null = serde_json::Value::Null;
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| {
            let (x, y) = (a.get(k).unwrap_or(&null), b.get(k).unwrap_or(&null));
            format!("{k} {x} there, {y} now")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl Trainer {
    /// Writes the EMA weights as a checkpoint.
    pub fn save_checkpoint(
        &self,
        path: &std::path::Path,
        provenance: &serde_json::Value,
    ) -> Result<()> {
        let cpu: BTreeMap<String, Tensor> = self
            .ema_tensors()?
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.to_dtype(DType::F32)?.to_device(&Device::Cpu)?)))
            .collect::<Result<_>>()?;
        checkpoint::save(path, &self.model_cfg, &cpu, provenance)
    }

    /// Everything needed to continue: weights, EMA, optimiser moments, counters.
    pub fn save_state(&self, path: &std::path::Path) -> Result<()> {
        let mut tensors: BTreeMap<String, Tensor> = BTreeMap::new();
        for (k, v) in snapshot(&self.varmap)? {
            tensors.insert(format!("param.{k}"), v);
        }
        for (k, v) in self.ema_tensors()? {
            tensors.insert(format!("ema.{k}"), v);
        }
        tensors.extend(self.opt.state()?);
        let tensors: Vec<(String, Tensor)> = tensors
            .into_iter()
            .map(|(k, v)| Ok((k, v.to_device(&Device::Cpu)?)))
            .collect::<Result<_>>()?;
        let meta = HashMap::from([
            ("step".to_string(), self.opt.step.to_string()),
            ("epoch".to_string(), self.epoch.to_string()),
            ("best_val_loss".to_string(), self.best_val_loss.to_string()),
            (
                "plateau_scale".to_string(),
                self.schedule.plateau_scale.to_string(),
            ),
            ("model_config".to_string(), self.model_cfg.to_json()),
            (
                "train_config".to_string(),
                serde_json::to_string(&self.cfg).expect("serialises"),
            ),
        ]);
        let bytes = safetensors::serialize(tensors, Some(meta))
            .map_err(|e| Error::Train(format!("serialising the training state: {e}")))?;
        crate::fsutil::write_atomic(path, &bytes)
    }

    /// Restores a state written by [`save_state`](Self::save_state) by a run with the same
    /// model and training configs.
    pub fn load_state(&mut self, path: &std::path::Path) -> Result<()> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.into(),
            cause: source,
        })?;
        let bad = |m: String| Error::Train(format!("{}: {m}", path.display()));
        let (_, header) = safetensors::SafeTensors::read_metadata(&bytes)
            .map_err(|e| bad(format!("not a training state: {e}")))?;
        let meta = header.metadata().clone().unwrap_or_default();
        let get = |k: &str| {
            meta.get(k)
                .cloned()
                .ok_or_else(|| bad(format!("missing `{k}`")))
        };
        if get("model_config")? != self.model_cfg.to_json() {
            return Err(bad("it was written for a different model config".into()));
        }
        let saved: TrainConfig = serde_json::from_str(&get("train_config")?)
            .map_err(|e| bad(format!("train_config: {e}")))?;
        if saved != self.cfg {
            return Err(bad(format!(
                "it was written with other training settings ({}); resume with the same ones",
                differences(&saved, &self.cfg)
            )));
        }
        let parse = |k: &str| get(k)?.parse::<f64>().map_err(|e| bad(format!("{k}: {e}")));
        let all = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)?;
        let strip = |prefix: &str| -> BTreeMap<String, Tensor> {
            all.iter()
                .filter_map(|(k, v)| k.strip_prefix(prefix).map(|n| (n.to_string(), v.clone())))
                .collect()
        };
        set_vars(&self.varmap, &strip("param."))?;
        let ema = strip("ema.");
        for (k, v) in ema.iter().filter(|(k, _)| FIXED.contains(&k.as_str())) {
            self.fixed
                .insert(k.clone(), v.to_device(&self.device)?.to_dtype(self.dtype)?);
        }
        let flat = self.opt.flatten(|k, var| {
            let name = &self.opt.vars()[k].0;
            let t = ema
                .get(name)
                .ok_or_else(|| bad(format!("the EMA lacks `{name}`")))?;
            Ok(t.to_device(var.device())?.to_dtype(var.dtype())?)
        })?;
        self.ema.set(&flat)?;
        let moments: BTreeMap<String, Tensor> = all
            .iter()
            .filter(|(k, _)| k.starts_with("m.") || k.starts_with("v."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        self.opt.load_state(&moments, parse("step")? as u64)?;
        self.epoch = parse("epoch")? as usize;
        self.best_val_loss = parse("best_val_loss")?;
        self.schedule.plateau_scale = parse("plateau_scale")?;
        Ok(())
    }
}
