//! A batch's labels on the device, as the fused step reads them, padded where a captured step
//! runs a batch with fewer atoms than it was captured for (`step_graph`), and its stress labels
//! for the double backward's stress term.

use super::step_graph::StepPadding;
use crate::error::{Error, Result};
use crate::eval::stress_label;
use crate::stress::stress_volume;
use crate::structure::Batch;
use candle_core::{DType, Device, Tensor};

/// Reference energies and 1 / atoms per structure (f64), reference forces [N, 3] and a mask of
/// the real atoms \[N\] (the model's dtype), and 1 / structures, 1 / force components of the
/// whole step (f64 scalars, see [`Norms`]). Padding (structures holding no atom or every
/// padding atom) has 1 / atoms, forces and mask zero, so it adds nothing to the loss or its
/// gradient.
pub(super) struct Labels {
    pub(super) energy: Tensor,
    pub(super) inv_atoms: Tensor,
    pub(super) forces: Tensor,
    pub(super) mask: Tensor,
    pub(super) inv_structures: Tensor,
    pub(super) inv_components: Tensor,
}

/// The structures and atoms the loss is averaged over: a batch's own, or in a data-parallel
/// step (`replicas`) those of all ranks' shards together, so that the ranks' losses and
/// gradients add up to the whole batch's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Norms {
    pub(super) structures: usize,
    pub(super) atoms: usize,
}

impl Norms {
    pub(super) fn of(batch: &Batch) -> Self {
        Self {
            structures: batch.n_structures(),
            atoms: batch.n_atoms(),
        }
    }
}

impl Labels {
    /// The labels of `batch` in one f64 buffer on `dev`, padded to `padded`'s atoms and
    /// structures where given (at least one structure more than the batch: every padding atom
    /// is in the first of them), averaged over `norms`: [Ê (S) | 1 / n (S) | F̂ (3N) | mask (N)
    /// | 1 / B, 1 / 3n], S and N counting the padding.
    pub(super) fn packed(
        batch: &Batch,
        padded: Option<StepPadding>,
        norms: Norms,
        dev: &Device,
    ) -> Result<Tensor> {
        let (b, n) = (batch.n_structures(), batch.n_atoms());
        let (s, all) = match padded {
            Some(p) if p.atoms >= n && p.structures > b => (p.structures, p.atoms),
            Some(p) => {
                return Err(Error::Train(format!(
                    "a batch of {n} atoms in {b} structures padded to {} in {}",
                    p.atoms, p.structures
                )))
            }
            None => (b, n),
        };
        let mut host = Vec::with_capacity(2 * s + 4 * all + 2);
        host.extend(batch.structures.iter().map(|s| s.energy.unwrap_or(0.0)));
        host.extend(std::iter::repeat_n(0.0, s - b));
        host.extend(batch.structures.iter().map(|s| 1.0 / s.len().max(1) as f64));
        host.extend(std::iter::repeat_n(0.0, s - b));
        let before = host.len();
        host.extend(
            batch
                .structures
                .iter()
                .flat_map(|s| s.forces.iter().flatten().flatten().copied()),
        );
        if host.len() - before != 3 * n {
            return Err(Error::Train("a training frame has no forces".into()));
        }
        host.extend(std::iter::repeat_n(0.0, 3 * (all - n)));
        host.extend(std::iter::repeat_n(1.0, n));
        host.extend(std::iter::repeat_n(0.0, all - n));
        host.extend([
            1.0 / norms.structures.max(1) as f64,
            1.0 / (3 * norms.atoms).max(1) as f64,
        ]);
        let len = host.len();
        Ok(Tensor::from_vec(host, len, dev)?)
    }

    /// Views of a [`packed`](Self::packed) buffer of `s` structures and `n` atoms (padding
    /// included).
    pub(super) fn of(packed: &Tensor, s: usize, n: usize, dtype: DType) -> Result<Self> {
        let at = |start: usize, len: usize| packed.narrow(0, start, len);
        let scalar = |start: usize| -> Result<Tensor> { Ok(at(start, 1)?.squeeze(0)?) };
        Ok(Self {
            energy: at(0, s)?,
            inv_atoms: at(s, s)?,
            forces: at(2 * s, 3 * n)?.reshape((n, 3))?.to_dtype(dtype)?,
            mask: at(2 * s + 3 * n, n)?.to_dtype(dtype)?,
            inv_structures: scalar(2 * s + 4 * n)?,
            inv_components: scalar(2 * s + 4 * n + 1)?,
        })
    }
}

/// A batch's stress labels for the stress term of the loss: each labelled structure's σ̂
/// ([S, 3, 3], zero where unlabelled), its 1 / V times a mask ([S, 1, 1]: zero where
/// unlabelled) and 1 / (9 · labelled structures).
pub(super) struct StressLabels {
    stress: Tensor,
    inv_volume: Tensor,
    inv_components: f64,
}

impl StressLabels {
    /// `None` where the weight is 0 or no structure of `batch` has a stress label; an error
    /// naming the structure whose label cannot be read, or that has one without a cell periodic
    /// along all three axes.
    pub(super) fn of(
        batch: &Batch,
        weight: f64,
        dtype: DType,
        dev: &Device,
    ) -> Result<Option<Self>> {
        if weight == 0.0 {
            return Ok(None);
        }
        let (mut stress, mut inv_volume, mut labelled) = (Vec::new(), Vec::new(), 0usize);
        for (k, s) in batch.structures.iter().enumerate() {
            let label = stress_label(s)
                .map_err(|e| Error::Train(format!("structure {k} of the batch: {e}")))?;
            match (label, stress_volume(s)) {
                (Some(l), Some(v)) => {
                    stress.extend(l.iter().flatten());
                    inv_volume.push(1.0 / v);
                    labelled += 1;
                }
                (Some(_), None) => {
                    return Err(Error::Train(format!(
                        "structure {k} of the batch has a stress label but no cell periodic \
                         along all three axes"
                    )))
                }
                (None, _) => {
                    stress.extend([0.0; 9]);
                    inv_volume.push(0.0);
                }
            }
        }
        if labelled == 0 {
            return Ok(None);
        }
        let s = batch.n_structures();
        Ok(Some(Self {
            stress: Tensor::from_vec(stress, (s, 3, 3), dev)?.to_dtype(dtype)?,
            inv_volume: Tensor::from_vec(inv_volume, (s, 1, 1), dev)?.to_dtype(dtype)?,
            inv_components: 1.0 / (9 * labelled) as f64,
        }))
    }

    /// mean((σ − σ̂)²) over the labelled structures' components, σ = (∂E/∂ε) / V.
    pub(super) fn loss(&self, de_deps: &Tensor) -> Result<Tensor> {
        // Unlabelled structures: 1 / V and σ̂ are zero.
        let err = (de_deps.broadcast_mul(&self.inv_volume)? - &self.stress)?;
        Ok((err.sqr()?.sum_all()? * self.inv_components)?)
    }
}
