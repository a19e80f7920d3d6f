//! Training a PaiNN student on teacher labels: loss on energies per atom and forces (through
//! second-order backprop), AdamW, warm-up + cosine or plateau schedule, gradient clipping, EMA
//! of the weights, per-element reference energies and scale/shift fitted before training.

mod adamw;
mod data;
mod force_gradient;
mod reference;
mod schedule;

pub use adamw::AdamW;
pub use data::{split_by_trajectory, Dataset};
pub use force_gradient::ForceGradient;
use force_gradient::{displacement_rms, step_along};
pub use reference::{composition, fit_reference_energies, fit_scale_shift};
pub use schedule::{LrSchedule, Schedule};

use crate::calculator::{atom_energies_and_forces, PainnCalculator};
use crate::checkpoint::{self, Checkpoint};
use crate::error::{Error, Result};
use crate::model::Backend;
use crate::model::{init_varmap, FusedPainn, Painn, PainnConfig};
use crate::neighbors::{structure_neighbor_list, NeighborList};
use crate::profiler::NoClock;
use crate::structure::{Batch, Structure};
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// Names of statistics fitted from data and kept fixed during training.
const FIXED: [&str; 3] = ["readout.atom_ref", "readout.scale", "readout.shift"];

/// How to train (saved with every checkpoint's provenance).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    pub epochs: usize,
    pub batch_size: usize,
    pub lr: f64,
    pub lr_min: f64,
    pub warmup_steps: u64,
    pub schedule: Schedule,
    pub weight_decay: f64,
    /// Weight of the mean squared energy-per-atom error (eV²).
    pub energy_weight: f64,
    /// Weight of the mean squared force-component error ((eV/Å)²).
    pub force_weight: f64,
    /// Clip the global gradient norm to this (0: no clipping).
    pub clip_grad_norm: f64,
    /// Decay of the exponential moving average of the weights (0: none).
    pub ema_decay: f64,
    pub seed: u64,
    /// How the force loss is differentiated with respect to the weights.
    pub force_gradient: ForceGradient,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 100,
            batch_size: 16,
            lr: 1e-3,
            lr_min: 1e-5,
            warmup_steps: 100,
            schedule: Schedule::Cosine,
            weight_decay: 0.0,
            energy_weight: 1.0,
            force_weight: 100.0,
            clip_grad_norm: 10.0,
            ema_decay: 0.99,
            seed: 0,
            force_gradient: ForceGradient::default(),
        }
    }
}

impl TrainConfig {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::Train(m.to_string()));
        if self.batch_size == 0 {
            return bad("batch_size must be at least 1");
        }
        if !(self.lr > 0.0 && self.lr.is_finite()) || self.lr_min < 0.0 {
            return bad("lr must be positive and lr_min non-negative");
        }
        if self.energy_weight < 0.0 || self.force_weight < 0.0 {
            return bad("loss weights must be non-negative");
        }
        if self.energy_weight + self.force_weight == 0.0 {
            return bad("energy_weight and force_weight are both 0: nothing to fit");
        }
        if !(0.0..1.0).contains(&self.ema_decay) {
            return bad("ema_decay must be in [0, 1)");
        }
        Ok(())
    }
}

/// A labelled frame with its neighbour list (positions never change during training).
struct Frame {
    structure: Structure,
    edges: NeighborList,
}

/// Energy and force errors of one evaluation.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Metrics {
    pub loss: f64,
    pub energy_mae: f64,
    pub energy_per_atom_mae: f64,
    pub force_mae: f64,
    pub frames: usize,
}

/// Errors of one prediction of a batch against its labels, on the host in f64.
struct HostErrors {
    /// Energy error of each structure (eV; atom energies summed in f64).
    energy: Vec<f64>,
    /// Force error of each atom (eV/Å).
    forces: Vec<[f64; 3]>,
}

impl HostErrors {
    fn of(batch: &Batch, atom_energies: &Tensor, forces: &Tensor) -> Result<Self> {
        let atom_e = atom_energies.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        let f = forces.to_dtype(DType::F64)?.to_vec2::<f64>()?;
        let mut out = Self {
            energy: Vec::with_capacity(batch.n_structures()),
            forces: Vec::with_capacity(batch.n_atoms()),
        };
        for (k, s) in batch.structures.iter().enumerate() {
            let atoms = batch.offsets[k]..batch.offsets[k + 1];
            let e: f64 = atom_e[atoms.clone()].iter().sum();
            out.energy.push(e - s.energy.unwrap_or(0.0));
            for (fr, fp) in s.forces.iter().flatten().zip(&f[atoms]) {
                out.forces
                    .push([fp[0] - fr[0], fp[1] - fr[1], fp[2] - fr[2]]);
            }
        }
        Ok(out)
    }

