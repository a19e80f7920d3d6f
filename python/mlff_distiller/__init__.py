"""mlff-distiller from Python: distilled PaiNN students as an ASE calculator, batched calls,
MD on the engine, and training and evaluation with the `mlff` command's options.

    from mlff_distiller import Calculator
    atoms.calc = Calculator("models/painn-gfn2.safetensors")

Units are ASE's: Å, eV, eV/Å, amu, fs.
"""

from ._native import __version__
from .model import Model
from .calculator import Calculator
from .commands import main, train, evaluate
from . import md

__all__ = ["Model", "Calculator", "main", "train", "evaluate", "md", "__version__"]
