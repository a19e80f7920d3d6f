"""MD from Python: ASE's own velocity Verlet with the calculator conserves energy and follows
the engine's NVE step for step; `md.run` writes what `mlff md` writes and calls back."""

import json

import ase.io
import numpy as np
import pytest
from ase import units
from ase.md.verlet import VelocityVerlet

import mlff_distiller as mf


def aspirin(root):
    atoms = ase.io.read(root / "data" / "gfn2" / "start" / "aspirin.extxyz")
    # The engine's masses, so that ASE's dynamics and the engine's are the same equations.
    atoms.set_masses(mf.md.masses(atoms.numbers))
    m = atoms.get_masses()[:, None]
    rng = np.random.default_rng(3)
    atoms.set_momenta(rng.normal(size=(len(atoms), 3)) * np.sqrt(m * units.kB * 300))
    return atoms


def test_ase_velocity_verlet_conserves_energy_and_equals_the_engine(root, model_path, device):
    model = mf.Model(model_path, device=device, dtype="float64")
    start = aspirin(root)
    atoms = start.copy()
    atoms.calc = mf.Calculator(model)
    dyn = VelocityVerlet(atoms, 0.5 * units.fs)
    e_tot = []
    dyn.attach(lambda: e_tot.append(atoms.get_total_energy()), interval=1)
    dyn.run(200)
    # Energy drift: the slope of E_tot(t), in meV/atom/ps, over 100 fs.
    t_ps = np.arange(len(e_tot)) * 0.5e-3
    slope = np.polyfit(t_ps, np.array(e_tot) * 1e3 / len(atoms), 1)[0]
    assert abs(slope) < 5.0, f"drift {slope} meV/atom/ps"
    assert np.std(e_tot) * 1e3 / len(atoms) < 0.5

    engine, summary = mf.md.run(start, model, steps=200, dt=0.5, keep_momenta=True)
    assert summary["last_step"] == 200 and summary["stable"]
    np.testing.assert_allclose(engine.positions, atoms.positions, atol=1e-7, rtol=0)
    np.testing.assert_allclose(engine.get_momenta(), atoms.get_momenta(), atol=1e-6, rtol=0)


def test_md_run_writes_like_mlff_md_and_calls_back(root, model_path, tmp_path, device):
    atoms = ase.io.read(root / "data" / "gfn2" / "start" / "ethanol.extxyz")
    seen = []
    traj, log = tmp_path / "t.extxyz", tmp_path / "l.jsonl"
    final, summary = mf.md.run(
        atoms, model_path, steps=40, ensemble="nvt", temperature=400, traj=traj,
        traj_every=20, log=log, log_every=10, restart_every=20, device=device,
        callback=lambda step, record, x: seen.append((step, record["e_tot"], x.shape)),
    )
    assert [s for s, _, _ in seen] == [0, 10, 20, 30, 40]
    assert all(shape == (9, 3) for _, _, shape in seen)
    assert len(ase.io.read(traj, ":")) == 3
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 10, 20, 30, 40]
    assert rows[-1]["e_tot"] == pytest.approx(seen[-1][1])
    np.testing.assert_allclose(final.positions, ase.io.read(traj, -1).positions, atol=1e-6)
    assert summary["ensemble"].startswith("NVT") or "nvt" in summary["ensemble"].lower()
    # The restart file continues with the command.
    assert mf.main(["md", "--resume", tmp_path / "t.extxyz.restart.json", "--steps", "60",
                    "--device", device]) == 0
    # Outputs are claimed as `mlff md` claims them.
    with pytest.raises(ValueError, match="exists already"):
        mf.md.run(atoms, model_path, steps=10, traj=traj, device=device)

    def stop(step, record, x):
        if step >= 20:
            raise RuntimeError("enough")

    with pytest.raises(RuntimeError, match="enough"):
        mf.md.run(atoms, model_path, steps=1000, device=device, callback=stop)


def test_the_readme_script_runs(root, monkeypatch, device):
    """The README's five lines, as written: 1,000 ASE steps with the shipped model."""
    text = (root / "README.md").read_text()
    script = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(script.strip().splitlines()) == 5
    monkeypatch.chdir(root)
    scope = {}
    exec(compile(script, "README.md", "exec"), scope)
    atoms = scope["atoms"]
    assert atoms.calc.model.device.startswith(device), "device=\"auto\" picks the GPU where there is one"
    assert np.isfinite(atoms.get_potential_energy())