    /// The training loss: w_E · mean((ΔE / n_atoms)²) + w_F · mean(ΔF²) over components.
    fn loss(&self, cfg: &TrainConfig, batch: &Batch) -> f64 {
        let per_atom = self
            .energy
            .iter()
            .zip(&batch.structures)
            .map(|(de, s)| (de / s.len() as f64).powi(2));
        let mut loss = cfg.energy_weight * per_atom.sum::<f64>() / self.energy.len().max(1) as f64;
        if cfg.force_weight > 0.0 {
            let sq = self.forces.iter().flatten().map(|c| c * c).sum::<f64>();
            loss += cfg.force_weight * sq / (3 * self.forces.len()).max(1) as f64;
        }
        loss
    }
}

pub struct Trainer {
    pub model_cfg: PainnConfig,
    pub cfg: TrainConfig,
    device: Device,
    dtype: DType,
    varmap: VarMap,
    calc: PainnCalculator,
    opt: AdamW,
    /// The fixed statistics (their EMA is themselves).
    fixed: BTreeMap<String, Tensor>,
    /// EMA of the trainable weights, flat in the optimiser's order.
    ema: Tensor,
    pub schedule: LrSchedule,
    train: Vec<Frame>,
    val: Vec<Frame>,
    pub epoch: usize,
    pub best_val_loss: f64,
}

fn frames(structures: &[Structure], cutoff: f64) -> Result<Vec<Frame>> {
    structures
        .iter()
        .map(|s| {
            Ok(Frame {
                edges: structure_neighbor_list(s, cutoff)?,
                structure: s.clone(),
            })
        })
        .collect()
}

