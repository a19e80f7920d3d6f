#!/usr/bin/env python3
"""PyTorch training loop of the same PaiNN, loss and optimiser as `mlff train`, for the
training-throughput comparison of BENCHMARKS.md (issue 48).

The model is painn_torch.PaiNN with our checkpoint's weights as trainable parameters (the
readout statistics fixed, as ours); the loss is ours: energy_weight · mean((ΔE / atoms)²) +
force_weight · mean(ΔF²), forces by torch.autograd.grad with create_graph; AdamW, the gradient
norm clipped to 10, one step per batch of `--batch` molecules. Neighbour lists are built once
per frame (positions do not change in training). Two forms:

  eager   the step as written;
  graph   the whole step (forward, double backward, clipping, capturable AdamW) captured once
          as a CUDA graph and replayed on static buffers the batches are copied into (edges
          padded to a fixed count with edges longer than the cutoff, which contribute nothing).

    python3 benches/reference/train_torch.py MODEL.safetensors TRAIN.extxyz [--batch 8 32]
        [--steps 200] [--forms eager,graph] [--json OUT.json]

Prints structures/s per form and batch (after warm-up steps that are not timed).
Needs torch and safetensors.
"""
import argparse
import json
import pathlib
import sys
import time

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from md_torch import neighbor_list  # noqa: E402
from painn_torch import PaiNN  # noqa: E402

FIXED = ("readout.atom_ref", "readout.scale", "readout.shift")
SYMBOLS = {"H": 1, "C": 6, "N": 7, "O": 8}


def read_frames(path):
    """(numbers, positions, energy, forces, cell or None) of every frame of an extended-XYZ
    file with species, pos and forces among its Properties (rMD17, our teachers and our MD
    trajectories write them), periodic where it gives a Lattice."""
    lines = pathlib.Path(path).read_text().splitlines()
    frames, k = [], 0
    while k < len(lines) and lines[k].strip():
        n = int(lines[k])
        comment = lines[k + 1]
        energy = float(comment.split("energy=")[1].split()[0])
        props = comment.split("Properties=")[1].split()[0].split(":")
        columns, at = {}, 0
        for name, _, width in zip(props[0::3], props[1::3], props[2::3]):
            columns[name] = (at, at + int(width))
            at += int(width)
        cell = None
        if "Lattice=" in comment:
            cell = np.array(comment.split('Lattice="')[1].split('"')[0].split(), float).reshape(3, 3)
        rows = [lines[k + 2 + i].split() for i in range(n)]
        numbers = np.array([SYMBOLS[r[columns["species"][0]]] for r in rows])
        part = lambda name: np.array([[float(v) for v in r[slice(*columns[name])]] for r in rows])  # noqa: E731
        frames.append((numbers, part("pos"), energy, part("forces"), cell))
        k += n + 2
    return frames


class Trainable(torch.nn.Module):
    def __init__(self, path, device):
        super().__init__()
        self.painn = PaiNN(str(path), device, torch.float32)
        self.params = torch.nn.ParameterDict(
            {k.replace(".", "__"): torch.nn.Parameter(v.clone())
             for k, v in self.painn.w.items() if k not in FIXED})
        for k, p in self.params.items():
            self.painn.w[k.replace("__", ".")] = p


def batches(data, batch, rng):
    order = rng.permutation(len(data["frames"]))
    return [order[k:k + batch] for k in range(0, len(order) - batch + 1, batch)]


def assemble(data, idx, dev, pad_edges=None):
    """The model inputs and labels of frames `idx`, edges padded to `pad_edges` if given."""
    n_atoms = [len(data["frames"][i][0]) for i in idx]
    offsets = np.cumsum([0] + n_atoms)
    species = torch.cat([data["species"][i] for i in idx])
    pos = torch.cat([data["pos"][i] for i in idx])
    c = torch.cat([data["edges"][i][0] + offsets[k] for k, i in enumerate(idx)])
    nb = torch.cat([data["edges"][i][1] + offsets[k] for k, i in enumerate(idx)])
    off = torch.cat([data["edges"][i][2] for i in idx])
    if pad_edges is not None:
        extra = pad_edges - c.shape[0]
        assert extra >= 0, "more edges than the padding allows"
        c = torch.cat([c, torch.zeros(extra, dtype=c.dtype, device=dev)])
        nb = torch.cat([nb, torch.zeros(extra, dtype=nb.dtype, device=dev)])
        far = torch.zeros(extra, 3, dtype=off.dtype, device=dev)
        far[:, 0] = 100.0  # longer than any cutoff: no message, no gradient
        off = torch.cat([off, far])
    atom_structure = torch.repeat_interleave(torch.arange(len(idx), device=dev),
                                             torch.tensor(n_atoms, device=dev))
    e_ref = torch.tensor([data["frames"][i][2] for i in idx], device=dev, dtype=torch.float32)
    f_ref = torch.cat([data["forces"][i] for i in idx])
    n = torch.tensor(n_atoms, device=dev, dtype=torch.float32)
    return dict(species=species, pos=pos, c=c, nb=nb, off=off, s=atom_structure, e_ref=e_ref,
                f_ref=f_ref, n=n)


