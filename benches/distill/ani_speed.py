#!/usr/bin/env python3
"""The ANI-2x ensemble's time per structure (energy and forces), the peer of `mlff bench
--teacher-data` for issue 46's ANI-2x student: for the first frame of every molecule in FRAMES,
one structure per call and BATCH copies per call (each copy displaced by 0.01 Å noise), on
--device, in --dtype. torchani 2.2.4 builds the model as the teacher bridge does, from
--model-dir (a folder like ani-model-zoo's resources/). Prints a markdown table; --json keeps it.

    python3 benches/distill/ani_speed.py FRAMES --model-dir DIR --device cuda [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

import ase.io  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from mlff_distiller.teachers.ml import _ani_from_dir, check_ani_model_dir  # noqa: E402


def seconds_per_call(model, species, coords, device, repeats):
    """Mean wall time of energy + forces (autograd) over `repeats` calls, after warm-up."""

    def call():
        x = coords.clone().requires_grad_(True)
        e = model((species, x)).energies
        (f,) = torch.autograd.grad(e.sum(), x)
        return f

    for _ in range(5):
        call()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        call()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("frames")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    model = _ani_from_dir("ani2x", check_ani_model_dir("ani2x", args.model_dir), None)
    model = model.to(device).to(dtype)
    # torchani 2.2.4's energy shifter writes a float64 constant into its self energies, so it
    # stays in float64 while the AEVs and networks run in --dtype.
    model.energy_shifter.to(torch.float64)
    firsts = {}
    for a in ase.io.read(args.frames, ":"):
        firsts.setdefault(a.info.get("molecule", a.get_chemical_formula()), a)
    rng = np.random.default_rng(0)
    rows = []
    for name, a in firsts.items():
        z = torch.tensor(a.numbers, device=device).unsqueeze(0)
        x = torch.tensor(a.positions, device=device, dtype=dtype).unsqueeze(0)
        one = seconds_per_call(model, z, x, device, args.repeats)
        noise = rng.normal(0, 0.01, (args.batch, len(a), 3))
        xb = torch.tensor(a.positions[None] + noise, device=device, dtype=dtype)
        zb = z.expand(args.batch, -1).contiguous()
        many = seconds_per_call(model, zb, xb, device, max(1, args.repeats // 5)) / args.batch
        rows.append({"molecule": name, "atoms": len(a), "ms_per_call": one * 1e3,
                     "ms_per_structure_batched": many * 1e3})
    print(f"ANI-2x ensemble, {args.dtype}, {device}, batch {args.batch}, torch {torch.__version__}\n")
    print("| molecule | atoms | one per call ms | batched ms/structure |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['molecule']} | {r['atoms']} | {r['ms_per_call']:.3f} | {r['ms_per_structure_batched']:.4f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": str(device), "dtype": args.dtype,
                                               "batch": args.batch, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
