#!/usr/bin/env python3
"""`python3 teachers/teachers.py`: the teachers and whether each works here (the teacher bridge
lives in python/mlff_distiller/teachers; with the package installed, `python3 -m
mlff_distiller.teachers` is the same)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from mlff_distiller.teachers.core import _main, run_cli  # noqa: E402

if __name__ == "__main__":
    run_cli(_main)
