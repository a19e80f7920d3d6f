"""How much of a cluster's energy error no model with a finite cutoff can remove.

A local model (PaiNN with a cutoff of R Å) gives two molecules further apart than R the sum of
their own energies, while the teacher still sees them interact (electrostatics, dispersion).
On every frame of MOLECULE at TEMPERATURE this splits the cluster into molecules (bonds within
1.2x ASE's natural cutoffs), labels each molecule alone with GFN2-xTB (tblite), and reports the
teacher's interaction energy on the frames where no two atoms of different molecules are
within R, the student's energy error there and how the two correlate, and the floor: the
energy MAE (meV/atom, over all frames of the group) that those frames alone force on a model
that is exact everywhere else and blind beyond R (its best constant offset allowed).

    mlff predict MODEL TEST.extxyz -o PRED.extxyz --device cpu
    python3 benches/distill/beyond_cutoff.py PRED.extxyz water2 300 [CUTOFF]

PRED.extxyz keeps the teacher's energy as `ref_energy` (what `mlff predict -o` writes); its
frames carry `molecule` and `temperature_K` (the held-out sets of `mlff distill` do).
"""

import sys

import numpy as np
from ase.io import read
from ase.neighborlist import natural_cutoffs, neighbor_list
from scipy.sparse.csgraph import connected_components
from scipy.sparse import coo_matrix
from tblite.ase import TBLite


def molecules(atoms):
    """Atom indices of each covalently bonded fragment."""
    # 1.2x the covalent radii: bonds stretch at 600 K (ASE's own default of 1 splits off H).
    i, j = neighbor_list("ij", atoms, natural_cutoffs(atoms, mult=1.2))
    n = len(atoms)
    graph = coo_matrix((np.ones(len(i)), (i, j)), shape=(n, n))
    count, label = connected_components(graph, directed=False)
    return [np.flatnonzero(label == k) for k in range(count)]


def teacher_energy(atoms):
    atoms = atoms.copy()
    atoms.calc = TBLite(method="GFN2-xTB", verbosity=0)
    return atoms.get_potential_energy()


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    path, name, temperature = sys.argv[1], sys.argv[2], float(sys.argv[3])
    cutoff = float(sys.argv[4]) if len(sys.argv) == 5 else 5.0
    frames = [
        a
        for a in read(path, ":")
        if a.info.get("molecule") == name
        and float(a.info.get("temperature_K", "nan")) == temperature
    ]
    if not frames:
        sys.exit(f"{path}: no frame of molecule {name} at {temperature} K")
    far, e_int, err = [], [], []
    for k, a in enumerate(frames):
        if "ref_energy" not in a.info:
            sys.exit(f"{path}: frame {k} has no ref_energy (write it with mlff predict -o)")
        parts = molecules(a)
        d = a.get_all_distances()
        gap = min(
            (d[np.ix_(p, q)].min() for x, p in enumerate(parts) for q in parts[x + 1 :]),
            default=np.inf,
        )
        far.append(gap > cutoff)
        e_int.append(a.info["ref_energy"] - sum(teacher_energy(a[p]) for p in parts))
        err.append(a.get_potential_energy() - a.info["ref_energy"])
    far, e_int, err = np.array(far), np.array(e_int), np.array(err)
    n_atoms = len(frames[0])
    mae = np.abs(err).mean() / n_atoms * 1e3
    print(f"{name} at {temperature:g} K: {len(frames)} frames, student E MAE {mae:.3f} meV/atom")
    print(f"frames with every pair of molecules more than {cutoff:g} Å apart: {far.sum()}")
    if not far.any():
        return
    ef, rf = e_int[far], err[far]
    print(
        f"  teacher's interaction energy there: mean {ef.mean() * 1e3:+.1f} meV, "
        f"mean |.| {np.abs(ef).mean() * 1e3:.1f} meV ({ef.min() * 1e3:+.1f} .. "
        f"{ef.max() * 1e3:+.1f})"
    )
    corr = np.corrcoef(ef, rf)[0, 1] if far.sum() > 1 else float("nan")
    print(
        f"  student's error there: mean |.| {np.abs(rf).mean() * 1e3:.1f} meV, "
        f"correlation with the interaction energy {corr:+.2f}"
    )
    if (~far).any():
        print(f"  student's error on the other frames: mean |.| {np.abs(err[~far]).mean() * 1e3:.1f} meV")
    floor = np.abs(ef - np.median(ef)).sum() / len(frames) / n_atoms * 1e3
    print(f"floor over all {len(frames)} frames: {floor:.3f} meV/atom")


if __name__ == "__main__":
    main()
