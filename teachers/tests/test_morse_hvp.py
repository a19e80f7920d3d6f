"""The toy `morse` teacher and Hessian-vector labels (`label.py --hessian-vectors`). Offline,
ase only; a few seconds.

Run: OMP_NUM_THREADS=1 python3 -m pytest -q teachers/tests/test_morse_hvp.py
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from _cli import assert_clean_error, force_by_difference, run, strain_derivative

import ase.io  # noqa: E402
from ase import Atoms  # noqa: E402

from mlff_distiller import teachers  # noqa: E402
from mlff_distiller.teachers import core as T  # noqa: E402

EPS, R0, RHO0 = 0.5, 1.6, 6.0


def morse_pair(r):
    """The Morse pair energy inside the cut-off (r < 3 Å), written out independently of ASE."""
    x = np.exp(-RHO0 * (r / R0 - 1.0))
    return EPS * (x * x - 2.0 * x)


def c7(seed=1):
    """A 7-atom carbon cluster, atoms at least 1.4 Å apart, fixed by `seed`."""
    rng = np.random.default_rng(seed)
    pos = []
    while len(pos) < 7:
        p = rng.uniform(-2, 2, 3)
        if all(np.linalg.norm(p - q) > 1.4 for q in pos):
            pos.append(p)
    return Atoms("C7", positions=pos)


def strip_times(text):
    """The file without teacher_time_s and hvp_time_s (wall times differ between runs, nothing
    else may)."""
    timed = ("teacher_time_s=", "hvp_time_s=")
    return [" ".join(t for t in line.split() if not t.startswith(timed)) for line in text.splitlines()]


# ------------------------------------------------------------------------------------ morse


def test_morse_pair_energy_cutoff_and_elements_ignored():
    calc = T.get_calculator("morse")
    for r, want in ((R0, -EPS), (2.2, morse_pair(2.2)), (4.2, 0.0)):
        for symbols in ("C2", "H2", "HO"):  # every pair is the same, whatever the elements
            a = Atoms(symbols, positions=[[0, 0, 0], [0, 0, r]])
            a.calc = calc
            assert a.get_potential_energy() == pytest.approx(want, abs=1e-12), (symbols, r)
    # between 3 and 4 Å the smooth cut-off lowers the pair energy towards 0, continuously
    es = []
    for r in (2.999, 3.5, 3.999):
        a = Atoms("C2", positions=[[0, 0, 0], [0, 0, r]])
        a.calc = calc
        es.append(a.get_potential_energy())
    assert es[0] == pytest.approx(morse_pair(2.999), rel=1e-6)
    assert morse_pair(3.5) < es[1] < 0 and abs(es[2]) < 1e-9
    # --epsilon/--r0/--rho0 reach the potential: the minimum moves with r0 and deepens with epsilon
    a = Atoms("C2", positions=[[0, 0, 0], [0, 0, 1.3]])
    a.calc = T.get_calculator("morse", epsilon=0.8, r0=1.3)
    assert a.get_potential_energy() == pytest.approx(-0.8, abs=1e-12)
    assert np.abs(a.get_forces()).max() < 1e-12


def test_morse_forces_are_minus_gradient():
    atoms = c7()
    atoms.calc = T.get_calculator("morse")
    f = atoms.get_forces()
    assert np.abs(f).max() > 0.1 and np.abs(f.sum(axis=0)).max() < 1e-10
    h = 1e-5
    for i, k in ((0, 0), (3, 1), (6, 2)):
        assert force_by_difference(atoms, atoms.calc, i, k, h) == pytest.approx(f[i, k], abs=1e-6)


def _periodic_carbon():
    a = Atoms("C8", scaled_positions=np.random.default_rng(2).uniform(0, 1, (8, 3)), cell=[4.5, 4.8, 5.1], pbc=True)
    # spread the atoms out so that no pair sits deep in the repulsive wall
    for _ in range(200):
        d = a.get_all_distances(mic=True) + 10 * np.eye(len(a))
        i, j = np.unravel_index(np.argmin(d), d.shape)
        if d[i, j] > 1.3:
            break
        a.positions[i] += 0.2 * a.get_distance(j, i, mic=True, vector=True) / d[i, j]
    return a


def test_label_morse_writes_stress_of_periodic_cells_equal_to_strain_derivative(tmp_path):
    box = _periodic_carbon()
    mol = c7()
    inp, out = tmp_path / "in.extxyz", tmp_path / "out.extxyz"
    ase.io.write(inp, [box, mol], format="extxyz")
    p = run("label.py", inp, "-o", out, "--teacher", "morse")
    assert "teacher: morse = Morse pair potential" in p.stdout
    got = ase.io.read(out, ":")
    assert got[0].info["teacher"] == "morse" and "stress" not in got[1].calc.results
    s = got[0].get_stress()  # Voigt xx yy zz yz xz xy, eV/Å³
    # stress = (1/V) dE/d(strain), strain applied to the cell with fractional positions kept
    fd = strain_derivative(got[0], T.get_calculator("morse"), 1e-5)
    for v in range(6):
        assert fd[v] == pytest.approx(s[v], abs=1e-6), v
    assert np.abs(s).max() > 1e-3


def test_sample_morse_c7_relaxes_and_runs_langevin_fast(tmp_path):
    start = tmp_path / "c7.xyz"
    ase.io.write(start, c7())
    t0 = time.perf_counter()
    p = run(
        "sample.py", start, "--teacher", "morse", "--temperatures", "300", "--seeds", "0",
        "--equil-steps", "100", "--steps", "400", "--every", "20", "-o", tmp_path / "md",
        "--start-dir", tmp_path / "start",
    )
    wall = time.perf_counter() - t0
    assert "c7: 7 atoms (C7), relaxed in" in p.stdout and "NOT converged" not in p.stdout
    assert wall < 30, wall  # about 1 s here; the point of this teacher is speed
    relaxed = ase.io.read(tmp_path / "start" / "c7.extxyz")
    assert np.linalg.norm(relaxed.get_forces(), axis=1).max() < 0.05
    assert relaxed.get_potential_energy() < -5  # bound: several bonds of about -0.5 eV
    frames = ase.io.read(tmp_path / "md" / "c7.extxyz", ":")
    assert len(frames) == 20 and [a.info["step"] for a in frames][:2] == [120, 140]
    calc = T.get_calculator("morse")
    for a in frames:
        assert a.info["teacher"] == "morse" and a.info["trajectory"] == "c7_300K_s0"
        assert a.get_all_distances().max() < 8  # still a cluster at 300 K
        e, f, _, _ = T.compute(a.copy(), calc)  # the stored labels are the teacher's
        assert e == pytest.approx(a.get_potential_energy(), abs=1e-6)
        np.testing.assert_allclose(f, a.get_forces(), atol=1e-5)
    # it moved: the last frame is not the relaxed start
    assert np.abs(frames[-1].get_all_distances() - relaxed.get_all_distances()).max() > 0.01


def test_morse_is_listed():
    assert "morse" in T.TEACHERS and T.teacher_status("morse") == "ok"
    p = run("teachers.py")
    assert any(line.startswith("morse") for line in p.stdout.splitlines())


def test_morse_bad_options_are_one_line_errors(tmp_path):
    inp = tmp_path / "in.extxyz"
    ase.io.write(inp, [c7()], format="extxyz")
    o = tmp_path / "o.extxyz"
    assert_clean_error(run("label.py", inp, "-o", o, "--teacher", "morse", "--r0", "3.5", check=False), "--r0")
    assert_clean_error(run("label.py", inp, "-o", o, "--teacher", "morse", "--epsilon", "-1", check=False), "--epsilon")
    assert_clean_error(run("label.py", inp, "-o", o, "--teacher", "gfn2", "--rho0", "5", check=False), "--rho0", "morse")
    assert not o.exists()


# ------------------------------------------------------------------------ Hessian-vector labels


def fd_hessian(atoms, calc, h):
    """The full 3N x 3N Hessian, column by column, by central differences of teacher forces."""
    x = atoms.copy()
    x.calc = calc
    x0 = x.get_positions()
    n = 3 * len(x)
    H = np.zeros((n, n))
    for j in range(n):
        d = np.zeros(n)
        d[j] = h
        x.set_positions(x0 + d.reshape(-1, 3))
        fp = x.get_forces().ravel()
        x.set_positions(x0 - d.reshape(-1, 3))
        fm = x.get_forces().ravel()
        H[:, j] = -(fp - fm) / (2 * h)
    return H


@pytest.mark.parametrize("step,tol", [(1e-4, 1e-5), (1e-3, 1e-3)])
def test_hvp_equals_full_hessian_times_direction(tmp_path, step, tol):
    frames = [c7(1), c7(2), _periodic_carbon()]
    inp, out = tmp_path / "in.extxyz", tmp_path / "out.extxyz"
    ase.io.write(inp, frames, format="extxyz")
    p = run("label.py", inp, "-o", out, "--teacher", "morse", "--hessian-vectors", "--hvp-step", step)
    assert "Hessian-vector labels" in p.stdout
    calc = T.get_calculator("morse")
    for a in ase.io.read(out, ":"):
        v, hv = a.arrays["hvp_direction"], a.arrays["hvp"]
        assert v.shape == hv.shape == (len(a), 3)
        assert a.info["hvp_step"] == pytest.approx(step)
        assert a.info["hvp_time_s"] > 0  # the two extra calls' cost, for teacher budgets
        H = fd_hessian(a, calc, step)
        assert np.abs(H - H.T).max() < 10 * tol  # the reference itself is sound
        np.testing.assert_allclose(hv.ravel(), H @ v.ravel(), rtol=0, atol=tol * np.abs(hv).max())
        # and, from energies alone (so no sign of the forces can hide): v.H.v = d²E/dh² along v
        x = a.copy()
        x.calc = calc
        x0 = x.get_positions()
        e = []
        for s in (1, 0, -1):
            x.set_positions(x0 + s * 1e-3 * v)
            e.append(x.get_potential_energy())
        assert float(v.ravel() @ hv.ravel()) == pytest.approx((e[0] - 2 * e[1] + e[2]) / 1e-6, rel=1e-3)
        assert np.abs(hv).max() > 0.1  # a real curvature, not zeros


def test_hvp_direction_is_unit_and_reproducible(tmp_path):
    frames = [c7(1), c7(2), c7(3)]
    inp = tmp_path / "in.extxyz"
    ase.io.write(inp, frames, format="extxyz")
    outs = {}
    for tag, extra in (("a", []), ("b", []), ("s1", ["--seed", "1"])):
        outs[tag] = tmp_path / f"{tag}.extxyz"
        run("label.py", inp, "-o", outs[tag], "--teacher", "morse", "--hessian-vectors", *extra)
    assert strip_times(outs["a"].read_text()) == strip_times(outs["b"].read_text())
    a = ase.io.read(outs["a"], ":")
    s1 = ase.io.read(outs["s1"], ":")
    dirs = [f.arrays["hvp_direction"] for f in a]
    for k, d in enumerate(dirs):
        assert np.linalg.norm(d) == pytest.approx(1.0, abs=1e-7)  # over all 3N entries
        np.testing.assert_allclose(d, teachers.hvp_direction(7, 0, k), atol=1e-8)  # (seed, frame)
        assert abs(float(np.vdot(d, s1[k].arrays["hvp_direction"]))) < 0.9  # --seed changes it
    assert abs(float(np.vdot(dirs[0], dirs[1]))) < 0.9  # frames differ
    # the Python function gives the same labels as the script
    api = teachers.label(ase.io.read(inp, ":"), "morse", hessian_vectors=True)
    for x, y in zip(api, a):
        np.testing.assert_allclose(x.arrays["hvp_direction"], y.arrays["hvp_direction"], atol=1e-8)
        np.testing.assert_allclose(x.arrays["hvp"], y.arrays["hvp"], atol=1e-6)


def test_hvp_relabel_keeps_old_labels_as_ref(tmp_path):
    inp = tmp_path / "in.extxyz"
    ase.io.write(inp, [c7(1), c7(2)], format="extxyz")
    old = tmp_path / "old.extxyz"
    run("label.py", inp, "-o", old, "--teacher", "morse", "--epsilon", "0.3", "--hessian-vectors")
    new = tmp_path / "new.extxyz"
    run("label.py", old, "-o", new, "--teacher", "morse", "--hessian-vectors", "--seed", "5")
    before, after = ase.io.read(old, ":"), ase.io.read(new, ":")
    for b, a in zip(before, after):
        assert a.info["ref_energy"] == pytest.approx(b.get_potential_energy(), abs=1e-9)
        np.testing.assert_allclose(a.arrays["ref_forces"], b.get_forces(), atol=1e-8)
        np.testing.assert_allclose(a.arrays["ref_hvp"], b.arrays["hvp"], atol=1e-8)
        np.testing.assert_allclose(a.arrays["ref_hvp_direction"], b.arrays["hvp_direction"], atol=1e-8)
        assert a.info["ref_hvp_step"] == pytest.approx(1e-3)
        # the new labels are this teacher's (epsilon 0.5 is 5/3 of 0.3: all labels scale)
        assert a.get_potential_energy() == pytest.approx(b.get_potential_energy() * 5 / 3, rel=1e-6)
        assert not np.allclose(a.arrays["hvp_direction"], b.arrays["hvp_direction"])
    # labelled again without --hessian-vectors: no stale H.v is left as hvp; as with ref_energy,
    # the first reference is kept (ref_hvp exists already)
    plain = tmp_path / "plain.extxyz"
    run("label.py", new, "-o", plain, "--teacher", "morse")
    p = ase.io.read(plain, 0)
    assert "hvp" not in p.arrays and "hvp_direction" not in p.arrays and "hvp_step" not in p.info
    np.testing.assert_allclose(p.arrays["ref_hvp"], before[0].arrays["hvp"], atol=1e-8)
    assert p.info["ref_energy"] == pytest.approx(before[0].get_potential_energy(), abs=1e-9)
    # on a file with H.v but no ref_hvp, relabelling moves H.v to ref_hvp
    once = tmp_path / "once.extxyz"
    run("label.py", old, "-o", once, "--teacher", "morse")
    q = ase.io.read(once, 0)
    assert "hvp" not in q.arrays
    np.testing.assert_allclose(q.arrays["ref_hvp"], before[0].arrays["hvp"], atol=1e-8)


def test_hvp_bad_options_are_one_line_errors(tmp_path):
    inp = tmp_path / "in.extxyz"
    ase.io.write(inp, [c7()], format="extxyz")
    o = tmp_path / "o.extxyz"
    assert_clean_error(run("label.py", inp, "-o", o, "--teacher", "morse", "--seed", "1", check=False), "--seed", "--hessian-vectors")
    assert_clean_error(run("label.py", inp, "-o", o, "--teacher", "morse", "--hvp-step", "1e-3", check=False), "--hvp-step")
    assert_clean_error(
        run("label.py", inp, "-o", o, "--teacher", "morse", "--hessian-vectors", "--hvp-step", "0", check=False), "--hvp-step"
    )
    assert not o.exists()
    with pytest.raises(T.TeacherError, match="step"):
        teachers.label([c7()], "morse", hessian_vectors=True, hvp_step=-1)


def test_sample_keeps_the_teachers_stress_of_periodic_cells(tmp_path):
    start = tmp_path / "box.extxyz"
    ase.io.write(start, _periodic_carbon())
    run(
        "sample.py", start, "--teacher", "morse", "--temperatures", "300", "--seeds", "0",
        "--equil-steps", "10", "--steps", "40", "--every", "20", "-o", tmp_path / "md",
        "--no-optimize",
    )
    frames = ase.io.read(tmp_path / "md" / "box.extxyz", ":")
    assert len(frames) == 2
    calc = T.get_calculator("morse")
    for a in frames:
        s = a.get_stress()
        assert np.abs(s).max() > 1e-4
        _, _, ref, _ = T.compute(a.copy(), calc)  # the teacher's own stress at this frame
        np.testing.assert_allclose(s, ref, rtol=1e-6, atol=1e-8)  # positions as written
