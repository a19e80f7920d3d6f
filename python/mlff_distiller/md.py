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
    dt: float = 0.5,
    ensemble: str = "nve",
    temperature: float = 300.0,
    friction: float = 10.0,
    init_temperature: Optional[float] = None,
    seed: int = 0,
    keep_momenta: bool = False,
    skin: float = 1.0,
    traj=None,
    traj_every: int = 100,
    log=None,
    log_every: int = 10,
    restart_every: int = 0,
    restart_file=None,
    keep_going: bool = False,
    overwrite: bool = False,
    append: bool = False,
    callback: Optional[Callable] = None,
    device: str = "auto",
    dtype: str = "float32",
    graphs: str = "auto",
):
    """Runs `steps` MD steps of `dt` fs from `atoms` with `model` (a path or a `Model`).

    `ensemble` is "nve" (velocity Verlet) or "nvt" (BAOAB Langevin at `temperature` K with
    `friction` 1/ps). Velocities start from Maxwell-Boltzmann at `init_temperature` (default
    `temperature`), or from the atoms' momenta with `keep_momenta`. `traj` (extended XYZ),
    `log` (JSON lines) and `restart_file` are written as `mlff md` writes them (existing files
    are refused unless `overwrite` or `append`); `callback(step, record, positions)` is called
    at every log step (an exception it raises stops the run and is raised here).

    Returns `(atoms, summary)`: a copy of `atoms` at the last step (positions and momenta),
    and the closing summary as a dict (steps/s, drift, stability verdict, ...).
    """
    m = as_model(model, device=device, dtype=dtype, graphs=graphs)
    periodic = bool(atoms.pbc.any())
    path = lambda p: None if p is None else os.fspath(p)
    momenta = np.ascontiguousarray(atoms.get_momenta(), dtype=np.float64) if keep_momenta else None
    x, v, summary = _native.run_md(
        m.native,
        np.ascontiguousarray(atoms.positions, dtype=np.float64),
        np.ascontiguousarray(atoms.numbers, dtype=np.int64),
        np.array(atoms.cell[:], dtype=np.float64) if periodic else None,
        np.array(atoms.pbc, dtype=bool) if periodic else None,
        momenta,
        steps=steps, dt=dt, ensemble=ensemble, temperature=temperature, friction=friction,
        init_temperature=init_temperature, seed=seed, skin=skin, traj=path(traj),
        traj_every=traj_every, log=path(log), log_every=log_every,
        restart_every=restart_every, restart_file=path(restart_file), keep_going=keep_going,
        overwrite=overwrite, append=append, callback=callback, graphs=graphs,
    )
    out = atoms.copy()
    out.calc = None
    out.positions = x
    out.set_momenta(v * masses(out.numbers)[:, None])
    return out, json.loads(summary)


def masses(numbers) -> np.ndarray:
    """The masses (amu) the engine uses for these elements."""
    return np.asarray(_native.masses(np.ascontiguousarray(numbers, dtype=np.int64)))
