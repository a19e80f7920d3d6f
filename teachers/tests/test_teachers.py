"""Tests of the teacher bridge (GFN2-xTB path, offline). Fast: a few seconds on 2 cores.

Run: OMP_NUM_THREADS=1 python3 -m pytest -q teachers/tests
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
TEACHERS_DIR = HERE.parent
# The bridge lives in the Python package; from a checkout it imports without the engine.
sys.path.insert(0, str(TEACHERS_DIR.parent / "python"))

import ase.io  # noqa: E402
from ase import Atoms  # noqa: E402
from ase.build import molecule  # noqa: E402

from mlff_distiller.teachers import core as T  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def run(script, *args, env=None, check=True):
    p = subprocess.run(
        [sys.executable, str(TEACHERS_DIR / script), *map(str, args)],
        capture_output=True,
        text=True,
        env=env or ENV,
        timeout=120,
    )
    if check and p.returncode != 0:
        raise AssertionError(f"{script} {args} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def water(seed=0):
    a = molecule("H2O")
    a.rattle(0.05, seed=seed)
    return a


# ------------------------------------------------------------------------------------- gfn2


def test_gfn2_water_finite_and_forces_are_minus_gradient():
    atoms = water()
    atoms.calc = T.get_calculator("gfn2", accuracy=0.01)
    e = atoms.get_potential_energy()
    f = atoms.get_forces()
    assert np.isfinite(e) and np.isfinite(f).all()
    assert -200 < e < -100  # GFN2 water is about -137.9 eV
    assert np.abs(f.sum(axis=0)).max() < 1e-6  # no net force on an isolated molecule
    h = 1e-3
    fd = np.zeros_like(f)
    for i in range(len(atoms)):
        for k in range(3):
            p = atoms.copy()
            p.calc = atoms.calc
            p.positions[i, k] += h
            ep = p.get_potential_energy()
            p.positions[i, k] -= 2 * h
            em = p.get_potential_energy()
            fd[i, k] = -(ep - em) / (2 * h)
    assert np.abs(fd - f).max() < 1e-3, (fd, f)


def test_unknown_teacher_and_missing_package_raise_clear_errors():
    with pytest.raises(T.TeacherError, match="unknown teacher 'nope'.*gfn2"):
        T.get_calculator("nope")
    with pytest.raises(T.TeacherError, match="fennol-ani2x.*--model-file"):
        T.get_calculator("fennol-ani2x")
    with pytest.raises(T.TeacherError, match="does not take"):
        T.get_calculator("gfn2", bogus=1)


# ------------------------------------------------------------------------------------ label


def test_label_round_trip_keeps_info_and_arrays(tmp_path):
    frames = []
    for i in range(2):
        a = water(seed=i)
        a.info["config_type"] = f"test{i}"
        a.info["weight"] = 0.5 + i
        a.arrays["tag_like"] = np.arange(len(a)) + 10 * i
        frames.append(a)
    inp = tmp_path / "in.extxyz"
    ase.io.write(inp, frames, format="extxyz")
    before = inp.read_bytes()
    out = tmp_path / "out.extxyz"
    p = run("label.py", inp, "-o", out)
    assert "frames: 2 labelled" in p.stdout and "per structure" in p.stdout and "per atom" in p.stdout
    assert inp.read_bytes() == before
    got = ase.io.read(out, ":")
    assert len(got) == 2
    for i, (a, b) in enumerate(zip(frames, got)):
        assert b.info["config_type"] == f"test{i}"
        assert b.info["weight"] == pytest.approx(0.5 + i)
        assert b.info["teacher"] == "gfn2"
        assert b.info["teacher_time_s"] > 0
        np.testing.assert_array_equal(b.arrays["tag_like"], a.arrays["tag_like"])
        np.testing.assert_allclose(b.positions, a.positions, atol=1e-7)
        assert np.isfinite(b.get_potential_energy())
        assert b.get_forces().shape == (3, 3)
    # the energy and forces column are where the Rust reader expects them
    lines = out.read_text().splitlines()
    assert "forces:R:3" in lines[1] and " energy=" in lines[1]
    # never onto the input, and not onto an existing output without --overwrite
    p = run("label.py", out, "-o", out, check=False)
    assert p.returncode == 2 and "refusing to overwrite" in p.stderr
    p = run("label.py", inp, "-o", out, check=False)
    assert p.returncode == 2 and "--overwrite" in p.stderr
    # old labels are kept as ref_energy / ref_forces
    out2 = tmp_path / "out2.extxyz"
    run("label.py", out, "-o", out2)
    again = ase.io.read(out2, ":")
    assert again[0].info["ref_energy"] == pytest.approx(got[0].get_potential_energy())
    np.testing.assert_allclose(again[0].arrays["ref_forces"], got[0].get_forces(), atol=1e-7)


def test_label_failed_frame_is_named_and_can_be_skipped(tmp_path):
    inp = tmp_path / "in.extxyz"
    ase.io.write(inp, [water(0), water(1)], format="extxyz")
    out = tmp_path / "out.extxyz"
    p = run("label.py", inp, "-o", out, "--max-iterations", "1", check=False)
    assert p.returncode == 2
    assert "error:" in p.stderr and "frame 0" in p.stderr and "Traceback" not in p.stderr
    p = run("label.py", inp, "-o", out, "--max-iterations", "1", "--skip-failed", check=False)
    assert p.returncode == 2 and "failed on all 2 frames" in p.stderr
    assert p.stderr.count("warning:") == 2
    assert not out.exists()


# ----------------------------------------------------------------------------------- sample


def _sample(out_dir, every=5):
    return run(
        "sample.py",
        "--smiles", "ethanol=CCO",
        "--temperatures", "300", "500",
        "--seeds", "0", "1",
        "--equil-steps", "10",
        "--steps", "20",
        "--every", every,
        "--max-opt-steps", "30",
        "-o", out_dir,
        "--start-dir", out_dir / "start",
    )


def test_sample_is_reproducible_and_keeps_every_kth_frame(tmp_path):
    _sample(tmp_path / "a")
    _sample(tmp_path / "b")
    fa = (tmp_path / "a" / "ethanol.extxyz").read_text()
    fb = (tmp_path / "b" / "ethanol.extxyz").read_text()
    strip = lambda s: [  # noqa: E731 - teacher wall times differ between runs, nothing else
        " ".join(t for t in line.split() if not t.startswith("teacher_time_s=")) for line in s.splitlines()
    ]
    assert strip(fa) == strip(fb)
    frames = ase.io.read(tmp_path / "a" / "ethanol.extxyz", ":")
    assert len(frames) == 2 * 2 * (20 // 5)
    trajs = {}
    for a in frames:
        trajs.setdefault(a.info["trajectory"], []).append(a.info["step"])
        assert a.info["teacher"] == "gfn2" and a.info["teacher_time_s"] > 0
        assert a.info["temperature_K"] in (300.0, 500.0)
        assert np.isfinite(a.get_potential_energy()) and a.get_forces().shape == (9, 3)
        assert "momenta" not in a.arrays
    assert sorted(trajs) == ["ethanol_300K_s0", "ethanol_300K_s1", "ethanol_500K_s0", "ethanol_500K_s1"]
    for steps in trajs.values():
        assert steps == [15, 20, 25, 30]  # 10 equilibration steps dropped, then every 5th
    # different seeds give different trajectories
    s0 = [a.positions for a in frames if a.info["trajectory"] == "ethanol_300K_s0"]
    s1 = [a.positions for a in frames if a.info["trajectory"] == "ethanol_300K_s1"]
    assert not np.allclose(s0[-1], s1[-1])
    # the stored labels are the teacher's for the stored positions (not recomputed elsewhere)
    calc = T.get_calculator("gfn2")
    a = frames[-1].copy()
    e, f, _, _ = T.compute(a, calc)
    assert e == pytest.approx(frames[-1].get_potential_energy(), abs=1e-4)
    np.testing.assert_allclose(f, frames[-1].get_forces(), atol=1e-3)
    start = ase.io.read(tmp_path / "a" / "start" / "ethanol.extxyz")
    assert start.info["smiles"] == "CCO" and len(start) == 9


def test_sample_relax_only_saves_the_relaxed_start_and_runs_no_md(tmp_path):
    run(
        "sample.py", "--cluster", "w2=O:2", "--relax-only", "--max-opt-steps", "40",
        "-o", tmp_path / "md", "--start-dir", tmp_path / "start", "--summary-json", tmp_path / "s.json",
    )
    start = ase.io.read(tmp_path / "start" / "w2.extxyz")
    assert len(start) == 6 and start.info["copies"] == 2
    assert not (tmp_path / "md" / "w2.extxyz").exists()
    s = json.loads((tmp_path / "s.json").read_text())["molecules"]["w2"]
    assert s["atoms"] == 6 and s["relax_calls"] >= 1 and s["teacher_s"] > 0
    p = run("sample.py", "--cluster", "w2=O:2", "--relax-only", "-o", tmp_path / "x", check=False)
    assert p.returncode != 0 and "--relax-only needs --start-dir" in p.stderr


def test_sample_every_k_other_value(tmp_path):
    run(
        "sample.py", "--cluster", "w2=O:2", "--temperatures", "400", "--seeds", "3",
        "--equil-steps", "4", "--steps", "12", "--every", "3", "--no-optimize", "-o", tmp_path,
    )
    frames = ase.io.read(tmp_path / "w2.extxyz", ":")
    assert [a.info["step"] for a in frames] == [7, 10, 13, 16]
    assert {a.info["trajectory"] for a in frames} == {"w2_400K_s3"}
    assert len(frames[0]) == 6


# ------------------------------------------------------------------------------------ split


def _fake_trajectories(path, n_traj, frames_per=3):
    frames = []
    for t in range(n_traj):
        for s in range(frames_per):
            a = Atoms("H2", positions=[[0, 0, 0], [0, 0, 0.74 + 0.01 * s]])
            a.info.update(trajectory=f"h2_{t}", step=s)
            frames.append(a)
    ase.io.write(path, frames, format="extxyz")
    return frames


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_split_never_puts_a_trajectory_in_two_splits(tmp_path, seed):
    inp = tmp_path / "all.extxyz"
    _fake_trajectories(inp, 10)
    p = run("split.py", inp, "-o", tmp_path / "x", "--counts", "6", "2", "2", "--seed", seed)
    assert "train: 6 trajectories, 18 frames" in p.stdout
    seen = {}
    total = 0
    for s in ("train", "val", "test"):
        frames = ase.io.read(tmp_path / f"x_{s}.extxyz", ":")
        total += len(frames)
        for a in frames:
            t = a.info["trajectory"]
            assert seen.setdefault(t, s) == s, f"{t} in {seen[t]} and {s}"
    assert total == 30 and len(seen) == 10
    assert sum(1 for v in seen.values() if v == "val") == 2


def test_split_is_seeded_and_refuses_too_few_trajectories(tmp_path):
    inp = tmp_path / "all.extxyz"
    _fake_trajectories(inp, 8)
    run("split.py", inp, "-o", tmp_path / "a", "--fractions", "0.75", "0.125", "0.125", "--seed", 3)
    run("split.py", inp, "-o", tmp_path / "b", "--fractions", "0.75", "0.125", "0.125", "--seed", 3)
    for s in ("train", "val", "test"):
        assert (tmp_path / f"a_{s}.extxyz").read_text() == (tmp_path / f"b_{s}.extxyz").read_text()
    few = tmp_path / "few.extxyz"
    _fake_trajectories(few, 2)
    p = run("split.py", few, "-o", tmp_path / "c", check=False)
    assert p.returncode == 2 and "only 2 trajectories for 3 splits" in p.stderr
    ase.io.write(tmp_path / "notraj.extxyz", [water()], format="extxyz")
    p = run("split.py", tmp_path / "notraj.extxyz", "-o", tmp_path / "d", check=False)
    assert p.returncode == 2 and "no 'trajectory' info key" in p.stderr


# --------------------------------------------------------------------------- CLI error paths


@pytest.fixture()
def tiny(tmp_path):
    inp = tmp_path / "in.extxyz"
    ase.io.write(inp, [water()], format="extxyz")
    return inp


def test_cli_unknown_teacher_exit_2(tmp_path, tiny):
    p = run("label.py", tiny, "-o", tmp_path / "o.extxyz", "--teacher", "not-a-teacher", check=False)
    assert p.returncode == 2
    assert p.stderr.startswith("error: unknown teacher 'not-a-teacher'") and "Traceback" not in p.stderr
    p = run("sample.py", "--smiles", "w=O", "-o", tmp_path / "md", "--teacher", "not-a-teacher", check=False)
    assert p.returncode == 2 and "unknown teacher" in p.stderr


def test_cli_missing_model_file_exit_2(tmp_path, tiny):
    p = run("label.py", tiny, "-o", tmp_path / "o.extxyz", "--teacher", "fennol-ani2x", check=False)
    assert p.returncode == 2 and "needs a model file" in p.stderr and "Traceback" not in p.stderr
    p = run(
        "label.py", tiny, "-o", tmp_path / "o.extxyz", "--teacher", "fennol-ani2x",
        "--model-file", tmp_path / "missing.fnx", check=False,
    )
    assert p.returncode == 2 and "does not exist" in p.stderr


def _fake_package(root: Path, files: dict):
    for rel, text in files.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)


def test_cli_weights_not_downloadable_exit_2(tmp_path, tiny):
    """orb-v2 downloads weights on first use; offline that fails -> clear error, exit 2.

    A stand-in `orb_models` package (whose loader fails like a download without network) is
    put on PYTHONPATH, so this runs whether or not the real one is installed.
    """
    fake = tmp_path / "fake"
    _fake_package(
        fake,
        {
            "orb_models/__init__.py": "",
            "orb_models/forcefield/__init__.py": "",
            "orb_models/forcefield/pretrained.py": (
                "import urllib.error\n"
                "def orb_v2(**kw):\n"
                "    raise urllib.error.URLError('[Errno -3] Temporary failure in name resolution')\n"
            ),
            "orb_models/forcefield/calculator.py": "class ORBCalculator:\n    pass\n",
        },
    )
    env = {**ENV, "PYTHONPATH": str(fake)}
    p = run("label.py", tiny, "-o", tmp_path / "o.extxyz", "--teacher", "orb-v2", env=env, check=False)
    assert p.returncode == 2, p.stderr
    assert "could not get the orb-v2 weights" in p.stderr and "--model-file" in p.stderr
    assert "Traceback" not in p.stderr
    # and without the package at all: names the package and how to install it
    p = run("label.py", tiny, "-o", tmp_path / "o.extxyz", "--teacher", "mace-off", check=False)
    if p.returncode == 2 and "cannot be imported" in p.stderr:
        assert "pip install mace-torch" in p.stderr


def test_torchani_empty_info_file_is_detected_and_fixed(tmp_path, monkeypatch):
    """The torchani 2.2.4 wheel ships ANI-1x networks but an empty ani-1x_8x.info."""
    fake = tmp_path / "fake"
    files = {
        "torchani/__init__.py": "",
        "torchani/resources/ani-1x_8x.info": "",
        "torchani/resources/ani-1x_8x/rHCNO-5.2R_16-3.5A_a4-8.params": "x",
        "torchani/resources/ani-1x_8x/sae_linfit.dat": "x",
    }
    for i in range(8):
        files[f"torchani/resources/ani-1x_8x/train{i}/networks/ANN-H.nnf"] = "x"
    _fake_package(fake, files)
    monkeypatch.syspath_prepend(str(fake))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delitem(sys.modules, "torchani", raising=False)
    status = T.fix_torchani_resources(fix=False)
    assert status.startswith("broken") and "empty" in status
    msg = T.fix_torchani_resources(fix=True)
    assert msg.startswith("fixed")
    info = (fake / "torchani/resources/ani-1x_8x.info").read_text().split()
    assert info == [
        "ani-1x_8x/rHCNO-5.2R_16-3.5A_a4-8.params",
        "ani-1x_8x/sae_linfit.dat",
        "ani-1x_8x/train",
        "8",
    ]
    assert T.fix_torchani_resources(fix=False).startswith("ok")
    # ANI-2x in the same wheel: empty placeholder files -> clear error, nothing written
    two = {"torchani/resources/ani-2x_8x.info": "", "torchani/resources/ani-2x_8x/r.params": "",
           "torchani/resources/ani-2x_8x/sae_linfit.dat": ""}
    for i in range(8):
        two[f"torchani/resources/ani-2x_8x/train{i}/networks/ANN-H.nnf"] = ""
    _fake_package(fake, two)
    with pytest.raises(T.TeacherError, match="ani2x.*placeholder.*internet"):
        T.fix_torchani_resources(fix=True, model_dir="ani-2x_8x", teacher="ani2x")
    assert (fake / "torchani/resources/ani-2x_8x.info").read_text() == ""


def test_help_texts():
    for script in ("label.py", "sample.py", "split.py"):
        p = run(script, "--help")
        assert "usage:" in p.stdout
    assert "--skip-failed" in run("label.py", "--help").stdout
    assert "--every" in run("sample.py", "--help").stdout


def test_label_writes_the_stress_of_periodic_cells(tmp_path):
    """GFN2 (tblite) labels a periodic box with its stress, in the layout ASE reads back with
    get_stress() and `mlff eval` compares against; a molecule gets none."""
    box = water(seed=1) + water(seed=2).copy()
    box.positions[3:] += 2.5
    box.set_cell([6.0, 6.5, 7.0])
    box.pbc = True
    inp, out = tmp_path / "in.extxyz", tmp_path / "out.extxyz"
    ase.io.write(inp, [box, water(seed=3)], format="extxyz")
    run("label.py", inp, "-o", out)
    got = ase.io.read(out, ":")
    direct = box.copy()
    direct.calc = T.get_calculator("gfn2")
    np.testing.assert_allclose(got[0].get_stress(), direct.get_stress(), atol=1e-9)
    assert np.abs(got[0].get_stress()).max() > 1e-5
    assert "stress" not in got[1].calc.results
    # Kept as ref_stress (9 values) when labelled again.
    out2 = tmp_path / "out2.extxyz"
    run("label.py", out, "-o", out2)
    again = ase.io.read(out2, 0)
    full = np.asarray(again.info["ref_stress"]).reshape(3, 3)
    np.testing.assert_allclose(full[[0, 1, 2, 1, 0, 0], [0, 1, 2, 2, 2, 1]], got[0].get_stress(), atol=1e-12)
    # The engine reads the labels: `mlff eval` reports the stress errors of the one box.
    root = Path(__file__).resolve().parents[2]
    mlff = root / "target" / "debug" / "mlff"
    if not mlff.exists():
        if os.environ.get("MLFF_REQUIRE_TEACHERS") == "1":
            pytest.fail(f"{mlff} is not built (cargo build)")
        pytest.skip("the mlff binary is not built")
    report = tmp_path / "eval.json"
    p = subprocess.run(
        [str(mlff), "eval", str(root / "models" / "painn-gfn2.safetensors"), str(out),
         "--device", "cpu", "--json", str(report)],
        capture_output=True, text=True,
    )
    assert p.returncode == 0, p.stderr
    import json
    stress = json.loads(report.read_text())["report"]["stress"]
    assert stress["frames"] == 1, stress

