#!/usr/bin/env python3
"""Split an extxyz file into train / validation / test BY TRAJECTORY.

Frames of one MD trajectory are strongly correlated, so a split by frame would put near-copies
of test frames into training. This script groups frames by their `trajectory` info key (as
written by sample.py), shuffles the trajectories with --seed and assigns whole trajectories to
the splits; no trajectory is ever in two splits. Frames keep their order within each output.

How many trajectories go where:
    --counts TRAIN VAL TEST      exact numbers of trajectories (must add up to the total)
    --fractions TRAIN VAL TEST   shares (default 0.8 0.1 0.1); every split with a share > 0
                                 gets at least one trajectory
It refuses to run when there are fewer trajectories than non-empty splits.

Writes PREFIX_train.extxyz, PREFIX_val.extxyz, PREFIX_test.extxyz (an empty split writes no
file) and prints the trajectories and frame counts of each split.

Example:
    python3 teachers/split.py data/gfn2/raw/ethanol.extxyz --counts 6 1 1 --seed 0 -o data/gfn2/ethanol
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from .core import TeacherError, read_frames, run_cli, write_extxyz_atomic

SPLITS = ("train", "val", "test")


def split_counts(n_traj, counts=None, fractions=None):
    if counts is not None:
        if any(c < 0 for c in counts):
            raise TeacherError(f"--counts must be >= 0, got {counts}")
        if sum(counts) != n_traj:
            raise TeacherError(f"--counts {counts} add up to {sum(counts)}, but the file has {n_traj} trajectories")
        return list(counts)
    fractions = np.asarray(fractions, dtype=float)
    if (fractions < 0).any() or fractions.sum() <= 0:
        raise TeacherError(f"--fractions must be >= 0 with a positive sum, got {list(fractions)}")
    fractions = fractions / fractions.sum()
    nonzero = int((fractions > 0).sum())
    if n_traj < nonzero:
        raise TeacherError(
            f"only {n_traj} trajectories for {nonzero} splits; a split by trajectory needs at least one "
            f"trajectory per split (make more trajectories, or give a split a share of 0)"
        )
    counts = [max(1, int(round(f * n_traj))) if f > 0 else 0 for f in fractions]
    # fix the total by taking from / giving to the largest split (train first)
    order = np.argsort(-fractions, kind="stable")
    while sum(counts) > n_traj:
        for i in order:
            if counts[i] > 1:
                counts[i] -= 1
                break
    while sum(counts) < n_traj:
        counts[order[0]] += 1
    return counts


def assign(traj_ids, counts, seed):
    """Map trajectory id -> split name."""
    rng = np.random.default_rng(seed)
    shuffled = [traj_ids[i] for i in rng.permutation(len(traj_ids))]
    out, k = {}, 0
    for name, c in zip(SPLITS, counts):
        for t in shuffled[k : k + c]:
            out[t] = name
        k += c
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="split.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("input", help="extxyz file whose frames have a `trajectory` info key")
    ap.add_argument("-o", "--prefix", required=True, help="output prefix: PREFIX_{train,val,test}.extxyz")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--counts", type=int, nargs=3, metavar=("TRAIN", "VAL", "TEST"))
    g.add_argument("--fractions", type=float, nargs=3, metavar=("TRAIN", "VAL", "TEST"))
    ap.add_argument("--seed", type=int, default=0, help="seed for shuffling trajectories (default 0)")
    ap.add_argument("--key", default="trajectory", help="info key naming the trajectory (default: trajectory)")
    ap.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    args = ap.parse_args(argv)

    frames = read_frames(args.input)
    traj_ids = []
    for i, atoms in enumerate(frames):
        t = atoms.info.get(args.key)
        if t is None:
            raise TeacherError(f"frame {i} of {args.input} has no '{args.key}' info key; cannot split by trajectory")
        t = str(t)
        if t not in traj_ids:
            traj_ids.append(t)
    if args.fractions is None and args.counts is None:
        args.fractions = [0.8, 0.1, 0.1]
    counts = split_counts(len(traj_ids), args.counts, args.fractions)
    which = assign(traj_ids, counts, args.seed)

    outputs = {s: Path(f"{args.prefix}_{s}.extxyz") for s in SPLITS}
    for s, p in outputs.items():
        if Path(args.input).resolve() == p.resolve():
            raise TeacherError(f"output {p} is the input; refusing to overwrite it")
        if p.exists() and not args.overwrite and counts[SPLITS.index(s)] > 0:
            raise TeacherError(f"output {p} exists; pass --overwrite to replace it")
    print(f"{args.input}: {len(frames)} frames in {len(traj_ids)} trajectories (seed {args.seed})")
    for s in SPLITS:
        sel = [a for a in frames if which[str(a.info[args.key])] == s]
        trajs = [t for t in traj_ids if which[t] == s]
        if not trajs:
            print(f"  {s:5s}: 0 trajectories, 0 frames (no file written)")
            continue
        write_extxyz_atomic(outputs[s], sel, protect=[args.input])
        print(f"  {s:5s}: {len(trajs)} trajectories, {len(sel)} frames -> {outputs[s]}  [{' '.join(trajs)}]")
    return 0


if __name__ == "__main__":
    run_cli(main)
