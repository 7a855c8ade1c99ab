"""Every built-in recipe runs, scaled down by overrides, for a few steps through the real CLI."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainforge.config import builtin_recipes, load_config, resolve_recipe
from trainforge.cli import main

COMMON = ["train.max_steps=2", "train.eval_every_steps=2", "log.progress=false", "log.tensorboard=false",
          "train.early_stopping=null"]
SCALE_DOWN = {
    "digits_cnn": [],
    "digits_hybrid": [],
    "textcls_transformer": ["data.args.num_samples=200"],
    "charlm_gpt": ["data.args.max_bytes=60000", "data.args.block_size=64", "model.args.n_layer=1",
                   "train.global_batch_size=16", "train.micro_batch_size=16"],
    "resnet50_synthetic": ["data.args.num_samples=80", "data.args.image_size=64", "data.args.num_classes=10",
                           "train.global_batch_size=4", "train.micro_batch_size=2"],
    "gpt2_small_synthetic": ["data.args.num_samples=40", "data.args.seq_len=64", "model.args.block_size=64",
                             "model.args.n_layer=1", "model.args.n_embd=64", "model.args.n_head=2",
                             "train.global_batch_size=4", "train.micro_batch_size=2"],
}


def test_every_recipe_has_a_scaled_down_run():
    assert set(SCALE_DOWN) == set(builtin_recipes())


@pytest.mark.parametrize("name", sorted(SCALE_DOWN))
def test_recipe_runs_a_few_steps(name, tmp_path, capsys):
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as code:
        main(["train", name, *COMMON, *SCALE_DOWN[name], "--run-dir", str(run), "--json"])
    out = capsys.readouterr().out
    assert code.value.code in (0, None)
    doc = json.loads(out)
    assert doc["status"] == "completed" and doc["steps"] == 2
    ev = json.loads((run / "eval.json").read_text())
    assert ev["loss"] > 0
    assert ("perplexity" in ev) == name.startswith(("charlm", "gpt2"))


def test_recipes_command_lists_every_recipe(capsys):
    with pytest.raises(SystemExit):
        main(["recipes", "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert {r["name"] for r in rows} == set(builtin_recipes())
    assert all(set(r) == {"name", "path", "command"} for r in rows)  # the --json keys are a contract
    assert [r["command"] for r in rows] == [f"trainforge train {r['name']}" for r in rows]


def test_every_shown_command_runs_from_another_directory(capsys, monkeypatch, tmp_path):
    """A command copied from `trainforge recipes` must work wherever the user is, not just in the repo root."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["recipes", "--json"])
    rows = json.loads(capsys.readouterr().out)
    for row in rows:
        program, command, recipe, *rest = shlex.split(row["command"])
        assert (program, command, rest) == ("trainforge", "train", [])
        assert resolve_recipe(recipe).resolve() == Path(row["path"]).resolve()
        assert load_config(recipe).name  # the recipe loads and validates from here
    with pytest.raises(SystemExit):
        main(["recipes"])
    table = capsys.readouterr().out
    assert all(row["command"] in table for row in rows) and "recipes/" not in table


@pytest.mark.slow
def test_default_recipe_reaches_97_percent_within_5_minutes(tmp_path):
    """Acceptance: `trainforge train` with no recipe, on CPU, >= 97% test accuracy in under 5 minutes."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "trainforge", "train", "--run-dir", str(tmp_path / "run"), "--json"],
        capture_output=True, text=True, timeout=300,
    )
    elapsed_s = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["eval"]["accuracy"] >= 0.97
    assert elapsed_s < 300
    assert "ETA" in proc.stderr and "samples/s" in proc.stderr  # the progress bar was shown
    for name in ("config.yaml", "metrics.jsonl", "data_report.json", "checkpoints/latest", "final/model.safetensors",
                 "final/model.json", "eval.json", "report.html"):
        assert (tmp_path / "run" / name).exists(), name
