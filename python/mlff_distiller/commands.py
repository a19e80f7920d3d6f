"""The `mlff` commands in this process: `main` for any of them, `train` and `evaluate` with
Python arguments (paths, or lists of labelled `ase.Atoms`)."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Optional, Sequence

from . import _native


class CommandError(ValueError):
    """An `mlff` command failed; the message is the command's error."""


def main(args: Sequence[str]) -> int:
    """Runs `mlff ARGS...` in this process (the GIL released) and returns its exit status;
    errors are printed as the command prints them."""
    status, error = _native.run_command([os.fspath(a) for a in args])
    if error is not None:
        import sys

        print(f"error: {error}", file=sys.stderr)
    return status


def _run(args):
    status, error = _native.run_command([os.fspath(a) for a in args])
    if status == 130:
        raise KeyboardInterrupt(error or f"mlff {args[0]} was interrupted")
    if status != 0:
        raise CommandError(error or f"mlff {args[0]} exited with status {status}")


def _files(data, folder: str, name: str) -> list:
    """Paths of `data`: a path, a list of paths, or a list of `ase.Atoms` (written to
    `folder` as extended XYZ)."""
    if isinstance(data, (str, os.PathLike)):
        return [os.fspath(data)]
    items = list(data)
    if items and all(isinstance(d, (str, os.PathLike)) for d in items):
        return [os.fspath(d) for d in items]
    import ase.io

    path = os.path.join(folder, f"{name}.extxyz")
    ase.io.write(path, items, format="extxyz")
    return [path]


def _flags(options: dict) -> list:
    """`epochs=3, force_gradient="auto", resume=True` as `--epochs 3 --force-gradient auto
    --resume`."""
    out = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        out.append(flag)
        if value is not True:
            out.append(str(value))
    return out


def train(train, out, val=None, **options) -> dict:
    """`mlff train`: fits a student to `train` (paths or labelled `ase.Atoms`), validating on
    `val` (or a held-out fraction of the training trajectories), writing into `out`.

    `options` are the command's flags with underscores: `epochs`, `batch_size`, `lr`,
    `config`, `init`, `resume`, `overwrite`, `max_minutes`, `device`, `dtype`, ...
    Returns the paths of best.safetensors, last.safetensors, state.safetensors, log.jsonl.
    """
    with tempfile.TemporaryDirectory() as tmp:
        args = ["train", "--train", *_files(train, tmp, "train")]
        if val is not None:
            args += ["--val", *_files(val, tmp, "val")]
        args += ["--out", os.fspath(out), *_flags(options)]
        _run(args)
    names = ["best.safetensors", "last.safetensors", "state.safetensors", "log.jsonl"]
    return {n.split(".")[0]: os.path.join(os.fspath(out), n) for n in names}


def evaluate(model, data, **options) -> dict:
    """`mlff eval`: errors of `model` (a path) on labelled `data` (paths or `ase.Atoms`):
    the report as a dict (overall, per_element, per_molecule; eV and eV/Å). `options` as
    the command's flags (`batch_size`, `device`, `dtype`, `plot`, ...)."""
    if hasattr(model, "path"):
        model = model.path
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        args = ["eval", os.fspath(model), *_files(data, tmp, "data"), "--json", report]
        _run(args + _flags(options))
        with open(report) as f:
            return json.load(f)["report"]
