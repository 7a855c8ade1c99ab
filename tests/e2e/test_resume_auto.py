"""`--resume auto` continues the run that is in the directory, with that run's own config.yaml; it never
trains another recipe there, and with no usable checkpoint it restarts the same recipe from step 0 after
moving the earlier attempt's files aside."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainforge.cli import main

QUICK = ["train.max_steps=4", "train.checkpoint_every_steps=2", "train.eval_every_steps=2", "log.progress=false",
         "log.tensorboard=false", "log.report=false", "data.num_workers=0", "train.early_stopping=null"]
MLP = ["model.name=mlp", "model.args={hidden: [16]}", *QUICK]


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return exit_info.value.code, capsys.readouterr().err


def train_mlp(run: Path, capsys) -> None:
    code, err = run_cli(["train", *MLP, "--run-dir", str(run)], capsys)
    assert code in (0, None), err


def saved(run: Path) -> dict:
    return yaml.safe_load((run / "config.yaml").read_text())


def test_no_usable_checkpoint_restarts_the_runs_own_recipe_and_keeps_the_old_files(tmp_path, capsys):
    run = tmp_path / "run"
    train_mlp(run, capsys)
    old_metrics = (run / "metrics.jsonl").read_text()
    steps = sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    for step in steps:  # every checkpoint unusable
        weights = run / "checkpoints" / step / "model.safetensors"
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0xFF
        weights.write_bytes(bytes(data))

    code, err = run_cli(["train", "--run-dir", str(run), "--resume", "auto"], capsys)
    assert code in (0, None), err
    assert "Traceback" not in err
    notice = [line for line in err.splitlines() if "no usable checkpoint" in line]
    assert len(notice) == 1 and "starting its recipe from step 0" in notice[0]
    cfg = saved(run)
    assert cfg["model"]["name"] == "mlp" and cfg["model"]["args"] == {"hidden": [16]}  # not the default CNN
    aside = [p for p in run.iterdir() if p.name.startswith("unusable-")]
    assert len(aside) == 1
    assert sorted(p.name for p in (aside[0] / "checkpoints").glob("step-*")) == steps
    assert (aside[0] / "metrics.jsonl").read_text() == old_metrics
    assert (aside[0] / "final").is_dir()
    rows = [yaml.safe_load(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train_steps = [r["step"] for r in rows if r["split"] == "train"]
    assert train_steps == sorted(set(train_steps)) and train_steps[-1] == 4  # from step 0 again, once each


def test_overrides_apply_on_top_of_the_runs_config_and_are_reported(tmp_path, capsys):
    run = tmp_path / "run"
    train_mlp(run, capsys)
    code, err = run_cli(["train", "train.max_steps=6", "--run-dir", str(run), "--resume", "auto"], capsys)
    assert code in (0, None), err
    assert "with its own config.yaml and, on top: train.max_steps=6" in err
    cfg = saved(run)
    assert cfg["model"]["name"] == "mlp" and cfg["train"]["max_steps"] == 6


def test_another_models_recipe_never_replaces_the_runs_config(tmp_path, capsys):
    run = tmp_path / "run"
    train_mlp(run, capsys)
    before = (run / "config.yaml").read_text()
    code, err = run_cli(["train", "digits_cnn", *QUICK, "--run-dir", str(run), "--resume", "auto"], capsys)
    assert code == 2 and "holds a run of another model" in err and len(err.strip().splitlines()) == 1
    assert (run / "config.yaml").read_text() == before


def test_a_run_without_config_or_checkpoint_is_not_guessed(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"split": "train", "step": 1}\n')
    code, err = run_cli(["train", "--run-dir", str(run), "--resume", "auto"], capsys)
    assert code == 2 and "pass the recipe" in err
    assert (run / "metrics.jsonl").read_text() == '{"split": "train", "step": 1}\n'
    assert not (run / "config.yaml").exists()
