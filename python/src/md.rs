//! `run_md`: the MD engine of `mlff md` on arrays, with the same settings, outputs (claimed and
//! locked as the command does), restart files and summary, and a Python callback at every log
//! step: one system, or many at once (as `mlff md --replicas/--all-frames`). The GIL is
//! released between callbacks.

use crate::arrays::{array, atomic_number, bad, rows};
use crate::model::{Model, SameThread};
use crate::to_py;
use mlff_distiller::fsutil::{Mode, OutputSet};
use mlff_distiller::interrupt::StopFlag;
use mlff_distiller::md::{
    Barostat, BarostatMode, BatchProgress, BatchSimulation, Ensemble, ListSite, MdOutputs,
    MdSettings, PainnForces, Progress, Simulation,
};
use mlff_distiller::structure::{ExtraArray, Structure};
use numpy::{PyArray2, PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;

/// One system as arrays: positions (Å), atomic numbers, cell and pbc (periodic systems),
/// momenta (ASE's units; to start from them instead of Maxwell-Boltzmann velocities).
pub type SystemArrays<'py> = (
    PyReadonlyArray2<'py, f64>,
    PyReadonlyArray1<'py, i64>,
    Option<PyReadonlyArray2<'py, f64>>,
    Option<PyReadonlyArray1<'py, bool>>,
    Option<PyReadonlyArray2<'py, f64>>,
);

