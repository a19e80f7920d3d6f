//! The training loop: set-up, seeded epochs of optimiser steps, the EMA of the weights.

use super::adamw::AdamW;
use super::collective::Collective;
use super::config::TrainConfig;
use super::data::Dataset;
use super::force_gradient::ForceGradient;
use super::ranks::Peers;
use super::reference::{fit_reference_energies, fit_scale_shift};
use super::resident::FramePlace;
use super::schedule::LrSchedule;
use super::step_graph::StepGraph;
use super::variables::{set_vars, snapshot, FIXED};
use crate::calculator::PainnCalculator;
use crate::checkpoint::Checkpoint;
use crate::error::{Error, Result};
use crate::graph::Graphs;
use crate::interrupt::StopFlag;
use crate::model::Backend;
use crate::model::{init_varmap, Painn, PainnConfig};
use crate::neighbors::{structure_neighbor_list, wrap_positions, NeighborList};
use crate::phase::{NoClock, Phase, PhaseClock};
use crate::structure::{Batch, Structure};
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;

/// A batch of training frames with its merged list, where it was assembled ahead of its step.
pub(super) type Ready = Option<(Batch, NeighborList)>;

/// A labelled frame with its neighbour list (positions never change during training).
pub(super) struct Frame {
    pub(super) structure: Structure,
    pub(super) edges: NeighborList,
}

pub struct Trainer {
    pub model_cfg: PainnConfig,
    pub cfg: TrainConfig,
    pub(super) device: Device,
    pub(super) dtype: DType,
    pub(super) varmap: VarMap,
    pub(super) calc: PainnCalculator,
    pub(super) opt: AdamW,
    /// The fixed statistics (their EMA is themselves).
    pub(super) fixed: BTreeMap<String, Tensor>,
    /// EMA of the trainable weights, flat in the optimiser's order.
    pub(super) ema: Var,
    pub schedule: LrSchedule,
    /// Shared with the other ranks of a data-parallel run, which build their shards from it.
    pub(super) train: Arc<Vec<Frame>>,
    pub(super) val: Vec<Frame>,
    pub epoch: usize,
    pub best_val_loss: f64,
    /// Checked after every optimiser step ([`Trainer::with_stop`]).
    pub(super) stop: StopFlag,
    /// Whether steps replay as CUDA graphs ([`Trainer::with_graphs`]), and those captured.
    pub(super) graphs: Graphs,
    pub(super) step_graphs: Vec<StepGraph>,
    /// This rank's end of the sums of a data-parallel run (`replicas`); None on one device.
    pub(super) collective: Option<Collective>,
    /// The other ranks of a data-parallel run ([`Trainer::with_replicas`]).
    pub(super) peers: Peers,
    /// Where the training frames are for captured steps ([`Trainer::with_frames_on_device`]).
    pub(super) resident: FramePlace,
}

