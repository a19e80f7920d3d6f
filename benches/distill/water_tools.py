#!/usr/bin/env python3
"""Numpy-only helpers of benches/distill/water_bulk.sh (a GPU host may have no ASE):

    water_tools.py box N DENSITY SEED OUT.extxyz   N rigid waters at DENSITY g/cm³, random
                                                    orientations on fcc sites where N is 4k³
                                                    (32, 108, ...), else a simple cubic lattice
    water_tools.py rdf OUT.json TRAJ.extxyz [SKIP]  O-O radial distribution of the frames of
                                                    periodic orthorhombic cells (SKIP first)
    water_tools.py pressure T FRAMES [PRED ...]     GFN2-xTB's pressure of each frame at T K
                                                    (virial + N k_B T / V; needs ase and
                                                    tblite, the label tool's settings) and each
                                                    `mlff predict --stress` file's difference
    water_tools.py eos LABELLED [PRED ...]          the pressure of labelled frames (their stress
                                                    + N k_B T / V at their temperature), mean
                                                    and standard error by density and
                                                    temperature, beside each `mlff predict
                                                    --stress` file of the same frames
    water_tools.py strain-check FRAMES [K]         GFN2-xTB's stress trace on frame K against
                                                    the central difference of its energy under
                                                    a uniform strain of 1e-3 (ase and tblite)
"""

import json
import sys

import numpy as np

AVOGADRO = 0.602214076  # molecules per mol, in units that turn g/cm³ into Å⁻³ per amu
WATER_AMU = 18.015


def box(n, density, seed, out):
    rng = np.random.default_rng(seed)
    side = (n * WATER_AMU / AVOGADRO / density) ** (1 / 3)
    k = round((n / 4) ** (1 / 3))
    if 4 * k ** 3 == n:
        # fcc: 32 waters on a 4³ simple cubic lattice would sit 2.5 Å apart, on fcc 3.5 Å.
        basis = np.array([[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]])
        cells = np.array([(i, j, l) for i in range(k) for j in range(k) for l in range(k)])
        sites = ((cells[:, None, :] + basis[None] + 0.25).reshape(-1, 3) / k) * side
    else:
        per = int(np.ceil(n ** (1 / 3)))
        cube = np.array([(i, j, l) for i in range(per) for j in range(per) for l in range(per)])
        sites = (cube + 0.5) * side / per
    sites = rng.permutation(sites)[:n]
    r, half = 0.9572, np.radians(104.52) / 2
    local = np.array([[0, 0, 0], [r * np.sin(half), r * np.cos(half), 0],
                      [-r * np.sin(half), r * np.cos(half), 0]])
    rows = []
    for c in sites:
        q, rr = np.linalg.qr(rng.normal(size=(3, 3)))
        rot = q * np.sign(np.diag(rr))
        for z, p in zip("OHH", local @ rot.T + c):
            rows.append("%s %.8f %.8f %.8f" % (z, *p))
    with open(out, "w") as f:
        f.write(f"{len(rows)}\nLattice=\"{side} 0 0 0 {side} 0 0 0 {side}\" "
                f"Properties=species:S:1:pos:R:3 pbc=\"T T T\"\n" + "\n".join(rows) + "\n")


def frames(path):
    with open(path) as f:
        while True:
            head = f.readline()
            if not head.strip():
                return
            n = int(head)
            info = f.readline()
            lat = info.split('Lattice="')[1].split('"')[0].split()
            cell = np.array(lat, float).reshape(3, 3)
            rows = [f.readline().split() for _ in range(n)]
            yield cell, [r[0] for r in rows], np.array([r[1:4] for r in rows], float)


def rdf(out, traj, skip=0, width=0.05):
    """g(r) out to 8 Å or 0.45 of the first frame's shortest side (an NPT box breathes)."""
    hist, edges = None, None
    density_sum, used = 0.0, 0
    for k, (cell, species, x) in enumerate(frames(traj)):
        if k < skip:
            continue
        if np.abs(cell - np.diag(np.diag(cell))).max() > 1e-9:
            raise SystemExit(f"{traj}: frame {k} is not orthorhombic")
        lengths = np.diag(cell)
        if edges is None:
            r_max = min(8.0, 0.45 * lengths.min())
            edges = np.arange(0.0, r_max, width)
            hist = np.zeros(len(edges) - 1)
        if edges[-1] > lengths.min() / 2:
            raise SystemExit(f"{traj}: frame {k}: the box shrank below twice {edges[-1]:.2f} Å")
        o = x[np.array(species) == "O"]
        for i in range(len(o) - 1):
            d = o[i + 1:] - o[i]
            d -= lengths * np.round(d / lengths)
            hist += 2 * np.histogram(np.sqrt((d * d).sum(1)), edges)[0]
        density_sum += len(o) / lengths.prod()
        used += 1
        n_o = len(o)
    if used == 0:
        raise SystemExit(f"{traj}: no frames after skipping {skip}")
    shell = 4 / 3 * np.pi * (edges[1:] ** 3 - edges[:-1] ** 3)
    g = hist / (used * n_o * (density_sum / used) * shell)
    centres = (edges[1:] + edges[:-1]) / 2
    peak = int(np.argmax(g))
    json.dump({"traj": traj, "frames": used, "oxygens": n_o, "r": centres.round(4).tolist(),
               "g": g.round(5).tolist(), "first_peak_r": float(centres[peak]),
               "first_peak_g": float(g[peak])}, open(out, "w"))
    print(f"{traj}: {used} frames, O-O first peak g({centres[peak]:.3f} Å) = {g[peak]:.3f}")


