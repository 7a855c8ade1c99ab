"""`trainforge eval` on a run dir, its final/ and any checkpoint; classification and language models."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import trainforge
from trainforge.cli import main

BASE = ["train.max_steps=6", "train.checkpoint_every_steps=3", "log.progress=false", "log.tensorboard=false", "log.report=false",
        "train.early_stopping=null", "model.args={channels: [8, 16]}"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    trainforge.train(None, overrides=BASE, run_dir=run_dir)
    return run_dir


def eval_json(args: list[str], capsys) -> dict:
    with pytest.raises(SystemExit) as code:
        main(["eval", *args, "--json"])
    assert code.value.code in (0, None)
    return json.loads(capsys.readouterr().out)


def test_eval_run_dir_matches_training_eval(run, capsys):
    doc = eval_json([str(run)], capsys)
    trained = json.loads((run / "eval.json").read_text())
    assert doc["split"] == "test" and doc["step"] == 6
    assert doc["accuracy"] == pytest.approx(trained["accuracy"])
    assert doc["macro_f1"] == pytest.approx(trained["macro_f1"])
    assert len(doc["confusion_matrix"]) == 10 and sum(map(sum, doc["confusion_matrix"])) == doc["num_samples"]
    assert set(doc["per_class"]) == {str(i) for i in range(10)}


def test_eval_final_and_checkpoint_dirs(run, capsys):
    final = eval_json([str(run / "final")], capsys)
    early = eval_json([str(run / "checkpoints" / "step-000003"), "--split", "val"], capsys)
    assert final["step"] == 6 and early["step"] == 3 and early["split"] == "val"
    assert early["loss"] != final["loss"]


def test_eval_train_split_without_augmentation(run, capsys):
    a = eval_json([str(run), "--split", "train"], capsys)
    b = eval_json([str(run), "--split", "train"], capsys)
    assert a["loss"] == b["loss"]  # no random augmentation in evaluation


def test_eval_human_readable_table(run, capsys):
    with pytest.raises(SystemExit):
        main(["eval", str(run)])
    out = capsys.readouterr().out
    assert "accuracy" in out and "confusion matrix" in out and "per class" in out


def test_eval_language_model_reports_perplexity(tmp_path, capsys):
    run_dir = tmp_path / "lm"
    trainforge.train(None, overrides=[
        "data.source=synthetic_text", "data.args={task: lm, num_samples: 120, seq_len: 32, vocab_size: 64}",
        "data.augment.rotation_deg=0", "data.augment.crop_scale=null", "data.normalize=none",
        "model.name=gpt", "model.args={n_layer: 1, n_head: 2, n_embd: 32}", "train.max_steps=3",
        "train.global_batch_size=16", "train.micro_batch_size=16", "train.early_stopping=null",
        "log.progress=false", "log.tensorboard=false", "log.report=false",
    ], run_dir=run_dir)
    doc = eval_json([str(run_dir)], capsys)
    assert doc["perplexity"] == pytest.approx(math.exp(doc["loss"]))
    assert "accuracy" not in doc


def test_python_api_evaluate(run):
    doc = trainforge.evaluate(run, split="val")
    assert doc["split"] == "val" and 0.0 <= doc["accuracy"] <= 1.0


def test_gpus_command_lists_the_catalog_with_corrected_facts(capsys, tmp_path, monkeypatch):
    with pytest.raises(SystemExit):
        main(["gpus", "--json"])
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["a100-40gb"]["cuda_cores"] == 6912
    assert rows["h100-sxm"]["memory_bandwidth_bytes_per_s"] == pytest.approx(3.35e12)
    assert rows["h100-sxm"]["interconnect_bytes_per_s"] == pytest.approx(900e9)
    assert rows["h100-sxm"]["peak_flops"]["bf16"] == pytest.approx(989e12)
    override = tmp_path / "mine.yaml"
    override.write_text("prices:\n  - {gpu: h100-sxm, usd_per_hour: 1.99, provider: ourcloud, terms: on-demand,"
                        " date: 2026-11-01, source: our contract}\n")
    monkeypatch.setenv("TRAINFORGE_CATALOG", str(override))
    with pytest.raises(SystemExit):
        main(["gpus", "--json"])
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["h100-sxm"]["price"]["usd_per_hour"] == 1.99
    with pytest.raises(SystemExit):
        main(["gpus"])
    assert "6912" in capsys.readouterr().out
