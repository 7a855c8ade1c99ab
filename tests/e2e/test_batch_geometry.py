"""The default recipe and its shipped sweep run unchanged on any world size and any sampled global batch:
`train.micro_batch_size` is an upper bound, fitted once and said once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import trainforge
from trainforge.engine.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["train.max_steps=2", "train.eval_every_steps=2", "train.log_every_steps=1", "train.device=cpu",
         "log.progress=false", "log.tensorboard=false", "log.report=false"]


@pytest.mark.serial
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["auto", "fsdp"])
def test_default_recipe_runs_on_two_processes_and_says_the_micro_batch_once(tmp_path, strategy):
    """Also under FSDP, with the recipe's early stopping (best weights kept as shards, gathered at the end)."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "trainforge", "train", *QUICK, f"distributed.strategy={strategy}",
         "--nproc-per-node", "2", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("train.micro_batch_size 64 -> 32") == 1, proc.stderr[-3000:]
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["split"] == "train"]
    assert {(r["micro_batch_size"], r["accumulation"]) for r in rows} == {(32, 1)}
    meta = json.loads((run_dir / "final" / "model.json").read_text())
    ran = meta["ran"]
    assert ran["micro_batch_size"] == 32 and ran["world_size"] == 2
    assert ran["strategy"] == ("ddp" if strategy == "auto" else "fsdp")
    assert ran["reasons"]["strategy"] == "auto: ddp over 2 processes" if strategy == "auto" else "strategy" not in ran["reasons"]
    assert json.loads((run_dir / "eval.json").read_text())["step"] == 2 and "accuracy" in meta["metrics"]


def test_every_global_batch_of_the_shipped_sweep_runs_on_the_default_recipe(tmp_path):
    space = yaml.safe_load((ROOT / "recipes" / "sweeps" / "digits_cnn.yaml").read_text())
    choices = space["train.global_batch_size"]["choices"]
    assert max(choices) > 64 and min(choices) < 64  # the recipe's micro-batch 64 divides neither alone
    for batch in choices:
        cfg = trainforge.load_config(None, [*QUICK, "train.max_steps=1", f"train.global_batch_size={batch}"])
        result = trainforge.train(cfg, run_dir=tmp_path / f"b{batch}")
        assert result.status in ("completed", "early_stopped")
        assert result.micro_batch_size == min(batch, 64)


def test_help_says_max_steps_replaces_epochs_and_micro_batch_is_a_bound(capsys):
    from trainforge.cli import main

    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "train.max_steps=N optimizer steps, which replaces train.epochs (not a cap)" in text
    assert "train.micro_batch_size is an upper bound per process" in text
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "`train.max_steps` optimizer steps, which *replaces* `train.epochs` when set (it is not a cap" in readme
