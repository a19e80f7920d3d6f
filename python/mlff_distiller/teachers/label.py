#!/usr/bin/env python3
"""Label configurations with a teacher: energy (eV), forces (eV/Å), and stress (eV/Å³) for
cells periodic along all three axes where the teacher has one (GFN2/GFN1, morse, sevenn), for
every frame; with --hessian-vectors also one Hessian-vector product per frame.

Reads one or more extended XYZ (or plain XYZ) files with any number of frames and writes them
to OUTPUT with the teacher's `energy` (comment line) and `forces` (forces:R:3 column), keeping
everything else of each frame: info keys, per-atom arrays, cell and pbc. Labels that the input
already had are kept as `ref_energy` (info) and `ref_forces` (array), as `mlff predict` does,
unless --drop-old-labels is given. Each frame also gets

    teacher          the teacher's name (e.g. gfn2)
    teacher_time_s   the teacher's wall time for this structure, in seconds

and a summary is printed (frames, atoms, mean/median teacher time per structure, time per atom).

--hessian-vectors adds, per frame k, a random unit direction v over the 3N coordinates (drawn
from numpy.random.default_rng([--seed, k])) as the array `hvp_direction` (N x 3) and the
Hessian-vector product H.v = -(F(x+hv) - F(x-hv))/(2h) as the array `hvp` (N x 3, eV/Å²), from
two extra teacher force calls with h = --hvp-step (Å), stored as info `hvp_step`. Central
differences are used for every teacher, autograd ones included. Hessian-vector labels the input
already had become `ref_hvp`/`ref_hvp_direction` like old energies and forces.

The output is written to a temporary file in the same folder and renamed over OUTPUT at the end,
so a crash never leaves half a file. OUTPUT must not be one of the inputs, and an existing
OUTPUT is only replaced with --overwrite.

If the teacher fails on a frame (SCF not converged, unsupported element, ...) the run stops with
an error naming the frame; with --skip-failed such frames are dropped with a warning, and the
number dropped is reported.

Examples:
    python3 teachers/label.py data/aspirin_rmd17_10frames.extxyz -o /tmp/aspirin_gfn2.extxyz
    python3 teachers/label.py frames.extxyz -o labelled.extxyz --teacher ani1x
    python3 teachers/label.py frames.extxyz -o labelled.extxyz --teacher fennol-ani2x --model-file ani2x.fnx
    python3 teachers/label.py frames.extxyz -o labelled.extxyz --teacher ani2x --model-dir ANI2X_RESOURCES
    python3 teachers/label.py frames.extxyz -o labelled.extxyz --teacher morse --hessian-vectors --seed 1
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from .hvp import DEFAULT_HVP_STEP, add_hvp_labels, check_step, keep_old_hvp
from .core import (
    DEFAULT_TEACHER,
    TEACHERS,
    TeacherError,
    canonical_name,
    compute,
    get_calculator,
    read_frames,
    run_cli,
    set_labels,
    teacher_version,
    write_extxyz_atomic,
)


def add_teacher_args(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("teacher")
    g.add_argument(
        "--teacher",
        default=DEFAULT_TEACHER,
        help=f"teacher force field, one of: {', '.join(TEACHERS)} (default: {DEFAULT_TEACHER}; "
        "gfn2/gfn1 and ani1x work offline without extra files; "
        "`python3 teachers/teachers.py` lists what is installed)",
    )
    g.add_argument(
        "--model-file",
        help="local model/weights file (required for fennol-ani2x; for orb-v2 and mace-off "
        "instead of downloading)",
    )
    g.add_argument(
        "--model-dir",
        help="folder of ANI weights holding ani-2x_8x.info and ani-2x_8x/, laid out like "
        "ani-model-zoo's resources/ (required for ani2x; optional for ani1x)",
    )
    g.add_argument("--device", help="torch device for ani1x/ani2x/sevenn/orb-v2/mace-off (default cpu)")
    g.add_argument("--epsilon", type=float, help="Morse well depth in eV (morse; default 0.5)")
    g.add_argument("--r0", type=float, help="Morse equilibrium distance in Å (morse; default 1.6)")
    g.add_argument("--rho0", type=float, help="Morse stiffness, dimensionless (morse; default 6.0)")
    g.add_argument("--charge", type=float, help="total charge (gfn2/gfn1; default 0 or from initial charges)")
    g.add_argument("--multiplicity", type=int, help="spin multiplicity (gfn2/gfn1)")
    g.add_argument("--max-iterations", type=int, help="SCF iteration limit (gfn2/gfn1; default 250)")
    g.add_argument("--accuracy", type=float, help="numerical accuracy (gfn2/gfn1; default 1.0)")
    g.add_argument(
        "--electronic-temperature", type=float, help="Fermi smearing temperature in K (gfn2/gfn1; default 300)"
    )


def teacher_from_args(args):
    name = canonical_name(args.teacher)
    opts = {}
    for flag in ("epsilon", "r0", "rho0"):
        if getattr(args, flag) is not None:
            if name != "morse":
                raise TeacherError(f"--{flag} only applies to morse, not '{name}'")
            opts[flag] = getattr(args, flag)
    if args.model_dir is not None:
        if name not in ("ani1x", "ani2x"):
            raise TeacherError(f"--model-dir only applies to ani2x/ani1x, not '{name}'")
        opts["model_dir"] = args.model_dir
    if name in ("gfn2", "gfn1"):
        opts.update(
            charge=args.charge,
            multiplicity=args.multiplicity,
            max_iterations=args.max_iterations,
            accuracy=args.accuracy,
            electronic_temperature=args.electronic_temperature,
        )
    else:
        for flag in ("charge", "multiplicity", "max_iterations", "accuracy", "electronic_temperature"):
            if getattr(args, flag) is not None:
                raise TeacherError(f"--{flag.replace('_', '-')} only applies to gfn2/gfn1, not '{name}'")
        if name in ("ani1x", "ani2x", "sevenn", "orb-v2", "mace-off"):
            opts["device"] = args.device
    if args.model_file is not None:
        if name not in ("orb-v2", "fennol-ani2x", "mace-off"):
            raise TeacherError(f"--model-file does not apply to teacher '{name}'")
        opts["model_file"] = args.model_file
    return name, get_calculator(name, **opts)


def full_stress(s):
    """A stress as its 3x3 (from ASE's Voigt 6 or a 3x3)."""
    from ase.stress import voigt_6_to_full_3x3_stress

    s = np.asarray(s, dtype=float)
    return voigt_6_to_full_3x3_stress(s) if s.shape == (6,) else s.reshape(3, 3)


def timing_summary(times, natoms):
    """Lines describing teacher timings for structures of `natoms` atoms each."""
    if not times:
        return ["no structures labelled"]
    total = sum(times)
    return [
        f"teacher time: total {total:.3f} s, mean {total / len(times) * 1e3:.2f} ms, "
        f"median {statistics.median(times) * 1e3:.2f} ms per structure, "
        f"{total / sum(natoms) * 1e3:.3f} ms per atom",
    ]


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="label.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("inputs", nargs="+", metavar="INPUT", help="extxyz/xyz files (all frames are read)")
    ap.add_argument("-o", "--output", required=True, help="output extxyz file")
    ap.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists (never an input)")
    ap.add_argument(
        "--skip-failed",
        action="store_true",
        help="drop frames on which the teacher fails (with a warning) instead of stopping",
    )
    ap.add_argument(
        "--drop-old-labels",
        action="store_true",
        help="discard labels the input already had (energy, forces, stress, hvp) instead of keeping them as ref_*",
    )
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    h = ap.add_argument_group("Hessian-vector labels")
    h.add_argument(
        "--hessian-vectors",
        action="store_true",
        help="also store, per frame, a random unit direction v over the 3N coordinates "
        "(array hvp_direction) and H.v in eV/Å² (array hvp) from two extra force calls, "
        "-(F(x+hv) - F(x-hv))/(2h); info hvp_step = h",
    )
    h.add_argument(
        "--hvp-step", type=float, metavar="H",
        help=f"finite-difference step h in Å (default {DEFAULT_HVP_STEP:g})",
    )
    h.add_argument(
        "--seed", type=int,
        help="seed of the directions (default 0); frame k of the inputs (counted across all "
        "inputs, failed frames included) draws from numpy.random.default_rng([seed, k])",
    )
    add_teacher_args(ap)
    args = ap.parse_args(argv)
    if not args.hessian_vectors:
        for flag in ("hvp_step", "seed"):
            if getattr(args, flag) is not None:
                raise TeacherError(f"--{flag.replace('_', '-')} only applies with --hessian-vectors")
    try:
        hvp_step = check_step(DEFAULT_HVP_STEP if args.hvp_step is None else args.hvp_step)
    except ValueError as e:
        raise TeacherError(f"--hvp-step: {e}") from e
    hvp_seed = 0 if args.seed is None else args.seed

    out = Path(args.output)
    for p in args.inputs:
        if Path(p).resolve() == out.resolve():
            raise TeacherError(f"output {out} is the input file {p}; refusing to overwrite it")
    if out.exists() and not args.overwrite:
        raise TeacherError(f"output {out} exists; pass --overwrite to replace it")

    frames = []
    for p in args.inputs:
        frames.extend((p, i, a) for i, a in enumerate(read_frames(p)))

    name, calc = teacher_from_args(args)
    labelled, times, natoms, failed, hvp_times = [], [], [], [], []
    t_start = time.perf_counter()
    for k, (path, i, atoms) in enumerate(frames):
        where = f"frame {i} of {path}" if len(args.inputs) > 1 else f"frame {i}"
        old = atoms.calc
        ref_e = ref_f = ref_s = None
        if old is not None and not args.drop_old_labels:
            ref_e = old.results.get("energy")
            ref_f = old.results.get("forces")
            ref_s = old.results.get("stress")
        atoms.calc = None
        keep_old_hvp(atoms, drop=args.drop_old_labels)
        try:
            energy, forces, stress, dt = compute(atoms, calc)
            if not (math.isfinite(energy) and np.isfinite(forces).all()):
                raise RuntimeError("non-finite energy or forces")
            if args.hessian_vectors:
                add_hvp_labels(atoms, calc, hvp_seed, k, hvp_step)
                hvp_times.append(atoms.info["hvp_time_s"])
        except TeacherError:
            raise
        except Exception as e:  # noqa: BLE001 - any teacher failure is reported per frame
            if hasattr(calc, "reset"):
                calc.reset()
            msg = f"teacher '{name}' failed on {where} ({len(atoms)} atoms, {atoms.get_chemical_formula()}): {type(e).__name__}: {e}"
            if not args.skip_failed:
                raise TeacherError(msg + " (use --skip-failed to drop such frames)") from e
            print(f"warning: {msg}; frame dropped", file=sys.stderr)
            failed.append(where)
            continue
        if ref_e is not None and "ref_energy" not in atoms.info:
            atoms.info["ref_energy"] = float(ref_e)
        if ref_f is not None and "ref_forces" not in atoms.arrays:
            atoms.arrays["ref_forces"] = np.asarray(ref_f, dtype=float)
        if ref_s is not None and "ref_stress" not in atoms.info:
            atoms.info["ref_stress"] = full_stress(ref_s).reshape(9)
        set_labels(atoms, energy, forces, name, dt, stress)
        labelled.append(atoms)
        times.append(dt)
        natoms.append(len(atoms))
        if not args.quiet and (k + 1) % 100 == 0:
            print(f"  {k + 1}/{len(frames)} frames", file=sys.stderr)

    if not labelled:
        raise TeacherError(f"the teacher failed on all {len(frames)} frames; nothing written")
    write_extxyz_atomic(out, labelled, protect=args.inputs)
    wall = time.perf_counter() - t_start
    print(f"teacher: {name} = {teacher_version(name)}")
    print(
        f"frames: {len(labelled)} labelled of {len(frames)} read"
        + (f", {len(failed)} failed and dropped" if failed else "")
        + f"; atoms per frame {min(natoms)}-{max(natoms)}, {sum(natoms)} in all"
    )
    for line in timing_summary(times, natoms):
        print(line)
    if args.hessian_vectors and hvp_times:
        print(
            f"Hessian-vector labels: step {hvp_step:g} Å, seed {hvp_seed}; 2 extra teacher calls "
            f"per frame, {sum(hvp_times) / len(hvp_times) * 1e3:.2f} ms per frame (info hvp_time_s)"
        )
    print(f"wall time {wall:.2f} s; wrote {out}")
    return 0


if __name__ == "__main__":
    run_cli(main)
