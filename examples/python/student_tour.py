"""A tour of mlff_distiller from Python, cell by cell (run it from the repository root after
`pip install ./python`): check the shipped student against its teacher's held-out labels,
compute a batch, run ASE's MD and the engine's MD, fine-tune briefly, and evaluate again."""

# %% The shipped student and its teacher's (GFN2-xTB) held-out labels.
import tempfile

import ase.io
import ase.units
import numpy as np
from ase.md.verlet import VelocityVerlet

import mlff_distiller as mf

model = mf.Model("models/painn-gfn2.safetensors")  # device="auto": CUDA when built for it
test = ase.io.read("data/gfn2/aspirin_test.extxyz", ":20")
report = mf.evaluate(model, test)
print(f"{model}: force MAE {report['overall']['force_mae'] * 1e3:.1f} meV/Å on 20 frames")

# %% A batch in one call: energies per structure, forces per atom.
energies, forces = model.compute(test)
print("batch energies (eV):", np.round(energies[:4], 3), "...")

# %% ASE's own dynamics with the calculator (it keeps its neighbour list between steps).
atoms = ase.io.read("data/gfn2/start/aspirin.extxyz")
atoms.calc = mf.Calculator(model)
dyn = VelocityVerlet(atoms, timestep=0.5 * ase.units.fs)
dyn.run(200)
print(f"ASE: E_tot {atoms.get_total_energy():.4f} eV after 200 steps")

# %% The engine's MD: the same integrator with the whole step on the device, a callback.
def report_step(step, record, positions):
    if step % 500 == 0:
        print(f"  step {step}: T {record['temperature']:.0f} K, E_tot {record['e_tot']:.4f} eV")


final, summary = mf.md.run(atoms, model, steps=2000, ensemble="nvt", temperature=300,
                           log_every=100, callback=report_step)
print(f"engine: {summary['steps_per_s']:.0f} steps/s, stable: {summary['stable']}")

# %% Fine-tune on a few labelled frames (a short run: the point is the call), then evaluate.
train = ase.io.read("data/gfn2/aspirin_train.extxyz", ":64")
val = ase.io.read("data/gfn2/aspirin_val.extxyz", ":16")
with tempfile.TemporaryDirectory() as out:
    files = mf.train(train, f"{out}/run", val=val, init="models/painn-gfn2.safetensors",
                     epochs=1, batch_size=16, lr=1e-5)
    tuned = mf.evaluate(files["best"], test)
    print(f"fine-tuned: force MAE {tuned['overall']['force_mae'] * 1e3:.1f} meV/Å")
