"""Learning-rate schedules as pure functions of the optimizer step (no hidden scheduler state).

    lr = lr_at(step, base_lr=cfg.lr, total_steps=T, cfg=schedule_cfg)

Linear warmup over `warmup_steps` from lr/warmup_steps up to lr, then the named decay over the
remaining steps. Because the LR depends only on the step, resuming needs nothing but the step.
"""
from __future__ import annotations

import math
from typing import Callable

from trainforge.config import ScheduleConfig
from trainforge.registry import Registry

# decay(t, n, cfg) -> multiplier in [0, 1]; t = steps since warmup ended, n = decay steps (>= 1)
Decay = Callable[[int, int, ScheduleConfig], float]
SCHEDULES: Registry[Decay] = Registry("schedule", "schedule.name")


@SCHEDULES.register("constant")
def constant(t: int, n: int, cfg: ScheduleConfig) -> float:
    return 1.0


@SCHEDULES.register("cosine")
def cosine(t: int, n: int, cfg: ScheduleConfig) -> float:
    frac = min(t / n, 1.0)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac))


@SCHEDULES.register("linear")
def linear(t: int, n: int, cfg: ScheduleConfig) -> float:
    frac = min(t / n, 1.0)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * (1 - frac)


@SCHEDULES.register("step")
def step(t: int, n: int, cfg: ScheduleConfig) -> float:
    return cfg.gamma ** (t // cfg.step_size)


def lr_at(step_index: int, *, base_lr: float, total_steps: int, cfg: ScheduleConfig) -> float:
    """LR for optimizer step `step_index` (0-based) of `total_steps`."""
    decay = SCHEDULES.get(cfg.name)
    warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))
    if step_index < warmup:
        return base_lr * (step_index + 1) / warmup
    n = max(total_steps - warmup, 1)
    return base_lr * decay(step_index - warmup, n, cfg)
