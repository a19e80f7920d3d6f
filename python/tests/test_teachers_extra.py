"""The teacher extra end to end from Python: GFN2-xTB labels frames offline, they split by
trajectory, and `train` accepts them."""

import os

import numpy as np
import pytest
from ase.build import molecule

import mlff_distiller as mf

tblite = pytest.importorskip("tblite") if not os.environ.get("MLFF_REQUIRE_TEACHERS") else None


def test_gfn2_labels_frames_that_train_accepts(tmp_path, device):
    frames = []
    for t in range(4):
        for k in range(3):
            a = molecule("H2O")
            a.rattle(0.05, seed=10 * t + k)
            a.info["trajectory"] = f"water-{t}"
            frames.append(a)
    labelled = mf.teachers.label(frames, "gfn2", accuracy=0.01)
    assert len(labelled) == 12
    assert all(a.info["teacher"] == "gfn2" for a in labelled)
    energies = np.array([a.get_potential_energy() for a in labelled])
    assert np.all((-200 < energies) & (energies < -100))
    parts = mf.teachers.split(labelled, counts=(2, 1, 1), seed=0)
    assert [len(parts[s]) for s in ("train", "val", "test")] == [6, 3, 3]
    trajectories = {s: {a.info["trajectory"] for a in parts[s]} for s in parts}
    assert not trajectories["train"] & trajectories["val"]
    config = tmp_path / "config.json"
    config.write_text('{"hidden": 8, "n_blocks": 1, "n_rbf": 4, "cutoff": 4.0, "elements": [1, 8]}')
    files = mf.train(parts["train"], tmp_path / "run", val=parts["val"], config=config,
                     epochs=2, batch_size=3, device=device)
    report = mf.evaluate(files["best"], parts["test"], device=device)
    assert report["overall"]["frames"] == 3 and np.isfinite(report["overall"]["force_mae"])
    with pytest.raises(mf.teachers.TeacherError, match="no-such-teacher"):
        mf.teachers.label(frames, "no-such-teacher")
