"""The ASE calculator and batched calls against `mlff predict`, finite differences, and
one-by-one calls; bad input raises naming the cause."""

import ase.io
import numpy as np
import pytest
from ase import Atom, Atoms
from ase.calculators.fd import calculate_numerical_forces

import mlff_distiller as mf


@pytest.mark.parametrize("dtype,tol", [("float32", 2e-4), ("float64", 1e-9)])
def test_calculator_equals_mlff_predict(root, model_path, tmp_path, dtype, tol, device):
    frames = root / "data" / "gfn2" / "aspirin_test.extxyz"
    out = tmp_path / "pred.extxyz"
    status = mf.main(["predict", model_path, frames, "-o", out, "--device", device,
                      "--dtype", dtype.replace("float", "f")])
    assert status == 0
    predicted = ase.io.read(out, ":6")
    calc = mf.Calculator(model_path, device=device, dtype=dtype)
    for atoms, want in zip(ase.io.read(frames, ":6"), predicted):
        atoms.calc = calc
        e = atoms.get_potential_energy()
        assert abs(e - want.get_potential_energy()) < tol * max(1.0, abs(e)) * 10
        np.testing.assert_allclose(atoms.get_forces(), want.get_forces(), atol=tol * 10, rtol=0)
        assert atoms.get_potential_energy(force_consistent=True) == e


def test_forces_are_minus_the_energy_gradient(root, model_path, device):
    atoms = ase.io.read(root / "data" / "gfn2" / "start" / "ethanol.extxyz")
    atoms.calc = mf.Calculator(model_path, device=device, dtype="float64")
    numerical = calculate_numerical_forces(atoms, eps=1e-4)
    np.testing.assert_allclose(atoms.get_forces(), numerical, atol=1e-6, rtol=0)
    # Per-atom energies add up to the energy.
    assert abs(atoms.get_potential_energies().sum() - atoms.get_potential_energy()) < 1e-9


def test_one_calculator_follows_changes_of_the_system(root, model_path, device):
    calc = mf.Calculator(model_path, device=device, dtype="float64")
    atoms = ase.io.read(root / "data" / "gfn2" / "start" / "ethanol.extxyz")

    def check(a):
        a.calc = calc
        got = (a.get_potential_energy(), a.get_forces())
        fresh = a.copy()
        fresh.calc = mf.Calculator(calc.model, skin=calc.skin)
        assert abs(got[0] - fresh.get_potential_energy()) < 1e-9
        np.testing.assert_allclose(got[1], fresh.get_forces(), atol=1e-9, rtol=0)
        return got

    e0, _ = check(atoms)
    moved = atoms.copy()
    moved.positions[0] += [0.3, -0.2, 0.1]
    assert check(moved)[0] != e0
    grown = atoms.copy()
    grown.append(Atom("H", (4.0, 4.0, 4.0)))
    check(grown)
    swapped = atoms.copy()
    swapped.numbers[np.where(swapped.numbers == 8)[0][0]] = 7
    check(swapped)
    boxed = atoms.copy()
    boxed.cell = [7.0, 7.5, 8.0]
    boxed.pbc = True
    check(boxed)
    boxed.cell = [6.0, 7.5, 8.0]
    check(boxed)


def test_a_batch_equals_one_by_one(root, model_path, device):
    model = mf.Model(model_path, device=device, dtype="float64")
    frames = ase.io.read(root / "data" / "gfn2" / "aspirin_test.extxyz", ":3")
    frames += ase.io.read(root / "data" / "gfn2" / "water8_test.extxyz", ":2")
    box = frames[-1].copy()
    box.cell = [9.0, 9.0, 9.0]
    box.pbc = True
    frames.append(box)
    energies, forces = model.compute(frames)
    assert energies.shape == (len(frames),)
    for k, atoms in enumerate(frames):
        e, f = model.compute([atoms])
        assert abs(e[0] - energies[k]) < 1e-9
        np.testing.assert_allclose(f[0], forces[k], atol=1e-9, rtol=0)


