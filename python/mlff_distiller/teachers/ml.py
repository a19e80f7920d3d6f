"""The ML teachers (torchani ANI-1x/ANI-2x, SevenNet, Orb, FeNNol, MACE-OFF): building their
ASE calculators, and the torchani 2.2.4 resource workarounds. Kept apart from core.py so that
the offline paths (GFN2, Morse) never import any of this; `core.get_calculator` calls
`build(name, take)` here for these teachers.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from .core import TeacherError, _import, _version

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
            f"download them from GitHub on first use, which needs internet. Use ani1x offline, "
            f"or for ani2x pass --model-dir PATH to a folder of its weights, or reinstall: "
            f"python3 -m pip install --force-reinstall torchani==2.2.4"
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
# ANI-2x (or ANI-1x) from a folder of weights laid out like the resources/ folder of
# ani-model-zoo: NAME.info (four lines: constants file, self-energy file, ensemble prefix,
# ensemble size, paths relative to the folder) beside the NAME/ folder of networks.

ANI_INFO = {"ani1x": "ani-1x_8x", "ani2x": "ani-2x_8x"}


def check_ani_model_dir(name: str, model_dir) -> Path:
    """The folder, after checking that it holds real (non-empty) ANI files; TeacherError else."""
    stem = ANI_INFO[name]
    d = Path(model_dir)
    hint = f"--model-dir must be a folder holding {stem}.info and {stem}/ (like ani-model-zoo's resources/)"
    if not d.is_dir():
        raise TeacherError(f"teacher '{name}': model folder {d} does not exist; {hint}")
    info = d / f"{stem}.info"
    if not info.is_file() or info.stat().st_size == 0:
        raise TeacherError(f"teacher '{name}': {info} is {'empty' if info.is_file() else 'missing'}; {hint}")
    lines = [x.strip() for x in info.read_text().splitlines() if x.strip()][:4]
    if len(lines) != 4 or not lines[3].isdigit() or int(lines[3]) < 1:
        raise TeacherError(
            f"teacher '{name}': {info} should have 4 lines (constants file, self-energy file, "
            f"ensemble prefix, ensemble size), got {lines!r}"
        )
    for rel in lines[:2]:
        f = d / rel
        if not f.is_file() or f.stat().st_size == 0:
            raise TeacherError(f"teacher '{name}': {f} (named in {info}) is missing or empty")
    for i in range(int(lines[3])):
        nets = d / f"{lines[2]}{i}" / "networks"
        if not any(f.is_file() and f.stat().st_size > 0 for f in nets.glob("ANN-*.nnf")):
            raise TeacherError(
                f"teacher '{name}': no network files in {nets} (ensemble member {i} of {lines[3]}, "
                f"named in {info}); empty placeholders, as in the torchani wheel, do not count"
            )
    return d


def _ani_from_dir(name: str, model_dir: Path, model_index):
    """torchani's own ANI constructor, with its resource lookup pointed at `model_dir`.

    torchani 2.2.4 looks for NAME.info only in its package folder and in ~/.local/torchani/,
    and downloads otherwise. Rather than writing into either, the lookup that
    `BuiltinModel._from_neurochem_resources` calls is swapped, for this call only, for one that
    resolves the same four lines against `model_dir` with torchani's own `_get_resources`: the
    model is built exactly as `torchani.models.ANI2x()` builds it, and nothing is written."""
    import torchani
    from torchani.neurochem import parse_resources

    info = f"{ANI_INFO[name]}.info"
    orig = torchani.neurochem.parse_neurochem_resources

    def parse(info_file_path):
        if info_file_path != info:
            return orig(info_file_path)
        return parse_resources._get_resources(str(model_dir), info_file_path)

    torchani.neurochem.parse_neurochem_resources = parse
    try:
        if model_index is None:
            return torchani.models.BuiltinEnsemble._from_neurochem_resources(info, periodic_table_index=True)
        return torchani.models.BuiltinModel._from_neurochem_resources(
            info, periodic_table_index=True, model_index=int(model_index)
        )
    finally:
        torchani.neurochem.parse_neurochem_resources = orig


def _build_ani(name, take):
    model_dir = take("model_dir")
    model_index = take("model_index")
    device = take("device", "cpu")
    fix = take("fix_resources", True)
    if model_dir is not None:
        model_dir = check_ani_model_dir(name, model_dir)
    elif name == "ani2x":
        raise TeacherError(
            "teacher 'ani2x' needs its weights: pass --model-dir PATH (model_dir=PATH), a folder "
            "holding ani-2x_8x.info and ani-2x_8x/ like ani-model-zoo's resources/ (the torchani "
            "2.2.4 wheel holds only empty placeholders for ANI-2x and would download the "
            "networks from GitHub, which needs internet)"
        )
    elif fix:  # ani1x from the wheel, whose .info file is empty
        fix_torchani_resources(fix=True, model_dir=ANI_INFO[name], log=sys.stderr, teacher=name)
    else:
        status = fix_torchani_resources(fix=False, model_dir=ANI_INFO[name], teacher=name)
        if status.startswith("broken"):
            raise TeacherError(f"teacher '{name}': {status}")
    # the folder is checked first (above), so a missing --model-dir is named even without torch
    torch = _import(name, "torch")
    torchani = _import(name, "torchani")
    try:
        with contextlib.redirect_stdout(sys.stderr):  # torchani prints its resource path
            if model_dir is not None:
                model = _ani_from_dir(name, model_dir, model_index)
            else:
                model = torchani.models.ANI1x(periodic_table_index=True, model_index=model_index)
        model = model.to(device).to(torch.float64)
    except Exception as e:  # noqa: BLE001 - turned into a message
        where = f"from {model_dir}" if model_dir is not None else "(see `python3 teachers/teachers.py`)"
        raise TeacherError(
            f"teacher '{name}': could not load the networks {where} ({type(e).__name__}: {e})"
        ) from e
    return model.ase()


# --------------------------------------------------------------------------------------------


def _build_sevenn(name, take):
    calc_mod = _import(name, "sevenn.calculator")
    model = take("model", "7net-0")
    device = take("device", "cpu")
    try:
        with contextlib.redirect_stdout(sys.stderr):  # keep stdout for the scripts' summaries
            return calc_mod.SevenNetCalculator(model, device=device)
    except Exception as e:  # noqa: BLE001
        raise TeacherError(
            f"teacher 'sevenn': could not load SevenNet model '{model}' on device {device} "
            f"({type(e).__name__}: {e}); sevenn==0.13.0 ships 7net-0 inside its wheel"
        ) from e


def _build_orb(name, take):
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
    return orbcalc.ORBCalculator(orbff, device=device)


def _build_fennol(name, take):
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
        return fase.FENNIXCalculator(str(model_file), use_float64=bool(take("use_float64", True)))
    except Exception as e:  # noqa: BLE001
        raise TeacherError(
            f"teacher 'fennol-ani2x': could not load {model_file} ({type(e).__name__}: {e})"
        ) from e


def _build_mace(name, take):
    mcalc = _import(name, "mace.calculators")
    model_file = take("model_file")
    if model_file is not None and not Path(model_file).is_file():
        raise TeacherError(f"teacher 'mace-off': model file {model_file} does not exist")
    model = str(model_file) if model_file is not None else take("size", "medium")
    try:
        return mcalc.mace_off(model=model, device=take("device", "cpu"), default_dtype="float64")
    except Exception as e:  # noqa: BLE001
        raise TeacherError(
            f"teacher 'mace-off': could not get the MACE-OFF weights ({type(e).__name__}: {e}). "
            f"mace-torch downloads them on first use, which needs internet; on an offline "
            f"machine pass --model-file PATH to a local MACE-OFF .model file"
        ) from e


BUILDERS = {
    "ani1x": _build_ani,
    "ani2x": _build_ani,
    "sevenn": _build_sevenn,
    "orb-v2": _build_orb,
    "fennol-ani2x": _build_fennol,
    "mace-off": _build_mace,
}


def build(name: str, take):
    """The calculator of ML teacher `name`; `take(key, default)` pops its options."""
    return BUILDERS[name](name, take)
