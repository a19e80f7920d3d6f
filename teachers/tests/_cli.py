"""Helpers shared by the newer test files: running the teachers/ scripts as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TEACHERS_DIR = Path(__file__).resolve().parents[1]
ROOT = TEACHERS_DIR.parent
# The bridge lives in the Python package; from a checkout it imports without the engine.
if str(ROOT / "python") not in sys.path:
    sys.path.insert(0, str(ROOT / "python"))

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run(script, *args, env=None, check=True, timeout=120):
    """Run teachers/SCRIPT with this interpreter; fail with its output if it does not exit 0."""
    p = subprocess.run(
        [sys.executable, str(TEACHERS_DIR / script), *map(str, args)],
        capture_output=True,
        text=True,
        env=env or ENV,
        timeout=timeout,
    )
    if check and p.returncode != 0:
        raise AssertionError(f"{script} {args} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def assert_clean_error(p, *needles):
    """Exit code 2, one `error: ...` line naming each of `needles`, no traceback."""
    assert p.returncode == 2, (p.returncode, p.stderr)
    errors = [line for line in p.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    for n in needles:
        assert n in errors[0], (n, errors[0])


def strain_derivative(atoms, calc, d):
    """(1/V) dE/dε by central differences of the energy of strained copies of `atoms`
    (fractional positions kept), in ASE's Voigt order xx yy zz yz xz xy, eV/Å³: what
    `atoms.get_stress()` should equal."""
    import numpy as np

    out = []
    for i, j in [(0, 0), (1, 1), (2, 2), (1, 2), (0, 2), (0, 1)]:
        es = []
        for sign in (1, -1):
            eps = np.zeros((3, 3))
            eps[i, j] += sign * d / (1 if i == j else 2)
            eps[j, i] += 0 if i == j else sign * d / 2
            a = atoms.copy()
            a.set_cell(atoms.cell.array @ (np.eye(3) + eps), scale_atoms=True)
            a.calc = calc
            es.append(a.get_potential_energy())
        out.append((es[0] - es[1]) / (2 * d) / atoms.get_volume())
    return out


def force_by_difference(atoms, calc, i, k, h):
    """-dE/dx of atom i along axis k by central differences of `calc`'s energy, step h (Å):
    what `atoms.get_forces()[i, k]` should equal."""
    p = atoms.copy()
    p.calc = calc
    p.positions[i, k] += h
    ep = p.get_potential_energy()
    p.positions[i, k] -= 2 * h
    em = p.get_potential_energy()
    return -(ep - em) / (2 * h)
