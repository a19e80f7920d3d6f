//! Stress of periodic structures as the strain derivative of the energy: every structure's
//! positions and image offsets go through a symmetric strain ε (r → r (1 + ε), rows as
//! vectors), and one backward pass at ε = 0 gives the forces and ∂E/∂ε together. With V the
//! cell volume, ASE's stress is σ = (1/V) ∂E/∂ε (positive = tensile; Voigt order xx yy zz yz
//! xz xy) and the virial W = -∂E/∂ε = Σ_edges r_ij ⊗ F_ij.
//!
//! The autograd and stock backends run candle's autograd through the model's graph; the fused
//! one runs its explicit adjoint to the edges, whose forces give both the atoms' forces and
//! the virial (no autograd graph, no strained copy of the inputs).

use crate::calculator::{PainnCalculator, Prediction};
use crate::error::{Error, Result};
use crate::model::{Backend, PainnInputs};
use crate::neighbors::{batch_neighbor_list, wrap_batch};
use crate::ops::scatter_add;
use crate::structure::{volume, Batch, Structure};
use candle_core::{DType, Tensor, Var};

pub use crate::calculator::StressPrediction;
pub use crate::structure::Matrix3;

/// ASE's Voigt order of a symmetric 3x3: xx yy zz yz xz xy.
pub fn voigt(s: &Matrix3) -> [f64; 6] {
    [s[0][0], s[1][1], s[2][2], s[1][2], s[0][2], s[0][1]]
}

/// The volume a structure's stress is taken over, if it has one (a cell periodic along all
/// three axes).
pub fn stress_volume(s: &Structure) -> Option<f64> {
    match (s.cell.as_ref(), s.pbc) {
        (Some(c), [true, true, true]) => Some(volume(c).abs()),
        _ => None,
    }
}

impl PainnCalculator {
    /// Energies, forces and stresses of `batch` by one forward and one backward pass through
    /// the model under a strain of every structure.
    pub fn compute_with_stress(&self, batch: &Batch) -> Result<StressPrediction> {
        let batch = wrap_batch(batch)?;
        let nl = batch_neighbor_list(&batch, self.model().config().cutoff)?;
        let (inputs, positions) = self.prepare_with(&batch, &nl)?;
        let edge_structure =
            Tensor::from_vec(nl.edge_structures(&batch.offsets), nl.len(), self.device())?;
        let (energies, forces, de_deps) =
            strain_derivative(self, &inputs, &positions, &edge_structure)?;
        let prediction = Prediction::from_device(&batch, &energies, &forces)?;
        let stresses = stresses_of(&batch.structures, &de_deps)?;
        Ok(StressPrediction {
            prediction,
            stresses,
        })
    }

    /// [`compute_with_stress`](Self::compute_with_stress) and every atom's virial (eV, rows
    /// as ASE writes a 3x3): W_i = Σ over its edges i ← j of r_ij ⊗ F_ij, with F_ij =
    /// −∂E/∂r_ij, so that a structure's Σ_i W_i, symmetrized, is −∂E/∂ε (−V σ for a cell).
    /// The fused backend's force kernel gathers them; the others refuse.
    pub fn compute_with_virials(
        &self,
        batch: &Batch,
    ) -> Result<(StressPrediction, Vec<Vec<Matrix3>>)> {
        if self.model().backend() != Backend::Fused {
            return Err(Error::Config(format!(
                "per-atom virials come from the fused backend's force kernel, not the {} \
                 backend",
                self.model().backend().name()
            )));
        }
        let batch = wrap_batch(batch)?;
        let nl = batch_neighbor_list(&batch, self.model().config().cutoff)?;
        let (inputs, _) = self.prepare_with(&batch, &nl)?;
        let s = inputs.n_structures;
        let (energies, forces, de_deps, virials) = fused_pass_with_virials(self, &inputs)?;
        let prediction = Prediction::from_device(&batch, &energies, &forces)?;
        let stresses = stresses_of(&batch.structures, &de_deps)?;
        let rows = virials.to_dtype(DType::F64)?.to_vec3::<f64>()?;
        let rows: Vec<Matrix3> = (rows.iter())
            .map(|w| std::array::from_fn(|a| std::array::from_fn(|b| w[a][b])))
            .collect();
        let per_structure = (0..s)
            .map(|k| rows[batch.offsets[k]..batch.offsets[k + 1]].to_vec())
            .collect();
        let stress = StressPrediction {
            prediction,
            stresses,
        };
        Ok((stress, per_structure))
    }
}

/// The stress σ = (1/V) ∂E/∂ε of each structure from its strain derivative ([S, 3, 3]).
pub fn stresses_of(structures: &[Structure], de_deps: &Tensor) -> Result<Vec<Option<Matrix3>>> {
    let de_deps = de_deps.to_dtype(DType::F64)?.to_vec3::<f64>()?;
    Ok((structures.iter().zip(&de_deps))
        .map(|(s, d)| {
            stress_volume(s).map(|v| std::array::from_fn(|a| std::array::from_fn(|b| d[a][b] / v)))
        })
        .collect())
}

