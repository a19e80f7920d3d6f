#!/usr/bin/env python3
"""PyTorch peer of `mlff bench --stress`: energy+forces against energy+forces+stress of the
same model and weights (painn_torch.py's PaiNN) on the systems `mlff bench --export DIR`
wrote, eager and replayed as CUDA graphs. The stress is PyTorch's usual route: a symmetric
strain ε applied to positions and image offsets, and one autograd call for ∂E/∂x and ∂E/∂ε.

    python3 benches/reference/stress_torch.py MODEL.safetensors DIR [--device cuda] [--json OUT]

Prints a markdown table: per system, the median ms of each form and the stress's cost over
energy+forces. Needs torch and safetensors.
"""
import argparse
import json
import pathlib
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from painn_torch import capture, energy_forces, model_on, time_ms  # noqa: E402


def energy_forces_stress(model, x, pos):
    """Energies, forces and ∂E/∂ε (one structure's, [3, 3]) by one autograd call."""
    pos = pos.detach().requires_grad_(True)
    strain = torch.zeros(3, 3, device=pos.device, dtype=pos.dtype, requires_grad=True)
    eps = 0.5 * (strain + strain.T)
    p = pos + pos @ eps
    off = x["offsets"] + x["offsets"] @ eps
    e = model(x["species"], p, x["centers"], x["neighbors"], off, x["atom_structure"], x["n"])
    g, de = torch.autograd.grad(e.sum(), (pos, strain))
    return e.detach(), -g, de


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("systems", help="directory written by `mlff bench --export`")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    model, dev, cuda = model_on(a.model, a.device, "stress_torch.py", "")
    print(f"PyTorch {torch.__version__}, {torch.cuda.get_device_name() if cuda else 'cpu'}, float32")
    print("| system | atoms | forces ms | forces+stress ms | stress cost | graph forces ms | "
          "graph forces+stress ms | graph stress cost |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for path in sorted(pathlib.Path(a.systems).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            n_structures = int(f.metadata()["n_structures"])
        if n_structures != 1:
            continue
        t = {k: v.to(dev) for k, v in load_file(str(path)).items()}
        x = {k: t[k].long() for k in ("species", "centers", "neighbors", "atom_structure")}
        x["offsets"], x["n"] = t["offsets"].float(), n_structures
        pos = t["positions"].float().clone()
        ef = lambda: energy_forces(model, x, pos)  # noqa: E731
        efs = lambda: energy_forces_stress(model, x, pos)  # noqa: E731
        row = dict(system=path.stem, atoms=pos.shape[0],
                   forces_ms=time_ms(ef, a.warmup, a.repeats, cuda)[0],
                   stress_ms=time_ms(efs, a.warmup, a.repeats, cuda)[0])
        if cuda:
            g1 = capture(lambda p: energy_forces(model, x, p), pos)[0]
            g2 = capture(lambda p: energy_forces_stress(model, x, p)[:2], pos)[0]
            row["graph_forces_ms"] = time_ms(g1.replay, a.warmup, a.repeats, True)[0]
            row["graph_stress_ms"] = time_ms(g2.replay, a.warmup, a.repeats, True)[0]
        else:
            row["graph_forces_ms"] = row["graph_stress_ms"] = float("nan")
        rows.append(row)
        print(f"| {row['system']} | {row['atoms']} | {row['forces_ms']:.3f} | {row['stress_ms']:.3f} | "
              f"{row['stress_ms'] / row['forces_ms'] - 1:+.1%} | {row['graph_forces_ms']:.3f} | "
              f"{row['graph_stress_ms']:.3f} | {row['graph_stress_ms'] / row['graph_forces_ms'] - 1:+.1%} |",
              flush=True)
        if a.json:
            pathlib.Path(a.json).write_text(json.dumps(dict(torch=torch.__version__, cases=rows), indent=1))


if __name__ == "__main__":
    main()
