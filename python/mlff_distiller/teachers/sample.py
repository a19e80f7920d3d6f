#!/usr/bin/env python3
"""Make training configurations by teacher-driven Langevin molecular dynamics.

For every molecule, every temperature (--temperatures) and every seed (--seeds) one trajectory
is run with the teacher as the force field (ase.md.langevin.Langevin, time step --timestep fs,
friction --friction 1/fs). The first --equil-steps steps are discarded as equilibration; of the
following --steps production steps every --every-th is kept. Kept frames carry the energy and
forces the MD itself computed (nothing is recomputed) and the info keys

    trajectory       id of the trajectory: MOLECULE_TK_sSEED, e.g. ethanol_300K_s0
    temperature_K    thermostat temperature
    step             MD step counted from the start of the trajectory (equilibration included)
    teacher          teacher name (e.g. gfn2)
    teacher_time_s   teacher wall time for this structure, in seconds

All trajectories of a molecule go to OUT_DIR/MOLECULE.extxyz (rewritten, atomically, after each
trajectory, so a long run shows its progress). Split it with split.py, by trajectory.

Starting geometries (one molecule each):
    FILE.xyz / FILE.extxyz   the first frame; the molecule is named after the file stem
    --smiles NAME=SMILES     built with RDKit (ETKDG v3 + MMFF94, seeded by --seed)
    --cluster NAME=SMILES:N  N copies of the molecule, randomly oriented and packed at liquid
                             density around the origin (seeded), e.g. water8=O:8; clusters
                             evaporate in vacuum at 400-600 K: add --wall-radius R to confine
                             them (the stored labels stay the teacher's alone)
Each start is first relaxed with the teacher (BFGS, fmax --fmax eV/Å; --no-optimize skips it);
--start-dir DIR saves the relaxed starts as DIR/NAME.extxyz; --relax-only stops there (no MD),
so that one process per start can relax and others run the trajectories from the saved files.

Reproducibility: each trajectory has its own numpy Generator, seeded from (seed, molecule name,
temperature); it draws the Maxwell-Boltzmann velocities and drives the Langevin noise, so the
same command gives the same file (on the same machine and library versions).

Example (one small trajectory):
    python3 teachers/sample.py --smiles ethanol=CCO --temperatures 300 --seeds 0 \\
        --equil-steps 100 --steps 200 --every 20 -o /tmp/md
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import zlib
from pathlib import Path

import numpy as np
from ase.calculators.calculator import Calculator, all_changes

from .label import add_teacher_args, teacher_from_args
from .core import TeacherError, read_frames, run_cli, set_labels, teacher_version, write_extxyz_atomic


def _rdkit():
    try:
        from rdkit import Chem
        from rdkit.Chem import AllChem
    except ImportError as e:
        raise TeacherError(
            "building molecules from SMILES needs RDKit: python3 -m pip install -r teachers/requirements.txt"
        ) from e
    return Chem, AllChem


def atoms_from_smiles(smiles: str, seed: int):
    """One conformer: RDKit ETKDG v3 embedding (seeded) + MMFF94 relaxation."""
    from ase import Atoms

    Chem, AllChem = _rdkit()
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise TeacherError(f"RDKit cannot parse SMILES '{smiles}'")
    mol = Chem.AddHs(mol)
    params = AllChem.ETKDGv3()
    params.randomSeed = int(seed)
    if AllChem.EmbedMolecule(mol, params) != 0:
        raise TeacherError(f"RDKit could not embed '{smiles}' in 3D")
    if AllChem.MMFFHasAllMoleculeParams(mol):
        AllChem.MMFFOptimizeMolecule(mol, maxIters=2000)
    else:
        AllChem.UFFOptimizeMolecule(mol, maxIters=2000)
    pos = mol.GetConformer().GetPositions()
    atoms = Atoms([a.GetSymbol() for a in mol.GetAtoms()], positions=pos - pos.mean(axis=0))
    charge = Chem.GetFormalCharge(mol)
    if charge:
        atoms.info["charge"] = charge
    return atoms


def _random_rotation(rng):
    q = rng.standard_normal(4)
    q /= np.linalg.norm(q)
    a, b, c, d = q
    return np.array(
        [
            [a * a + b * b - c * c - d * d, 2 * (b * c - a * d), 2 * (b * d + a * c)],
            [2 * (b * c + a * d), a * a - b * b + c * c - d * d, 2 * (c * d - a * b)],
            [2 * (b * d - a * c), 2 * (c * d + a * b), a * a - b * b - c * c + d * d],
        ]
    )


def cluster_from_smiles(smiles: str, n: int, seed: int, min_dist: float = 2.0):
    """`n` copies of one molecule, randomly rotated and placed at about liquid density."""
    from ase import Atoms

    one = atoms_from_smiles(smiles, seed)
    rng = np.random.default_rng([int(seed), zlib.crc32(smiles.encode()), n])
    mass = one.get_masses().sum()  # amu; at 1 g/cm^3 one molecule takes 1.6605*mass Å^3
    radius = (3 * n * 1.6605 * mass / (4 * np.pi)) ** (1 / 3)
    placed = []
    for _ in range(n):
        for attempt in range(20000):
            r = radius * (1 + attempt // 2000 * 0.1)
            centre = rng.uniform(-r, r, 3)
            if np.linalg.norm(centre) > r:
                continue
            pos = one.positions @ _random_rotation(rng).T + centre
            if all(np.min(np.linalg.norm(pos[:, None] - p[None], axis=2)) >= min_dist for p in placed):
                placed.append(pos)
                break
        else:
            raise TeacherError(f"could not pack {n} copies of {smiles}")
    atoms = Atoms(list(one.symbols) * n, positions=np.concatenate(placed))
    atoms.positions -= atoms.get_center_of_mass()
    return atoms


def parse_named(value: str, flag: str):
    if "=" not in value:
        raise TeacherError(f"{flag} expects NAME=VALUE, got '{value}'")
    name, rest = value.split("=", 1)
    if not name or not all(c.isalnum() or c in "-_" for c in name):
        raise TeacherError(f"{flag}: name '{name}' must be letters, digits, '-' or '_'")
    return name, rest


def starting_structures(args):
    starts = []
    for path in args.inputs:
        atoms = read_frames(path)[0]
        atoms.calc = None
        starts.append((Path(path).stem, atoms, {"source": Path(path).name}))
    for value in args.smiles:
        name, smi = parse_named(value, "--smiles")
        starts.append((name, atoms_from_smiles(smi, args.seed), {"smiles": smi}))
    for value in args.cluster:
        name, rest = parse_named(value, "--cluster")
        smi, _, n = rest.rpartition(":")
        if not smi or not n.isdigit() or int(n) < 1:
            raise TeacherError(f"--cluster expects NAME=SMILES:N, got '{value}'")
        starts.append((name, cluster_from_smiles(smi, int(n), args.seed), {"smiles": smi, "copies": int(n)}))
    if not starts:
        raise TeacherError("no starting geometries: give FILE arguments, --smiles or --cluster")
    names = [s[0] for s in starts]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise TeacherError(f"molecule name(s) used twice: {', '.join(sorted(dup))}")
    return starts


class TimedCalculator:
    """Wraps calc.calculate to record the wall time of the latest teacher call."""

    def __init__(self, calc):
        self.calc = calc
        self.last = 0.0
        self.times = []
        inner = calc.calculate

        def calculate(*a, **k):
            t0 = time.perf_counter()
            inner(*a, **k)
            self.last = time.perf_counter() - t0
            self.times.append(self.last)

        calc.calculate = calculate


class WallCalculator(Calculator):
    """Teacher + a flat-bottom harmonic wall that keeps a cluster from evaporating.

    E_wall = k/2 * sum over atoms with r > R of (r - R)^2, r = distance from `centre` (the
    centre of mass, which FixCom holds in place). The MD feels teacher + wall; the frames store
    the teacher's energy and forces only (`teacher_energy`, `teacher_forces`), so the labels are
    exact teacher values while the sampling is confined.
    """

    implemented_properties = ["energy", "forces"]

    def __init__(self, teacher, radius, k, centre):
        super().__init__()
        self.teacher, self.radius, self.k = teacher, float(radius), float(k)
        self.centre = np.asarray(centre, dtype=float)
        self.teacher_energy = self.teacher_forces = None
        self.wall_energy = 0.0
        self._scratch = None

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        if self._scratch is None or len(self._scratch) != len(self.atoms):
            self._scratch = self.atoms.copy()
            self._scratch.set_constraint()
        self._scratch.positions = self.atoms.positions
        self._scratch.calc = self.teacher
        e = float(self._scratch.get_potential_energy())
        f = self._scratch.get_forces().copy()
        d = self.atoms.positions - self.centre
        r = np.linalg.norm(d, axis=1)
        out = r > self.radius
        excess = np.where(out, r - self.radius, 0.0)
        ew = 0.5 * self.k * float((excess**2).sum())
        fw = -self.k * (excess / np.where(out, r, 1.0))[:, None] * d
        self.teacher_energy, self.teacher_forces, self.wall_energy = e, f, ew
        self.results = {"energy": e + ew, "forces": f + fw}


def relax(atoms, calc, fmax, max_steps):
    from ase.optimize import BFGS

    atoms.calc = calc
    opt = BFGS(atoms, logfile=None)
    converged = opt.run(fmax=fmax, steps=max_steps)
    fmax_now = float(np.linalg.norm(atoms.get_forces(), axis=1).max())
    return bool(converged), opt.get_number_of_steps(), fmax_now


def run_trajectory(atoms0, name, temperature, seed, timed, teacher, args):
    from ase import units
    from ase.md.langevin import Langevin
    from ase.constraints import FixCom
    from ase.md import velocitydistribution as vd

    traj_id = f"{name}_{temperature:g}K_s{seed}"
    rng = np.random.default_rng([int(seed), zlib.crc32(name.encode()), int(round(temperature * 1000))])
    atoms = atoms0.copy()
    atoms.calc = timed.calc
    # Maxwell-Boltzmann velocities (ASE >= 3.29 calls MaxwellBoltzmannDistribution
    # thermalize_momenta; same distribution, same draws), no net translation or rotation.
    if hasattr(vd, "thermalize_momenta"):
        vd.thermalize_momenta(atoms, temperature, rng=rng)
    else:
        vd.MaxwellBoltzmannDistribution(atoms, temperature_K=temperature, rng=rng)
    vd.Stationary(atoms)
    vd.ZeroRotation(atoms)
    # The centre of mass stays put through a FixCom constraint (ASE's recommended replacement
    # for Langevin's deprecated fixcm=True).
    atoms.set_constraint(FixCom())
    if args.wall_radius is not None:
        atoms.calc = WallCalculator(timed.calc, args.wall_radius, args.wall_k, atoms.get_center_of_mass())
    dyn = Langevin(
        atoms,
        timestep=args.timestep * units.fs,
        temperature_K=temperature,
        friction=args.friction / units.fs,
        fixcm=False,
        rng=rng,
        logfile=None,
    )
    kept = []
    state = {"step": 0, "wall_frames": 0}

    def observe():
        state["step"] += 1
        step = state["step"]
        prod = step - args.equil_steps
        if prod <= 0 or prod % args.every:
            return
        calc = atoms.calc
        energy = calc.get_property("energy", atoms, allow_calculation=False)
        forces = calc.get_property("forces", atoms, allow_calculation=False)
        if energy is None or forces is None:  # the teacher did not cache both: compute
            energy, forces = atoms.get_potential_energy(), atoms.get_forces()
        if args.wall_radius is not None:  # store the teacher's labels, not teacher + wall
            energy, forces = calc.teacher_energy, calc.teacher_forces
            state["wall_frames"] += calc.wall_energy > 0
        if not (np.isfinite(energy) and np.isfinite(forces).all()):
            raise TeacherError(f"{traj_id}: teacher gave non-finite energy/forces at step {step}")
        frame = atoms.copy()
        frame.set_constraint()
        frame.info.update(trajectory=traj_id, temperature_K=float(temperature), step=step)
        if args.wall_radius is not None:
            frame.info["wall_radius_A"] = float(args.wall_radius)
        frame.arrays.pop("momenta", None)
        # Cells periodic along all three axes keep the teacher's stress too (a stress term in
        # training, stress errors on held-out frames); one more property of a kept frame.
        seconds, stress = timed.last, None
        base = timed.calc
        if atoms.pbc.all() and "stress" in getattr(base, "implemented_properties", ()):
            stress = base.get_property("stress", atoms)
        set_labels(frame, energy, np.array(forces), teacher, seconds, stress)
        kept.append(frame)

    dyn.attach(observe, interval=1)
    n0 = len(timed.times)
    try:
        dyn.run(args.equil_steps + args.steps)
    except TeacherError:
        raise
    except Exception as e:  # noqa: BLE001
        raise TeacherError(
            f"{traj_id}: the teacher failed at MD step {state['step'] + 1}: {type(e).__name__}: {e}"
        ) from e
    return traj_id, kept, timed.times[n0:], state["wall_frames"]


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="sample.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("inputs", nargs="*", metavar="FILE", help="starting geometries (xyz/extxyz, first frame)")
    ap.add_argument("--smiles", action="append", default=[], metavar="NAME=SMILES", help="molecule from SMILES (repeatable)")
    ap.add_argument(
        "--cluster", action="append", default=[], metavar="NAME=SMILES:N", help="cluster of N copies (repeatable)"
    )
    ap.add_argument("-o", "--out-dir", required=True, help="folder for MOLECULE.extxyz files")
    ap.add_argument("--start-dir", help="also save the relaxed starting geometries here")
    ap.add_argument("--overwrite", action="store_true", help="replace existing output files")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[300, 400, 500, 600], metavar="K",
                    help="thermostat temperatures in K (default: 300 400 500 600)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="one trajectory per seed and temperature (default: 0 1)")
    ap.add_argument("--seed", type=int, default=0, help="seed for building starts from SMILES (default 0)")
    ap.add_argument("--timestep", type=float, default=0.5, help="MD time step in fs (default 0.5)")
    ap.add_argument("--friction", type=float, default=0.01, help="Langevin friction in 1/fs (default 0.01)")
    ap.add_argument("--equil-steps", type=int, default=500, help="equilibration steps, discarded (default 500 = 0.25 ps)")
    ap.add_argument("--steps", type=int, default=2000, help="production steps per trajectory (default 2000)")
    ap.add_argument("--every", type=int, default=40, help="keep every k-th production step (default 40)")
    ap.add_argument("--fmax", type=float, default=0.05, help="relaxation threshold in eV/Å (default 0.05)")
    ap.add_argument("--max-opt-steps", type=int, default=1000, help="relaxation step limit (default 1000)")
    ap.add_argument("--no-optimize", action="store_true", help="start MD from the geometry as given")
    ap.add_argument("--relax-only", action="store_true", help="relax and save the starts (--start-dir), run no MD")
    ap.add_argument(
        "--wall-radius", type=float, metavar="R",
        help="confine the MD with a flat-bottom harmonic wall at R Å from the centre of mass (for "
        "clusters, which evaporate at high temperature); stored labels are the teacher's alone",
    )
    ap.add_argument("--wall-k", type=float, default=1.0, help="wall force constant in eV/Å² (default 1.0)")
    ap.add_argument("--summary-json", help="write timings and counts per molecule to this JSON file")
    add_teacher_args(ap)
    args = ap.parse_args(argv)

    if args.timestep <= 0 or args.friction < 0 or args.equil_steps < 0 or args.steps < 1 or args.every < 1:
        raise TeacherError("need --timestep > 0, --friction >= 0, --equil-steps >= 0, --steps >= 1, --every >= 1")
    if args.steps < args.every:
        raise TeacherError(f"--steps {args.steps} < --every {args.every}: no frame would be kept")
    if args.relax_only and (args.no_optimize or not args.start_dir):
        raise TeacherError("--relax-only needs --start-dir and cannot take --no-optimize")
    starts = starting_structures(args)
    out_dir = Path(args.out_dir)
    for name, _, _ in starts:
        out = out_dir / f"{name}.extxyz"
        if out.exists() and not args.overwrite and not args.relax_only:
            raise TeacherError(f"output {out} exists; pass --overwrite to replace it")

    teacher, calc = teacher_from_args(args)
    timed = TimedCalculator(calc)
    print(f"teacher: {teacher} = {teacher_version(teacher)}", flush=True)
    summary = {"teacher": teacher_version(teacher), "molecules": {}}
    for name, atoms, meta in starts:
        t0 = time.perf_counter()
        charge = atoms.info.get("charge")
        if charge and teacher in ("gfn2", "gfn1"):
            atoms.set_initial_charges([charge] + [0] * (len(atoms) - 1))
        if not args.no_optimize:
            try:
                conv, nsteps, fmax_now = relax(atoms, timed.calc, args.fmax, args.max_opt_steps)
            except Exception as e:  # noqa: BLE001
                raise TeacherError(f"{name}: the teacher failed while relaxing the start: {type(e).__name__}: {e}") from e
            print(
                f"{name}: {len(atoms)} atoms ({atoms.get_chemical_formula()}), relaxed in {nsteps} BFGS steps, "
                f"max force {fmax_now:.3f} eV/Å{'' if conv else ' (NOT converged)'}",
                flush=True,
            )
        if args.start_dir:
            start = atoms.copy()
            start.info.update(meta)
            if not args.no_optimize:
                start.info["relaxed_fmax"] = args.fmax
            e, f = atoms.get_potential_energy(), atoms.get_forces()
            set_labels(start, e, f, teacher, timed.last)
            write_extxyz_atomic(Path(args.start_dir) / f"{name}.extxyz", [start])
        if args.relax_only:
            summary["molecules"][name] = {
                "atoms": len(atoms),
                "formula": atoms.get_chemical_formula(),
                "relax_calls": len(timed.times),
                "teacher_s": float(sum(timed.times)),
                "wall_s": time.perf_counter() - t0,
            }
            timed.times.clear()
            continue
        frames, times = [], []
        for temperature in args.temperatures:
            for seed in args.seeds:
                traj_id, kept, ts, nwall = run_trajectory(atoms, name, temperature, seed, timed, teacher, args)
                frames.extend(kept)
                times.extend(ts)
                write_extxyz_atomic(out_dir / f"{name}.extxyz", frames)
                wall_note = f", {nwall} kept frames touch the wall" if args.wall_radius is not None else ""
                print(f"  {traj_id}: {len(kept)} frames, {len(ts)} teacher calls, "
                      f"{statistics.mean(ts) * 1e3:.2f} ms each{wall_note}", flush=True)
        fmax_all = max(float(np.linalg.norm(f.get_forces(), axis=1).max()) for f in frames)
        wall = time.perf_counter() - t0
        s = {
            "atoms": len(atoms),
            "formula": atoms.get_chemical_formula(),
            "trajectories": len(args.temperatures) * len(args.seeds),
            "frames": len(frames),
            "md_steps": len(times),
            "teacher_s_per_structure_mean": statistics.mean(times),
            "teacher_s_per_structure_median": statistics.median(times),
            "teacher_s_per_atom": statistics.mean(times) / len(atoms),
            "max_force_eV_per_A": fmax_all,
            "wall_s": wall,
        }
        summary["molecules"][name] = s
        print(
            f"{name}: {s['frames']} frames from {s['trajectories']} trajectories; teacher "
            f"{s['teacher_s_per_structure_mean'] * 1e3:.2f} ms mean, "
            f"{s['teacher_s_per_structure_median'] * 1e3:.2f} ms median per structure, "
            f"{s['teacher_s_per_atom'] * 1e3:.3f} ms per atom; max |F| {fmax_all:.2f} eV/Å; "
            f"wall {wall:.1f} s; wrote {out_dir / (name + '.extxyz')}",
            flush=True,
        )
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    run_cli(main)
