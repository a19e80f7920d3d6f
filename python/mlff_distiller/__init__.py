"""mlff-distiller from Python: distilled PaiNN students as an ASE calculator, batched calls,
MD on the engine, training, evaluation and distillation with the `mlff` command's options, and
the teacher bridge (`mlff_distiller.teachers`) that makes the training data.

    from mlff_distiller import Calculator
    atoms.calc = Calculator("models/painn-gfn2.safetensors")

Units are ASE's: Å, eV, eV/Å, amu, fs. The engine (the compiled `_native` module) is loaded
on first use, so that `mlff_distiller.teachers` works from a source checkout too.
"""

import importlib

_LAZY = {
    "Model": ("model", "Model"),
    "Calculator": ("calculator", "Calculator"),
    "main": ("commands", "main"),
    "train": ("commands", "train"),
    "evaluate": ("commands", "evaluate"),
    "distill": ("commands", "distill"),
    "md": ("md", None),
    "teachers": ("teachers", None),
    "__version__": ("_native", "__version__"),
}

__all__ = [
    "Model",
    "Calculator",
    "main",
    "train",
    "evaluate",
    "distill",
    "md",
    "teachers",
    "__version__",
]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'mlff_distiller' has no attribute {name!r}")
    module, attr = _LAZY[name]
    m = importlib.import_module(f".{module}", __name__)
    value = m if attr is None else getattr(m, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
