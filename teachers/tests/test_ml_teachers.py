"""The ML teachers that work offline here: ANI-2x from a weights folder (torchani) and
SevenNet-0 (sevenn, checkpoint inside the wheel).

They need torch, torchani==2.2.4 and sevenn==0.13.0 (teachers/requirements-ml.txt), which CI's
environment does not have: those tests skip when the packages are missing, unless
MLFF_REQUIRE_ML_TEACHERS=1. The ANI-2x tests take the weights folder from MLFF_ANI2X_DIR (the
team's copy: ../shared/teachers/ani-model-zoo/resources) and skip without it. The error paths at
the top run everywhere: they stop before torch is imported.

    MLFF_REQUIRE_ML_TEACHERS=1 MLFF_ANI2X_DIR=../shared/teachers/ani-model-zoo/resources \\
        OMP_NUM_THREADS=1 target/teachers-ml-venv/bin/python -m pytest -q teachers/tests/test_ml_teachers.py
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

from _cli import ENV, assert_clean_error, force_by_difference, run, strain_derivative

import ase.io  # noqa: E402
from ase.build import bulk, molecule  # noqa: E402

from mlff_distiller.teachers import core as T  # noqa: E402

REQUIRE = os.environ.get("MLFF_REQUIRE_ML_TEACHERS") == "1"


def need(*modules):
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        if REQUIRE:
            pytest.fail(f"MLFF_REQUIRE_ML_TEACHERS=1 but {', '.join(missing)} cannot be imported")
        pytest.skip(f"{', '.join(missing)} not installed (teachers/requirements-ml.txt)")


def ani2x_dir():
    need("torch", "torchani")
    d = os.environ.get("MLFF_ANI2X_DIR")
    if not d:
        pytest.skip("MLFF_ANI2X_DIR is not set (the ANI-2x weights folder)")
    return Path(d)


def ethanol():
    return molecule("CH3CH2OH")


def fd_force_check(atoms, calc, components, h, tol):
    """forces == -dE/dx by central differences for the given (atom, axis) components."""
    atoms = atoms.copy()
    atoms.calc = calc
    f = atoms.get_forces()
    for i, k in components:
        assert force_by_difference(atoms, calc, i, k, h) == pytest.approx(f[i, k], abs=tol), (i, k)
    assert np.abs(f).max() > 0.05  # a non-trivial force, so the check means something


# ------------------------------------------------------------------- error paths (no torch)


def test_ani2x_needs_model_dir_and_names_what_is_wrong(tmp_path):
    inp, o = tmp_path / "in.extxyz", tmp_path / "o.extxyz"
    ase.io.write(inp, [ethanol()], format="extxyz")
    assert_clean_error(run("label.py", inp, "-o", o, "--teacher", "ani2x", check=False), "--model-dir")
    assert_clean_error(
        run("label.py", inp, "-o", o, "--teacher", "ani2x", "--model-dir", tmp_path / "nope", check=False),
        "does not exist",
    )
    # a folder like the torchani wheel's: info file present, networks empty placeholders
    fake = tmp_path / "fake"
    (fake / "ani-2x_8x").mkdir(parents=True)
    (fake / "ani-2x_8x.info").write_text("ani-2x_8x/r.params\nani-2x_8x/sae_linfit.dat\nani-2x_8x/train\n8\n")
    (fake / "ani-2x_8x" / "r.params").write_text("x")
    (fake / "ani-2x_8x" / "sae_linfit.dat").write_text("x")
    for i in range(8):
        (fake / "ani-2x_8x" / f"train{i}" / "networks").mkdir(parents=True)
        (fake / "ani-2x_8x" / f"train{i}" / "networks" / "ANN-H.nnf").write_text("")
    assert_clean_error(
        run("label.py", inp, "-o", o, "--teacher", "ani2x", "--model-dir", fake, check=False),
        "no network files", "train0",
    )
    (fake / "ani-2x_8x.info").write_text("")
    assert_clean_error(
        run("label.py", inp, "-o", o, "--teacher", "ani2x", "--model-dir", fake, check=False), "is empty"
    )
    assert not o.exists()
    with pytest.raises(T.TeacherError, match="--model-dir"):
        T.get_calculator("ani2x")


def test_ml_teachers_are_listed():
    assert {"ani2x", "sevenn"} <= set(T.TEACHERS)
    assert T.canonical_name("SevenNet-0") == "sevenn"
    if importlib.util.find_spec("sevenn") is None:
        with pytest.raises(T.TeacherError, match="pip install torch sevenn==0.13.0"):
            T.get_calculator("sevenn")


# ------------------------------------------------------------------------------------ ANI-2x


def test_ani2x_from_folder_ethanol(tmp_path):
    d = ani2x_dir()
    inp, out = tmp_path / "in.extxyz", tmp_path / "out.extxyz"
    ase.io.write(inp, [ethanol()], format="extxyz")
    home = tmp_path / "home"  # torchani's fallback folder is ~/.local/torchani: must stay empty
    home.mkdir()
    p = run("label.py", inp, "-o", out, "--teacher", "ani2x", "--model-dir", d, env={**ENV, "HOME": str(home)})
    assert "teacher: ani2x = ANI-2x (torchani 2.2.4)" in p.stdout
    assert "note:" not in p.stderr and not any(home.iterdir())
    a = ase.io.read(out)
    assert a.info["teacher"] == "ani2x"
    assert a.get_potential_energy() == pytest.approx(-4217.50, abs=0.01)
    assert np.isfinite(a.get_forces()).all()
    assert np.abs(a.get_forces().sum(axis=0)).max() < 1e-6  # no net force on a molecule
    calc = T.get_calculator("ani2x", model_dir=d)
    fd_force_check(ethanol(), calc, [(0, 0), (2, 1), (8, 2)], h=1e-3, tol=1e-3)
    # one member of the ensemble differs from the mean, slightly
    one = ethanol()
    one.calc = T.get_calculator("ani2x", model_dir=d, model_index=3)
    e3 = one.get_potential_energy()
    assert e3 != pytest.approx(a.get_potential_energy(), abs=1e-6) and abs(e3 - a.get_potential_energy()) < 0.5


def test_ani2x_hessian_vector_labels(tmp_path):
    d = ani2x_dir()
    inp, out = tmp_path / "in.extxyz", tmp_path / "out.extxyz"
    a = ethanol()
    a.rattle(0.02, seed=1)
    ase.io.write(inp, [a], format="extxyz")
    run("label.py", inp, "-o", out, "--teacher", "ani2x", "--model-dir", d, "--hessian-vectors")
    got = ase.io.read(out)
    v, hv = got.arrays["hvp_direction"], got.arrays["hvp"]
    assert np.linalg.norm(v) == pytest.approx(1, abs=1e-7) and np.isfinite(hv).all()
    # v.H.v from energies alone
    x = got.copy()
    x.calc = T.get_calculator("ani2x", model_dir=d)
    x0 = x.get_positions()
    e = []
    for s in (1, 0, -1):
        x.set_positions(x0 + s * 2e-3 * v)
        e.append(x.get_potential_energy())
    assert float(np.vdot(v, hv)) == pytest.approx((e[0] - 2 * e[1] + e[2]) / 4e-6, rel=1e-2, abs=0.05)


# ------------------------------------------------------------------------------------ sevenn


def test_sevenn_ethanol_energy_and_forces(tmp_path):
    need("torch", "sevenn")
    inp, out = tmp_path / "in.extxyz", tmp_path / "out.extxyz"
    ase.io.write(inp, [ethanol()], format="extxyz")
    p = run("label.py", inp, "-o", out, "--teacher", "sevenn", "--device", "cpu")
    assert "SevenNet-0 (sevenn 0.13.0)" in p.stdout
    a = ase.io.read(out)
    assert np.isfinite(a.get_potential_energy()) and np.isfinite(a.get_forces()).all()
    # -46.68 eV with sevenn 0.13.0 (VASP-PBE scale energies, unlike ANI's all-electron ones)
    assert a.get_potential_energy() == pytest.approx(-46.68, abs=0.05)
    assert "stress" not in a.calc.results  # a molecule has none
    # SevenNet runs in float32: a larger step, a looser tolerance
    fd_force_check(ethanol(), T.get_calculator("sevenn"), [(0, 0), (2, 1), (8, 2)], h=1e-2, tol=5e-3)


def test_sevenn_stress_is_strain_derivative(tmp_path):
    need("torch", "sevenn")
    si = bulk("Si", "diamond", a=5.43, cubic=True)
    si.rattle(0.03, seed=0)
    si.set_cell(si.cell.array @ np.array([[1.02, 0.01, 0], [0, 0.99, 0.02], [0, 0, 1.0]]), scale_atoms=True)
    inp, out = tmp_path / "in.extxyz", tmp_path / "out.extxyz"
    ase.io.write(inp, [si], format="extxyz")
    run("label.py", inp, "-o", out, "--teacher", "sevenn")
    got = ase.io.read(out)
    s = got.get_stress()
    assert np.abs(s).max() > 1e-3
    fd = strain_derivative(got, T.get_calculator("sevenn"), 2e-3)
    for v in range(6):
        assert fd[v] == pytest.approx(s[v], abs=2e-4), v
