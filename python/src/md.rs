//! `run_md`: the MD engine of `mlff md` on arrays, with the same settings, outputs (claimed and
//! locked as the command does), restart files and summary, and a Python callback at every log
//! step. The GIL is released between callbacks.

use crate::arrays::{array, atomic_number, bad, rows};
use crate::model::{Model, SameThread};
use crate::to_py;
use mlff_distiller::fsutil::{Mode, OutputSet};
use mlff_distiller::interrupt::StopFlag;
use mlff_distiller::md::{
    Ensemble, ListSite, MdOutputs, MdSettings, PainnForces, Progress, Simulation,
};
use mlff_distiller::structure::{ExtraArray, Structure};
use numpy::{PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;

/// Runs MD from `positions` (Å) of atoms `numbers` (with `cell`/`pbc` for periodic systems;
/// `momenta` in ASE's units to start from them instead of Maxwell-Boltzmann velocities).
/// Returns (positions, velocities in Å/ASE time unit, the summary as JSON). `callback(step,
/// record, positions)` is called at every log step; it may raise to stop the run.
#[pyfunction]
#[pyo3(signature = (
    model, positions, numbers, cell=None, pbc=None, momenta=None, *, steps=1000, dt=0.5,
    ensemble="nve", temperature=300.0, friction=10.0, init_temperature=None, seed=0, skin=1.0,
    traj=None, traj_every=100, log=None, log_every=10, restart_every=0, restart_file=None,
    keep_going=false, overwrite=false, append=false, callback=None, graphs="auto"
))]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub fn run_md<'py>(
    py: Python<'py>,
    model: Bound<'py, Model>,
    positions: PyReadonlyArray2<'py, f64>,
    numbers: PyReadonlyArray1<'py, i64>,
    cell: Option<PyReadonlyArray2<'py, f64>>,
    pbc: Option<PyReadonlyArray1<'py, bool>>,
    momenta: Option<PyReadonlyArray2<'py, f64>>,
    steps: u64,
    dt: f64,
    ensemble: &str,
    temperature: f64,
    friction: f64,
    init_temperature: Option<f64>,
    seed: u64,
    skin: f64,
    traj: Option<PathBuf>,
    traj_every: u64,
    log: Option<PathBuf>,
    log_every: u64,
    restart_every: u64,
    restart_file: Option<PathBuf>,
    keep_going: bool,
    overwrite: bool,
    append: bool,
    callback: Option<Py<PyAny>>,
    graphs: &str,
) -> PyResult<(Bound<'py, PyArray2<f64>>, Bound<'py, PyArray2<f64>>, String)> {
    let z = numbers.as_array();
    let n = z.len();
    let numbers: Vec<u8> = (z.iter().enumerate())
        .map(|(i, &v)| atomic_number(i, v))
        .collect::<PyResult<_>>()?;
    let mut start = Structure::molecule(numbers, rows(positions.as_array(), "positions", n)?);
    if let Some(c) = &cell {
        let c = c.as_array();
        if c.shape() != [3, 3] {
            return Err(bad(format!("cell: shape {:?}, expected [3, 3]", c.shape())));
        }
        start.cell = Some(std::array::from_fn(|r| std::array::from_fn(|d| c[[r, d]])));
        start.pbc = [true; 3];
    }
    if let Some(p) = &pbc {
        let p = p.as_array();
        if p.len() != 3 {
            return Err(bad(format!("pbc: {} values, expected 3", p.len())));
        }
        start.pbc = std::array::from_fn(|d| p[d]);
    }
    if let Some(m) = &momenta {
        let values = rows(m.as_array(), "momenta", n)?
            .iter()
            .flatten()
            .map(|x| format!("{x:e}"))
            .collect();
        start.arrays.push(ExtraArray {
            name: "momenta".into(),
            kind: 'R',
            ncols: 3,
            values,
        });
    }
    let ensemble = match ensemble {
        "nve" => Ensemble::Nve,
        "nvt" => Ensemble::Nvt {
            temperature,
            friction,
        },
        other => return Err(bad(format!("ensemble `{other}`: expected nve or nvt"))),
    };
    for (name, v, ok) in [
        ("dt", dt, dt.is_finite() && dt > 0.0),
        (
            "temperature",
            temperature,
            temperature.is_finite() && temperature >= 0.0,
        ),
        ("skin", skin, skin.is_finite() && skin >= 0.0),
    ] {
        if !ok {
            return Err(bad(format!("{name} = {v} is out of range")));
        }
    }
    if traj_every == 0 || log_every == 0 {
        return Err(bad("traj_every and log_every must be at least 1".into()));
    }
    if overwrite && append {
        return Err(bad("give overwrite or append, not both".into()));
    }
    let restart = (restart_every > 0)
        .then(|| {
            restart_file.clone().or_else(|| {
                traj.as_ref()
                    .map(|t| PathBuf::from(format!("{}.restart.json", t.display())))
            })
        })
        .flatten();
    if restart_every > 0 && restart.is_none() {
        return Err(bad("restart_every needs traj or restart_file".into()));
    }
    let absolute = |p: &PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());
    let settings = MdSettings {
        dt_fs: dt,
        steps,
        ensemble,
        init_temperature: init_temperature.unwrap_or(temperature),
        keep_momenta: momenta.is_some(),
        seed,
        skin,
        log_every,
        traj_every,
        restart_every,
        stop_when_unstable: !keep_going,
        outputs: MdOutputs {
            traj: traj.as_ref().map(absolute),
            log: log.as_ref().map(absolute),
            restart: restart.as_ref().map(absolute),
            append,
            traj_split: false,
        },
    };
    settings.validate().map_err(to_py)?;
    let mut io = OutputSet::new();
    io.input("model", &model.borrow().path);
    let keep = Mode::for_existing(overwrite, append);
    for (flag, p) in [("traj", &traj), ("log", &log)] {
        if let Some(p) = p {
            io.output_with_hint(flag, p, keep, "pass overwrite=True or append=True");
        }
    }
    if let Some(r) = &restart {
        io.output("restart_file", r, Mode::for_existing(overwrite, false));
    }
    let holder = format!("python: mlff_distiller.md.run (pid {})", std::process::id());
    let _claim = io.claim(&holder).map_err(to_py)?;
    let graphs = graphs.parse().map_err(bad)?;
    let calc = model.borrow().calc;
    let forces = PainnForces::new(calc, &start, skin)
        .and_then(|f| f.with_list_site(ListSite::Auto))
        .and_then(|f| f.with_graphs(graphs))
        .map_err(to_py)?;
    let caller = serde_json::json!({
        "model": absolute(&model.borrow().path),
        "dtype": if model.borrow().dtype() == "float64" { "f64" } else { "f32" },
        "backend": calc.model().backend().name(),
        "structure": "python",
    });
    let stop = StopFlag::on_signals().map_err(|e| bad(e.to_string()))?;
    let sim = Simulation::new(forces, &start, settings, caller).map_err(to_py)?;
    let mut sim = SameThread(sim.with_stop(stop.clone()));
    let callback = SameThread(callback);
    let mut failure: Option<PyErr> = None;
    let failed = SameThread(&mut failure);
    let out = py.detach(move || {
        let (sim, callback, failed) = (&mut sim, callback, failed);
        let summary = sim.0.run(&mut |p: &Progress| {
            let Some(cb) = &callback.0 else { return };
            Python::attach(|py| {
                let record = PyDict::new(py);
                let r = &p.record;
                let fields = [
                    ("time_fs", r.time_fs),
                    ("e_pot", r.e_pot),
                    ("e_kin", r.e_kin),
                    ("e_tot", r.e_tot),
                    ("temperature", r.temperature),
                    ("bond_deviation", r.bond_deviation),
                ];
                let called = fields
                    .iter()
                    .try_for_each(|(k, v)| record.set_item(k, v))
                    .map(|_| array(py, p.positions))
                    .and_then(|x| cb.call1(py, (p.step, record, x)).map(|_| ()));
                if let Err(e) = called {
                    *failed.0 = Some(e);
                    stop.raise(mlff_distiller::interrupt::SIGINT);
                }
            });
        })?;
        let state = sim.0.state();
        let x = mlff_distiller::md::host_positions(&state.positions)?;
        let v = mlff_distiller::md::host_positions(&state.velocities)?;
        Ok::<_, mlff_distiller::Error>((x, v, summary))
    });
    if let Some(e) = failure {
        return Err(e);
    }
    let (x, v, summary) = out.map_err(to_py)?;
    let json = serde_json::to_string(&summary).map_err(|e| bad(e.to_string()))?;
    Ok((array(py, &x), array(py, &v), json))
}
