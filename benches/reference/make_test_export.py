#!/usr/bin/env python3
"""A smoke-test input for painn_torch.py and md_torch.py, written without cargo.

Writes DIR/NAME.safetensors files in the format of `mlff bench --export DIR`
(src/cli/bench/mod.rs, `export`): species, centers, neighbors and atom_structure as u32;
positions, offsets, energies and forces as f32; cells (zero: no cell) and masses as f64, pbc as
u8; metadata n_structures. Structures are frames of an extended-XYZ file (default
data/gfn2/aspirin_test.extxyz), molecules without a cell; edges are every ordered pair (i, j),
i != j, within one structure and closer than the model's cutoff (both directions of each bond,
sorted by i then j, zero image offsets), found by brute force.

THE ENERGIES AND FORCES ARE NOT mlff's: they are the PyTorch eager model's own output
(painn_torch.PaiNN in float64 on the CPU), so that the agreement columns of painn_torch.py
measure PyTorch's float32 forms (eager, CUDA graph, torch.compile) against float64 eager.
This is a smoke-test input, not a reference: only `mlff bench --export` checks PyTorch
against mlff.

    python3 benches/reference/make_test_export.py MODEL.safetensors DIR
        [--xyz FILE] [--name aspirin] [--batches 1,4] [--first-frame 0]

writes DIR/aspirin.safetensors (frame 0) and DIR/aspirin-x4.safetensors (frames 0-3 as one
batch of four structures), as `mlff bench` names its systems.
"""
import argparse
import json
import pathlib
import sys

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from painn_torch import PaiNN, energy_forces  # noqa: E402

# Atomic numbers and masses (amu, as ASE's) of the elements the shipped data hold.
ELEMENTS = {"H": (1, 1.008), "C": (6, 12.011), "N": (7, 14.007), "O": (8, 15.999),
            "F": (9, 18.998), "S": (16, 32.06), "Cl": (17, 35.45)}


def read_extxyz(path):
    """Frames of an extended-XYZ file as (symbols, positions [N, 3] f64)."""
    lines = pathlib.Path(path).read_text().splitlines()
    frames, k = [], 0
    while k < len(lines) and lines[k].strip():
        n = int(lines[k])
        rows = [lines[k + 2 + i].split() for i in range(n)]
        frames.append(([r[0] for r in rows], np.array([[float(v) for v in r[1:4]] for r in rows])))
        k += n + 2
    return frames


def edges_within(pos, cutoff):
    """Ordered pairs (i, j), i != j, |x_j - x_i| < cutoff, sorted by i then j."""
    d = np.linalg.norm(pos[None, :, :] - pos[:, None, :], axis=-1)
    i, j = np.nonzero((d < cutoff) & ~np.eye(len(pos), dtype=bool))
    return i, j


def system(frames, elements, cutoff):
    """The exported arrays (without energies and forces) of `frames` as one batch."""
    species, pos, centers, neighbors, atom_structure, masses = [], [], [], [], [], []
    base = 0
    for s, (symbols, x) in enumerate(frames):
        for a, sym in enumerate(symbols):
            z, m = ELEMENTS[sym]
            if z not in elements:
                sys.exit(f"atom {a} ({sym}) of structure {s}: the model knows Z = {elements}")
            species.append(elements.index(z))
            masses.append(m)
        i, j = edges_within(x, cutoff)
        centers.append(i + base)
        neighbors.append(j + base)
        atom_structure.append(np.full(len(x), s))
        pos.append(x)
        base += len(x)
    n_s = len(frames)
    centers = np.concatenate(centers)
    return dict(
        species=np.array(species, dtype=np.uint32),
        positions=np.concatenate(pos).astype(np.float32),
        centers=centers.astype(np.uint32),
        neighbors=np.concatenate(neighbors).astype(np.uint32),
        offsets=np.zeros((len(centers), 3), dtype=np.float32),
        atom_structure=np.concatenate(atom_structure).astype(np.uint32),
        cells=np.zeros((n_s, 3, 3), dtype=np.float64),
        pbc=np.zeros((n_s, 3), dtype=np.uint8),
        masses=np.array(masses, dtype=np.float64),
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("dir")
    ap.add_argument("--xyz", default="data/gfn2/aspirin_test.extxyz")
    ap.add_argument("--name", default="aspirin", help="system name (file stem)")
    ap.add_argument("--batches", default="1,4", help="structures per system, comma-separated")
    ap.add_argument("--first-frame", type=int, default=0)
    a = ap.parse_args()
    with safe_open(a.model, "pt") as f:
        cfg = json.loads(f.metadata()["config"])
    model = PaiNN(a.model, torch.device("cpu"), torch.float64)
    frames = read_extxyz(a.xyz)
    out = pathlib.Path(a.dir)
    out.mkdir(parents=True, exist_ok=True)
    for b in (int(v) for v in a.batches.split(",")):
        chosen = frames[a.first_frame:a.first_frame + b]
        if len(chosen) < b:
            sys.exit(f"{a.xyz}: {len(frames)} frames, fewer than {a.first_frame} + {b}")
        t = system(chosen, list(cfg["elements"]), float(cfg["cutoff"]))
        x = {k: torch.from_numpy(t[k].astype(np.int64))
             for k in ("species", "centers", "neighbors", "atom_structure")}
        x["offsets"], x["n"] = torch.from_numpy(t["offsets"]).double(), b
        e, f = energy_forces(model, x, torch.from_numpy(t["positions"]).double())
        t["energies"] = e.numpy().astype(np.float32)
        t["forces"] = f.numpy().astype(np.float32)
        name = a.name if b == 1 else f"{a.name}-x{b}"
        path = out / f"{name}.safetensors"
        save_file(t, str(path), metadata={"n_structures": str(b)})
        print(f"{path}: {len(t['species'])} atoms, {len(t['centers'])} edges, {b} structure(s), "
              f"energies {t['energies'].tolist()} eV (PyTorch eager float64, not mlff)")


if __name__ == "__main__":
    main()
