#!/usr/bin/env python3
"""PyTorch reference of the mlff-distiller PaiNN: same maths, same weights, same inputs.

Loads our safetensors checkpoint and the per-system inputs that `mlff bench --export DIR`
writes (positions, species, edges, image offsets and our energies/forces), checks that PyTorch
gives the same energies and forces, and times energy+forces eager and as a replayed CUDA graph.

    python3 benches/reference/painn_torch.py MODEL.safetensors DIR [--json OUT.json]

Needs torch and safetensors. Prints a markdown table.
"""
import argparse
import json
import math
import pathlib
import sys
import time

import torch
from safetensors import safe_open
from safetensors.torch import load_file


class PaiNN(torch.nn.Module):
    """The model of src/model/*.rs, written with plain tensor ops (index_add for scatters)."""

    def __init__(self, path, device, dtype):
        super().__init__()
        with safe_open(path, "pt") as f:
            self.cfg = json.loads(f.metadata()["config"])
        w = {k: v.to(device=device, dtype=dtype) for k, v in load_file(path).items()}
        self.w = w
        self.F = self.cfg["hidden"]

    def lin(self, x, name, bias=True):
        y = x @ self.w[name + ".weight"].T
        return y + self.w[name + ".bias"] if bias else y

    def forward(self, species, pos, centers, neighbors, offsets, atom_structure, n_structures):
        F, c = self.F, self.cfg
        n = pos.shape[0]
        r = pos[neighbors] - pos[centers] + offsets
        d = torch.sqrt((r * r).sum(1))
        direction = r / d[:, None]
        width = c["cutoff"] / (c["n_rbf"] - 1)
        mu = torch.arange(c["n_rbf"], device=pos.device, dtype=pos.dtype) * width
        rbf = torch.exp(-0.5 / width**2 * (d[:, None] - mu) ** 2)
        fcut = 0.5 * (torch.cos(math.pi * d / c["cutoff"]) + 1.0) * (d < c["cutoff"]).to(pos.dtype)
        filters = self.lin(rbf, "filter") * fcut[:, None]
        s = self.w["embedding.weight"][species]
        v = torch.zeros(n, 3, F, device=pos.device, dtype=pos.dtype)
        for k in range(c["n_blocks"]):
            p = f"blocks.{k}."
            phi = self.lin(torch.nn.functional.silu(self.lin(s, p + "message.context1")), p + "message.context2")
            x = phi[neighbors] * filters[:, 3 * F * k: 3 * F * (k + 1)]
            ds, dv_dir, dv_v = torch.split(x, F, dim=1)
            dv = dv_dir[:, None, :] * direction[:, :, None] + dv_v[:, None, :] * v[neighbors]
            s = s + torch.zeros_like(s).index_add(0, centers, ds)
            v = v + torch.zeros_like(v).index_add(0, centers, dv)
            mixed = self.lin(v, p + "update.mix", bias=False)
            v_u, v_v = torch.split(mixed, F, dim=2)
            v_v_norm = torch.sqrt((v_v * v_v).sum(1) + 1e-8)
            a = self.lin(torch.nn.functional.silu(self.lin(torch.cat([s, v_v_norm], 1), p + "update.context1")),
                         p + "update.context2")
            a_ss, a_vv, a_sv = torch.split(a, F, dim=1)
            s = s + a_ss + a_sv * (v_u * v_v).sum(1)
            v = v + a_vv[:, None, :] * v_u
        y = self.lin(torch.nn.functional.silu(self.lin(s, "readout.hidden")), "readout.out").squeeze(1)
        e_atom = y * self.w["readout.scale"] + self.w["readout.shift"] + self.w["readout.atom_ref"][species]
        return torch.zeros(n_structures, device=pos.device, dtype=pos.dtype).index_add(0, atom_structure, e_atom)


def energy_forces(model, x, pos):
    pos = pos.detach().requires_grad_(True)
    e = model(x["species"], pos, x["centers"], x["neighbors"], x["offsets"], x["atom_structure"], x["n"])
    (g,) = torch.autograd.grad(e.sum(), pos)
    return e.detach(), -g


def time_ms(fn, warmup, repeats, cuda):
    """Median and minimum wall time of fn() in ms (CUDA events on the GPU)."""
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2], times[0]


def graph_replay(model, x, pos, f_eager, warmup, repeats):
    """Captures energy+forces on static inputs as a CUDA graph; returns (timing, max |dF|)."""
    static_pos = pos.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            energy_forces(model, x, static_pos)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, static_f = energy_forces(model, x, static_pos)
    graph.replay()
    torch.cuda.synchronize()
    return time_ms(graph.replay, warmup, repeats, True), (static_f - f_eager).abs().max().item()


def model_on(path, device, script, cpu_hint):
    """The checkpoint's model in f32 on `device` (cuda or cpu), the torch device, and whether it
    is CUDA; exits naming `script` where CUDA is asked for and absent."""
    cuda = device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit(f"{script}: no CUDA device (use --device cpu {cpu_hint})")
    dev = torch.device(device)
    return PaiNN(path, dev, torch.float32), dev, cuda


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("systems", help="directory written by `mlff bench --export`")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--json")
    ap.add_argument("--device", default="cuda", help="cuda (timings + graphs) or cpu (agreement check)")
    a = ap.parse_args()
    model, dev, cuda = model_on(a.model, a.device, "painn_torch.py", "for the agreement check only")
    rows = []
    for path in sorted(pathlib.Path(a.systems).glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            n_structures = int(f.metadata()["n_structures"])
        t = {k: v.to(dev) for k, v in load_file(str(path)).items()}
        x = {k: t[k].long() for k in ("species", "centers", "neighbors", "atom_structure")}
        x["offsets"], x["n"] = t["offsets"].float(), n_structures
        pos = t["positions"].float().clone()
        e, f = energy_forces(model, x, pos)
        de = (e - t["energies"]).abs().max().item()
        df = (f - t["forces"]).abs().max().item()
        eager = time_ms(lambda: energy_forces(model, x, pos), a.warmup, a.repeats, cuda)
        replay, dg = graph_replay(model, x, pos, f, a.warmup, a.repeats) if cuda else ((math.nan,) * 2, math.nan)
        row = dict(system=path.stem, atoms=pos.shape[0], edges=x["centers"].shape[0],
                   eager_median_ms=eager[0], eager_min_ms=eager[1],
                   graph_median_ms=replay[0], graph_min_ms=replay[1],
                   max_de_vs_mlff=de, max_df_vs_mlff=df, max_df_graph_vs_eager=dg)
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"PyTorch {torch.__version__}, {device_name}, float32")
    print("| system | atoms | edges | eager median ms | CUDA graph median ms | max dE vs mlff eV | max dF vs mlff eV/Å |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['system']} | {r['atoms']} | {r['edges']} | {r['eager_median_ms']:.3f} | "
              f"{r['graph_median_ms']:.3f} | {r['max_de_vs_mlff']:.1e} | {r['max_df_vs_mlff']:.1e} |")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(dict(torch=torch.__version__,
                                                        device=device_name, cases=rows), indent=1))


if __name__ == "__main__":
    main()
