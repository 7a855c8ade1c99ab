"""Pure pieces of a step: the loss with label smoothing, gradient clipping, EMA, early stopping."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainforge.engine.early_stop import EarlyStopper
from trainforge.engine.ema import EMA
from trainforge.training.loop import grad_norm_and_clip
from trainforge.engine.losses import task_loss


def test_label_smoothing_matches_its_definition():
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    y = torch.tensor([0])
    logp = torch.log_softmax(logits, -1)[0]
    eps = 0.1
    expected = -((1 - eps) * logp[0] + eps * logp.mean())
    assert task_loss(logits, y, "classification", label_smoothing=eps).item() == pytest.approx(expected.item())


def test_lm_loss_averages_every_position():
    logits = torch.randn(2, 5, 7)
    y = torch.randint(0, 7, (2, 5))
    manual = torch.stack([nn.functional.cross_entropy(logits[b, t:t + 1], y[b, t:t + 1]) for b in range(2) for t in range(5)]).mean()
    assert task_loss(logits, y, "lm").item() == pytest.approx(manual.item(), rel=1e-6)


def test_clipping_bounds_the_gradient_norm():
    model = nn.Linear(4, 4)
    (model(torch.ones(3, 4)) * 100).sum().backward()
    before = grad_norm_and_clip(model, None, measure=True)
    assert before > 1.0
    reported = grad_norm_and_clip(model, 1.0, measure=False)
    assert reported == pytest.approx(before)  # the norm before clipping is what gets logged
    after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert after.item() == pytest.approx(1.0, rel=1e-5)
    assert grad_norm_and_clip(model, None, measure=False) is None  # no extra work when not logging


def test_ema_moves_towards_the_weights():
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    ema = EMA(model, decay=0.9)
    with torch.no_grad():
        model.weight.fill_(1.0)
    ema.update(model)
    assert ema.shadow["weight"].item() == pytest.approx(0.1)
    with ema.swapped_in(model):
        assert model.weight.item() == pytest.approx(0.1)
    assert model.weight.item() == 1.0


def test_early_stopper_counts_evaluations_without_improvement():
    es = EarlyStopper("accuracy", "max", patience=2, min_delta=0.01)
    assert es.update({"accuracy": 0.5}) and not es.should_stop
    assert not es.update({"accuracy": 0.505})  # within min_delta: not an improvement
    assert es.update({"accuracy": 0.6}) and es.bad_evals == 0
    es.update({"accuracy": 0.55})
    es.update({"accuracy": 0.59})
    assert es.should_stop and es.best == 0.6
    restored = EarlyStopper("accuracy", "max", patience=2)
    restored.load_state_dict(es.state_dict())
    assert restored.should_stop and restored.best == 0.6
    with pytest.raises(ValueError, match="train.early_stopping.metric: 'f2' is not reported"):
        EarlyStopper("f2", "max", 2).update({"loss": 1.0})


def test_min_mode_early_stopping():
    es = EarlyStopper("loss", "min", patience=1)
    es.update({"loss": 1.0})
    assert es.update({"loss": 0.5})
    assert not es.update({"loss": 0.7}) and es.should_stop
    assert not math.isnan(es.best)


def test_early_stopping_without_a_metric_takes_the_tasks_default_and_its_direction():
    from trainforge.config import EarlyStoppingConfig
    from trainforge.tasks import TASKS
    from trainforge.training.loop import stopper_for

    classify = stopper_for(EarlyStoppingConfig(patience=3), TASKS.get("classification"))
    assert (classify.metric, classify.mode, classify.patience) == ("accuracy", "max", 3)
    lm = stopper_for(EarlyStoppingConfig(), TASKS.get("lm"))
    assert (lm.metric, lm.mode) == ("loss", "min")
    named = stopper_for(EarlyStoppingConfig(metric="loss"), TASKS.get("classification"))
    assert (named.metric, named.mode) == ("loss", "min")  # the named metric's direction, not the default's
