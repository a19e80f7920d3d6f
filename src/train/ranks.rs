//! The other ranks of a data-parallel run as a trainer holds them (`replicas` runs them): their
//! threads, and the jobs and losses that pass between them and rank 0.

use super::labels::Norms;
use super::step_graph::Need;
use crate::ops::AdamWStep;
use candle_core::Device;
use std::sync::mpsc::{Receiver, Sender};
use std::thread::JoinHandle;

/// The other ranks of a data-parallel run: none, their devices (started at the first step,
/// from the state the trainer has then), or running.
pub(super) enum Peers {
    None,
    Pending(Vec<Device>),
    Running(Vec<Worker>),
}

impl Peers {
    pub(super) fn any(&self) -> bool {
        !matches!(self, Self::None)
    }
}

/// A rank's shard of one step (training frames, which the rank assembles itself) and what
/// all ranks share of it.
pub(super) struct Job {
    pub(super) idx: Vec<usize>,
    pub(super) need: Need,
    pub(super) norms: Norms,
    pub(super) step: AdamWStep,
}

/// A rank on a thread of its own: jobs in, losses out.
pub(super) struct Worker {
    pub(super) jobs: Option<Sender<Job>>,
    pub(super) losses: Receiver<std::result::Result<f64, String>>,
    pub(super) thread: Option<JoinHandle<()>>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing the job channel ends the thread's loop.
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
