//! Atomic structures (ASE conventions: Å, eV, eV/Å) and batches of them.

use crate::error::{Error, Result};

/// A 3x3 lattice whose rows are the cell vectors a, b, c (as `ase.Atoms.cell`).
pub type Lattice = [[f64; 3]; 3];

/// A 3x3 tensor (a stress, a virial), rows as ASE writes them.
pub type Matrix3 = [[f64; 3]; 3];

/// One configuration: atoms, optional cell, optional labels and free-form metadata.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Structure {
    /// Atomic numbers.
    pub numbers: Vec<u8>,
    /// Cartesian positions in Å.
    pub positions: Vec<[f64; 3]>,
    /// Cell vectors as rows, when the structure has a cell.
    pub cell: Option<Lattice>,
    /// Periodicity along a, b, c. Only meaningful with a cell.
    pub pbc: [bool; 3],
    /// Energy label in eV.
    pub energy: Option<f64>,
    /// Force labels in eV/Å, one per atom.
    pub forces: Option<Vec<[f64; 3]>>,
    /// Other per-frame key=value pairs from the comment line, kept verbatim (value as written).
    pub info: Vec<(String, String)>,
    /// Other per-atom columns, kept verbatim so that files round-trip.
    pub arrays: Vec<ExtraArray>,
}

/// A per-atom column we do not interpret (e.g. `tags:I:1`), kept as text.
#[derive(Clone, Debug, PartialEq)]
pub struct ExtraArray {
    pub name: String,
    /// Extended-XYZ type letter: R, I, S or L.
    pub kind: char,
    pub ncols: usize,
    /// `n_atoms * ncols` tokens, row-major.
    pub values: Vec<String>,
}

impl Structure {
    /// The value of a per-frame info key (as written in the file), if present.
    pub fn info_value(&self, key: &str) -> Option<&str> {
        self.info
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A non-periodic molecule.
    pub fn molecule(numbers: Vec<u8>, positions: Vec<[f64; 3]>) -> Self {
        Self {
            numbers,
            positions,
            ..Default::default()
        }
    }

    pub fn len(&self) -> usize {
        self.numbers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.numbers.is_empty()
    }

    /// True when any direction is periodic (which requires a cell).
    pub fn is_periodic(&self) -> bool {
        self.cell.is_some() && self.pbc.iter().any(|&p| p)
    }

    /// Checks internal consistency: lengths match, coordinates are finite, periodic
    /// directions have a cell with non-zero volume.
    pub fn validate(&self) -> Result<()> {
        let n = self.numbers.len();
        if self.positions.len() != n {
            return Err(Error::Structure(format!(
                "{} atomic numbers but {} positions",
                n,
                self.positions.len()
            )));
        }
        if let Some(f) = &self.forces {
            if f.len() != n {
                return Err(Error::Structure(format!(
                    "{} atoms but {} force rows",
                    n,
                    f.len()
                )));
            }
        }
        for (i, p) in self.positions.iter().enumerate() {
            if p.iter().any(|x| !x.is_finite()) {
                return Err(Error::Structure(format!(
                    "atom {i} has a non-finite position {p:?}"
                )));
            }
        }
        for (i, &z) in self.numbers.iter().enumerate() {
            if z == 0 || z > 118 {
                return Err(Error::Structure(format!("atom {i} has atomic number {z}")));
            }
        }
        if self.pbc.iter().any(|&p| p) {
            match &self.cell {
                None => {
                    return Err(Error::Structure(
                        "periodic boundaries requested without a cell".into(),
                    ))
                }
                Some(c) if volume(c).abs() < 1e-9 => {
                    return Err(Error::Structure(format!(
                        "periodic cell {c:?} has zero volume"
                    )))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Signed volume a·(b×c) of a lattice.
pub fn volume(c: &Lattice) -> f64 {
    let [a, b, cc] = c;
    a[0] * (b[1] * cc[2] - b[2] * cc[1]) - a[1] * (b[0] * cc[2] - b[2] * cc[0])
        + a[2] * (b[0] * cc[1] - b[1] * cc[0])
}

/// The inverse of a lattice (rows as vectors), `None` if it is singular.
pub fn inverse(c: &Lattice) -> Option<Lattice> {
    let det = volume(c);
    if det == 0.0 || !det.is_finite() {
        return None;
    }
    // The adjugate's rows are the cross products of the columns' complements.
    let m = |r: usize, k: usize| c[r % 3][k % 3];
    Some(std::array::from_fn(|i| {
        std::array::from_fn(|j| {
            (m(j + 1, i + 1) * m(j + 2, i + 2) - m(j + 1, i + 2) * m(j + 2, i + 1)) / det
        })
    }))
}

/// Several structures of different sizes, flattened for one model call.
#[derive(Clone, Debug)]
pub struct Batch {
    pub structures: Vec<Structure>,
    /// `offsets[k]..offsets[k+1]` are the atoms of structure k in the flat arrays.
    pub offsets: Vec<usize>,
}

impl Batch {
    pub fn new(structures: Vec<Structure>) -> Result<Self> {
        let mut offsets = Vec::with_capacity(structures.len() + 1);
        offsets.push(0);
        for (k, s) in structures.iter().enumerate() {
            s.validate()
                .map_err(|e| Error::Structure(format!("structure {k}: {e}")))?;
            offsets.push(offsets[k] + s.len());
        }
        Ok(Self {
            structures,
            offsets,
        })
    }

    pub fn from_one(s: Structure) -> Result<Self> {
        Self::new(vec![s])
    }

    pub fn n_structures(&self) -> usize {
        self.structures.len()
    }

    pub fn n_atoms(&self) -> usize {
        *self.offsets.last().unwrap_or(&0)
    }

    /// Structure index of every atom.
    pub fn atom_structure(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.n_atoms());
        for (k, s) in self.structures.iter().enumerate() {
            out.extend(std::iter::repeat_n(k as u32, s.len()));
        }
        out
    }

    pub fn numbers(&self) -> Vec<u8> {
        self.structures
            .iter()
            .flat_map(|s| s.numbers.iter().copied())
            .collect()
    }

    pub fn positions(&self) -> Vec<[f64; 3]> {
        self.structures
            .iter()
            .flat_map(|s| s.positions.iter().copied())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverse_times_lattice_is_one() {
        let c: Lattice = [[4.0, 0.3, -0.2], [1.1, 5.0, 0.4], [0.7, -0.9, 6.0]];
        let inv = inverse(&c).unwrap();
        for (i, row) in c.iter().enumerate() {
            for (j, one) in [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]][i]
                .iter()
                .enumerate()
            {
                let x: f64 = (0..3).map(|k| row[k] * inv[k][j]).sum();
                assert!((x - one).abs() < 1e-14, "{i} {j}: {x}");
            }
        }
        assert!(inverse(&[[1.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.0, 0.0, 1.0]]).is_none());
    }
}
