//! `Model`: a checkpoint on a device, computing batches from NumPy arrays; `Session`: one
//! system's state between calls (the MD force provider: a Verlet list with a skin, device
//! buffers, CUDA graphs), for ASE's calculator interface.

use crate::arrays::{array, atomic_number, bad, rows};
use crate::to_py;
use candle_core::DType;
use mlff_distiller::calculator::atom_energies_and_forces;
use mlff_distiller::device::{self, DeviceSpec};
use mlff_distiller::graph::{GraphCalculator, Graphs};
use mlff_distiller::md::{device_positions, host_positions, ForceProvider, ListSite, PainnForces};
use mlff_distiller::model::Backend;
use mlff_distiller::phase::NoClock;
use mlff_distiller::structure::Lattice;
use mlff_distiller::{Batch, Calculator, PainnCalculator, Structure, Tuning};
use numpy::ndarray::{Array1, Array3, ArrayView1, ArrayView2, ArrayView3, Axis};
use numpy::{
    IntoPyArray, PyArray1, PyArray2, PyArray3, PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArray3,
};
use pyo3::prelude::*;
use std::path::PathBuf;

/// Lets a closure that runs with the GIL released use engine state that is not `Send`: the
/// closure runs on this same thread ([`Python::detach`] does not move it).
pub(crate) struct SameThread<T>(pub T);
// SAFETY: only ever moved into `Python::detach`, which runs the closure on the calling thread.
unsafe impl<T> Send for SameThread<T> {}

/// `float32`/`f32` or `float64`/`f64`.
pub(crate) fn parse_dtype(s: &str) -> PyResult<DType> {
    match s {
        "float32" | "f32" => Ok(DType::F32),
        "float64" | "f64" => Ok(DType::F64),
        _ => Err(bad(format!("dtype `{s}`: expected float32 or float64"))),
    }
}

/// A trained student on a device.
#[pyclass(unsendable, module = "mlff_distiller._native")]
pub struct Model {
    /// Borrows `calc`, so it is dropped first (see `Drop`).
    graphs: Option<GraphCalculator<'static>>,
    /// Leaked in `new` and freed in `Drop`, so that graphs and sessions can borrow it.
    pub(crate) calc: &'static PainnCalculator,
    #[pyo3(get)]
    pub(crate) path: PathBuf,
}

impl Drop for Model {
    fn drop(&mut self) {
        self.graphs = None;
        // SAFETY: `calc` came from `Box::leak` in `new`; the graph cache that borrowed it is
        // gone, and every `Session` keeps its `Model` alive, so nothing refers to it.
        unsafe {
            drop(Box::from_raw(
                self.calc as *const PainnCalculator as *mut PainnCalculator,
            ))
        };
    }
}

#[pymethods]
impl Model {
    /// Loads `path` onto `device` (cpu, cuda, cuda:N, auto) in `dtype` (float32, float64).
    /// `graphs` (auto, on, off) replays batch shapes seen before as CUDA graphs; `backend`
    /// (fused, autograd, stock) and `tuning` (a JSON file) as for `mlff`.
    #[new]
    #[pyo3(signature = (path, device="auto", dtype="float32", graphs="auto", backend="fused", tuning=None))]
    fn new(
        path: PathBuf,
        device: &str,
        dtype: &str,
        graphs: &str,
        backend: &str,
        tuning: Option<PathBuf>,
    ) -> PyResult<Self> {
        let spec: DeviceSpec = device.parse().map_err(bad)?;
        let graphs: Graphs = graphs.parse().map_err(bad)?;
        let backend: Backend = backend.parse().map_err(bad)?;
        let dtype = parse_dtype(dtype)?;
        let sel = device::select(spec).map_err(to_py)?;
        let tuning = Tuning::load(tuning.as_deref()).map_err(|e| bad(e.to_string()))?;
        let calc = PainnCalculator::from_checkpoint(&path, &sel.device, dtype)
            .map_err(to_py)?
            .with_backend(backend)
            .with_tuning(tuning);
        calc.check_ops()
            .map_err(|e| bad(format!("{}: {e}", path.display())))?;
        let calc: &'static PainnCalculator = Box::leak(Box::new(calc));
        let graphs = GraphCalculator::new(calc, graphs).map_err(to_py)?;
        Ok(Self {
            graphs: Some(graphs),
            calc,
            path,
        })
    }

    /// Interaction cutoff in Å.
    #[getter]
    fn cutoff(&self) -> f64 {
        self.calc.model().config().cutoff
    }