/// Runs MD from `systems` (one, or with `batch` many at once, system k seeded with seed + k).
/// `ensemble` "npt" adds the barostat (`pressure` bar, `barostat_mode` iso or aniso,
/// `barostat_time` fs, `compressibility` 1/bar) to the Langevin thermostat. Returns
/// (positions, velocities in Å/ASE time unit, the cell where NPT moved it, one of each per
/// system; the summary as JSON). `callback(step, record, positions)` is called at every log step (a batch gives
/// the active systems, mean temperature and atom-steps/s as the record and no positions); it
/// may raise to stop the run. A batch's `traj` is one file with a `system` key per frame.
#[pyfunction]
#[pyo3(signature = (
    model, systems, *, batch=false, steps=1000, dt=0.5,
    ensemble="nve", temperature=300.0, friction=10.0, init_temperature=None, seed=0, skin=1.0,
    pressure=1.0, barostat_mode="iso", barostat_time=1000.0, compressibility=4.5e-5,
    traj=None, traj_every=100, log=None, log_every=10, restart_every=0, restart_file=None,
    keep_going=false, bond_limit=0.5, overwrite=false, append=false, callback=None,
    graphs="auto"
))]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub fn run_md<'py>(
    py: Python<'py>,
    model: Bound<'py, Model>,
    systems: Vec<SystemArrays<'py>>,
    batch: bool,
    steps: u64,
    dt: f64,
    ensemble: &str,
    temperature: f64,
    friction: f64,
    init_temperature: Option<f64>,
    seed: u64,
    skin: f64,
    pressure: f64,
    barostat_mode: &str,
    barostat_time: f64,
    compressibility: f64,
    traj: Option<PathBuf>,
    traj_every: u64,
    log: Option<PathBuf>,
    log_every: u64,
    restart_every: u64,
    restart_file: Option<PathBuf>,
    keep_going: bool,
    bond_limit: f64,
    overwrite: bool,
    append: bool,
    callback: Option<Py<PyAny>>,
    graphs: &str,
) -> PyResult<(
    Vec<Bound<'py, PyArray2<f64>>>,
    Vec<Bound<'py, PyArray2<f64>>>,
    Vec<Option<Bound<'py, PyArray2<f64>>>>,
    String,
)> {
    if systems.is_empty() || (!batch && systems.len() > 1) {
        return Err(bad(format!(
            "{} systems given: one, or at least one with batch=True",
            systems.len()
        )));
    }
    let keep_momenta = systems[0].4.is_some();
    if systems.iter().any(|s| s.4.is_some() != keep_momenta) {
        return Err(bad("momenta: give them for every system or for none".into()));
    }
    let starts = (systems.iter().enumerate())
        .map(|(k, s)| match batch {
            true => structure(s).map_err(|e| bad(format!("system {k}: {}", e.value(py)))),
            false => structure(s),
        })
        .collect::<PyResult<Vec<Structure>>>()?;
    let barostat = match ensemble {
        "npt" => Some(Barostat {
            pressure_bar: pressure,
            mode: barostat_mode.parse::<BarostatMode>().map_err(bad)?,
            time_fs: barostat_time,
            compressibility_per_bar: compressibility,
        }),
        _ => None,
    };
    let ensemble = match ensemble {
        "nve" => Ensemble::Nve,
        "nvt" | "npt" => Ensemble::Nvt {
            temperature,
            friction,
        },
        other => return Err(bad(format!("ensemble `{other}`: expected nve, nvt or npt"))),
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
        keep_momenta,
        seed,
        skin,
        log_every,
        traj_every,
        restart_every,
        stop_when_unstable: !keep_going,
        bond_limit,
        log_pressure: false,
        barostat,
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
    let graphs = settings
        .graphs(graphs.parse().map_err(bad)?)
        .map_err(to_py)?;
    let calc = model.borrow().calc;
    let forces = PainnForces::batch(calc, &starts, skin)
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
    let callback = SameThread(callback);
    let mut failure: Option<PyErr> = None;
    let failed = SameThread(&mut failure);
    // Calls `callback(step, record, positions)`; an exception stops the run.
    let raise = stop.clone();
    let mut call = move |step: u64, fields: &[(&str, f64)], x: Option<&[[f64; 3]]>| {
        let Some(cb) = &callback.0 else { return };
        Python::attach(|py| {
            let record = PyDict::new(py);
            let called = (fields.iter())
                .try_for_each(|(k, v)| record.set_item(k, v))
                .and_then(|_| match x {
                    Some(x) => cb.call1(py, (step, record, array(py, x))),
                    None => cb.call1(py, (step, record, py.None())),
                });
            if let Err(e) = called {
                *failed.0 = Some(e);
                raise.raise(mlff_distiller::interrupt::SIGINT);
            }
        });
    };
    let out = if batch {
        let sim = BatchSimulation::new(forces, &starts, settings, caller).map_err(to_py)?;
        let mut sim = SameThread(sim.with_stop(stop.clone()));
        let mut call = SameThread(&mut call);
        py.detach(move || {
            let (sim, call) = (&mut sim, &mut call);
            let summary = sim.0.run(&mut |p: &BatchProgress| {
                let fields = [
                    ("active", p.active as f64),
                    ("temperature", p.temperature),
                    ("atom_steps_per_s", p.atom_steps_per_s),
                ];
                (call.0)(p.step, &fields, None);
            })?;
            let states = sim.0.host_states()?;
            let json = serde_json::to_string(&summary);
            let (x, v): (Vec<_>, Vec<_>) = states
                .into_iter()
                .map(|s| (s.positions, s.velocities))
                .unzip();
            // Each system's cell where NPT moved it (None where it has none).
            let cells = (0..x.len())
                .map(|k| sim.0.cell(k).map(|c| c.to_vec()))
                .collect();
            Ok::<_, mlff_distiller::Error>((x, v, cells, json))
        })
    } else {
        let sim = Simulation::new(forces, &starts[0], settings, caller).map_err(to_py)?;
        let mut sim = SameThread(sim.with_stop(stop.clone()));
        let mut call = SameThread(&mut call);
        py.detach(move || {
            let (sim, call) = (&mut sim, &mut call);
            let summary = sim.0.run(&mut |p: &Progress| {
                let r = &p.record;
                let mut fields = vec![
                    ("time_fs", r.time_fs),
                    ("e_pot", r.e_pot),
                    ("e_kin", r.e_kin),
                    ("e_tot", r.e_tot),
                    ("temperature", r.temperature),
                    ("bond_deviation", r.bond_deviation),
                ];
                let npt = [
                    ("pressure_bar", r.pressure_bar),
                    ("volume", r.volume),
                    ("density", r.density),
                    ("e_eff", r.e_eff),
                ];
                fields.extend(npt.iter().filter_map(|&(k, v)| Some((k, v?))));
                (call.0)(p.step, &fields, Some(p.positions));
            })?;
            let state = sim.0.state();
            let x = mlff_distiller::md::host_positions(&state.positions)?;
            let v = mlff_distiller::md::host_positions(&state.velocities)?;
            let cell = sim.0.cell().map(|c| c.to_vec());
            let json = serde_json::to_string(&summary);
            Ok::<_, mlff_distiller::Error>((vec![x], vec![v], vec![cell], json))
        })
    };
    if let Some(e) = failure {
        return Err(e);
    }
    let (x, v, cells, json) = out.map_err(to_py)?;
    let json = json.map_err(|e| bad(e.to_string()))?;
    let arrays = |rows: Vec<Vec<[f64; 3]>>| rows.iter().map(|r| array(py, r)).collect();
    let cells = (cells.iter())
        .map(|c| c.as_ref().map(|c| array(py, c)))
        .collect();
    Ok((arrays(x), arrays(v), cells, json))
}

/// One system's arrays as a structure (momenta as the `momenta` column).
fn structure(s: &SystemArrays) -> PyResult<Structure> {
    let (positions, numbers, cell, pbc, momenta) = s;
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
    Ok(start)
}
