"""Diamond silicon's equation of state from SevenNet-0 and from a student.

    python3 silicon_eos.py label OUT.extxyz      SevenNet-0 (sevenn 0.13.0, CPU) on 64-atom cells
                                                strained uniformly, a = 5.30 ... 5.60 Å
    python3 silicon_eos.py fit LABELS PRED       the zero-pressure lattice constant and bulk
                                                modulus of both: LABELS from `label`, PRED from
                                                `mlff predict MODEL LABELS --stress -o PRED`
    python3 silicon_eos.py time FRAMES [cuda]    SevenNet-0's time for one call (energy, forces,
                                                stress) on the first frame, one CPU thread (or
                                                the GPU, synchronised): the median of 10 after 2
                                                warm-up calls

`data/sevennet/eos.extxyz` is `label`'s output; tests/accuracy.rs fits both curves the same way
as `fit` (zero of the pressure, its slope there).
"""
import sys

import ase.io
import numpy as np

GPA = 160.21766208  # eV/Å³ in GPa


def label(out):
    from ase.build import bulk
    from ase.calculators.singlepoint import SinglePointCalculator
    from sevenn.calculator import SevenNetCalculator

    calc = SevenNetCalculator("7net-0", device="cpu")
    frames = []
    for a in np.linspace(5.30, 5.60, 13):
        at = bulk("Si", "diamond", a=a, cubic=True).repeat(2)
        at.calc = calc
        e, f, s = at.get_potential_energy(), at.get_forces(), at.get_stress(voigt=False)
        at.calc = SinglePointCalculator(at, energy=e, forces=f, stress=s)
        at.info.update(a=round(float(a), 4), teacher="sevenn", model="7net-0")
        frames.append(at)
    ase.io.write(out, frames, format="extxyz")


def eos(frames):
    """(a0 Å, B GPa): the pressure's zero by linear interpolation, B = -V dp/dV there."""
    a = np.array([f.info["a"] for f in frames])
    v = np.array([f.get_volume() for f in frames])
    p = np.array([-np.trace(f.get_stress(voigt=False)) / 3 for f in frames])
    k = int(np.where((p[:-1] > 0) & (p[1:] <= 0))[0][0])
    a0 = a[k] + (a[k + 1] - a[k]) * p[k] / (p[k] - p[k + 1])
    b = -0.5 * (v[k] + v[k + 1]) * (p[k + 1] - p[k]) / (v[k + 1] - v[k])
    return a0, b * GPA


def fit(labels, pred):
    for name, path in (("SevenNet-0", labels), ("student", pred)):
        a0, b = eos(ase.io.read(path, ":"))
        print(f"{name}: a0 {a0:.4f} Å, B {b:.1f} GPa")


def time_teacher(path, device="cpu"):
    import time

    import torch
    from sevenn.calculator import SevenNetCalculator

    if device == "cpu":
        torch.set_num_threads(1)
    calc = SevenNetCalculator("7net-0", device=device)
    at = ase.io.read(path, 0)
    times = []
    for k in range(12):
        at.rattle(0.01, seed=k)  # a new geometry each call: nothing cached
        at.calc = calc
        t = time.perf_counter()
        at.get_forces()
        at.get_stress()
        if device != "cpu":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    where = "one CPU thread" if device == "cpu" else torch.cuda.get_device_name()
    print(f"SevenNet-0, {len(at)} atoms, {where}: {1e3 * np.median(times[2:]):.2f} ms a call")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "label":
        label(sys.argv[2])
    elif len(sys.argv) in (3, 4) and sys.argv[1] == "time":
        time_teacher(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "fit":
        fit(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(__doc__)
