"""train.class_weights: auto weighs each class n / (classes x count) over the train split, recorded with the run; a
weighted run finds the rare class an unweighted one misses; a setting that does not fit is one line."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import trainforge
from trainforge.errors import UserError
from trainforge.tasks import TASKS


def write_rare(path, n_common: int = 950, n_rare: int = 50, seed: int = 0):
    """One feature: the common class ~ N(0, 1), the rare one ~ N(1.5, 1)."""
    rng = np.random.default_rng(seed)
    rows = [(float(v), "common") for v in rng.normal(0, 1, n_common)] + [(float(v), "rare") for v in
                                                                          rng.normal(1.5, 1, n_rare)]
    path.write_text("x,label\n" + "".join(f"{x:.5f},{y}\n" for x, y in rows))
    return path


def run(tmp_path, name, *extra):
    cfg = trainforge.load_config(None, [
        "data.source=csv", f"data.path={tmp_path / 'rare.csv'}", "data.augment={}",
        "model={name: mlp, args: {hidden: []}}",
        "optim.lr=0.05", "train.epochs=5", "train.global_batch_size=64", "train.micro_batch_size=64",
        "train.early_stopping=null", "log.progress=false", "log.tensorboard=false", "log.report=false", *extra])
    assert trainforge.train(cfg, run_dir=tmp_path / name).status == "completed"
    return (json.loads((tmp_path / name / "eval.json").read_text()),
            json.loads((tmp_path / name / "final" / "model.json").read_text())["ran"],
            json.loads((tmp_path / name / "data_report.json").read_text()))


def test_auto_class_weights_are_recorded_and_find_the_rare_class(tmp_path):
    write_rare(tmp_path / "rare.csv")
    plain, ran_plain, _ = run(tmp_path, "plain")
    weighted, ran, report = run(tmp_path, "weighted", "train.class_weights=auto")
    counts = report["class_counts"]["train"]
    n = sum(counts.values())
    assert ran["class_weights"] == [pytest.approx(n / (2 * counts[c]), rel=1e-5) for c in ("common", "rare")]
    assert ran["reasons"]["class_weights"].startswith("auto: n / (classes x count)")
    assert ran_plain["class_weights"] is None
    # unweighted, the rare class (5%) is rarely predicted; weighted, most of it is found
    assert plain["sensitivity"] < 0.4 < 0.6 < weighted["sensitivity"], (plain, weighted)
    assert weighted["balanced_accuracy"] > plain["balanced_accuracy"] + 0.1


def test_the_weighted_loss_is_torchs_weighted_cross_entropy():
    task = TASKS.get("classification")
    logits, y = torch.randn(16, 3), torch.randint(0, 3, (16,))
    w = torch.tensor([0.5, 2.0, 1.0])
    got = task.training_loss(logits, (None, y), class_weights=w)
    want = -(w[y] * F.log_softmax(logits, -1)[torch.arange(16), y]).sum() / w[y].sum()
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("extra, message", [
    (["train.class_weights=[1.0]"], r"train.class_weights: give one positive weight per class \(2: common, rare\)"),
    (["train.class_weights=[1.0, 0]"], r"train.class_weights: give one positive weight per class"),
])
def test_class_weights_that_do_not_fit_are_one_line(tmp_path, extra, message):
    write_rare(tmp_path / "rare.csv", 40, 10)
    with pytest.raises(UserError, match=message):
        run(tmp_path, "bad", *extra)


def test_a_language_model_has_no_class_weights(tmp_path):
    cfg = trainforge.load_config("charlm_gpt", ["data.args.max_bytes=20000", "train.class_weights=auto",
                                                "train.max_steps=1", "log.progress=false"])
    with pytest.raises(UserError, match=r"train.class_weights: a language modelling run has no class weights"):
        trainforge.train(cfg, run_dir=tmp_path / "lm")