/// Energies \[S\] (f64), forces [N, 3] and ∂E/∂ε [S, 3, 3] (symmetric) of prepared inputs,
/// `edge_structure` the structure of every edge (\[E\] u32).
pub fn strain_derivative(
    calc: &PainnCalculator,
    inputs: &PainnInputs,
    positions: &Var,
    edge_structure: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let model = calc.model();
    if model.backend() == Backend::Fused {
        return fused_strain_derivative(calc, inputs);
    }
    let s = inputs.n_structures;
    let x = positions.as_tensor();
    let (strain, strained_inputs) = strained(inputs, edge_structure)?;
    let atom_energies = model.atom_energies(&strained_inputs)?;
    let total = atom_energies.sum_all()?;
    let grads = total.backward()?;
    let forces = match grads.get(x) {
        Some(g) => g.neg()?,
        None => x.zeros_like()?,
    };
    let de_deps = match grads.get(strain.as_tensor()) {
        Some(g) => g.clone(),
        None => strain.as_tensor().zeros_like()?,
    };
    let energies = model.backend().scatter_add(
        &atom_energies.to_dtype(DType::F64)?,
        &inputs.atom_structure,
        s,
    )?;
    Ok((energies, forces, de_deps))
}

/// ∂E/∂ε of `s` structures ([S, 3, 3]) from their atoms' virials ([N, 3, 3], each atom's
/// Σ r_e ⊗ F_e; `atom_structure` \[N\] u32): minus their symmetrized sum per structure.
pub fn strain_derivative_of_virials(
    virials: &Tensor,
    atom_structure: &Tensor,
    s: usize,
) -> Result<Tensor> {
    let n = virials.dim(0)?;
    let virial = match s {
        1 => virials.sum_keepdim(0)?,
        _ => scatter_add(&virials.reshape((n, 9))?, atom_structure, s)?.reshape((s, 3, 3))?,
    };
    Ok(((&virial + virial.transpose(1, 2)?)? * -0.5)?)
}

/// A zero strain ε of every structure ([S, 3, 3], a variable, symmetrized before use so that
/// ∂E/∂ε is symmetric and rotations do not enter) and `inputs` under it: positions and image
/// offsets r → r (1 + ε) (`edge_structure`: each edge's structure, \[E\] u32).
pub fn strained(inputs: &PainnInputs, edge_structure: &Tensor) -> Result<(Var, PainnInputs)> {
    let x = &inputs.positions;
    let strain = Var::from_tensor(&Tensor::zeros(
        (inputs.n_structures, 3, 3),
        x.dtype(),
        x.device(),
    )?)?;
    let eps = ((strain.as_tensor() + strain.as_tensor().transpose(1, 2)?)? * 0.5)?;
    let moved = |rows: &Tensor, index: &Tensor| -> Result<Tensor> {
        let e = eps.index_select(index, 0)?; // [R, 3, 3]
        Ok((rows + rows.unsqueeze(1)?.matmul(&e)?.squeeze(1)?)?)
    };
    let out = PainnInputs {
        species: inputs.species.clone(),
        positions: moved(x, &inputs.atom_structure)?,
        centers: inputs.centers.clone(),
        neighbors: inputs.neighbors.clone(),
        offsets: moved(&inputs.offsets, edge_structure)?,
        atom_structure: inputs.atom_structure.clone(),
        n_structures: inputs.n_structures,
    };
    Ok((strain, out))
}

/// [`strain_derivative`] by the fused adjoint: one forward and one adjoint pass, whose last
/// kernel gathers every atom's virial Σ_e r_e ⊗ F_e (F_e = −∂E/∂r_e) besides its force:
/// ∂E/∂ε = −W, W the structure's sum (symmetrized, as the symmetric strain gives it).
fn fused_strain_derivative(
    calc: &PainnCalculator,
    inputs: &PainnInputs,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (energies, forces, de_deps, _) = fused_pass_with_virials(calc, inputs)?;
    Ok((energies, forces, de_deps))
}

/// The fused pass behind [`fused_strain_derivative`], with the atoms' virials [N, 3, 3] too.
fn fused_pass_with_virials(
    calc: &PainnCalculator,
    inputs: &PainnInputs,
) -> Result<(Tensor, Tensor, Tensor, Tensor)> {
    let s = inputs.n_structures;
    let pass = calc.fused()?.forward(inputs)?;
    let (forces, virials) = pass.forces_and_virials()?;
    let de_deps = strain_derivative_of_virials(&virials, &inputs.atom_structure, s)?;
    let energies = calc.model().backend().scatter_add(
        &pass.atom_energies.to_dtype(DType::F64)?,
        &inputs.atom_structure,
        s,
    )?;
    Ok((energies, forces, de_deps, virials))
}