    /// Atomic numbers the model knows.
    #[getter]
    fn elements(&self) -> Vec<u8> {
        self.calc.model().config().elements.clone()
    }

    /// `cpu` or `cuda:N`.
    #[getter]
    fn device(&self) -> String {
        match self.calc.device().location() {
            candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
            _ => "cpu".into(),
        }
    }

    #[getter]
    pub(crate) fn dtype(&self) -> &'static str {
        if self.calc.dtype() == DType::F64 {
            "float64"
        } else {
            "float32"
        }
    }

    /// Energies (eV, one per structure) and forces (eV/Å, [N, 3]) of a batch given as flat
    /// arrays: `structure_index[i]` is the structure of atom i (0, 1, ... in order; all 0
    /// when omitted), `cells` [S, 3, 3] and `pbc` [S, 3] per structure (molecules without).
    /// With `atom_energies`, also the energy of every atom ([N]).
    #[pyo3(signature = (positions, numbers, cells=None, pbc=None, structure_index=None, atom_energies=false))]
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn compute_arrays<'py>(
        &self,
        py: Python<'py>,
        positions: PyReadonlyArray2<'py, f64>,
        numbers: PyReadonlyArray1<'py, i64>,
        cells: Option<PyReadonlyArray3<'py, f64>>,
        pbc: Option<PyReadonlyArray2<'py, bool>>,
        structure_index: Option<PyReadonlyArray1<'py, i64>>,
        atom_energies: bool,
    ) -> PyResult<(
        Bound<'py, PyArray1<f64>>,
        Bound<'py, PyArray2<f64>>,
        Option<Bound<'py, PyArray1<f64>>>,
    )> {
        let batch = batch_of_arrays(&positions, &numbers, &cells, &pbc, &structure_index)?;
        let calc = self.calc;
        let graphs = SameThread(self.graphs.as_ref());
        let out = py.detach(move || -> mlff_distiller::Result<_> {
            let graphs = graphs;
            if atom_energies {
                let (inputs, x) = calc.prepare(&batch)?;
                let (e, f) = atom_energies_and_forces(calc, &inputs, &x, &mut NoClock)?;
                let e = e.to_dtype(DType::F64)?.to_vec1::<f64>()?;
                let f = host_positions(&f)?;
                let energies = (0..batch.n_structures())
                    .map(|k| e[batch.offsets[k]..batch.offsets[k + 1]].iter().sum())
                    .collect();
                let split = (0..batch.n_structures())
                    .map(|k| f[batch.offsets[k]..batch.offsets[k + 1]].to_vec())
                    .collect();
                let p = mlff_distiller::Prediction {
                    energies,
                    forces: split,
                };
                p.check_finite()?;
                Ok((p, Some(e)))
            } else {
                let p = match graphs.0 {
                    Some(g) => g.compute(&batch)?,
                    None => calc.compute(&batch)?,
                };
                p.check_finite()?;
                Ok((p, None))
            }
        });
        let (pred, atoms) = out.map_err(to_py)?;
        let forces: Vec<[f64; 3]> = pred.forces.concat();
        Ok((
            Array1::from_vec(pred.energies).into_pyarray(py),
            array(py, &forces),
            atoms.map(|a| Array1::from_vec(a).into_pyarray(py)),
        ))
    }

    /// Energies, forces and stresses ([S, 3, 3], eV/Å³, ASE's sign; NaN for structures
    /// without a cell periodic along all three axes) of a batch given as in `compute_arrays`,
    /// through the model's autograd graph.
    #[pyo3(signature = (positions, numbers, cells=None, pbc=None, structure_index=None))]
    #[allow(clippy::type_complexity)]
    fn stress_arrays<'py>(
        &self,
        py: Python<'py>,
        positions: PyReadonlyArray2<'py, f64>,
        numbers: PyReadonlyArray1<'py, i64>,
        cells: Option<PyReadonlyArray3<'py, f64>>,
        pbc: Option<PyReadonlyArray2<'py, bool>>,
        structure_index: Option<PyReadonlyArray1<'py, i64>>,
    ) -> PyResult<(
        Bound<'py, PyArray1<f64>>,
        Bound<'py, PyArray2<f64>>,
        Bound<'py, PyArray3<f64>>,
    )> {
        let batch = batch_of_arrays(&positions, &numbers, &cells, &pbc, &structure_index)?;
        let calc = self.calc;
        let out = py.detach(move || -> mlff_distiller::Result<_> {
            let p = calc.compute_with_stress(&batch)?;
            p.prediction.check_finite()?;
            Ok(p)
        });
        let p = out.map_err(to_py)?;
        let forces: Vec<[f64; 3]> = p.prediction.forces.concat();
        let s = p.stresses.len();
        let flat: Vec<f64> = (p.stresses.iter())
            .flat_map(|m| m.unwrap_or([[f64::NAN; 3]; 3]).into_iter().flatten())
            .collect();
        let stresses = Array3::from_shape_vec((s, 3, 3), flat).map_err(|e| bad(e.to_string()))?;
        Ok((
            Array1::from_vec(p.prediction.energies).into_pyarray(py),
            array(py, &forces),
            stresses.into_pyarray(py),
        ))
    }
}

