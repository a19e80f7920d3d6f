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
        "no: the 2.2.4 wheel holds only empty placeholder files for ANI-2x; torchani downloads "
        "the networks from GitHub on first use",
        "",
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
    return f"install it with: python3 -m pip install {pkgs}  (see teachers/requirements-optional.txt)"


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
    if name in ("ani1x", "ani2x"):
        return f"ANI-{name[3:]} (torchani {_version('torchani')})"
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
    }
    key = aliases.get(key, key)
    if key not in TEACHERS:
        raise TeacherError(
            f"unknown teacher '{name}'; known teachers: {', '.join(TEACHERS)} "
            f"(run `python3 teachers/teachers.py` to see which are installed)"
        )
    return key


# --------------------------------------------------------------------------------------------
# torchani: the 2.2.4 wheel ships the ANI-1x networks under torchani/resources/ani-1x_8x/ but an
# EMPTY torchani/resources/ani-1x_8x.info. torchani then thinks the resources are missing and
# tries to download them from GitHub, which fails offline. The .info file is four lines:
# constants file, self-energy file, ensemble prefix, ensemble size (paths relative to the
# folder holding the .info). We write it from what is on disk.


def _torchani_info_lines(resources: Path, model_dir: str = "ani-1x_8x") -> list[str] | None:
    d = resources / model_dir
    if not d.is_dir():
        return None
    params = sorted(p for p in d.glob("*.params") if p.stat().st_size > 0)
    sae = sorted(p for p in d.glob("sae*.dat") if p.stat().st_size > 0)
    members = sorted(p for p in d.glob("train*") if p.is_dir() and p.name[5:].isdigit())
    if len(params) != 1 or not sae or not members:
        return None
    # the wheel ships ANI-2x and ANI-1ccx as EMPTY placeholder files: only real weights count
    for m in members:
        if not any(f.is_file() and f.stat().st_size > 0 for f in (m / "networks").glob("*")):
            return None
    return [
        f"{model_dir}/{params[0].name}",
        f"{model_dir}/{sae[0].name}",
        f"{model_dir}/train",
        str(len(members)),
    ]


def fix_torchani_resources(fix: bool = True, model_dir: str = "ani-1x_8x", log=None, teacher="ani1x") -> str:
    """Detect (and by default repair) the empty ``ani-1x_8x.info`` of the torchani wheel.

    Returns a one-line description of what was found or done. The repair writes the info file
    into torchani's resources folder when that is writable, else into ``~/.local/torchani/``
    (which torchani also reads) with absolute paths. Raises TeacherError when the networks
    themselves are not there (then only a download can help).
    """
    torchani = _import(teacher, "torchani")
    resources = Path(torchani.__file__).resolve().parent / "resources"
    info = resources / f"{model_dir}.info"
    local_info = Path(os.path.expanduser("~/.local/torchani")) / f"{model_dir}.info"
    if info.is_file() and info.stat().st_size > 0:
        return f"ok: {info} is filled in"
    if local_info.is_file() and local_info.stat().st_size > 0:
        return f"ok: {info} is empty but {local_info} is used instead"
    lines = _torchani_info_lines(resources, model_dir)
    if lines is None:
        raise TeacherError(
            f"teacher '{teacher}': torchani {_version('torchani')} has no usable networks in "
            f"{resources / model_dir} (missing, or empty placeholder files: the 2.2.4 wheel ships "
            f"real weights for ANI-1x only), and {info} is empty or missing, so torchani would "
            f"download them from GitHub on first use, which needs internet. Use ani1x offline, or "
            f"run once with internet, or reinstall: python3 -m pip install --force-reinstall torchani==2.2.4"
        )
    problem = f"{info} is {'empty' if info.exists() else 'missing'} (torchani 2.2.4 wheel bug)"
    if not fix:
        return (
            f"broken: {problem}; it should read {lines!r}; "
            f"fix with fix_torchani_resources() or `python3 teachers/teachers.py --fix-torchani` "
            f"(get_calculator does it by itself)"
        )
    try:
        info.write_text("\n".join(lines) + "\n")
        where = info
    except OSError:
        local_info.parent.mkdir(parents=True, exist_ok=True)
        abs_lines = [str(resources / p) for p in lines[:3]] + [lines[3]]
        local_info.write_text("\n".join(abs_lines) + "\n")
        where = local_info
    msg = f"fixed: {problem}; wrote {where}"
    if log is not None:
        print(f"note: {msg}", file=log)
    return msg


# --------------------------------------------------------------------------------------------


