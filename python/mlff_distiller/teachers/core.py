"""Teacher force fields for mlff-distiller, as ASE calculators.

    from mlff_distiller.teachers import get_calculator
    atoms.calc = get_calculator("gfn2")          # GFN2-xTB via tblite, works offline

Every teacher returns energies in eV and forces in eV/Å (ASE units). Anything that stops a
teacher from being built (unknown name, package not installed, weights missing or not
downloadable) raises `TeacherError` with a message that names the teacher, what is missing and
how to install it. The command-line scripts catch it and print `error: ...` with exit code 2.

Run `python3 -m mlff_distiller.teachers` (or `python3 teachers/teachers.py`) to see which
teachers work on this machine.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import sys
import tempfile
import time
from pathlib import Path


class TeacherError(RuntimeError):
    """A teacher could not be built or used; the message says why and what to do."""


# name -> (description, pip packages, works offline?, note)
TEACHERS = {
    "gfn2": (
        "GFN2-xTB semi-empirical tight binding (tblite)",
        "tblite==0.8.0",
        "yes",
        "the default; parametrised for elements H-Rn",
    ),
    "gfn1": (
        "GFN1-xTB semi-empirical tight binding (tblite)",
        "tblite==0.8.0",
        "yes",
        "cheaper, less accurate than GFN2",
    ),
    "morse": (
        "toy Morse pair potential over all atom pairs, elements ignored (ASE MorsePotential)",
        "ase",
        "yes",
        "for fast CPU tests only, not a real force field; epsilon 0.5 eV, r0 1.6 Å, rho0 6, "
        "smooth cut-off 3-4 Å (--epsilon --r0 --rho0)",
    ),
    "ani1x": (
        "ANI-1x ensemble of 8 networks (torchani), elements H C N O",
        "torch torchani==2.2.4 'setuptools<81'",
        "yes, once the empty resources/ani-1x_8x.info of the wheel is filled in "
        "(done automatically, see fix_torchani_resources)",
        "weights ship inside the torchani wheel",
    ),
    "ani2x": (
        "ANI-2x ensemble of 8 networks (torchani), elements H C N O S F Cl",
        "torch torchani==2.2.4 'setuptools<81'",
        "yes, with --model-dir PATH to a folder holding ani-2x_8x.info and ani-2x_8x/ (the "
        "2.2.4 wheel holds only empty placeholders for ANI-2x)",
        "the team's copy: ../shared/teachers/ani-model-zoo/resources",
    ),
    "sevenn": (
        "SevenNet-0 (11Jul2024) universal potential, 89 elements (sevenn)",
        "torch sevenn==0.13.0",
        "yes: the checkpoint ships inside the wheel",
        "energy, forces, and stress of periodic cells",
    ),
    "orb-v2": (
        "Orb-v2 universal potential (orb-models)",
        "orb-models",
        "no: weights are downloaded on first use (or pass --model-file with a local checkpoint)",
        "",
    ),
    "fennol-ani2x": (
        "a FeNNol model, e.g. ANI-2x converted to FeNNol's .fnx format",
        "fennol jax",
        "yes, given --model-file PATH to the model",
        "",
    ),
    "mace-off": (
        "MACE-OFF23 organic force field (mace-torch)",
        "mace-torch",
        "no: weights are downloaded on first use (or pass --model-file with a local .model)",
        "",
    ),
}

DEFAULT_TEACHER = "gfn2"


def _install_hint(name: str) -> str:
    pkgs = TEACHERS[name][1]
    req = "requirements-ml.txt" if name in ("ani1x", "ani2x", "sevenn") else "requirements-optional.txt"
    return f"install it with: python3 -m pip install {pkgs}  (see teachers/{req})"


def _import(name: str, module: str):
    try:
        with contextlib.redirect_stdout(sys.stderr):  # some ML packages print on import
            return importlib.import_module(module)
    except ImportError as e:
        raise TeacherError(
            f"teacher '{name}' needs the Python module '{module}', which cannot be imported "
            f"({e}); {_install_hint(name)}"
        ) from e


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def teacher_version(name: str) -> str:
    """A short provenance string, e.g. 'GFN2-xTB (tblite 0.8.0)'."""
    name = canonical_name(name)
    if name in ("gfn2", "gfn1"):
        return f"{'GFN2' if name == 'gfn2' else 'GFN1'}-xTB (tblite {_version('tblite')})"
    if name == "morse":
        return f"Morse pair potential (ase {_version('ase')})"
    if name in ("ani1x", "ani2x"):
        return f"ANI-{name[3:]} (torchani {_version('torchani')})"
    if name == "sevenn":
        return f"SevenNet-0 (sevenn {_version('sevenn')})"
    if name == "orb-v2":
        return f"orb-v2 (orb-models {_version('orb-models')})"
    if name == "fennol-ani2x":
        return f"FeNNol model (fennol {_version('fennol')})"
    if name == "mace-off":
        return f"MACE-OFF (mace-torch {_version('mace-torch')})"
    return name


def canonical_name(name: str) -> str:
    key = name.strip().lower().replace("_", "-")
    aliases = {
        "gfn2-xtb": "gfn2",
        "xtb": "gfn2",
        "gfn1-xtb": "gfn1",
        "ani-1x": "ani1x",
        "ani-2x": "ani2x",
        "orb": "orb-v2",
        "orbv2": "orb-v2",
        "fennol": "fennol-ani2x",
        "mace-off23": "mace-off",
        "sevennet": "sevenn",
        "7net-0": "sevenn",
        "sevennet-0": "sevenn",
    }
    key = aliases.get(key, key)
    if key not in TEACHERS:
        raise TeacherError(
            f"unknown teacher '{name}'; known teachers: {', '.join(TEACHERS)} "
            f"(run `python3 teachers/teachers.py` to see which are installed)"
        )
    return key


def fix_torchani_resources(fix: bool = True, model_dir: str = "ani-1x_8x", log=None, teacher="ani1x") -> str:
    """Detect (and by default repair) the empty ``ani-1x_8x.info`` of the torchani 2.2.4 wheel
    (see teachers/README.md); lives in ml.py with the other torchani code."""
    from .ml import fix_torchani_resources as fix_resources

    return fix_resources(fix=fix, model_dir=model_dir, log=log, teacher=teacher)


# --------------------------------------------------------------------------------------------


def get_calculator(name: str = DEFAULT_TEACHER, **opts):
    """Return an ASE calculator for teacher `name`.

    Options (unused ones are rejected):
      gfn2/gfn1: charge, multiplicity, accuracy (1.0), max_iterations (250),
                 electronic_temperature (300 K), verbosity (0)
      morse:     epsilon (0.5 eV), r0 (1.6 Å), rho0 (6.0); the smooth cut-off is fixed at 3-4 Å
      ani1x/ani2x: model_dir (folder with ani-2x_8x.info and ani-2x_8x/; required for ani2x),
                 model_index (None = whole 8-network ensemble), device ('cpu'), fix_resources (True)
      sevenn:    model ('7net-0'), device ('cpu')
      orb-v2:    model_file (local checkpoint instead of download), device ('cpu')
      fennol-ani2x: model_file (required), use_float64 (True)
      mace-off:  model_file or size ('small'|'medium'|'large', default 'medium'), device ('cpu')
    """
    name = canonical_name(name)
    opts = {k: v for k, v in opts.items() if v is not None}

    def take(key, default=None):
        return opts.pop(key, default)

    if name in ("gfn2", "gfn1"):
        tblite_ase = _import(name, "tblite.ase")
        kw = dict(
            method="GFN2-xTB" if name == "gfn2" else "GFN1-xTB",
            accuracy=float(take("accuracy", 1.0)),
            max_iterations=int(take("max_iterations", 250)),
            electronic_temperature=float(take("electronic_temperature", 300.0)),
            verbosity=int(take("verbosity", 0)),
        )
        for k in ("charge", "multiplicity"):
            if k in opts:
                kw[k] = take(k)
        calc = tblite_ase.TBLite(**kw)
    elif name == "morse":
        calc = morse_calculator(take("epsilon", MORSE["epsilon"]), take("r0", MORSE["r0"]), take("rho0", MORSE["rho0"]))
    else:
        from . import ml  # the ML teachers' imports stay out of the offline paths

        calc = ml.build(name, take)
    if opts:
        raise TeacherError(f"teacher '{name}' does not take option(s): {', '.join(sorted(opts))}")
    return calc


# The toy teacher. ASE's MorsePotential takes its cut-off radii in units of r0; ours are fixed in
# Å, so that changing --r0 moves the minimum, not the range (and the cut-off stays below 5 Å,
# which the students' cut-off covers).
MORSE = {"epsilon": 0.5, "r0": 1.6, "rho0": 6.0, "rcut1": 3.0, "rcut2": 4.0}


def morse_calculator(epsilon=MORSE["epsilon"], r0=MORSE["r0"], rho0=MORSE["rho0"]):
    """ASE's MorsePotential over all atom pairs (elements ignored): E = sum over pairs of
    epsilon (exp(-2 rho0 (r/r0 - 1)) - 2 exp(-rho0 (r/r0 - 1))) times a smooth (C2) cut-off
    from 3 to 4 Å. A toy with analytic forces and stress, for fast tests only."""
    from ase.calculators.morse import MorsePotential

    epsilon, r0, rho0 = float(epsilon), float(r0), float(rho0)
    for flag, v in (("epsilon", epsilon), ("r0", r0), ("rho0", rho0)):
        if not (v > 0 and v < float("inf")):
            raise TeacherError(f"teacher 'morse': --{flag} must be a positive number, got {v}")
    if r0 >= MORSE["rcut1"]:
        raise TeacherError(f"teacher 'morse': --r0 {r0} Å must lie below the cut-off start {MORSE['rcut1']} Å")
    return MorsePotential(
        epsilon=epsilon, r0=r0, rho0=rho0, rcut1=MORSE["rcut1"] / r0, rcut2=MORSE["rcut2"] / r0
    )


def compute(atoms, calc):
    """Energy (eV), forces (eV/Å) and, for a cell periodic along all three axes with a teacher
    that has one (GFN2/GFN1 via tblite, ...), the stress (eV/Å³, ASE's sign and Voigt order;
    else None) of `atoms` with `calc`, and the wall time in seconds."""
    atoms.calc = calc
    t0 = time.perf_counter()
    energy = float(atoms.get_potential_energy())
    forces = atoms.get_forces().copy()
    stress = None
    if atoms.pbc.all() and "stress" in getattr(calc, "implemented_properties", ()):
        stress = atoms.get_stress().copy()
    return energy, forces, stress, time.perf_counter() - t0


def teacher_status(name: str) -> str:
    """One line: can this teacher be built here, and if not, why."""
    try:
        if name == "fennol-ani2x":
            _import(name, "fennol.ase")
            return "installed (needs --model-file)"
        if name == "ani1x":
            _import(name, "torch")
            return "installed; resources: " + fix_torchani_resources(fix=False, model_dir="ani-1x_8x", teacher=name)
        if name == "ani2x":
            _import(name, "torch")
            _import(name, "torchani")
            return "installed (needs --model-dir)"
        if name == "sevenn":
            _import(name, "torch")
            _import(name, "sevenn.calculator")
            return "installed (7net-0 ships in the wheel)"
        if name in ("orb-v2", "mace-off"):
            _import(name, {"orb-v2": "orb_models", "mace-off": "mace.calculators"}[name])
            return "installed (weights need internet on first use, or --model-file)"
        get_calculator(name)
        return "ok"
    except TeacherError as e:
        return f"unavailable: {e}"


# --------------------------------------------------------------------------------------------
# Files and command lines shared by label.py, sample.py, split.py.


def set_labels(atoms, energy, forces, teacher, seconds, stress=None):
    """Attach `energy`/`forces` (written as the extxyz energy= key and forces column) and,
    where given, `stress` (the stress= key, read back by `atoms.get_stress()` and `mlff`)."""
    from ase.calculators.singlepoint import SinglePointCalculator

    labels = dict(energy=float(energy), forces=forces)
    if stress is not None:
        labels["stress"] = stress
    atoms.calc = SinglePointCalculator(atoms, **labels)
    atoms.info["teacher"] = teacher
    atoms.info["teacher_time_s"] = round(float(seconds), 6)
    return atoms


def write_extxyz_atomic(path, frames, protect=()):
    """Write `frames` to `path` as extended XYZ through a temp file and a rename.

    Refuses to write onto any file in `protect` (the inputs).
    """
    import ase.io

    path = Path(path)
    for p in protect:
        if Path(p).exists() and path.exists() and os.path.samefile(p, path):
            raise TeacherError(f"refusing to overwrite the input file {p}; choose another -o")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        ase.io.write(tmp, list(frames), format="extxyz")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_frames(path):
    import ase.io

    path = Path(path)
    if not path.is_file():
        raise TeacherError(f"input file {path} does not exist")
    try:
        frames = ase.io.read(path, index=":")
    except Exception as e:  # noqa: BLE001
        raise TeacherError(f"cannot read {path}: {type(e).__name__}: {e}") from e
    if not frames:
        raise TeacherError(f"{path} has no frames")
    return frames


def run_cli(main):
    """Run `main()`; a TeacherError becomes `error: ...` on stderr and exit code 2."""
    try:
        code = main()
    except TeacherError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)


def _main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(
        description="List the teachers and whether each works on this machine.",
    )
    ap.add_argument(
        "--fix-torchani",
        action="store_true",
        help="fill in torchani's empty resources/ani-1x_8x.info (torchani 2.2.4 wheel bug)",
    )
    args = ap.parse_args(argv)
    if args.fix_torchani:
        print(fix_torchani_resources(fix=True, model_dir="ani-1x_8x", teacher="ani1x"))
        return 0
    for name, (desc, pkgs, offline, note) in TEACHERS.items():
        print(f"{name:13s} {desc}")
        print(f"{'':13s}   packages: {pkgs}; offline: {offline}{'; ' + note if note else ''}")
        print(f"{'':13s}   here: {teacher_status(name)}")
    return 0