/// [`batch_of`] on the arrays as Python passed them.
fn batch_of_arrays(
    positions: &PyReadonlyArray2<'_, f64>,
    numbers: &PyReadonlyArray1<'_, i64>,
    cells: &Option<PyReadonlyArray3<'_, f64>>,
    pbc: &Option<PyReadonlyArray2<'_, bool>>,
    structure_index: &Option<PyReadonlyArray1<'_, i64>>,
) -> PyResult<Batch> {
    batch_of(
        positions.as_array(),
        numbers.as_array(),
        cells.as_ref().map(|c| c.as_array()),
        pbc.as_ref().map(|p| p.as_array()),
        structure_index.as_ref().map(|s| s.as_array()),
    )
}

/// Checks the arrays' shapes and values, naming the argument, and makes the batch.
fn batch_of(
    x: ArrayView2<'_, f64>,
    z: ArrayView1<'_, i64>,
    cells: Option<ArrayView3<'_, f64>>,
    pbc: Option<ArrayView2<'_, bool>>,
    structure_index: Option<ArrayView1<'_, i64>>,
) -> PyResult<Batch> {
    let n = x.nrows();
    if x.ncols() != 3 {
        return Err(bad(format!(
            "positions: shape {:?}, expected [N, 3]",
            x.shape()
        )));
    }
    if z.len() != n {
        return Err(bad(format!(
            "numbers: {} values for {n} positions",
            z.len()
        )));
    }
    let index: Vec<usize> = match structure_index {
        None => vec![0; n],
        Some(s) => {
            if s.len() != n {
                return Err(bad(format!(
                    "structure_index: {} values for {n} atoms",
                    s.len()
                )));
            }
            let mut out = Vec::with_capacity(n);
            let mut last = 0i64;
            for (i, &k) in s.iter().enumerate() {
                if k < 0 || k < last || k > last + 1 || (i == 0 && k != 0) {
                    return Err(bad(format!(
                        "structure_index[{i}] = {k}: structures must be numbered 0, 1, 2, ... \
                         with each structure's atoms together"
                    )));
                }
                last = k;
                out.push(k as usize);
            }
            out
        }
    };
    let n_structures = index.last().map_or(0, |&k| k + 1);
    let cells: Option<Vec<Lattice>> = match cells {
        None => None,
        Some(c) => {
            if c.shape() != [n_structures, 3, 3] {
                return Err(bad(format!(
                    "cells: shape {:?}, expected [{n_structures}, 3, 3]",
                    c.shape()
                )));
            }
            Some(
                (0..n_structures)
                    .map(|k| std::array::from_fn(|r| std::array::from_fn(|d| c[[k, r, d]])))
                    .collect(),
            )
        }
    };
    let pbc: Vec<[bool; 3]> = match pbc {
        None => vec![[cells.is_some(); 3]; n_structures],
        Some(p) => {
            if p.shape() != [n_structures, 3] {
                return Err(bad(format!(
                    "pbc: shape {:?}, expected [{n_structures}, 3]",
                    p.shape()
                )));
            }
            (0..n_structures)
                .map(|k| std::array::from_fn(|d| p[[k, d]]))
                .collect()
        }
    };
    let mut structures: Vec<Structure> = Vec::with_capacity(n_structures);
    for (i, (&k, &zi)) in index.iter().zip(z.iter()).enumerate() {
        let zi = atomic_number(i, zi)?;
        let row = [x[[i, 0]], x[[i, 1]], x[[i, 2]]];
        if row.iter().any(|v| !v.is_finite()) {
            return Err(bad(format!("positions[{i}] = {row:?} is not finite")));
        }
        if structures.len() == k {
            structures.push(Structure {
                cell: cells.as_ref().map(|c| c[k]),
                pbc: pbc[k],
                ..Default::default()
            });
        }
        structures[k].numbers.push(zi);
        structures[k].positions.push(row);
    }
    Batch::new(structures).map_err(to_py)
}

