//! Hessian-informed training (after Amin et al., ICLR 2025): each labelled frame carries the
//! teacher's Hessian-vector product `hvp` along a random unit direction `hvp_direction` over
//! its 3N coordinates (per-atom columns, as `teachers/label.py --hessian-vectors` writes them),
//! and the loss adds w_H · mean((H·v − Ĥ·v)²) over the labelled frames' components, the
//! student's H·v by central differences of its forces, −(F(x + h·v) − F(x − h·v)) / 2h.

use crate::calculator::Calculator;
use crate::error::{Error, Result};
use crate::model::Painn;
use crate::neighbors::NeighborList;
use crate::structure::{Batch, Structure};
use candle_core::{DType, Device, Tensor};

/// A per-atom `NAME:R:3` column as numbers, if the frame has one.
fn column(s: &Structure, name: &str) -> std::result::Result<Option<Vec<[f64; 3]>>, String> {
    let Some(col) = s.arrays.iter().find(|a| a.name == name) else {
        return Ok(None);
    };
    if col.ncols != 3 || col.values.len() != 3 * s.len() {
        return Err(format!("`{name}` must be a per-atom column of 3 reals"));
    }
    let mut out = Vec::with_capacity(s.len());
    for (i, row) in col.values.chunks(3).enumerate() {
        let mut v = [0.0; 3];
        for (x, t) in v.iter_mut().zip(row) {
            *x = t
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .ok_or_else(|| {
                    format!("atom {i}: `{name}` component `{t}` is not a finite number")
                })?;
        }
        out.push(v);
    }
    Ok(Some(out))
}

/// A frame's Hessian-vector label: the direction v and the teacher's H·v (eV/Å²).
pub type HvpLabel = (Vec<[f64; 3]>, Vec<[f64; 3]>);

/// A frame's [`HvpLabel`], both columns or neither; the direction must have unit norm over all
/// 3N components.
pub fn hvp_label(s: &Structure) -> std::result::Result<Option<HvpLabel>, String> {
    match (column(s, "hvp_direction")?, column(s, "hvp")?) {
        (None, None) => Ok(None),
        (Some(v), Some(hv)) => {
            let norm = v.iter().flatten().map(|x| x * x).sum::<f64>().sqrt();
            if (norm - 1.0).abs() > 1e-6 {
                return Err(format!("`hvp_direction` has norm {norm}, not 1"));
            }
            Ok(Some((v, hv)))
        }
        _ => Err("`hvp` and `hvp_direction` come together: one of them is missing".into()),
    }
}

/// `s` moved by `step` along `v`.
fn moved(s: &Structure, v: &[[f64; 3]], step: f64) -> Structure {
    let mut m = s.clone();
    for (x, v) in m.positions.iter_mut().zip(v) {
        for d in 0..3 {
            x[d] += step * v[d];
        }
    }
    m
}

/// The Hessian-vector products H·v of `calc` (eV/Å²) for each frame and its direction, by
/// central differences of its forces with step `h` (Å).
pub fn hessian_vector_products(
    calc: &dyn Calculator,
    frames: &[Structure],
    directions: &[Vec<[f64; 3]>],
    h: f64,
) -> Result<Vec<Vec<[f64; 3]>>> {
    let mut shifted = Vec::with_capacity(2 * frames.len());
    for sign in [1.0, -1.0] {
        for (s, v) in frames.iter().zip(directions) {
            shifted.push(moved(s, v, sign * h));
        }
    }
    let p = calc.compute(&Batch::new(shifted)?)?;
    p.check_finite()?;
    let b = frames.len();
    Ok((0..b)
        .map(|k| {
            p.forces[k]
                .iter()
                .zip(&p.forces[b + k])
                .map(|(plus, minus)| std::array::from_fn(|d| (minus[d] - plus[d]) / (2.0 * h)))
                .collect()
        })
        .collect())
}

/// A batch's Hessian-vector labels for the loss: the directions per atom (zero for frames
/// without labels), the teacher's H·v [N, 3], a mask [N, 1] of the labelled frames' atoms and
/// 1 / their components.
pub(super) struct HessianLabels {
    directions: Vec<[f64; 3]>,
    hvp: Tensor,
    mask: Tensor,
    inv_components: f64,
}

impl HessianLabels {
    /// `None` where the weight is 0 or no frame of `batch` has labels.
    pub(super) fn of(
        batch: &Batch,
        weight: f64,
        dtype: DType,
        dev: &Device,
    ) -> Result<Option<Self>> {
        if weight == 0.0 {
            return Ok(None);
        }
        let n = batch.n_atoms();
        let (mut directions, mut hvp, mut mask) = (Vec::with_capacity(n), Vec::new(), Vec::new());
        let mut labelled = 0usize;
        for (k, s) in batch.structures.iter().enumerate() {
            let label = hvp_label(s)
                .map_err(|e| Error::Train(format!("structure {k} of the batch: {e}")))?;
            match label {
                Some((v, hv)) => {
                    directions.extend(v);
                    hvp.extend(hv.iter().flatten());
                    mask.extend(std::iter::repeat_n(1.0, s.len()));
                    labelled += s.len();
                }
                None => {
                    directions.extend(std::iter::repeat_n([0.0; 3], s.len()));
                    hvp.extend(std::iter::repeat_n(0.0, 3 * s.len()));
                    mask.extend(std::iter::repeat_n(0.0, s.len()));
                }
            }
        }
        if labelled == 0 {
            return Ok(None);
        }
        Ok(Some(Self {
            directions,
            hvp: Tensor::from_vec(hvp, (n, 3), dev)?.to_dtype(dtype)?,
            mask: Tensor::from_vec(mask, (n, 1), dev)?.to_dtype(dtype)?,
            inv_components: 1.0 / (3 * labelled) as f64,
        }))
    }

    /// mean((H·v − Ĥ·v)²) over the labelled components, differentiable in the weights: the
    /// batch at x ± h·v keeps x's neighbour list (a pair crossing the cutoff within h weighs
    /// nothing: the cutoff function and its slope vanish there), forces from a backward pass
    /// whose graph is kept.
    pub(super) fn loss(
        &self,
        calc: &crate::PainnCalculator,
        model: &Painn,
        batch: &Batch,
        nl: &NeighborList,
        h: f64,
    ) -> Result<Tensor> {
        let n = batch.n_atoms();
        let mut structures = Vec::with_capacity(2 * batch.n_structures());
        for sign in [1.0, -1.0] {
            for (k, s) in batch.structures.iter().enumerate() {
                let v = &self.directions[batch.offsets[k]..batch.offsets[k + 1]];
                structures.push(moved(s, v, sign * h));
            }
        }
        let all = Batch::new(structures)?;
        let all_nl = NeighborList::concat([nl, nl].into_iter(), &[0, n]);
        let (inputs, positions) = calc.prepare_with(&all, &all_nl)?;
        let energies = model.energies(&inputs)?;
        let grads = energies.sum_all()?.backward()?;
        let x = positions.as_tensor();
        let gradient = grads
            .get(x)
            .ok_or_else(|| Error::Train("the energy does not depend on the positions".into()))?;
        // H·v = (∇E(x + h·v) − ∇E(x − h·v)) / 2h.
        let hv = ((gradient.narrow(0, 0, n)? - gradient.narrow(0, n, n)?)? / (2.0 * h))?;
        let err = (hv - &self.hvp)?.broadcast_mul(&self.mask)?;
        Ok((err.sqr()?.sum_all()? * self.inv_components)?)
    }
}
