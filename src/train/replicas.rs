//! Data-parallel training: one rank per device, each a trainer of its own on a thread of its
//! own (rank 0 is the caller's trainer, which keeps the data, validates and saves). Each step
//! splits the batch into one shard per rank; every rank takes its shard's fused loss and
//! gradients averaged over the whole batch's structures and atoms (`labels::Norms`), with
//! the force step h from all ranks' errors; the gradients are summed over the ranks in one
//! flat buffer (`collective`), and every rank takes the same AdamW step from the same sum, so
//! the weights stay equal without being sent. A step is then the one-device step of the
//! whole batch, up to the order of the f32 sums.
//!
//! All ranks pad their shards to the largest shard's shape (`step_graph::Need`), so they
//! capture and replay graphs of the same shapes at the same steps: every rank makes the same
//! sums in the same order, as NCCL requires.

use super::collective::{Collective, HostSum};
use super::force_gradient::ForceGradient;
use super::labels::Labels;
use super::ranks::{Job, Peers, Worker};
use super::resident::FramePlace;
use super::step_graph::{Need, StepPadding};
use super::trainer::{Frame, Trainer};
use super::variables::{set_vars, snapshot};
use super::TrainConfig;
use crate::error::{Error, Result};
use crate::graph::Graphs;
use crate::model::{init_varmap, PainnConfig};
use crate::ops::AdamWStep;
use crate::phase::NoClock;
use crate::tuning::Tuning;
use candle_core::{DType, Device, Tensor};
use std::collections::BTreeMap;
use std::sync::mpsc::channel;
use std::sync::Arc;

/// Rank 0's state on the host, which the other ranks start from.
#[derive(Clone)]
struct Seed {
    model_cfg: PainnConfig,
    cfg: TrainConfig,
    dtype: DType,
    graphs: Graphs,
    frames_on_device: bool,
    tuning: Tuning,
    params: BTreeMap<String, Tensor>,
    /// AdamW's moments and flat weights (`AdamW::snapshot`).
    moments: [Tensor; 3],
    ema: Tensor,
}

/// A rank's end of the sums, as it is handed to the rank's thread.
enum End {
    Host(HostSum),
    #[cfg(feature = "nccl")]
    Nccl(super::collective::nccl::NcclEnd),
}

impl End {
    fn into_collective(self) -> Collective {
        match self {
            Self::Host(h) => Collective::Host(h),
            #[cfg(feature = "nccl")]
            Self::Nccl(n) => n.into_collective(),
        }
    }
}

/// `idx` in `ranks` consecutive shards whose sizes differ by one at most.
fn shards(idx: &[usize], ranks: usize) -> Vec<&[usize]> {
    let (base, extra) = (idx.len() / ranks, idx.len() % ranks);
    let mut start = 0;
    (0..ranks)
        .map(|k| {
            let len = base + usize::from(k < extra);
            start += len;
            &idx[start - len..start]
        })
        .collect()
}

impl Trainer {
    /// Trains data-parallel over this trainer's device and `others` (all CUDA, with the `nccl`
    /// feature; or all CPU, where the ranks sum in host memory, as the tests do): each batch
    /// is split into one shard per device, see the module docs. It needs the fused force
    /// gradient. The other ranks start at the first optimiser step, from this trainer's state
    /// then (after a [`load_state`](Self::load_state), say).
    pub fn with_replicas(mut self, others: Vec<Device>) -> Result<Self> {
        if others.is_empty() {
            return Ok(self);
        }
        if self.cfg.gradient_mode(&self.device) != ForceGradient::Fused
            || self.cfg.stress_weight > 0.0
        {
            return Err(Error::Train(
                "training on several devices needs --force-gradient fused (no stress or \
                 Hessian term)"
                    .into(),
            ));
        }
        let mut seen = vec![self.device.location()];
        for d in &others {
            if d.is_cuda() && seen.contains(&d.location()) {
                return Err(Error::Train(format!(
                    "device {:?} is given twice for data-parallel training",
                    d.location()
                )));
            }
            if d.is_cuda() != self.device.is_cuda() {
                return Err(Error::Train(
                    "data-parallel training takes CUDA devices only, or CPU ones only".into(),
                ));
            }
            seen.push(d.location());
        }
        if self.device.is_cuda() && !cfg!(feature = "nccl") {
            return Err(Error::Train(
                "training on several GPUs needs a build with the `nccl` feature \
                 (cargo build --release --features nccl)"
                    .into(),
            ));
        }
        self.peers = Peers::Pending(others);
        Ok(self)
    }