/// One system between calls: the force provider of `mlff md` (a Verlet neighbour list with a
/// skin, device buffers, CUDA graphs where they pay), so that an ASE loop pays the model call
/// and little more. A change of atoms, cell or periodicity needs a new session.
#[pyclass(unsendable, module = "mlff_distiller._native")]
pub struct Session {
    /// Borrows the model's calculator, so it is declared (and dropped) before `model`.
    forces: PainnForces<'static>,
    model: Py<Model>,
    n: usize,
}

#[pymethods]
impl Session {
    /// A session for atoms `numbers` at `positions` ([N, 3], Å), with `cell` ([3, 3]) and
    /// `pbc` ([3]) for periodic systems, rebuilding its list once an atom moved `skin`/2 Å.
    #[new]
    #[pyo3(signature = (model, positions, numbers, cell=None, pbc=None, skin=1.0, graphs="auto"))]
    fn new(
        model: Bound<'_, Model>,
        positions: PyReadonlyArray2<'_, f64>,
        numbers: PyReadonlyArray1<'_, i64>,
        cell: Option<PyReadonlyArray2<'_, f64>>,
        pbc: Option<PyReadonlyArray1<'_, bool>>,
        skin: f64,
        graphs: &str,
    ) -> PyResult<Self> {
        // One structure: the cell and pbc as a batch of one, without copies.
        let cell = cell.as_ref().map(|c| c.as_array());
        if let Some(c) = cell.filter(|c| c.shape() != [3, 3]) {
            return Err(bad(format!("cell: shape {:?}, expected [3, 3]", c.shape())));
        }
        let batch = batch_of(
            positions.as_array(),
            numbers.as_array(),
            cell.map(|c| c.insert_axis(Axis(0))),
            pbc.as_ref().map(|p| p.as_array().insert_axis(Axis(0))),
            None,
        )?;
        let structure = batch.structures.into_iter().next().unwrap_or_default();
        if !(skin.is_finite() && skin >= 0.0) {
            return Err(bad(format!("skin {skin}: must be finite and >= 0 Å")));
        }
        let graphs: Graphs = graphs.parse().map_err(bad)?;
        let calc = model.borrow().calc;
        let forces = PainnForces::new(calc, &structure, skin)
            .and_then(|f| f.with_list_site(ListSite::Auto))
            .and_then(|f| f.with_graphs(graphs))
            .map_err(to_py)?;
        Ok(Self {
            forces,
            model: model.unbind(),
            n: structure.numbers.len(),
        })
    }

    /// Energy (eV) and forces ([N, 3], eV/Å) at `positions`.
    fn evaluate<'py>(
        &mut self,
        py: Python<'py>,
        positions: PyReadonlyArray2<'py, f64>,
    ) -> PyResult<(f64, Bound<'py, PyArray2<f64>>)> {
        let rows = rows(positions.as_array(), "positions", self.n)?;
        let forces = SameThread(&mut self.forces);
        let out = py.detach(move || -> mlff_distiller::Result<(f64, Vec<[f64; 3]>)> {
            let forces = forces;
            let mut t = device_positions(&rows, forces.0.device())?;
            let e = forces.0.evaluate(&mut t)?;
            // Energy and forces in one read from the device (each read waits for the queue).
            let both = candle_core::Tensor::cat(
                &[
                    e.energy.reshape(1)?.to_dtype(DType::F64)?,
                    e.forces.flatten_all()?.to_dtype(DType::F64)?,
                ],
                0,
            )?
            .to_vec1::<f64>()?;
            let f = both[1..]
                .chunks_exact(3)
                .map(|c| [c[0], c[1], c[2]])
                .collect();
            Ok((both[0], f))
        });
        let (energy, f) = out.map_err(to_py)?;
        let pred = mlff_distiller::Prediction {
            energies: vec![energy],
            forces: vec![f],
        };
        pred.check_finite().map_err(to_py)?;
        Ok((energy, array(py, &pred.forces[0])))
    }

    /// The model this session runs.
    #[getter]
    fn model(&self, py: Python<'_>) -> Py<Model> {
        self.model.clone_ref(py)
    }

    /// Neighbour-list builds so far.
    #[getter]
    fn list_builds(&self) -> usize {
        self.forces.list_builds()
    }
}
