"""`python3 -m mlff_distiller.teachers`: the teachers and whether each works here."""

from .core import _main, run_cli

run_cli(_main)
