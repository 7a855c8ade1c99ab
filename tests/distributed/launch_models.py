"""Models named by `model.target` in the launcher tests (on PYTHONPATH of the launcher and its workers)."""
from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch
from torch import nn

from trainforge.errors import UserError


def _mlp(info, hidden: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(info.input_shape), hidden), nn.ReLU(),
                         nn.Linear(hidden, info.num_classes))


def rejected_by_workers(info, attempts: str):
    """Fine where the launcher checks it; bad input once a worker runs it. Each worker start leaves a file
    `rank<R>-restart<K>` in `attempts`, so a test can count the starts."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        name = f"rank{os.environ['RANK']}-restart{os.environ['TORCHELASTIC_RESTART_COUNT']}"
        (Path(attempts) / name).touch()
        raise UserError("model.args.attempts: refused by the worker (a test model); fix the model and rerun")
    return _mlp(info, 8)


class _Paced(nn.Module):
    def __init__(self, info, hidden: int, delay_s: float, slow_while: str) -> None:
        super().__init__()
        self.net = _mlp(info, hidden)
        self.delay_s = delay_s
        self.slow_while = Path(slow_while)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.slow_while.exists():
            time.sleep(self.delay_s)
        return self.net(x)


def paced(info, slow_while: str, hidden: int = 32, delay_s: float = 0.2):
    """A small MLP whose training forward sleeps `delay_s` per micro-batch while the file `slow_while` exists:
    a test keeps a run going, whatever the machine's load, until it has seen what it waits for."""
    return _Paced(info, hidden, delay_s, slow_while)


def needs_real_tensors(info):
    """Reads a value from a tensor while it builds: impossible on the meta device, fine on the CPU."""
    model = _mlp(info, 8)
    if not math.isfinite(float(model[1].weight.detach().sum())):
        raise ValueError("non-finite initial weights")
    return model