def test_bad_input_raises_naming_the_cause(root, model_path, tmp_path, device):
    model = mf.Model(model_path, device=device)
    water = Atoms("OHH", positions=[[0, 0, 0], [0, 0, 0.97], [0.94, 0, -0.24]])
    chlorine = Atoms("OCl", positions=[[0, 0, 0], [0, 0, 1.7]])
    with pytest.raises(ValueError, match="Z=17"):
        model.compute([water, chlorine])
    with pytest.raises(ValueError, match=r"positions\[1\].*not finite"):
        model.compute_arrays([[0, 0, 0], [np.nan, 0, 0]], [8, 1])
    with pytest.raises(ValueError, match="positions: shape"):
        model.compute_arrays(np.zeros((3, 2)), [8, 1, 1])
    with pytest.raises(ValueError, match="structure_index"):
        model.compute_arrays(np.zeros((3, 3)), [8, 1, 1], structure_index=[0, 2, 2])
    water.calc = mf.Calculator(model)
    water.positions[1] = water.positions[0]
    with pytest.raises(ValueError, match="not finite|atoms 0 and 1"):
        water.get_forces()
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        mf.Model(tmp_path / "missing.safetensors")
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match="corrupt.safetensors"):
        mf.Model(corrupt)
    with pytest.raises(ValueError, match="dtype"):
        mf.Model(model_path, dtype="float16")


def test_the_gil_is_released_while_the_engine_computes(root, model_path, device):
    """Another Python thread runs while a batch is being computed: the main thread's loop
    keeps turning inside the engine calls' time windows. (A model is used by the thread that
    made it: the engine's state is not shared between threads.)"""
    import threading
    import time

    frames = ase.io.read(root / "data" / "gfn2" / "aspirin_test.extxyz", ":")
    positions = np.concatenate([a.positions for a in frames])
    numbers = np.concatenate([a.numbers for a in frames])
    index = np.repeat(np.arange(len(frames)), [len(a) for a in frames])
    windows, failure, done = [], [], threading.Event()

    def work():
        try:
            model = mf.Model(model_path, device=device)
            for _ in range(4):
                t0 = time.perf_counter()
                model.compute_arrays(positions, numbers, structure_index=index)
                windows.append((t0, time.perf_counter()))
        except Exception as e:  # reported below, not lost in the thread
            failure.append(e)
        finally:
            done.set()

    ticks = []
    t = threading.Thread(target=work)
    t.start()
    while not done.is_set():
        ticks.append(time.perf_counter())
    t.join()
    assert not failure, failure
    # Turns of this loop well inside the calls: none if the calls held the GIL. (Between
    # taking a window's time and entering the call the GIL may pass to this thread for one
    # switch interval: the margin is four of them.)
    import sys

    margin = 4 * sys.getswitchinterval()
    inside = sum(1 for x in ticks for a, b in windows[1:] if a + margin < x < b - margin)
    span = sum(b - a for a, b in windows[1:])
    assert span > 10 * margin, f"calls too short to tell: {span} s"
    assert inside > 1000, (inside, span)


def water_box():
    """Eight randomly turned waters in a 6.2 Å periodic cube."""
    from ase.build import molecule

    rng = np.random.default_rng(1)
    atoms = Atoms(cell=[6.2, 6.2, 6.2], pbc=True)
    for i, j, k in np.ndindex(2, 2, 2):
        w = molecule("H2O")
        w.rotate(rng.uniform(0, 360), rng.normal(size=3))
        w.translate(np.array([i, j, k]) * 3.1 + 1.5)
        atoms += w
    return atoms


def test_stress_is_ase_numerical_stress_with_its_sign_and_order(model_path, device):
    from ase.calculators.calculator import PropertyNotImplementedError
    from ase.calculators.fd import calculate_numerical_stress

    atoms = water_box()
    atoms.calc = mf.Calculator(model_path, device=device, dtype="float64")
    stress = atoms.get_stress()
    assert stress.shape == (6,) and np.abs(stress).max() > 1e-4
    numerical = calculate_numerical_stress(atoms, eps=1e-5)
    np.testing.assert_allclose(stress, numerical, atol=1e-8, rtol=1e-5)
    # Energy and forces of the stress call are those of the plain call.
    e, f = atoms.get_potential_energy(), atoms.get_forces()
    atoms.calc.reset()
    assert abs(atoms.get_potential_energy() - e) < 1e-9
    np.testing.assert_allclose(atoms.get_forces(), f, atol=1e-9, rtol=0)
    molecule = Atoms("H2O", positions=[[0, 0, 0], [0.96, 0, 0], [-0.24, 0.93, 0]])
    molecule.calc = mf.Calculator(model_path, device=device)
    with pytest.raises(PropertyNotImplementedError, match="periodic"):
        molecule.get_stress()