/// The frames with their lists; periodic positions wrapped into the cell in f64 first (see
/// [`wrap_positions`]: the labels do not change, f32 digits are kept).
fn frames(structures: &[Structure], cutoff: f64) -> Result<Vec<Frame>> {
    structures
        .iter()
        .map(|s| {
            let mut structure = s.clone();
            wrap_positions(&mut structure.positions, s.cell.as_ref(), s.pbc)?;
            Ok(Frame {
                edges: structure_neighbor_list(&structure, cutoff)?,
                structure,
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
        let train = Arc::new(frames(&train.frames, model_cfg.cutoff)?);
        let val = frames(&val.frames, model_cfg.cutoff)?;
        Self::assemble(model_cfg, cfg, varmap, device, dtype, train, val)
    }

    /// A trainer of `varmap`'s weights (the EMA starting at them, fresh moments).
    pub(super) fn assemble(
        model_cfg: &PainnConfig,
        cfg: &TrainConfig,
        varmap: VarMap,
        device: &Device,
        dtype: DType,
        train: Arc<Vec<Frame>>,
        val: Vec<Frame>,
    ) -> Result<Self> {
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
        let ema = Var::from_tensor(&opt.flat_weights()?)?;
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
            stop: StopFlag::new(),
            graphs: Graphs::Auto,
            step_graphs: Vec::new(),
            collective: None,
            peers: Peers::None,
            resident: FramePlace::Undecided,
        })
    }

    /// Replays each fused step as a CUDA graph (`step_graph`): `Auto` where it can (a CUDA
    /// device opened with a stream of its own, as `device::select` does, and the fused force
    /// gradient), `On` (an error where it cannot), `Off`.
    pub fn with_graphs(mut self, graphs: Graphs) -> Self {
        self.graphs = graphs;
        self
    }

    /// Whether steps replay as graphs; `On` where they cannot is an error naming why.
    pub(super) fn graphed(&self) -> Result<bool> {
        let why_not = if self.cfg.gradient_mode(&self.device) != ForceGradient::Fused {
            Some("they need --force-gradient fused")
        } else if self.cfg.stress_weight > 0.0 {
            Some("a stress term strains the step's copies on the host, outside a graph")
        } else if !crate::graph::capturable(&self.device) {
            Some("they need a CUDA device with a stream of its own (device::select)")
        } else {
            None
        };
        match (self.graphs, why_not) {
            (Graphs::Off, _) | (Graphs::Auto, Some(_)) => Ok(false),
            (_, None) => Ok(true),
            (Graphs::On, Some(why)) => Err(Error::Train(format!("--graphs on: {why}"))),
        }
    }

    /// Whether captured steps may hold the training frames on the device (where they fit a
    /// quarter of its free memory) and gather each batch there: `true` by default; `false`
    /// uploads every batch, leaving that memory to other work on a shared GPU.
    pub fn with_frames_on_device(mut self, allowed: bool) -> Self {
        self.resident = match allowed {
            true => FramePlace::Undecided,
            false => FramePlace::Host,
        };
        self
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

    /// Ends an epoch early with [`Error::Interrupted`] after the step during which `stop` was
    /// raised (the weights are those of that step; the epoch count is not advanced).
    pub fn with_stop(mut self, stop: StopFlag) -> Self {
        self.stop = stop;
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
    pub(super) fn batch(frames: &[Frame], idx: &[usize]) -> Result<(Batch, NeighborList)> {
        let batch = Batch::new(idx.iter().map(|&k| frames[k].structure.clone()).collect())?;
        let nl = NeighborList::concat(idx.iter().map(|&k| &frames[k].edges), &batch.offsets);
        Ok((batch, nl))
    }

    /// One pass over the training frames in a seeded order (the order depends on the seed and
    /// the epoch only, so a resumed run sees the same batches). `on_step(step, loss)` is called
    /// after every optimiser step. Returns the mean training loss. Where steps take batches
    /// assembled on the host, a thread assembles each while the step before it runs.
    pub fn train_epoch(&mut self, mut on_step: impl FnMut(u64, f64)) -> Result<f64> {
        let mut order: Vec<usize> = (0..self.train.len()).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(self.cfg.seed ^ (self.epoch as u64 + 1) << 32);
        order.shuffle(&mut rng);
        let chunks: Vec<&[usize]> = order.chunks(self.cfg.batch_size).collect();
        let graphed = self.graphed()?;
        if graphed {
            self.place_frames()?;
        }
        let gathered = graphed && matches!(self.resident, FramePlace::Device(_));
        let prefetch = !gathered && !self.peers.any();
        let train = self.train.clone();
        let (mut total, mut n) = (0.0, 0usize);
        std::thread::scope(|scope| -> Result<()> {
            let (ahead, ready) = sync_channel(1);
            if prefetch {
                let chunks = &chunks;
                scope.spawn(move || {
                    for idx in chunks {
                        if ahead.send(Self::batch(&train, idx)).is_err() {
                            break;
                        }
                    }
                });
            }
            for idx in &chunks {
                let batch = match prefetch {
                    true => Some(ready.recv().map_err(|_| {
                        Error::Train("the batch-assembling thread stopped".into())
                    })??),
                    false => None,
                };
                let loss = self.step_with(idx, batch, &mut NoClock)?;
                total += loss * idx.len() as f64;
                n += idx.len();
                on_step(self.opt.step, loss);
                if let Some(signal) = self.stop.raised() {
                    return Err(Error::Interrupted(signal));
                }
            }
            Ok(())
        })?;
        self.epoch += 1;
        Ok(total / n.max(1) as f64)
    }

    /// One optimiser step on the training frames `idx`, its phases marked on `clock`
    /// (`benches/harness/train_step_times` reads them). Returns the batch's loss.
    pub fn optimizer_step(&mut self, idx: &[usize], clock: &mut dyn PhaseClock) -> Result<f64> {
        self.step_with(idx, None, clock)
    }

    /// [`optimizer_step`](Self::optimizer_step), with the frames' batch where it was
    /// assembled ahead ([`Ready`]).
    fn step_with(
        &mut self,
        idx: &[usize],
        ready: Ready,
        clock: &mut dyn PhaseClock,
    ) -> Result<f64> {
        let lr = self.schedule.at(self.opt.step + 1);
        // The EMA's decay is warmed up so that early weights do not dominate.
        let t = (self.opt.step + 1) as f64;
        let decay = match self.cfg.ema_decay {
            d if d > 0.0 => d.min((1.0 + t) / (10.0 + t)),
            _ => 0.0,
        };
        let step = self
            .opt
            .next_step(lr, self.cfg.clip_grad_norm.max(0.0), decay);
        let replayed = match self.peers.any() {
            true => Some(self.parallel_step(idx, step)?),
            false => self.replayed(idx, step, ready.as_ref(), clock)?,
        };
        let loss = match replayed {
            Some(loss) => loss,
            None => {
                let (loss, grads) = self.loss_and_grads_of(idx, ready, clock)?;
                if loss.is_finite() {
                    clock.mark(Phase::Optimizer)?;
                    let grads = self.opt.flat_grads(&grads)?;
                    let values = step.values(self.dtype, &self.device)?;
                    self.opt.update(&grads, step, &values, &self.ema)?;
                }
                loss
            }
        };
        // (A replayed step whose gradient was not finite left the weights as they were.)
        if !loss.is_finite() {
            return Err(Error::Train(format!(
                "loss became {loss} at step {} (epoch {}): lower the learning rate",
                self.opt.step + 1,
                self.epoch
            )));
        }
        self.opt.step += 1;
        Ok(loss)
    }

    /// The EMA of every tensor of the model by name (fixed statistics included, unchanged).
    pub(super) fn ema_tensors(&self) -> Result<BTreeMap<String, Tensor>> {
        let mut out = self.fixed.clone();
        for ((name, _), t) in self.opt.vars().iter().zip(self.opt.unflatten(&self.ema)?) {
            // A copy: the EMA buffer is written in place by the next step.
            out.insert(name.clone(), t.copy()?);
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
}
