"""The teacher bridge: teacher force fields as ASE calculators, and the steps that make
training data with them (`pip install ./python[teachers]` installs the offline GFN2-xTB path).

    from mlff_distiller import teachers
    atoms.calc = teachers.get_calculator("gfn2")           # GFN2-xTB via tblite, offline
    labelled = teachers.label(frames, "gfn2")              # energies and forces, timed
    hv = teachers.label(frames, "morse", hessian_vectors=True)  # + arrays hvp_direction, hvp
    parts = teachers.split(labelled, counts=(8, 1, 1))     # by trajectory: train, val, test

The command-line forms are `python3 -m mlff_distiller.teachers.{label,sample,split}` (and the
scripts in the repository's teachers/ folder); `python3 -m mlff_distiller.teachers` lists the
teachers and whether each works here. Anything that stops a teacher raises `TeacherError`
naming the teacher, what is missing and how to install it.
"""

from __future__ import annotations

from .core import (
    DEFAULT_TEACHER,
    TEACHERS,
    TeacherError,
    canonical_name,
    compute,
    get_calculator,
    read_frames,
    set_labels,
    teacher_status,
    teacher_version,
    write_extxyz_atomic,
)
from .hvp import (
    DEFAULT_HVP_STEP,
    add_hvp_labels,
    check_step,
    hessian_vector_product,
    hvp_direction,
    keep_old_hvp,
)


def label(
    frames,
    teacher: str = DEFAULT_TEACHER,
    skip_failed: bool = False,
    hessian_vectors: bool = False,
    hvp_step: float = DEFAULT_HVP_STEP,
    seed: int = 0,
    **opts,
) -> list:
    """Copies of `frames` (ase.Atoms) labelled by `teacher` (energy, forces, the stress of
    cells periodic along all three axes where the teacher has one, and the info keys
    `teacher` and `teacher_time_s`). Labels a frame already had are kept as
    `ref_energy`/`ref_forces` (and `ref_hvp`/`ref_hvp_direction`). A frame the teacher fails
    on raises TeacherError naming it, or is dropped with `skip_failed`.

    `hessian_vectors=True` adds, as `label.py --hessian-vectors` does, the arrays
    `hvp_direction` (a unit direction over the 3N coordinates drawn from
    numpy.random.default_rng([seed, k]) for frame k) and `hvp` (H.v in eV/Å² by central
    differences of the forces with step `hvp_step` Å, stored as info `hvp_step`)."""
    name = canonical_name(teacher)
    if hessian_vectors:
        try:
            hvp_step = check_step(hvp_step)
        except ValueError as e:
            raise TeacherError(str(e)) from e
    calc = get_calculator(name, **opts)
    out = []
    for k, atoms in enumerate(frames):
        a = atoms.copy()
        old = atoms.calc.results if atoms.calc is not None else {}
        if "energy" in old:
            a.info["ref_energy"] = float(old["energy"])
        if "forces" in old:
            a.arrays["ref_forces"] = old["forces"].copy()
        keep_old_hvp(a)
        try:
            energy, forces, stress, seconds = compute(a, calc)
            if hessian_vectors:
                add_hvp_labels(a, calc, seed, k, hvp_step)
        except TeacherError:
            raise
        except Exception as e:  # the teacher's own failure, named by frame
            if skip_failed:
                continue
            raise TeacherError(f"teacher '{name}' failed on frame {k}: {type(e).__name__}: {e}") from e
        out.append(set_labels(a, energy, forces, name, seconds, stress))
    return out


def split(frames, counts=None, fractions=None, seed: int = 0, key: str = "trajectory") -> dict:
    """`frames` split into {"train", "val", "test"} by the info key `key` (whole trajectories
    only, shuffled with `seed`), as `split.py` does: `counts` of trajectories, or `fractions`
    (default 0.8, 0.1, 0.1)."""
    from .split import SPLITS, assign, split_counts

    ids = []
    for i, atoms in enumerate(frames):
        t = atoms.info.get(key)
        if t is None:
            raise TeacherError(f"frame {i} has no '{key}' info key; cannot split by trajectory")
        if str(t) not in ids:
            ids.append(str(t))
    if counts is None and fractions is None:
        fractions = [0.8, 0.1, 0.1]
    where = assign(ids, split_counts(len(ids), counts=counts, fractions=fractions), seed)
    out = {name: [] for name in SPLITS}
    for atoms in frames:
        out[where[str(atoms.info[key])]].append(atoms)
    return out


__all__ = [
    "DEFAULT_TEACHER", "TEACHERS", "TeacherError", "canonical_name", "compute", "get_calculator",
    "hessian_vector_product", "hvp_direction", "label", "read_frames", "set_labels", "split",
    "teacher_status", "teacher_version", "write_extxyz_atomic",
]