def pressure(temperature, frames, preds):
    import ase.io
    from tblite.ase import TBLite

    bar = 1.602176634e6  # eV/Å³
    kinetic = lambda a: len(a) * 8.617333262e-5 * temperature / a.get_volume() * bar
    virial = lambda s: -np.trace(s) / 3 * bar
    others = [ase.io.read(p, ":") for p in preds]
    for k, a in enumerate(ase.io.read(frames, ":")):
        a.pbc = True
        a.calc = TBLite(method="GFN2-xTB", accuracy=1.0, max_iterations=250,
                        electronic_temperature=300.0, verbosity=0)
        p = virial(a.get_stress(voigt=False)) + kinetic(a)
        diffs = [virial(o[k].get_stress(voigt=False)) + kinetic(a) - p for o in others]
        density = len(a) / 3 * WATER_AMU / AVOGADRO / a.get_volume()
        print(f"frame {k}: {density:.3f} g/cm³, GFN2-xTB {p:+.0f} bar"
              + "".join(f", {q}: {d:+.0f}" for q, d in zip(preds, diffs)), flush=True)


def eos(labelled, preds):
    bar = 1.602176634e6  # eV/Å³
    sets = [frames_with_stress(labelled)] + [frames_with_stress(p) for p in preds]
    groups = {}
    for k, (n, volume, temperature, _) in enumerate(sets[0]):
        density = n / 3 * WATER_AMU / AVOGADRO / volume
        kinetic = n * 8.617333262e-5 * temperature / volume * bar
        p = [-np.trace(s[k][3]) / 3 * bar + kinetic for s in sets]
        groups.setdefault((round(density, 2), temperature), []).append(p)
    names = ["labels"] + preds
    print("| g/cm³ | T K | frames | " + " | ".join(f"{q} bar" for q in names) + " |")
    print("|---:|---:|---:|" + "---:|" * len(names))
    for (density, temperature), ps in sorted(groups.items()):
        ps = np.array(ps)
        sem = ps.std(axis=0, ddof=1) / np.sqrt(len(ps)) if len(ps) > 1 else 0 * ps[0]
        cells = [f"{m:+.0f} ± {e:.0f}" for m, e in zip(ps.mean(axis=0), sem)]
        print(f"| {density:.2f} | {temperature:.0f} | {len(ps)} | " + " | ".join(cells) + " |")


def strain_check(path, k):
    import ase.io
    from tblite.ase import TBLite

    def energy_and_stress(a):
        a.pbc = True
        a.calc = TBLite(method="GFN2-xTB", accuracy=1.0, max_iterations=250,
                        electronic_temperature=300.0, verbosity=0)
        return a.get_potential_energy(), a.get_stress(voigt=False)

    a = ase.io.read(path, k)
    _, stress = energy_and_stress(a.copy())
    e = 1e-3
    energies = []
    for sign in (-1, 1):
        b = a.copy()
        b.set_cell(a.cell * (1 + sign * e), scale_atoms=True)
        energies.append(energy_and_stress(b)[0])
    # Under the uniform strain ε, dE/dε = V tr(σ).
    difference = (energies[1] - energies[0]) / (2 * e) / a.get_volume()
    print(f"frame {k}: tr σ {np.trace(stress):.6e} eV/Å³, dE/dε / V {difference:.6e}")


def frames_with_stress(path):
    """(atoms, volume, temperature, 3x3 stress) of every frame: the comment line's
    temperature_K (or temperature_k) and stress, a diagonal or general Lattice."""
    out = []
    with open(path) as f:
        while line := f.readline():
            n = int(line)
            comment = f.readline()
            for _ in range(n):
                f.readline()
            fields = dict(parse_comment(comment))
            cell = np.array(fields["Lattice"].split(), float).reshape(3, 3)
            t = float(fields.get("temperature_K", fields.get("temperature_k", "nan")))
            stress = np.array(fields["stress"].split(), float).reshape(3, 3)
            out.append((n, abs(np.linalg.det(cell)), t, stress))
    return out


def parse_comment(comment):
    """KEY=VALUE pairs of an extended XYZ comment line, quoted values unquoted."""
    import shlex

    for item in shlex.split(comment):
        if "=" in item:
            key, value = item.split("=", 1)
            yield key, value


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "box":
        box(int(args[0]), float(args[1]), int(args[2]), args[3])
    elif cmd == "pressure":
        pressure(float(args[0]), args[1], args[2:])
    elif cmd == "eos":
        eos(args[0], args[1:])
    elif cmd == "strain-check":
        strain_check(args[0], int(args[1]) if len(args) > 1 else 0)
    elif cmd == "rdf":
        rdf(args[0], args[1], int(args[2]) if len(args) > 2 else 0)
    else:
        raise SystemExit(__doc__)
