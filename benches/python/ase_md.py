#!/usr/bin/env python3
"""ASE-driven MD with our calculator, beside the engine's own MD and a PyTorch ASE calculator
of the same model and weights (benches/reference/painn_torch.py), and the calculator's
per-call overhead over the engine call it wraps.

    python3 benches/python/ase_md.py MODEL [--device cuda] [--steps 2000] [--no-torch]
        [--json OUT.json]

Rows: aspirin (21 atoms) and a periodic water box (1,029 atoms):
  ase+ours     ase.md.verlet.VelocityVerlet, mlff_distiller.Calculator: steps/s
  engine       mlff_distiller.md.run, the same NVE on the engine: steps/s
  ase+torch    VelocityVerlet with an eager PyTorch calculator (neighbour list and
               energy+forces every call, as peers' ASE calculators do): steps/s
  call         one energy+forces call through ASE (atoms.get_forces after a move) against
               the engine call it wraps (Session.evaluate): ms each
Needs mlff_distiller (pip install ./python), ase, and for the torch row torch + safetensors.
"""
import argparse
import json
import pathlib
import sys
import time

import ase.io
import ase.units
import numpy as np
from ase import Atoms
from ase.calculators.calculator import Calculator as AseCalculator
from ase.calculators.calculator import all_changes
from ase.md.verlet import VelocityVerlet

import mlff_distiller as mf

ROOT = pathlib.Path(__file__).resolve().parents[2]


def aspirin():
    return ase.io.read(ROOT / "data" / "gfn2" / "start" / "aspirin.extxyz")


def water_box(n_side=7, spacing=3.1):
    """n_side³ water molecules on a cubic grid in a periodic box."""
    mol = np.array([[0.0, 0.0, 0.0], [0.0, 0.757, 0.587], [0.0, -0.757, 0.587]])
    grid = np.array([[i, j, k] for i in range(n_side) for j in range(n_side) for k in range(n_side)])
    pos = (grid[:, None, :] * spacing + mol[None]).reshape(-1, 3)
    return Atoms("OH2" * len(grid), positions=pos, cell=[n_side * spacing] * 3, pbc=True)


def thermalize(atoms, temperature=300.0, seed=0):
    m = mf.md.masses(atoms.numbers)
    atoms.set_masses(m)
    rng = np.random.default_rng(seed)
    p = rng.normal(size=(len(atoms), 3)) * np.sqrt(m[:, None] * ase.units.kB * temperature)
    atoms.set_momenta(p - p.mean(0) * m[:, None] / m.mean())
    return atoms


def ase_steps_per_s(atoms, calc, steps, warmup=50):
    atoms = atoms.copy()
    atoms.calc = calc
    dyn = VelocityVerlet(atoms, timestep=0.5 * ase.units.fs)
    dyn.run(warmup)
    t = time.perf_counter()
    dyn.run(steps)
    return steps / (time.perf_counter() - t)


def call_ms(atoms, model, repeats=200):
    """(through ASE, the engine call alone) per energy+forces, ms."""
    atoms = atoms.copy()
    atoms.calc = mf.Calculator(model)
    rng = np.random.default_rng(1)
    moves = rng.normal(scale=1e-3, size=(repeats, len(atoms), 3))
    atoms.get_forces()
    t = time.perf_counter()
    for d in moves:
        atoms.positions += d
        atoms.get_forces()
    through_ase = (time.perf_counter() - t) / repeats * 1e3
    session = atoms.calc._session
    x = np.ascontiguousarray(atoms.positions)
    t = time.perf_counter()
    for d in moves:
        x = x + d
        session.evaluate(x)
    alone = (time.perf_counter() - t) / repeats * 1e3
    return through_ase, alone


class TorchCalculator(AseCalculator):
    """An eager PyTorch ASE calculator of the same model: neighbour list and energy+forces
    (torch.autograd.grad) at every call."""

    implemented_properties = ["energy", "forces"]

    def __init__(self, path, device):
        super().__init__()
        sys.path.insert(0, str(ROOT / "benches" / "reference"))
        import torch
        from md_torch import neighbor_list
        from painn_torch import PaiNN

        self.torch, self.neighbor_list = torch, neighbor_list
        self.model = PaiNN(str(path), device, torch.float32)
        self.device = device

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        torch, a = self.torch, self.atoms
        cfg = self.model.cfg
        index = {z: k for k, z in enumerate(cfg["elements"])}
        species = torch.tensor([index[z] for z in a.numbers], device=self.device)
        pos = torch.tensor(a.positions, device=self.device, dtype=torch.float64)
        cell = torch.tensor(np.array(a.cell[:]), device=self.device, dtype=torch.float64)
        pbc = torch.tensor(a.pbc, device=self.device)
        c, nb, off = self.neighbor_list(pos, cell, pbc, cfg["cutoff"])
        x = pos.float().requires_grad_(True)
        zeros = torch.zeros(len(a), dtype=torch.long, device=self.device)
        e = self.model(species, x, c, nb, off.float(), zeros, 1)
        (g,) = torch.autograd.grad(e.sum(), x)
        self.results = {"energy": float(e.sum()), "forces": (-g).double().cpu().numpy()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    model = mf.Model(a.model, device=a.device)
    rows = []
    for name, atoms, steps in [("aspirin", aspirin(), a.steps), ("water-1029", water_box(), a.steps // 10)]:
        atoms = thermalize(atoms)
        row = {"system": name, "atoms": len(atoms), "device": model.device}
        row["ase_ours_steps_per_s"] = ase_steps_per_s(atoms, mf.Calculator(model), steps)
        _, s = mf.md.run(atoms, model, steps=steps, keep_momenta=True, log_every=max(1, steps // 10))
        row["engine_steps_per_s"] = s["steps_per_s"]
        row["call_through_ase_ms"], row["call_engine_ms"] = call_ms(atoms, model)
        if not a.no_torch:
            dev = "cuda" if model.device.startswith("cuda") else "cpu"
            row["ase_torch_steps_per_s"] = ase_steps_per_s(atoms, TorchCalculator(a.model, dev), max(10, steps // 10), warmup=10)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| system | atoms | ASE + ours steps/s | engine md.run steps/s | ASE + PyTorch steps/s | call via ASE ms | engine call ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['system']} | {r['atoms']} | {r['ase_ours_steps_per_s']:.0f} | {r['engine_steps_per_s']:.0f} | "
              f"{r.get('ase_torch_steps_per_s', float('nan')):.0f} | {r['call_through_ase_ms']:.3f} | {r['call_engine_ms']:.3f} |")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