    /// The devices training runs on, rank 0 first.
    pub fn ranks(&self) -> usize {
        1 + match &self.peers {
            Peers::None => 0,
            Peers::Pending(d) => d.len(),
            Peers::Running(w) => w.len(),
        }
    }

    fn seed(&self) -> Result<Seed> {
        let host = |t: &Tensor| t.to_device(&Device::Cpu);
        let params = snapshot(&self.varmap)?
            .into_iter()
            .map(|(k, v)| Ok((k, host(&v)?)))
            .collect::<Result<_>>()?;
        let [m, v, theta] = self.opt.snapshot()?;
        Ok(Seed {
            model_cfg: self.model_cfg.clone(),
            cfg: self.cfg.clone(),
            dtype: self.dtype,
            graphs: self.graphs,
            frames_on_device: !matches!(self.resident, FramePlace::Host),
            tuning: self.calc.tuning().clone(),
            params,
            moments: [host(&m)?, host(&v)?, host(&theta)?],
            ema: host(self.ema.as_tensor())?,
        })
    }

    /// A rank's trainer on `dev` in `seed`'s state, sharing the training frames `train`.
    fn from_seed(
        seed: Seed,
        train: Arc<Vec<Frame>>,
        dev: &Device,
        collective: Collective,
    ) -> Result<Self> {
        let varmap = init_varmap(&seed.model_cfg, seed.cfg.seed, seed.dtype, dev)?;
        set_vars(&varmap, &seed.params)?;
        let mut t = Self::assemble(
            &seed.model_cfg,
            &seed.cfg,
            varmap,
            dev,
            seed.dtype,
            train,
            Vec::new(),
        )?
        .with_tuning(seed.tuning)
        .with_graphs(seed.graphs)
        .with_frames_on_device(seed.frames_on_device);
        let moved = |x: &Tensor| x.to_device(dev)?.to_dtype(seed.dtype);
        let [m, v, theta] = &seed.moments;
        t.opt.restore(&[moved(m)?, moved(v)?, moved(theta)?])?;
        t.ema.set(&moved(&seed.ema)?)?;
        t.collective = Some(collective);
        Ok(t)
    }

