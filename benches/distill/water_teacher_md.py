#!/usr/bin/env python3
"""GFN2-xTB Langevin MD of one structure, a frame every 10 steps written and flushed as it goes
(so a run cut short keeps what it made): the teacher's side of the O-O g(r) in bench-log 56.

    OMP_NUM_THREADS=2 python3 benches/distill/water_teacher_md.py START.extxyz OUT.extxyz STEPS

300 K, 0.5 fs, friction 0.01/fs (10/ps, as `mlff md` and the bridge's sampler), velocities
seeded 5, noise seeded 6. Needs ase and tblite. Then `water_tools.py rdf` on OUT.
"""
import sys
import time

import numpy as np
from ase import units
from ase.io import read, write
from ase.md.langevin import Langevin
from ase.md.velocitydistribution import MaxwellBoltzmannDistribution
from tblite.ase import TBLite

start, out_path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
atoms = read(start)
atoms.calc = TBLite(method="GFN2-xTB", verbosity=0)
MaxwellBoltzmannDistribution(atoms, temperature_K=300, rng=np.random.default_rng(5))
md = Langevin(atoms, 0.5 * units.fs, temperature_K=300, friction=0.01 / units.fs,
              rng=np.random.default_rng(6))
out = open(out_path, "a")
t0 = time.time()


def dump():
    write(out, atoms, format="extxyz")
    out.flush()
    print(md.nsteps, round(time.time() - t0, 1), atoms.get_temperature(), flush=True)


md.attach(dump, interval=10)
md.run(steps)
