"""A study in PostgreSQL is shared: two machines (here: two output folders) add trials to the same study."""
from __future__ import annotations

import json

import optuna
import pytest
from optuna.trial import TrialState

from trainforge.cli import main

SHORT = ["train.max_steps=20", "train.eval_every_steps=10", "train.num_threads=1", "log.progress=false",
         "log.tensorboard=false", "log.report=false", "data.num_workers=0", "model.args.channels=[8,16]"]


def tune_json(capsys, *args: str) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main(["tune", *args, "--json"])
    captured = capsys.readouterr()
    assert exit_info.value.code in (0, None), captured.err
    return json.loads(captured.out)


@pytest.mark.slow
def test_two_machines_share_a_study_in_postgresql(postgres_url, tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text("optim.lr: {type: float, low: 1.0e-3, high: 1.0e-2, log: true}\n")
    common = ["digits_cnn", *SHORT, "--space", str(space), "--storage", postgres_url, "--study", "shared",
              "--pruner", "none"]
    first = tune_json(capsys, *common, "--trials", "2", "--out", str(tmp_path / "machine-a"))
    second = tune_json(capsys, *common, "--trials", "3", "--out", str(tmp_path / "machine-b"))
    assert first["counts"]["complete"] == 2 and second["counts"]["complete"] == 3
    trials = optuna.load_study(study_name="shared", storage=postgres_url).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    homes = [t.user_attrs["run_dir"] for t in sorted(trials, key=lambda t: t.number)]
    assert [str(tmp_path / "machine-a") in h for h in homes] == [True, True, False]
    assert str(tmp_path / "machine-b") in homes[2]
    assert second["storage"] == postgres_url
