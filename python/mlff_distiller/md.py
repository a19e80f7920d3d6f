"""MD on the engine (`mlff md` from Python): device-resident steps, the same outputs, restart
files and summary as the command."""

from __future__ import annotations

import json
import os
from typing import Callable, Optional

import numpy as np

from . import _native
from .model import as_model


def run(
    atoms,
    model,
    steps: int = 1000,
    replicas: int = 1,
    dt: float = 0.5,
    ensemble: str = "nve",
    temperature: float = 300.0,
    friction: float = 10.0,
    init_temperature: Optional[float] = None,
    seed: int = 0,
    keep_momenta: bool = False,
    skin: float = 1.0,
    pressure: float = 1.0,
    barostat_mode: str = "iso",
    barostat_time: float = 1000.0,
    compressibility: float = 4.5e-5,
    traj=None,
    traj_every: int = 100,
    log=None,
    log_every: int = 10,
    restart_every: int = 0,
    restart_file=None,
    keep_going: bool = False,
    bond_limit: float = 0.5,
    overwrite: bool = False,
    append: bool = False,
    callback: Optional[Callable] = None,
    device: str = "auto",
    dtype: str = "float32",
    graphs: str = "auto",
):
    """Runs `steps` MD steps of `dt` fs from `atoms` with `model` (a path or a `Model`).

    `ensemble` is "nve" (velocity Verlet), "nvt" (BAOAB Langevin at `temperature` K with
    `friction` 1/ps) or "npt" (the same with the stochastic cell rescaling barostat at
    `pressure` bar: `barostat_mode` "iso" or "aniso", relaxation time `barostat_time` fs,
    `compressibility` 1/bar; a cell periodic along all three axes). The returned atoms carry
    the last step's cell, and the callback's record the volume, density and pressure. Velocities start from Maxwell-Boltzmann at `init_temperature` (default
    `temperature`), or from the atoms' momenta with `keep_momenta`. `traj` (extended XYZ),
    `log` (JSON lines) and `restart_file` are written as `mlff md` writes them (existing files
    are refused unless `overwrite` or `append`); `callback(step, record, positions)` is called
    at every log step (an exception it raises stops the run and is raised here). A run is
    unstable once a bond is `bond_limit` Å off its starting length (Fu et al.'s 0.5 Å, for
    molecules; a hot crystal needs more); it stops there unless `keep_going`.

    Returns `(atoms, summary)`: a copy of `atoms` at the last step (positions and momenta),
    and the closing summary as a dict (steps/s, drift, stability verdict, ...).

    Many systems at once (as `mlff md --replicas/--all-frames`): `atoms` a list of Atoms
    and/or `replicas` > 1 (each system that many times). They advance together, one force
    call per step for all, system k with seed `seed + k`; a system that turns unstable or
    non-finite is frozen and the others go on. `traj` is then one file with a `system` key
    per frame, the log has a `system` field per row, and `callback(step, record, None)` gets
    the active systems, mean temperature and atom-steps/s. Returns a list of Atoms (each at
    its last step, or where it was frozen) and the batch summary (one row per system).
    """
    m = as_model(model, device=device, dtype=dtype, graphs=graphs)
    batch = isinstance(atoms, (list, tuple)) or replicas != 1
    if replicas < 1:
        raise ValueError(f"replicas = {replicas}: must be at least 1")
    systems = [a for a in (atoms if isinstance(atoms, (list, tuple)) else [atoms])
               for _ in range(replicas)]
    path = lambda p: None if p is None else os.fspath(p)
    xs, vs, cells, summary = _native.run_md(
        m.native,
        [arrays(a, keep_momenta) for a in systems],
        batch=batch,
        steps=steps, dt=dt, ensemble=ensemble, temperature=temperature, friction=friction,
        init_temperature=init_temperature, seed=seed, skin=skin, pressure=pressure,
        barostat_mode=barostat_mode, barostat_time=barostat_time,
        compressibility=compressibility, traj=path(traj),
        traj_every=traj_every, log=path(log), log_every=log_every,
        restart_every=restart_every, restart_file=path(restart_file), keep_going=keep_going,
        bond_limit=bond_limit, overwrite=overwrite, append=append, callback=callback, graphs=graphs,
    )
    out = []
    for a, x, v, cell in zip(systems, xs, vs, cells):
        b = a.copy()
        b.calc = None
        if cell is not None:
            b.set_cell(cell)
        b.positions = x
        b.set_momenta(v * masses(b.numbers)[:, None])
        out.append(b)
    return (out if batch else out[0]), json.loads(summary)


def arrays(atoms, keep_momenta: bool):
    """One system as the engine takes it: positions, numbers, cell and pbc where periodic,
    momenta where kept."""
    periodic = bool(atoms.pbc.any())
    return (
        np.ascontiguousarray(atoms.positions, dtype=np.float64),
        np.ascontiguousarray(atoms.numbers, dtype=np.int64),
        np.array(atoms.cell[:], dtype=np.float64) if periodic else None,
        np.array(atoms.pbc, dtype=bool) if periodic else None,
        np.ascontiguousarray(atoms.get_momenta(), dtype=np.float64) if keep_momenta else None,
    )


def masses(numbers) -> np.ndarray:
    """The masses (amu) the engine uses for these elements."""
    return np.asarray(_native.masses(np.ascontiguousarray(numbers, dtype=np.int64)))