def make_step(model, opt, b, ew, fw):
    params = list(model.parameters())

    def step(x):
        pos = x["pos"].detach().requires_grad_(True)
        e = model.painn(x["species"], pos, x["c"], x["nb"], x["off"], x["s"], b)
        (g,) = torch.autograd.grad(e.sum(), pos, create_graph=True)
        loss = ew * (((e - x["e_ref"]) / x["n"]) ** 2).mean() + fw * ((-g - x["f_ref"]) ** 2).mean()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 10.0, foreach=True)
        opt.step()
        return loss.detach()

    return step


def timed(fn, n, cuda):
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    for k in range(n):
        fn(k)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("train")
    ap.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--forms", default="eager,graph")
    ap.add_argument("--energy-weight", type=float, default=1.0)
    ap.add_argument("--force-weight", type=float, default=100.0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json")
    a = ap.parse_args()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    frames = read_frames(a.train)
    cutoff = json.loads(__import__("safetensors").safe_open(a.model, "pt").metadata()["config"])["cutoff"]
    elements = json.loads(__import__("safetensors").safe_open(a.model, "pt").metadata()["config"])["elements"]
    index = {z: k for k, z in enumerate(elements)}
    data = {"frames": frames, "species": [], "pos": [], "edges": [], "forces": []}
    zero_cell = torch.zeros(3, 3, dtype=torch.float64, device=dev)
    no_pbc = torch.zeros(3, dtype=torch.bool, device=dev)
    for numbers, pos, _, forces, cell in frames:
        p = torch.tensor(pos, device=dev, dtype=torch.float64)
        if cell is None:
            c, nb, off = neighbor_list(p, zero_cell, no_pbc, cutoff)
        else:
            box = torch.tensor(cell, device=dev, dtype=torch.float64)
            c, nb, off = neighbor_list(p, box, ~no_pbc, cutoff)
        data["edges"].append((c, nb, off.float()))
        data["species"].append(torch.tensor([index[z] for z in numbers], device=dev))
        data["pos"].append(p.float())
        data["forces"].append(torch.tensor(forces, device=dev, dtype=torch.float32))
    max_edges = max(e[0].shape[0] for e in data["edges"])
    rows = []
    for b in a.batch:
        for form in a.forms.split(","):
            if form == "graph" and not cuda:
                continue
            torch.manual_seed(0)
            model = Trainable(a.model, dev)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0,
                                    capturable=(form == "graph"))
            step = make_step(model, opt, b, a.energy_weight, a.force_weight)
            rng = np.random.default_rng(0)
            plan = []
            while len(plan) < a.warmup + a.steps:
                plan += batches(data, b, rng)
            if form == "eager":
                run = lambda k: step(assemble(data, plan[k], dev))  # noqa: E731
                timed(run, a.warmup, cuda)
                seconds = timed(lambda k: run(a.warmup + k), a.steps, cuda)
            else:
                static = assemble(data, plan[0], dev, pad_edges=b * max_edges)
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    for _ in range(3):
                        step(static)
                torch.cuda.current_stream().wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step(static)

                def run(k):
                    x = assemble(data, plan[k], dev, pad_edges=b * max_edges)
                    for key, v in x.items():
                        static[key].copy_(v)
                    graph.replay()

                timed(run, a.warmup, cuda)
                seconds = timed(lambda k: run(a.warmup + k), a.steps, cuda)
            row = {"form": form, "batch": b, "steps": a.steps,
                   "structures_per_s": a.steps * b / seconds, "device": torch.cuda.get_device_name() if cuda else "cpu",
                   "torch": torch.__version__}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| form | batch | structures/s |\n|---|---:|---:|")
    for r in rows:
        print(f"| {r['form']} | {r['batch']} | {r['structures_per_s']:.0f} |")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