def test_md_run_judges_stability_by_its_bond_limit(root, model_path, device):
    atoms = ase.io.read(root / "data" / "gfn2" / "start" / "ethanol.extxyz")
    args = dict(steps=40, ensemble="nvt", temperature=600, seed=3, device=device)
    _, free = mf.md.run(atoms, model_path, **args)
    assert free["stable"] and free["bond_limit"] == 0.5
    limit = free["max_bond_deviation"] / 2
    _, tight = mf.md.run(atoms, model_path, bond_limit=limit, **args)
    assert not tight["stable"] and tight["bond_limit"] == limit
    assert tight["stop"]["kind"] == "unstable" and tight["last_step"] < 40
    with pytest.raises(ValueError, match="bond limit"):
        mf.md.run(atoms, model_path, bond_limit=0.0, **args)


def test_md_run_many_systems_follows_their_single_runs(root, model_path, device):
    start = root / "data" / "gfn2" / "start"
    ethanol, benzene = (ase.io.read(start / f"{n}.extxyz") for n in ("ethanol", "benzene"))
    model = mf.Model(model_path, device=device, dtype="float64")
    seen = []
    finals, summary = mf.md.run(
        [ethanol, benzene], model, steps=40, ensemble="nvt", replicas=2, seed=3,
        callback=lambda step, record, x: seen.append((step, record["active"], x)),
    )
    assert len(finals) == 4 and len(summary["systems"]) == 4
    assert summary["stable_systems"] == 4 and summary["atoms"] == 2 * 9 + 2 * 12
    assert [s for s, _, _ in seen] == [0, 10, 20, 30, 40]
    assert all(active == 4 and x is None for _, active, x in seen)
    # System k is the single run seeded with seed + k (to the batched call's rounding).
    for k, atoms in enumerate([ethanol, ethanol, benzene, benzene]):
        single, _ = mf.md.run(atoms, model, steps=40, ensemble="nvt", seed=3 + k)
        np.testing.assert_allclose(finals[k].positions, single.positions, atol=1e-8, rtol=0)
        np.testing.assert_allclose(finals[k].get_momenta(), single.get_momenta(), atol=1e-7, rtol=0)
    assert not np.allclose(finals[0].positions, finals[1].positions)
    with pytest.raises(ValueError, match="replicas"):
        mf.md.run(ethanol, model, steps=1, replicas=0)


def test_md_run_at_constant_pressure(root, model_path, tmp_path, device):
    """ensemble="npt": the cell moves, the returned atoms carry the last one (as the trajectory
    does), the log and the callback get the volume; a molecule is refused by name."""
    atoms = ase.io.read(root / "data" / "gfn2" / "start" / "water8.extxyz")
    atoms.set_cell([14.0, 14.0, 14.0])
    atoms.pbc = True
    log, traj = tmp_path / "l.jsonl", tmp_path / "t.extxyz"
    seen = []
    final, summary = mf.md.run(
        atoms, model_path, steps=20, ensemble="npt", temperature=300, pressure=2000,
        barostat_time=100, compressibility=1e-3, log=log, log_every=5, traj=traj,
        traj_every=20, device=device,
        callback=lambda step, record, x: seen.append(record["volume"]),
    )
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["volume"] for r in rows] == pytest.approx(seen, rel=1e-12)
    assert all("density" in r and "pressure_bar" in r and "e_eff" in r for r in rows)
    assert summary["ensemble"] == "npt" and summary["volume_mean_a3"] > 0
    last = ase.io.read(traj, -1)
    np.testing.assert_allclose(final.cell[:], last.cell[:], atol=1e-6)
    assert final.get_volume() == pytest.approx(rows[-1]["volume"], rel=1e-9)
    assert final.get_volume() != pytest.approx(14.0**3, rel=1e-6), "the cell never moved"

    # Two replicas at constant pressure: each returned Atoms carries its own last cell.
    batch_log = tmp_path / "b.jsonl"
    finals, _ = mf.md.run(
        atoms, model_path, steps=20, ensemble="npt", temperature=300, pressure=2000,
        barostat_time=100, compressibility=1e-3, replicas=2, log=batch_log, log_every=20,
        device=device,
    )
    rows = [json.loads(line) for line in batch_log.read_text().splitlines()]
    last = {r["system"]: r["volume"] for r in rows if r["step"] == 20}
    for k, f in enumerate(finals):
        assert f.get_volume() == pytest.approx(last[k], rel=1e-9)
    assert finals[0].get_volume() != pytest.approx(finals[1].get_volume(), rel=1e-9)

    molecule = ase.io.read(root / "data" / "gfn2" / "start" / "ethanol.extxyz")
    with pytest.raises(ValueError, match="constant pressure needs a cell periodic"):
        mf.md.run(molecule, model_path, steps=5, ensemble="npt", device=device)
