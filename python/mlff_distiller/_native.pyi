"""Type hints of the compiled engine module (python/src)."""

from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

__version__: str

class Model:
    path: str
    cutoff: float
    elements: list[int]
    device: str
    dtype: str
    def __init__(
        self,
        path: str,
        device: str = "auto",
        dtype: str = "float32",
        graphs: str = "auto",
        backend: str = "fused",
        tuning: Optional[str] = None,
    ) -> None: ...
    def compute_arrays(
        self,
        positions: npt.NDArray[np.float64],
        numbers: npt.NDArray[np.int64],
        cells: Optional[npt.NDArray[np.float64]] = None,
        pbc: Optional[npt.NDArray[np.bool_]] = None,
        structure_index: Optional[npt.NDArray[np.int64]] = None,
        atom_energies: bool = False,
    ) -> Tuple[
        npt.NDArray[np.float64], npt.NDArray[np.float64], Optional[npt.NDArray[np.float64]]
    ]: ...
    def stress_arrays(
        self,
        positions: npt.NDArray[np.float64],
        numbers: npt.NDArray[np.int64],
        cells: Optional[npt.NDArray[np.float64]] = None,
        pbc: Optional[npt.NDArray[np.bool_]] = None,
        structure_index: Optional[npt.NDArray[np.int64]] = None,
    ) -> Tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]: ...

class Session:
    model: Model
    list_builds: int
    def __init__(
        self,
        model: Model,
        positions: npt.NDArray[np.float64],
        numbers: npt.NDArray[np.int64],
        cell: Optional[npt.NDArray[np.float64]] = None,
        pbc: Optional[npt.NDArray[np.bool_]] = None,
        skin: float = 1.0,
        graphs: str = "auto",
    ) -> None: ...
    def evaluate(
        self, positions: npt.NDArray[np.float64]
    ) -> Tuple[float, npt.NDArray[np.float64]]: ...

def run_command(args: Sequence[str]) -> Tuple[int, Optional[str]]: ...
def masses(numbers: Sequence[int]) -> list[float]: ...
SystemArrays = Tuple[
    npt.NDArray[np.float64],
    npt.NDArray[np.int64],
    Optional[npt.NDArray[np.float64]],
    Optional[npt.NDArray[np.bool_]],
    Optional[npt.NDArray[np.float64]],
]

def run_md(
    model: Model,
    systems: Sequence[SystemArrays],
    *,
    batch: bool = False,
    steps: int = 1000,
    dt: float = 0.5,
    ensemble: str = "nve",
    temperature: float = 300.0,
    friction: float = 10.0,
    init_temperature: Optional[float] = None,
    seed: int = 0,
    skin: float = 1.0,
    pressure: float = 1.0,
    barostat_mode: str = "iso",
    barostat_time: float = 1000.0,
    compressibility: float = 4.5e-5,
    traj: Optional[str] = None,
    traj_every: int = 100,
    log: Optional[str] = None,
    log_every: int = 10,
    restart_every: int = 0,
    restart_file: Optional[str] = None,
    keep_going: bool = False,
    bond_limit: float = 0.5,
    overwrite: bool = False,
    append: bool = False,
    callback: Optional[Callable[[int, dict, Optional[npt.NDArray[np.float64]]], object]] = None,
    graphs: str = "auto",
) -> Tuple[
    list[npt.NDArray[np.float64]],
    list[npt.NDArray[np.float64]],
    list[Optional[npt.NDArray[np.float64]]],
    str,
]: ...
