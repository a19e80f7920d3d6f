"""Training and evaluation from Python run the `mlff` commands with their options and errors."""

import json

import ase.io
import pytest

import mlff_distiller as mf


def test_train_then_evaluate_from_atoms(root, tmp_path, device):
    frames = ase.io.read(root / "data" / "aspirin_rmd17_10frames.extxyz", ":")
    config = tmp_path / "config.json"
    config.write_text('{"hidden": 8, "n_blocks": 1, "n_rbf": 4, "cutoff": 4.0, '
                      '"elements": [1, 6, 7, 8]}')
    out = tmp_path / "run"
    files = mf.train(frames[:8], out, val=frames[8:], config=config, epochs=2, batch_size=4,
                     device=device)
    for path in files.values():
        assert (tmp_path / "run" / path.split("/")[-1]).exists()
    report = mf.evaluate(files["best"], frames, device=device)
    assert report["overall"]["frames"] == 10
    assert report["overall"]["force_mae"] > 0
    # The command's own refusal, as an exception with its message.
    with pytest.raises(mf.commands.CommandError, match="already holds a training run"):
        mf.train(frames[:8], out, val=frames[8:], config=config, epochs=2, device=device)
    with pytest.raises(mf.commands.CommandError, match="epochs"):
        mf.train(frames[:8], tmp_path / "other", config=config, epochs=0, device=device)


def test_main_runs_any_command(model_path):
    assert mf.main(["info", model_path]) == 0
    assert mf.main(["no-such-command"]) == 2


C7 = """7
Properties=species:S:1:pos:R:3
C 0.0 0.0 0.0
C 1.6 0.0 0.0
C 0.8 1.386 0.0
C 0.8 0.462 1.306
C -0.8 1.386 0.0
C 2.4 1.386 0.0
C 0.8 -0.924 1.306
"""


def test_distill_runs_the_loop_with_this_pythons_bridge(tmp_path, monkeypatch, device):
    # Relative paths of a dict config are the current directory's; the teacher commands
    # default to this interpreter, which has the bridge (no `python3` on PATH is needed).
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c7.xyz").write_text(C7)
    (tmp_path / "model.json").write_text(
        '{"hidden": 8, "n_blocks": 1, "n_rbf": 6, "cutoff": 4.5, "elements": [6]}')
    config = {
        "teacher": {"name": "morse", "workers": 2, "hessian_vectors": True},
        "seeds": [{"name": "c7", "file": "c7.xyz"}],
        "temperatures": [300],
        "model": "model.json",
        "committee": 2,
        "train": {"epochs": 5, "batch_size": 8, "lr": 3e-3, "warmup_steps": 5,
                  "hessian_weight": 0.01},
        "teacher_md": {"equil_steps": 20, "steps": 100, "every": 10},
        "sampling": {"replicas": 2, "steps": 100, "every": 10, "rattle_per_molecule": 4},
        "selection": {"per_molecule": 5},
        "stop": {"max_iterations": 1, "disagreement": 0.0},
        "stability": {"steps": 50},
    }
    report = mf.distill("run", config, device=device)
    iterations = report["state"]["iterations"]
    assert [len(i["done"]) for i in iterations] == [3, 5]
    assert iterations[1]["new_frames"] == 5
    assert "max_iterations" in report["state"]["finished"]
    assert (tmp_path / "run" / "student.safetensors").exists()
    # The teacher's Hessian-vector labels, which the training's H·v term fits.
    new = ase.io.read(tmp_path / "run" / "iter-001" / "labelled.extxyz", ":")
    assert all(a.arrays["hvp"].shape == (7, 3) for a in new)
    settings = (tmp_path / "run" / "iter-001" / "student-0.train.json").read_text()
    assert json.loads(settings)["hessian_weight"] == 0.01
    # Going on: one more iteration from the same folder.
    report = mf.distill("run", resume=True, max_iterations=2, device=device)
    assert len(report["state"]["iterations"]) == 3
    with pytest.raises(mf.commands.CommandError, match="already holds a distillation run"):
        mf.distill("run", config, device=device)


def test_train_passes_a_device_list_as_one_flag(root, tmp_path):
    # A CPU device in the list is refused by `mlff train` naming the flag, which shows the
    # list reached it as `--devices cpu,cuda:1`.
    frames = root / "data" / "aspirin_rmd17_10frames.extxyz"
    from mlff_distiller.commands import CommandError

    with pytest.raises(CommandError, match="--devices takes CUDA devices.*`cpu`"):
        mf.train(frames, tmp_path / "run", val=frames, devices=["cpu", "cuda:1"])
    assert not (tmp_path / "run").exists()
