"""LR schedules are pure functions of the step."""
from __future__ import annotations

import math

import pytest

from trainforge.config import ScheduleConfig
from trainforge.errors import UnknownNameError
from trainforge.engine.schedule import SCHEDULES, lr_at


@pytest.mark.parametrize("name", SCHEDULES.names())
def test_warmup_is_linear_and_reaches_base_lr(name):
    cfg = ScheduleConfig(name=name, warmup_steps=10)
    lrs = [lr_at(s, base_lr=1.0, total_steps=100, cfg=cfg) for s in range(10)]
    assert lrs == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert lr_at(10, base_lr=1.0, total_steps=100, cfg=cfg) == pytest.approx(1.0)


def test_cosine_halfway_is_half_and_decays_towards_floor():
    cfg = ScheduleConfig(name="cosine", warmup_steps=0, min_lr_ratio=0.1)
    assert lr_at(0, base_lr=2.0, total_steps=100, cfg=cfg) == pytest.approx(2.0)
    assert lr_at(50, base_lr=2.0, total_steps=100, cfg=cfg) == pytest.approx(2.0 * (0.1 + 0.9 * 0.5))
    last = lr_at(99, base_lr=2.0, total_steps=100, cfg=cfg)
    assert last == pytest.approx(2.0 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.99))))
    assert 0.2 < last < 0.201  # just above the floor of 0.1 x 2.0
    assert lr_at(150, base_lr=2.0, total_steps=100, cfg=cfg) == pytest.approx(0.2)


def test_linear_and_step_decay():
    lin = ScheduleConfig(name="linear")
    assert lr_at(5, base_lr=1.0, total_steps=10, cfg=lin) == pytest.approx(0.5)
    st = ScheduleConfig(name="step", step_size=3, gamma=0.5)
    assert [lr_at(s, base_lr=1.0, total_steps=10, cfg=st) for s in (0, 2, 3, 6)] == pytest.approx([1, 1, 0.5, 0.25])


def test_warmup_longer_than_run_still_reaches_lr():
    cfg = ScheduleConfig(name="constant", warmup_steps=1000)
    assert lr_at(4, base_lr=1.0, total_steps=5, cfg=cfg) == pytest.approx(1.0)


def test_unknown_schedule_lists_valid_names():
    with pytest.raises(UnknownNameError, match="schedule.name: unknown schedule 'exp'; choose one of: constant, cosine"):
        lr_at(0, base_lr=1.0, total_steps=10, cfg=ScheduleConfig(name="exp"))
