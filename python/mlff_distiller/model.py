"""`Model`: a trained student on a device, computing whole batches in one call."""

from __future__ import annotations

import os
from typing import Optional, Sequence, Tuple

import numpy as np

from . import _native


class Model:
    """A checkpoint (`.safetensors`) loaded on `device` ("cpu", "cuda", "cuda:N" or "auto":
    CUDA when this build and machine have it) in `dtype` ("float32" or "float64").

    `graphs` ("auto", "on", "off") replays batch shapes seen before as CUDA graphs; `backend`
    ("fused", "autograd", "stock") and `tuning` (a JSON file) are those of `mlff`.
    A missing file raises FileNotFoundError, a bad one ValueError.
    """

    def __init__(
        self,
        path: "str | os.PathLike",
        device: str = "auto",
        dtype: str = "float32",
        graphs: str = "auto",
        backend: str = "fused",
        tuning: "Optional[str | os.PathLike]" = None,
    ):
        self.native = _native.Model(
            os.fspath(path),
            device=device,
            dtype=dtype,
            graphs=graphs,
            backend=backend,
            tuning=None if tuning is None else os.fspath(tuning),
        )

    @property
    def path(self) -> str:
        return str(self.native.path)

    @property
    def cutoff(self) -> float:
        """Interaction cutoff in Å."""
        return self.native.cutoff

    @property
    def elements(self) -> list:
        """Atomic numbers the model knows."""
        return list(self.native.elements)

    @property
    def device(self) -> str:
        return self.native.device

    @property
    def dtype(self) -> str:
        return self.native.dtype

    def __repr__(self) -> str:
        return f"Model({self.path!r}, device={self.device!r}, dtype={self.dtype!r})"

    def compute_arrays(
        self,
        positions,
        numbers,
        cells=None,
        pbc=None,
        structure_index=None,
        atom_energies: bool = False,
    ):
        """Energies (eV, one per structure) and forces (eV/Å, [N, 3]) of a batch in one call.

        `positions` [N, 3] and `numbers` [N] hold every atom of every structure;
        `structure_index[i]` is the structure of atom i (0, 1, 2, ... with each structure's
        atoms together; all 0 when omitted); `cells` [S, 3, 3] and `pbc` [S, 3] give periodic
        cells (molecules without). With `atom_energies=True` a third array holds each atom's
        energy. Bad input raises ValueError naming the argument, structure or atom.
        """
        args = batch_arrays(positions, numbers, cells, pbc, structure_index)
        energies, forces, atoms = self.native.compute_arrays(*args, atom_energies=atom_energies)
        if atom_energies:
            return energies, forces, atoms
        return energies, forces

    def stress_arrays(self, positions, numbers, cells=None, pbc=None, structure_index=None):
        """Energies, forces and stresses ([S, 3, 3] in eV/Å³, ASE's sign: positive =
        tensile; NaN for a structure without a cell periodic along all three axes) of a batch
        given as in `compute_arrays`. The stress is the energy's strain derivative over the
        volume, computed through the model's autograd graph."""
        return self.native.stress_arrays(
            *batch_arrays(positions, numbers, cells, pbc, structure_index))

    def compute(self, structures: Sequence) -> Tuple[np.ndarray, list]:
        """Energies (eV, [S]) and forces (a [n_i, 3] array per structure, eV/Å) of a list of
        `ase.Atoms`, computed as one batch."""
        structures = list(structures)
        if not structures:
            return np.zeros(0), []
        positions = np.concatenate([a.positions for a in structures])
        numbers = np.concatenate([a.numbers for a in structures])
        index = np.repeat(np.arange(len(structures)), [len(a) for a in structures])
        periodic = [bool(a.pbc.any()) for a in structures]
        cells = pbc = None
        if any(periodic):
            cells = np.stack([np.asarray(a.cell[:]) for a in structures])
            pbc = np.stack([a.pbc for a in structures])
        energies, forces = self.compute_arrays(positions, numbers, cells, pbc, index)
        bounds = np.cumsum([0] + [len(a) for a in structures])
        return energies, [forces[bounds[k] : bounds[k + 1]] for k in range(len(structures))]


def batch_arrays(positions, numbers, cells, pbc, structure_index):
    """A batch's arrays in the dtypes and layout the engine takes."""
    contiguous = lambda a, dtype: None if a is None else np.ascontiguousarray(a, dtype=dtype)
    return (
        contiguous(positions, np.float64),
        contiguous(numbers, np.int64),
        contiguous(cells, np.float64),
        contiguous(pbc, bool),
        contiguous(structure_index, np.int64),
    )


def as_model(model, device: str = "auto", dtype: str = "float32", graphs: str = "auto") -> Model:
    """`model` itself, or the checkpoint at that path loaded."""
    if isinstance(model, Model):
        return model
    return Model(model, device=device, dtype=dtype, graphs=graphs)
