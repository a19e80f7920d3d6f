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
    """`epochs=3, force_gradient="auto", resume=True, devices=["cuda:0", "cuda:1"]` as
    `--epochs 3 --force-gradient auto --resume --devices cuda:0,cuda:1`."""
    out = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        flag = "--" + key.replace("_", "-")
        out.append(flag)
        if value is not True:
            out.append(str(value))
    return out


def train(train, out, val=None, **options) -> dict:
    """`mlff train`: fits a student to `train` (paths or labelled `ase.Atoms`), validating on
    `val` (or a held-out fraction of the training trajectories), writing into `out`.

    `options` are the command's flags with underscores: `epochs`, `batch_size`, `lr`,
    `config`, `init`, `resume`, `overwrite`, `max_minutes`, `device`, `dtype`, `devices`
    (a list of GPUs: data-parallel, a build with the `nccl` feature), ...
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


def _absolute_paths(config: dict, base: str) -> dict:
    """`config` with its seed files and model config made absolute (from `base`), and the
    teacher commands defaulting to this Python, which has the bridge installed."""
    import copy
    import sys

    c = copy.deepcopy(config)
    for seed in c.get("seeds", []):
        if isinstance(seed, dict) and seed.get("file"):
            seed["file"] = os.path.join(base, os.fspath(seed["file"]))
    if c.get("model"):
        c["model"] = os.path.join(base, os.fspath(c["model"]))
    teacher = c.setdefault("teacher", {})
    for key, module in (("label_command", "label"), ("sample_command", "sample")):
        teacher.setdefault(key, [sys.executable, "-m", f"mlff_distiller.teachers.{module}"])
    return c


def distill(out, config=None, resume: bool = False, **options) -> dict:
    """`mlff distill`: the active-learning loop from a teacher to a student (docs/distill.md)
    in the folder `out`, from `config` (a path to the JSON settings, or a dict of them, whose
    relative paths are the current directory's) or, with `resume=True`, continuing the run
    in `out`. `options` are the command's flags (`max_iterations`, `disagreement`,
    `max_frames`, `max_teacher_hours`, `max_train_minutes`, `stop_before`, `device`,
    `tuning`). Returns the run's
    report (report.json: `config` and `state`)."""
    args = ["distill", "--out", os.fspath(out)]
    with tempfile.TemporaryDirectory() as tmp:
        if isinstance(config, dict):
            path = os.path.join(tmp, "distill.json")
            with open(path, "w") as f:
                json.dump(_absolute_paths(config, os.getcwd()), f)
            args += ["--config", path]
        elif config is not None:
            args += ["--config", os.fspath(config)]
        if resume:
            args.append("--resume")
        _run(args + _flags(options))
    with open(os.path.join(os.fspath(out), "report.json")) as f:
        return json.load(f)