impl Trainer {
    /// Sets up training from scratch (seeded init, statistics fitted to `train`) or from the
    /// weights of `init` (fine-tuning: its statistics are kept).
    pub fn new(
        model_cfg: &PainnConfig,
        cfg: &TrainConfig,
        train: &Dataset,
        val: &Dataset,
        device: &Device,
        dtype: DType,
        init: Option<&Checkpoint>,
    ) -> Result<Self> {
        cfg.validate()?;
        model_cfg.validate()?;
        train.check_elements(model_cfg)?;
        val.check_elements(model_cfg)?;
        let varmap = init_varmap(model_cfg, cfg.seed, dtype, device)?;
        match init {
            Some(ck) => set_vars(&varmap, &ck.tensors)?,
            None => {
                let refs = fit_reference_energies(&train.frames, &model_cfg.elements);
                let (scale, shift) = fit_scale_shift(&train.frames, &model_cfg.elements, &refs);
                let stats = BTreeMap::from([
                    (
                        "readout.atom_ref".to_string(),
                        Tensor::new(refs, &Device::Cpu)?,
                    ),
                    (
                        "readout.scale".to_string(),
                        Tensor::new(&[scale], &Device::Cpu)?,
                    ),
                    (
                        "readout.shift".to_string(),
                        Tensor::new(&[shift], &Device::Cpu)?,
                    ),
                ]);
                set_vars(&varmap, &stats)?;
            }
        }
        let model = Painn::new(model_cfg, VarBuilder::from_varmap(&varmap, dtype, device))?;
        let calc = PainnCalculator::new(model, device.clone(), dtype);
        let mut trainable: Vec<_> = varmap
            .data()
            .lock()
            .expect("varmap lock")
            .iter()
            .filter(|(k, _)| !FIXED.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        trainable.sort_by(|a, b| a.0.cmp(&b.0));
        let opt = AdamW::new(trainable, cfg.weight_decay)?;
        let mut fixed = snapshot(&varmap)?;
        fixed.retain(|k, _| FIXED.contains(&k.as_str()));
        let ema = opt.flat_weights()?;
        let train = frames(&train.frames, model_cfg.cutoff)?;
        let val = frames(&val.frames, model_cfg.cutoff)?;
        let steps_per_epoch = train.len().div_ceil(cfg.batch_size) as u64;
        let schedule = LrSchedule::new(
            cfg.schedule.clone(),
            cfg.lr,
            cfg.lr_min,
            cfg.warmup_steps,
            steps_per_epoch * cfg.epochs as u64,
        );
        Ok(Self {
            model_cfg: model_cfg.clone(),
            cfg: cfg.clone(),
            device: device.clone(),
            dtype,
            varmap,
            calc,
            opt,
            fixed,
            ema,
            schedule,
            train,
            val,
            epoch: 0,
            best_val_loss: f64::INFINITY,
        })
    }

    /// Runs the model's autograd graph with `ops` (the same maths; `Custom` by default).
    pub fn with_backend(mut self, backend: Backend) -> Self {
        self.calc = self.calc.with_backend(backend);
        self
    }

    /// Picks the fused kernels of the force-gradient passes under `tuning`.
    pub fn with_tuning(mut self, tuning: crate::tuning::Tuning) -> Self {
        self.calc = self.calc.with_tuning(tuning);
        self
    }

    pub fn n_train(&self) -> usize {
        self.train.len()
    }

    pub fn step(&self) -> u64 {
        self.opt.step
    }

    pub fn optimizer(&self) -> &AdamW {
        &self.opt
    }

    /// The batch of training frames `idx`, with its merged neighbour list.
    fn batch(frames: &[Frame], idx: &[usize]) -> Result<(Batch, NeighborList)> {
        let batch = Batch::new(idx.iter().map(|&k| frames[k].structure.clone()).collect())?;
        let nl = NeighborList::concat(idx.iter().map(|&k| &frames[k].edges), &batch.offsets);
        Ok((batch, nl))
    }

    /// Loss of training frames `idx` and its gradients with respect to every variable, the
    /// force term's by [`TrainConfig::force_gradient`].
    pub fn loss_and_grads(&self, idx: &[usize]) -> Result<(f64, GradStore)> {
        let (batch, nl) = Self::batch(&self.train, idx)?;
        let mode = self.cfg.force_gradient.on(&self.device);
        if mode == ForceGradient::Directional && self.cfg.force_weight > 0.0 {
            return self.directional_loss_and_grads(&batch, &nl);
        }
        // Forces come from a first backward pass whose graph is kept, so the force loss can
        // be differentiated again: that needs CANDLE_GRAD_DO_NOT_DETACH=1 in the environment
        // before the first backward on this thread (`mlff train` sets it).
        let loss = self.loss(&batch, &nl)?;
        let value = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        Ok((value, loss.backward()?))
    }

    /// [`ForceGradient::Directional`]: energies and forces at x by the fused kernels (no
    /// graph), then one forward and backward pass over the batch at x + h·u and x − h·u,
    /// u = F − F̂ (see `force_gradient`): their difference gives the force term's gradient,
    /// their mean the energy term's.
    fn directional_loss_and_grads(
        &self,
        batch: &Batch,
        nl: &NeighborList,
    ) -> Result<(f64, GradStore)> {
        let model = self.calc.model();
        let (inputs, _) = self.calc.prepare_with(batch, nl)?;
        let fused = FusedPainn::new(model, model.tuning())?;
        let b = batch.n_structures();
        let pass = fused.forward(&inputs)?;
        let errors = HostErrors::of(batch, &pass.atom_energies, &pass.forces()?)?;
        let h = step_along(&errors.forces, displacement_rms(self.dtype));
        let step = h.unwrap_or(0.0);
        // The batch at x + h·u and x − h·u (or at x alone when every force is exact).
        let signs: &[f64] = if h.is_some() { &[1.0, -1.0] } else { &[0.0] };
        let mut structures = Vec::with_capacity(signs.len() * b);
        for &sign in signs {
            for (k, s) in batch.structures.iter().enumerate() {
                let u = &errors.forces[batch.offsets[k]..batch.offsets[k + 1]];
                let mut moved = s.clone();
                for (x, u) in moved.positions.iter_mut().zip(u) {
                    for d in 0..3 {
                        x[d] += sign * step * u[d];
                    }
                }
                structures.push(moved);
            }
        }
        // The copies keep x's neighbour list: they are ~1e-3 Å away, and a pair that crosses
        // the cutoff in between weighs ~1e-7 (the cosine cutoff and its slope vanish there).
        let copies = signs.len();
        let all = Batch::new(structures)?;
        let n = batch.n_atoms();
        let offsets: Vec<usize> = (0..copies).map(|c| c * n).collect();
        let all_nl = NeighborList::concat(vec![nl; copies].into_iter(), &offsets);
        let (all_inputs, _) = self.calc.prepare_with(&all, &all_nl)?;
        let energies = model.energies(&all_inputs)?.reshape((copies, b))?;
        // Energy term: its gradient is 2 w_E mean(ΔE_k ∂E_k/∂θ / n_k²), ΔE_k the error at x,
        // with ∂E_k/∂θ taken as the mean of the copies' (equal to O(h²)).
        let dev = &self.device;
        let weights: Vec<f64> = (0..b)
            .map(|k| {
                let n_k = batch.structures[k].len() as f64;
                2.0 * errors.energy[k] / (n_k * n_k * b as f64)
            })
            .collect();
        let weights = Tensor::from_vec(weights, b, dev)?.to_dtype(self.dtype)?;
        let mean_energies = energies.mean(0)?;
        let mut surrogate = ((mean_energies * weights)?.sum_all()? * self.cfg.energy_weight)?;
        if let Some(h) = h {
            let along = (energies.get(0)? - energies.get(1)?)?.sum_all()?;
            let m = 3.0 * batch.n_atoms() as f64;
            let c = -self.cfg.force_weight / (m * h);
            surrogate = (surrogate + (along * c)?)?;
        }
        Ok((errors.loss(&self.cfg, batch), surrogate.backward()?))
    }

    /// The weighted loss as a tensor whose force term is differentiable (double backward).
    fn loss(&self, batch: &Batch, nl: &NeighborList) -> Result<Tensor> {
        let calc = &self.calc;
        let (inputs, positions) = calc.prepare_with(batch, nl)?;
        let dev = &self.device;
        let energies = calc.model().energies(&inputs)?;
        let n_atoms: Vec<f64> = batch.structures.iter().map(|s| s.len() as f64).collect();
        let e_ref: Vec<f64> = batch
            .structures
            .iter()
            .map(|s| s.energy.unwrap_or(0.0))
            .collect();
        let b = batch.n_structures();
        let n_atoms = Tensor::from_vec(n_atoms, b, dev)?.to_dtype(self.dtype)?;
        let e_ref = Tensor::from_vec(e_ref, b, dev)?.to_dtype(self.dtype)?;
        let e_err = ((&energies - e_ref)? / n_atoms)?;
        let mut loss = (e_err.sqr()?.mean_all()? * self.cfg.energy_weight)?;
        if self.cfg.force_weight > 0.0 {
            let forces = match energies.sum_all()?.backward()?.get(&inputs.positions) {
                Some(g) => g.neg()?,
                None => positions.as_tensor().zeros_like()?,
            };
            if !nl.is_empty() && !forces.track_op() {
                return Err(Error::Train(
                    "forces were detached from the graph, so the force loss has no gradient: \
                     set CANDLE_GRAD_DO_NOT_DETACH=1 before the first backward pass"
                        .into(),
                ));
            }
            let f_ref: Vec<f64> = batch
                .structures
                .iter()
                .flat_map(|s| s.forces.iter().flatten().flatten().copied())
                .collect();
            let f_ref = Tensor::from_vec(f_ref, (batch.n_atoms(), 3), dev)?.to_dtype(self.dtype)?;
            let f_loss = (forces - f_ref)?.sqr()?.mean_all()?;
            loss = (loss + (f_loss * self.cfg.force_weight)?)?;
        }
        Ok(loss)
    }

    /// One pass over the training frames in a seeded order (the order depends on the seed and
    /// the epoch only, so a resumed run sees the same batches). `on_step(step, loss)` is called
    /// after every optimiser step. Returns the mean training loss.
    pub fn train_epoch(&mut self, mut on_step: impl FnMut(u64, f64)) -> Result<f64> {
        let mut order: Vec<usize> = (0..self.train.len()).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(self.cfg.seed ^ (self.epoch as u64 + 1) << 32);
        order.shuffle(&mut rng);
        let (mut total, mut n) = (0.0, 0usize);
        for idx in order.chunks(self.cfg.batch_size) {
            let (loss, grads) = self.loss_and_grads(idx)?;
            if !loss.is_finite() {
                return Err(Error::Train(format!(
                    "loss became {loss} at step {} (epoch {}): lower the learning rate",
                    self.opt.step + 1,
                    self.epoch
                )));
            }
            let grads = self.opt.flat_grads(&grads)?;
            let scale = match self.cfg.clip_grad_norm {
                c if c > 0.0 => {
                    let norm = AdamW::norm(&grads)?;
                    if norm > c {
                        c / norm
                    } else {
                        1.0
                    }
                }
                _ => 1.0,
            };
            let lr = self.schedule.at(self.opt.step + 1);
            let weights = self.opt.step_flat(&grads, lr, scale)?;
            self.update_ema(&weights)?;
            total += loss * idx.len() as f64;
            n += idx.len();
            on_step(self.opt.step, loss);
        }
        self.epoch += 1;
        Ok(total / n.max(1) as f64)
    }

    /// Folds the weights after a step (flat, in the optimiser's order) into their EMA.
    fn update_ema(&mut self, weights: &Tensor) -> Result<()> {
        let d = self.cfg.ema_decay;
        if d == 0.0 {
            self.ema = weights.clone();
            return Ok(());
        }
        // Warm-up of the decay so early weights do not dominate.
        let t = self.opt.step as f64;
        let d = d.min((1.0 + t) / (10.0 + t));
        self.ema = ((&self.ema * d)? + (weights * (1.0 - d))?)?;
        debug_assert!(!self.ema.track_op(), "the EMA is recorded in the graph");
        Ok(())
    }

    /// The EMA of every tensor of the model by name (fixed statistics included, unchanged).
    fn ema_tensors(&self) -> Result<BTreeMap<String, Tensor>> {
        let mut out = self.fixed.clone();
        for ((name, _), t) in self.opt.vars().iter().zip(self.opt.unflatten(&self.ema)?) {
            out.insert(name.clone(), t.contiguous()?);
        }
        Ok(out)
    }

    /// The EMA weights as a model (what checkpoints hold and validation uses).
    pub fn ema_model(&self) -> Result<Painn> {
        let map: HashMap<String, Tensor> = self.ema_tensors()?.into_iter().collect();
        Ok(Painn::new(
            &self.model_cfg,
            VarBuilder::from_tensors(map, self.dtype, &self.device),
        )?)
    }

    /// Loss and errors of the EMA model on the validation frames.
    pub fn validate(&self) -> Result<Metrics> {
        // The fused kernels' energies and forces (inference: no graph), totals summed in f64.
        let calc = PainnCalculator::new(self.ema_model()?, self.device.clone(), self.dtype)
            .with_backend(Backend::Fused);
        let mut m = Metrics::default();
        let idx: Vec<usize> = (0..self.val.len()).collect();
        let (mut n_f, mut loss_sum) = (0usize, 0.0);
        for chunk in idx.chunks(self.cfg.batch_size.max(32)) {
            let (batch, nl) = Self::batch(&self.val, chunk)?;
            let (inputs, positions) = calc.prepare_with(&batch, &nl)?;
            let (atom_e, f) =
                atom_energies_and_forces(calc.model(), &inputs, &positions, &mut NoClock)?;
            let errors = HostErrors::of(&batch, &atom_e, &f)?;
            for (de, s) in errors.energy.iter().zip(&batch.structures) {
                m.energy_mae += de.abs();
                m.energy_per_atom_mae += de.abs() / s.len() as f64;
            }
            m.force_mae += errors.forces.iter().flatten().map(|c| c.abs()).sum::<f64>();
            n_f += 3 * errors.forces.len();
            loss_sum += errors.loss(&self.cfg, &batch) * chunk.len() as f64;
        }
        let n = self.val.len().max(1) as f64;
        m.frames = self.val.len();
        m.loss = loss_sum / n;
        m.energy_mae /= n;
        m.energy_per_atom_mae /= n;
        m.force_mae /= n_f.max(1) as f64;
        Ok(m)
    }

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
            source,
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
                "it was written with different training settings ({}); resume with the same ones",
                serde_json::to_string(&saved).unwrap_or_default()
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
        self.ema = self.opt.flatten(|k, var| {
            let name = &self.opt.vars()[k].0;
            let t = ema
                .get(name)
                .ok_or_else(|| bad(format!("the EMA lacks `{name}`")))?;
            Ok(t.to_device(var.device())?.to_dtype(var.dtype())?)
        })?;
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

/// Copies of every variable's current value, detached: a copy of a `Var` is otherwise recorded
/// in the graph, and every EMA update would then keep all earlier EMA tensors alive.
fn snapshot(varmap: &VarMap) -> Result<BTreeMap<String, Tensor>> {
    varmap
        .data()
        .lock()
        .expect("varmap lock")
        .iter()
        .map(|(k, v)| Ok((k.clone(), v.as_tensor().detach().copy()?)))
        .collect()
}

/// Sets the named variables (converting device and dtype); unknown names are an error.
fn set_vars(varmap: &VarMap, values: &BTreeMap<String, Tensor>) -> Result<()> {
    let data = varmap.data().lock().expect("varmap lock");
    for (name, value) in values {
        let var = data
            .get(name)
            .ok_or_else(|| Error::Train(format!("no model variable named `{name}`")))?;
        var.set(
            &value
                .to_device(var.device())?
                .to_dtype(var.dtype())?
                .reshape(var.shape())?,
        )?;
    }
    Ok(())
}
