"""FitHooks: how tune and compress steer a run through the one training loop."""
from __future__ import annotations

import json

import torch
from torch import nn

import trainforge
from trainforge.models import build_model
from trainforge.training.loop import FitHooks
from trainforge.engine.losses import task_loss

QUICK = ["train.max_steps=12", "train.eval_every_steps=4", "log.progress=false", "log.tensorboard=false", "log.report=false",
         "train.early_stopping=null"]


def test_on_eval_sees_every_evaluation_and_can_stop_the_run(tmp_path):
    seen = []

    def on_eval(step, val):
        seen.append((step, val["accuracy"]))
        return step >= 8  # a tuner's pruner rejecting the trial at the second evaluation

    result = trainforge.train("digits_cnn", overrides=QUICK, run_dir=tmp_path / "r", hooks=FitHooks(on_eval=on_eval))
    assert [s for s, _ in seen] == [4, 8]
    assert result.status == "pruned" and result.steps == 8
    assert not (tmp_path / "r" / "final").exists(), "a pruned run writes no final model"
    rows = [json.loads(line) for line in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["split"] == "val"] == [4, 8]


def test_loss_and_model_hooks_replace_the_defaults(tmp_path):
    calls = []
    built = []

    def loss(output, batch):  # the task's batch, whatever its inputs: here digits' (x, y)
        x, y = batch
        calls.append(x.shape[0])
        return task_loss(output.float(), y, "classification")

    def make(info):
        cfg = trainforge.load_config("digits_cnn", ["model.args.channels=[8,16]"]).model
        model, _ = build_model(cfg, info)
        built.append(model)
        return model

    result = trainforge.train("digits_cnn", overrides=QUICK + ["train.micro_batch_size=32"], run_dir=tmp_path / "r",
                              hooks=FitHooks(build_model=make, loss=loss))
    assert result.status == "completed"
    assert calls == [32] * 24, "12 steps x 2 micro-batches, each through the hook"
    assert len(built) == 1
    weights = trainforge.training.artifacts.load_trained(tmp_path / "r").weights
    assert weights["features.0.weight"].shape[0] == 8, "the final model is the hook's model"
    assert isinstance(built[0], nn.Module) and torch.equal(built[0].features[0].weight.cpu(), weights["features.0.weight"])
