#!/usr/bin/env python3
"""PyTorch MD reference: the PaiNN of painn_torch.py in velocity-Verlet NVE, each step (forces,
kick-drift-kick, the largest displacement since the list was built) one replayed CUDA graph.
An export of many molecules (`mlff bench` systems such as aspirin-x64) runs as one batch: one
force call per step for all, each molecule's atoms paired only among themselves (the list
built per molecule, as a block-diagonal batch), `atom_steps_per_s` the aggregate.

Reads one structure that `mlff bench --export DIR` wrote (positions, species, cell, periodicity,
masses), builds a Verlet neighbour list (cutoff + skin, minimum image) in PyTorch with a fixed
capacity, and runs STEPS NVE steps of DT fs from Maxwell-Boltzmann velocities at T K. Every
CHECK steps the host reads the largest displacement; past half the skin the list is rebuilt
into the same buffers (the graph reads them), and re-captured only when it outgrows them.
Steps/s counts the whole loop after the first capture (checks and rebuilds included).

    python3 benches/reference/md_torch.py MODEL.safetensors SYSTEM.safetensors [--steps 300]
        [--dt 0.5] [--temperature 300] [--skin 1.0] [--check 10] [--graphs on|off]
        [--device cuda|cpu] [--compile] [--json OUT.json]

First it checks its list against the exported edges (the list of `mlff bench`, built without
skin at the same positions) and its forces against the exported ones; it exits non-zero if
either disagrees. Units as ASE: Å, eV, amu, fs.

--compile computes the forces with painn_torch.py's compiled form (torch.compile, inductor,
static shapes: the list's capacity fixes them), compiled at the first force call, before the
checks and the timed loop (compile_s in the JSON); a list that outgrows its capacity changes
the shapes and compiles again inside the timed loop (compile_graphs counts the graphs).
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

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from painn_torch import compiled_energy_forces, energy_forces, model_on  # noqa: E402

EV_PER_AMU_A2_FS2 = 103.642696  # 1 amu Å²/fs² in eV
KB_EV = 8.617333262e-5


class System:
    """One exported structure on `dev`: its model inputs and what MD needs."""

    def __init__(self, path, dev):
        with safe_open(str(path), "pt") as f:
            n_structures = int(f.metadata()["n_structures"])
        t = load_file(str(path))
        missing = [k for k in ("cells", "pbc", "masses") if k not in t]
        if missing:
            sys.exit(f"{path}: no {', '.join(missing)} (exported by an older mlff; re-export)")
        if n_structures != 1 and bool(t["pbc"].any()):
            sys.exit(f"{path}: {n_structures} periodic structures; a batch runs molecules")
        self.n_structures = n_structures
        self.atom_structure = t["atom_structure"].long().to(dev)
        self.species = t["species"].long().to(dev)
        self.pos = t["positions"].double().to(dev)
        self.cell = t["cells"][0].double().to(dev)
        self.pbc = t["pbc"][0].bool().to(dev)
        self.masses = t["masses"].double().to(dev)
        self.edges = (t["centers"].long(), t["neighbors"].long(), t["offsets"].double())
        self.forces = t["forces"].double()
        self.n = self.pos.shape[0]


def neighbor_list(pos, cell, pbc, cutoff, chunk=2048):
    """Edges (i, j, offset) with |x_j - x_i + offset| < cutoff, i != j, sorted by i then j:
    minimum image along the periodic directions (refused where the cutoff is more than half
    the cell's width there)."""
    periodic = bool(pbc.any())
    if periodic:
        volume = torch.linalg.det(cell).abs()
        for a in range(3):
            if pbc[a]:
                height = volume / torch.linalg.cross(cell[(a + 1) % 3], cell[(a + 2) % 3]).norm()
                if cutoff > 0.5 * height:
                    sys.exit(f"cutoff {cutoff} Å is more than half the cell's width {height:.3f} Å "
                             f"along axis {a}: minimum image does not hold")
        inv = torch.linalg.inv(cell)
        frac = pos @ inv
    centers, neighbors, offsets = [], [], []
    n = pos.shape[0]
    for i0 in range(0, n, chunk):
        i = torch.arange(i0, min(n, i0 + chunk), device=pos.device)
        if periodic:
            ds = frac[None, :, :] - frac[i, None, :]
            ds = ds - torch.round(ds) * pbc.to(ds.dtype)
            r = ds @ cell
        else:
            r = pos[None, :, :] - pos[i, None, :]
        d2 = (r * r).sum(-1)
        ii, jj = torch.nonzero(d2 < cutoff * cutoff, as_tuple=True)
        keep = (ii + i0) != jj
        ii, jj = ii[keep], jj[keep]
        rv = r[ii, jj]
        centers.append(ii + i0)
        neighbors.append(jj)
        offsets.append(rv - (pos[jj] - pos[ii + i0]))
    return torch.cat(centers), torch.cat(neighbors), torch.cat(offsets)


def molecule_batch_list(pos, structure, n_structures, cutoff):
    """Edges of a batch of molecules, each paired only within its own molecule, sorted by i then
    j: one padded [S, M, M] distance block (M the largest molecule), O(S M²) not O(N²)."""
    counts = torch.bincount(structure, minlength=n_structures)
    starts = torch.cumsum(counts, 0) - counts
    m = int(counts.max())
    local = torch.arange(pos.shape[0], device=pos.device) - starts[structure]
    p = torch.zeros(n_structures, m, 3, dtype=pos.dtype, device=pos.device)
    mask = torch.zeros(n_structures, m, dtype=torch.bool, device=pos.device)
    p[structure, local] = pos
    mask[structure, local] = True
    d2 = ((p[:, None, :, :] - p[:, :, None, :]) ** 2).sum(-1)  # [S, i, j]
    ok = (d2 < cutoff * cutoff) & mask[:, :, None] & mask[:, None, :]
    ok &= ~torch.eye(m, dtype=torch.bool, device=pos.device)[None]
    s_, i_, j_ = torch.nonzero(ok, as_tuple=True)
    centers, neighbors = starts[s_] + i_, starts[s_] + j_
    return centers, neighbors, torch.zeros(centers.shape[0], 3, dtype=pos.dtype, device=pos.device)


def edge_differences(ours, theirs, pos, cell, cutoff):
    """Edges (i, j, image) in one list and not the other, except those within 1e-4 Å of the
    cutoff (where f32 and f64 positions may disagree)."""
    inv = torch.linalg.inv(cell.cpu()) if bool(cell.abs().sum() > 0) else None

    def keyed(e):
        c, nb, off = (x.cpu().double() for x in e)
        img = torch.round(off @ inv).long() if inv is not None else torch.zeros_like(off).long()
        return {(i, j, tuple(k)): o for i, j, k, o in zip(c.long().tolist(), nb.long().tolist(),
                                                         img.tolist(), off)}
    a, b = keyed(ours), keyed(theirs)
    p = pos.cpu().double()
    odd = []
    for key in set(a) ^ set(b):
        i, j, _ = key
        off = a[key] if key in a else b[key]
        d = (p[j] - p[i] + off).norm().item()
        if abs(d - cutoff) > 1e-4:
            odd.append((key, d))
    return odd


class Md:
    """NVE velocity Verlet on static buffers, so that one step can be captured and replayed."""

    def __init__(self, model, s, cutoff, skin, dt, temperature, seed, graphs, ef=None):
        """ef(x, pos) -> (energies, forces): the eager energy_forces by default."""
        dev, f32 = s.pos.device, torch.float32
        self.model, self.s, self.cutoff, self.skin, self.graphs = model, s, cutoff, skin, graphs
        self.ef = ef or (lambda x, pos: energy_forces(model, x, pos))
        self.pos = s.pos.to(f32).clone()
        g = torch.Generator(device="cpu").manual_seed(seed)
        m = s.masses.cpu()
        sigma = torch.sqrt(KB_EV * temperature / (m * EV_PER_AMU_A2_FS2))  # Å/fs
        v = torch.randn(s.n, 3, generator=g, dtype=torch.float64) * sigma[:, None]
        v -= (m[:, None] * v).sum(0) / m.sum()  # no centre-of-mass drift
        self.vel = v.to(dev, f32)
        self.inv_m = (1.0 / (s.masses * EV_PER_AMU_A2_FS2)).to(f32)[:, None]
        self.half_dt, self.dt = 0.5 * dt, dt
        self.x = dict(species=s.species, atom_structure=s.atom_structure)
        self.capacity = 0
        self.rebuilds = self.captures = 0
        self.built_at = torch.empty_like(self.pos)  # positions at the last build
        self.build()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        e, f = self.ef(self.inputs(), self.pos)
        self.energy, self.forces = e.clone(), f.clone()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        self.first_call_s = time.perf_counter() - t0  # the compilation, where compiled
        self.disp = torch.zeros((), device=dev, dtype=f32)
        self.graph = None

    def inputs(self):
        return dict(self.x, centers=self.centers, neighbors=self.neighbors, offsets=self.offsets,
                    n=self.s.n_structures)

    def build(self):
        """The list at the current positions, into the static buffers (grown, and the graph
        dropped, where it does not fit)."""
        reach = self.cutoff + self.skin
        if self.s.n_structures > 1:
            c, nb, off = molecule_batch_list(self.pos.double(), self.s.atom_structure,
                                             self.s.n_structures, reach)
        else:
            c, nb, off = neighbor_list(self.pos.double(), self.s.cell, self.s.pbc, reach)
        e = c.shape[0]
        if e > self.capacity:
            self.capacity = (int(1.25 * e) + 63) // 64 * 64
            dev = self.pos.device
            self.centers = torch.zeros(self.capacity, dtype=torch.long, device=dev)
            self.neighbors = torch.zeros(self.capacity, dtype=torch.long, device=dev)
            self.offsets = torch.zeros(self.capacity, 3, dtype=torch.float32, device=dev)
            self.graph = None
        # Padding: each atom to itself at twice the list's reach, where the cutoff function is
        # 0, spread over the atoms (all on atom 0, their atomic adds into one row had taken a
        # water box's step 6x longer).
        pad = torch.arange(self.capacity - e, device=c.device) % self.s.n
        self.centers[:e], self.neighbors[:e], self.offsets[:e] = c, nb, off.float()
        self.centers[e:], self.neighbors[e:] = pad, pad
        self.offsets[e:] = 0.0
        self.offsets[e:, 0] = 2.0 * (self.cutoff + self.skin)
        self.built_at.copy_(self.pos)  # in place: a captured step reads this buffer
        self.rebuilds += 1

    def step(self):
        self.vel.add_(self.forces * self.inv_m, alpha=self.half_dt)
        self.pos.add_(self.vel, alpha=self.dt)
        e, f = self.ef(self.inputs(), self.pos)
        self.energy.copy_(e)
        self.forces.copy_(f)
        self.vel.add_(self.forces * self.inv_m, alpha=self.half_dt)
        self.disp.copy_(((self.pos - self.built_at) ** 2).sum(1).max().sqrt())

    def capture(self):
        """One step as a CUDA graph: the state is saved, warmed up on a side stream, restored."""
        saved = [t.clone() for t in (self.pos, self.vel, self.energy, self.forces)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.step()
        for t, v in zip((self.pos, self.vel, self.energy, self.forces), saved):
            t.copy_(v)
        self.captures += 1

    def advance(self):
        if self.graphs:
            if self.graph is None:
                self.capture()
            self.graph.replay()
        else:
            self.step()

    def kinetic_energy(self):
        return 0.5 * (self.vel.double() ** 2 / self.inv_m.double()).sum().item()

    def total_energy(self):
        """Potential plus kinetic energy in eV."""
        return self.energy.double().sum().item() + self.kinetic_energy()

    def temperature(self):
        """Kinetic temperature in K (3N - 3 degrees of freedom per molecule: no centre-of-mass
        motion of the whole; per molecule approximately)."""
        return 2.0 * self.kinetic_energy() / (max(3 * self.s.n - 3 * self.s.n_structures, 1) * KB_EV)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("system", help="SYSTEM.safetensors written by `mlff bench --export DIR`")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--dt", type=float, default=0.5, help="fs")
    ap.add_argument("--temperature", type=float, default=300.0, help="K, of the start velocities")
    ap.add_argument("--skin", type=float, default=1.0, help="Å")
    ap.add_argument("--check", type=int, default=10, help="steps between displacement checks")
    ap.add_argument("--graphs", choices=("on", "off"), default="on")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile", action="store_true",
                    help="forces through torch.compile (inductor), as painn_torch.py's compiled form")
    ap.add_argument("--compile-variant", default="whole", choices=("whole", "forward"),
                    help="see painn_torch.py")
    ap.add_argument("--json")
    a = ap.parse_args()
    model, dev, cuda = model_on(a.model, a.device, "md_torch.py", "(eager)")
    cutoff = float(model.cfg["cutoff"])
    s = System(a.system, dev)

    # Checks: our list at the exported positions is mlff's, and so are the forces.
    listed = (molecule_batch_list(s.pos, s.atom_structure, s.n_structures, cutoff)
              if s.n_structures > 1 else neighbor_list(s.pos, s.cell, s.pbc, cutoff))
    odd = edge_differences(listed, s.edges, s.pos, s.cell, cutoff)
    if odd:
        sys.exit(f"md_torch.py: {len(listed[0])} edges listed here, {len(s.edges[0])} exported; "
                 f"{len(odd)} differ, e.g. (i, j, image), distance: {odd[:3]}")
    ef = compiled_energy_forces(model, s.n_structures, a.compile_variant) if a.compile else None
    md = Md(model, s, cutoff, a.skin, a.dt, a.temperature, a.seed, a.graphs == "on" and cuda, ef)
    df = (md.forces.double().cpu() - s.forces).abs().max().item()
    if df > 1e-3:
        sys.exit(f"md_torch.py: forces differ from the exported ones by {df:.2e} eV/Å")

    if md.graphs:
        md.capture()
    e0 = md.total_energy()
    totals, temperatures = [e0], [md.temperature()]
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k in range(1, a.steps + 1):
        md.advance()
        if k % a.check == 0 or k == a.steps:
            if md.disp.item() > 0.5 * a.skin:
                md.build()
            totals.append(md.total_energy())
            temperatures.append(md.temperature())
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    per_atom = [(e - e0) / s.n * 1e3 for e in totals]  # meV/atom
    mean = sum(per_atom) / len(per_atom)
    row = dict(system=pathlib.Path(a.system).stem, atoms=s.n, structures=s.n_structures,
               steps=a.steps, graphs=md.graphs, steps_per_s=a.steps / wall,
               atom_steps_per_s=a.steps * s.n / wall, ms_per_step=wall / a.steps * 1e3,
               list_builds=md.rebuilds, captures=md.captures, capacity=md.capacity,
               e_tot_drift_mev_per_atom=per_atom[-1],
               e_tot_std_mev_per_atom=math.sqrt(sum((x - mean) ** 2 for x in per_atom) / len(per_atom)),
               temperature_mean_k=sum(temperatures) / len(temperatures),
               max_df_start_vs_mlff=df, torch=torch.__version__,
               compiled=a.compile, compile_variant=a.compile_variant if a.compile else None,
               compile_s=md.first_call_s if a.compile else None,
               compile_graphs=torch._dynamo.utils.counters["stats"]["unique_graphs"] if a.compile else None,
               device=torch.cuda.get_device_name() if cuda else "cpu")
    print(json.dumps(row), file=sys.stderr)
    form = ("compiled " if a.compile else "") + ("CUDA graph" if md.graphs else "eager")
    print(f"| {row['system']} | {s.n} | PyTorch {form} | {a.steps} | "
          f"{row['steps_per_s']:.1f} | {row['ms_per_step']:.2f} | {row['e_tot_drift_mev_per_atom']:+.3f} | "
          f"{row['list_builds']} |")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