    /// Starts the other ranks' threads where they are pending.
    fn start_peers(&mut self) -> Result<()> {
        let devices = match std::mem::replace(&mut self.peers, Peers::None) {
            Peers::Pending(devices) => devices,
            running => {
                self.peers = running;
                return Ok(());
            }
        };
        let ranks = devices.len() + 1;
        let seed = self.seed()?;
        let mut ends: Vec<End> = match self.device.is_cuda() {
            false => HostSum::ends(ranks).into_iter().map(End::Host).collect(),
            #[cfg(feature = "nccl")]
            true => {
                let all: Vec<Device> = std::iter::once(self.device.clone())
                    .chain(devices.iter().cloned())
                    .collect();
                super::collective::nccl::connect_all(&all)?
                    .into_iter()
                    .map(End::Nccl)
                    .collect()
            }
            #[cfg(not(feature = "nccl"))]
            true => return Err(Error::Train("several GPUs need the `nccl` feature".into())),
        };
        let mine = ends.remove(0);
        let mut workers = Vec::with_capacity(devices.len());
        let mut ready = Vec::with_capacity(devices.len());
        for (k, (dev, end)) in devices.into_iter().zip(ends).enumerate() {
            let (jobs, job_rx) = channel::<Job>();
            let (loss_tx, losses) = channel();
            let (ready_tx, ready_rx) = channel::<std::result::Result<(), String>>();
            let (seed, train) = (seed.clone(), self.train.clone());
            let thread = std::thread::Builder::new()
                .name(format!("mlff-rank-{}", k + 1))
                .spawn(move || {
                    let built = Trainer::from_seed(seed, train, &dev, end.into_collective());
                    let mut t = match built {
                        Ok(t) => t,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    for job in job_rx {
                        let loss = t.rank_step(&job).map_err(|e| e.to_string());
                        if loss_tx.send(loss).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|e| Error::Train(format!("starting rank {}: {e}", k + 1)))?;
            workers.push(Worker {
                jobs: Some(jobs),
                losses,
                thread: Some(thread),
            });
            ready.push(ready_rx);
        }
        for (k, r) in ready.into_iter().enumerate() {
            match r.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(Error::Train(format!("rank {}: {e}", k + 1))),
                Err(_) => return Err(Error::Train(format!("rank {} did not start", k + 1))),
            }
        }
        // Only a trainer whose ranks all started sums over them (a later step alone would
        // wait in a sum nobody joins).
        self.collective = Some(mine.into_collective());
        self.peers = Peers::Running(workers);
        Ok(())
    }

    /// One data-parallel step on the training frames `idx`: the shards sent to the other
    /// ranks, this rank's taken here. Returns the whole batch's loss (the ranks' sum).
    pub(super) fn parallel_step(&mut self, idx: &[usize], step: AdamWStep) -> Result<f64> {
        self.start_peers()?;
        let parts = shards(idx, self.ranks());
        // The shared shape: the largest shard's (each rank assembles its own batch).
        let need = parts
            .iter()
            .map(|p| self.need(p))
            .reduce(Need::max)
            .ok_or_else(|| Error::Train("a step with no ranks".into()))?;
        let norms = self.norms(idx);
        let job = |part: &[usize]| Job {
            idx: part.to_vec(),
            need,
            norms,
            step,
        };
        let Peers::Running(workers) = &self.peers else {
            return Err(Error::Train("the other ranks are not running".into()));
        };
        for (k, (w, part)) in workers.iter().zip(&parts[1..]).enumerate() {
            let sent = w.jobs.as_ref().map(|j| j.send(job(part)).is_ok());
            if sent != Some(true) {
                return Err(Error::Train(format!("rank {} has stopped", k + 1)));
            }
        }
        let own = self.rank_step(&job(parts[0]));
        // Every rank's answer is read, so that the next step starts with none pending.
        let Peers::Running(workers) = &self.peers else {
            return Err(Error::Train("the other ranks are not running".into()));
        };
        let mut total = own;
        for (k, w) in workers.iter().enumerate() {
            let theirs = match w.losses.recv() {
                Ok(Ok(loss)) => Ok(loss),
                Ok(Err(e)) => Err(Error::Train(format!("rank {}: {e}", k + 1))),
                Err(_) => Err(Error::Train(format!("rank {} has stopped", k + 1))),
            };
            total = match (total, theirs) {
                (Ok(a), Ok(b)) => Ok(a + b),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
        total
    }

    /// This rank's part of a step: its shard padded to the shared shape, replayed as a graph
    /// where steps are graphed, else op by op; the gradient summed over the ranks and the
    /// AdamW step taken. Returns the shard's part of the loss.
    fn rank_step(&mut self, job: &Job) -> Result<f64> {
        let Job {
            idx,
            need,
            norms,
            step,
        } = job;
        if self.graphed()? {
            self.place_frames()?;
            if let Some(k) = self.graph_for(*need, idx, *norms, *step, None, &mut NoClock)? {
                let graph = &self.step_graphs[k];
                let source = self.source(idx, graph.padded(), *norms, step, None, &mut NoClock)?;
                return graph.run(&source);
            }
        }
        let (batch, nl) = &Self::batch(&self.train, idx)?;
        let padded = StepPadding {
            atoms: need.atoms,
            structures: need.structures,
            capacity: need.edges,
        };
        let inputs = self.step_inputs(batch, nl, padded, *norms, step)?;
        let labels = Labels::of(&inputs.labels, padded.structures, padded.atoms, self.dtype)?;
        let (loss, named) = self.fused_device_step(&inputs.x, &labels, false)?;
        let g = self.flat_named(named)?;
        if let Some(c) = &self.collective {
            c.sum_in_place(&g)?;
        }
        self.opt.update(&g, *step, &inputs.values, &self.ema)?;
        Ok(loss.to_scalar::<f64>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::shards;

    #[test]
    fn shards_cover_the_batch_in_order() {
        let idx: Vec<usize> = (10..23).collect();
        let parts = shards(&idx, 3);
        assert_eq!(parts.iter().map(|p| p.len()).collect::<Vec<_>>(), [5, 4, 4]);
        assert_eq!(parts.concat(), idx);
        assert_eq!(shards(&idx[..1], 2)[1].len(), 0);
    }
}
