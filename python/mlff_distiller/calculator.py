"""The ASE calculator."""

from __future__ import annotations

import numpy as np
from ase.calculators.calculator import Calculator as AseCalculator
from ase.calculators.calculator import PropertyNotImplementedError, all_changes
from ase.stress import full_3x3_to_voigt_6_stress

from . import _native
from .model import as_model


class Calculator(AseCalculator):
    """An ASE calculator of a distilled student: energy (and free_energy, the same), forces,
    per-atom energies (`energies`) and, for cells periodic along all three axes, the stress
    (eV/Å³, Voigt order and sign as ASE's; through the model's autograd graph, so slower than
    energy and forces).

    `model` is a path or a `Model`. Between calls it keeps the system's neighbour list (with
    a `skin` in Å: rebuilt once an atom has moved half of it), device buffers and CUDA
    graphs, so that an ASE MD loop pays little more than the model call; a change of atoms,
    elements, cell or periodicity starts afresh. The GIL is released while it computes.
    """

    implemented_properties = ["energy", "free_energy", "forces", "energies", "stress"]

    def __init__(
        self,
        model,
        device: str = "auto",
        dtype: str = "float32",
        graphs: str = "auto",
        skin: float = 1.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.model = as_model(model, device=device, dtype=dtype, graphs=graphs)
        self.skin = skin
        self._graphs = graphs
        self._session = None
        self._key = None

    def check_state(self, atoms, tol=1e-15):
        """What changed since the last calculation: positions, numbers, cell, pbc (the model
        reads nothing else). ASE's general comparison costs more than a small molecule's
        model call on a GPU."""
        last = getattr(self, "_last", None)
        if self.atoms is None or last is None:
            return list(all_changes)
        positions, numbers, cell, pbc = last
        changes = []
        if len(atoms) != len(numbers) or not np.array_equal(atoms.numbers, numbers):
            changes += ["positions", "numbers"]
        elif np.abs(atoms.positions - positions).max(initial=0.0) > tol:
            changes.append("positions")
        if np.abs(atoms.cell.array - cell).max() > tol:
            changes.append("cell")
        if not np.array_equal(atoms.pbc, pbc):
            changes.append("pbc")
        return changes

    def _system(self, atoms):
        periodic = bool(atoms.pbc.any())
        cell = np.array(atoms.cell[:], dtype=np.float64) if periodic else None
        pbc = np.array(atoms.pbc, dtype=bool) if periodic else None
        numbers = np.ascontiguousarray(atoms.numbers, dtype=np.int64)
        key = (numbers.tobytes(), None if cell is None else cell.tobytes(),
               None if pbc is None else pbc.tobytes())
        return numbers, cell, pbc, key

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        atoms = self.atoms
        positions = np.ascontiguousarray(atoms.positions, dtype=np.float64)
        numbers, cell, pbc, key = self._system(atoms)
        if "stress" in properties:
            if not atoms.pbc.all():
                raise PropertyNotImplementedError(
                    "stress needs a cell periodic along all three axes")
            energies, forces, stresses = self.model.stress_arrays(
                positions, numbers, cell[None], pbc[None])
            energy = float(energies[0])
            self.results["stress"] = full_3x3_to_voigt_6_stress(stresses[0])
        elif "energies" in properties:
            energies, forces, per_atom = self.model.compute_arrays(
                positions, numbers,
                None if cell is None else cell[None],
                None if pbc is None else pbc[None],
                atom_energies=True,
            )
            energy = float(energies[0])
            self.results["energies"] = per_atom
        else:
            if self._session is None or self._key != key:
                self._session = _native.Session(
                    self.model.native, positions, numbers, cell, pbc,
                    skin=self.skin, graphs=self._graphs,
                )
                self._key = key
            energy, forces = self._session.evaluate(positions)
        self.results["energy"] = energy
        self.results["free_energy"] = energy
        self.results["forces"] = forces
        self._last = (positions.copy(), atoms.numbers.copy(), atoms.cell.array.copy(),
                      atoms.pbc.copy())
