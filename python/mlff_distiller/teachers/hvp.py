"""Hessian-vector labels for Hessian-informed training (Amin et al., ICLR 2025, who use one
random Hessian row per structure; a random direction carries the same information, spread
over all atoms).

Per frame: a random unit direction v over the 3N Cartesian coordinates, stored as the per-atom
array `hvp_direction` (N x 3, unit norm over all 3N entries), and the Hessian-vector product
H.v as the per-atom array `hvp` (N x 3, eV/Å²), from two extra teacher force calls:

    H.v = -(F(x + h v) - F(x - h v)) / (2 h)          (F = -dE/dx, so H.v = -dF/dh)

with the step h (Å) recorded as the info key `hvp_step`. Central differences are used for every
teacher, the ML ones with autograd included: one code path, and the error, O(h²) times the
third derivative, is far below the teachers' own noise at the default h = 1e-3 Å.
"""

from __future__ import annotations

import math
import time

import numpy as np

DEFAULT_HVP_STEP = 1e-3
HVP_KEYS = ("hvp", "hvp_direction")


def hvp_direction(natoms: int, seed: int, index: int) -> np.ndarray:
    """The direction for frame `index`: Gaussian over 3N coordinates, scaled to unit norm
    (uniform on the sphere). Seeded by (seed, index) alone, so the same command gives the same
    file and a frame's direction does not depend on which other frames are labelled."""
    rng = np.random.default_rng([int(seed), int(index)])
    v = rng.standard_normal((natoms, 3))
    return v / np.linalg.norm(v)


def hessian_vector_product(atoms, calc, v, step: float = DEFAULT_HVP_STEP) -> np.ndarray:
    """H.v (eV/Å²) of `atoms` with `calc` by central differences of the forces along `v`."""
    work = atoms.copy()
    # A constraint (FixCom, FixAtoms, ...) would project the forces; the label is the
    # teacher's unconstrained Hessian.
    work.set_constraint()
    x0 = atoms.get_positions()
    work.calc = calc
    work.set_positions(x0 + step * v)
    fp = np.array(work.get_forces())
    work.set_positions(x0 - step * v)
    fm = np.array(work.get_forces())
    return -(fp - fm) / (2.0 * step)


def check_step(step) -> float:
    step = float(step)
    if not (math.isfinite(step) and 0 < step <= 0.1):
        raise ValueError(f"the Hessian-vector step must be in (0, 0.1] Å, got {step}")
    return step


def keep_old_hvp(atoms, drop: bool = False) -> None:
    """Move Hessian-vector labels a frame already has to `ref_hvp`/`ref_hvp_direction` (info
    `ref_hvp_step`), as label.py does with old energies and forces: they belong to another
    teacher (or step) and must not stand beside new forces as if they matched them."""
    for key in HVP_KEYS:
        old = atoms.arrays.pop(key, None)
        if old is not None and not drop and f"ref_{key}" not in atoms.arrays:
            atoms.arrays[f"ref_{key}"] = np.asarray(old, dtype=float)
    atoms.info.pop("hvp_time_s", None)  # the old labelling's cost, not this one's
    step = atoms.info.pop("hvp_step", None)
    if step is not None and not drop and "ref_hvp_step" not in atoms.info:
        atoms.info["ref_hvp_step"] = step


def add_hvp_labels(atoms, calc, seed: int, index: int, step: float = DEFAULT_HVP_STEP) -> None:
    """Attach `hvp_direction`, `hvp` and info `hvp_step` to `atoms` (frame `index`), and the
    wall time of the two extra teacher calls as info `hvp_time_s` (a teacher budget counts it
    beside `teacher_time_s`)."""
    v = hvp_direction(len(atoms), seed, index)
    t0 = time.perf_counter()
    hv = hessian_vector_product(atoms, calc, v, step)
    seconds = time.perf_counter() - t0
    if not np.isfinite(hv).all():
        raise RuntimeError("non-finite forces in the Hessian-vector displacements")
    atoms.arrays["hvp_direction"] = v
    atoms.arrays["hvp"] = hv
    atoms.info["hvp_step"] = float(step)
    atoms.info["hvp_time_s"] = round(seconds, 6)
