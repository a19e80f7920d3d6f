"""Training and evaluation from Python run the `mlff` commands with their options and errors."""

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
