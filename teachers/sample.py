#!/usr/bin/env python3
"""`python3 teachers/sample.py`: mlff_distiller.teachers.sample from this checkout (teachers/README.md);
with the package installed, `python3 -m mlff_distiller.teachers.sample` is the same."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from mlff_distiller.teachers.core import run_cli  # noqa: E402
from mlff_distiller.teachers.sample import main  # noqa: E402

if __name__ == "__main__":
    run_cli(main)