def get_calculator(name: str = DEFAULT_TEACHER, **opts):
    """Return an ASE calculator for teacher `name`.

    Options (unused ones are rejected):
      gfn2/gfn1: charge, multiplicity, accuracy (1.0), max_iterations (250),
                 electronic_temperature (300 K), verbosity (0)
      ani1x/ani2x: model_index (None = whole 8-network ensemble), device ('cpu'), fix_resources (True)
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
    elif name in ("ani1x", "ani2x"):
        torch = _import(name, "torch")
        _import(name, "torchani")
        model_dir = "ani-1x_8x" if name == "ani1x" else "ani-2x_8x"
        if take("fix_resources", True):
            fix_torchani_resources(fix=True, model_dir=model_dir, log=sys.stderr, teacher=name)
        else:
            status = fix_torchani_resources(fix=False, model_dir=model_dir, teacher=name)
            if status.startswith("broken"):
                raise TeacherError(f"teacher '{name}': {status}")
        import torchani

        device = take("device", "cpu")
        cls = torchani.models.ANI1x if name == "ani1x" else torchani.models.ANI2x
        try:
            with contextlib.redirect_stdout(sys.stderr):  # torchani prints its resource path
                model = cls(periodic_table_index=True, model_index=take("model_index"))
            model = model.to(device).to(torch.float64)
        except Exception as e:  # noqa: BLE001 - turned into a message
            raise TeacherError(
                f"teacher '{name}': could not load the networks ({type(e).__name__}: {e}); "
                f"check `python3 teachers/teachers.py` and teachers/README.md (torchani workaround)"
            ) from e
        calc = model.ase()
    elif name == "orb-v2":
        _import(name, "orb_models")
        pretrained = _import(name, "orb_models.forcefield.pretrained")
        orbcalc = _import(name, "orb_models.forcefield.calculator")
        device = take("device", "cpu")
        model_file = take("model_file")
        if model_file is not None and not Path(model_file).is_file():
            raise TeacherError(f"teacher 'orb-v2': model file {model_file} does not exist")
        try:
            kw = {"device": device}
            if model_file is not None:
                kw["weights_path"] = str(model_file)
            orbff = pretrained.orb_v2(**kw)
        except Exception as e:  # noqa: BLE001
            raise TeacherError(
                f"teacher 'orb-v2': could not get the orb-v2 weights ({type(e).__name__}: {e}). "
                f"orb-models downloads them on first use, which needs internet; on an offline "
                f"machine copy a checkpoint here and pass --model-file PATH"
            ) from e
        calc = orbcalc.ORBCalculator(orbff, device=device)
    elif name == "fennol-ani2x":
        model_file = take("model_file")
        if model_file is None:
            raise TeacherError(
                "teacher 'fennol-ani2x' needs a model file: pass --model-file PATH "
                "(a FeNNol .fnx model, e.g. ANI-2x converted with FeNNol's tools)"
            )
        if not Path(model_file).is_file():
            raise TeacherError(f"teacher 'fennol-ani2x': model file {model_file} does not exist")
        fase = _import(name, "fennol.ase")
        try:
            calc = fase.FENNIXCalculator(str(model_file), use_float64=bool(take("use_float64", True)))
        except Exception as e:  # noqa: BLE001
            raise TeacherError(
                f"teacher 'fennol-ani2x': could not load {model_file} ({type(e).__name__}: {e})"
            ) from e
    elif name == "mace-off":
        mcalc = _import(name, "mace.calculators")
        model_file = take("model_file")
        if model_file is not None and not Path(model_file).is_file():
            raise TeacherError(f"teacher 'mace-off': model file {model_file} does not exist")
        model = str(model_file) if model_file is not None else take("size", "medium")
        try:
            calc = mcalc.mace_off(model=model, device=take("device", "cpu"), default_dtype="float64")
        except Exception as e:  # noqa: BLE001
            raise TeacherError(
                f"teacher 'mace-off': could not get the MACE-OFF weights ({type(e).__name__}: {e}). "
                f"mace-torch downloads them on first use, which needs internet; on an offline "
                f"machine pass --model-file PATH to a local MACE-OFF .model file"
            ) from e
    else:  # pragma: no cover - canonical_name guards this
        raise TeacherError(f"unknown teacher '{name}'")
    if opts:
        raise TeacherError(f"teacher '{name}' does not take option(s): {', '.join(sorted(opts))}")
    return calc


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
        if name in ("ani1x", "ani2x"):
            _import(name, "torch")
            model_dir = "ani-1x_8x" if name == "ani1x" else "ani-2x_8x"
            return "installed; resources: " + fix_torchani_resources(fix=False, model_dir=model_dir, teacher=name)
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

